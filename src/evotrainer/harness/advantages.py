"""Advantage slot: rewards [G, n] per group -> advantages [G, n]."""
from __future__ import annotations

from typing import Callable

import torch

from evotrainer.harness.registry import Registry

AdvantageFn = Callable[[torch.Tensor], torch.Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage")
EPS = 1e-4


@ADVANTAGES.register()
def grpo(rewards: torch.Tensor) -> torch.Tensor:
    """(r - group mean) / (group std + eps), std unbiased as in TRL (DeepSeekMath, 2402.03300)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + EPS)


@ADVANTAGES.register()
def dr_grpo(rewards: torch.Tensor) -> torch.Tensor:
    """r - group mean, no std division: removes the difficulty bias (Dr. GRPO, 2503.20783)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


@ADVANTAGES.register()
def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """r - mean of the *other* rollouts of the group (RLOO, Ahmadian et al. 2402.14740)."""
    n = rewards.shape[1]
    if n < 2:
        return torch.zeros_like(rewards)
    return (rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (n - 1))
