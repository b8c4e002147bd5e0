"""What a trial measured, as its lineage row holds it: the state it trained (checkpoints and
scores per seed), the promotion gate's decision against its control, and, for the root, the
noise replicas the gate's null comes from.

The row stores it as one flat JSON object (`to_json`), key for key what the controller wrote
before outcomes were typed, so a run recorded then reads back here (`Fitness.of`) and a run
recorded now reads the same way. JSON object keys are strings: seeds are ints once read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from evotrainer.lineage.state import State

_GATE = ("gain", "se", "threshold", "rule", "control_val", "extra_pairs")


def _seeds(m: Mapping | None) -> dict[int, float]:
    return {int(k): float(v) for k, v in (m or {}).items()}


@dataclass(frozen=True)
class Decision:
    """The promotion gate's decision as recorded (evolve/stats/gate.py decides it)."""
    gain: float | None                 # mean paired difference, child - control (None: not recorded)
    se: float | None = None            # its standard error, pooled with the run's null
    threshold: float | None = None     # what the gain had to beat
    rule: str = ""                     # keep | more | discard | blocking
    control_val: dict[int, float] = field(default_factory=dict)   # the control's validation per seed
    extra_pairs: tuple[tuple[float, float], ...] = ()              # (child, control) of extra seed pairs

    def to_json(self) -> dict:
        out = {"gain": self.gain, "se": self.se, "threshold": self.threshold, "rule": self.rule,
               "control_val": self.control_val, "extra_pairs": [list(p) for p in self.extra_pairs]}
        return {k: v for k, v in out.items() if v not in (None, "")}

    @classmethod
    def of(cls, d: Mapping) -> "Decision | None":
        if not any(k in d for k in _GATE):
            return None
        return cls(d.get("gain"), d.get("se"), d.get("threshold"), d.get("rule") or "",
                   _seeds(d.get("control_val")), tuple(tuple(p) for p in d.get("extra_pairs") or ()))


@dataclass(frozen=True)
class Fitness:
    """A trial's measurements. Empty for a trial that trained nothing (refused, crashed)."""
    val: dict[int, float] = field(default_factory=dict)    # seed -> validation accuracy
    test: dict[int, float] = field(default_factory=dict)   # seed -> test accuracy (never read by a decision)
    state: State | None = None         # the state it trained: its checkpoints per seed
    decision: Decision | None = None   # the promotion gate's, where it was judged
    noise_sd: float | None = None      # the root's: the spread of its replicas around it
    replicas: tuple[dict[int, float], ...] = ()   # the root's: each noise replica's validation per seed

    @classmethod
    def measured(cls, state: State, decision: Decision | None = None) -> "Fitness":
        return cls(state.val, state.test, state, decision)

    @property
    def mean_val(self) -> float | None:
        return sum(self.val.values()) / len(self.val) if self.val else None

    @property
    def gain(self) -> float | None:
        return self.decision.gain if self.decision else None

    @property
    def dirs(self) -> dict[int, str]:
        """seed -> the train directory of its checkpoint (none where nothing trained)."""
        return self.state.dirs if self.state else {}

    def to_json(self) -> dict:
        out: dict = {}
        if self.val:
            out["val"] = self.val
        if self.test:
            out["test"] = self.test
        if self.state is not None:
            out["state"] = self.state.to_json()
        if self.decision is not None:
            out |= self.decision.to_json()
        if self.noise_sd is not None:
            out["noise_sd"] = self.noise_sd
        if self.replicas:
            out["replicas"] = list(self.replicas)
        return out

    @classmethod
    def of(cls, d: "Mapping | Fitness | None") -> "Fitness":
        """A row's fitness (a dict, as stored) read back; a Fitness is returned as it is."""
        if isinstance(d, Fitness):
            return d
        d = d or {}
        return cls(_seeds(d.get("val")), _seeds(d.get("test")), State.of(d["state"]) if d.get("state") else None,
                   Decision.of(d), d.get("noise_sd"), tuple(_seeds(r) for r in d.get("replicas") or ()))
