"""Policies: any Hugging Face causal LM, and the built-in tiny one.

`load_policy` loads any checkpoint in Hugging Face format (`AutoModelForCausalLM` and
`AutoTokenizer`): a user's model, or one of ours; of a checkpoint a job wrote, only the
weights, on the run's base (its config, tokenizer, chat template, stop tokens). The built-in
policy, a ~1M-parameter Llama-style model with a character tokenizer, is built locally
(nothing is downloaded) and saved in the same format, so TRL and every transformers-based
tool load it too. It is the default when a run names no `model`.
"""
from __future__ import annotations

import json
import os
import re
import stat
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig,
                          LlamaForCausalLM, PreTrainedTokenizerFast)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from evotrainer.errors import UsageError
from evotrainer.policy.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, attach, is_adapter
from evotrainer.policy.config import PolicyConfig
from evotrainer.policy.weights import check_weights  # noqa: F401 (here too; weights.py imports no torch)

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Printable ASCII without the vertical whitespace that string.printable also holds.
CHARS = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"] + ["\n"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One token per character; Fuse() glues them back without spaces when decoding.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    # The tokenizer, not the trainer, says that a text starts with <bos> (as Llama's do): prompts are
    # encoded with add_special_tokens=True for every model, and Qwen's tokenizer adds nothing there.
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
        unk_token="<unk>", padding_side="left",  # left padding: generation appends on the right
    )
    return tok


