"""evotrainer: RL from verifiable rewards that evolves its own training harness."""
import os as _os

# Nothing is ever downloaded at run time: models and tokenizers are built locally.
_os.environ.setdefault("HF_HUB_OFFLINE", "1")
_os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
_os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

__version__ = "0.1.0"
