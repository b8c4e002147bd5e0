"""The run as the search sees it: one read of the lineage, and what the controller derives
from it to decide a trial.

The controller keeps no search state in memory that the lineage does not hold (so a resumed
controller decides as the killed one would have), and it reads the lineage once per trial:
`RunView.read(store)` takes the trials and the events as they stand, and everything below
is derived from those two lists, each at most once. A view is never updated: what the
controller records after reading it is read again in the next trial's view.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

from evotrainer.evolve.search import history
from evotrainer.evolve.search.population import Elite, SelectionConfig, promote
from evotrainer.labels import Label
from evotrainer.lineage import LineageStore, TrialRecord
from evotrainer.lineage.events import (
    ControlFinished,
    ControllerRevised,
    Escalated,
    Event,
    FinalFinished,
    PairControlFinished,
    ParentExhausted,
    RunStarted,
    TrialFinished,
    TrialStarted,
)
from evotrainer.lineage.plan import TrialPlan
from evotrainer.lineage.state import State

E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class RunView:
    trials: tuple[TrialRecord, ...]      # finished trials, by number
    events: tuple[Event, ...]            # every event, in the order recorded

    @classmethod
    def read(cls, store: LineageStore) -> "RunView":
        return cls(tuple(store.trials()), tuple(store.events()))

    def as_started(self, trial: int) -> "RunView":
        """The view a trial redone on resume runs on: the trials that had finished when it first
        started (its twin check, failure streak and replays read what they read before the kill,
        not the siblings that finished beside it since), and every event as it stands (a control
        trained before the kill is found, not trained again)."""
        first = next((i for i, e in enumerate(self.events) if isinstance(e, TrialStarted) and e.trial == trial),
                     len(self.events))
        done = {e.trial for e in self.events[:first] if isinstance(e, TrialFinished)}
        return RunView(tuple(t for t in self.trials if t.id in done), self.events)

    def of(self, *kinds: type[E]) -> list[E]:
        """The events of these kinds, in the order recorded."""
        return [e for e in self.events if isinstance(e, kinds)]

    # ------------------------------------------------------------------ the run

    @cached_property
    def started(self) -> RunStarted | None:
        return next(iter(self.of(RunStarted)), None)

    @cached_property
    def final(self) -> FinalFinished | None:
        return (self.of(FinalFinished) or [None])[-1]

    @cached_property
    def root(self) -> TrialRecord | None:
        return next((t for t in self.trials if t.id == 0), None)

    @cached_property
    def next_trial(self) -> int:
        """The number the next new trial takes: past every trial finished or started."""
        return max([t.id for t in self.trials] + [e.trial for e in self.of(TrialStarted)], default=0) + 1

    @cached_property
    def reference_acc(self) -> float | None:
        """The root's mean validation accuracy (the reference recipe's); None before it is scored."""
        return self.root.fitness.mean_val if self.root else None

    @cached_property
    def plans(self) -> dict[int, TrialPlan]:
        """Trial number -> the plan it (last) started with (every trial but the root's)."""
        return {e.trial: e.plan for e in self.of(TrialStarted) if e.plan}

    @cached_property
    def in_flight(self) -> dict[int, TrialPlan]:
        """Trials started and not finished, with the plan each (last) started with: with
        search.concurrency > 1, the claims of the trials running beside the next proposal."""
        done = {t.id for t in self.trials}
        return {n: p for n, p in self.plans.items() if n not in done}

    @cached_property
    def planned(self) -> list[tuple[TrialRecord, TrialPlan]]:
        """Finished trials with the plan each (last) started with: all but the root."""
        return [(t, self.plans[t.id]) for t in self.trials if t.id in self.plans]

    @cached_property
    def spent(self) -> int:
        return history.spent(self.trials)

    # ------------------------------------------------------------------ states

    @cached_property
    def kept(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.label == Label.KEPT]

    @cached_property
    def states(self) -> list[State]:
        """Every state a trial may branch from, or the final comparison's retraining: kept children, then controls."""
        return [t.fitness.state for t in self.kept] + [e.state for e in self.of(ControlFinished)]

    @cached_property
    def trained_states(self) -> list[State]:
        """`states` and the states of children the gate discarded (a blocking finding's, never):
        every validated candidate for a winner picked as a sweep picks."""
        discarded = [t.fitness.state for t in self.trials
                     if t.label == Label.DISCARDED and t.fitness.state is not None]
        return self.states + discarded

    def open_states(self, max_depth: int, restart: bool) -> list[State]:
        """States that can still be a parent: segments left (continue mode) and not exhausted."""
        exhausted = {(e.version, e.depth) for e in self.of(ParentExhausted)}
        return [s for s in self.states  # restart mode: a state is whole, any may be a parent
                if (restart or s.depth < max_depth) and s.key not in exhausted]

    def control(self, version: str, depth: int) -> State | None:
        """The control of `version`'s children at `depth` (the parent continued), where trained."""
        return next((e.state for e in self.of(ControlFinished) if e.state.key == (version, depth)), None)

    def pair_control(self, version: str, depth: int, pair: int) -> float | None:
        """The control's validation fitness in extra seed pair `pair`, where trained."""
        done = [e.val for e in self.of(PairControlFinished) if (e.version, e.depth, e.pair) == (version, depth, pair)]
        return done[-1] if done else None

    @cached_property
    def revisions(self) -> list[ControllerRevised]:
        """The search controller's policy revisions, oldest first (evolve/search/policy.py)."""
        return self.of(ControllerRevised)

    @cached_property
    def exhausted(self) -> frozenset[str]:
        """Versions the agent had nothing left for, at some depth (ParentExhausted)."""
        return frozenset(e.version for e in self.of(ParentExhausted))

    def escalation_after(self, trial: int) -> Escalated | None:
        """The escalation decided for the streak of failures ending at `trial`, if recorded."""
        return next((e for e in self.of(Escalated) if e.after == trial), None)

    # ------------------------------------------------------------------ selection

    def elites(self, states: list[State]) -> list[Elite]:
        """States as selection sees them: what each carries, and the surface of its last change."""
        families = {n: p.family for n, p in self.plans.items()}
        changes, surfaces = history.changes(self.trials), history.surfaces(self.trials, families)
        return [Elite(s.version, s.depth, s.mean_val, changes.get(s.version, frozenset()),
                      surfaces.get(s.version, "root")) for s in states]

    def population(self, selection: SelectionConfig) -> list[Elite]:
        """The elites, rebuilt in the order states were recorded (so a resumed controller has the
        same population): kept children and controls ask to join in turn."""
        kept = {t.id: t for t in self.kept}
        states = [e.state if isinstance(e, ControlFinished) else kept[e.trial].fitness.state
                  for e in self.of(ControlFinished, TrialFinished)
                  if isinstance(e, ControlFinished) or e.trial in kept]
        pop: list[Elite] = []
        for elite in self.elites(states):  # roles measure gains from the reference's accuracy
            pop, _ = promote(pop, elite, selection, self.reference_acc)
        return pop
