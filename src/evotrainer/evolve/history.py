"""What the search reads back from its own lineage: pure functions over finished trials.

The controller keeps no search state in memory that the lineage does not hold: which
changes a version carries, on which harness surface, which parents produced which gains,
how many failures in a row, which operations ran. So a resumed controller decides
exactly as the one that was killed would have.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from evotrainer.agents.catalog import FAMILY
from evotrainer.evolve.population import Child

CROSSOVER = "crossover"
# a candidate that would train exactly like a sibling already tried: recorded, never trained,
# and invisible to the search (no budget, no child, no failure)
EQUIVALENT = "equivalent"
FAILED = ("discarded", "invalid", "illegal", "backtest_rejected", "crash", "timeout", "oom")
CRASHED = ("crash", "timeout", "oom")


def family(intervention: str) -> str:
    if intervention == CROSSOVER:
        return CROSSOVER
    if intervention.startswith("revert_"):
        return "subtract"
    return FAMILY.get(intervention, "other")


def changes(trials: Iterable) -> dict[str, frozenset[str]]:
    """Version -> the interventions along its lineage (a crossover carries both parents')."""
    out: dict[str, frozenset[str]] = {}
    for t in sorted(trials, key=lambda t: t.id):
        if not t.version:
            continue
        if not t.parents:
            out[t.version] = frozenset()
        elif t.intervention == CROSSOVER:
            out[t.version] = frozenset().union(*(out.get(p, frozenset()) for p in t.parents))
        else:
            out[t.version] = out.get(t.parents[0], frozenset()) | {t.intervention}
    return out


def surfaces(trials: Iterable) -> dict[str, str]:
    """Version -> the harness surface (intervention family) its own change touched."""
    return {t.version: ("root" if not t.parents else family(t.intervention)) for t in trials if t.version}


def children(trials: Iterable, starts: Mapping[int, Mapping]) -> list[Child]:
    """Each finished non-root trial as a Child: its parent states (from the proposal it started
    with, `starts[trial]`) and its gain over the control (None where it never trained)."""
    out = []
    for t in sorted(trials, key=lambda t: t.id):
        start = starts.get(t.id)
        if not t.parents or start is None or t.label == EQUIVALENT:
            continue
        keys = [(start["parent_state"]["version"], start["parent_state"]["depth"])]
        if start.get("mate_state"):
            keys.append((start["mate_state"]["version"], start["mate_state"]["depth"]))
        out.append(Child(t.id, tuple(keys), t.fitness.get("gain"), crossover=t.intervention == CROSSOVER))
    return out


def failures_in_a_row(trials: Sequence) -> list:
    """The trailing run of failed trials since the last kept one (oldest first)."""
    out = []
    for t in sorted(trials, key=lambda t: t.id, reverse=True):
        if t.label == EQUIVALENT:
            continue
        if not t.parents or t.label not in FAILED:
            break
        out.append(t)
    return out[::-1]


def operations(trials: Iterable) -> list[str]:
    """'crossover' or 'mutation' per non-root trial that did not crash, in order."""
    return [CROSSOVER if t.intervention == CROSSOVER else "mutation"
            for t in sorted(trials, key=lambda t: t.id) if t.parents and t.label not in CRASHED + (EQUIVALENT,)]


def spent(trials: Iterable) -> int:
    """Trials that count against the budget: every non-root trial but the equivalent ones."""
    return sum(1 for t in trials if t.parents and t.label != EQUIVALENT)
