"""The search's training: a batch of segments (a child and its control, every seed; the root
and its noise replicas) through the segment pipeline (evolve/segments/pipeline.py) as one batch of
jobs, so they share the cores and one evaluator scores them all; and what the search reads
of a trained state (its findings, backtests, its evidence in the run's store).

Child and control use the same segment seed per run seed, so they see the same prompts: the
gain is paired. Each samples with its own stream (trainer.jobs.sampling_seed), so a change with no
effect differs from its control as two runs of one harness do: what the noise replicas measure.
A segment that fails on any seed is a SegmentFailed, a label of its trial, never the run's error.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from evotrainer import jobfiles
from evotrainer.backtest import backtest
from evotrainer.backtest.run import BacktestOutcome
from evotrainer.config import RunConfig
from evotrainer.evaluate.launch import EvaluatorFailed
from evotrainer.evidence import EvidenceStore
from evotrainer.evolve.segments.cache import SegmentCache
from evotrainer.evolve.segments.findings import worst_findings
from evotrainer.evolve.segments.pipeline import Segments, TrainJob, Unloaded
from evotrainer.evolve.segments.progress import Progress
from evotrainer.evolve.segments.state import Clock, ControlFailed, Segment, SegmentFailed, State
from evotrainer.executors import Executor
from evotrainer.labels import Label
from evotrainer.lineage import TrialRecord
from evotrainer.policy.adapters import checkpoint_size
from evotrainer.runtime import Runtime
from evotrainer.tasks.base import Task
from evotrainer.trainer.jobs import handed_draws, segment_seed
from evotrainer.trainer.outputs import read_run_meta


@dataclass(kw_only=True)
class Training:
    cfg: RunConfig
    task: Task
    runtime: Runtime
    base: str                                # the base checkpoint every lineage starts from
    run_dir: Path
    harness_dir: Callable[[str], Path]       # a version's harness checkout
    on_progress: Callable[[Progress], None] | None = None   # hears training steps as they go
    on_stage: Callable[[str], None] | None = None           # hears when scoring starts
    executor: Executor | None = None                        # where jobs run (None: the config's executor)
    cache: SegmentCache | None = None                       # trained segments and scores reused (None: off)
    cancel: threading.Event | None = None                   # set: jobs under way are stopped (Cancelled)

    def __post_init__(self):
        self.pipeline = Segments(task=self.task, base=self.base, runtime=self.runtime, executor=self.jobs,
                                 cache=self.cache, timeout_s=self.cfg.budget.trial_timeout_s,
                                 memory_mb=self.cfg.worker_memory_mb, on_progress=self.on_progress,
                                 cancel=self.cancel)

    @property
    def jobs(self) -> Executor:
        return self.executor or self.cfg.job_executor()

    @property
    def restart(self) -> bool:
        return self.cfg.search.restarts

    @property
    def segment_steps(self) -> int:
        return self.cfg.budget.total_steps if self.restart else self.cfg.budget.steps_per_segment

    def train(self, segments: list[Segment], clock: Clock,
              read: Callable[[Segment, dict[int, str]], None] | None = None) -> list[State | SegmentFailed]:
        """Train every segment on every seed as one batch of jobs, then score them all in one
        evaluator process. A segment whose job failed on any seed, or one of whose checkpoints
        the evaluator could not load, comes back as SegmentFailed; the others as States at
        their depth. `read(segment, dirs)` hears each segment that trained on every seed before
        they are scored, so the caller can start reading their evidence beside the evaluator
        (whose start-up leaves a core idle). The evaluator's own failure is ControlFailed."""
        with self._lock:  # trials in flight train at once: the training spec is written once
            if self._train_spec is None:  # the task without its held-out rows (a JSONL task writes a file: once a run)
                self._train_spec = self.task.train_spec(self.run_dir / "train-data")
        of = [(i, seed) for i, sg in enumerate(segments) for seed in sg.seeds or self.cfg.seeds]
        jobs = [self._job(segments[i], seed) for i, seed in of]
        names = list(dict.fromkeys(sg.out_root.name for sg in segments))  # v1, v0-d2 (a control), replica-1
        title = f"training {', '.join(names)}: {self.segment_steps} steps x {len(jobs) // len(segments)} seeds"
        failed: dict[int, SegmentFailed] = {}
        for (i, seed), why in zip(of, self.pipeline.train(jobs, title, clock)):
            if why is not None:
                failed.setdefault(i, SegmentFailed(why.label, f"seed {seed}: {why.detail}"))
        dirs: dict[int, dict[int, str]] = {i: {} for i in range(len(segments))}
        for (i, seed), job in zip(of, jobs):  # in the seeds' order, trained or reused
            dirs[i][seed] = str(job.out)
            if not clock.checkpoint and i not in failed:
                clock.checkpoint = {**checkpoint_size(job.out / "checkpoint"),
                                    "trainable_params": read_run_meta(job.out).get("trainable_params")}
        if read is not None:
            for i, sg in enumerate(segments):
                if i not in failed:
                    read(sg, dirs[i])
        if self.on_stage is not None:
            self.on_stage(f"the evaluator scores {', '.join(names)} on validation and test")
        scored = [n for n, (i, _) in enumerate(of) if i not in failed]
        try:  # validation: the mean of the last `last_k` checkpoints; test: the final one's
            means, _ = self.pipeline.score([jobs[n] for n in scored], {"val": self.cfg.evaluation.last_k, "test": 1},
                                           clock)
        except EvaluatorFailed as e:
            raise ControlFailed(str(e)) from None
        val: dict[int, dict[int, float]] = {i: {} for i in range(len(segments))}
        test: dict[int, dict[int, float]] = {i: {} for i in range(len(segments))}
        for n, m in zip(scored, means):
            i, seed = of[n]
            if isinstance(m, Unloaded):  # the job's fault (bad_output), never the run's
                failed.setdefault(i, SegmentFailed(Label.BAD_OUTPUT, f"seed {seed}: the evaluator could not load it: "
                                                                     f"{m.error}"))
            else:
                val[i][seed], test[i][seed] = m["val"], m["test"]
        return [failed.get(i) or State(sg.version, sg.depth, dirs[i], val[i], test[i]) for i, sg in enumerate(segments)]

    def _job(self, sg: Segment, seed: int) -> TrainJob:
        """Run seed `seed`'s job of a segment, in SEGMENT_ROOT/seed-S."""
        # paired: every version at a depth sees the same prompts per seed (restart: one depth); a
        # replica the same prompts, sampled with other seeds; an extra pair other prompts
        # (data_offset), shared by its child and control
        seg_seed = segment_seed(seed, 1 if self.restart else sg.depth) + sg.data_offset
        harness = str(self.harness_dir(sg.version))
        return TrainJob(name=f"{sg.out_root.name} s{seed}", train_spec=self._train_spec, level=self.task.target_level,
                        harnesses=(harness,), start=sg.start.checkpoint(seed) if sg.start.dirs else self.base,
                        out=sg.out_root / f"seed-{seed}", seeds=(seg_seed,), steps=self.segment_steps,
                        draws=(handed_draws(self.task, harness, seg_seed, self.segment_steps),),
                        runtime=self.runtime, eval_every=self.cfg.evaluation.every, replica=sg.replica)

    pipeline: Segments = field(init=False, repr=False)  # every batch of jobs goes through it
    _train_spec: str | None = field(default=None, init=False, repr=False)  # the workers' task spec (train)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _ingesting: threading.Thread | None = field(default=None, init=False, repr=False)
    _ingest_error: BaseException | None = field(default=None, init=False, repr=False)

    def findings(self, dirs: dict[int, str], harness_dir: Path) -> list[dict]:
        """A state's findings over its seeds' evidence, as its own harness reads them."""
        return worst_findings(list(dirs.values()), harness_dir)

    def backtest(self, parent: State, candidate: Path, parent_dir: Path) -> BacktestOutcome:
        """The candidate rescores the parent's cached rollouts (its lowest seed's)."""
        return backtest(parent.dirs[min(parent.dirs)], candidate, parent_dir,
                        timeout_s=self.cfg.budget.trial_timeout_s)

    def ingest_later(self, name: str, state: State) -> None:
        """`ingest` in a thread, beside what the controller does next (the last one joined first)."""
        self.join_ingest()

        def work() -> None:
            try:
                self.ingest(name, state)
            except BaseException as e:  # raised in the controller's own thread, at the next join
                self._ingest_error = e
        self._ingesting = threading.Thread(target=work, name=f"ingest {name}")
        self._ingesting.start()

    def join_ingest(self) -> None:
        """Wait for the ingest under way (no timeout: bounded work on local files); raise its error."""
        if self._ingesting is not None:
            self._ingesting.join()
            self._ingesting = None
        if self._ingest_error is not None:
            e, self._ingest_error = self._ingest_error, None
            raise e

    def ingest_missing(self, trials: Sequence[TrialRecord]) -> None:
        """Store the evidence of finished trials that is not in the store yet (a kill came first)."""
        store = EvidenceStore(self.run_dir / "evidence.sqlite")
        try:
            have = set(store.versions())
        finally:
            store.close()
        for t in trials:
            st = t.fitness.state
            if st and t.version and all(jobfiles.exists(d, "evidence.jsonl") for d in st.dirs.values()) \
                    and any(f"{t.version}/seed-{seed}" not in have for seed in st.dirs):
                self.ingest(t.version, st)

    def ingest(self, name: str, state: State) -> None:
        """A state's rollout evidence into the run's evidence store, under `name`/seed-S."""
        store = EvidenceStore(self.run_dir / "evidence.sqlite")
        try:
            for seed, d in state.dirs.items():
                store.ingest(f"{name}/seed-{seed}", Path(d))
        finally:
            store.close()
