"""What the next trial does: the search's decisions on the lineage as it stands (evolve/search/),
made in order: the controller's policy revised where one is due, a parent chosen, then a merge
of near misses, a crossover or the agent's proposal from it. Also the parent's findings, which
the agent reads: each state's are read once, in a thread, from when it has trained.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

from evotrainer.agents import AgentContext, AgentFailed, Escalation, Proposal
from evotrainer.config import RunConfig
from evotrainer.evolve.harnesses import Harnesses
from evotrainer.evolve.recorder import Recorder
from evotrainer.evolve.search import history, parents, specialists
from evotrainer.evolve.search import plans as plan
from evotrainer.evolve.search import policy as search_policy
from evotrainer.evolve.search.plans import TrialPlan
from evotrainer.evolve.search.policy import ControllerPolicy
from evotrainer.evolve.search.population import SelectionConfig
from evotrainer.evolve.search.view import RunView
from evotrainer.evolve.segments.state import State
from evotrainer.evolve.segments.training import Training
from evotrainer.labels import Label
from evotrainer.lineage.events import ControllerRevised, ParentExhausted, Stopped
from evotrainer.skills import SkillLibrary
from evotrainer.tasks.base import Task

# what `next` says where it has no plan: the search ends; wait for a trial in flight; ask again now
STOP, WAIT, AGAIN = "stop", "wait", "again"
AGENT_ERRORS_TO_STOP = 3  # agent_error trials in a row (a wrong URL, key or model): stop, do not spend the budget

Agent = Callable[[AgentContext], Proposal | AgentFailed | None]


def beside(in_flight: dict[int, TrialPlan], reached: Callable[[TrialPlan], frozenset[str]]) -> str:
    """The claims of the trials in flight (each the surfaces its change `reached`), as an
    agent's lineage text ends (none: nothing)."""
    if not in_flight:
        return ""
    return "\n\nIn flight now (their surfaces of their parents are taken):\n" + "\n".join(
        f"- trial {n}: {p.intervention} ({', '.join(sorted(reached(p)))}) from {p.parent.version}"
        for n, p in sorted(in_flight.items()))


