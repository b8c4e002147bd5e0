"""Where a trial's plan comes from: an agent's proposal (or its failure), a crossover of
two elites, or a merge of two near misses. The plan itself is a lineage record (lineage/plan.py): it is what the trial's
`trial_started` event carries, so a resumed controller redoes the trial as planned.
"""
from __future__ import annotations

from evotrainer.agents import AgentFailed, Proposal
from evotrainer.evolve.search.history import CROSSOVER, MERGE, MERGED
from evotrainer.evolve.segments.state import State
from evotrainer.lineage.plan import Failure, TrialPlan

__all__ = ["Failure", "TrialPlan", "of_agent", "of_crossover", "of_merge"]


# ---------------------------------------------------------------------- the plans' origins

def of_agent(parent: State, version: str, round_: int, p: Proposal | AgentFailed) -> TrialPlan:
    """An agent's proposal; or its failure, recorded as a trial with the failure's label (the run goes on)."""
    if isinstance(p, AgentFailed):  # it states no change, only what it meant and what it cost
        return TrialPlan(parent=parent, version=None, round=round_, intervention=p.intervention,
                         family=p.usage.get("role", "agent"), hypothesis=p.hypothesis, frozen=None,
                         success_criterion="-", rollback=None, knobs=None, files=None, agent=p.agent, trigger=None,
                         expected=None, usage=p.usage, failed=Failure(p.label, p.reason))
    return TrialPlan(parent=parent, version=version, round=round_, intervention=p.intervention, family=p.family,
                     hypothesis=p.hypothesis, frozen=p.frozen, success_criterion=p.success_criterion,
                     rollback=p.rollback, knobs=p.knobs, files=p.files, agent=p.agent, trigger=p.trigger,
                     expected=p.expected, usage=p.usage)


def of_crossover(parent: State, mate: State, version: str, *, parent_changes: frozenset[str],
                 mate_changes: frozenset[str], knobs: dict, files: dict) -> TrialPlan:
    """Two elites' harnesses merged (population.merge gave `knobs` and `files`); no agent, no round."""
    return TrialPlan(
        parent=parent, version=version, round=None, intervention=CROSSOVER, family=CROSSOVER,
        hypothesis=f"combining {parent.version}'s changes ({', '.join(sorted(parent_changes)) or 'none'}) with "
                   f"{mate.version}'s ({', '.join(sorted(mate_changes))}) keeps both gains, because they change "
                   "different parts of the harness",
        frozen=f"everything else of {parent.version}",
        success_criterion="validation accuracy beats the control's beyond the noise floor, with no blocking finding",
        rollback=f"back to {parent.version}", knobs=knobs, files=files, agent="crossover", trigger="none",
        expected=None, usage=None, mate=mate)


def of_merge(parent: State, version: str, a, b) -> TrialPlan:
    """Two near misses' changes together (evolve/search/near_miss.py: `a` and `b`, NearMiss records of
    discarded trials made on `parent`'s version, touching different knobs and files)."""
    return TrialPlan(
        parent=parent, version=version, round=None, intervention=f"{a.intervention}{MERGED}{b.intervention}",
        family=MERGE,
        hypothesis=f"{a.intervention} (trial {a.trial}, {100 * a.gain:+.1f} points) and {b.intervention} "
                   f"(trial {b.trial}, {100 * b.gain:+.1f}) each gained too little to clear the gate alone; they "
                   f"change different parts of the harness ({a.family}, {b.family}), so together their gains add up",
        frozen=f"everything else of {parent.version}",
        success_criterion="validation accuracy beats the control's beyond the noise floor, with no blocking finding",
        rollback=f"back to {parent.version}", knobs=a.knobs | b.knobs, files=a.files | b.files, agent=MERGE,
        trigger="none", expected=None, usage=None, merged=(a.trial, b.trial))
