"""Per-token log-probs and entropies of completions under a policy, with gradients."""
from __future__ import annotations

import torch

from evotrainer.policy.generate import Generation, position_ids, prompt_forward, with_cache


def completion_logprobs(model, gen: Generation, temperature: float,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(token) [B, T] at temperature, and the entropy [B, T] if asked.

    As in sampling, each distinct prompt runs once and its KV cache (with its autograd
    graph) is shared by the rows that answer it; the completions then run on top of it.
    The first completion token is predicted by the prompt's last position. Pads after the
    end token need no mask: the model is causal, so nothing before them attends to them.
    Under gradient checkpointing a layer keeps no cache, so each row runs its prompt itself.
    """
    if model.training and torch.is_grad_enabled() and checkpointed(model):
        return _whole_rows(model, gen, temperature, with_entropy)
    first, cache = prompt_forward(model, gen.prompt_ids, gen.prompt_mask, gen.prompt_index)
    comp = gen.completion_ids
    B, T = comp.shape
    pmask = gen.prompt_mask[gen.prompt_index]
    padded = bool((gen.prompt_mask == 0).any())
    mask = torch.cat([pmask, torch.ones_like(comp)], 1) if padded else None
    pos = position_ids(pmask)[:, -1:] + 1 + torch.arange(T, device=comp.device)[None, :]
    logits = first[:, None]
    if T > 1:
        rest = model(input_ids=comp[:, :-1], attention_mask=None if mask is None else mask[:, :-1],
                     position_ids=pos[:, :-1], **with_cache(model, cache), use_cache=False).logits
        logits = torch.cat([logits, rest], dim=1)
    return _token_logprobs(logits, comp, temperature, with_entropy)


def enable_checkpointing(model) -> None:
    """Activation (gradient) checkpointing, non-reentrant: a LoRA model's adapters get their
    gradients without the inputs requiring any (transformers 5 renamed the method)."""
    on = getattr(model, "activation_checkpointing_enable", None)
    if on is not None:
        on(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def checkpointed(model) -> bool:
    """Whether the model's layers recompute their activations (and so keep no cache) in training."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _whole_rows(model, gen: Generation, temperature: float, with_entropy: bool):
    """The same log-probs from one forward per row over its prompt and completion (no shared cache)."""
    comp = gen.completion_ids
    ids = torch.cat([gen.prompt_ids[gen.prompt_index], comp], 1)
    mask = torch.cat([gen.prompt_mask[gen.prompt_index], torch.ones_like(comp)], 1)
    L = gen.prompt_ids.shape[1]
    logits = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position_ids(mask)[:, :-1],
                   use_cache=False).logits[:, L - 1:]
    return _token_logprobs(logits, comp, temperature, with_entropy)


def _token_logprobs(logits, comp, temperature: float, with_entropy: bool):
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, comp.unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, ent
