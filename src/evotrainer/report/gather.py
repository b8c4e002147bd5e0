"""Everything the HTML report shows, read from a run directory into plain data.

Read-only and tolerant of a run in progress: a trial still training has curves on disk but
no lineage row yet, a run before its final comparison has no final.json, and a metrics line
half-written by a worker is skipped. Nothing here trains, evaluates or runs harness code:
diagnostics over time are the built-in library's (trusted code), computed on windows of the
first seed's rollouts; a harness's own diagnostics appear as the findings it recorded.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from evotrainer.diagnostics.evidence_view import Evidence
from evotrainer.diagnostics.health import load_evidence
from evotrainer.diagnostics.load import harness_diagnostics
from evotrainer.evolve.search import history
from evotrainer.evolve.search.specialists import blackboard, surface
from evotrainer.evolve.segments.progress import seed_metrics
from evotrainer.evolve.status import open_run, status
from evotrainer.jobfiles import BadOutput
from evotrainer.lineage.events import TrialStarted
from evotrainer.lineage.plan import TrialPlan
from evotrainer.lineage.store import TrialRecord

CURVES = ("reward_mean", "score_mean", "dead_groups", "entropy", "length_mean")  # per-step metrics plotted
WINDOWS = 10  # diagnostics over time: the steps of a run cut into this many windows


@dataclass
class Version:
    """One trial as the report draws it (a trial refused before committing has no version)."""
    trial: int
    version: str | None
    parents: list[str]
    intervention: str
    label: str
    depth: int
    hypothesis: str
    val: dict[str, float]            # seed -> accuracy on validation (a fraction)
    test: dict[str, float]
    gain: float | None               # paired validation gain over its control
    bar: float | None                # what the gain had to beat
    backtest: dict
    reflection: str
    findings: list
    patch: str
    started: float | None = None     # wall-clock seconds (the trial's row; in flight: its start's record)
    finished: float | None = None    # None: in flight
    surface: str = ""                # the specialist's surface its change touched (evolve/search/specialists.py)
    proposed: str = ""               # search.concurrency > 1: what its proposal read off the blackboard

    @property
    def mean_val(self) -> float | None:
        return sum(self.val.values()) / len(self.val) if self.val else None

    @property
    def mean_test(self) -> float | None:
        return sum(self.test.values()) / len(self.test) if self.test else None


@dataclass
class Curve:
    """One training directory group's per-step metrics, averaged over its seeds."""
    name: str                          # "v1" or "final evolved"
    seeds: int
    steps: list[int]
    metrics: dict[str, list[float | None]]


@dataclass
class DiagnosticSeries:
    name: str
    layer: str
    summary: str
    warn: float | None
    critical: float | None
    above: bool
    points: dict[str, list[tuple[int, float]]]   # version -> (last step of the window, value)


@dataclass
class RunData:
    run: Path
    status: dict
    versions: list[Version]
    in_flight: list[Version]                     # trials started and not finished
    best_path: list[str]                         # root .. winner (or the best kept)
    curves: list[Curve]
    diagnostics: list[DiagnosticSeries]
    noise_sd: float | None
    final: dict | None
    final_table: str | None
    config: str = ""
    notes: list[str] = field(default_factory=list)


