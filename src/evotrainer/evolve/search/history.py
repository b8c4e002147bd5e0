"""What the search reads back from its own lineage: pure functions over finished trials.

The controller keeps no search state in memory that the lineage does not hold: which
changes a version carries, on which harness surface, which parents produced which gains,
how many failures in a row, which operations ran. So a resumed controller decides
exactly as the one that was killed would have.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from evotrainer.agents.interventions import FAMILY
from evotrainer.evolve.search.population import Child
from evotrainer.labels import AGENT_FAILED, CRASHED, FAILED, Label
from evotrainer.lineage.plan import TrialPlan

CROSSOVER = "crossover"  # the intervention (and family) of a crossover trial
MERGE = "merge"          # the family (and agent) of a near-miss merge (evolve/search/near_miss.py)
MERGED = "+"             # a merge's intervention names its parts: "lower_lr+easier_mix"


def family(intervention: str, recorded: str | None = None) -> str:
    """The harness surface of an intervention: the catalog's family, else what its plan
    recorded (an llm or command agent's specialist role), else 'other'."""
    if intervention == CROSSOVER:
        return CROSSOVER
    if intervention.startswith("revert_"):
        return "subtract"
    return FAMILY.get(intervention) or recorded or "other"


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
            out[t.version] = out.get(t.parents[0], frozenset()) | set(parts(t))
    return out


def parts(t) -> list[str]:
    """The single changes trial `t` made: a near-miss merge's two, else its intervention (an
    agent's own name for a change may hold a "+" too: only a merge's is split)."""
    return t.intervention.split(MERGED) if t.agent == MERGE else [t.intervention]


def ancestors(trials: Iterable, v: str) -> list[str]:
    """`v` and every version it descends from (first parents and crossover mates), nearest first."""
    parents = {t.version: t.parents for t in trials if t.version}
    out, todo = [], [v]
    while todo:
        x = todo.pop(0)
        if x not in out:
            out.append(x)
            todo += parents.get(x, [])
    return out


def hacked_above(trials: Iterable, v: str) -> set[str]:
    """Interventions labelled `invalid` (a blocking finding: the reward rose while the score did
    not, or paid for length) from `v` or a version it descends from. Proposed again lower in the
    same line they set the same reward, and hack it again: a trial spent on a known verdict."""
    trials = list(trials)
    line = set(ancestors(trials, v))
    return {t.intervention for t in trials if t.label == Label.INVALID and t.parents[:1] and t.parents[0] in line}


def common_ancestor(trials: Iterable, a: str, b: str) -> str:
    """The nearest version both `a` and `b` descend from (first parents and crossover mates)."""
    trials = list(trials)
    of_b = set(ancestors(trials, b))
    return next(v for v in ancestors(trials, a) if v in of_b)


def gains_beyond(trials: Iterable, version: str, base: str) -> list:
    """The kept trials with a measured gain (> 0) that made the versions `version` descends from
    (itself included) and `base` does not: the gains `version` owns beyond `base`."""
    trials = list(trials)
    own = set(ancestors(trials, version)) - set(ancestors(trials, base))
    return [t for t in sorted(trials, key=lambda t: t.id)
            if t.version in own and t.parents and t.label == Label.KEPT and (t.fitness.gain or 0.0) > 0]


def repeats_ancestor(trials: Iterable, a: str, b: str) -> bool:
    """Whether the gains of `a` and `b` come from the same ancestor change: beyond their common
    ancestor, one of them owns no kept gain (it is that ancestor, or a state of it further
    trained, or carries only changes that gained nothing), so their merge only repeats what
    the ancestor and the other side already measured."""
    trials = list(trials)
    base = common_ancestor(trials, a, b)
    return not gains_beyond(trials, a, base) or not gains_beyond(trials, b, base)


def surfaces(trials: Iterable, families: Mapping[int, str] | None = None) -> dict[str, str]:
    """Version -> the harness surface (intervention family) its own change touched; an llm or
    command agent's free-text intervention counts under the family its plan recorded
    (`families`: trial number -> that family)."""
    families = families or {}
    return {t.version: ("root" if not t.parents else family(t.intervention, families.get(t.id)))
            for t in trials if t.version}


def children(trials: Iterable, plans: Mapping[int, TrialPlan]) -> list[Child]:
    """Each finished non-root trial as a Child: its parent states (from the plan it started
    with, `plans[trial]`) and its gain over the control (None where it never trained)."""
    out = []
    for t in sorted(trials, key=lambda t: t.id):
        plan = plans.get(t.id)
        if not t.parents or plan is None or t.label == Label.EQUIVALENT:
            continue
        keys = [plan.parent.key] + ([plan.mate.key] if plan.mate else [])
        out.append(Child(t.id, tuple(keys), t.fitness.gain, crossover=t.intervention == CROSSOVER,
                         failed=t.label in FAILED))
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
    return _trailing(trials, lambda t: t.parents and t.label in FAILED, skip=lambda t: t.label == Label.EQUIVALENT)


def agent_errors_in_a_row(trials: Sequence) -> list:
    """The trailing run of `agent_error` trials (oldest first): an endpoint that is down or
    misconfigured, not an idea that failed."""
    return _trailing(trials, lambda t: t.label == Label.AGENT_ERROR)


def operations(trials: Iterable) -> list[str]:
    """'crossover' or 'mutation' per non-root trial that ran (no crash, no agent failure, no abort), in order."""
    return [CROSSOVER if t.intervention == CROSSOVER else "mutation"
            for t in sorted(trials, key=lambda t: t.id)
            if t.parents and t.label not in CRASHED | AGENT_FAILED | {Label.EQUIVALENT, Label.ABORTED}]


def spent(trials: Iterable) -> int:
    """Trials that count against the budget: every non-root trial but the equivalent ones."""
    return sum(1 for t in trials if t.parents and t.label != Label.EQUIVALENT)


def latest(trials: Sequence, k: int = 5) -> str:
    """The last `k` trials to finish, from any parent, newest first: with trials in flight, the
    outcomes that came in while others ran, which the leaderboard (kept versions, the best's
    children) may not show."""
    done = sorted((t for t in trials if t.parents), key=lambda t: -t.finished)[:k]
    if not done:
        return ""
    return "\n\nLatest outcomes (newest first):\n" + "\n".join(
        f"- trial {t.id} {t.intervention} from {t.parents[0]}: {t.label}{_gain(t)}" for t in done)


def _gain(t) -> str:
    return "" if t.fitness.gain is None else f", gain {t.fitness.gain:+.3f}"


def leaderboard(trials: Sequence, top: int = 5) -> str:
    """What an agent is shown of the lineage: a leaderboard of kept versions by validation
    accuracy, the path from the root to the best, and every child of the best with its label."""
    kept = [t for t in trials if t.label == Label.KEPT and t.fitness.val]
    if not kept:
        return ""
    board = sorted(kept, key=lambda t: (-t.fitness.mean_val, t.id))
    by_version = {t.version: t for t in trials if t.version}
    best, path = board[0], []
    v = board[0].version
    while v is not None and v in by_version:
        path.append(f"{v} [{by_version[v].intervention}]")
        v = (by_version[v].parents or [None])[0]
    lines = ["Leaderboard (kept versions, mean validation accuracy):"]
    lines += [f"- {t.version} val {t.fitness.mean_val:.3f}: {t.intervention}" for t in board[:top]]
    lines += ["", "Path from the root to the best: " + " -> ".join(reversed(path)), "", f"Children of {best.version}:"]
    kids = [t for t in trials if t.parents[:1] == [best.version]]
    lines += [f"- trial {t.id} {t.intervention}: {t.label}{_gain(t)}; {t.hypothesis[:200]}" for t in kids] or ["- none yet"]
    return "\n".join(lines)
