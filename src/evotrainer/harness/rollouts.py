"""The plain data every slot function reads: one batch of sampled groups."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from evotrainer.tasks.base import Problem


@dataclass
class Rollouts:
    """B = groups x group_size rollouts, rows of one group contiguous."""
    problems: list[Problem]      # [B] the prompt each rollout answered
    completions: list[str]       # [B] decoded text up to (not including) the end token
    scores: torch.Tensor         # [B] verifier score in [0, 1]: fixed by the task, not the harness
    lengths: torch.Tensor        # [B] completion tokens, end token included
    truncated: torch.Tensor      # [B] bool: hit max_new_tokens without an end token
    group_size: int
    max_new_tokens: int
    # multi-turn tasks only (None otherwise): policy turns per episode, how each ended (envs.base
    # STOPS) and what it did (envs.base.Trace: tools called in order, failures, files, tests)
    turns: torch.Tensor | None = None
    stops: list[str] | None = None
    traces: list | None = None

    @property
    def num_groups(self) -> int:
        return len(self.problems) // self.group_size

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(self.num_groups, self.group_size)


class SlotError(RuntimeError):
    """A harness slot returned something the trainer cannot use."""


def check_output(name: str, x, shape) -> torch.Tensor:
    """What a slot returned, if it is a finite tensor of the shape the trainer needs."""
    if not isinstance(x, torch.Tensor):
        raise SlotError(f"{name} returned {type(x).__name__}, expected a tensor of shape {tuple(shape)}")
    if tuple(x.shape) != tuple(shape):
        raise SlotError(f"{name} returned shape {tuple(x.shape)}, expected {tuple(shape)}")
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise SlotError(f"{name} returned non-finite values")
    return x
