"""The evaluator: greedy accuracy of a checkpoint on a split, by the task's verifier.

Imports policy and tasks (and, to launch it as a job of its own, launch.py: the executors):
fitness never passes through harness code.
"""
from evotrainer.evaluate.greedy import accuracy, evaluate_checkpoint, evaluate_checkpoints

__all__ = ["accuracy", "evaluate_checkpoint", "evaluate_checkpoints"]