def mean_curve(name: str, seed_dirs: list[Path]) -> Curve | None:
    runs = [m for m in (seed_metrics(d) for d in seed_dirs) if m]
    if not runs:
        return None
    by_step: dict[int, list[dict]] = {}
    for rows in runs:
        for r in rows:
            by_step.setdefault(r["step"], []).append(r)
    steps = sorted(by_step)
    metrics = {}
    for key in CURVES:
        col = []
        for s in steps:
            xs = [float(r[key]) for r in by_step[s] if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            col.append(sum(xs) / len(xs) if xs else None)
        metrics[key] = col
    return Curve(name, len(runs), steps, metrics)


def seed_dirs(parent: Path) -> list[Path]:
    return sorted((d for d in parent.glob("seed-*") if d.is_dir()), key=lambda d: int(d.name.split("-")[1]))


def diagnostics_over_time(runs: dict[str, Path], windows: int = WINDOWS) -> list[DiagnosticSeries]:
    """The built-in diagnostics of the last-window kind on consecutive windows of each run's
    steps: what the health report would have said had training stopped there."""
    diags = {n: d for n, d in harness_diagnostics(None).items() if d.scope == "last" and (d.warn is not None or d.critical is not None)}
    points: dict[str, dict[str, list[tuple[int, float]]]] = {n: {} for n in diags}
    for name, d in runs.items():
        try:  # a refused trial's (bad_output) evidence is left out, not read
            ev: Evidence = load_evidence(d)
        except BadOutput:
            continue
        steps = ev.step_numbers
        if not steps:
            continue
        size = max(1, math.ceil(len(steps) / windows))
        for i in range(0, len(steps), size):
            chunk = steps[i:i + size]
            part = ev.between(chunk[0], chunk[-1])
            for n, diag in diags.items():
                v = diag.fn(part)
                if v is not None and math.isfinite(v):
                    points[n].setdefault(name, []).append((chunk[-1], float(v)))
    return [DiagnosticSeries(n, d.layer, d.summary, d.warn, d.critical, d.above, points[n])
            for n, d in diags.items() if points[n]]


def version_of(t: TrialRecord, plans: dict[int, TrialPlan]) -> Version:
    f, plan = t.fitness, plans.get(t.id)
    return Version(t.id, t.version, list(t.parents), t.intervention, str(t.label), t.depth,
                   t.hypothesis or (plan.hypothesis if plan else ""),
                   {str(k): v for k, v in f.val.items()}, {str(k): v for k, v in f.test.items()},
                   f.gain, f.decision.threshold if f.decision else None, t.backtest or {}, t.reflection, t.findings or [], t.patch,
                   t.started, t.finished, surface(history.family(t.intervention, plan.family if plan else None))
                   if t.parents else "root")


def in_flight(pending: list[TrialStarted], since: dict[int, float] | None = None) -> list[Version]:
    """Trials started and not finished, as the plan their start recorded (label "in flight");
    `since`: trial -> when it (last) started."""
    out = []
    for s in pending:
        parents, hypothesis = ([s.plan.parent.version], s.plan.hypothesis) if s.plan else ([], "")
        out.append(Version(s.trial, s.version, parents, s.intervention or "?", "in flight",
                           0, hypothesis, {}, {}, None, None, {}, "", [], "", (since or {}).get(s.trial), None,
                           surface(s.plan.family) if s.plan else ""))
    return out


def path_to(version: str | None, versions: list[Version]) -> list[str]:
    """The versions from the root down to `version` (first parents only)."""
    parent = {v.version: (v.parents[0] if v.parents else None) for v in versions if v.version}
    out = []
    while version is not None and version in parent and version not in out:
        out.append(version)
        version = parent[version]
    return out[::-1]


def best_version(final: dict | None, st: dict) -> str | None:
    """The final comparison's winner, else the best kept version `status` names."""
    if final and final.get("winner"):
        return str(final["winner"]).split("@")[0]
    return (st.get("best") or {}).get("version")


def gather(run_dir: Path | str) -> RunData:
    run = Path(run_dir)
    store = open_run(run)
    try:
        trials, pending = store.trials(), store.pending()
        starts = store.log(TrialStarted)
        plans = {x.event.trial: x.event.plan for x in starts if x.event.plan}
        since = {x.event.trial: x.t for x in starts}  # the last start of each
    finally:
        store.close()
    versions, read = [version_of(t, plans) for t in trials], blackboard(plans)
    for v in versions:
        v.proposed = read.get(v.trial, "")
    final_path = run / "final.json"
    final = json.loads(final_path.read_text()) if final_path.exists() else None
    table = None
    if final:
        from evotrainer.evolve.stats.final import table as final_table
        table = final_table(final["base"], final["comparison"], final["seeds"])
    # curves: every version directory on disk (a trial in flight included), then the final comparison's retraining
    curves = []
    vdirs = sorted((d for d in (run / "versions").glob("*") if d.is_dir()),
                   key=lambda d: (len(d.name), d.name)) if (run / "versions").is_dir() else []
    first_seed: dict[str, Path] = {}
    for d in vdirs:
        seeds = seed_dirs(d)
        c = mean_curve(d.name, seeds)
        if c:
            curves.append(c)
            first_seed[d.name] = seeds[0]
    for arm in ("reference", "evolved"):
        c = mean_curve(f"final {arm}", seed_dirs(run / "final" / arm))
        if c:
            curves.append(c)
    noise = next((t.fitness.noise_sd for t in trials if t.id == 0), None)
    config = (run / "config.yaml").read_text() if (run / "config.yaml").exists() else ""
    st = status(run)
    best = path_to(best_version(final, st), versions)
    return RunData(run, st, versions, in_flight(pending, since), best, curves, diagnostics_over_time(first_seed),
                   noise, final, table, config)
