"""A tiny Qwen2-architecture causal LM with a byte-level BPE tokenizer and a chat template,
built on the fly (nothing is downloaded): what a user's Hugging Face model looks like to
evotrainer, at a size a CPU trains in seconds."""
from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def corpus(n: int = 2000) -> list[str]:
    rng = random.Random(0)
    words = ["the", "answer", "is", "sum", "of", "and", "what", "user", "assistant", "system", "say"]
    out = []
    for _ in range(n):
        a, b = rng.randrange(1000), rng.randrange(1000)
        out.append(f"{a}+{b}={a + b} " + " ".join(rng.choices(words, k=4)))
    return out


def build_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


def build_tiny_qwen(path: Path, hidden: int = 64, layers: int = 2, seed: int = 0, init: float = 0.02) -> Path:
    """`init`: the weights' initial std (Qwen2's default 0.02 leaves a random model's next-token
    distribution almost uniform: logits within about +-1 over 400 tokens)."""
    tok = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=True, initializer_range=init,
                         bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # as Qwen's instruct models: a turn ends at <|im_end|> or at <|endoftext|>
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    model.generation_config.pad_token_id = tok.pad_token_id
    path = Path(path)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
