"""The final comparison: the winner retrained from the base with fresh seeds, beside the
reference recipe trained with the same seeds for the same total steps.

Selecting the best of several noisy versions biases its own score upwards (the winner's
curse), so the headline number never comes from the search. The winner is chosen on
validation only; its harness *schedule* (continue mode: the harness at each depth along its
lineage; restart mode: its one harness) is trained again from the base on seeds the search
never used, and so is the reference. Both are evaluated the same way: the mean of the
last `last_k` evaluations on validation and on test, per seed. The difference's interval is
a Student t interval over the paired seeds (n - 1 degrees of freedom), which holds its level
at any seed count (a percentile bootstrap over 3 values is [min, max] and said 'beat' for a
null difference 12% of the time at a stated 2.5%). Its power is the seed count's: with 3
seeds (2 df, t = 4.30) a real gain of 6 +/- 2 points per seed was shown 75% of the time and
one of 20 +/- 13 points 33% (simulated); with 5 (the default) 99.7% and 73%. Pure functions
here; the controller runs the training.
"""
from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping, Sequence

from evotrainer.evolve.stats.paired import paired_differences, t_interval


def merit(state) -> tuple:
    """How states rank for the winner: mean validation accuracy over their seeds; deeper wins ties."""
    return state.mean_val, state.depth, state.version


def winner(states: Iterable) -> object:
    """The best validated state (`merit`)."""
    return max(states, key=merit)


def schedule(trials: Iterable, version: str, depth: int) -> list[str]:
    """Harness versions at depths 1..depth along the lineage of state (version, depth).

    A version is created at one depth by its trial (from its parent at the depth above) and
    continued unchanged as its own control below that, so walking up: a state at its
    version's creation depth came from the parent, any deeper one from the same version."""
    created = {t.version: (t.depth, t.parents[0] if t.parents else None) for t in trials if t.version}
    out = []
    while depth >= 1:
        out.append(version)
        born, parent = created[version]
        if depth == born:
            if parent is None:
                break
            version = parent
        depth -= 1
    if depth > 1:
        raise ValueError(f"the lineage of {version} ends above depth 1")
    return out[::-1]


def extend(sched: Sequence[str], max_depth: int) -> list[str]:
    """A schedule shorter than the budget continues with its last harness to `max_depth`."""
    return list(sched) + [sched[-1]] * (max_depth - len(sched))


INTERVAL = "t"  # the final difference's interval: Student t over the paired seeds


def ci_name(d: Mapping) -> str:
    """How a comparison's interval is named where it is printed: its level and kind
    (a run recorded before t intervals said 'bootstrap')."""
    kind = {"t": "t interval", "bootstrap": "bootstrap CI"}[d.get("interval", "bootstrap")]
    n = len(d.get("per_seed", []))
    return f"{int(100 * d['level'])}% {kind}" + (f", {n - 1} df" if kind == "t interval" and n else "")


def spread(xs: Sequence[float]) -> dict:
    """Mean, sample standard deviation (nan with one seed) and the values, in points."""
    return {"mean": 100 * statistics.fmean(xs), "sd": 100 * statistics.stdev(xs) if len(xs) > 1 else math.nan,
            "per_seed": [round(100 * x, 2) for x in xs]}


def compare(reference: Mapping[int, Mapping[str, float]], evolved: Mapping[int, Mapping[str, float]],
            level: float = 0.95) -> dict:
    """Paired comparison per split: evolved minus reference, seed by seed, with a t interval."""
    out = {}
    for split in ("val", "test"):
        ref = {s: r[split] for s, r in reference.items()}
        evo = {s: r[split] for s, r in evolved.items()}
        diffs = paired_differences(evo, ref)
        lo, hi = t_interval(diffs, level)
        out[split] = {"reference": spread([ref[s] for s in sorted(ref)]),
                      "evolved": spread([evo[s] for s in sorted(evo)]),
                      "difference": spread(diffs) | {"ci": [100 * lo, 100 * hi], "level": level,
                                                                "interval": INTERVAL}}
    return out


def table(base: Mapping[str, float], comparison: Mapping, seeds: Sequence[int]) -> str:
    """The main job's table: base, reference and evolved, validation and test side by side."""
    def cell(x: Mapping) -> str:
        return f"{x['mean']:5.1f} ± {x['sd']:4.1f}" if not math.isnan(x["sd"]) else f"{x['mean']:5.1f}"
    v, t = comparison["val"], comparison["test"]
    rows = [("base", f"{100 * base['val']:5.1f}", f"{100 * base['test']:5.1f}"),
            ("reference", cell(v["reference"]), cell(t["reference"])),
            ("evolved", cell(v["evolved"]), cell(t["evolved"]))]
    lines = [f"accuracy %, mean ± sd over fresh seeds {list(seeds)} (mean of the last evaluations)",
             f"{'':10} {'validation':>14} {'test':>14}"]
    lines += [f"{name:10} {a:>14} {b:>14}" for name, a, b in rows]
    for split, name in (("val", "validation"), ("test", "test")):
        d = comparison[split]["difference"]
        lines.append(f"evolved - reference, {name}: {d['mean']:+.1f} points, "
                     f"{ci_name(d)} [{d['ci'][0]:+.1f}, {d['ci'][1]:+.1f}]")
    return "\n".join([*lines, verdict(comparison)])


def verdict(comparison: Mapping) -> str:
    """One line: did the evolved harness beat the reference, by how much, and how sure.
    Read on test (the split no decision touched); 'beat' means the CI lies above zero."""
    d = comparison["test"]["difference"]
    lo, hi = d["ci"]
    how = f"{d['mean']:+.1f} test points, {ci_name(d)} [{lo:+.1f}, {hi:+.1f}]"
    if lo > 0:
        return f"verdict: the evolved harness beat the reference recipe by {how}"
    if hi < 0:
        return f"verdict: the evolved harness did worse than the reference recipe: {how}"
    return f"verdict: no difference shown between the evolved harness and the reference recipe ({how}; the CI contains zero)"
