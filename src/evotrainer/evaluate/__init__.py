"""The evaluator: greedy accuracy of a checkpoint on a split, by the task's verifier.

Imports only policy and tasks: fitness never passes through harness code.
"""
from evotrainer.evaluate.greedy import accuracy, evaluate_checkpoint, evaluate_checkpoints

__all__ = ["accuracy", "evaluate_checkpoint", "evaluate_checkpoints"]
