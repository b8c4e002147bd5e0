"""The controller: the evolution loop of shared/DESIGN.md, in continue mode.

A *state* is a harness version at a lineage depth (segments of training behind it) with
one checkpoint per seed. Trial 0 trains the root harness for one segment from the base.
Each later trial:

    select parent (best state with segments left) -> diagnose it -> the agent proposes one
    intervention -> legality -> backtest on the parent's rollouts -> train the child one
    segment per seed from the parent's checkpoints -> evaluate (a process of its own) ->
    gate against the control (the parent continued unchanged, same segment seeds) ->
    kept / discarded / invalid, written to the lineage in one transaction.

Child and control at the same depth use the same segment seed per run seed, so they see
the same prompts and sampling noise: the gain is paired. Controls are states too, so the
lineage deepens even when children fail. Everything is recorded before it is relied on;
a killed controller resumes with `run()` again: pending trials are redone under their
number and with the proposal they started with, and finished work is never repeated.

Run directory: config.yaml, lineage.sqlite, evidence.sqlite, harness-repo/ (git, one
tag per version), harnesses/vN (checkouts), versions/vN/seed-S and controls/vN-dD/seed-S
(train directories).
"""
from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from evotrainer.agents import Proposal, propose as rules_propose, set_knob
from evotrainer.backtest import backtest
from evotrainer.config import RunConfig
from evotrainer.diagnostics.health import diagnose
from evotrainer.diagnostics.spec import SEVERITIES
from evotrainer.evidence import EvidenceStore
from evotrainer.evolve.gate import gate
from evotrainer.evolve.stats import average_last
from evotrainer.executors import run_in_worker
from evotrainer.harness import REFERENCE
from evotrainer.harness.candidate import Candidate, propose_files, vet
from evotrainer.harness.knobs import load_knobs
from evotrainer.harness.versions import HarnessRepo, PatchError
from evotrainer.lineage import LineageStore, TrialRecord
from evotrainer.tasks import get_task
from evotrainer.train import saved_checkpoints


class ControlFailed(RuntimeError):
    """The control (the parent's own harness) or the evaluator failed: nothing can be judged."""


@dataclass
class State:
    version: str
    depth: int
    dirs: dict[int, str]        # seed -> train directory of its last segment
    val: dict[int, float]       # seed -> validation accuracy (average of the last evaluations)
    test: dict[int, float]      # seed -> test accuracy (recorded, never read by a decision)

    def checkpoint(self, seed: int) -> str:
        return str(Path(self.dirs[seed]) / "checkpoint")

    @property
    def mean_val(self) -> float:
        return sum(self.val.values()) / len(self.val)

    @classmethod
    def of(cls, d: dict) -> "State":
        ints = lambda m: {int(k): v for k, v in m.items()}  # noqa: E731 (JSON keys are strings)
        return cls(d["version"], d["depth"], ints(d["dirs"]), ints(d["val"]), ints(d["test"]))


@dataclass
class Clock:
    """What one trial spent: training steps over all seeds (its control's too, where it paid
    for it) and seconds training and evaluating; the rest of its time is the framework's."""
    train_s: float = 0.0
    eval_s: float = 0.0
    steps: int = 0

    def budgets(self) -> dict:
        return {"steps": self.steps, "train_s": round(self.train_s, 2), "eval_s": round(self.eval_s, 2)}


