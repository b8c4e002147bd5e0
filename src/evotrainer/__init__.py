"""evotrainer: RL from verifiable rewards that evolves its own training harness.

Importing the package changes nothing in the process: Hugging Face offline mode is set by
our own command line and worker processes, which never download, not here.
"""
__version__ = "0.1.0"
