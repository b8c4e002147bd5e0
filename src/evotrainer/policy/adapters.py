"""LoRA adapters (PEFT): only low-rank adapters train, and a checkpoint holds only them.

    lora:                 # in the run config (or `evotrainer train --lora-rank R`); null: full fine-tuning
      rank: 16            # r, the adapters' rank (LoRA, Hu et al. 2021)
      alpha: 32           # the update is scaled by alpha / rank
      dropout: 0.0        # dropout on the adapters' input (0: GRPO's log-prob ratios stay exact)
      target_modules: all-linear   # PEFT's names: all-linear (every linear layer but the output head)
                                   # or a list such as [q_proj, v_proj]

Every checkpoint of a LoRA run is an adapter on one base, the run's model (PolicyConfig.base,
filled in from `model` by the run, never read from a checkpoint: a job writes its checkpoint's
files, so its adapter_config.json could name any model; nor is the adapter's shape read from
there: the run's spec is handed to PEFT as the config, and adapter_config.json is only checked
to be a LoRA adapter's). Of an adapter checkpoint only adapter_model.safetensors is read.
Training loads base + adapter with the adapter trainable and the base frozen; the evaluator
merges the adapter into the base and scores the merged model. A KL penalty's reference is
the segment's starting policy without a second model: the base with the adapter disabled
where the adapter is new (its B is zero, so that IS the start), else a frozen copy of the
starting adapter (adapter-sized), as TRL does.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path

from evotrainer.errors import UsageError

ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
REF = "ref"  # the frozen copy of a continued adapter (the KL reference)


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"
    base: str = ""  # the run's base as `evotrainer evaluate --run` names it (PolicyConfig.base_dir)

    def validate(self) -> "LoraSpec":
        if not isinstance(self.rank, int) or self.rank < 1:
            raise UsageError(f"lora.rank must be an integer >= 1, got {self.rank!r}")
        if not self.alpha > 0:
            raise UsageError(f"lora.alpha must be > 0, got {self.alpha!r}")
        if not 0 <= self.dropout < 1:
            raise UsageError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules or not isinstance(self.target_modules, (str, tuple)):
            raise UsageError("lora.target_modules must be all-linear or a list of module names such as [q_proj, v_proj]")
        peft_module()
        return self

    def peft_config(self):
        from peft import LoraConfig
        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets,
                          task_type="CAUSAL_LM")

    def to_dict(self) -> dict:
        d = asdict(self)
        if isinstance(self.target_modules, tuple):
            d["target_modules"] = list(self.target_modules)
        return d

    @classmethod
    def of(cls, d: "dict | LoraSpec | None") -> "LoraSpec | None":
        if d is None or isinstance(d, LoraSpec):
            return d
        if not isinstance(d, dict):
            raise UsageError(f"lora must be a mapping (rank, alpha, dropout, target_modules) or null, got {d!r}")
        unknown = set(d) - {"rank", "alpha", "dropout", "target_modules", "base"}
        if unknown:
            raise UsageError(f"lora has no key '{sorted(unknown)[0]}'; valid keys: rank, alpha, dropout, target_modules")
        targets = d.get("target_modules", "all-linear")
        return cls(**{**d, "target_modules": targets if isinstance(targets, str) else tuple(targets)})


def peft_module():
    try:
        import peft
    except ImportError:
        raise UsageError("lora needs PEFT: pip install 'evotrainer[peft]' (or pip install peft)") from None
    return peft


def is_adapter(path: Path | str) -> bool:
    """A checkpoint that holds an adapter, not a whole model."""
    return Path(path, ADAPTER_WEIGHTS).is_file()


def attach(model, spec: LoraSpec, start: Path | str, trainable: bool):
    """The model (the base, loaded) with the run's adapter: the one saved at `start` if `start`
    holds one, else a new one (B = 0: the base's outputs, unchanged). Not `trainable`: the
    adapter merged into the base, a plain model for the evaluator."""
    peft = peft_module()
    continued = is_adapter(start)
    if continued:
        model = peft.PeftModel.from_pretrained(model, str(start), config=spec.peft_config(), is_trainable=trainable)
    else:
        model = peft.get_peft_model(model, spec.peft_config())
    if not trainable:
        return model.merge_and_unload()
    model.evo_continued = continued  # the KL reference: see `reference`
    return model


def reference(model):
    """A context in which `model` (a PeftModel) computes the KL reference's log-probs: its
    starting policy (module doc). Call once, before training, to freeze the copy."""
    if not getattr(model, "evo_continued", False):
        return model.disable_adapter
    if REF not in model.peft_config:
        model.add_adapter(REF, model.peft_config["default"])
        for name, p in model.named_parameters():
            if ".default." in name:
                model.get_parameter(name.replace(".default.", f".{REF}.")).data.copy_(p.data)
        model.base_model.set_adapter("default")  # the copy frozen, the adapter trainable again

    @contextlib.contextmanager
    def use_ref():
        model.base_model.set_adapter(REF)
        try:
            yield
        finally:
            model.base_model.set_adapter("default")
    return use_ref


def trainable(model) -> list:
    """The parameters an optimizer steps: the adapters' under LoRA, every one otherwise."""
    return [p for p in model.parameters() if p.requires_grad]


def checkpoint_size(path: Path | str) -> dict:
    """What a checkpoint holds: its weights' bytes, and whether they are an adapter."""
    path = Path(path)
    weights = [f for f in path.glob("*.safetensors")]
    return {"adapter": is_adapter(path), "weights_bytes": sum(f.stat().st_size for f in weights)}
