"""One pipeline for every training job: the search's segments (a child, its control, the noise
replicas) and the schedules the final comparison and the benchmarks retrain from the base.

A job (`TrainJob`) is a schedule: segments in a row, each from the last one's checkpoint. A
search segment is a schedule of length one, written in its directory itself (OUT); a retrained
schedule writes OUT/segment-1, segment-2, ... The job is a frozen record on the trusted side and
becomes a worker's arguments only where its Call is made (`TrainJob.call`).

`Segments` takes a batch of jobs through: cache keys (segment_cache.chain_inputs) -> each job
materialised from the segment cache, or a Call -> one executor run, its progress watched ->
what each job wrote vetted (trainer/outputs.refused) and stored in the cache -> the last
checkpoints of each job's last segment scored by one evaluator process (cached_scores) -> each
job's mean per split. With the cache, the jobs that train have the threads they would have had
in the whole batch (Executor.part_of), so the numbers are the same with it or without it.

What a failure means (a trial's label, or a retraining's error), how seeds and data are chosen
and what comes back are the callers' (evolve/segments/training.py, evolve/segments/retrain.py).
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Sequence

from evotrainer.evaluate.launch import run_evaluator
from evotrainer.evolve.segments.cache import (
    SegmentCache,
    SegmentInputs,
    cached_scores,
    chain_inputs,
    checkpoint_identity,
    draws_digest,
    name_train_spec,
    numbers,
    score_inputs,
    segment_key,
    start_identity,
    task_identity,
    tree_digest,
)
from evotrainer.evolve.segments.progress import Job, Progress, Watcher
from evotrainer.evolve.segments.state import Clock, SegmentFailed
from evotrainer.executors import Call, Executor, LocalPool, WorkerResult
from evotrainer.labels import Label
from evotrainer.runtime import Runtime
from evotrainer.tasks import Task
from evotrainer.tasks.spec import spec_files
from evotrainer.trainer.jobs import train_schedule, train_segment
from evotrainer.trainer.outputs import keep_log, refused, scheduled_checkpoints


class Cancelled(RuntimeError):
    """The run stopped (an error in another trial in flight, an interrupt): this trial's jobs were
    stopped, and the trial is redone on resume."""


@dataclass(frozen=True)
class TrainJob:
    """One training job: `harnesses` trained in a row from `start`, `steps` each."""
    name: str                    # what the progress shows: "v1 s0", "evolved seed 100"
    train_spec: str              # the worker's task: the task's view without held-out rows
    level: int | None
    harnesses: tuple[str, ...]   # a harness directory per segment
    start: str                   # the first segment's start checkpoint: the run's base or a parent's
    out: Path                    # everything the job writes (cleaned when it starts)
    seeds: tuple[int, ...]       # a segment seed per segment (trainer.jobs.segment_seed, data offset in)
    draws: tuple[dict, ...]      # the training problems handed to each segment (trainer.jobs.handed_draws)
    steps: int                   # each segment's
    runtime: Runtime
    eval_every: int              # the run's checkpoint schedule
    replica: int = 0             # > 0: the same problems sampled with other seeds (the gate's null)
    nested: bool = False         # its segments in OUT/segment-D (a retrained schedule), not in OUT itself

    @property
    def dirs(self) -> tuple[Path, ...]:
        """Each segment's train directory, first to last."""
        if not self.nested:
            return (self.out,)
        return tuple(self.out / f"segment-{d}" for d in range(1, len(self.harnesses) + 1))

    def call(self) -> Call:
        """The worker's call: the one place where the job becomes plain arguments."""
        where = dict(writes=(str(self.out),), clean=True,  # a job killed mid-way is redone from a clean directory
                     reads=(*self.harnesses, *spec_files(self.train_spec), self.start, *self.runtime.policy.reads()))
        args = dict(task=self.train_spec, level=self.level, base=self.start, out=str(self.out), steps=self.steps,
                    runtime=self.runtime.to_dict(), eval_every=self.eval_every, replica=self.replica)
        if self.nested:
            return Call(train_schedule, args | dict(harnesses=list(self.harnesses), seeds=list(self.seeds),
                                                    draws=list(self.draws)), **where)
        (harness,), (seed,), (draws,) = self.harnesses, self.seeds, self.draws
        return Call(train_segment, args | dict(harness=harness, seed=seed, draws=draws), **where)