class Proposer:
    """The next trial's plan, on the view the recorder last read. `max_depth` is how deep a
    state may grow (continue mode: segments to the reference's total steps)."""

    def __init__(self, cfg: RunConfig, task: Task, agent: Agent, *, recorder: Recorder, harnesses: Harnesses,
                 training: Training, max_depth: int):
        self.cfg, self.task, self.agent = cfg, task, agent
        self.recorder, self.harnesses, self.training, self.max_depth = recorder, harnesses, training, max_depth
        self.initial_policy = ControllerPolicy.initial(cfg.search)  # the search's policy until revised
        self._findings_of: dict[tuple, Future] = {}  # a state is diagnosed once, as child and as parent
        self._reader: ThreadPoolExecutor | None = None  # read_later's thread, until `close`
        self._escalated: tuple[RunView, Escalation | None] | None = None  # decided once per view
        self._lock = threading.Lock()  # trials in flight ask for findings at once

    @property
    def view(self) -> RunView:
        return self.recorder.view

    @property
    def evolving(self) -> bool:
        return self.cfg.search.controller == "evolving"

    @property
    def policy(self) -> ControllerPolicy:
        """The search's policy as the current view has it: the latest revision's where evolving."""
        return search_policy.current(self.view.revisions, self.initial_policy) if self.evolving else self.initial_policy

    @property
    def selection(self) -> SelectionConfig:
        return SelectionConfig(capacity=self.policy.frontier)

    @property
    def search_seed(self) -> int:
        """What seeds the search's own draws (agents' choices, parent draws): search.seed, or the
        run's first training seed."""
        return self.cfg.seeds[0] if self.cfg.search.seed is None else self.cfg.search.seed

    def next(self, view: RunView, t_end: float) -> TrialPlan | str:
        """The next trial's plan on `view`; STOP where the search ends here (recorded why); AGAIN
        where the parent had nothing left (recorded exhausted: another parent is chosen); WAIT
        where nothing can be proposed until a trial in flight finishes (nothing off the surfaces
        they hold, or no open state but theirs to come)."""
        n, record = view.next_trial, self.recorder.record
        if time.time() > t_end:
            record(Stopped("wall-clock budget spent"))
            return STOP
        self.revise()
        parent = self.select_parent(n)
        if parent is None:
            if view.in_flight:  # a trial in flight may still make a new state
                return WAIT
            record(Stopped("no state has segments or untried interventions left"))
            return STOP
        broken = history.agent_errors_in_a_row(view.trials)
        if len(broken) >= AGENT_ERRORS_TO_STOP:
            record(Stopped(f"the agent failed {len(broken)} times in a row: {broken[-1].reflection}"))
            return STOP
        trial_plan = self.merge(n, parent) or self.crossover(n, parent) or self.propose(n, parent)
        knobs = self.harnesses.knobs(parent.version)
        busy = specialists.claimed(view.in_flight, parent.version, knobs)
        if trial_plan is not None and specialists.reached(trial_plan, knobs) & busy:
            return WAIT  # an agent whose change reaches a surface in flight (its own choice): asked again later
        if trial_plan is None:
            if busy:
                return WAIT
            self.recorder.store.append(ParentExhausted(parent.version, parent.depth))
            return AGAIN
        return trial_plan

    def revise(self) -> None:
        """An evolving controller's revision of its policy where one is due: recorded (and
        read back) before the trial relies on it, then written to RUN/controller/."""
        if not self.evolving:
            return
        view = self.view
        revised = search_policy.decide(self.policy, view.trials, view.plans, view.revisions)
        if revised is None:
            return
        self.recorder.record(revised)
        self.write_policy(self.recorder.look().revisions)

    def write_policy(self, revisions: Sequence[ControllerRevised]) -> None:
        """RUN/controller/policy.yaml and one file per revision (a resume rewrites what a kill cut off)."""
        search_policy.write_files(self.recorder.run_dir / "controller", self.initial_policy, revisions)

    def select_parent(self, n: int) -> State | None:
        view = self.view
        return parents.choose_parent(view, n, view.open_states(self.max_depth, self.cfg.search.restarts),
                                     search=self.cfg.search, selection=self.selection, escalation=self.escalation,
                                     policy=self.policy, seed=f"parent {self.search_seed} {n}")

    def crossover(self, n: int, parent: State) -> TrialPlan | None:
        return parents.crossover(self.view, n, parent, search=self.cfg.search, selection=self.selection,
                                 harness=self.harnesses.files, record=self.recorder.store.append,
                                 policy=self.policy)  # a conflict is recorded, not shown

    def merge(self, n: int, parent: State) -> TrialPlan | None:
        return parents.merge_near_misses(self.view, n, parent, self.cfg.promotion.min_gain, self.policy)

    def escalation(self) -> Escalation | None:
        """The escalation for the current view (search.escalation), decided and recorded once per view."""
        if self._escalated is None or self._escalated[0] is not self.view:
            self._escalated = (self.view, parents.escalation(
                self.view, self.cfg.search, timeout_s=self.cfg.budget.trial_timeout_s, record=self.recorder.record,
                note=self.recorder.store.append, revert_after=self.policy.revert_after))
        return self._escalated[1]

    def propose(self, n: int, parent: State, feedback: str = "", rejected: tuple[str, ...] = (),
                round_: int = 0) -> TrialPlan | None:
        """The agent's plan for trial `n` from `parent` (round > 0: a revision a person asked
        for at an approval point, with their feedback, the rejected interventions counted as tried)."""
        self.recorder.stage(f"trial {n}: the {self.cfg.agent} agent proposes a change to {parent.version}")
        try:
            p = self.agent(self.context(n, parent, feedback, rejected))
        except Exception as e:  # noqa: BLE001 (an agent's own failure is a label, never the run's end)
            p = AgentFailed(Label.AGENT_ERROR, f"{type(e).__name__}: {e}", self.cfg.agent)
        if p is None:
            return None
        return plan.of_agent(parent, f"v{n}" + (f"r{round_}" if round_ else ""), round_, p)

    def context(self, n: int, parent: State, feedback: str, rejected: tuple[str, ...]) -> AgentContext:
        """What the agent is given to propose trial `n` from `parent`."""
        trials, in_flight = self.view.trials, self.view.in_flight
        tried = {t.intervention for t in trials if t.parents[:1] == [parent.version]} | set(rejected) | \
            specialists.in_flight_from(in_flight, parent.version) | history.hacked_above(trials, parent.version)
        knobs = self.harnesses.knobs(parent.version)
        closed = specialists.closed_families(specialists.claimed(in_flight, parent.version, knobs))
        # what an llm or command agent reads of the lineage; with trials in flight, also their
        # claims and the outcomes that came in while they ran
        shown = history.leaderboard(trials) + beside(
            in_flight, lambda p: specialists.reached(p, self.harnesses.knobs(p.parent.version)))
        if self.cfg.search.concurrency > 1:
            shown += history.latest(trials)
        return AgentContext(
            findings=self.findings(parent), knobs=knobs, root_knobs=self.harnesses.knobs("v0"),
            target_level=self.task.target_level, task=self.cfg.task, tried=frozenset(tried), skills=self.skills(),
            escalation=self.escalation(), seed=1000 * self.search_seed + n, parent=parent.version,
            harness_dir=self.harnesses.dir(parent.version), lineage=shown, feedback=feedback, trial=n,
            workdir=self.recorder.run_dir / "agents", closed=closed, reference_acc=self.view.reference_acc,
            backend=self.cfg.backend,
            family_weights=search_policy.weights_now(self.policy, trials, self.view.plans) if self.evolving else {},
            family_trials=search_policy.tried_families(trials, self.view.plans)
            if self.cfg.search.order == "spread" else None)

    def skills(self) -> list:
        if not self.cfg.search.skills:
            return []
        lib = SkillLibrary(self.cfg.search.skills)
        try:
            return lib.skills()
        finally:
            lib.close()

    def findings(self, state: State) -> list[dict]:
        """The worst finding per diagnostic over the state's seeds, critical and blocking first
        (findings.worst_findings), read once per state: as a child and again as a parent."""
        self.read_later(state.version, state.dirs)
        return self._findings_of[(state.version, *sorted(state.dirs.items()))].result()

    def read_later(self, version: str, dirs: dict[int, str]) -> None:
        """Start reading a state's findings in a thread (Training.train's `read`: while its
        checkpoints are scored, ~1 s per state off the controller's own time); once per state."""
        key = (version, *sorted(dirs.items()))
        with self._lock:
            if key not in self._findings_of:  # the state's own harness reads it (a new diagnostic included)
                self._reader = self._reader or ThreadPoolExecutor(1, thread_name_prefix="findings")
                self._findings_of[key] = self._reader.submit(self.training.findings, dict(dirs),
                                                             self.harnesses.dir(version))

    def reading(self) -> set[str]:
        """The train directories whose findings have been read or are being read."""
        return {d for key in self._findings_of for _, d in key[1:]}  # key: version, (seed, dir), ...

    def close(self) -> None:
        """The findings reader's thread ends (a run under way is over)."""
        if self._reader is not None:
            self._reader.shutdown()
            self._reader = None
