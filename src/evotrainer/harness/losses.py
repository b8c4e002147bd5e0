"""Loss form and loss aggregation, kept apart (as in verl's core_algos).

Policy loss: per-token loss [B, T] from log-probs, old log-probs and advantages.
Aggregation: per-token loss [B, T] and mask [B, T] -> scalar. Any form pairs with any
aggregation; the KL and entropy terms are added per token before aggregation. The trainer
hands an aggregation the whole batch: rows a group filter dropped have an all-zero mask
(verl leaves them out of every denominator, and so do we), and the mask is as wide as
the completion budget (max_new_tokens), not as the longest completion of the batch.
"""
from __future__ import annotations

from typing import Callable

import torch

from evotrainer.harness.registry import Registry

PolicyLossFn = Callable[..., torch.Tensor]
LossAggFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LOG_RATIO_CLAMP = 20.0  # as verl: exp() of a stale or broken log-ratio must not overflow to inf
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy_loss")
LOSS_AGGS: Registry[LossAggFn] = Registry("loss_agg")
KL_ESTIMATORS: Registry[KLFn] = Registry("kl_estimator")


@POLICY_LOSSES.register()
def clipped(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
            clip_low: float, clip_high: float) -> torch.Tensor:
    """PPO clipped surrogate with separate bounds: ratio in [1 - clip_low, 1 + clip_high].

    clip_high > clip_low is DAPO's clip-higher (2503.14476): more room to raise unlikely
    tokens, which fights entropy collapse. adv is [B] (one per rollout), broadcast over T.
    """
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    a = adv.unsqueeze(-1)
    return torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip_low, 1 + clip_high))


@LOSS_AGGS.register()
def token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over all completion tokens in the batch (DAPO): long answers weigh more."""
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def _live_rows(mask: torch.Tensor) -> torch.Tensor:
    """How many rows have any token in the loss: rows a group filter dropped do not count."""
    return (mask.sum(-1) > 0).sum().clamp(min=1)


@LOSS_AGGS.register()
def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean per sequence, then mean over the sequences in the loss (original GRPO): every rollout weighs the same."""
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / _live_rows(mask)


@LOSS_AGGS.register()
def seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum per sequence, mean over the sequences in the loss."""
    return (loss * mask).sum() / _live_rows(mask)


@LOSS_AGGS.register()
def seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum per sequence divided by a constant, the completion budget (the mask's width), then the
    mean over sequences: Dr. GRPO's unbiased form (2503.20783), verl's seq-mean-token-sum-norm."""
    return (loss * mask).sum() / (_live_rows(mask) * mask.shape[1])


# KL estimators (Schulman, "Approximating KL divergence", 2020; verl's kl_penalty). Each is a
# per-token term added to the loss and differentiated, so what matters is its gradient on
# samples from pi, not its value (Tang & Munos 2506.09477): per position, given the prefix,
#   k1: E[grad] = E[grad log pi] = 0, noise only (refused as a loss term: Knobs.validate);
#   k2: E[grad] = E[(log pi - log pi_ref) grad log pi] = grad KL(pi || ref), the penalty itself;
#   k3: E[grad] = E[(1 - pi_ref / pi) grad log pi] = grad KL(ref || pi), the reverse direction.

@KL_ESTIMATORS.register()
def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_ref: an unbiased estimate of KL(pi || ref), but its expected gradient
    on-policy is zero, so a harness may not use it as a loss term (kl_coef > 0)."""
    return logp - ref_logp


@KL_ESTIMATORS.register()
def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """0.5 (log pi - log pi_ref)^2 (verl's "mse"): its value is biased, but its gradient
    on-policy is exactly that of KL(pi || ref). Off-policy (num_iterations > 1) it is not
    importance-weighted, so it drifts from that gradient as the ratio moves from 1."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register()
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """exp(ref - logp) - (ref - logp) - 1: unbiased for KL(pi || ref) and non-negative (GRPO's,
    TRL's); as a loss term its gradient on-policy is that of KL(ref || pi)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1
