"""Group-filter slot: which prompt groups enter the gradient.

Signature: (rewards [G, n], scores [G, n]) -> keep mask [G]. Filters that ask "did the
group disagree about correctness" read scores, not rewards: filtering on a shaped reward
lets a hacked reward keep its own groups alive (the DAPO "phantom gradient").
"""
from __future__ import annotations

from typing import Callable

import torch

from evotrainer.harness.registry import Registry

GroupFilterFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
GROUP_FILTERS: Registry[GroupFilterFn] = Registry("group_filter")
DEAD_STD = 1e-3  # EvoTrainer's dead-group threshold on reward std


@GROUP_FILTERS.register()
def keep_all(rewards: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """No filtering (the reference recipe)."""
    return torch.ones(rewards.shape[0], dtype=torch.bool)


@GROUP_FILTERS.register()
def drop_dead(rewards: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Drop groups whose rewards are all equal (they carry no GRPO signal)."""
    return rewards.std(dim=1, unbiased=False) > DEAD_STD


@GROUP_FILTERS.register()
def score_spread(rewards: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Keep groups whose verifier scores disagree (DAPO dynamic sampling, on the score)."""
    return scores.max(dim=1).values > scores.min(dim=1).values


class StdGroupFilter:
    """EvoTrainer's StdGroupFilter: keep a group when its reward std is at least an EMA threshold
    mean - z * sd of the live groups' stds seen so far (z = 1.28 keeps about 90% of a normal
    spread), after a warm-up of `warmup` groups; dead groups always go. It keeps state across
    steps, so each harness load (one segment, one process) starts it afresh."""

    def __init__(self, z: float = 1.28, decay: float = 0.95, warmup: int = 20):
        self.z, self.decay, self.warmup = z, decay, warmup
        self.mean, self.var, self.seen = 0.0, 0.0, 0

    def fresh(self) -> "StdGroupFilter":
        return StdGroupFilter(self.z, self.decay, self.warmup)

    def __call__(self, rewards: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        std = rewards.std(dim=1, unbiased=False)
        keep = std > DEAD_STD
        if self.seen >= self.warmup:
            keep &= std >= self.mean - self.z * self.var ** 0.5
        for s in std[std > DEAD_STD].tolist():  # the threshold follows the live groups only
            if self.seen == 0:
                self.mean = s
            delta = s - self.mean
            self.mean += (1 - self.decay) * delta
            self.var = self.decay * (self.var + (1 - self.decay) * delta * delta)
            self.seen += 1
        return keep


GROUP_FILTERS.register("std_ema")(StdGroupFilter())
