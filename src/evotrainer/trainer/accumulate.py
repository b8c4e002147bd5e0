"""Gradient accumulation over micro-batches without changing the update.

A loss aggregation reads the whole batch (token_mean divides by every token of it), so a
micro-batch cannot simply aggregate its own rows. Every built-in aggregation is linear in
the per-token loss, agg(L) = sum(W * L) + c, with weights W that depend on the mask only;
we read W off autograd once per step and each micro-batch then contributes sum(W_rows * L_rows).
The sum of those contributions, and of their gradients, is exactly the full-batch one.
"""
from __future__ import annotations

import torch

from evotrainer.harness.rollouts import SlotError


def aggregation_weights(agg, mask: torch.Tensor) -> torch.Tensor:
    """W = d agg(L, mask) / dL, checked to be the aggregation's own: agg must be linear in L."""
    probe = torch.zeros_like(mask, dtype=torch.float32, requires_grad=True)
    base = agg(probe, mask)
    if not base.requires_grad:
        raise SlotError("loss_agg does not depend on the per-token loss")
    (weights,) = torch.autograd.grad(base, probe)
    x = torch.rand(mask.shape, generator=torch.Generator().manual_seed(0)).to(mask.device)
    with torch.no_grad():
        linear = (x * weights).sum() + base.detach()
        actual = agg(x, mask)
    if not torch.allclose(actual, linear, rtol=1e-4, atol=1e-6):
        raise SlotError("loss_agg is not linear in the per-token loss, so a batch cannot be split into micro-batches "
                        "with the same update; set micro_batch_size: 0 (the whole batch at once)")
    return weights


def chunks(rows: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Row indices in micro-batches of `size` (0: one batch)."""
    if not size or size >= len(rows):
        return [rows]
    return list(rows.split(size))
