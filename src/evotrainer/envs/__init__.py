"""Multi-turn environments: the interface (base.py), an episode's
tokens and loss mask (episode.py), playing a batch of episodes with a policy (play.py), and
the built-in environments (vault.py; swe_mini.py with its repositories, swe_mini_repo.py),
each registered as a task (tasks/registry.py) and loaded by evotrainer.catalog."""
from evotrainer.envs.base import (ABANDON, ECHO, FAIL, INVALID, STOPS, SUCCESS, TOKEN_CAP, TURN_CAP, Caps, EnvTask,
                                  Environment, SingleTurn, Step, ToolCall, Trace)
from evotrainer.envs.episode import Episode, pad

__all__ = ["ABANDON", "Caps", "ECHO", "EnvTask", "Environment", "Episode", "FAIL", "INVALID", "STOPS", "SUCCESS",
           "SingleTurn", "Step", "TOKEN_CAP", "TURN_CAP", "ToolCall", "Trace", "pad"]
