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