def build_model(vocab_size: int, *, hidden: int = 128, layers: int = 4, heads: int = 4,
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
    """A checkpoint in Hugging Face format; a LoRA policy's holds its adapter only (adapters.py)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    (path / "README.md").unlink(missing_ok=True)  # PEFT's model card: a template, nothing of ours
    tok.save_pretrained(path)
    # transformers writes the weights 0600; a checkpoint is read by other processes, sandboxed
    # jobs running as nobody among them (evotrainer.sandbox), as under the usual umask 022
    for f in path.iterdir():
        if f.is_file():
            f.chmod(f.stat().st_mode | 0o044)


class BadCheckpoint(UsageError):
    """A checkpoint the loader refuses: one line naming the file and why."""


# every file save_policy (model and tokenizer .save_pretrained) and the trainer write into a
# checkpoint; optimizer.pt is the next training segment's (loaded weights-only, never by the evaluator).
# The tokenizer, chat template and generation config files stay accepted, so that a checkpoint is a
# whole Hugging Face model to any tool (save_policy writes the run's base's there), and no process
# of a run reads them: load_policy takes those from the run's base (docs/sandbox.md)
WRITTEN = re.compile(r"(config|adapter_config|generation_config|tokenizer|tokenizer_config|special_tokens_map|added_tokens|vocab)"
                     r"\.json|(adapter_)?model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json|merges\.txt|"
                     r"vocab\.txt|tokenizer\.model|chat_template\.(jinja|json)|optimizer\.pt")
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")  # formats whose loading can run code
MAX_ENTRIES = 10000
MAX_CONFIG_BYTES = 2 ** 20


def check_checkpoint(path: Path | str, written: bool = False) -> None:
    """Raise BadCheckpoint unless `path` is a checkpoint the loader reads as plain data: a
    directory of regular files, no link leading out of it (a Hugging Face cache snapshot's
    links lead into its repository's blobs/), weights in *.safetensors, a config.json that is
    a JSON object naming a model_type. `written`: a job wrote it (harness code ran there), so
    it must be exactly what save_policy writes: no links at all, no subdirectory, none but the
    expected files, no pickled weights, a causal LM's config without custom code.

    Whole weights with an adapter_config.json beside them are refused: transformers would load
    an adapter from there onto them (or, without a config.json, the model the file names)."""
    path = Path(path)
    if path.is_symlink() and written:
        raise BadCheckpoint(f"checkpoint '{path}' is a symbolic link")
    if not path.is_dir():
        raise BadCheckpoint(f"checkpoint '{path}' is not a directory")
    real = path.resolve()
    home = real.parent.parent if real.parent.name == "snapshots" else real  # a cache snapshot's repository
    seen = 0
    for top, dirs, files in os.walk(path):  # links are looked at, never followed
        seen += len(dirs) + len(files)
        if seen > MAX_ENTRIES:
            raise BadCheckpoint(f"checkpoint '{path}' holds more than {MAX_ENTRIES} files")
        for name in dirs + files:
            f = Path(top, name)
            rel, mode = _shown(f.relative_to(path)), os.lstat(f).st_mode
            if stat.S_ISLNK(mode):
                if written:
                    raise BadCheckpoint(f"checkpoint '{path}': {rel} is a symbolic link")
                if not f.resolve().is_relative_to(home):
                    raise BadCheckpoint(f"checkpoint '{path}': {rel} links outside the checkpoint")
            elif not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
                raise BadCheckpoint(f"checkpoint '{path}': {rel} is not a regular file")
            elif written and name.endswith(PICKLED) and name != "optimizer.pt":
                raise BadCheckpoint(f"checkpoint '{path}': {rel}: weights must be *.safetensors "
                                    "(a pickle can run code as it loads)")
            elif written and (stat.S_ISDIR(mode) or not WRITTEN.fullmatch(name)):
                raise BadCheckpoint(f"checkpoint '{path}': {rel} is not a file a checkpoint holds")
    if not any(path.glob("*.safetensors")):
        raise BadCheckpoint(f"checkpoint '{path}' has no *.safetensors weights (evotrainer loads no other "
                            "format: a pickle can run code as it loads); save it with safe_serialization=True")
    index = path / "model.safetensors.index.json"
    try:  # its shards are files of this checkpoint (a name with a / could pick another's weights)
        shards = set(json.loads(index.read_text())["weight_map"].values()) if index.is_file() else set()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise BadCheckpoint(f"checkpoint '{path}': model.safetensors.index.json is not an index ({type(e).__name__})") from None
    for shard in shards:
        if not isinstance(shard, str) or "/" in shard or not (path / shard).is_file():
            raise BadCheckpoint(f"checkpoint '{path}': its index names {_shown(shard)}, not a file of the checkpoint")
    adapter = (path / ADAPTER_WEIGHTS).is_file()
    if not adapter and os.path.lexists(path / ADAPTER_CONFIG):
        raise BadCheckpoint(f"checkpoint '{path}' holds whole weights and an {ADAPTER_CONFIG} "
                            "(transformers would load an adapter from it)")
    config = path / (ADAPTER_CONFIG if adapter else "config.json")
    try:
        if config.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES} bytes")
        cfg = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise BadCheckpoint(f"checkpoint '{path}': {config.name} is not readable JSON ({e})") from None
    if adapter:  # its shape is the run's LoRA spec, never read from here (adapters.attach)
        if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
            raise BadCheckpoint(f"checkpoint '{path}': {ADAPTER_CONFIG} is not a LoRA adapter's config")
        if (path / "config.json").exists():  # nothing reads one here, and nothing should start to
            raise BadCheckpoint(f"checkpoint '{path}' holds an adapter and a model config.json")
        return
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
        raise BadCheckpoint(f"checkpoint '{path}': config.json is not a model config (no model_type)")
    if written and (cfg["model_type"] not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or "auto_map" in cfg):
        raise BadCheckpoint(f"checkpoint '{path}': config.json names a {cfg['model_type']} model"
                            f"{' with custom code (auto_map)' if 'auto_map' in cfg else ''}, not one it was trained from")


def _shown(name) -> str:
    """A name from a checkpoint's files, safe in a one-line message (a job chose it)."""
    return ascii(str(name))[1:-1][:120]


def resolve_model(name: str | Path) -> str:
    """A local directory for `name` (a directory, or a hub id already in the local cache),
    checked to hold a causal LM and a tokenizer. Nothing is downloaded: workers load the
    returned directory, so every process of a run reads the same files."""
    path = Path(name).expanduser()
    if not path.exists():
        if str(name).startswith((".", "/", "~")) or str(name).count("/") != 1:
            raise UsageError(f"no model at '{name}' (expected a directory with config.json, or a hub id "
                             "such as Qwen/Qwen2.5-0.5B-Instruct that is already in the local cache)")
        from huggingface_hub import snapshot_download
        try:
            path = Path(snapshot_download(str(name), local_files_only=True))
        except Exception:
            raise UsageError(f"model '{name}' is neither a directory nor in the local Hugging Face cache; "
                             f"download it first (`hf download {name}`) or pass a directory") from None
    if not (path / "config.json").is_file():
        raise UsageError(f"no checkpoint at '{path}' (expected config.json and model weights; "
                         "run `evotrainer pretrain` or pass --model PATH to a Hugging Face model directory)")
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:
        raise UsageError(f"'{path}/config.json' is not a model config transformers can read: "
                         f"{str(e).splitlines()[0][:200]}") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UsageError(f"'{path}' holds a {config.model_type} model, which is not a causal LM "
                         "(AutoModelForCausalLM cannot load it); pass a decoder-only model such as Qwen2, Llama or GPT-2")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        raise UsageError(f"'{path}' has no tokenizer files (tokenizer.json or tokenizer_config.json); "
                         "save the tokenizer beside the model with tokenizer.save_pretrained")
    check_checkpoint(path)  # what every worker's load will check, said here first
    return str(path.resolve())


def load_policy(path: Path | str, cfg: PolicyConfig | None = None, trainable: bool = False):
    """(model, tokenizer) of a Hugging Face checkpoint on cfg's device, its weights in cfg's
    `weights` dtype. Under `cfg.lora` the model is the run's base with its adapter: the one
    `path` holds, or (`path` is the base) a new one where the model is to be `trainable`;
    for the evaluator (not trainable) the adapter is merged into the base.

    Only the weights are the checkpoint's. The model config, the generation config (the stop
    tokens), the tokenizer and its chat template are the run's base's (`cfg.base_dir()`), for
    the evaluator and for training alike: a job writes its checkpoint's files, and a chat
    template is a program over every prompt it renders, held-out ones included; a generation
    config decides where completions stop. A checkpoint's config.json is not read (the
    architecture is the base's; check_checkpoint parses it as plain JSON, no more), nor are
    its tokenizer, template and generation files. Where no base is known (library use,
    `evotrainer evaluate --model DIR`) the checkpoint is its own base.

    The tokenizer pads on the left (generation appends on the right) and, if it has no
    pad token, pads with its end token (as TRL does); pads are always masked out."""
    path = Path(path)
    cfg = cfg or PolicyConfig()
    lora = cfg.lora
    if is_adapter(path) and lora is None:
        raise BadCheckpoint(f"checkpoint '{path}' is a LoRA adapter: load it under the run's lora config "
                            "(its base is the run's model)")
    if not (path / "config.json").exists() and not is_adapter(path):
        raise BadCheckpoint(f"no checkpoint at '{path}' (expected config.json and model weights; "
                            "run `evotrainer pretrain` or pass --model PATH to a checkpoint)")
    # a checkpoint a worker wrote is data from harness code: weights load only from safetensors,
    # no file it links out to is read, and no code named in its config ever runs (a job's
    # checkpoints were also checked, strictly, when it ended: executors.worker)
    check_checkpoint(path)
    if lora is not None and not cfg.base_dir():
        raise UsageError("lora: the run's base model is not set (lora.base)")
    base = Path(cfg.base_dir() or path)
    own = path.resolve() == base.resolve()
    if lora is not None and not is_adapter(path) and not own:
        # a job of a LoRA run writes adapters; full weights in its place would escape the adapter
        raise BadCheckpoint(f"checkpoint '{path}' holds whole weights, but this run trains LoRA adapters on {base}")
    if not own:
        check_checkpoint(base)
    model = weights_on_base(base if lora is not None else path, base, cfg)
    if lora is not None and (trainable or is_adapter(path)):
        model = attach(model, lora, path, trainable)
    model = model.to(cfg.resolved_device())
    tok = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def weights_on_base(weights_from: Path, base: Path, cfg: PolicyConfig):
    """The base's model with `weights_from`'s weights. transformers is handed the base's config
    and generation config, so it reads neither from `weights_from` (a config there could name
    other weight files, `transformers_weights`, or custom code, `auto_map`): it reads the
    weights, model.safetensors or the shards its index lists, and nothing else there."""
    kw = dict(dtype=cfg.weights_dtype(), trust_remote_code=False, use_safetensors=True)
    if weights_from.resolve() == base.resolve():
        return AutoModelForCausalLM.from_pretrained(base, **kw)
    config = AutoConfig.from_pretrained(base, trust_remote_code=False)
    # its name stays `weights_from`: TRL builds its KL reference by loading the model from its name,
    # and that reference is the segment's start (and its colocated vLLM loads from there too)
    return AutoModelForCausalLM.from_pretrained(weights_from, config=config,
                                                generation_config=base_generation_config(base, config), **kw)


def base_generation_config(base: Path, config) -> GenerationConfig:
    """The base's generation config; one made from its model config where it has none (as
    transformers' own load does)."""
    try:
        return GenerationConfig.from_pretrained(base)
    except OSError:
        return GenerationConfig.from_model_config(config)