class Unloaded(NamedTuple):
    """A checkpoint of a job's that the evaluator could not load: the job's fault, not the run's."""
    checkpoint: str
    error: str


@dataclass(kw_only=True)
class Segments:
    """The pipeline for one task and base on one executor: a run's, or one retraining's. The
    base's and the task's identities are read once (a digest of every file of the base)."""
    task: Task
    base: str                    # every lineage's start, whose weights' shapes every checkpoint must have
    runtime: Runtime             # what the evaluator loads checkpoints with
    executor: Executor
    cache: SegmentCache | None   # trained segments and scores reused (None: off)
    timeout_s: float             # each segment's
    memory_mb: int | None
    on_progress: Callable[[Progress], None] | None = None  # hears training steps as they go
    cancel: threading.Event | None = None                  # set: the jobs under way are stopped (Cancelled)

    def train(self, jobs: Sequence[TrainJob], title: str, clock: Clock) -> list[SegmentFailed | None]:
        """Every job trained, or materialised from the cache; per job None, or why it failed.
        A failure is never cached: a crash, a timeout or what the trusted side refuses to read
        (trainer/outputs.py) is no outcome of a segment."""
        keys = [[segment_key(i) for i in self.inputs(job, len(jobs))] for job in jobs]
        todo = [n for n, job in enumerate(jobs) if not self._reuse(job, keys[n])]
        longest = max((len(job.harnesses) for job in jobs), default=1)
        results = self._run([jobs[n] for n in todo], len(jobs), longest, title, clock) if todo else []
        failed: list[SegmentFailed | None] = [None] * len(jobs)
        for n, res in zip(todo, results):
            failed[n] = self._vet(jobs[n], res)
            if failed[n] is None:
                self._store(keys[n], jobs[n].dirs)
        trained = sum(len(jobs[n].harnesses) for n in todo)
        clock.steps += sum(jobs[n].steps * len(jobs[n].harnesses) for n in todo)
        clock.trained += trained
        clock.reused += sum(len(job.harnesses) for job in jobs) - trained
        return failed

    def score(self, jobs: Sequence[TrainJob], last: Mapping[str, int], clock: Clock,
              also: Sequence[str] = ()) -> tuple[list[dict[str, float] | Unloaded], dict[str, dict]]:
        """Per job its mean accuracy per split over the last `last[split]` checkpoints of its last
        segment (the run's schedule names them: only those are scored, earlier ones would cost
        evaluator time no decision reads), or the first of them that did not load; and every
        scored checkpoint's accuracies, `also` (on every split) first."""
        k = max(last.values())
        tails = [[str(c) for c in scheduled_checkpoints(job.dirs[-1], job.steps, job.eval_every)[-k:]] for job in jobs]
        asked = {c: list(last) for c in also}
        for cs in tails:
            asked |= {c: [s for s, n in last.items() if i >= len(cs) - n] for i, c in enumerate(cs)}
        acc = self._scores(asked, clock) if asked else {}
        out = []
        for cs in tails:
            bad = next((Unloaded(c, acc[c]["error"]) for c in cs if "error" in acc[c]), None)
            out.append(bad or {s: sum(acc[c][s] for c in cs[-n:]) / len(cs[-n:]) for s, n in last.items()})
        return out, acc

    def inputs(self, job: TrainJob, batch: int) -> list[SegmentInputs]:
        """What each segment of `job`, one of a batch of `batch` jobs, depends on: its cache key's
        inputs (none with the cache off)."""
        if self.cache is None:
            return []
        # the base is hashed once; a parent's checkpoint is named by its entry's key, else read as a job's files
        start = self._base_id if job.start == self.base else start_identity(Path(job.start), job=True)
        return chain_inputs(start, [tree_digest(Path(h)) for h in job.harnesses], list(job.seeds),
                            [draws_digest(d) for d in job.draws], replica=job.replica, steps=job.steps,
                            task=self._task_id, level=job.level, eval_every=job.eval_every,
                            runtime=numbers(job.runtime, self._local, self.executor.threads(batch)))

    @functools.cached_property
    def _base_id(self) -> str:
        return start_identity(Path(self.base))

    @functools.cached_property
    def _task_id(self) -> str:  # the data files are hashed once
        return task_identity(self.task.spec, self.task.data_files())

    @property
    def _local(self) -> bool:
        return isinstance(self.executor, LocalPool)

    def _reuse(self, job: TrainJob, keys: list[str]) -> bool:
        """Whether every segment of `job` was materialised from the cache: its log says so, and each
        run.json names this run's train spec."""
        if not keys or not all(self.cache.lookup(k) for k in keys) or \
                not all(self.cache.materialise(k, d) for k, d in zip(keys, job.dirs)):
            return False
        keep_log(job.out, f"reused from the segment cache: {', '.join(str(self.cache.entry(k)) for k in keys)}\n")
        for d in job.dirs:
            name_train_spec(d, job.train_spec)
        return True

    def _run(self, jobs: list[TrainJob], batch: int, longest: int, title: str, clock: Clock) -> list[WorkerResult]:
        """The jobs on the executor (a local pool: `workers` at once), each with the threads it has
        in the whole batch of `batch` (the rest reused), and `timeout_s` for each segment of the
        batch's longest schedule."""
        watch = Watcher(title, [Job(j.name, j.out, j.steps * len(j.harnesses)) for j in jobs], self.on_progress) \
            if self.on_progress else None

        def poll() -> None:  # the caller's thread, while the jobs run: a cancel stops them (run_all kills them)
            if self.cancel is not None and self.cancel.is_set():
                raise Cancelled("the run stopped while this trial trained")
            if watch is not None:
                watch()
        t = time.time()
        results = self.executor.part_of(batch).run([j.call() for j in jobs], self.timeout_s * longest,
                                                   self.memory_mb, poll)
        clock.train_s += time.time() - t
        if watch is not None:
            watch.flush()
        return results

    def _vet(self, job: TrainJob, res: WorkerResult) -> SegmentFailed | None:
        """Why what a finished job left is no outcome, if it is none; its log kept beside it."""
        keep_log(job.out, res.log_tail)
        if not res.ok:
            return SegmentFailed(res.label, res.error)
        why = refused(job.out, job.steps, job.eval_every, self.base, segments=len(job.dirs) if job.nested else 0)
        return SegmentFailed(Label.BAD_OUTPUT, why) if why else None

    def _store(self, keys: list[str], dirs: tuple[Path, ...]) -> None:
        for k, d in zip(keys, dirs):  # each from the last: stored while the last is the entry exactly
            self.cache.store(k, d)
            if not checkpoint_identity(d / "checkpoint"):
                break

    def _scores(self, asked: dict[str, list[str]], clock: Clock) -> dict[str, dict]:
        """Accuracy per checkpoint and split: from the cache where a checkpoint of a cache entry
        (or the base) was scored before on every split asked, from the evaluator otherwise."""
        inputs = score_inputs(self.task, self._task_id, self.runtime, self._local, self.executor.threads(1)) \
            if self.cache else None
        return cached_scores(self.cache, asked, self._identity, inputs, lambda todo: self._evaluate(todo, clock))

    def _identity(self, checkpoint: str) -> str | None:
        return self._base_id if checkpoint == self.base else checkpoint_identity(Path(checkpoint))

    def _evaluate(self, todo: dict[str, list[str]], clock: Clock) -> dict[str, dict]:
        t = time.time()
        try:
            return run_evaluator(self.task, todo, self.timeout_s, runtime=self.runtime, memory_mb=self.memory_mb,
                                 executor=self.executor)
        finally:
            clock.eval_s += time.time() - t
