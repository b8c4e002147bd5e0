"""KV-cached sampling of a batch of completions, shared by training and evaluation.

A hand-rolled loop instead of `model.generate`, for two savings: each distinct prompt goes
through the model once and its KV cache is shared by all the rows that answer it (a GRPO
group of 8 pays for one prompt forward, not 8), and we stop as soon as every row has
written its end token. Without left padding we pass no attention mask, so attention takes
the fused causal path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Generation:
    prompt_ids: torch.Tensor       # [P, L] distinct prompts, left-padded
    prompt_mask: torch.Tensor      # [P, L] 1 for real tokens
    prompt_index: torch.Tensor     # [B] which prompt each completion answers
    completion_ids: torch.Tensor   # [B, T] padded after the end token
    completion_mask: torch.Tensor  # [B, T] 1 up to and including the end token
    truncated: torch.Tensor        # [B] bool: no end token within T
    logprobs: torch.Tensor         # [B, T] log-prob of each sampled token under the sampling policy
    entropy: torch.Tensor          # [B, T] entropy of the sampling distribution at each position

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1)


def encode_prompts(tok, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tok([tok.bos_token + p for p in prompts], add_special_tokens=False,
              padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def prompt_forward(model, prompt_ids, prompt_mask, index):
    """Run each distinct prompt once; return its last logits and KV cache, one row per `index`."""
    padded = bool((prompt_mask == 0).any())
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask if padded else None,
                position_ids=position_ids(prompt_mask), use_cache=True)
    cache = out.past_key_values
    cache.batch_select_indices(index)  # rows share their prompt's keys and values
    return out.logits[index, -1], cache


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
             eos_id: int, pad_id: int, temperature: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None, repeats: int = 1) -> Generation:
    """`repeats` completions per prompt (a GRPO group), rows of one prompt contiguous."""
    index = torch.arange(prompt_ids.shape[0]).repeat_interleave(repeats)
    B = index.shape[0]
    logits, cache = prompt_forward(model, prompt_ids, prompt_mask, index)
    mask = prompt_mask[index] if bool((prompt_mask == 0).any()) else None
    next_pos = position_ids(prompt_mask)[index, -1:] + 1
    tokens, logps, ents, done = [], [], [], torch.zeros(B, dtype=torch.bool)
    for t in range(max_new_tokens):
        # evidence comes for free: the sampling distribution is already computed here
        logp_all = torch.log_softmax(logits.float() / (1.0 if greedy else temperature), -1)
        if greedy:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        tokens.append(nxt)
        logps.append(logp_all.gather(-1, nxt[:, None]).squeeze(-1))
        ents.append(-(logp_all.exp() * logp_all).sum(-1))
        done |= nxt == eos_id
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        if mask is not None:
            mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], dim=1)
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        cache, logits, next_pos = out.past_key_values, out.logits[:, -1], next_pos + 1
    comp = torch.stack(tokens, dim=1)
    # mask covers tokens up to and including the first end token
    is_eos = comp == eos_id
    after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
    comp_mask = (~after_eos).long()
    return Generation(prompt_ids, prompt_mask, index, comp, comp_mask, truncated=~is_eos.any(-1),
                      logprobs=torch.stack(logps, 1) * comp_mask, entropy=torch.stack(ents, 1) * comp_mask)


def select_rows(gen: Generation, rows: torch.Tensor) -> Generation:
    """The same generation restricted to some rows, keeping only the prompts they answer."""
    used, index = gen.prompt_index[rows].unique(return_inverse=True)
    return Generation(gen.prompt_ids[used], gen.prompt_mask[used], index,
                      *(getattr(gen, f)[rows] for f in (
                          "completion_ids", "completion_mask", "truncated", "logprobs", "entropy")))


def decode(tok, gen: Generation) -> list[str]:
    """Completion text up to (not including) the end token."""
    rows = []
    for ids, m in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist()):
        ids = [i for i, keep in zip(ids, m) if keep and i != tok.eos_token_id]
        rows.append(tok.decode(ids, skip_special_tokens=True))
    return rows
