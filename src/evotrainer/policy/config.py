"""How every process of a run loads, places and prompts a checkpoint.

One `PolicyConfig` travels with each job (training workers, the evaluator) as a plain
dict, so the policy trains and is judged on the same device, precision and prompt format.

    dtype: precision of the forward and backward passes: `bf16` and `fp16` autocast the
        model's matmuls (fp16 with a gradient scaler). `auto`: bf16 on a CUDA device that
        supports it, else fp32 (CPU autocast is slower than fp32 for small models, and MPS
        autocast is incomplete).
    weights: the dtype the weights are held in. `fp32` (the default; TRL's too: fp32 weights,
        bf16 mixed precision): weights, gradients and AdamW's two moments take 16 bytes a
        parameter. `bf16`: the weights and their gradients in bf16, and torch's AdamW keeps
        its moments in the weights' dtype: 8 bytes a parameter, but an update smaller than
        bf16's resolution (1/128 of a weight) is lost, so full fine-tuning in bf16 wants a
        larger learning rate or `lora`. With `lora` the base is frozen in bf16 and the adapters
        stay fp32 (with fp32 moments): the usual recipe for a model that does not fit.
    lora: train LoRA adapters instead of every weight (policy/adapters.py; null: full fine-tuning).
    device: `auto` picks cuda, then mps, then cpu; or name one (`cpu`, `cuda`, `cuda:1`, `mps`).
    chat_template: wrap each prompt as one user message in the tokenizer's chat template,
        when it has one (instruction-tuned models expect it); off, or without a template,
        prompts are plain text and the tokenizer adds whatever special tokens it adds
        (a BOS for Llama-style tokenizers, nothing for Qwen's).
    base: the run's base model directory, filled in by the run (`Runtime.on_base`), never
        written in a config. Every checkpoint of the run is loaded with the base's model
        config, generation config, tokenizer and chat template, and only its weights are the
        checkpoint's: a job writes its checkpoint's files, and a tokenizer or template from
        there would decide what the evaluator asks and where it stops (policy/model.py,
        load_policy). Empty where no run is known (library use): a checkpoint is its own base.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch

from evotrainer.errors import UsageError
from evotrainer.policy.adapters import LoraSpec

DTYPES = ("auto", "fp32", "bf16", "fp16")
WEIGHT_DTYPES = ("fp32", "bf16")
FP16_NEEDS_CUDA = "dtype fp16 needs a CUDA device (its gradient scaler is CUDA's); use bf16 or fp32"
_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class PolicyConfig:
    dtype: str = "auto"
    device: str = "auto"
    chat_template: bool = True
    weights: str = "fp32"
    lora: LoraSpec | None = None
    base: str = ""

    def validate(self, here: bool = True) -> "PolicyConfig":
        """`here`: the jobs run on this machine, so the device must exist here (with a Ray
        executor they run on the cluster's nodes, which check it as they load the policy)."""
        if self.dtype not in DTYPES:
            raise UsageError(f"dtype must be one of {', '.join(DTYPES)}, got '{self.dtype}'")
        if self.weights not in WEIGHT_DTYPES:
            raise UsageError(f"weights must be one of {', '.join(WEIGHT_DTYPES)}, got '{self.weights}'")
        if self.weights == "bf16" and self.dtype == "fp16":
            raise UsageError("weights bf16 with dtype fp16: the forward would run in fp16 on bf16 weights; "
                             "use dtype bf16 or auto")
        if self.lora is not None:
            self.lora.validate()
        kind = self.device.split(":")[0]
        if kind not in ("auto", "cpu", "cuda", "mps"):
            raise UsageError(f"device must be auto, cpu, cuda, cuda:N or mps, got '{self.device}'")
        if not here:
            if self.dtype == "fp16" and kind in ("cpu", "mps"):
                raise UsageError(FP16_NEEDS_CUDA)
            return self
        if kind == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"device '{self.device}' asked for, but torch sees no CUDA device "
                             f"(torch {torch.__version__}); use device: cpu or auto")
        if kind == "mps" and not torch.backends.mps.is_available():
            raise UsageError("device 'mps' asked for, but torch sees no MPS device; use device: cpu or auto")
        if self.dtype == "fp16" and self.resolved_device().type != "cuda":
            raise UsageError(FP16_NEEDS_CUDA)
        return self

    def resolved_device(self) -> torch.device:
        if self.device != "auto":
            return torch.device(self.device)
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")

    def compute_dtype(self) -> torch.dtype:
        """The autocast dtype (fp32: no autocast)."""
        if self.dtype != "auto":
            return _TORCH_DTYPES[self.dtype]
        dev = self.resolved_device()
        return torch.bfloat16 if dev.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32

    def autocast(self):
        """Mixed precision around the model's forward passes (a no-op at fp32)."""
        dtype = self.compute_dtype()
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.resolved_device().type, dtype=dtype)

    def weights_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self.weights]

    def base_dir(self) -> str:
        """The run's base directory, "" where none is known. A LoRA spec's own `base` is what
        `evotrainer evaluate --run` and older records name; the policy's, where set, is the run's."""
        return self.base or (self.lora.base if self.lora is not None else "")

    def reads(self) -> tuple[str, ...]:
        """What a job loading a checkpoint under this config reads besides it: the run's base."""
        return (self.base_dir(),) if self.base_dir() else ()

    def to_dict(self) -> dict:
        return {**asdict(self), "lora": None if self.lora is None else self.lora.to_dict()}

    @classmethod
    def of(cls, d: "dict | PolicyConfig | None") -> "PolicyConfig":
        if isinstance(d, PolicyConfig):
            return d
        d = dict(d or {})
        return cls(**{**d, "lora": LoraSpec.of(d.get("lora"))})
