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
into a view (evolve/search/view.py) that the search's decisions and the trial itself work from;
a trial is given that view and the few services it needs (evolve/tools.py).

The controller schedules; three parts do the rest, each one job: the Proposer decides what
the next trial does (evolve/proposer.py), the Recorder writes and shows what happened
(evolve/recorder.py), and Harnesses keeps the versions on disk (evolve/harnesses.py).

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
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable

from evotrainer.agents import make_agent
from evotrainer.catalog import get_task
from evotrainer.config import RunConfig
from evotrainer.evolve import approval, setup
from evotrainer.evolve.final_run import run_final, winner_schedule
from evotrainer.evolve.harnesses import Harnesses
from evotrainer.evolve.notices import OnEvent
from evotrainer.evolve.proposer import AGAIN, STOP, WAIT, Agent, Proposer
from evotrainer.evolve.recorder import Recorder
from evotrainer.evolve.search.plans import TrialPlan
from evotrainer.evolve.search.view import RunView
from evotrainer.evolve.segments.cache import SegmentCache
from evotrainer.evolve.segments.state import Clock, ControlFailed, Segment, SegmentFailed, State
from evotrainer.evolve.segments.training import Training
from evotrainer.evolve.stats.paired import noise_floor
from evotrainer.evolve.status import controller_seconds
from evotrainer.evolve.tools import TrialTools
from evotrainer.evolve.trial import Trial
from evotrainer.executors import use_isolation
from evotrainer.harness import REFERENCE, inspect_harness
from evotrainer.labels import Label
from evotrainer.lineage import Fitness, TrialRecord
from evotrainer.lineage.events import (
    ApprovalDecided,
    ApprovalWaiting,
    FinalFinished,
    RunFinished,
    RunStarted,
    SessionStarted,
    Stopped,
    TrialResumed,
    TrialStarted,
    new_run_id,
)
from evotrainer.policy.model import resolve_model
from evotrainer.sandbox import describe
from evotrainer.sandbox import record as sandbox_record
from evotrainer.trainer.backends import check_backend


