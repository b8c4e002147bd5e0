"""What a diagnostic is, and the rule engine that turns its value into a finding.

A diagnostic is a metric function over `Evidence` with its thresholds and the
intervention family a finding suggests, written with the `@diagnostic` decorator:

    @diagnostic("signal", warn=0.3, critical=0.5, suggest="reward: make it more continuous")
    def dead_group_ratio(ev: Evidence) -> float | None: ...

`scope="last"` (the default) evaluates it on the last fifth of the steps, the state a
child version inherits; `scope="run"` hands it the whole evidence (trend diagnostics
compare `ev.first` with `ev.last` themselves). `suggest` may be a function of every
diagnostic's value, which is how compound rules read ("dead groups above 30% *and* one
score value above half -> make the reward more continuous", EvoTrainer).

`blocking` diagnostics stop a version from being promoted when they are critical (reward
rising while the verifier score is not). Harnesses add or revise diagnostics in their
`diagnostics.py`: a diagnostic there with a built-in's name replaces it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

from evotrainer.diagnostics.evidence_view import Evidence
from evotrainer.harness.registry import Registry

LAYERS = ("score", "signal", "behavior", "efficiency", "model_state", "code", "agentic", "custom")
SEVERITIES = ("warning", "critical")

MetricFn = Callable[[Evidence], "float | None"]
Suggest = "str | Callable[[Mapping[str, float | None]], str]"


@dataclass(frozen=True)
class Diagnostic:
    name: str
    layer: str
    fn: MetricFn
    warn: float | None = None
    critical: float | None = None
    above: bool = True             # True: values above the thresholds are bad
    suggest: Suggest = ""
    blocking: bool = False
    scope: str = "last"            # "last": the last window; "run": all the evidence
    summary: str = ""              # one line: what the number means

    def __call__(self, ev: Evidence) -> float | None:
        value = self.fn(ev.last if self.scope == "last" else ev)
        return None if value is None else float(value)

    def severity(self, value: float | None) -> str | None:
        if value is None or not math.isfinite(value):
            return None
        worse = (lambda t: value > t) if self.above else (lambda t: value < t)
        if self.critical is not None and worse(self.critical):
            return "critical"
        if self.warn is not None and worse(self.warn):
            return "warning"
        return None

    def thresholds(self) -> str:
        op = ">" if self.above else "<"
        parts = [f"warning {op} {self.warn:g}" if self.warn is not None else "",
                 f"critical {op} {self.critical:g}" if self.critical is not None else ""]
        return ", ".join(p for p in parts if p) or "none"


def diagnostic(layer: str, *, warn: float | None = None, critical: float | None = None, above: bool = True,
               suggest: Suggest = "", blocking: bool = False, scope: str = "last",
               name: str | None = None) -> Callable[[MetricFn], Diagnostic]:
    """Turn a metric function into a `Diagnostic`; its docstring's first line is the summary."""
    if layer not in LAYERS:
        raise ValueError(f"unknown diagnostic layer '{layer}'; valid choices: {', '.join(LAYERS)}")
    if scope not in ("last", "run"):
        raise ValueError(f"unknown diagnostic scope '{scope}'; valid choices: last, run")

    def deco(fn: MetricFn) -> Diagnostic:
        doc = (fn.__doc__ or "").strip().splitlines()
        return Diagnostic(name or fn.__name__, layer, fn, warn, critical, above, suggest, blocking, scope,
                          doc[0] if doc else "")
    return deco


DIAGNOSTICS: Registry[Diagnostic] = Registry("diagnostic")


def register(d: Diagnostic) -> Diagnostic:
    return DIAGNOSTICS.register(d.name)(d)


@dataclass(frozen=True)
class Finding:
    diagnostic: str
    layer: str
    severity: str         # warning | critical
    value: float
    thresholds: str
    evidence: str         # what was measured, over which steps
    suggest: str          # the intervention family to try
    blocking: bool        # blocks promotion

    def to_dict(self) -> dict:
        return asdict(self)


def measure(diags: Mapping[str, Diagnostic], ev: Evidence) -> dict[str, float | None]:
    """Every diagnostic's value on the evidence (None where it does not apply)."""
    return {name: d(ev) for name, d in diags.items()}


def windows(ev: Evidence) -> dict[str, str]:
    """Which steps each scope covered, for the evidence line of a finding."""
    return {"last": f"last window, {ev.last.span()}", "run": f"first vs last window, {ev.span()}"}


def findings(diags: Mapping[str, Diagnostic], values: Mapping[str, float | None],
             spans: Mapping[str, str] | None = None) -> list[Finding]:
    """The rule engine: a finding for each diagnostic past a threshold, worst first."""
    spans = spans or {}
    out = []
    for name, d in diags.items():
        sev = d.severity(values.get(name))
        if sev is None:
            continue
        suggest = d.suggest(values) if callable(d.suggest) else d.suggest
        out.append(Finding(name, d.layer, sev, round(values[name], 4), d.thresholds(),
                           f"{name} = {values[name]:.3f} ({spans.get(d.scope, d.scope)}): {d.summary}",
                           suggest, d.blocking and sev == "critical"))
    return sorted(out, key=lambda f: (-SEVERITIES.index(f.severity), not f.blocking, LAYERS.index(f.layer)))
