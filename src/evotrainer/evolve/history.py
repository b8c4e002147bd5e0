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
# an agent that produced nothing usable, and a person's abort at a gate: nothing trained
AGENT_FAILED = ("unparseable", "patch_failed", "syntax_error", "agent_timeout", "agent_error")
ABORTED = "aborted"
# a new or revised diagnostic whose replay did not separate failed versions from held-up ones
DIAGNOSTIC_REJECTED = "diagnostic_rejected"
FAILED = ("discarded", "invalid", "illegal", "backtest_rejected", "crash", "timeout", "oom", *AGENT_FAILED, ABORTED,
          DIAGNOSTIC_REJECTED)
CRASHED = ("crash", "timeout", "oom")


def family(intervention: str, start: Mapping | None = None) -> str:
    """The harness surface of an intervention: the catalog's family, else what its proposal
    recorded (an llm or command agent's specialist role), else 'other'."""
    if intervention == CROSSOVER:
        return CROSSOVER
    if intervention.startswith("revert_"):
        return "subtract"
    return FAMILY.get(intervention) or (start or {}).get("family") or "other"


def add_usage(before: Mapping | None, after: Mapping | None) -> dict:
    """Two rounds' proposing costs as one: counts and seconds add up, the rest is the later's."""
    before, after = dict(before or {}), dict(after or {})
    out = before | after
    for k, v in after.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(before.get(k), (int, float)):
            out[k] = round(before[k] + v, 3) if isinstance(v, float) else before[k] + v
    return out


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


def surfaces(trials: Iterable, starts: Mapping[int, Mapping] | None = None) -> dict[str, str]:
    """Version -> the harness surface (intervention family) its own change touched; an llm or
    command agent's free-text intervention counts under the surface its proposal recorded."""
    starts = starts or {}
    return {t.version: ("root" if not t.parents else family(t.intervention, starts.get(t.id)))
            for t in trials if t.version}


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


def _trailing(trials: Iterable, counts, skip=lambda t: False) -> list:
    """The newest run of trials for which `counts` holds (oldest first), passing over `skip`ped ones."""
    out = []
    for t in sorted(trials, key=lambda t: t.id, reverse=True):
        if skip(t):
            continue
        if not counts(t):
            break
        out.append(t)
    return out[::-1]


def failures_in_a_row(trials: Sequence) -> list:
    """The trailing run of failed trials since the last kept one (oldest first)."""
    return _trailing(trials, lambda t: t.parents and t.label in FAILED, skip=lambda t: t.label == EQUIVALENT)


def agent_errors_in_a_row(trials: Sequence) -> list:
    """The trailing run of `agent_error` trials (oldest first): an endpoint that is down or
    misconfigured, not an idea that failed."""
    return _trailing(trials, lambda t: t.label == "agent_error")


def operations(trials: Iterable) -> list[str]:
    """'crossover' or 'mutation' per non-root trial that ran (no crash, no agent failure, no abort), in order."""
    return [CROSSOVER if t.intervention == CROSSOVER else "mutation"
            for t in sorted(trials, key=lambda t: t.id)
            if t.parents and t.label not in CRASHED + AGENT_FAILED + (EQUIVALENT, ABORTED)]


def spent(trials: Iterable) -> int:
    """Trials that count against the budget: every non-root trial but the equivalent ones."""
    return sum(1 for t in trials if t.parents and t.label != EQUIVALENT)


def view(trials: Sequence, top: int = 5) -> str:
    """What an agent is shown of the lineage: a leaderboard of kept versions by validation
    accuracy, the path from the root to the best, and every child of the best with its label."""
    kept = [t for t in trials if t.label == "kept" and t.fitness.get("val")]
    if not kept:
        return ""
    mean = lambda t: sum(t.fitness["val"].values()) / len(t.fitness["val"])  # noqa: E731
    board = sorted(kept, key=lambda t: (-mean(t), t.id))
    by_version = {t.version: t for t in trials if t.version}
    best, path = board[0], []
    v = board[0].version
    while v is not None and v in by_version:
        path.append(f"{v} [{by_version[v].intervention}]")
        v = (by_version[v].parents or [None])[0]
    lines = ["Leaderboard (kept versions, mean validation accuracy):"]
    lines += [f"- {t.version} val {mean(t):.3f}: {t.intervention}" for t in board[:top]]
    lines += ["", "Path from the root to the best: " + " -> ".join(reversed(path)), "", f"Children of {best.version}:"]
    kids = [t for t in trials if t.parents[:1] == [best.version]]
    gain = lambda t: "" if t.fitness.get("gain") is None else f", gain {t.fitness['gain']:+.3f}"  # noqa: E731
    lines += [f"- trial {t.id} {t.intervention}: {t.label}{gain(t)}; {t.hypothesis[:200]}" for t in kids] or ["- none yet"]
    return "\n".join(lines)