class Controller:
    def __init__(self, cfg: RunConfig, run_dir: Path | str, on_event: OnEvent | None = None, *,
                 agent: Agent | None = None, run_backtests: bool = True, approval_poll_s: float = 1.0,
                 backend: type[Training] = Training):
        """`agent(context)` proposes (default: the config's agent); `run_backtests=False` lets a
        test show that the gate alone still stops what a backtest would have caught;
        `approval_poll_s` is how often a run paused at a person's approval looks for the decision;
        `backend` trains and reads segments (the search simulator's draws them from a table)."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.agent, self.run_backtests = agent or make_agent(cfg), run_backtests
        self.backend = backend
        self.approval_poll_s = approval_poll_s
        self.task = get_task(cfg.task, cfg.level)
        self.runtime = cfg.runtime().validate(here=cfg.executor == "local")
        # a user's model: a local directory every worker loads (checked now: bad input stops here)
        self.model = resolve_model(cfg.model) if cfg.model else None
        check_backend(self.runtime, inspect_harness(cfg.harness or REFERENCE), "the root harness", self.task)
        self.jobs = cfg.job_executor()  # where every training and evaluation job runs: reached now (a
        self.jobs.start()               # Ray cluster that cannot be reached stops the run before it starts)
        # continue mode: segments to the reference's total steps; restart mode: every state is whole
        self.max_depth = 1 if cfg.search.restarts else cfg.budget.total_steps // cfg.budget.steps_per_segment
        self.recorder = Recorder(cfg, self.run_dir, on_event, level=self.task.target_level)
        self.store = self.recorder.store
        self.base: str | None = None
        # set up with the base (`setup`)
        self.harnesses: Harnesses | None = None
        self.training: Training | None = None
        self.proposer: Proposer | None = None
        # trials in flight (search.concurrency > 1) share these
        self._once: dict[tuple, Future] = {}    # controls two trials in flight both need: trained once
        self._once_lock = threading.Lock()
        self._cancel = threading.Event()        # set: trials in flight stop their workers (a kill, an error)

    @property
    def view(self) -> RunView:
        """The lineage as the current trial began."""
        return self.recorder.view

    def look(self) -> RunView:
        return self.recorder.look()

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        # every worker this process starts runs in the sandbox at this level (said in status and reports)
        self.isolation = use_isolation(self.cfg.sandbox)
        t_end = self.wall_clock_end()  # before this session's first event
        # status adds up sessions and reads the sandbox here
        self.store.append(SessionStarted(sandbox_record(self.isolation)))
        self._cancel.clear()  # a run() again on this controller (a resume in-process) starts uncancelled
        self._once.clear()    # and trains again what a cancelled control left unfinished
        self.setup()
        view = self.look()
        # what a kill cut off between a trial's row and its skill outcome
        self.recorder.learn(view.planned)
        self.training.ingest_missing(view.trials)  # a resume: what a kill cut off before it was stored
        self.recorder.open_trackers()
        try:
            resumed = []
            for started in self.store.pending():  # resume: redo what a kill cut off, same number
                self.recorder.record(TrialResumed(started.trial, started.intervention))
                if started.trial > 0 and self.cfg.search.concurrency > 1:
                    resumed.append(started)  # beside the new ones
                elif started.trial > 0:
                    self.look()
                    self._trial(started.trial, started.plan)
            if not self.store.finished(0):
                self.look()
                self._root()
            if self.cfg.search.concurrency > 1:
                self._search_parallel(t_end, resumed)
            else:
                self._search(t_end)
            self.final()  # reads no evidence: the last trial's is stored beside it
        finally:
            self.recorder.close()
            self.training.join_ingest()
            self.proposer.close()

    def wall_clock_end(self) -> float:
        """When the wall-clock budget runs out: it is the run's, over all its sessions, so a
        resume gets what is left (the time between a kill and a resume is not ours, as status
        counts it)."""
        return time.time() + self.cfg.budget.wall_clock_s - controller_seconds(self.store.log())

    def _search(self, t_end: float) -> None:
        while (view := self.look()).spent < self.cfg.budget.trials:
            trial_plan = self.proposer.next(view, t_end)
            if trial_plan == STOP:
                return
            if trial_plan not in (WAIT, AGAIN):
                self._trial(view.next_trial, trial_plan)
        self.recorder.record(RunFinished(len(view.trials)))

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
                                   self.look().as_started(started.trial))] = started.trial
            while True:
                view = self.look()
                if not stopped and len(flight) < most and view.spent + len(flight) < self.cfg.budget.trials:
                    trial_plan = self.proposer.next(view, t_end)
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
                        self.recorder.record(Stopped("no state has segments or untried interventions left"))
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
            self.recorder.record(RunFinished(len(self.look().trials)))

    def _run_trial(self, n: int, trial_plan: TrialPlan, view: RunView) -> None:
        """Trial `n` in a thread of its own, on the view it was proposed on."""
        Trial(self._tools(trial_plan, view), n, trial_plan).run()

    # ------------------------------------------------------------------ the final comparison

    def final(self) -> FinalFinished | None:
        """The final comparison (evolve/final_run.py), recorded as `final_finished`. Done once."""
        done = self.look().final
        if done or not self.cfg.final_seeds:
            return done
        result = run_final(self.view, self.training, self.max_depth, self.recorder.record, describe(self.isolation))
        self.recorder.final(result)
        return result

    def winner_schedule(self):
        """The winner ("vN@D"), its harness schedule as versions, and as an arm to retrain
        (final_run.winner_schedule on the lineage as it is now): what the benchmarks replay."""
        return winner_schedule(self.look(), self.training, self.max_depth)

    def setup(self) -> None:
        """The run's config copy, harness repository, base and split key (evolve/setup.py), and
        the parts that work from them. What a run does first; a bench that replays states
        without a search calls it alone."""
        setup.save_config(self.run_dir, self.cfg)
        repo = setup.open_repo(self.run_dir, self.cfg.harness or REFERENCE)
        started = self.store.events(RunStarted)
        if not started:
            first = setup.first_start(self.cfg, self.task, self.runtime, model=self.model, max_depth=self.max_depth,
                                      on_event=self.recorder.show)
            self.recorder.record(dataclasses.replace(first, run_id=new_run_id()))  # this run's, whatever its directory
            started = self.store.events(RunStarted)
        self.base = started[0].base
        self.runtime = self.runtime.on_base(self.base)  # a LoRA run's adapters sit on its base
        setup.use_key(self.task, started[0])
        self.harnesses = Harnesses(repo, self.run_dir, self.runtime)
        cache = self.cfg.cache_dir(self.run_dir)
        self.training = self.backend(cfg=self.cfg, task=self.task, runtime=self.runtime, base=self.base,
                                     run_dir=self.run_dir, harness_dir=self.harnesses.dir,
                                     on_progress=self.recorder.show, on_stage=self.recorder.stage,
                                     executor=self.jobs, cache=SegmentCache(cache) if cache else None,
                                     cancel=self._cancel)
        self.proposer = Proposer(self.cfg, self.task, self.agent, recorder=self.recorder, harnesses=self.harnesses,
                                 training=self.training, max_depth=self.max_depth)
        if self.proposer.evolving:  # the policy files, from the lineage (a kill may have cut off the last one)
            self.proposer.write_policy(RunView.read(self.store).revisions)

    # ------------------------------------------------------------------ trials

    def _root(self) -> None:
        root = State("v0", 0, {}, {}, {})
        if 0 not in {s.trial for s in self.store.pending()}:
            self.store.begin_trial(TrialStarted(0, "root", "v0"))
        self.recorder.stage(f"trial 0: the root harness v0 trains, with {self.cfg.promotion.replicas} noise replica(s)")
        t0, clock = time.time(), Clock()
        # replicas: the root again on the same problems with other sampling seeds: the spread of
        # a paired difference when nothing changed, the null every gain is tested against
        segments = [Segment("v0", root, 1, self.run_dir / "versions" / "v0")] + [
            Segment("v0", root, 1, self.run_dir / "noise" / f"replica-{i + 1}", replica=i + 1)
            for i in range(self.cfg.promotion.replicas)]
        def read(sg: Segment, dirs: dict[int, str]) -> None:  # a replica's evidence is never read
            if sg is segments[0]:
                self.proposer.read_later(sg.version, dirs)
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
            findings=self.proposer.findings(state), started=t0, finished=time.time()), state)

    def _trial(self, n: int, trial_plan: TrialPlan) -> None:
        """Trial `n` on the current view (the trial's own start, recorded here, changes nothing it reads)."""
        if n not in {s.trial for s in self.store.pending()}:
            self.store.begin_trial(TrialStarted.of(n, trial_plan))
        while True:
            try:
                return Trial(self._tools(trial_plan, self.view), n, trial_plan).run()
            except approval.Revise as r:  # a person asked for another proposal: same trial, the next round
                proposed = self.proposer.propose(n, trial_plan.parent, feedback=r.feedback,
                                                 rejected=trial_plan.rejected_so_far, round_=trial_plan.next_round)
                trial_plan = trial_plan.revision(proposed, r.feedback)
                self.store.begin_trial(TrialStarted.of(n, trial_plan))  # the latest start is what a resume redoes
                self.look()  # the round before may have trained a control the next one shares

    def _tools(self, trial_plan: TrialPlan, view: RunView) -> TrialTools:
        """What a trial may use of the run (evolve/tools.py), on the view it started on."""
        return TrialTools(
            cfg=self.cfg, run_dir=self.run_dir, view=view, repo=self.harnesses.repo, training=self.training,
            run_backtests=self.run_backtests, harness_dir=self.harnesses.dir, candidate=self.harnesses.candidate,
            findings=self.proposer.findings, read_later=self.proposer.read_later,
            record=self.recorder.record, ask=self._ask, finish=lambda rec, state: self._finish(rec, state, trial_plan),
            stage=self.recorder.stage, show=self.recorder.show, once=self.once)

    def once(self, key: tuple, make: Callable[[], object]):
        """`make()` once per key however many trials in flight ask (a control both need): the
        first trains it, the others wait for its result; an error reaches every asker."""
        with self._once_lock:
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
        return approval.ask(self.store, self.run_dir, asked, self.recorder.show, self.approval_poll_s)

    def _finish(self, rec: TrialRecord, state: State | None = None, trial_plan: TrialPlan | None = None) -> None:
        """A finished trial: its state's evidence to the evidence store (in a thread: nothing in
        the run reads it, so it fills while the next trial starts), then recorded."""
        with self.recorder.lock:  # one at a time, the evidence in the order the rows go
            if state is not None:
                self.training.ingest_later(rec.version, state)
            self.recorder.finish(rec, trial_plan)
