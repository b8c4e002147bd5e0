"""Specialists: the surfaces of a recipe that trials in flight divide between them.

With `search.concurrency: N` up to N trials run at once. Each is proposed by a specialist for
one surface of the recipe, and the lineage is their blackboard: a trial's `trial_started`
record (its plan) is its claim, its `trial_finished` row its result, and every proposal
reads both. Two trials in flight never change the same surface of the same parent: their
gains would not separate (the specialist-agent method's partition of the recipe), and the
second would often retry what the first is already measuring.

A surface is a specialist role's set of the catalog's intervention families (agents/brief.py,
the roles an llm or command agent is briefed as); an llm or command agent's change counts
under the role its plan records.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from evotrainer.agents.brief import SPECIALISTS
from evotrainer.agents.space import reach
from evotrainer.harness.knobs import Knobs
from evotrainer.lineage.plan import TrialPlan


def surface(family: str) -> str:
    """The specialist whose surface holds `family` (agents/brief.py: reward, signal,
    optimisation, exploration, curriculum, diagnostics); a family of none (crossover, subtract, other), or
    a specialist's own name as an llm agent's plan records it, is its own surface."""
    return next((role for role, fams in SPECIALISTS.items() if family in fams), family)


def reached(p: TrialPlan, parent_knobs: Knobs) -> frozenset[str]:
    """The surfaces a plan's change reaches (agents/space.reach: its family's, and those of the
    knobs and files it writes, which an llm or command agent's edit may take past its role)."""
    return frozenset(surface(f) for f in reach(p.family, p.knobs, p.files, parent_knobs))


def claimed(in_flight: Mapping[int, TrialPlan], parent: str, parent_knobs: Knobs) -> frozenset[str]:
    """The surfaces trials in flight are changing from `parent` (whose knobs are `parent_knobs`)."""
    return frozenset().union(*(reached(p, parent_knobs) for p in in_flight.values() if p.parent.version == parent))


def closed_families(surfaces: Iterable[str]) -> frozenset[str]:
    """Every family of these surfaces: what a proposal from the same parent may not touch now."""
    out: set[str] = set()
    for s in surfaces:
        out |= {s, *SPECIALISTS.get(s, ())}
    return frozenset(out)


def in_flight_from(in_flight: Mapping[int, TrialPlan], parent: str) -> frozenset[str]:
    """The interventions trials in flight are trying from `parent` (counted as tried)."""
    return frozenset(p.intervention for p in in_flight.values() if p.parent.version == parent)


def blackboard(plans: Mapping[int, TrialPlan]) -> dict[int, str]:
    """What each trial proposed with others in flight read off the blackboard, in words: the
    trials that were running as it was proposed, and the outcomes it read that had come in
    since the proposal before it (those that finished while it was being made). Trials of a
    run one at a time (no `saw` recorded) have none."""
    out, before = {}, None
    for n in sorted(plans):
        p = plans[n]
        if p.saw is None:
            continue
        new = [t for t in p.saw if before is None or t not in before]
        parts = ([f"while {', '.join(f'#{t}' for t in p.beside)} ran"] if p.beside else []) + \
                ([f"after {', '.join(f'#{t}' for t in new)} finished"] if new else [])
        if parts:
            out[n] = "proposed " + ", ".join(parts)
        before = set(p.saw)
    return out
