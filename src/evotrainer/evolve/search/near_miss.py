"""Near-miss merges: two single changes that each nearly cleared the gate, tried together.

Where single moves are small next to the noise, a search that judges one change at a time
can discard every move that helps: on vault3 at 30 steps the best moves gain +1.4 to +2.4
validation points and the gate needs about +3.6 (docs/benchmarks.md). A crossover merges
*kept* branches, so it never sees them. A near miss is a discarded trial whose mean gain
cleared the gate's minimum gain (`promotion.min_gain`) while its lower bound did not; two
of them from different intervention families, made on the same harness version and
touching different knobs and files, are merged into one trial gated against that
version's control like any other. If their gains add up, the merge clears the gate where
neither part could; if not, it is discarded as a merge and says so in the lineage. On
vault3's searches one merge of two +1.5-point near misses gained -0.1 (noise, not additive)
and one was kept on search seeds where the default recipe falters, a gain that did not hold
on fresh seeds (docs/benchmarks.md): a merge is a hypothesis the gate judges, not a gain.

Only an evolving controller merges, and only once its policy says so
(search_policy.py: a stall turns it on). Each pair is merged at most once. Pure functions
of finished trials and their plans: the controller builds the plan (evolve/search/plans.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from evotrainer.evolve.search import history
from evotrainer.labels import Label
from evotrainer.lineage.plan import TrialPlan


@dataclass(frozen=True)
class NearMiss:
    trial: int
    intervention: str
    family: str
    gain: float
    knobs: dict
    files: dict


def near_misses(planned: Iterable[tuple], version: str, min_gain: float) -> list[NearMiss]:
    """Discarded single changes to `version` whose mean gain reached `min_gain` (best first).
    `planned`: (finished trial, the plan it started with) pairs."""
    out = []
    for t, p in planned:
        gain = t.fitness.gain
        if (t.label != Label.DISCARDED or gain is None or gain < min_gain or p.parent.version != version
                or p.agent in (history.MERGE, history.CROSSOVER) or not (p.knobs or p.files)
                or history.MERGED in t.intervention):  # a merge's name must split back into its two
            continue
        out.append(NearMiss(t.id, t.intervention, history.family(t.intervention, p.family), gain,
                            dict(p.knobs or {}), dict(p.files or {})))
    return sorted(out, key=lambda m: (-m.gain, m.trial))


def merged_pairs(plans: Iterable[TrialPlan]) -> set[frozenset[int]]:
    """The pairs of trials already merged (from every plan's `merged`)."""
    return {frozenset(p.merged) for p in plans if p.merged}


def best_pair(misses: Sequence[NearMiss], done: set[frozenset[int]]) -> tuple[NearMiss, NearMiss] | None:
    """The not-yet-merged pair from different families, with no knob or slot file in common,
    of the highest summed gain (ties: the earlier trials)."""
    pairs = [(a, b) for i, a in enumerate(misses) for b in misses[i + 1:]
             if a.family != b.family and frozenset((a.trial, b.trial)) not in done
             and not (set(a.knobs) & set(b.knobs)) and not (set(a.files) & set(b.files))]
    if not pairs:
        return None
    a, b = max(pairs, key=lambda ab: (ab[0].gain + ab[1].gain, -min(ab[0].trial, ab[1].trial),
                                      -max(ab[0].trial, ab[1].trial)))
    return (a, b) if a.trial < b.trial else (b, a)