class Controller:
    def __init__(self, cfg: RunConfig, run_dir: Path | str, on_event: Callable[[str, dict], None] | None = None,
                 agent: Callable[..., Proposal | None] = rules_propose, run_backtests: bool = True):
        """`agent(findings, knobs, target_level, tried)` proposes; `run_backtests=False` lets a
        test show that the gate alone still stops what a backtest would have caught."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.agent, self.run_backtests = agent, run_backtests
        self.task = get_task(cfg.task, cfg.level)
        self.max_depth = cfg.budget.total_steps // cfg.budget.steps_per_segment
        self.on_event = on_event or (lambda kind, data: None)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.store = LineageStore(self.run_dir / "lineage.sqlite")
        self.repo: HarnessRepo | None = None
        self.base: str | None = None
        self._findings_of: dict[tuple, list[dict]] = {}  # a state is diagnosed once, as child and as parent

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        self.store.event("session_started")  # status adds up sessions: time between a kill and a resume is not ours
        self._setup()
        t_end = time.time() + self.cfg.budget.wall_clock_s
        for n, proposal in self.store.pending():  # resume: redo what a kill cut off, same number
            self._event("trial_resumed", n, intervention=proposal.get("intervention"))
            if n > 0:
                self._trial(n, State.of(proposal["parent_state"]), proposal)
        if not self.store.finished(0):
            self._root()
        while (n := self.store.next_trial()) <= self.cfg.budget.trials:
            if time.time() > t_end:
                self._event("stopped", reason="wall-clock budget spent")
                return
            parent = self._select_parent()
            if parent is None:
                self._event("stopped", reason="no state has segments or untried interventions left")
                return
            proposal = self._propose(n, parent)
            if proposal is None:
                self.store.event("parent_exhausted", version=parent.version, depth=parent.depth)
                continue
            self._trial(n, parent, proposal)
        self._event("run_finished", trials=len(self.store.trials()))

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
            self._event("run_started", base=self._base_checkpoint(), max_depth=self.max_depth)
            started = self.store.events("run_started")
        self.base = started[0]["base"]

    def _base_checkpoint(self) -> str:
        if self.cfg.base.checkpoint:  # absolute: a resume may start from another directory
            return str(Path(self.cfg.base.checkpoint).resolve())
        from evotrainer.pretrain import PretrainConfig, pretrain
        path, _ = pretrain(self.task, PretrainConfig(target_acc=self.cfg.base.target_acc, seed=self.cfg.base.seed))
        return str(path)

    # ------------------------------------------------------------------ states and proposals

    def _states(self) -> list[State]:
        out = [State.of(t.fitness["state"]) for t in self.store.trials() if t.label == "kept"]
        out += [State.of(e["state"]) for e in self.store.events("control_finished")]
        return out

    def _select_parent(self) -> State | None:
        exhausted = {(e["version"], e["depth"]) for e in self.store.events("parent_exhausted")}
        open_ = [s for s in self._states() if s.depth < self.max_depth and (s.version, s.depth) not in exhausted]
        return max(open_, key=lambda s: (s.mean_val, s.depth, s.version), default=None)

    def _propose(self, n: int, parent: State) -> dict | None:
        findings = self._findings(parent)
        tried = {t.intervention for t in self.store.trials() if t.parents[:1] == [parent.version]}
        p = self.agent(findings, self._knobs(parent.version), self.task.target_level, tried)
        if p is None:
            return None
        return {"parent_state": dataclasses.asdict(parent), "version": f"v{n}", **dataclasses.asdict(p)}

    def _findings(self, state: State) -> list[dict]:
        """The worst finding per diagnostic over the state's seeds, critical and blocking first."""
        key = tuple(sorted(state.dirs.items()))
        if key in self._findings_of:
            return self._findings_of[key]
        worst: dict[str, dict] = {}
        for d in state.dirs.values():
            for f in diagnose(d)[0]["findings"]:
                kept = worst.get(f["diagnostic"])
                if kept is None or SEVERITIES.index(f["severity"]) > SEVERITIES.index(kept["severity"]):
                    worst[f["diagnostic"]] = f
        found = sorted(worst.values(), key=lambda f: (f["severity"] != "critical", not f["blocking"]))
        self._findings_of[key] = found
        return found

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
        t0, clock = time.time(), Clock()
        state = self._segment("v0", root, self.run_dir / "versions" / "v0", clock)
        self._finish(TrialRecord(
            id=0, version="v0", parents=[], agent="-", intervention="root", depth=1,
            hypothesis="the root harness, trained one segment from the base", success_criterion="-", patch="",
            label="kept", fitness=self._fitness(state), budgets=clock.budgets(),
            findings=self._findings(state), started=t0, finished=time.time()), state)

    def _trial(self, n: int, parent: State, proposal: dict) -> None:
        if n not in dict(self.store.pending()):
            self.store.begin_trial(n, **proposal)
        # shown, not stored: the store's own trial_started record (begin_trial) carries the proposal
        self.on_event("trial_started", {"trial": n, "intervention": proposal["intervention"], "parent": parent.version})
        t0, clock, version = time.time(), Clock(), proposal["version"]
        rec = dict(id=n, version=version, parents=[parent.version], agent=proposal["agent"],
                   intervention=proposal["intervention"], depth=parent.depth + 1,
                   hypothesis=proposal["hypothesis"], success_criterion=proposal["success_criterion"], started=t0)

        try:
            cand = self._candidate(parent.version, version, proposal)
        except PatchError as e:  # the proposal changes nothing: recorded, never run
            return self._finish(TrialRecord(**{**rec, "version": None}, patch="", label="discarded",
                                            reflection=str(e), finished=time.time()))
        patch = self.repo.diff(parent.version, version) if cand.version else ""
        if not cand.legal:
            return self._finish(TrialRecord(**rec, patch=patch, label="illegal", reflection="; ".join(cand.reasons),
                                            finished=time.time()))
        if self.run_backtests:
            bt = backtest(parent.dirs[min(parent.dirs)], self._harness_dir(version), self._harness_dir(parent.version),
                          timeout_s=self.cfg.budget.trial_timeout_s)
            bt_summary = {"label": bt.label, "reasons": bt.reasons}
        else:
            bt, bt_summary = None, {"label": "skipped", "reasons": []}
        if bt is not None and not bt.passed:
            return self._finish(TrialRecord(**rec, patch=patch, label=bt.label, backtest=bt_summary,
                                            reflection="; ".join(bt.reasons), finished=time.time()))
        control = self._control(parent, clock)
        try:
            child = self._segment(version, parent, self.run_dir / "versions" / version, clock)
        except SegmentFailed as e:
            return self._finish(TrialRecord(**rec, patch=patch, label=e.label, backtest=bt_summary,
                                            budgets=clock.budgets(), reflection=e.detail,
                                            finished=time.time()))
        findings = self._findings(child)
        blocking = [f"{f['diagnostic']} = {f['value']:g}" for f in findings if f["blocking"]]
        decision = gate(child.val, control.val, blocking, self.cfg.gate)
        fitness = self._fitness(child) | {"control_val": control.val, "gain": decision.gain,
                                          "threshold": decision.threshold}
        self._finish(TrialRecord(**rec, patch=patch, label=decision.label, backtest=bt_summary, fitness=fitness,
                                 budgets=clock.budgets(), findings=findings,
                                 reflection="; ".join(decision.reasons), finished=time.time()), child)

    def _candidate(self, parent: str, version: str, proposal: dict) -> Candidate:
        if version in self.repo.versions():  # a resumed trial: the child was committed before the kill
            return vet(self.repo, parent, version)
        text = (self._harness_dir(parent) / "knobs.yaml").read_text()
        for key, value in proposal["knobs"].items():
            text = set_knob(text, key, value)
        files = {**proposal.get("files", {}), "knobs.yaml": text}
        return propose_files(self.repo, parent, files, version, proposal["hypothesis"])

    def _control(self, parent: State, clock: Clock) -> State:
        """The parent continued one segment with its own harness: every child's comparison."""
        for e in self.store.events("control_finished"):
            if (e["state"]["version"], e["state"]["depth"]) == (parent.version, parent.depth + 1):
                return State.of(e["state"])
        out = self.run_dir / "controls" / f"{parent.version}-d{parent.depth + 1}"
        try:
            state = self._segment(parent.version, parent, out, clock)
        except SegmentFailed as e:
            raise ControlFailed(f"the control of {parent.version} failed: {e.label}: {e.detail}") from None
        self._ingest(f"{parent.version}-d{state.depth}", state)
        self._event("control_finished", state=dataclasses.asdict(state))
        return state

    def _finish(self, rec: TrialRecord, state: State | None = None) -> None:
        if state is not None:
            self._ingest(rec.version, state)
        self.store.finish_trial(rec)
        self.on_event("trial_finished", {"trial": rec.id, "label": rec.label, "version": rec.version,
                                         "intervention": rec.intervention, "val": rec.fitness.get("val")})

    # ------------------------------------------------------------------ training and evaluation

    def _segment(self, version: str, parent: State, out_root: Path, clock: Clock) -> State:
        """One segment per seed from the parent's checkpoints (the base for the root), then evaluation."""
        depth, harness = parent.depth + 1, self._harness_dir(version)
        dirs = {}
        for seed in self.cfg.seeds:
            out = out_root / f"seed-{seed}"
            shutil.rmtree(out, ignore_errors=True)  # a resumed segment starts clean
            t = time.time()
            res = run_in_worker("evotrainer.train:train_segment", dict(
                task=self.task.name, level=self.task.target_level or None, harness=str(harness),
                base=parent.checkpoint(seed) if parent.dirs else self.base, out=str(out),
                seed=1000 * seed + depth, steps=self.cfg.budget.steps_per_segment),
                timeout_s=self.cfg.budget.trial_timeout_s)
            clock.train_s += time.time() - t
            clock.steps += self.cfg.budget.steps_per_segment
            out.mkdir(parents=True, exist_ok=True)
            (out / "worker.log").write_text(res.log_tail)
            if not res.ok:
                raise SegmentFailed(res.label, f"seed {seed}: {res.error}")
            dirs[seed] = str(out)
        t = time.time()
        jobs = {}
        for seed, d in dirs.items():
            jobs |= {str(c): ["val"] for c in saved_checkpoints(Path(d))} | {str(Path(d, "checkpoint")): ["val", "test"]}
        ev = run_in_worker("evotrainer.evaluate.greedy:evaluate_checkpoints",
                           dict(task=self.task.name, level=self.task.target_level or None, jobs=jobs),
                           timeout_s=self.cfg.budget.trial_timeout_s)
        clock.eval_s += time.time() - t
        if not ev.ok:
            raise ControlFailed(f"the evaluator failed: {ev.label}: {ev.error}")
        val, test = {}, {}
        for seed, d in dirs.items():
            seq = [ev.value[k]["val"] for k in jobs if k.startswith(d + "/")]  # saved steps, then the final
            val[seed], test[seed] = average_last(seq, self.cfg.gate.last_k), ev.value[str(Path(d, "checkpoint"))]["test"]
        return State(version, depth, dirs, val, test)

    def _ingest(self, name: str, state: State) -> None:
        store = EvidenceStore(self.run_dir / "evidence.sqlite")
        try:
            for seed, d in state.dirs.items():
                store.ingest(f"{name}/seed-{seed}", Path(d))
        finally:
            store.close()

    def _fitness(self, state: State) -> dict:
        return {"val": state.val, "test": state.test, "state": dataclasses.asdict(state)}

    def _event(self, kind: str, trial: int | None = None, **data) -> None:
        self.store.event(kind, trial, **data)
        self.on_event(kind, data)


class SegmentFailed(RuntimeError):
    def __init__(self, label: str, detail: str):
        self.label, self.detail = label, detail
        super().__init__(f"{label}: {detail}")


def _plain(x):
    """Tuples as lists, so the config copy is plain YAML."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
