"""One attempt at a trial: its plan taken through stages, any of which may end it.

    plan (the agent failed?) -> candidate: commit, legality, this run's backend -> design approval
    -> diagnostic replay (a change to diagnostics.py alone is kept here, untrained)
    -> backtest on the parent's rollouts, and the equivalent-twin check -> backtest approval
    -> train against the control -> promotion gate (gate.gate; an inconclusive but promising
    child trains more seed pairs, one at a time) -> completion approval -> record

A stage returns what the next one needs, or an Outcome that ends the trial; `record` turns
whichever outcome came into the trial's lineage row, so every exit is written one way. At
a gate a person may abort (an outcome like any other) or ask for a revision: approval.Revise
goes up to the controller, which runs the trial again on the agent's next plan.

A Trial works with what the controller gives it (evolve/tools.py: the view of the lineage as
the trial began, the harness repository, the training pool, the human gates, and the few
services it calls back) and keeps only what this attempt has spent.
"""
from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from evotrainer.backtest.run import rest_key, same_signal
from evotrainer.diagnostics.replay import revised_diagnostics
from evotrainer.evolve import approval
from evotrainer.evolve.search import history
from evotrainer.evolve.search.plans import TrialPlan
from evotrainer.evolve.segments.findings import Replayed, replay_revised
from evotrainer.evolve.segments.state import EXTRA_PAIR_DATA, Clock, ControlFailed, Segment, SegmentFailed, State
from evotrainer.evolve.stats.gate import UNBACKED, gate
from evotrainer.evolve.stats.paired import null_differences
from evotrainer.evolve.tools import TrialTools
from evotrainer.harness.versions import PatchError
from evotrainer.labels import Label
from evotrainer.lineage import Decision, Fitness, TrialRecord
from evotrainer.lineage.events import ApprovalWaiting, ControlFinished, PairControlFinished, TrialStarted


