"""The run's record as it grows: every event goes into the lineage before anything relies on
it, and is shown as it happens; a finished trial goes into the store, the skill library and the
trackers, one trial at a time. Reading the lineage back (`look`) lives here too: a view is
what was recorded.
"""
from __future__ import annotations

import threading
from pathlib import Path

from evotrainer.config import RunConfig
from evotrainer.evolve.notices import OnEvent, Stage, ignore
from evotrainer.evolve.search import history
from evotrainer.evolve.search.plans import TrialPlan
from evotrainer.evolve.search.view import RunView
from evotrainer.evolve.segments.progress import seed_metrics
from evotrainer.labels import AGENT_FAILED, Label
from evotrainer.lineage import LineageStore, TrialRecord
from evotrainer.lineage.events import Event, FinalFinished, RunStarted, TrackerFailed
from evotrainer.skills import SkillLibrary
from evotrainer.trackers import TrackerSet, open_trackers, trial_row


def learn(lib: SkillLibrary, run_dir: Path, cfg: RunConfig, *, level: int, reference_acc: float | None,
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


class Recorder:
    """The lineage store, what is shown live (`on_event`) and where finished trials go.
    `level` is the task's target level, the condition skill outcomes are recorded under."""

    def __init__(self, cfg: RunConfig, run_dir: Path, on_event: OnEvent | None = None, *, level: int):
        self.cfg, self.run_dir, self.level = cfg, run_dir, level
        self.show: OnEvent = on_event or ignore
        run_dir.mkdir(parents=True, exist_ok=True)
        self.store = LineageStore(run_dir / "lineage.sqlite")
        self.view = RunView((), ())  # the lineage as the current trial began (`look`)
        self.trackers = TrackerSet([], self.tracker_failed)  # opened by `open_trackers`
        self.lock = threading.RLock()  # trials in flight finish one at a time: store, skills, trackers in order

    def look(self) -> RunView:
        """Read the lineage once: what the next decisions, and the trial they start, read."""
        self.view = RunView.read(self.store)
        return self.view

    def record(self, ev: Event) -> None:
        """An event into the lineage, and shown (`store.append` records one without showing it)."""
        self.store.append(ev)
        self.show(ev)

    def stage(self, text: str) -> None:
        """What the run does now (shown live, never stored: the lineage records outcomes)."""
        self.show(Stage(text))

    def finish(self, rec: TrialRecord, trial_plan: TrialPlan | None = None) -> None:
        """A finished trial: its row, its skill outcome (an agent's trial, with its plan), shown,
        and to the trackers."""
        with self.lock:
            self.store.finish_trial(rec)
            if rec.parents and trial_plan is not None:
                self.learn([(rec, trial_plan)])
            self.show(rec)
            self._track(rec)

    def learn(self, done: list[tuple[TrialRecord, TrialPlan]]) -> None:
        """Finished agent trials' outcomes into the skill library, each with the plan it ran,
        under the run's id. Idempotent per run and trial, so a resume records what a kill cut
        off, once."""
        if not self.cfg.search.skills:
            return
        lib = SkillLibrary(self.cfg.search.skills)
        try:
            learn(lib, self.run_dir, self.cfg, level=self.level, reference_acc=self.view.reference_acc, done=done,
                  run=run_key(self.run_dir, self.store.events(RunStarted)[0]))
        finally:
            lib.close()

    def open_trackers(self) -> None:
        """The config's trackers, opened where `close` ends them (a W&B run left open is a run
        never finished)."""
        self.trackers = open_trackers(self.cfg.tracking, self.run_dir, self.run_dir.name, self.tracker_failed)

    def close(self) -> None:
        self.trackers.close()

    def final(self, result: FinalFinished) -> None:
        """The final comparison's training steps and its table to the trackers."""
        for arm in ("reference", "evolved"):
            seeds = (d for d in (self.run_dir / "final" / arm).glob("seed-*") if d.is_dir())  # not seed-S.log
            for d in sorted(seeds):
                self.trackers.steps(f"final/{arm}/{d.name}", seed_metrics(d))
        self.trackers.final(result.to_json(), result.table)

    def _track(self, rec: TrialRecord) -> None:
        """A finished trial to the run's trackers: its training jobs' steps, its outcome."""
        if not self.trackers.trackers:
            return
        for seed, d in sorted(rec.fitness.dirs.items()):
            self.trackers.steps(f"{rec.version}/seed-{seed}", seed_metrics(Path(d)))
        trials = sorted([t for t in self.view.trials if t.id != rec.id] + [rec], key=lambda t: t.id)
        self.trackers.trial(trial_row(rec), [trial_row(t) for t in trials])

    def tracker_failed(self, name: str, why: str) -> None:
        self.record(TrackerFailed(name, why))
