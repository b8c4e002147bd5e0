"""The controller: the evolution loop (docs/concepts.md).

A *state* (evolve/segments/state.py) is a harness version at a lineage depth with one checkpoint per
seed. In `continue` mode (population-based training) depth counts segments of training
behind the state; trial 0 trains the root harness one segment from the base, and each
later trial:

    select parent (search.selection: greedy, or a population of elites) -> diagnose it ->
    the agent proposes one intervention (or a crossover of two elites is due): the plan ->
    the trial's stages (evolve/trial.py): legality -> backtest on the parent's rollouts ->
    train the child one segment per seed from the parent's checkpoints -> evaluate (a
    process of its own) -> gate against the control (the parent continued unchanged, same
    segment seeds) -> kept / discarded / invalid, written to the lineage in one transaction.

In `restart` mode (the published protocol) every version trains from the base for the
whole budget and its control is its parent, trained from the base with the same seeds.

Controls are states too, so the lineage deepens even when children fail. Everything is
recorded before it is relied on; a killed controller resumes with `run()` again: pending
trials are redone under their number and with the plan they started with
(evolve/search/plans.py), and finished work is never repeated. The lineage is read once per trial,
into a view (evolve/search/view.py) that the search's decisions (evolve/search/parents.py) and the trial
itself work from; a trial is given that view and the few services it needs (evolve/tools.py).

The search's own policy (frontier, selection temperature, crossover timing, when to roll
back, the weights of intervention families) is the config's all run long, or, with
`search.controller: evolving`, revised every few trials from the lineage before the parent
is chosen (evolve/search/policy.py), each revision recorded before it is relied on.

Run directory: config.yaml, lineage.sqlite, evidence.sqlite, harness-repo/ (git, one
tag per version), harnesses/vN (checkouts), versions/vN/seed-S and controls/vN-dD/seed-S
(train directories), controller/policy.yaml and policy-rN.yaml (an evolving controller's
policy, each revision), cache/ (the segment cache, unless the config points elsewhere).
"""
from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable

from evotrainer.agents import AgentContext, AgentFailed, Escalation, Proposal, make_agent, set_knob
from evotrainer.catalog import get_task
from evotrainer.config import RunConfig
from evotrainer.errors import UsageError
from evotrainer.evolve import approval, setup
from evotrainer.evolve.final_run import run_final, winner_schedule
from evotrainer.evolve.notices import OnEvent, Stage, ignore
from evotrainer.evolve.search import history, parents, specialists
from evotrainer.evolve.search import plans as plan
from evotrainer.evolve.search import policy as search_policy
from evotrainer.evolve.search.plans import TrialPlan
from evotrainer.evolve.search.policy import ControllerPolicy
from evotrainer.evolve.search.population import SelectionConfig
from evotrainer.evolve.search.view import RunView
from evotrainer.evolve.segments.cache import SegmentCache
from evotrainer.evolve.segments.progress import Progress, seed_metrics
from evotrainer.evolve.segments.state import Clock, ControlFailed, Segment, SegmentFailed, State
from evotrainer.evolve.segments.training import Training
from evotrainer.evolve.stats.paired import noise_floor
from evotrainer.evolve.status import controller_seconds
from evotrainer.evolve.tools import TrialTools
from evotrainer.evolve.trial import Trial
from evotrainer.executors import use_isolation
from evotrainer.harness import REFERENCE, inspect_harness
from evotrainer.harness.candidate import Candidate, propose_files, vet
from evotrainer.harness.knobs import load_knobs, read_yaml
from evotrainer.harness.versions import HarnessRepo
from evotrainer.labels import AGENT_FAILED, Label
from evotrainer.lineage import Fitness, LineageStore, TrialRecord
from evotrainer.lineage.events import (
    ApprovalDecided,
    ApprovalWaiting,
    Event,
    FinalFinished,
    ParentExhausted,
    RunFinished,
    RunStarted,
    SessionStarted,
    Stopped,
    TrackerFailed,
    TrialResumed,
    TrialStarted,
    new_run_id,
)
from evotrainer.policy.model import resolve_model
from evotrainer.sandbox import describe
from evotrainer.sandbox import record as sandbox_record
from evotrainer.skills import SkillLibrary
from evotrainer.trackers import TrackerSet, open_trackers, trial_row
from evotrainer.trainer.backends import check_backend

