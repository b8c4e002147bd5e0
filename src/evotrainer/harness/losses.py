"""Loss form and loss aggregation, kept apart (as in verl's core_algos).

Policy loss: per-token loss [B, T] from log-probs, old log-probs, advantages, the completion
mask and the harness's knobs (each form reads its own: clip bounds, clip_delta).
Aggregation: per-token loss [B, T] and mask [B, T] -> scalar. Any form pairs with any
aggregation; the KL and entropy terms are added per token before aggregation. The trainer
hands an aggregation the whole batch: rows a group filter dropped have an all-zero mask
(verl leaves them out of every denominator, and so do we), and the mask is as wide as
the completion budget (max_new_tokens), not as the longest completion of the batch.
"""
from __future__ import annotations

from typing import Callable

import torch

from evotrainer.harness.knobs import Knobs
from evotrainer.harness.registry import Registry

PolicyLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Knobs], torch.Tensor]
LossAggFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LOG_RATIO_CLAMP = 20.0  # as verl: exp() of a stale or broken log-ratio must not overflow to inf
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy_loss")
LOSS_AGGS: Registry[LossAggFn] = Registry("loss_agg")
KL_ESTIMATORS: Registry[KLFn] = Registry("kl_estimator")


def ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """pi / pi_old per token, its log clamped as verl does: exp() of a stale or broken log-ratio must not overflow."""
    return torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def surrogate(r: torch.Tensor, adv: torch.Tensor, k: Knobs) -> torch.Tensor:
    """-min(r A, clip(r) A) with clip to [1 - clip_low, 1 + clip_high]; with clip_delta, the
    unclipped r is first capped at clip_delta (INTELLECT-2's two-sided clipping, 2505.07291:
    it binds only where A < 0, since clip_delta > 1 + clip_high)."""
    unclipped = r.clamp(max=k.clip_delta) if k.clip_delta else r
    return torch.maximum(-adv * unclipped, -adv * r.clamp(1 - k.clip_low, 1 + k.clip_high))


@POLICY_LOSSES.register()
def clipped(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
            k: Knobs) -> torch.Tensor:
    """PPO clipped surrogate per token with separate bounds: ratio in [1 - clip_low, 1 + clip_high].

    clip_high > clip_low is DAPO's clip-higher (2503.14476): more room to raise unlikely
    tokens, which fights entropy collapse. adv is [B] (one per rollout), broadcast over T.
    """
    return surrogate(ratio(logp, old_logp), adv.unsqueeze(-1), k)


@POLICY_LOSSES.register()
def gspo(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
         k: Knobs) -> torch.Tensor:
    """GSPO (Zheng et al. 2507.18071): one ratio per sequence, the geometric mean of its tokens'
    ratios, exp(mean_t log pi/pi_old), clipped as PPO clips a token's; every token of the
    sequence carries the sequence's loss. Whole-sequence ratios stay near 1, so the paper's
    clip range is tiny (clip_low 3e-4, clip_high 4e-4); with num_iterations 1 every ratio is 1
    and the update is the token-level one."""
    log_r = ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return surrogate(ratio(log_r, torch.zeros_like(log_r)), adv, k).unsqueeze(-1).expand_as(logp)


@POLICY_LOSSES.register()
def cispo(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
          k: Knobs) -> torch.Tensor:
    """CISPO (MiniMax-M1, 2506.13585): REINFORCE on every token, -sg(min(ratio, 1 + clip_high)) A log pi.
    The importance weight is clipped and its gradient stopped, so no token leaves the gradient
    the way PPO's clip drops them (rare, high-entropy tokens most of all); ScaleRL (2510.13786)
    caps the weight at 5, i.e. clip_high 4."""
    w = ratio(logp, old_logp).clamp(max=1 + k.clip_high).detach()
    return -w * adv.unsqueeze(-1) * logp


def tis_weights(train_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"; TRL's vLLM correction, token_truncate): per token,
    min(pi_train / pi_sampler, cap), stop-gradient, for a sampler whose numbers are not the
    trainer's (vLLM, bf16 sampling, or top-k / top-p filtering, which the loss's log-probs lack)."""
    return ratio(train_logp, sampler_logp).clamp(max=cap).detach()


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
