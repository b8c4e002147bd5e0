"""Where and how a run trains: the same for every segment and evaluation of a run, and never
a harness choice (an agent may not move the run to another device or backend).

    backend: `embedded` (our GRPO trainer: small, readable, fast on a CPU) or `trl` (TRL's
        GRPOTrainer, for Hugging Face models on GPUs). Both take the same harness and write
        the same metrics and evidence; what a backend cannot express is refused by name
        before training.
    policy: dtype, device and chat template (evotrainer.policy.config.PolicyConfig), and the
        run's base, which `on_base` fills in for every job of the run.
    micro_batch_size: rows per forward/backward pass, gradients accumulated over the batch
        (0: the whole batch at once). The update is the same; only memory and speed change.
    use_vllm / vllm_mode: the TRL backend samples with vLLM (`colocate`: in the training
        process, sharing its GPU; `server`: a `trl vllm-serve` process). Needs vllm installed.
    gradient_checkpointing: recompute each layer's activations in the backward pass instead of
        keeping them (Chen et al. 2016): activation memory drops from one set per layer to
        about one layer's, for roughly one more forward's compute. Both backends; off by default
        (a small model on a CPU only slows down).
    data_parallel: training processes per segment, each with a copy of the model and a share
        of every step's prompts (whole groups), their gradients summed before each step so the
        update is the one process's (trainer/distributed.py); one per GPU on CUDA (a job is
        given that many), gloo on a CPU. Both backends (TRL under accelerate, its DDP), single-turn tasks.
    report_to: the run's trackers (config `tracking.report_to`), passed to TRL as its own
        `report_to`, so a TRL job also logs TRL's metrics into its train directory.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from evotrainer.errors import UsageError
from evotrainer.policy.config import PolicyConfig

BACKEND_NAMES = ("embedded", "trl")
VLLM_MODES = ("colocate", "server")


@dataclass(frozen=True)
class Runtime:
    backend: str = "embedded"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    micro_batch_size: int = 0
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    report_to: tuple[str, ...] = ()
    gradient_checkpointing: bool = False
    data_parallel: int = 1

    def validate(self, here: bool = True) -> "Runtime":
        """`here`: the jobs run on this machine (PolicyConfig.validate)."""
        if self.backend not in BACKEND_NAMES:
            raise UsageError(f"unknown backend '{self.backend}'; valid choices: {', '.join(BACKEND_NAMES)}")
        if self.micro_batch_size < 0:
            raise UsageError(f"micro_batch_size must be >= 0 (0: the whole batch), got {self.micro_batch_size}")
        if self.vllm_mode not in VLLM_MODES:
            raise UsageError(f"vllm_mode must be one of {', '.join(VLLM_MODES)}, got '{self.vllm_mode}'")
        if not isinstance(self.data_parallel, int) or self.data_parallel < 1:
            raise UsageError(f"data_parallel must be an integer >= 1, got {self.data_parallel!r}")
        if self.data_parallel > 1 and self.policy.dtype == "fp16":
            raise UsageError("data_parallel > 1 with dtype fp16: each rank's gradient scaler would skip steps on its "
                             "own; use bf16 or fp32")
        if self.use_vllm and self.backend != "trl":
            raise UsageError("use_vllm needs backend: trl (the embedded trainer samples with its own KV-cached loop)")
        self.policy.validate(here)
        if here and self.data_parallel > 1 and self.policy.resolved_device().type == "cuda":
            import torch
            if torch.cuda.device_count() < self.data_parallel:
                raise UsageError(f"data_parallel {self.data_parallel} asks for a GPU per process; torch sees "
                                 f"{torch.cuda.device_count()}")
        return self

    def on_base(self, base: str | Path) -> "Runtime":
        """This runtime for a run whose model is `base`: every checkpoint of the run is loaded
        with the base's config, tokenizer, chat template and generation config (only its weights
        are the checkpoint's), and a LoRA run's adapters all sit on it (PolicyConfig.base)."""
        return replace(self, policy=replace(self.policy, base=str(Path(base).resolve())))

    def to_dict(self) -> dict:
        return {"backend": self.backend, "policy": self.policy.to_dict(), "micro_batch_size": self.micro_batch_size,
                "use_vllm": self.use_vllm, "vllm_mode": self.vllm_mode, "report_to": list(self.report_to),
                "gradient_checkpointing": self.gradient_checkpointing, "data_parallel": self.data_parallel}

    @classmethod
    def of(cls, d: "dict | Runtime | None") -> "Runtime":
        if isinstance(d, Runtime):
            return d
        d = dict(d or {})
        return cls(**{**d, "policy": PolicyConfig.of(d.get("policy")), "report_to": tuple(d.get("report_to", ()))})