@dataclass(frozen=True)
class Screened:
    """What the checks before training found, stored as the trial's `backtest`."""
    diagnostics: tuple[Replayed, ...] = ()   # new or revised diagnostics, replayed
    label: str | None = None                 # the backtest's verdict (passed, skipped, ...); None: it never ran
    reasons: tuple[str, ...] = ()
    signal: str | None = None                # fingerprint of the training signal on the parent's rollouts
    rest: str | None = None                  # key of every other setting (with `signal`: how it would train)
    judged: bool = True                      # False: it passed a change it cannot see (BacktestOutcome.judged)

    def to_json(self) -> dict:
        out = {} if self.label is None else {"label": self.label, "reasons": list(self.reasons)}
        if not self.judged:
            out["judged"] = False
        if self.diagnostics:
            out["diagnostics"] = [r.to_json() for r in self.diagnostics]
        return out if self.rest is None else out | {"signal": self.signal, "rest": self.rest}


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: everything its record needs besides the plan."""
    label: str                               # a Label
    reflection: str                          # why, in words
    patch: str = ""                          # the diff to the parent's harness ("" where none was committed)
    screened: Screened = Screened()
    fitness: Fitness = field(default_factory=Fitness)
    findings: list = field(default_factory=list)
    budgets: dict = field(default_factory=dict)   # training and evaluation spent (the agent's cost is added)
    state: State | None = None               # the state it keeps (stored in the evidence store with the record)
    committed: bool = True                   # False: refused before its version was committed (recorded without one)
    depth: int | None = None                 # its lineage depth where not the parent's + 1 (kept untrained)


class Trial:
    def __init__(self, tools: TrialTools, n: int, plan: TrialPlan):
        self.tools, self.n, self.plan = tools, n, plan
        self.parent, self.version = plan.parent, plan.version
        self.clock, self.started = Clock(), time.time()

    def run(self) -> None:
        # shown, not stored: the store's own trial_started record (begin_trial) carries the plan
        self.tools.show(TrialStarted.of(self.n, self.plan))
        self.record(self.outcome())

    def outcome(self) -> Outcome:
        """The stages in order; the first that ends the trial gives its outcome."""
        if self.plan.failed:  # the agent produced nothing usable: labelled, never run
            return Outcome(self.plan.failed.label, self.plan.failed.reason, committed=False)
        self.stage("commits the change and checks its legality")
        patch = self.candidate()
        if isinstance(patch, Outcome):
            return patch
        again = self.repeat(patch)
        if again is not None:
            return again
        if self.ask("design", patch=patch) == "abort":
            return Outcome(Label.ABORTED, "aborted by a person at the design approval", patch)
        replays = self.replay_diagnostics()
        rejected = [r for r in replays if not r.kept]
        if rejected:  # a diagnostic is kept only if it separates (EvoTrainer)
            return Outcome(Label.DIAGNOSTIC_REJECTED, "; ".join(f"{r.diagnostic}: {r.why_not}" for r in rejected),
                           patch, Screened(tuple(replays)))
        if replays and self.tools.repo.files_changed(self.parent.version, self.version) == ["diagnostics.py"]:
            return self.keep_untrained(patch, replays)
        self.stage(f"backtest: {self.version} rescores {self.parent.version}'s cached rollouts")
        screened = self.backtest(patch, replays)
        if isinstance(screened, Outcome):
            return screened
        if self.ask("backtest", backtest=screened.to_json()) == "abort":
            return Outcome(Label.ABORTED, "aborted by a person at the backtest approval", patch, screened)
        self.stage(f"trains {self.version} beside its control, then the evaluator scores both")
        trained = self.train(patch, screened)
        if isinstance(trained, Outcome):
            return trained
        self.stage("gate: paired gain over the control against the noise floor; blocking findings")
        return self.judge(patch, screened, *trained)

    # ------------------------------------------------------------------ the stages

    def candidate(self) -> str | Outcome:
        """The plan's change committed as the child version and vetted: its patch, or why it never runs."""
        plan = self.plan
        try:
            cand = self.tools.candidate(self.parent.version, self.version, plan.knobs or {}, plan.files or {},
                                        plan.hypothesis)
        except PatchError as e:  # the proposal changes nothing: recorded, never run
            return Outcome(Label.DISCARDED, str(e), committed=False)
        patch = self.tools.repo.diff(self.parent.version, self.version) if cand.version else ""
        return patch if cand.legal else Outcome(Label.ILLEGAL, "; ".join(cand.reasons), patch)

    def repeat(self, patch: str) -> Outcome | None:
        """Restart mode: a candidate with the files of a version that already trained here (a
        move back to the root's reward from a child that changed it, say) would train from the
        base on the same seeds exactly as that version did. Passed over, off the budget."""
        if not self.tools.restart:
            return None
        repo, mine = self.tools.repo, self.tools.repo.tree(self.version)
        for t in self.tools.view.trials:
            trained = not t.parents or (t.fitness.state is not None and t.label != Label.EQUIVALENT)
            if t.version and t.version != self.version and trained and repo.tree(t.version) == mine:
                return Outcome(Label.EQUIVALENT, f"the same harness as {t.version} ({t.intervention or 'the root'}), "
                               "which trained from the base on these seeds; not trained again", patch)
        return None

    def replay_diagnostics(self) -> list[Replayed]:
        """Each diagnostic the candidate adds or revises, replayed over this run's judged versions."""
        here = self.tools.harness_dir
        revised = revised_diagnostics(here(self.parent.version), here(self.version))
        return replay_revised(revised, self.tools.view.trials, here(self.version),
                              self.tools.cfg.budget.trial_timeout_s) if revised else []

    def keep_untrained(self, patch: str, replays: list[Replayed]) -> Outcome:
        """What the harness reads changed, not how it trains: kept on its replay alone, on the
        parent's checkpoints, so the next proposals from it read the new diagnostic."""
        screened = Screened(tuple(replays))
        if self.ask("completion", label=Label.KEPT, diagnostics=[r.to_json() for r in replays]) == "abort":
            return Outcome(Label.ABORTED, "aborted by a person at the completion approval", patch, screened)
        state = dataclasses.replace(self.parent, version=self.version)
        why = "; ".join(f"{r.diagnostic} separates failed from held-up versions (AUC {r.auc})" for r in replays)
        return Outcome(Label.KEPT, why + "; kept without training", patch, screened, fitness=Fitness.measured(state),
                       findings=self.tools.findings(state), state=state, depth=self.parent.depth)

    def backtest(self, patch: str, replays: list[Replayed]) -> Screened | Outcome:
        """The candidate rescores the parent's rollouts before any training: a failure ends the
        trial, and so does an earlier sibling that would train alike (equivalent)."""
        if not self.tools.run_backtests:
            return Screened(tuple(replays), "skipped")
        here = self.tools.harness_dir
        bt = self.tools.training.backtest(self.parent, here(self.version), here(self.parent.version))
        if not bt.passed:
            return Outcome(bt.label, "; ".join(bt.reasons), patch, Screened(label=bt.label, reasons=tuple(bt.reasons)))
        screened = Screened(tuple(replays), bt.label, tuple(bt.reasons), bt.signal, rest_key(here(self.version)),
                            bt.judged)
        twin = self.twin(screened)
        if twin is not None:
            where = "the parent's rollouts and the twin's own recorded training" if twin.fitness.state is not None \
                else "the parent's rollouts"
            return Outcome(Label.EQUIVALENT, f"trains like {twin.version} ({twin.intervention}): the same rewards, "
                           f"filter and advantages on {where}, and every other setting equal; not trained",
                           patch, screened)
        return screened

    def twin(self, screened: Screened) -> TrialRecord | None:
        """An earlier child of the parent's harness that trained (or tried to) and would train
        like this candidate: the same rest key, the same signal fingerprint on this parent's
        evidence (its own, if it branched from this very state; else rescored here), and, where
        it trained, the same signal as its own harness on every rollout its training sampled.

        The last is what makes "trains like" hold beyond the parent's policy: a reward that
        differs only on answers the parent never wrote (partial credit where every parent
        rollout was all right or all wrong) shows there, if the twin's policy wrote them.
        Given equal signals on every rollout a training sampled, the candidate would train step
        for step as the twin did on the twin's draws. Its own runs would be other draws (the
        sampling seed follows the harness's content: trainer/jobs.sampling_seed), where the two
        could still differ on an answer neither training wrote: alike is evidence, not proof."""
        plans, here, timeout = self.tools.view.plans, self.tools.harness_dir, self.tools.cfg.budget.trial_timeout_s
        for t in self.tools.view.trials:
            if t.parents[:1] != [self.parent.version] or t.backtest.get("rest") != screened.rest \
                    or t.label in (Label.EQUIVALENT, Label.ILLEGAL, Label.BACKTEST_REJECTED):
                continue
            if t.id in plans and plans[t.id].parent.key == self.parent.key:
                signal = t.backtest.get("signal")
            else:
                signal = self.tools.training.backtest(self.parent, here(t.version), here(self.parent.version)).signal
            # where it trained, also the rollouts its own training sampled on the run's seeds
            # (none recorded: it crashed, timed out or ran out of memory; the parent's evidence decides)
            own = t.fitness.dirs.values()
            if signal and signal == screened.signal and \
                    same_signal(own, here(self.version), here(t.version), here(self.parent.version), timeout):
                return t
        return None

    def train(self, patch: str, screened: Screened) -> tuple[State, State] | Outcome:
        """(control, child) trained, or how the child's training failed."""
        control, child = self.against_control()
        if isinstance(child, SegmentFailed):
            return Outcome(child.label, child.detail, patch, screened, budgets=self.clock.budgets())
        return control, child

    def against_control(self) -> tuple[State, State | SegmentFailed]:
        """Train the child and, where not trained yet, its control. Continue mode: the control is
        the parent continued one segment with its own harness, shared by every child of that
        parent. Restart mode: the control is the parent itself, and the child starts at the base."""
        tools, parent, depth = self.tools, self.parent, self.parent.depth + 1
        start = State(parent.version, 0, {}, {}, {}) if tools.restart else parent
        child_seg = Segment(self.version, start, depth, tools.run_dir / "versions" / self.version)
        if tools.restart:
            (child,) = tools.training.train([child_seg], self.clock, read=self.read)
            return parent, child
        done = tools.view.control(parent.version, depth)
        if done is not None:  # a sibling trained it
            (child,) = tools.training.train([child_seg], self.clock, read=self.read)
            return done, child
        control_seg = Segment(parent.version, parent, depth, tools.run_dir / "controls" / f"{parent.version}-d{depth}")
        if tools.cfg.search.concurrency > 1:  # a sibling in flight may need it too: trained once, beside the child
            return self.beside_shared(child_seg, ("control", parent.version, depth),
                                      lambda clock: self.control(control_seg, clock))
        child, control = tools.training.train([child_seg, control_seg], self.clock, read=self.read)
        return self.recorded_control(control), child

    def control(self, control_seg: Segment, clock: Clock) -> State:
        (control,) = self.tools.training.train([control_seg], clock, read=self.read)
        return self.recorded_control(control)

    def recorded_control(self, control: State | SegmentFailed) -> State:
        if isinstance(control, SegmentFailed):
            raise ControlFailed(f"the control of {self.parent.version} failed: {control}") from None
        self.tools.training.ingest(f"{self.parent.version}-d{control.depth}", control)
        self.tools.record(ControlFinished(control))
        return control

    def beside_shared(self, child_seg: Segment, key: tuple, make: Callable[[Clock], object]) -> tuple:
        """(shared, child): the child trains here while `make(clock)` (a control that siblings in
        flight share, `tools.once`) runs in a thread; the run's shared pool runs both at once.
        The trial that trained the shared part counts its steps and segments (not its seconds:
        they ran beside the child's)."""
        def made() -> tuple:
            clock = Clock()
            return make(clock), clock, self.n
        with ThreadPoolExecutor(1, thread_name_prefix="control") as ex:
            shared = ex.submit(self.tools.once, key, made)
            (child,) = self.tools.training.train([child_seg], self.clock,
                                                 read=self.read if child_seg.data_offset == 0 else None)
            value, clock, maker = shared.result()
        if maker == self.n:
            self.clock.steps += clock.steps
            self.clock.trained += clock.trained
            self.clock.reused += clock.reused
        return value, child

    def extra_pair(self, k: int) -> tuple[float, float] | Outcome:
        """The k-th extra seed pair of a sequential gate: the child and its control (the parent's
        harness, as for the run's seeds) on problems no other pair saw, started where the run's
        seed (k-1) mod n started. The control's pair is shared by every child of the parent at
        this depth. Returns (child, control) validation fitness, or how the child failed."""
        tools, parent, depth = self.tools, self.parent, self.parent.depth + 1
        seed = tools.cfg.seeds[(k - 1) % len(tools.cfg.seeds)]
        start = State(parent.version, 0, {}, {}, {}) if tools.restart else parent
        pairs, offset = tools.run_dir / "pairs", EXTRA_PAIR_DATA + k

        def segment(version: str, name: str) -> Segment:
            return Segment(version, start, depth, pairs / name, data_offset=offset, seeds=(seed,))
        child_seg = segment(self.version, f"{self.version}-p{k}")
        control_val = tools.view.pair_control(parent.version, depth, k)
        control_seg = segment(parent.version, f"{parent.version}-d{depth}-p{k}")

        def pair_control(control) -> float:
            if isinstance(control, SegmentFailed):
                raise ControlFailed(f"the control of {parent.version}, extra pair {k}, failed: {control}") from None
            tools.record(PairControlFinished(parent.version, depth, k, control.val[seed]))
            return control.val[seed]
        if control_val is not None:  # a sibling trained it
            (child,) = tools.training.train([child_seg], self.clock)
        elif tools.cfg.search.concurrency > 1:  # a sibling in flight may need it too
            control_val, child = self.beside_shared(child_seg, ("pair", parent.version, depth, k),
                                                    lambda clock: pair_control(tools.training.train([control_seg], clock)[0]))
        else:
            child, control = tools.training.train([child_seg, control_seg], self.clock)
            control_val = pair_control(control)
        if isinstance(child, SegmentFailed):
            return Outcome(child.label, f"extra seed pair {k}: {child.detail}", budgets=self.clock.budgets())
        return child.val[seed], control_val

    def read(self, segment: Segment, dirs: dict[int, str]) -> None:
        """A trained segment's findings, read while it is scored (the gate and the next proposal
        read them)."""
        self.tools.read_later(segment.version, dirs)

    def judge(self, patch: str, screened: Screened, control: State, child: State) -> Outcome:
        """The promotion gate (paired gain over the control beyond the noise floor, no blocking
        finding), then a person at the completion approval where there is one: an abort there is
        measured and recorded, never kept."""
        findings = self.tools.findings(child)
        said = {f["diagnostic"]: f"{f['diagnostic']} = {f['value']:g}" for f in findings if f["blocking"]}
        blocking = [s for name, s in said.items() if name not in UNBACKED]  # invalid at once
        unbacked = [s for name, s in said.items() if name in UNBACKED]      # unless validation refutes them
        null, extra = self._null(), []
        while (decision := gate(child.val, control.val, blocking, unbacked=unbacked,
                                cfg=self.tools.cfg.promotion, null=null, extra=extra)).more:
            self.stage(f"gate: {decision.reasons[0]}")
            pair = self.extra_pair(len(extra) + 1)
            if isinstance(pair, Outcome):
                return dataclasses.replace(pair, patch=patch, screened=screened)
            extra.append(pair)
        fitness = Fitness.measured(child, Decision(decision.gain, decision.se, decision.threshold, decision.rule,
                                                   control.val, tuple(extra)))
        judged = Outcome(decision.label, "; ".join(decision.reasons), patch, screened, fitness, findings,
                         self.clock.budgets(), state=child)
        if self.ask("completion", label=decision.label, gain=decision.gain, val=child.val,
                    control_val=control.val) == "abort":
            return dataclasses.replace(judged, label=Label.ABORTED, state=None, reflection=(
                f"aborted by a person at the completion approval (the gate said {decision.label})"))
        return judged

    def record(self, o: Outcome) -> None:
        """The outcome as the trial's lineage row (with what proposing cost, every round)."""
        plan = self.plan
        usage = {"agent": plan.usage} if plan.usage else {}
        self.tools.finish(TrialRecord(
            id=self.n, version=self.version if o.committed else None, parents=plan.parents, agent=plan.agent,
            intervention=plan.intervention, depth=self.parent.depth + 1 if o.depth is None else o.depth,
            hypothesis=plan.hypothesis, success_criterion=plan.success_criterion, patch=o.patch, label=o.label,
            backtest=o.screened.to_json(), budgets=o.budgets | usage, fitness=o.fitness, findings=o.findings,
            reflection=o.reflection, started=self.started, finished=time.time()), o.state)

    # ------------------------------------------------------------------ helpers

    def stage(self, what: str) -> None:
        self.tools.stage(f"trial {self.n} {self.version} [{self.plan.intervention}]: {what}")

    def ask(self, point: str, **shown) -> str:
        """'approve' at once where this point is not gated; else a person's 'approve' or 'abort'
        (approval.Revise is raised for a revision)."""
        tools = self.tools
        streak = len(history.failures_in_a_row(tools.view.trials))
        if point not in approval.points(tools.cfg.approval, streak):
            return "approve"
        d = tools.ask(ApprovalWaiting(self.n, point, self.plan.round or 0, self.plan.intervention, self.plan.hypothesis,
                                shown))
        if d.decision == "revise":
            raise approval.Revise(d.feedback)
        return d.decision

    def _null(self) -> list[float]:
        """The null the root trial measured: its noise replicas minus itself, seed by seed."""
        root = self.tools.view.root
        return null_differences(root.fitness.val, root.fitness.replicas)
