"""Which state the next trial branches from, and whether it is a crossover: the search's
decisions, as functions of a view of the run (evolve/search/view.py) and the search's settings.

    greedy       the best open state (keep-or-revert on one path)
    population   after three failures in a row the last kept version (roll back), else the
                 elite with the best parent score (population.select_parent)
    escalation   three failures in a row change what the agent is asked (and roll back)
    crossover    when one is due (population.crossover_due): the parent's harness merged
                 with an elite's that carries changes the parent lacks, against their common
                 ancestor; a pair whose changes conflict is recorded and skipped, never guessed;
                 a pair whose gains come from the same ancestor change (history.repeats_ancestor)
                 and a pair already crossed in this order are skipped, a pair crossed the other
                 way round is tried after every fresh one
    merge        where the policy merges near misses (an evolving controller after a stall):
                 the best pair of near misses made on the parent's version and not merged
                 yet, as one trial from the parent (evolve/search/near_miss.py); before a crossover

"three" and the crossover timing, the frontier and the selection temperature are the
controller's policy (evolve/search/policy.py): fixed, or revised as the run goes.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

from evotrainer.agents import Escalation
from evotrainer.config import SearchConfig
from evotrainer.evolve.search import history, near_miss
from evotrainer.evolve.search import plans as plan
from evotrainer.evolve.search.policy import ControllerPolicy
from evotrainer.evolve.search.population import SelectionConfig, crossover_due, mates, merge, select_parent
from evotrainer.evolve.search.view import RunView
from evotrainer.evolve.segments.findings import misleads
from evotrainer.lineage.events import CrossoverConflict, Escalated, Event
from evotrainer.lineage.plan import TrialPlan
from evotrainer.lineage.state import State

Harness = Callable[[str], tuple[dict, dict[str, str]]]  # version -> its knobs and its slot files


def choose_parent(view: RunView, n: int, open_: list[State], *, search: SearchConfig, selection: SelectionConfig,
                  escalation: Callable[[], Escalation | None], policy: ControllerPolicy = ControllerPolicy(),
                  seed: int | str = 0) -> State | None:
    """The parent of trial `n` among the open states. `escalation` is asked only where the
    choice depends on it (it records its decision the first time it is asked); `seed` draws
    the parent where the policy's temperature is above 0 (the same seed, the same parent)."""
    best = max(open_, key=lambda s: (s.mean_val, s.depth, s.version), default=None)
    if best is None or search.selection == "greedy":
        return best
    by_key = {s.key: s for s in open_}
    if escalation() is not None:  # roll back to the last kept version
        back = [s for s in open_ if view.kept and s.version == view.kept[-1].version]
        if back:
            return max(back, key=lambda s: s.depth)
    elites = [e for e in view.population(selection) if e.key in by_key]
    plans = view.plans
    recent = [e.changes for e in view.elites([plans[t.id].parent for t in view.trials[-selection.recent:]
                                              if t.id in plans])]
    pick = select_parent(elites, history.children(view.trials, plans), n, cfg=selection, recent_parents=recent,
                         exhausted=view.exhausted, temperature=policy.temperature, seed=seed)
    return by_key[pick.key] if pick else best


def crossover(view: RunView, n: int, parent: State, *, search: SearchConfig, selection: SelectionConfig,
              harness: Harness, record: Callable[[Event], None],
              policy: ControllerPolicy = ControllerPolicy()) -> TrialPlan | None:
    """A crossover plan for trial `n` from `parent` where one is due, else None; a conflicting
    pair is `record`ed (CrossoverConflict) and the next mate is tried."""
    if search.selection != "population" or not search.crossover:
        return None
    if not crossover_due(history.operations(view.trials), policy.crossover_window, policy.crossover_min_rate):
        return None
    pairs = [(p.parent.version, p.mate.version) for p in view.plans.values() if p.mate]
    (first,) = view.elites([parent])
    for mate in mates(view.population(selection), first, Counter(map(frozenset, pairs))):
        if (parent.version, mate.version) in pairs or history.repeats_ancestor(view.trials, parent.version,
                                                                                mate.version):
            continue
        base = history.common_ancestor(view.trials, parent.version, mate.version)
        (bk, bf), (pk, pf), (mk, mf) = (harness(v) for v in (base, parent.version, mate.version))
        m = merge(bk, pk, mk, base_files=bf, a_files=pf, b_files=mf)
        if m.conflicts:
            record(CrossoverConflict([parent.version, mate.version], list(m.conflicts)))
            continue
        mate_state = next(s for s in view.states if s.key == mate.key)
        return plan.of_crossover(parent, mate_state, f"v{n}", parent_changes=first.changes, mate_changes=mate.changes,
                                 knobs=m.knobs, files=m.files)
    return None


def merge_near_misses(view: RunView, n: int, parent: State, min_gain: float,
                      policy: ControllerPolicy = ControllerPolicy()) -> TrialPlan | None:
    """A merge of two near misses for trial `n` from `parent`, where the policy merges and a
    pair made on the parent's version is left, else None."""
    if not policy.merge_near_misses:
        return None
    pair = near_miss.best_pair(near_miss.near_misses(view.planned, parent.version, min_gain),
                               near_miss.merged_pairs(view.plans.values()))
    return plan.of_merge(parent, f"v{n}", *pair) if pair else None


def escalation(view: RunView, search: SearchConfig, *, timeout_s: float, record: Callable[[Event], None],
               note: Callable[[Event], None], revert_after: int = 3) -> Escalation | None:
    """Three failures in a row (EvoTrainer; `revert_after`, the policy's): leave their layers,
    subtract first, roll back, and check the diagnostics that prompted them (replayed over
    this run's versions; one that does not separate failed versions from kept ones is
    ignored). Decided once per streak and `record`ed (Escalated), so a resume reuses it; a
    replay that cannot run is `note`d."""
    if not search.escalation:
        return None
    streak = history.failures_in_a_row(view.trials)
    if len(streak) < revert_after:
        return None
    last = streak[-1].id
    decided = view.escalation_after(last)
    if decided is None:
        plans = view.plans
        triggers = {(plans[t.id].trigger or "none").split(":")[0] for t in streak if t.id in plans}
        ignore = sorted(d for d in triggers - {"none"} if misleads(view.trials, d, timeout_s, note))
        families = {n: p.family for n, p in plans.items()}
        avoid = sorted({history.family(t.intervention, families.get(t.id)) for t in streak})
        decided = Escalated(last, avoid, ignore)
        record(decided)
    return Escalation(avoid=frozenset(decided.avoid), ignore=frozenset(decided.ignore))
