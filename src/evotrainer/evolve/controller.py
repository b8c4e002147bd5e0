"""The controller: the evolution loop of shared/DESIGN.md.

A *state* is a harness version at a lineage depth with one checkpoint per seed. In
`continue` mode (population-based training) depth counts segments of training behind the
state; trial 0 trains the root harness one segment from the base, and each later trial:

    select parent (search.selection: greedy, or a population of elites) -> diagnose it ->
    the agent proposes one (or a crossover of two elites is due)
    intervention -> legality -> backtest on the parent's rollouts -> train the child one
    segment per seed from the parent's checkpoints -> evaluate (a process of its own) ->
    gate against the control (the parent continued unchanged, same segment seeds) ->
    kept / discarded / invalid, written to the lineage in one transaction.

In `restart` mode (the published protocol) every version trains from the base for the
whole budget and its control is its parent, trained from the base with the same seeds.

Child and control use the same segment seed per run seed, so they see the same prompts
and sampling noise: the gain is paired. Every training job of a step (child and control,
all seeds) runs in one pool of worker processes, and one evaluator process scores them. Controls are states too, so the
lineage deepens even when children fail. Everything is recorded before it is relied on;
a killed controller resumes with `run()` again: pending trials are redone under their
number and with the proposal they started with, and finished work is never repeated.

Run directory: config.yaml, lineage.sqlite, evidence.sqlite, harness-repo/ (git, one
tag per version), harnesses/vN (checkouts), versions/vN/seed-S and controls/vN-dD/seed-S
(train directories).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from evotrainer.agents import AgentContext, AgentFailed, Escalation, Proposal, make_agent, set_knob
from evotrainer.backtest import backtest
from evotrainer.backtest.run import rest_key
from evotrainer.config import RunConfig
from evotrainer.diagnostics.health import diagnose
from evotrainer.diagnostics.replay import revised_diagnostics
from evotrainer.diagnostics.spec import SEVERITIES
from evotrainer.errors import HarnessFailed, UsageError
from evotrainer.evidence import EvidenceStore
from evotrainer.evolve.final import compare, extend, schedule, table, winner
from evotrainer.evolve import approval, history
from evotrainer.evolve.gate import gate
from evotrainer.evolve.replay import Arm, ReplayFailed, evaluate, pool, replay
from evotrainer.evolve.population import Elite, SelectionConfig, crossover_due, mates, merge, promote, select_parent
from evotrainer.evolve.skills import SkillLibrary
from evotrainer.evolve.stats import average_last, noise_floor
from evotrainer.executors import Call
from evotrainer.harness import REFERENCE, inspect_harness
from evotrainer.harness.candidate import Candidate, propose_files, vet
from evotrainer.harness.knobs import load_knobs
from evotrainer.harness.versions import HarnessRepo, PatchError
from evotrainer.inner.backends import check_backend
from evotrainer.lineage import LineageStore, TrialRecord
from evotrainer.policy.model import resolve_model
from evotrainer.tasks import get_task
from evotrainer.train import saved_checkpoints, segment_seed


AGENT_ERRORS_TO_STOP = 3  # agent_error trials in a row (a wrong URL, key or model): stop, do not spend the budget


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
        self.runtime = cfg.runtime().validate()
        # a user's model: a local directory every worker loads (checked now: bad input stops here)
        self.model = resolve_model(cfg.model) if cfg.model else None
        check_backend(self.runtime, inspect_harness(cfg.harness or REFERENCE), "the root harness")
        # continue mode: segments to the reference's total steps; restart mode: every state is whole
        self.max_depth = 1 if cfg.policy == "restart" else cfg.budget.total_steps // cfg.budget.steps_per_segment
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
        self._learn()  # what a kill cut off between a trial's row and its skill outcome
        t_end = time.time() + self.cfg.budget.wall_clock_s
        for n, proposal in self.store.pending():  # resume: redo what a kill cut off, same number
            self._event("trial_resumed", n, intervention=proposal.get("intervention"))
            if n > 0:
                self._trial(n, State.of(proposal["parent_state"]), proposal)
        if not self.store.finished(0):
            self._root()
        self._search(t_end)
        self.final()

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
            proposal = self._crossover(n, parent) or self._propose(n, parent)
            if proposal is None:
                self.store.event("parent_exhausted", version=parent.version, depth=parent.depth)
                continue
            self._trial(n, parent, proposal)
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
        arms = {"reference": Arm((str(self._harness_dir("v0")),), self.cfg.budget.total_steps), "evolved": arm}
        try:
            rep = replay(self.task.spec, self.task.target_level, self.base, arms, self.cfg.final_seeds,
                         self.run_dir / "final", self.cfg.gate.last_k, self.cfg.budget.trial_timeout_s,
                         self.cfg.workers, self.runtime, self.cfg.worker_memory_mb)
        except ReplayFailed as e:
            raise ControlFailed(f"the final comparison: {e}") from None
        result = {"winner": label, "schedule": harnesses, "seeds": list(self.cfg.final_seeds),
                  "total_steps": self.cfg.budget.total_steps, "base": rep.base,
                  "comparison": compare(rep.scores["reference"], rep.scores["evolved"]),
                  "budgets": Clock(rep.train_s, rep.eval_s).budgets()}
        result["table"] = table(result["base"], result["comparison"], self.cfg.final_seeds)
        (self.run_dir / "final.json").write_text(json.dumps(result, indent=2))
        (self.run_dir / "final.md").write_text(f"# Final comparison\n\nwinner {result['winner']}, schedule "
                                               f"{' -> '.join(harnesses)}\n\n```\n{result['table']}\n```\n")
        self._event("final_finished", **result)
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
            self._event("run_started", base=base, base_s=round(time.time() - t, 2), max_depth=self.max_depth,
                        task=self.task.spec, runtime=self.runtime.to_dict(),
                        device=f"{pol.resolved_device()}, {str(pol.compute_dtype()).removeprefix('torch.')}")
            started = self.store.events("run_started")
        self.base = started[0]["base"]

    def _base_checkpoint(self) -> str:
        if self.model:  # absolute: a resume may start from another directory
            return self.model
        from evotrainer.pretrain import PretrainConfig, pretrain
        b = self.cfg.base
        path, _ = pretrain(self.task, PretrainConfig(target_acc=b.target_acc, seed=b.seed, warm_start=b.warm_start),
                           progress=lambda step, loss, acc: self.on_event(
                               "base_progress", {"step": step, "loss": loss, "probe_acc": acc}))
        return str(path)

    # ------------------------------------------------------------------ states and proposals

    def _states(self) -> list[State]:
        out = [State.of(t.fitness["state"]) for t in self.store.trials() if t.label == "kept"]
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
            kept = [t for t in self.store.trials() if t.label == "kept"]
            back = [s for s in open_ if kept and s.version == kept[-1].version]
            if back:
                return max(back, key=lambda s: s.depth)
        elites = [e for e in self._population() if e.key in by_key]
        trials = self.store.trials()
        starts = self._starts()
        recent = [e.changes for e in self._elites([State.of(starts[t.id]["parent_state"])
                                                   for t in trials[-self.selection.recent:] if t.id in starts])]
        pick = select_parent(elites, history.children(trials, starts), n, self.selection, recent)
        return by_key[pick.key] if pick else best

    def _population(self) -> list[Elite]:
        """The elites, rebuilt from the lineage in the order states were recorded (so a resumed
        controller has the same population): kept children and controls ask to join in turn."""
        kept = {t.id: t for t in self.store.trials() if t.label == "kept"}
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
        changes, surfaces = history.changes(trials), history.surfaces(trials, self._starts())
        return [Elite(s.version, s.depth, s.mean_val, changes.get(s.version, frozenset()),
                      surfaces.get(s.version, "root")) for s in states]

    def _elite_of(self, state: State) -> Elite:
        return self._elites([state])[0]

    def _starts(self) -> dict[int, dict]:
        """Trial number -> the proposal it (last) started with (every trial but the root's)."""
        return {e["trial"]: e for e in self.store.events("trial_started") if "parent_state" in e}

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
            starts = self._starts()
            triggers = {starts[t.id].get("trigger", "none").split(":")[0] for t in streak if t.id in starts}
            ignore = sorted(d for d in triggers - {"none"} if self._diagnostic_misleads(d))
            self._event("escalated", after=last, avoid=sorted({history.family(t.intervention, starts.get(t.id))
                                                              for t in streak}),
                        ignore=ignore)
            done = self.store.events("escalated")[-1:]
        e = done[0]
        return Escalation(avoid=frozenset(e["avoid"]), ignore=frozenset(e["ignore"]))

    def _diagnostic_misleads(self, name: str) -> bool:
        """Whether diagnostic `name` ranks this run's failed versions *better* than its kept ones
        (replay AUC < 0.5); undecidable (too few of either) counts as not misleading."""
        from evotrainer.diagnostics.replay import FAILED, HELD_UP, replay
        labelled = [(Path(d), t.label) for t in self.store.trials() if t.parents and t.label in HELD_UP + FAILED
                    and "state" in t.fitness for d in t.fitness["state"]["dirs"].values()]
        try:
            r = replay(name, labelled, timeout_s=self.cfg.budget.trial_timeout_s)
        except Exception as e:  # a replay that cannot run leaves the diagnostic trusted
            self.store.event("replay_failed", diagnostic=name, error=str(e))
            return False
        return r.auc is not None and r.auc < 0.5

    def _replay_revised(self, names: list[str], version: str) -> list[dict]:
        """Each new or revised diagnostic of `version` replayed (in a worker) over the evidence of
        every version this run trained and judged, the root included: AUC and whether it is kept."""
        from evotrainer.diagnostics.replay import FAILED, HELD_UP, replay
        labelled, versions = {}, set()
        for t in self.store.trials():
            if t.label in HELD_UP + FAILED and "state" in t.fitness:
                for d in t.fitness["state"]["dirs"].values():
                    if d not in labelled:  # a version kept without training shares its parent's
                        labelled[d] = t.label
                        versions.add(t.id)
        out = []
        for name in names:
            try:
                r = replay(name, [(Path(d), lab) for d, lab in labelled.items()], harness_dir=self._harness_dir(version),
                           timeout_s=self.cfg.budget.trial_timeout_s)
                out.append({"diagnostic": name, "auc": r.auc, "kept": r.kept, "versions": len(versions)})
            except (UsageError, HarnessFailed) as e:  # it does not load or run: not kept
                out.append({"diagnostic": name, "auc": None, "kept": False, "versions": len(versions),
                            "error": str(e)})
        return out

    def _propose(self, n: int, parent: State, feedback: str = "", rejected: tuple[str, ...] = (),
                 round_: int = 0) -> dict | None:
        """The agent's proposal for trial `n` from `parent` (round > 0: a revision a person asked
        for at a gate, with their feedback, the rejected interventions counted as tried)."""
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
            p = AgentFailed("agent_error", f"{type(e).__name__}: {e}", self.cfg.agent)
        if p is None:
            return None
        head = {"parent_state": dataclasses.asdict(parent), "version": f"v{n}" + (f"r{round_}" if round_ else ""),
                "round": round_}
        if isinstance(p, AgentFailed):  # recorded as a trial with the failure's label: the run goes on
            return head | {"version": None, "intervention": p.intervention, "agent": p.agent,
                           "family": p.usage.get("role", "agent"),
                           "hypothesis": p.hypothesis, "success_criterion": "-", "usage": p.usage,
                           "failed": {"label": p.label, "reason": p.reason}}
        return head | dataclasses.asdict(p)

    def _crossover(self, n: int, parent: State) -> dict | None:
        """A crossover proposal when one is due (population.crossover_due): the parent's harness
        merged with an elite's that carries changes the parent lacks, against their common
        ancestor. A pair whose changes conflict is recorded and skipped, never guessed."""
        if self.cfg.search.selection != "population" or not self.cfg.search.crossover:
            return None
        trials = self.store.trials()
        if not crossover_due(history.operations(trials)):
            return None
        starts = self._starts()
        crossed = {(s["parent_state"]["version"], s["mate_state"]["version"]) for s in starts.values()
                   if s.get("mate_state")}
        first = self._elite_of(parent)
        for mate in mates(self._population(), first):
            if (parent.version, mate.version) in crossed:
                continue
            base = _common_ancestor(trials, parent.version, mate.version)
            m = merge(*(self._knob_dict(v) for v in (base, parent.version, mate.version)),
                      *(self._slot_files(v) for v in (base, parent.version, mate.version)))
            if m.conflicts:
                self.store.event("crossover_conflict", parents=[parent.version, mate.version],
                                 conflicts=list(m.conflicts))
                continue
            mate_state = next(s for s in self._states() if (s.version, s.depth) == mate.key)
            return {"parent_state": dataclasses.asdict(parent), "mate_state": dataclasses.asdict(mate_state),
                    "version": f"v{n}", "intervention": history.CROSSOVER, "family": history.CROSSOVER,
                    "hypothesis": f"combining {parent.version}'s changes ({', '.join(sorted(first.changes)) or 'none'}) "
                                  f"with {mate.version}'s ({', '.join(sorted(mate.changes))}) keeps both gains, "
                                  "because they change different parts of the harness",
                    "frozen": f"everything else of {parent.version}",
                    "success_criterion": "validation accuracy beats the control's beyond the noise floor, "
                                         "with no blocking finding",
                    "rollback": f"back to {parent.version}", "knobs": m.knobs, "files": m.files,
                    "agent": "crossover", "trigger": "none"}
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
        starts, lib = self._starts(), SkillLibrary(self.cfg.search.skills)
        try:
            for t in self.store.trials():
                s = starts.get(t.id)
                if (trial is not None and t.id != trial) or not t.parents or s is None \
                        or t.intervention == history.CROSSOVER \
                        or t.label in (history.EQUIVALENT, history.ABORTED, *history.AGENT_FAILED):
                    continue
                lib.record(run=str(self.run_dir.resolve()), trial=t.id, task=self.cfg.task,
                           trigger=s.get("trigger", "none"), intervention=t.intervention,
                           family=history.family(t.intervention, s), patch=s.get("knobs", {}),
                           expected=t.hypothesis, label=t.label, gain=t.fitness.get("gain"))
        finally:
            lib.close()

    def _findings(self, state: State) -> list[dict]:
        """The worst finding per diagnostic over the state's seeds, critical and blocking first."""
        key = (state.version, *sorted(state.dirs.items()))
        if key in self._findings_of:
            return self._findings_of[key]
        worst: dict[str, dict] = {}
        for d in state.dirs.values():  # the state's own harness reads it (a new diagnostic included)
            try:
                report = diagnose(d, self._harness_dir(state.version))[0]["findings"]
            except HarnessFailed as e:  # its diagnostics.py fails: blocking, so it is never promoted
                report = [{"diagnostic": "diagnostics_failed", "layer": "custom", "severity": "critical",
                           "blocking": True, "value": 1.0, "evidence": f"{e.label}: {e.detail}"[:500],
                           "suggest": "diagnostics: fix or revert diagnostics.py"}]
            for f in report:
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
        # replicas: the root again on other data (segment seeds offset), to measure the noise floor
        segments = [Segment("v0", root, 1, self.run_dir / "versions" / "v0")] + [
            Segment("v0", root, 1, self.run_dir / "noise" / f"replica-{i + 1}", seed_offset=500 + i)
            for i in range(self.cfg.gate.replicas)]
        state, *replicas = self._train(segments, clock)
        for s in (state, *replicas):
            if isinstance(s, SegmentFailed):
                raise ControlFailed(f"the root harness failed: {s}")
        noise = noise_floor(state.val, [r.val for r in replicas])
        self._finish(TrialRecord(
            id=0, version="v0", parents=[], agent="-", intervention="root", depth=1,
            hypothesis="the root harness, trained one segment from the base", success_criterion="-", patch="",
            label="kept", fitness=self._fitness(state) | {"noise_sd": noise, "replicas": [r.val for r in replicas]},
            budgets=clock.budgets(),
            findings=self._findings(state), started=t0, finished=time.time()), state)

    def _trial(self, n: int, parent: State, proposal: dict) -> None:
        if n not in dict(self.store.pending()):
            self.store.begin_trial(n, **proposal)
        while True:
            try:
                return self._attempt(n, parent, proposal)
            except approval.Revise as r:  # a person asked for another proposal: same trial, the next round
                rejected = tuple(dict.fromkeys([*proposal.get("rejected", ()), proposal["intervention"]]))
                round_ = proposal.get("round", 0) + 1
                new = self._propose(n, parent, feedback=r.feedback, rejected=rejected, round_=round_)
                if new is None:
                    new = {**proposal, "round": round_, "usage": {}, "failed": {
                        "label": history.ABORTED, "reason": "revised at a gate, and the agent has nothing else to "
                                                            f"propose from {parent.version}"}}
                # what proposing cost covers every round, so the trial's budgets hold the whole bill
                proposal = {**new, "rejected": list(rejected), "feedback": r.feedback,
                            "usage": history.add_usage(proposal.get("usage"), new.get("usage"))}
                self.store.begin_trial(n, **proposal)  # the latest start is what a resume redoes

    def _attempt(self, n: int, parent: State, proposal: dict) -> None:
        # shown, not stored: the store's own trial_started record (begin_trial) carries the proposal
        self.on_event("trial_started", {"trial": n, "intervention": proposal["intervention"], "parent": parent.version})
        t0, clock, version = time.time(), Clock(), proposal["version"]
        parents = [parent.version] + ([proposal["mate_state"]["version"]] if proposal.get("mate_state") else [])
        rec = dict(id=n, version=version, parents=parents, agent=proposal["agent"],
                   intervention=proposal["intervention"], depth=parent.depth + 1,
                   hypothesis=proposal["hypothesis"], success_criterion=proposal["success_criterion"], started=t0)
        usage = {"agent": proposal["usage"]} if proposal.get("usage") else {}  # what proposing cost (llm tokens)
        if proposal.get("failed"):  # the agent produced nothing usable: labelled, never run
            f = proposal["failed"]
            return self._finish(TrialRecord(**{**rec, "version": None}, patch="", label=f["label"], budgets=usage,
                                            reflection=f["reason"], finished=time.time()))

        try:
            cand = self._candidate(parent.version, version, proposal)
        except PatchError as e:  # the proposal changes nothing: recorded, never run
            return self._finish(TrialRecord(**{**rec, "version": None}, patch="", label="discarded", budgets=usage,
                                            reflection=str(e), finished=time.time()))
        patch = self.repo.diff(parent.version, version) if cand.version else ""
        if not cand.legal:
            return self._finish(TrialRecord(**rec, patch=patch, label="illegal", reflection="; ".join(cand.reasons),
                                            budgets=usage, finished=time.time()))
        if self._gate(n, "design", proposal, patch=patch) == "abort":
            return self._finish(TrialRecord(**rec, patch=patch, label=history.ABORTED, budgets=usage,
                                            reflection="aborted by a person at the design gate", finished=time.time()))
        revised = revised_diagnostics(self._harness_dir(parent.version), self._harness_dir(version))
        replays = self._replay_revised(revised, version) if revised else []
        if any(not r["kept"] for r in replays):  # a diagnostic is kept only if it separates (EvoTrainer)
            return self._finish(TrialRecord(
                **rec, patch=patch, label=history.DIAGNOSTIC_REJECTED, backtest={"diagnostics": replays},
                budgets=usage, finished=time.time(), reflection="; ".join(
                    f"{r['diagnostic']}: " + _replay_reason(r) for r in replays if not r["kept"])))
        if replays and self.repo.files_changed(parent.version, version) == ["diagnostics.py"]:
            # what the harness reads changed, not how it trains: kept on its replay alone, on the
            # parent's checkpoints, so the next proposals from it read the new diagnostic
            state = dataclasses.replace(parent, version=version)
            if self._gate(n, "completion", proposal, label="kept", diagnostics=replays) == "abort":
                return self._finish(TrialRecord(**rec, patch=patch, label=history.ABORTED, budgets=usage,
                                                backtest={"diagnostics": replays}, finished=time.time(),
                                                reflection="aborted by a person at the completion gate"))
            return self._finish(TrialRecord(
                **{**rec, "depth": parent.depth}, patch=patch, label="kept", backtest={"diagnostics": replays},
                fitness=self._fitness(state), budgets=usage, findings=self._findings(state), finished=time.time(),
                reflection="; ".join(f"{r['diagnostic']} separates failed from held-up versions (AUC {r['auc']})"
                                     for r in replays) + "; kept without training"), state)
        if self.run_backtests:
            bt = backtest(parent.dirs[min(parent.dirs)], self._harness_dir(version), self._harness_dir(parent.version),
                          timeout_s=self.cfg.budget.trial_timeout_s)
            bt_summary = {"label": bt.label, "reasons": bt.reasons}
        else:
            bt, bt_summary = None, {"label": "skipped", "reasons": []}
        if bt is not None and not bt.passed:
            return self._finish(TrialRecord(**rec, patch=patch, label=bt.label, backtest=bt_summary, budgets=usage,
                                            reflection="; ".join(bt.reasons), finished=time.time()))
        if replays:
            bt_summary |= {"diagnostics": replays}
        if bt is not None:
            bt_summary |= {"signal": bt.signal, "rest": rest_key(self._harness_dir(version))}
            twin = self._twin(parent, bt_summary)
            if twin is not None:
                return self._finish(TrialRecord(
                    **rec, patch=patch, label=history.EQUIVALENT, backtest=bt_summary, budgets=usage,
                    finished=time.time(),
                    reflection=f"trains exactly like {twin.version} ({twin.intervention}): the same rewards, filter "
                               "and advantages on the parent's rollouts and every other setting equal; not trained"))
        if self._gate(n, "backtest", proposal, backtest=bt_summary) == "abort":
            return self._finish(TrialRecord(**rec, patch=patch, label=history.ABORTED, backtest=bt_summary,
                                            budgets=usage, reflection="aborted by a person at the backtest gate",
                                            finished=time.time()))
        try:
            control, child = self._train_against_control(parent, version, clock)
        except SegmentFailed as e:
            return self._finish(TrialRecord(**rec, patch=patch, label=e.label, backtest=bt_summary,
                                            budgets=clock.budgets() | usage, reflection=e.detail,
                                            finished=time.time()))
        findings = self._findings(child)
        blocking = [f"{f['diagnostic']} = {f['value']:g}" for f in findings if f["blocking"]]
        decision = gate(child.val, control.val, blocking, self.cfg.gate, noise_sd=self._noise_sd())
        fitness = self._fitness(child) | {"control_val": control.val, "gain": decision.gain,
                                          "threshold": decision.threshold}
        if self._gate(n, "completion", proposal, label=decision.label, gain=decision.gain,
                      val=child.val, control_val=control.val) == "abort":  # measured, recorded, never kept
            return self._finish(TrialRecord(**rec, patch=patch, label=history.ABORTED, backtest=bt_summary,
                                            fitness=fitness, budgets=clock.budgets() | usage, findings=findings,
                                            reflection=f"aborted by a person at the completion gate (the gate said "
                                                       f"{decision.label})", finished=time.time()))
        self._finish(TrialRecord(**rec, patch=patch, label=decision.label, backtest=bt_summary, fitness=fitness,
                                 budgets=clock.budgets() | usage, findings=findings,
                                 reflection="; ".join(decision.reasons), finished=time.time()), child)

    def _gate(self, n: int, point: str, proposal: dict, **shown) -> str:
        """'approve' at once where this point is not gated; else a person's 'approve' or 'abort'
        (approval.Revise is raised for a revision)."""
        streak = len(history.failures_in_a_row(self.store.trials()))
        if point not in approval.points(self.cfg.gates, self.cfg.gate_after_failures, streak):
            return "approve"
        d = approval.ask(self.store, self.run_dir, n, point, proposal.get("round", 0),
                         {"intervention": proposal["intervention"], "hypothesis": proposal["hypothesis"], **shown},
                         self.on_event, self.gate_poll_s)
        if d["decision"] == "revise":
            raise approval.Revise(d["feedback"])
        return d["decision"]

    def _twin(self, parent: State, bt: dict):
        """An earlier child of the parent's harness that trained (or tried to) and would train
        exactly like this candidate: the same rest key, and the same signal fingerprint on this
        parent's evidence (its own, if it branched from this very state; else rescored here)."""
        starts, here = self._starts(), (parent.version, parent.depth)
        for t in self.store.trials():
            if t.parents[:1] != [parent.version] or t.backtest.get("rest") != bt["rest"] \
                    or t.label in (history.EQUIVALENT, "illegal", "backtest_rejected"):
                continue
            ps = starts.get(t.id, {}).get("parent_state", {})
            if (ps.get("version"), ps.get("depth")) == here:
                signal = t.backtest.get("signal")
            else:
                signal = backtest(parent.dirs[min(parent.dirs)], self._harness_dir(t.version),
                                  self._harness_dir(parent.version), timeout_s=self.cfg.budget.trial_timeout_s).signal
            if signal and signal == bt["signal"]:
                return t
        return None

    def _noise_sd(self) -> float:
        """The noise floor the root trial measured (sd of a paired difference between runs of one harness)."""
        root = next(t for t in self.store.trials() if t.id == 0)
        return root.fitness.get("noise_sd", 0.0)

    def _candidate(self, parent: str, version: str, proposal: dict) -> Candidate:
        if version in self.repo.versions():  # a resumed trial: the child was committed before the kill
            cand = vet(self.repo, parent, version)
        else:
            text = proposal.get("files", {}).get("knobs.yaml") or (self._harness_dir(parent) / "knobs.yaml").read_text()
            for key, value in proposal["knobs"].items():
                text = set_knob(text, key, value)
            files = {**proposal.get("files", {}), "knobs.yaml": text}
            cand = propose_files(self.repo, parent, files, version, proposal["hypothesis"])
        if not cand.legal:
            return cand
        try:  # legal, but this run's backend must be able to train it as written
            check_backend(self.runtime, inspect_harness(self._harness_dir(version)), version)
        except UsageError as e:
            return dataclasses.replace(cand, label="illegal", reasons=[str(e)])
        return cand

    def _train_against_control(self, parent: State, version: str, clock: Clock) -> tuple[State, State]:
        """Train the child and, where not trained yet, its control; return (control, child).

        Continue mode: the control is the parent continued one segment with its own harness,
        shared by every child of that parent. Restart mode: the control is the parent itself."""
        child_seg = Segment(version, self._start_of(parent), parent.depth + 1, self.run_dir / "versions" / version)
        if self.restart:
            (child,) = self._train([child_seg], clock)
            return parent, _raise_failed(child)
        for e in self.store.events("control_finished"):
            if (e["state"]["version"], e["state"]["depth"]) == (parent.version, parent.depth + 1):
                (child,) = self._train([child_seg], clock)
                return State.of(e["state"]), _raise_failed(child)
        control_seg = Segment(parent.version, parent, parent.depth + 1,
                              self.run_dir / "controls" / f"{parent.version}-d{parent.depth + 1}")
        child, control = self._train([child_seg, control_seg], clock)
        if isinstance(control, SegmentFailed):
            raise ControlFailed(f"the control of {parent.version} failed: {control}") from None
        self._ingest(f"{parent.version}-d{control.depth}", control)
        self._event("control_finished", state=dataclasses.asdict(control))
        return control, _raise_failed(child)

    def _start_of(self, parent: State) -> State:
        """Where a child of `parent` starts: the parent's checkpoints, or the base in restart mode."""
        return State(parent.version, 0, {}, {}, {}) if self.restart else parent

    def _finish(self, rec: TrialRecord, state: State | None = None) -> None:
        if state is not None:
            self._ingest(rec.version, state)
        self.store.finish_trial(rec)
        if rec.parents:
            self._learn(rec.id)
        self.on_event("trial_finished", {"trial": rec.id, "label": rec.label, "version": rec.version,
                                         "intervention": rec.intervention, "val": rec.fitness.get("val")})

    # ------------------------------------------------------------------ training and evaluation

    @property
    def restart(self) -> bool:
        return self.cfg.policy == "restart"

    @property
    def segment_steps(self) -> int:
        return self.cfg.budget.total_steps if self.restart else self.cfg.budget.steps_per_segment

    def _train(self, segments: list["Segment"], clock: Clock) -> list["State | SegmentFailed"]:
        """Train every segment on every seed in one pool of workers, then evaluate them all in
        one evaluator process. A segment whose worker failed on any seed comes back as
        SegmentFailed; the others as States at their depth."""
        calls, where = [], []
        for i, sg in enumerate(segments):
            for seed in self.cfg.seeds:
                out = sg.out_root / f"seed-{seed}"
                shutil.rmtree(out, ignore_errors=True)  # a resumed segment starts clean
                # paired: every version at a depth sees the same prompts per seed (restart: one depth)
                seg_seed = segment_seed(seed, 1 if self.restart else sg.depth) + sg.seed_offset
                calls.append(Call("evotrainer.train:train_segment", dict(
                    task=self.task.spec, level=self.task.target_level, runtime=self.runtime.to_dict(),
                    harness=str(self._harness_dir(sg.version)),
                    base=sg.start.checkpoint(seed) if sg.start.dirs else self.base, out=str(out),
                    seed=seg_seed, steps=self.segment_steps)))
                where.append((i, seed, out))
        results = self._pool(calls, clock, self.cfg.budget.trial_timeout_s)
        clock.steps += self.segment_steps * len(calls)
        failed: dict[int, SegmentFailed] = {}
        dirs: dict[int, dict[int, str]] = {i: {} for i in range(len(segments))}
        for (i, seed, out), res in zip(where, results):
            out.mkdir(parents=True, exist_ok=True)
            (out / "worker.log").write_text(res.log_tail)
            if not res.ok:
                failed.setdefault(i, SegmentFailed(res.label, f"seed {seed}: {res.error}"))
            dirs[i][seed] = str(out)
        scores = self._evaluate([dirs[i] for i in range(len(segments)) if i not in failed], clock)
        out = []
        for i, sg in enumerate(segments):
            out.append(failed[i] if i in failed else State(sg.version, sg.depth, dirs[i], *scores.pop(0)))
        return out

    def _evaluate(self, dir_sets: list[dict[int, str]], clock: Clock) -> list[tuple[dict, dict]]:
        """(val, test) per seed for each set of train directories, from one evaluator process:
        validation averages the last evaluations of a segment, test is the final checkpoint's."""
        if not dir_sets:
            return []
        jobs = {}
        for dirs in dir_sets:
            for d in dirs.values():
                jobs |= {str(c): ["val"] for c in saved_checkpoints(Path(d))} | {str(Path(d, "checkpoint")): ["val", "test"]}
        acc = self._evaluator(jobs, clock)
        out = []
        for dirs in dir_sets:
            val, test = {}, {}
            for seed, d in dirs.items():
                seq = [acc[k]["val"] for k in jobs if k.startswith(d + "/")]  # saved steps, then the final
                val[seed], test[seed] = average_last(seq, self.cfg.gate.last_k), acc[str(Path(d, "checkpoint"))]["test"]
            out.append((val, test))
        return out

    def _evaluator(self, jobs: dict[str, list[str]], clock: Clock) -> dict[str, dict[str, float]]:
        """Accuracy per checkpoint and split (replay.evaluate: a process with no harness code)."""
        t = time.time()
        try:
            return evaluate(self.task.spec, self.task.target_level, jobs, self.cfg.budget.trial_timeout_s,
                            self.runtime, self.cfg.worker_memory_mb)
        except ReplayFailed as e:
            raise ControlFailed(str(e)) from None
        finally:
            clock.eval_s += time.time() - t

    def _pool(self, calls: list[Call], clock: Clock, timeout_s: float) -> list:
        """Training calls in one pool (replay.pool: `workers` at once, threads shared)."""
        t = time.time()
        results = pool(calls, self.cfg.workers, timeout_s, self.cfg.worker_memory_mb)
        clock.train_s += time.time() - t
        return results

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


@dataclass(frozen=True)
class Segment:
    """`version` trained on from `start`'s checkpoints (the base where it has none) to lineage `depth`."""
    version: str
    start: State
    depth: int
    out_root: Path
    seed_offset: int = 0     # other data for the same version: a replica that measures noise


class SegmentFailed(RuntimeError):
    def __init__(self, label: str, detail: str):
        self.label, self.detail = label, detail
        super().__init__(f"{label}: {detail}")


def _raise_failed(x: "State | SegmentFailed") -> State:
    if isinstance(x, SegmentFailed):
        raise x
    return x


def _replay_reason(r: dict) -> str:
    """Why a replayed diagnostic was not kept, in words."""
    if r.get("error"):
        return r["error"]
    if r["auc"] is None:
        return (f"undecidable over {r['versions']} versions: a diagnostic is kept only once the run has both a "
                "failed version and one that held up to separate")
    return f"AUC {r['auc']} over {r['versions']} versions does not separate failed from held-up ones (needs 0.8)"


def _plain(x):
    """Tuples as lists, so the config copy is plain YAML."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _common_ancestor(trials, a: str, b: str) -> str:
    """The nearest version both `a` and `b` descend from (first parents and crossover mates)."""
    parents = {t.version: t.parents for t in trials if t.version}
    def ancestors(v: str) -> list[str]:
        out, todo = [], [v]
        while todo:
            x = todo.pop(0)
            if x not in out:
                out.append(x)
                todo += parents.get(x, [])
        return out
    of_b = set(ancestors(b))
    return next(v for v in ancestors(a) if v in of_b)