# what `_next` says where it has no plan: the search ends; wait for a trial in flight; ask again now
STOP, WAIT, AGAIN = "stop", "wait", "again"
AGENT_ERRORS_TO_STOP = 3  # agent_error trials in a row (a wrong URL, key or model): stop, do not spend the budget


def learn(lib: SkillLibrary, run_dir: Path, cfg: RunConfig, level: int, reference_acc: float | None,
          done: list[tuple[TrialRecord, TrialPlan]], run: str | None = None) -> None:
    """Agent trials' outcomes (each with its plan) into `lib`, under the run's conditions and
    its key (`run`, else `run_key` read from its lineage): what a run records as it goes, and
    what a finished lineage gives a library afterwards (bench/search_suite.py's transfer).
    Learning a trial again changes nothing. Crossovers, agent failures, equivalents and aborts
    say nothing about an intervention and are passed over (so are near-miss merges: two at once)."""
    run = run or run_key(run_dir)
    for t, p in done:
        if not t.parents or p.agent in (history.CROSSOVER, history.MERGE) \
                or t.label in AGENT_FAILED | {Label.EQUIVALENT, Label.ABORTED}:
            continue
        lib.record(run=run, trial=t.id, task=cfg.task, trigger=p.trigger or "none",
                   intervention=t.intervention, family=history.family(t.intervention, p.family),
                   patch=p.knobs or {}, expected=t.hypothesis, label=t.label, gain=t.fitness.gain,
                   level=level, ref_acc=reference_acc, backend=cfg.backend, run_dir=str(Path(run_dir).resolve()))


def run_key(run_dir: Path, started: RunStarted | None = None) -> str:
    """What a run's skill outcomes are keyed by: its id (`started`, else its lineage's
    run_started), so a run made again in a deleted run's directory is another run; a run from
    before ids by its directory, as its outcomes always were."""
    if started is None:
        store = LineageStore(Path(run_dir) / "lineage.sqlite")
        try:
            started = next(iter(store.events(RunStarted)), None)
        finally:
            store.close()
    return started.run_id if started is not None and started.run_id else str(Path(run_dir).resolve())


def beside(in_flight: dict[int, TrialPlan], reached: Callable[[TrialPlan], frozenset[str]]) -> str:
    """The claims of the trials in flight (each the surfaces its change `reached`), as an
    agent's lineage text ends (none: nothing)."""
    if not in_flight:
        return ""
    return "\n\nIn flight now (their surfaces of their parents are taken):\n" + "\n".join(
        f"- trial {n}: {p.intervention} ({', '.join(sorted(reached(p)))}) from {p.parent.version}"
        for n, p in sorted(in_flight.items()))


