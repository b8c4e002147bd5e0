"""KV-cached sampling of a batch of completions, shared by training and evaluation.

A hand-rolled loop instead of `model.generate`: one prompt forward fills the cache,
then one forward per new token; we stop when every row has written its end token.
Without left padding we pass no attention mask, so attention takes the fused causal path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Generation:
    prompt_ids: torch.Tensor       # [B, P] left-padded
    prompt_mask: torch.Tensor      # [B, P] 1 for real tokens
    completion_ids: torch.Tensor   # [B, T] padded after the end token
    completion_mask: torch.Tensor  # [B, T] 1 up to and including the end token
    truncated: torch.Tensor        # [B] bool: no end token within T

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1)


def encode_prompts(tok, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tok([tok.bos_token + p for p in prompts], add_special_tokens=False,
              padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
             eos_id: int, pad_id: int, temperature: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None) -> Generation:
    B = prompt_ids.shape[0]
    padded = bool((prompt_mask == 0).any())
    mask = prompt_mask if padded else None
    pos = position_ids(prompt_mask)
    out = model(input_ids=prompt_ids, attention_mask=mask, position_ids=pos, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1]
    next_pos = pos[:, -1:] + 1
    tokens, done = [], torch.zeros(B, dtype=torch.bool)
    for t in range(max_new_tokens):
        if greedy:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float() / temperature, -1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        tokens.append(nxt)
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
    return Generation(prompt_ids, prompt_mask, comp, comp_mask, truncated=~is_eos.any(-1))


def decode(tok, gen: Generation) -> list[str]:
    """Completion text up to (not including) the end token."""
    rows = []
    for ids, m in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist()):
        ids = [i for i, keep in zip(ids, m) if keep and i != tok.eos_token_id]
        rows.append(tok.decode(ids, skip_special_tokens=True))
    return rows
