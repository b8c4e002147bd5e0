"""Reward slot: rollouts -> one float per rollout (what the policy gradient reads).

Rewards may shape the verifier score; they can also be hacked, which is why the score
stays separate and the evaluator never reads rewards.
"""
from __future__ import annotations

from typing import Callable

import torch

from evotrainer.harness.registry import Registry
from evotrainer.harness.rollouts import Rollouts

RewardFn = Callable[[Rollouts], torch.Tensor]
REWARDS: Registry[RewardFn] = Registry("reward")


@REWARDS.register()
def binary(r: Rollouts) -> torch.Tensor:
    """The verifier score itself: 1 if correct, else 0 (the reference recipe)."""
    return r.scores.clone()


@REWARDS.register()
def partial_credit(r: Rollouts) -> torch.Tensor:
    """Share of answer positions written correctly; a wrong length costs the extra positions.

    Continuous credit keeps groups alive when no rollout is fully correct (EvoTrainer's
    "dead groups > 30% -> make the reward more continuous"). Exact answers still get 1.
    """
    out = []
    for prob, comp, score in zip(r.problems, r.completions, r.scores.tolist()):
        ans = prob.answer
        hits = sum(a == b for a, b in zip(ans, comp))
        out.append(max(score, hits / max(len(ans), len(comp), 1)))
    return torch.tensor(out, dtype=torch.float32)


@REWARDS.register()
def overlong_penalty(r: Rollouts) -> torch.Tensor:
    """The verifier score minus DAPO's soft overlong punishment: 0 up to the last quarter of
    the token budget, then rising linearly to 1 at the budget (arXiv 2503.14476)."""
    cache = max(r.max_new_tokens // 4, 1)
    over = ((r.lengths.float() - (r.max_new_tokens - cache)) / cache).clamp(0, 1)
    return r.scores.float() - over
