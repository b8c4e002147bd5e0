"""The tiny policy: a ~1M-parameter Llama-style causal LM and a character tokenizer.

Both are built locally (nothing is downloaded) and saved in Hugging Face format, so any
transformers-based tool (TRL included) can load them with `from_pretrained`.
"""
from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from evotrainer.errors import UsageError

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Printable ASCII without the vertical whitespace that string.printable also holds.
CHARS = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"] + ["\n"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One token per character; Fuse() glues them back without spaces when decoding.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
        unk_token="<unk>", padding_side="left",  # left padding: generation appends on the right
    )
    return tok


def build_model(vocab_size: int, hidden: int = 128, layers: int = 4, heads: int = 4,
                ffn: int = 512, max_positions: int = 512, seed: int = 0) -> LlamaForCausalLM:
    """Llama config of ~1.05M parameters at the defaults (hidden 128, 4 layers, FFN 512)."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=ffn,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = 0
    return model


def save_policy(model, tok, path: Path) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)


def load_policy(path: Path):
    path = Path(path)
    if not (path / "config.json").exists():
        raise UsageError(f"no checkpoint at '{path}' (expected config.json and model weights; "
                         "run `evotrainer pretrain` or pass --base PATH to a checkpoint)")
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = PreTrainedTokenizerFast.from_pretrained(path)
    return model, tok