class Controller:
    def __init__(self, cfg: RunConfig, run_dir: Path | str, on_event: OnEvent | None = None,
                 agent: Callable[[AgentContext], Proposal | AgentFailed | None] | None = None,
                 run_backtests: bool = True, approval_poll_s: float = 1.0, backend: type[Training] = Training):
        """`agent(context)` proposes (default: the config's agent); `run_backtests=False` lets a
        test show that the gate alone still stops what a backtest would have caught;
        `approval_poll_s` is how often a run paused at a human gate looks for the decision;
        `backend` trains and reads segments (the search simulator's draws them from a table)."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.agent, self.run_backtests = agent or make_agent(cfg), run_backtests
        self.backend = backend
        self.approval_poll_s = approval_poll_s
        self.initial_policy = ControllerPolicy.initial(cfg.search)  # the search's policy until revised
        self.task = get_task(cfg.task, cfg.level)
        self.runtime = cfg.runtime().validate(here=cfg.executor == "local")
        # a user's model: a local directory every worker loads (checked now: bad input stops here)
        self.model = resolve_model(cfg.model) if cfg.model else None
        check_backend(self.runtime, inspect_harness(cfg.harness or REFERENCE), "the root harness", self.task)
        self.jobs = cfg.job_executor()  # where every training and evaluation job runs: reached now (a
        self.jobs.start()               # Ray cluster that cannot be reached stops the run before it starts)
        # continue mode: segments to the reference's total steps; restart mode: every state is whole
        self.max_depth = 1 if cfg.search.restarts else cfg.budget.total_steps // cfg.budget.steps_per_segment
        self.on_event = on_event or ignore
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.store = LineageStore(self.run_dir / "lineage.sqlite")
        self.repo: HarnessRepo | None = None
        self.base: str | None = None
        self.training: Training | None = None   # set up with the base (`_setup`)
        self._findings_of: dict[tuple, Future] = {}  # a state is diagnosed once, as child and as parent
        self._reader: ThreadPoolExecutor | None = None  # read_later's thread, while a run is under way
        self.view = RunView((), ())  # the lineage as the current trial began (`_look`)
        self._escalated: tuple[RunView, Escalation | None] | None = None  # decided once per view
        self.trackers: TrackerSet = TrackerSet([], self._tracker_failed)  # opened by `run`
        # trials in flight (search.concurrency > 1) share these: one lock per service they call back
        self._lock = threading.RLock()          # findings readers, checkouts, finishing
        self._once: dict[tuple, Future] = {}    # controls two trials in flight both need: trained once
        self._cancel = threading.Event()        # set: trials in flight stop their workers (a kill, an error)

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        # every worker this process starts runs in the sandbox at this level (said in status and reports)
        self.isolation = use_isolation(self.cfg.sandbox)
        t_end = self._wall_clock_end()  # before this session's first event
        # status adds up sessions and reads the sandbox here
        self.store.append(SessionStarted(sandbox_record(self.isolation)))
        self._cancel.clear()  # a run() again on this controller (a resume in-process) starts uncancelled
        self._once.clear()    # and trains again what a cancelled control left unfinished
        self._setup()
        view = self._look()
        # what a kill cut off between a trial's row and its skill outcome
        self._learn(view.planned)
        self.training.ingest_missing(view.trials)  # a resume: what a kill cut off before it was stored
        # opened where the `finally` below closes them (a W&B run left open is a run never finished)
        self.trackers = open_trackers(self.cfg.tracking, self.run_dir, self.run_dir.name, self._tracker_failed)
        try:
            resumed = []
            for started in self.store.pending():  # resume: redo what a kill cut off, same number
                self._record(TrialResumed(started.trial, started.intervention))
                if started.trial > 0 and self.cfg.search.concurrency > 1:
                    resumed.append(started)  # beside the new ones
                elif started.trial > 0:
                    self._look()
                    self._trial(started.trial, started.plan)
            if not self.store.finished(0):
                self._look()
                self._root()
            if self.cfg.search.concurrency > 1:
                self._search_parallel(t_end, resumed)
            else:
                self._search(t_end)
            self.final()  # reads no evidence: the last trial's is stored beside it
        finally:
            self.trackers.close()
            self.training.join_ingest()
            if self._reader is not None:
                self._reader.shutdown()
                self._reader = None

    def _wall_clock_end(self) -> float:
        """When the wall-clock budget runs out: it is the run's, over all its sessions, so a
        resume gets what is left (the time between a kill and a resume is not ours, as status
        counts it)."""
        return time.time() + self.cfg.budget.wall_clock_s - controller_seconds(self.store.log())

    def _search(self, t_end: float) -> None:
        while (view := self._look()).spent < self.cfg.budget.trials:
            trial_plan = self._next(view, t_end)
            if trial_plan == STOP:
                return
            if trial_plan not in (WAIT, AGAIN):
                self._trial(view.next_trial, trial_plan)
        self._record(RunFinished(len(view.trials)))

    def _next(self, view: RunView, t_end: float) -> TrialPlan | str:
        """The next trial's plan on `view`; STOP where the search ends here (recorded why); AGAIN
        where the parent had nothing left (recorded exhausted: another parent is chosen); WAIT
        where nothing can be proposed until a trial in flight finishes (nothing off the surfaces
        they hold, or no open state but theirs to come)."""
        n = view.next_trial
        if time.time() > t_end:
            self._record(Stopped("wall-clock budget spent"))
            return STOP
        self._revise()
        parent = self._select_parent(n)
        if parent is None:
            if view.in_flight:  # a trial in flight may still make a new state
                return WAIT
            self._record(Stopped("no state has segments or untried interventions left"))
            return STOP
        broken = history.agent_errors_in_a_row(view.trials)
        if len(broken) >= AGENT_ERRORS_TO_STOP:
            self._record(Stopped(f"the agent failed {len(broken)} times in a row: {broken[-1].reflection}"))
            return STOP
        trial_plan = self._merge(n, parent) or self._crossover(n, parent) or self._propose(n, parent)
        knobs = self._knobs(parent.version)
        busy = specialists.claimed(view.in_flight, parent.version, knobs)
        if trial_plan is not None and specialists.reached(trial_plan, knobs) & busy:
            return WAIT  # an agent whose change reaches a surface in flight (its own choice): asked again later
        if trial_plan is None:
            if busy:
                return WAIT
            self.store.append(ParentExhausted(parent.version, parent.depth))
            return AGAIN
        return trial_plan

    def _search_parallel(self, t_end: float, resumed: list[TrialStarted]) -> None:
        """Up to search.concurrency trials at once (evolve/search/specialists.py). Each is proposed on
        the lineage as it stands, with every finished trial and the claims of those in flight,
        and recorded as started before it runs; the budget counts trials in flight as spent."""
        most, flight = self.cfg.search.concurrency, {}
        pool = ThreadPoolExecutor(most, thread_name_prefix="trial")
        stopped = False
        try:
            for started in resumed:  # each with the plan and the finished trials it started with
                flight[pool.submit(self._run_trial, started.trial, started.plan,
                                   self._look().as_started(started.trial))] = started.trial
            while True:
                view = self._look()
                if not stopped and len(flight) < most and view.spent + len(flight) < self.cfg.budget.trials:
                    trial_plan = self._next(view, t_end)
                    stopped = trial_plan == STOP
                    if trial_plan == AGAIN:
                        continue
                    if trial_plan not in (STOP, WAIT):
                        n = view.next_trial
                        trial_plan = dataclasses.replace(trial_plan, beside=tuple(sorted(view.in_flight)),
                                                         saw=tuple(t.id for t in view.trials))
                        self.store.begin_trial(TrialStarted.of(n, trial_plan))
                        flight[pool.submit(self._run_trial, n, trial_plan, view)] = n
                        continue
                    if trial_plan == WAIT and not flight:  # nothing in flight will change the view
                        self._record(Stopped("no state has segments or untried interventions left"))
                        stopped = True
                if not flight:
                    break
                done, _ = wait(flight, return_when=FIRST_COMPLETED)
                for f in done:
                    del flight[f]
                    f.result()  # a trial's error is the run's, as with one trial at a time
        except BaseException:
            self._cancel.set()  # trials in flight stop their workers and end (redone on resume)
            wait(flight)
            raise
        finally:
            pool.shutdown(wait=True)
        if not stopped:
            self._record(RunFinished(len(self._look().trials)))

    def _run_trial(self, n: int, trial_plan: TrialPlan, view: RunView) -> None:
        """Trial `n` in a thread of its own, on the view it was proposed on."""
        Trial(self._tools(trial_plan, view), n, trial_plan).run()

    # ------------------------------------------------------------------ the final comparison

    def final(self) -> FinalFinished | None:
        """The final comparison (evolve/final_run.py), recorded as `final_finished`. Done once."""
        done = self._look().final
        if done or not self.cfg.final_seeds:
            return done
        result = run_final(self.view, self.training, self.max_depth, self._record, describe(self.isolation))
        for arm in ("reference", "evolved"):
            seeds = (d for d in (self.run_dir / "final" / arm).glob("seed-*") if d.is_dir())  # not seed-S.log
            for d in sorted(seeds):
                self.trackers.steps(f"final/{arm}/{d.name}", seed_metrics(d))
        self.trackers.final(result.to_json(), result.table)
        return result

    def winner_schedule(self):
        """The winner ("vN@D"), its harness schedule as versions, and as an arm to retrain
        (final_run.winner_schedule on the lineage as it is now): what the benchmarks replay."""
        return winner_schedule(self._look(), self.training, self.max_depth)

    def _setup(self) -> None:
        """The run's config copy, harness repository, base and split key (evolve/setup.py)."""
        setup.save_config(self.run_dir, self.cfg)
        self.repo = setup.open_repo(self.run_dir, self.cfg.harness or REFERENCE)
        started = self.store.events(RunStarted)
        if not started:
            first = setup.first_start(self.cfg, self.task, self.runtime, self.model, self.max_depth, self.on_event)
            self._record(dataclasses.replace(first, run_id=new_run_id()))  # this run's, whatever its directory
            started = self.store.events(RunStarted)
        self.base = started[0].base
        self.runtime = self.runtime.on_base(self.base)  # a LoRA run's adapters sit on its base
        setup.use_key(self.task, started[0])
        if self.evolving:  # the policy files, from the lineage (a kill may have cut off the last one)
            search_policy.write_files(self.run_dir / "controller", self.initial_policy,
                                      RunView.read(self.store).revisions)
        cache = self.cfg.cache_dir(self.run_dir)
        self.training = self.backend(cfg=self.cfg, task=self.task, runtime=self.runtime, base=self.base,
                                     run_dir=self.run_dir, harness_dir=self._harness_dir, on_progress=self._progress,
                                     on_stage=self.stage, executor=self.jobs,
                                     cache=SegmentCache(cache) if cache else None, cancel=self._cancel)

    # ------------------------------------------------------------------ states and proposals

    def _look(self) -> RunView:
        """Read the lineage once: what this trial's decisions and the trial itself read."""
        self.view = RunView.read(self.store)
        return self.view

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

    def _revise(self) -> None:
        """An evolving controller's revision of its policy where one is due: recorded (and
        read back) before the trial relies on it, then written to RUN/controller/."""
        if not self.evolving:
            return
        view = self.view
        revised = search_policy.decide(self.policy, view.trials, view.plans, view.revisions)
        if revised is None:
            return
        self._record(revised)
        search_policy.write_files(self.run_dir / "controller", self.initial_policy, self._look().revisions)

    def _select_parent(self, n: int) -> State | None:
        view = self.view
        return parents.choose_parent(view, n, view.open_states(self.max_depth, self.restart), self.cfg.search,
                                    self.selection, self._escalation, self.policy, f"parent {self._search_seed} {n}")

    def _crossover(self, n: int, parent: State) -> TrialPlan | None:
        return parents.crossover(self.view, n, parent, self.cfg.search, self.selection, self._harness_files,
                                self.store.append, self.policy)  # a conflict is recorded, not shown

    def _merge(self, n: int, parent: State) -> TrialPlan | None:
        return parents.merge_near_misses(self.view, n, parent, self.cfg.promotion.min_gain, self.policy)

    def _escalation(self) -> Escalation | None:
        """The escalation for the current view (search.escalation), decided and recorded once per view."""
        if self._escalated is None or self._escalated[0] is not self.view:
            self._escalated = (self.view, parents.escalation(self.view, self.cfg.search, self.cfg.budget.trial_timeout_s,
                                                            self._record, self.store.append,
                                                            self.policy.revert_after))
        return self._escalated[1]

    def _propose(self, n: int, parent: State, feedback: str = "", rejected: tuple[str, ...] = (),
                 round_: int = 0) -> TrialPlan | None:
        """The agent's plan for trial `n` from `parent` (round > 0: a revision a person asked
        for at an approval point, with their feedback, the rejected interventions counted as tried)."""
        self.stage(f"trial {n}: the {self.cfg.agent} agent proposes a change to {parent.version}")
        findings = self._findings(parent)
        trials, in_flight = self.view.trials, self.view.in_flight
        tried = {t.intervention for t in trials if t.parents[:1] == [parent.version]} | set(rejected) | \
            specialists.in_flight_from(in_flight, parent.version) | history.hacked_above(trials, parent.version)
        knobs = self._knobs(parent.version)
        closed = specialists.closed_families(specialists.claimed(in_flight, parent.version, knobs))
        # what an llm or command agent reads of the lineage; with trials in flight, also their
        # claims and the outcomes that came in while they ran
        shown = history.leaderboard(trials) + beside(in_flight,
                                              lambda p: specialists.reached(p, self._knobs(p.parent.version)))
        if self.cfg.search.concurrency > 1:
            shown += history.latest(trials)
        ctx = AgentContext(findings=findings, knobs=knobs, root_knobs=self._knobs("v0"),
                           target_level=self.task.target_level, task=self.cfg.task, tried=frozenset(tried),
                           skills=self._skills(), escalation=self._escalation(), seed=1000 * self._search_seed + n,
                           parent=parent.version, harness_dir=self._harness_dir(parent.version),
                           lineage=shown, feedback=feedback, trial=n, workdir=self.run_dir / "agents",
                           closed=closed, reference_acc=self.view.reference_acc,
                           backend=self.cfg.backend,
                           family_weights=search_policy.weights_now(self.policy, trials, self.view.plans)
                           if self.evolving else {})
        try:
            p = self.agent(ctx)
        except Exception as e:  # noqa: BLE001 (an agent's own failure is a label, never the run's end)
            p = AgentFailed(Label.AGENT_ERROR, f"{type(e).__name__}: {e}", self.cfg.agent)
        if p is None:
            return None
        return plan.of_agent(parent, f"v{n}" + (f"r{round_}" if round_ else ""), round_, p)

    def _harness_files(self, version: str) -> tuple[dict, dict[str, str]]:
        """A version's knobs and its slot files (a crossover merges them)."""
        d = self._harness_dir(version)
        return (read_yaml((d / "knobs.yaml").read_text()) or {},
                {p.name: p.read_text() for p in sorted(d.glob("*.py"))})

    @property
    def _search_seed(self) -> int:
        """What seeds the search's own draws (agents' choices, parent draws): search.seed, or the
        run's first training seed."""
        return self.cfg.seeds[0] if self.cfg.search.seed is None else self.cfg.search.seed

    def _skills(self) -> list:
        if not self.cfg.search.skills:
            return []
        lib = SkillLibrary(self.cfg.search.skills)
        try:
            return lib.skills()
        finally:
            lib.close()

    def _learn(self, done: list[tuple[TrialRecord, TrialPlan]]) -> None:
        """Finished agent trials' outcomes into the skill library, each with the plan it ran,
        under the run's id. Idempotent per run and trial, so a resume records what a kill cut
        off, once."""
        if not self.cfg.search.skills:
            return
        lib = SkillLibrary(self.cfg.search.skills)
        try:
            learn(lib, self.run_dir, self.cfg, self.task.target_level, self.view.reference_acc, done,
                  run=run_key(self.run_dir, self.store.events(RunStarted)[0]))
        finally:
            lib.close()

    def _findings(self, state: State) -> list[dict]:
        """The worst finding per diagnostic over the state's seeds, critical and blocking first
        (diagnosis.worst_findings), read once per state: as a child and again as a parent."""
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
                                                             self._harness_dir(version))

    def _knobs(self, version: str):
        return load_knobs(self._harness_dir(version) / "knobs.yaml")

    def _harness_dir(self, version: str) -> Path:
        d = self.run_dir / "harnesses" / version
        with self._lock:  # two trials in flight may ask for one parent's checkout at once
            if not d.exists():
                tmp = d.with_name(version + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                self.repo.checkout(version, tmp)
                tmp.rename(d)
        return d

    # ------------------------------------------------------------------ trials

    def _root(self) -> None:
        root = State("v0", 0, {}, {}, {})
        if 0 not in {s.trial for s in self.store.pending()}:
            self.store.begin_trial(TrialStarted(0, "root", "v0"))
        self.stage(f"trial 0: the root harness v0 trains, with {self.cfg.promotion.replicas} noise replica(s)")
        t0, clock = time.time(), Clock()
        # replicas: the root again on the same problems with other sampling seeds: the spread of
        # a paired difference when nothing changed, the null every gain is tested against
        segments = [Segment("v0", root, 1, self.run_dir / "versions" / "v0")] + [
            Segment("v0", root, 1, self.run_dir / "noise" / f"replica-{i + 1}", replica=i + 1)
            for i in range(self.cfg.promotion.replicas)]
        def read(sg: Segment, dirs: dict[int, str]) -> None:  # a replica's evidence is never read
            if sg is segments[0]:
                self.read_later(sg.version, dirs)
        state, *replicas = self.training.train(segments, clock, read=read)
        for s in (state, *replicas):
            if isinstance(s, SegmentFailed):
                raise ControlFailed(f"the root harness failed: {s}")
        noise = noise_floor(state.val, [r.val for r in replicas])
        self._finish(TrialRecord(
            id=0, version="v0", parents=[], agent="-", intervention="root", depth=1,
            hypothesis="the root harness, trained one segment from the base", success_criterion="-", patch="",
            label=Label.KEPT, fitness=dataclasses.replace(Fitness.measured(state), noise_sd=noise,
                                                     replicas=tuple(r.val for r in replicas)),
            budgets=clock.budgets(),
            findings=self._findings(state), started=t0, finished=time.time()), state)

    def _trial(self, n: int, trial_plan: TrialPlan) -> None:
        """Trial `n` on the current view (the trial's own start, recorded here, changes nothing it reads)."""
        if n not in {s.trial for s in self.store.pending()}:
            self.store.begin_trial(TrialStarted.of(n, trial_plan))
        while True:
            try:
                return Trial(self._tools(trial_plan, self.view), n, trial_plan).run()
            except approval.Revise as r:  # a person asked for another proposal: same trial, the next round
                proposed = self._propose(n, trial_plan.parent, feedback=r.feedback,
                                         rejected=trial_plan.rejected_so_far, round_=trial_plan.next_round)
                trial_plan = trial_plan.revision(proposed, r.feedback)
                self.store.begin_trial(TrialStarted.of(n, trial_plan))  # the latest start is what a resume redoes
                self._look()  # the round before may have trained a control the next one shares

    def _tools(self, trial_plan: TrialPlan, view: RunView) -> TrialTools:
        """What a trial may use of the run (evolve/tools.py), on the view it started on."""
        return TrialTools(
            cfg=self.cfg, run_dir=self.run_dir, view=view, repo=self.repo, training=self.training,
            run_backtests=self.run_backtests, harness_dir=self._harness_dir, candidate=self._candidate,
            findings=self._findings, read_later=self.read_later,
            record=self._record, ask=self._ask, finish=lambda rec, state: self._finish(rec, state, trial_plan),
            stage=self.stage, show=self.on_event, once=self.once)

    def once(self, key: tuple, make: Callable[[], object]):
        """`make()` once per key however many trials in flight ask (a control both need): the
        first trains it, the others wait for its result; an error reaches every asker."""
        with self._lock:
            fut, mine = self._once.get(key), False
            if fut is None:
                fut, mine = self._once.setdefault(key, Future()), True
        if mine:
            try:
                fut.set_result(make())
            except BaseException as e:
                fut.set_exception(e)
        return fut.result()

    def _ask(self, asked: ApprovalWaiting) -> ApprovalDecided:
        return approval.ask(self.store, self.run_dir, asked, self.on_event, self.approval_poll_s)

    def _candidate(self, parent: str, version: str, knobs: dict, files: dict, hypothesis: str) -> Candidate:
        """`version`: `parent`'s harness with `knobs` set and `files` replaced, committed and vetted
        (legal, and this run's backend can train it). PatchError where it changes nothing."""
        if version in self.repo.versions():  # a resumed trial: the child was committed before the kill
            cand = vet(self.repo, parent, version)
        else:
            text = files.get("knobs.yaml") or (self._harness_dir(parent) / "knobs.yaml").read_text()
            for key, value in knobs.items():
                text = set_knob(text, key, value)
            cand = propose_files(self.repo, parent, {**files, "knobs.yaml": text}, version, hypothesis)
        if not cand.legal:
            return cand
        try:  # legal, but this run's backend must be able to train it as written
            check_backend(self.runtime, inspect_harness(self._harness_dir(version)), version)
        except UsageError as e:
            return dataclasses.replace(cand, label="illegal", reasons=[str(e)])
        return cand

    def _finish(self, rec: TrialRecord, state: State | None = None, trial_plan: TrialPlan | None = None) -> None:
        with self._lock:  # trials in flight finish one at a time: the store, skills and trackers in order
            self._finish_one(rec, state, trial_plan)

    def _finish_one(self, rec: TrialRecord, state: State | None, trial_plan: TrialPlan | None) -> None:
        if state is not None:  # nothing in the run reads the store: it fills while the next trial starts
            self.training.ingest_later(rec.version, state)
        self.store.finish_trial(rec)
        if rec.parents and trial_plan is not None:
            self._learn([(rec, trial_plan)])
        self.on_event(rec)
        self._track(rec)

    def _track(self, rec: TrialRecord) -> None:
        """A finished trial to the run's trackers: its training jobs' steps, its outcome."""
        if not self.trackers.trackers:
            return
        for seed, d in sorted(rec.fitness.dirs.items()):
            self.trackers.steps(f"{rec.version}/seed-{seed}", seed_metrics(Path(d)))
        trials = sorted([t for t in self.view.trials if t.id != rec.id] + [rec], key=lambda t: t.id)
        self.trackers.trial(trial_row(rec), [trial_row(t) for t in trials])

    def _tracker_failed(self, name: str, why: str) -> None:
        self._record(TrackerFailed(name, why))

    @property
    def restart(self) -> bool:
        return self.cfg.search.restarts

    def _progress(self, p: Progress) -> None:
        """Training steps as they go: shown (`training_progress`), never stored in the lineage."""
        self.on_event(p)

    def stage(self, text: str) -> None:
        """What the run does now (shown live, never stored: the lineage records outcomes)."""
        self.on_event(Stage(text))

    def _record(self, ev: Event) -> None:
        """An event into the lineage, and shown (`store.append` records one without showing it)."""
        self.store.append(ev)
        self.on_event(ev)

