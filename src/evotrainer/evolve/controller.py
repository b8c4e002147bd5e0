"""The controller: the evolution loop (docs/concepts.md).

A *state* (evolve/state.py) is a harness version at a lineage depth with one checkpoint per
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
(evolve/plan.py), and finished work is never repeated.

Run directory: config.yaml, lineage.sqlite, evidence.sqlite, harness-repo/ (git, one
tag per version), harnesses/vN (checkouts), versions/vN/seed-S and controls/vN-dD/seed-S
(train directories).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import yaml

from evotrainer.agents import AgentContext, AgentFailed, Escalation, Proposal, make_agent, set_knob
from evotrainer.config import RunConfig
from evotrainer.errors import UsageError
from evotrainer.evolve import approval, history, plan
from evotrainer.evolve.diagnosis import misleads, worst_findings
from evotrainer.evolve.final import compare, extend, schedule, table, winner
from evotrainer.evolve.plan import TrialPlan
from evotrainer.evolve.population import Elite, SelectionConfig, crossover_due, mates, merge, promote, select_parent
from evotrainer.evolve.progress import Progress, seed_metrics
from evotrainer.evolve.replay import Arm, ReplayFailed, replay
from evotrainer.evolve.state import Clock, ControlFailed, Segment, SegmentFailed, State
from evotrainer.evolve.stats import noise_floor
from evotrainer.evolve.training import Training
from evotrainer.evolve.trial import Trial
from evotrainer.executors import Warm, use_isolation
from evotrainer.harness import REFERENCE, inspect_harness
from evotrainer.harness.candidate import Candidate, propose_files, vet
from evotrainer.harness.knobs import load_knobs
from evotrainer.harness.versions import HarnessRepo
from evotrainer.inner.backends import check_backend
from evotrainer.labels import AGENT_FAILED, Label
from evotrainer.lineage import LineageStore, TrialRecord
from evotrainer.policy.model import resolve_model
from evotrainer.sandbox import conceal, describe
from evotrainer.sandbox import record as sandbox_record
from evotrainer.skills import SkillLibrary
from evotrainer.catalog import get_task
from evotrainer.tasks.keys import key_digest, key_dir, split_key
from evotrainer.trackers import TrackerSet, open_trackers, trial_row

AGENT_ERRORS_TO_STOP = 3  # agent_error trials in a row (a wrong URL, key or model): stop, do not spend the budget


class Controller:
    def __init__(self, cfg: RunConfig, run_dir: Path | str, on_event: Callable[[str, dict], None] | None = None,
                 agent: Callable[[AgentContext], Proposal | AgentFailed | None] | None = None,
                 run_backtests: bool = True, gate_poll_s: float = 1.0):
        """`agent(context)` proposes (default: the config's agent); `run_backtests=False` lets a
        test show that the gate alone still stops what a backtest would have caught;
        `gate_poll_s` is how often a run paused at a human gate looks for the decision."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.agent, self.run_backtests = agent or make_agent(cfg), run_backtests
        self.gate_poll_s = gate_poll_s
        self.selection = SelectionConfig(capacity=cfg.search.population)
        self.task = get_task(cfg.task, cfg.level)
        self.runtime = cfg.runtime().validate(here=cfg.executor == "local")
        # a user's model: a local directory every worker loads (checked now: bad input stops here)
        self.model = resolve_model(cfg.model) if cfg.model else None
        check_backend(self.runtime, inspect_harness(cfg.harness or REFERENCE), "the root harness", self.task)
        self.jobs = cfg.job_executor()  # where every training and evaluation job runs: reached now (a
        self.jobs.start()               # Ray cluster that cannot be reached stops the run before it starts)
        # continue mode: segments to the reference's total steps; restart mode: every state is whole
        self.max_depth = 1 if cfg.policy == "restart" else cfg.budget.total_steps // cfg.budget.steps_per_segment
        self.on_event = on_event or (lambda kind, data: None)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.store = LineageStore(self.run_dir / "lineage.sqlite")
        self.repo: HarnessRepo | None = None
        self.base: str | None = None
        self.training: Training | None = None   # set up with the base (`_setup`)
        self._findings_of: dict[tuple, Future] = {}  # a state is diagnosed once, as child and as parent
        self._reader: ThreadPoolExecutor | None = None  # read_later's thread, while a run is under way
        self._warm: Warm | None = None  # the next backtest's worker, started early (prewarm)
        self.trackers: TrackerSet = TrackerSet([], self._tracker_failed)  # opened by `run`

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        # every worker this process starts runs in the sandbox at this level (said in status and reports)
        self.isolation = use_isolation(self.cfg.sandbox)
        # status adds up sessions (time between a kill and a resume is not ours) and reads the sandbox here
        self.store.event("session_started", sandbox=sandbox_record(self.isolation))
        self._setup()
        self._learn()  # what a kill cut off between a trial's row and its skill outcome
        self.training.ingest_missing(self.store.trials())  # a resume: what a kill cut off before it was stored
        t_end = time.time() + self.cfg.budget.wall_clock_s
        # opened where the `finally` below closes them (a W&B run left open is a run never finished)
        self.trackers = open_trackers(self.cfg.tracking, self.run_dir, self.run_dir.name, self._tracker_failed)
        try:
            for n, started in self.store.pending():  # resume: redo what a kill cut off, same number
                self._event("trial_resumed", n, intervention=started.get("intervention"))
                if n > 0:
                    self._trial(n, TrialPlan.from_json(started))
            if not self.store.finished(0):
                self._root()
            self._search(t_end)
            self._close_warm()
            self.final()  # reads no evidence: the last trial's is stored beside it
        finally:
            self._close_warm()
            self.trackers.close()
            self.training.join_ingest()
            if self._reader is not None:
                self._reader.shutdown()
                self._reader = None

    def _close_warm(self) -> None:
        """A warm worker no backtest took (the budget ran out, or the run stopped)."""
        warm = self.take_warm()
        if warm is not None:
            warm.close()

    def _search(self, t_end: float) -> None:
        while history.spent(self.store.trials()) < self.cfg.budget.trials:
            n = self.store.next_trial()
            if time.time() > t_end:
                self._event("stopped", reason="wall-clock budget spent")
                return
            parent = self._select_parent(n)
            if parent is None:
                self._event("stopped", reason="no state has segments or untried interventions left")
                return
            broken = history.agent_errors_in_a_row(self.store.trials())
            if len(broken) >= AGENT_ERRORS_TO_STOP:
                self._event("stopped", reason=f"the agent failed {len(broken)} times in a row: {broken[-1].reflection}")
                return
            trial_plan = self._crossover(n, parent) or self._propose(n, parent)
            if trial_plan is None:
                self.store.event("parent_exhausted", version=parent.version, depth=parent.depth)
                continue
            self._trial(n, trial_plan)
        self._event("run_finished", trials=len(self.store.trials()))

    # ------------------------------------------------------------------ the final comparison

    def final(self) -> dict | None:
        """Replay the winner's harness schedule from the base with `final_seeds`, beside the
        root harness (the reference recipe) trained the same total steps with the same seeds;
        written to final.json and final.md and recorded as `final_finished`. Done once."""
        done = self.store.events("final_finished")
        if done or not self.cfg.final_seeds:
            return done[-1] if done else None
        label, harnesses, arm = self.winner_schedule()
        self._event("final_started", winner=label, schedule=harnesses, seeds=list(self.cfg.final_seeds))
        self.stage(f"final comparison: {label} and the reference train from the base on seeds "
                   f"{list(self.cfg.final_seeds)}, then the evaluator scores them")
        arms = {"reference": Arm((str(self._harness_dir("v0")),), self.cfg.budget.total_steps), "evolved": arm}
        try:
            rep = replay(self.task, self.base, arms, self.cfg.final_seeds,
                         self.run_dir / "final", self.cfg.evaluation, self.cfg.budget.trial_timeout_s,
                         self.cfg.workers, self.runtime, self.cfg.worker_memory_mb, self._progress,
                         self.training.jobs)  # the executor every training and evaluation job runs on
        except ReplayFailed as e:
            raise ControlFailed(f"the final comparison: {e}") from None
        result = {"winner": label, "schedule": harnesses, "seeds": list(self.cfg.final_seeds),
                  "total_steps": self.cfg.budget.total_steps, "base": rep.base,
                  "comparison": compare(rep.scores["reference"], rep.scores["evolved"]),
                  "budgets": Clock(rep.train_s, rep.eval_s).budgets()}
        result["table"] = table(result["base"], result["comparison"], self.cfg.final_seeds)
        (self.run_dir / "final.json").write_text(json.dumps(result, indent=2))
        (self.run_dir / "final.md").write_text(f"# Final comparison\n\nwinner {result['winner']}, schedule "
                                               f"{' -> '.join(harnesses)}\n\n```\n{result['table']}\n```\n\n"
                                               f"sandbox: {describe(self.isolation)}\n")
        self._event("final_finished", **result)
        for arm in arms:
            for d in sorted((self.run_dir / "final" / arm).glob("seed-*")):
                self.trackers.steps(f"final/{arm}/{d.name}", seed_metrics(d))
        self.trackers.final(result, result["table"])
        return result

    def winner_schedule(self) -> tuple[str, list[str], Arm]:
        """The winner ("vN@D"), its harness schedule as versions, and as an arm to replay: in
        continue mode the harness at each depth along its lineage, continued with its own
        harness to the full budget; in restart mode its one harness for the whole budget."""
        win = winner(self._states())
        if self.restart:
            harnesses, steps = [win.version], self.cfg.budget.total_steps
        else:
            harnesses = extend(schedule(self.store.trials(), win.version, win.depth), self.max_depth)
            steps = self.cfg.budget.steps_per_segment
        return f"{win.version}@{win.depth}", harnesses, Arm(tuple(str(self._harness_dir(v)) for v in harnesses), steps)

    def _setup(self) -> None:
        cfg_file = self.run_dir / "config.yaml"
        if not cfg_file.exists():  # written aside and renamed: resume always finds a whole config
            tmp = cfg_file.with_suffix(".yaml.tmp")
            tmp.write_text(yaml.safe_dump(_plain(dataclasses.asdict(self.cfg)), sort_keys=False))
            tmp.rename(cfg_file)
        repo_dir = self.run_dir / "harness-repo"
        if not repo_dir.exists():  # built aside and renamed: a kill never leaves half a repo
            tmp = self.run_dir / "harness-repo.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            HarnessRepo.init(tmp, self.cfg.harness or REFERENCE)
            tmp.rename(repo_dir)
        self.repo = HarnessRepo(repo_dir)
        started = self.store.events("run_started")
        if not started:
            t = time.time()
            base = self._base_checkpoint()
            pol = self.runtime.policy
            device = f"{pol.resolved_device()}, {str(pol.compute_dtype()).removeprefix('torch.')}" \
                if self.cfg.executor == "local" else f"device {pol.device}, dtype {pol.dtype}, on the Ray cluster's nodes"
            self._event("run_started", base=base, base_s=round(time.time() - t, 2), max_depth=self.max_depth,
                        task=self.task.spec, runtime=self.runtime.to_dict(), split_key=self._key_name(base),
                        split_key_digest=key_digest(self.task.key), device=device, executor=self.cfg.executor)
            started = self.store.events("run_started")
        self.base = started[0]["base"]
        self._use_key(started[0])
        self.training = Training(self.cfg, self.task, self.runtime, self.base, self.run_dir, self._harness_dir,
                                 self._progress, self.stage, self.jobs)

    def _key_name(self, base: str) -> str:
        """Whose split key this run uses: a built base's (pretrain keyed the task already), or
        the user's model's with this task."""
        return Path(base).name if self.model is None else f"model:{base}|{self.task.name}/{self.task.target_level}"

    def _use_key(self, started: dict) -> None:
        """Key the task's held-out pool (the same key on a resume, or the run stops: new
        validation and test problems mid-run would void every comparison), and hide the
        keys and the task's data files from every job."""
        if "split_key" not in started:  # a run from before split keys: its public split goes on
            return
        self.task.use_key(split_key(started["split_key"]))
        if key_digest(self.task.key) != started["split_key_digest"]:
            raise UsageError(f"this run's split key ({key_dir()}) is gone: resuming would change its validation "
                             f"and test problems; restore the key file or start a new run")
        conceal(key_dir(), *self.task.data_files())

    def _base_checkpoint(self) -> str:
        if self.model:  # absolute: a resume may start from another directory
            self.task.use_key(split_key(self._key_name(self.model)))
            return self.model
        from evotrainer.pretrain import pretrain
        b = self.cfg.base
        path, _ = pretrain(self.task, b.pretrain_config(), require_target=b.require_target,
                           progress=lambda step, loss, acc: self.on_event(
                               "base_progress", {"step": step, "loss": loss, "probe_acc": acc}))
        return str(path)

    # ------------------------------------------------------------------ states and proposals

    def _states(self) -> list[State]:
        out = [State.of(t.fitness["state"]) for t in self.store.trials() if t.label == Label.KEPT]
        out += [State.of(e["state"]) for e in self.store.events("control_finished")]
        return out

    def _open_states(self) -> list[State]:
        """States that can still be a parent: segments left (continue mode) and not exhausted."""
        exhausted = {(e["version"], e["depth"]) for e in self.store.events("parent_exhausted")}
        return [s for s in self._states()  # restart mode: a state is whole, any may be a parent
                if (self.restart or s.depth < self.max_depth) and (s.version, s.depth) not in exhausted]

    def _select_parent(self, n: int) -> State | None:
        """greedy: the best open state (keep-or-revert on one path). population: after three
        failures in a row the last kept version (roll back), else the elite with the best
        parent score (population.select_parent), else the best open state."""
        open_ = self._open_states()
        best = max(open_, key=lambda s: (s.mean_val, s.depth, s.version), default=None)
        if best is None or self.cfg.search.selection == "greedy":
            return best
        by_key = {(s.version, s.depth): s for s in open_}
        if self._escalation() is not None:
            kept = [t for t in self.store.trials() if t.label == Label.KEPT]
            back = [s for s in open_ if kept and s.version == kept[-1].version]
            if back:
                return max(back, key=lambda s: s.depth)
        elites = [e for e in self._population() if e.key in by_key]
        trials = self.store.trials()
        plans = self._starts()
        recent = [e.changes for e in self._elites([plans[t.id].parent
                                                   for t in trials[-self.selection.recent:] if t.id in plans])]
        pick = select_parent(elites, history.children(trials, plans), n, self.selection, recent)
        return by_key[pick.key] if pick else best

    def _population(self) -> list[Elite]:
        """The elites, rebuilt from the lineage in the order states were recorded (so a resumed
        controller has the same population): kept children and controls ask to join in turn."""
        kept = {t.id: t for t in self.store.trials() if t.label == Label.KEPT}
        states = []
        for e in self.store.events():
            if e["kind"] == "control_finished":
                states.append(State.of(e["state"]))
            elif e["kind"] == "trial_finished" and e["trial"] in kept:
                states.append(State.of(kept[e["trial"]].fitness["state"]))
        pop: list[Elite] = []
        for elite in self._elites(states):
            pop, _ = promote(pop, elite, self.selection)
        return pop

    def _elites(self, states: list[State]) -> list[Elite]:
        """States as selection sees them, from one read of the lineage."""
        trials = self.store.trials()
        families = {n: p.family for n, p in self._starts().items()}
        changes, surfaces = history.changes(trials), history.surfaces(trials, families)
        return [Elite(s.version, s.depth, s.mean_val, changes.get(s.version, frozenset()),
                      surfaces.get(s.version, "root")) for s in states]

    def _elite_of(self, state: State) -> Elite:
        return self._elites([state])[0]

    def _starts(self) -> dict[int, TrialPlan]:
        """Trial number -> the plan it (last) started with (every trial but the root's)."""
        return {e["trial"]: TrialPlan.from_json(e) for e in self.store.events("trial_started") if "parent_state" in e}

    def _escalation(self) -> Escalation | None:
        """Three failures in a row (EvoTrainer): leave their layers, subtract first, roll back,
        and check the diagnostics that prompted them (replayed over this run's versions; one
        that does not separate failed versions from kept ones is ignored). Decided once per
        streak and recorded, so a resume reuses it."""
        if not self.cfg.search.escalation:
            return None
        streak = history.failures_in_a_row(self.store.trials())
        if len(streak) < 3:
            return None
        last = streak[-1].id
        done = [e for e in self.store.events("escalated") if e["after"] == last]
        if not done:
            plans = self._starts()
            triggers = {(plans[t.id].trigger or "none").split(":")[0] for t in streak if t.id in plans}
            ignore = sorted(d for d in triggers - {"none"} if misleads(self.store, d, self.cfg.budget.trial_timeout_s))
            families = {n: p.family for n, p in plans.items()}
            avoid = sorted({history.family(t.intervention, families.get(t.id)) for t in streak})
            self._event("escalated", after=last, avoid=avoid, ignore=ignore)
            done = self.store.events("escalated")[-1:]
        e = done[0]
        return Escalation(avoid=frozenset(e["avoid"]), ignore=frozenset(e["ignore"]))

    def _propose(self, n: int, parent: State, feedback: str = "", rejected: tuple[str, ...] = (),
                 round_: int = 0) -> TrialPlan | None:
        """The agent's plan for trial `n` from `parent` (round > 0: a revision a person asked
        for at a gate, with their feedback, the rejected interventions counted as tried)."""
        self.stage(f"trial {n}: the {self.cfg.agent} agent proposes a change to {parent.version}")
        findings = self._findings(parent)
        trials = self.store.trials()
        tried = {t.intervention for t in trials if t.parents[:1] == [parent.version]} | set(rejected)
        ctx = AgentContext(findings=findings, knobs=self._knobs(parent.version), root_knobs=self._knobs("v0"),
                           target_level=self.task.target_level, task=self.cfg.task, tried=frozenset(tried),
                           skills=self._skills(), escalation=self._escalation(), seed=1000 * self.cfg.seeds[0] + n,
                           parent=parent.version, harness_dir=self._harness_dir(parent.version),
                           lineage=history.view(trials), feedback=feedback, trial=n, workdir=self.run_dir / "agents")
        try:
            p = self.agent(ctx)
        except Exception as e:  # noqa: BLE001 (an agent's own failure is a label, never the run's end)
            p = AgentFailed(Label.AGENT_ERROR, f"{type(e).__name__}: {e}", self.cfg.agent)
        if p is None:
            return None
        return plan.of_agent(parent, f"v{n}" + (f"r{round_}" if round_ else ""), round_, p)

    def _crossover(self, n: int, parent: State) -> TrialPlan | None:
        """A crossover plan when one is due (population.crossover_due): the parent's harness
        merged with an elite's that carries changes the parent lacks, against their common
        ancestor. A pair whose changes conflict is recorded and skipped, never guessed."""
        if self.cfg.search.selection != "population" or not self.cfg.search.crossover:
            return None
        trials = self.store.trials()
        if not crossover_due(history.operations(trials)):
            return None
        crossed = {(p.parent.version, p.mate.version) for p in self._starts().values() if p.mate}
        first = self._elite_of(parent)
        for mate in mates(self._population(), first):
            if (parent.version, mate.version) in crossed:
                continue
            base = history.common_ancestor(trials, parent.version, mate.version)
            m = merge(*(self._knob_dict(v) for v in (base, parent.version, mate.version)),
                      *(self._slot_files(v) for v in (base, parent.version, mate.version)))
            if m.conflicts:
                self.store.event("crossover_conflict", parents=[parent.version, mate.version],
                                 conflicts=list(m.conflicts))
                continue
            mate_state = next(s for s in self._states() if s.key == mate.key)
            return plan.of_crossover(parent, mate_state, f"v{n}", first.changes, mate.changes, m.knobs, m.files)
        return None

    def _knob_dict(self, version: str) -> dict:
        return yaml.safe_load((self._harness_dir(version) / "knobs.yaml").read_text()) or {}

    def _slot_files(self, version: str) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(self._harness_dir(version).glob("*.py"))}

    def _skills(self) -> list:
        if not self.cfg.search.skills:
            return []
        lib = SkillLibrary(self.cfg.search.skills)
        try:
            return lib.skills()
        finally:
            lib.close()

    def _learn(self, trial: int | None = None) -> None:
        """Finished agent trials' outcomes into the skill library: `trial` alone, or every one
        (at start-up). Idempotent per run and trial, so a resume records what a kill cut off, once."""
        if not self.cfg.search.skills:
            return
        plans, lib = self._starts(), SkillLibrary(self.cfg.search.skills)
        try:
            for t in self.store.trials():
                p = plans.get(t.id)
                if (trial is not None and t.id != trial) or not t.parents or p is None \
                        or t.intervention == history.CROSSOVER \
                        or t.label in AGENT_FAILED | {Label.EQUIVALENT, Label.ABORTED}:
                    continue
                lib.record(run=str(self.run_dir.resolve()), trial=t.id, task=self.cfg.task,
                           trigger=p.trigger or "none", intervention=t.intervention,
                           family=history.family(t.intervention, p.family), patch=p.knobs or {},
                           expected=t.hypothesis, label=t.label, gain=t.fitness.get("gain"))
        finally:
            lib.close()

    def prewarm(self) -> None:
        """Start the next backtest's worker now, where a trial will still follow: its Python and
        torch start-up (~1.5 s) then runs beside the controller's scoring and bookkeeping of
        this trial, on a core that would be idle, instead of before the next trial's backtest."""
        if self.run_backtests and self._warm is None \
                and history.spent(self.store.trials()) + 1 < self.cfg.budget.trials:
            self._warm = Warm(reads=(str(self.run_dir.resolve()),))  # its backtest reads evidence and harnesses there

    def take_warm(self) -> Warm | None:
        warm, self._warm = self._warm, None
        return warm

    def _findings(self, state: State) -> list[dict]:
        """The worst finding per diagnostic over the state's seeds, critical and blocking first
        (diagnosis.worst_findings), read once per state: as a child and again as a parent."""
        self.read_later(state.version, state.dirs)
        return self._findings_of[(state.version, *sorted(state.dirs.items()))].result()

    def read_later(self, version: str, dirs: dict[int, str]) -> None:
        """Start reading a state's findings in a thread (Training.train's `read`: while its
        checkpoints are scored, ~1 s per state off the controller's own time); once per state."""
        key = (version, *sorted(dirs.items()))
        if key not in self._findings_of:  # the state's own harness reads it (a new diagnostic included)
            self._reader = self._reader or ThreadPoolExecutor(1, thread_name_prefix="findings")
            self._findings_of[key] = self._reader.submit(worst_findings, list(dirs.values()),
                                                         self._harness_dir(version))

    def _knobs(self, version: str):
        return load_knobs(self._harness_dir(version) / "knobs.yaml")

    def _harness_dir(self, version: str) -> Path:
        d = self.run_dir / "harnesses" / version
        if not d.exists():
            tmp = d.with_name(version + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            self.repo.checkout(version, tmp)
            tmp.rename(d)
        return d

    # ------------------------------------------------------------------ trials

    def _root(self) -> None:
        root = State("v0", 0, {}, {}, {})
        if 0 not in dict(self.store.pending()):
            self.store.begin_trial(0, intervention="root", version="v0")
        self.stage(f"trial 0: the root harness v0 trains, with {self.cfg.gate.replicas} noise replica(s)")
        t0, clock = time.time(), Clock()
        # replicas: the root again on the same problems with other sampling seeds: the spread of
        # a paired difference when nothing changed, the null every gain is tested against
        segments = [Segment("v0", root, 1, self.run_dir / "versions" / "v0")] + [
            Segment("v0", root, 1, self.run_dir / "noise" / f"replica-{i + 1}", replica=i + 1)
            for i in range(self.cfg.gate.replicas)]
        def read(sg: Segment, dirs: dict[int, str]) -> None:  # a replica's evidence is never read
            if sg is segments[0]:
                self.read_later(sg.version, dirs)
                self.prewarm()  # the first trial's backtest worker starts up while the root is scored
        state, *replicas = self.training.train(segments, clock, read=read)
        for s in (state, *replicas):
            if isinstance(s, SegmentFailed):
                raise ControlFailed(f"the root harness failed: {s}")
        self.prewarm()
        noise = noise_floor(state.val, [r.val for r in replicas])
        self._finish(TrialRecord(
            id=0, version="v0", parents=[], agent="-", intervention="root", depth=1,
            hypothesis="the root harness, trained one segment from the base", success_criterion="-", patch="",
            label=Label.KEPT, fitness=state.fitness() | {"noise_sd": noise, "replicas": [r.val for r in replicas]},
            budgets=clock.budgets(),
            findings=self._findings(state), started=t0, finished=time.time()), state)

    def _trial(self, n: int, trial_plan: TrialPlan) -> None:
        if n not in dict(self.store.pending()):
            self.store.begin_trial(n, **trial_plan.to_json())
        while True:
            try:
                return Trial(self, n, trial_plan).run()
            except approval.Revise as r:  # a person asked for another proposal: same trial, the next round
                proposed = self._propose(n, trial_plan.parent, feedback=r.feedback,
                                         rejected=trial_plan.rejected_so_far, round_=trial_plan.next_round)
                trial_plan = trial_plan.revision(proposed, r.feedback)
                self.store.begin_trial(n, **trial_plan.to_json())  # the latest start is what a resume redoes

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

    def _finish(self, rec: TrialRecord, state: State | None = None) -> None:
        if state is not None:  # nothing in the run reads the store: it fills while the next trial starts
            self.training.ingest_later(rec.version, state)
        self.store.finish_trial(rec)
        if rec.parents:
            self._learn(rec.id)
        self.on_event("trial_finished", {"trial": rec.id, "label": rec.label, "version": rec.version,
                                         "intervention": rec.intervention, "val": rec.fitness.get("val")})
        self._track(rec)

    def _track(self, rec: TrialRecord) -> None:
        """A finished trial to the run's trackers: its training jobs' steps, its outcome."""
        if not self.trackers.trackers:
            return
        dirs = (rec.fitness.get("state") or {}).get("dirs") or {}
        for seed, d in sorted(dirs.items(), key=lambda kv: int(kv[0])):
            self.trackers.steps(f"{rec.version}/seed-{seed}", seed_metrics(Path(d)))
        self.trackers.trial(trial_row(rec), [trial_row(t) for t in self.store.trials()])

    def _tracker_failed(self, name: str, why: str) -> None:
        self._event("tracker_failed", tracker=name, error=why)

    @property
    def restart(self) -> bool:
        return self.cfg.policy == "restart"

    def _progress(self, p: Progress) -> None:
        """Training steps as they go: shown (`training_progress`), never stored in the lineage."""
        self.on_event("training_progress", {"title": p.title, "done": p.done, "total": p.total,
                                            "jobs": [list(j) for j in p.jobs]})

    def stage(self, text: str) -> None:
        """What the run does now (shown live, never stored: the lineage records outcomes)."""
        self.on_event("stage", {"stage": text})

    def _event(self, kind: str, trial: int | None = None, **data) -> None:
        self.store.event(kind, trial, **data)
        self.on_event(kind, data)


def _plain(x):
    """Tuples as lists, so the config copy is plain YAML."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
