"""Per-token log-probs and entropies of completions under a policy (one forward pass)."""
from __future__ import annotations

import torch

from evotrainer.policy.generate import Generation, position_ids


def completion_logprobs(model, gen: Generation, temperature: float,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(token) [B, T] at temperature, and the entropy [B, T] if asked.

    Prompt and completion go through the model together. Pads after the end token need
    no mask: the model is causal, so nothing before them attends to them.
    """
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], dim=1)
    P, T = gen.prompt_ids.shape[1], gen.completion_ids.shape[1]
    padded = bool((gen.prompt_mask == 0).any())
    mask = torch.cat([gen.prompt_mask, torch.ones_like(gen.completion_ids)], 1) if padded else None
    pos = position_ids(torch.cat([gen.prompt_mask, torch.ones_like(gen.completion_ids)], 1))
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, P - 1:P - 1 + T]
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, gen.completion_ids.unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, ent
