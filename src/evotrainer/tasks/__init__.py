"""Tasks: the interface (base.py), spec strings (spec.py), the registry of built-ins and the
spec resolver (registry.py), and the single-turn tasks. `get_task` lives above tasks and
envs, in evotrainer.catalog, which loads every built-in (envs/ holds the multi-turn ones)."""
from evotrainer.tasks.base import Judgement, Problem, Task, TrainStream

__all__ = ["Judgement", "Problem", "Task", "TrainStream"]
