"""From task prompts to token ids, the same way in training, evaluation and both backends.

A prompt is wrapped as one user message in the tokenizer's chat template when it has one
and the run asks for it (`PolicyConfig.chat_template`); otherwise it is plain text and the
tokenizer adds its own special tokens (a BOS for Llama-style tokenizers and our built-in
one, nothing for Qwen's). We never write a BOS ourselves: the tokenizer knows its model.
"""
from __future__ import annotations

import torch


def uses_chat_template(tok, chat_template: bool) -> bool:
    return bool(chat_template and getattr(tok, "chat_template", None))


def prompt_token_ids(tok, prompts: list[str], chat_template: bool = True) -> list[list[int]]:
    """Unpadded token ids of each prompt, ready for the completion to follow."""
    if uses_chat_template(tok, chat_template):
        texts = tok.apply_chat_template([[{"role": "user", "content": p}] for p in prompts],
                                        add_generation_prompt=True, tokenize=False)
        return tok(texts, add_special_tokens=False)["input_ids"]  # the template wrote its special tokens
    return tok(prompts, add_special_tokens=True)["input_ids"]


def pad_left(rows: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids [P, L] and their attention mask (generation appends on the right)."""
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, L - len(r):] = torch.tensor(r)
            mask[i, L - len(r):] = 1
    return ids.to(device), mask.to(device)


def encode_prompts(tok, prompts: list[str], chat_template: bool = True, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_left(prompt_token_ids(tok, prompts, chat_template), tok.pad_token_id, device)


def stop_token_ids(model, tok) -> list[int]:
    """Every id that ends a completion: the tokenizer's end token and each one the model's
    generation config lists (chat models end a turn with their own, e.g. <|im_end|>)."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tok.eos_token_id is not None and tok.eos_token_id not in ids:
        ids = [tok.eos_token_id, *ids]
    if not ids:
        raise ValueError("the tokenizer has no end token and the model's generation config lists none")
    return ids


def observation_token_ids(tok, text: str, chat_template: bool = True) -> list[int]:
    """Ids of an environment's observation, to append after a policy turn (never re-tokenized later).

    Plain text: the observation's own ids, no special tokens. With a chat template: what the
    template writes for a tool message and the next assistant header, found as the difference
    between a conversation rendered with and without it (verl's agent loop does the same),
    since templates only render whole conversations."""
    if not uses_chat_template(tok, chat_template):
        return tok(text, add_special_tokens=False)["input_ids"]
    before = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]
    head = tok.apply_chat_template(before, tokenize=False)
    full = tok.apply_chat_template(before + [{"role": "tool", "content": text}], add_generation_prompt=True,
                                   tokenize=False)
    if not full.startswith(head):
        raise ValueError("the chat template renders earlier messages differently once a tool message follows; "
                         "observations cannot be appended without re-tokenizing")
    return tok(full[len(head):], add_special_tokens=False)["input_ids"]
