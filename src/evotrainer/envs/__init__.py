"""Multi-turn environments: the interface (base.py) and an episode's tokens and loss mask (episode.py)."""
from evotrainer.envs.base import Caps, Environment, SingleTurn, Step
from evotrainer.envs.episode import Episode, pad

__all__ = ["Caps", "Environment", "Episode", "SingleTurn", "Step", "pad"]
