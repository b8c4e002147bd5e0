"""KV-cached sampling of a batch of completions, shared by training and evaluation.

A hand-rolled loop instead of `model.generate`, for three savings: each distinct prompt goes
through the model once and its KV cache is shared by all the rows that answer it (a GRPO
group of 8 pays for one prompt forward, not 8); rows that wrote their end token leave the
batch (and the cache) once an eighth of it has, so a batch whose answers differ in length
stops paying for the finished ones (a seed still samples what it sampled with the whole
batch); and we stop as soon as every row has ended. Without left padding we pass no
attention mask, so attention takes the fused causal path. Prompts are encoded by
`evotrainer.policy.prompts`.
"""
from __future__ import annotations

import functools
import inspect
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


# rows that ended leave the model's batch once this share of it has: each time, the KV cache
# is copied without them (about what one more token's cache update costs)
LEAVE_SHARE = 1 / 8


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def with_cache(model, cache) -> dict:
    """The KV cache as a forward's keyword: `cache` from transformers 5 on, `past_key_values`
    before (5 still takes the old name, but prints a deprecation line in every process)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model passes it on
    return {_cache_keyword(type(inner)): cache}


@functools.lru_cache(maxsize=None)
def _cache_keyword(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def cache_of(out):
    """The KV cache a forward returned (`cache` from transformers 5 on, `past_key_values` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def prompt_forward(model, prompt_ids, prompt_mask, index):
    """Run each distinct prompt once; return its last logits and KV cache, one row per `index`."""
    padded = bool((prompt_mask == 0).any())
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask if padded else None,
                position_ids=position_ids(prompt_mask), use_cache=True)
    cache = cache_of(out)
    cache.batch_select_indices(index)  # rows share their prompt's keys and values
    return out.logits[index, -1], cache


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Top-k, then nucleus (top-p) filtering of [B, V] logits, as transformers orders them:
    tokens outside are set to -inf. top_k 0 and top_p 1.0 keep every token."""
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # mass before the token already covers top_p
        drop[..., 0] = False                               # the most likely token always stays
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, max_new_tokens: int,
             stop_ids: int | list[int], pad_id: int, temperature: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None, repeats: int = 1, top_k: int = 0,
             top_p: float = 1.0, index: torch.Tensor | None = None) -> Generation:
    """`repeats` completions per prompt (a GRPO group), rows of one prompt contiguous; or,
    given `index`, one completion per entry, continuing prompt `index[b]` (multi-turn
    episodes whose histories coincide share one prompt forward).

    A row ends at the first of `stop_ids` (every end-of-sequence id the model's generation
    config lists). Tensors live on the prompts' device; the log-probs and entropies are
    those of the distribution sampled from (temperature, then top-k / top-p)."""
    dev = prompt_ids.device
    stops = torch.tensor([stop_ids] if isinstance(stop_ids, int) else list(stop_ids), device=dev)
    if index is None:
        index = torch.arange(prompt_ids.shape[0], device=dev).repeat_interleave(repeats)
    B = index.shape[0]
    logits, cache = prompt_forward(model, prompt_ids, prompt_mask, index)
    mask = prompt_mask[index] if bool((prompt_mask == 0).any()) else None
    next_pos = position_ids(prompt_mask)[index, -1:] + 1
    # `rows`: the batch rows still in the model's batch (and its cache), in order; `logits`,
    # `mask` and `next_pos` hold those rows only
    rows, done = torch.arange(B, device=dev), torch.zeros(B, dtype=torch.bool, device=dev)
    tokens, logps, ents = [], [], []
    for t in range(max_new_tokens):
        # evidence comes for free: the sampling distribution is already computed here
        scaled = logits.float() / (1.0 if greedy else temperature)
        if not greedy:
            scaled = filter_logits(scaled, top_k, top_p)
        logp_all = torch.log_softmax(scaled, -1)
        p = logp_all.exp()
        if greedy:
            nxt = logits.argmax(-1)
        elif len(rows) < B:
            # the rows out of the batch draw too (a pad, surely): the sampler's draws per row do
            # not depend on its probabilities, so every row gets the draws it got with the whole batch
            whole = p.new_zeros(B, p.shape[-1])
            whole[:, pad_id] = 1.0
            whole[rows] = p
            nxt = torch.multinomial(whole, 1, generator=generator).squeeze(-1)[rows]
        else:
            nxt = torch.multinomial(p, 1, generator=generator).squeeze(-1)
        nxt = torch.where(done[rows], torch.full_like(nxt, pad_id), nxt)
        # rows out of the batch ended earlier: a pad, log-prob and entropy 0
        tokens.append(torch.full((B,), pad_id, dtype=nxt.dtype, device=dev).index_put((rows,), nxt))
        logps.append(logp_all.new_zeros(B).index_put((rows,), logp_all.gather(-1, nxt[:, None]).squeeze(-1)))
        ents.append(logp_all.new_zeros(B).index_put((rows,), -(p * logp_all.masked_fill(p == 0, 0.0)).sum(-1)))
        done[rows] |= torch.isin(nxt, stops)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        stay = ~done[rows]
        if len(rows) - int(stay.sum()) >= LEAVE_SHARE * len(rows):
            keep = stay.nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            rows, nxt, next_pos = rows[keep], nxt[keep], next_pos[keep]
            mask = None if mask is None else mask[keep]
        if mask is not None:
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype, device=dev)], dim=1)
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=next_pos,
                    **with_cache(model, cache), use_cache=True)
        cache, logits, next_pos = cache_of(out), out.logits[:, -1], next_pos + 1
    comp = torch.stack(tokens, dim=1)
    # mask covers tokens up to and including the first end token
    is_stop = torch.isin(comp, stops)
    after_stop = (is_stop.cumsum(-1) - is_stop.long()) > 0
    comp_mask = (~after_stop).long()
    # where, not a product: under top-k / top-p the pad after an end token may be filtered out
    # (log-prob -inf), and -inf x 0 is NaN
    live = comp_mask.bool()
    return Generation(prompt_ids, prompt_mask, index, comp, comp_mask, truncated=~is_stop.any(-1),
                      logprobs=torch.stack(logps, 1).where(live, 0.0), entropy=torch.stack(ents, 1).where(live, 0.0))


def select_rows(gen: Generation, rows: torch.Tensor) -> Generation:
    """The same generation restricted to some rows, keeping only the prompts they answer."""
    used, index = gen.prompt_index[rows].unique(return_inverse=True)
    return Generation(gen.prompt_ids[used], gen.prompt_mask[used], index,
                      *(getattr(gen, f)[rows] for f in (
                          "completion_ids", "completion_mask", "truncated", "logprobs", "entropy")))


def concat_generations(gens: list[Generation], pad_id: int) -> Generation:
    """Several generations as one batch (dynamic sampling's rounds): prompts left-padded and
    completions right-padded to the widest, each row still pointing at its own prompt."""
    if len(gens) == 1:
        return gens[0]
    L, T = max(g.prompt_ids.shape[1] for g in gens), max(g.completion_ids.shape[1] for g in gens)
    left = lambda x, v: torch.nn.functional.pad(x, (L - x.shape[1], 0), value=v)  # noqa: E731
    right = lambda x, v: torch.nn.functional.pad(x, (0, T - x.shape[1]), value=v)  # noqa: E731
    offsets = torch.tensor([0] + [len(g.prompt_ids) for g in gens[:-1]]).cumsum(0).tolist()
    return Generation(torch.cat([left(g.prompt_ids, pad_id) for g in gens]),
                      torch.cat([left(g.prompt_mask, 0) for g in gens]),
                      torch.cat([g.prompt_index + o for g, o in zip(gens, offsets)]),
                      torch.cat([right(g.completion_ids, pad_id) for g in gens]),
                      torch.cat([right(g.completion_mask, 0) for g in gens]),
                      torch.cat([g.truncated for g in gens]),
                      torch.cat([right(g.logprobs, 0.0) for g in gens]),
                      torch.cat([right(g.entropy, 0.0) for g in gens]))


def decode(tok, gen: Generation) -> list[str]:
    """Completion text up to (not including) the end token."""
    rows = [ids[:n - (not tr)] for ids, n, tr in zip(gen.completion_ids.tolist(), gen.lengths.tolist(),
                                                     gen.truncated.tolist())]
    return decode_ids(tok, rows)


def decode_ids(tok, rows: list[list[int]]) -> list[str]:
    """Text of completions given as ids without their end token (special tokens dropped)."""
    return tok.batch_decode(rows, skip_special_tokens=True)
