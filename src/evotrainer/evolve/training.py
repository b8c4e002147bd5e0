"""Training and scoring segments: one pool of worker processes, then one evaluator process.

Every training job of a step (a child and its control, every seed; the root and its noise
replicas) runs in one pool, so they share the cores, and one evaluator scores them all.
Child and control use the same segment seed per run seed, so they see the same prompts: the
gain is paired. Each samples with its own stream (trainer.jobs.sampling_seed), so a change with no
effect differs from its control as two runs of one harness do: what the noise replicas measure.

With a segment cache (evolve/segment_cache.py) a segment trained before, in this run or any
run sharing the cache, is materialised instead of trained, and a checkpoint scored before is
not scored again; the rest of the batch trains with the threads it would have had whole, so
the numbers are the same with the cache or without it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from evotrainer import jobfiles
from evotrainer.backtest import backtest
from evotrainer.backtest.run import BacktestOutcome
from evotrainer.config import RunConfig
from evotrainer.evidence import EvidenceStore
from evotrainer.evolve.diagnosis import worst_findings
from evotrainer.evolve.progress import Job, Progress, Watcher
from evotrainer.evolve.retrain import RetrainFailed, evaluate
from evotrainer.evolve.segment_cache import (SegmentCache, SegmentInputs, cached_scores, checkpoint_identity,
                                             draws_digest, name_train_spec, numbers, score_inputs, segment_key,
                                             start_identity, task_identity, tree_digest)
from evotrainer.evolve.state import Clock, ControlFailed, Segment, SegmentFailed, State
from evotrainer.evolve.stats import average_last
from evotrainer.executors import Call, Executor, LocalPool
from evotrainer.labels import Label
from evotrainer.lineage import TrialRecord
from evotrainer.policy.adapters import checkpoint_size
from evotrainer.runtime import Runtime
from evotrainer.tasks.base import Task
from evotrainer.trainer.jobs import handed_draws, segment_seed, train_segment
from evotrainer.trainer.outputs import keep_log, read_run_meta, refused, scheduled_checkpoints


class Cancelled(RuntimeError):
    """The run stopped (an error in another trial in flight, an interrupt): this trial's jobs were
    stopped, and the trial is redone on resume."""


@dataclass
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
        """Train every segment on every seed in one pool of workers, then evaluate them all in
        one evaluator process. A segment whose worker failed on any seed comes back as
        SegmentFailed; the others as States at their depth. `read(segment, dirs)` hears each
        segment that trained on every seed before they are scored, so the caller can start
        reading their evidence beside the evaluator (whose start-up leaves a core idle)."""
        with self._lock:  # trials in flight train at once: the training spec is written once
            if self._train_spec is None:  # the task without its held-out rows (a JSONL task writes a file: once a run)
                self._train_spec = self.task.train_spec(self.run_dir / "train-data")
        train_spec = self._train_spec
        jobs = []  # (segment index, seed, out, train_segment's arguments)
        for i, sg in enumerate(segments):
            for seed in sg.seeds or self.cfg.seeds:
                out = sg.out_root / f"seed-{seed}"
                # paired: every version at a depth sees the same prompts per seed (restart: one
                # depth); a replica the same prompts, sampled with other seeds; an extra pair
                # other prompts (data_offset), shared by its child and control
                seg_seed = segment_seed(seed, 1 if self.restart else sg.depth) + sg.data_offset
                harness = str(self.harness_dir(sg.version))
                jobs.append((i, seed, out, dict(
                    task=train_spec, level=self.task.target_level, runtime=self.runtime.to_dict(), harness=harness,
                    base=sg.start.checkpoint(seed) if sg.start.dirs else self.base, out=str(out),
                    seed=seg_seed, steps=self.segment_steps,
                    draws=handed_draws(self.task, harness, seg_seed, self.segment_steps),
                    eval_every=self.cfg.evaluation.every, replica=sg.replica)))
        calls, where = [], []  # what trains; each job's key (None: the cache is off)
        keys = [self._key(args, len(jobs)) if self.cache else None for *_, args in jobs]
        for (i, seed, out, args), key in zip(jobs, keys):
            if key is not None and self.cache.materialise(key, out):
                self._reused(out, key, train_spec)
                continue
            calls.append(Call(train_segment, args, writes=(str(out),), clean=True,  # a resumed segment starts clean
                              reads=(args["harness"], *self.task.files(train_spec), args["base"],
                                     *self.runtime.policy.reads())))
            where.append((i, seed, out, key))
        names = list(dict.fromkeys(sg.out_root.name for sg in segments))  # v1, v0-d2 (a control), replica-1
        watch = Watcher(
            f"training {', '.join(names)}: {self.segment_steps} steps x {len(jobs) // len(segments)} seeds",
            [Job(f"{segments[i].out_root.name} s{seed}", out, self.segment_steps) for i, seed, out, _ in where],
            self.on_progress) if self.on_progress and calls else None
        results = self._pool(calls, clock, watch, len(jobs)) if calls else []
        if watch is not None:
            watch.flush()
        clock.steps += self.segment_steps * len(calls)
        clock.trained, clock.reused = clock.trained + len(calls), clock.reused + len(jobs) - len(calls)
        failed: dict[int, SegmentFailed] = {}
        for (i, seed, out, key), res in zip(where, results):
            keep_log(out, res.log_tail)
            if not res.ok:  # never cached: a crash or a timeout is no outcome of the segment
                failed.setdefault(i, SegmentFailed(res.label, f"seed {seed}: {res.error}"))
            elif why := refused(out, self.segment_steps, self.cfg.evaluation.every, self.base):
                # nor is what the trusted side refuses to read (trainer/outputs.py)
                failed.setdefault(i, SegmentFailed(Label.BAD_OUTPUT, f"seed {seed}: {why}"))
            elif key is not None:
                self.cache.store(key, out)
        dirs: dict[int, dict[int, str]] = {i: {} for i in range(len(segments))}
        for i, seed, out, _ in jobs:  # in the seeds' order, trained or reused
            dirs[i][seed] = str(out)
            if not clock.checkpoint and i not in failed:
                clock.checkpoint = {**checkpoint_size(out / "checkpoint"),
                                    "trainable_params": read_run_meta(out).get("trainable_params")}
        if read is not None:
            for i, sg in enumerate(segments):
                if i not in failed:
                    read(sg, dirs[i])
        if self.on_stage is not None:
            self.on_stage(f"the evaluator scores {', '.join(names)} on validation and test")
        scores = self._evaluate({i: dirs[i] for i in range(len(segments)) if i not in failed}, clock)
        return [failed.get(i) or (scores[i] if isinstance(scores[i], SegmentFailed)
                                  else State(sg.version, sg.depth, dirs[i], *scores[i]))
                for i, sg in enumerate(segments)]

    _train_spec: str | None = field(default=None, init=False, repr=False)  # the workers' task spec (train)
    _base_id: str | None = field(default=None, init=False, repr=False)  # the base's digest, once a run
    _task_id: str | None = field(default=None, init=False, repr=False)  # the task's identity, once a run
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _ingesting: threading.Thread | None = field(default=None, init=False, repr=False)
    _ingest_error: BaseException | None = field(default=None, init=False, repr=False)

    def _key(self, args: dict, batch: int) -> str:
        """The cache key of a train_segment call that is one of a batch of `batch` jobs."""
        if args["base"] == self.base:
            self._base_id = self._base_id or start_identity(Path(self.base))
            start = self._base_id
        else:
            start = start_identity(Path(args["base"]), job=True)  # a parent's checkpoint: a job wrote it
        return segment_key(SegmentInputs(
            start=start, harness=tree_digest(Path(args["harness"])), seed=args["seed"], replica=args["replica"],
            steps=args["steps"], task=self._task_identity(), level=args["level"], draws=draws_digest(args["draws"]),
            runtime=numbers(self.runtime, self._local, self.jobs.threads(batch)), eval_every=args["eval_every"]))

    def _task_identity(self) -> str:
        if self._task_id is None:  # the data files are hashed once a run
            self._task_id = task_identity(self.task.spec, self.task.data_files())
        return self._task_id

    @property
    def _local(self) -> bool:
        return isinstance(self.jobs, LocalPool)

    def _reused(self, out: Path, key: str, train_spec: str) -> None:
        """A segment materialised from the cache: its log says so; run.json names this run's train_spec."""
        keep_log(out, f"reused from the segment cache: {self.cache.entry(key)}\n")
        name_train_spec(out, train_spec)

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

    def _evaluate(self, dir_sets: dict[int, dict[int, str]], clock: Clock) -> dict[int, tuple[dict, dict] | SegmentFailed]:
        """(val, test) per seed for each set of train directories, from one evaluator process:
        validation averages the last `last_k` checkpoints the run's schedule names (only those
        are scored: earlier ones would cost evaluator time no decision reads), test is the final
        checkpoint's. A set with a checkpoint the evaluator could not load is a SegmentFailed
        (bad_output): the job's, never the run's."""
        k, every = self.cfg.evaluation.last_k, self.cfg.evaluation.every
        last = {d: [str(c) for c in scheduled_checkpoints(d, self.segment_steps, every)[-k:]]
                for dirs in dir_sets.values() for d in dirs.values()}
        jobs = {c: ["val"] for cs in last.values() for c in cs[:-1]} | {cs[-1]: ["val", "test"] for cs in last.values()}
        acc = self._scores(jobs, clock) if jobs else {}
        out: dict[int, tuple[dict, dict] | SegmentFailed] = {}
        for i, dirs in dir_sets.items():
            bad = [(seed, acc[c]["error"]) for seed, d in dirs.items() for c in last[d] if "error" in acc[c]]
            if bad:
                out[i] = SegmentFailed(Label.BAD_OUTPUT, f"seed {bad[0][0]}: the evaluator could not load it: {bad[0][1]}")
                continue
            val = {seed: average_last([acc[c]["val"] for c in last[d]], k) for seed, d in dirs.items()}
            test = {seed: acc[last[d][-1]]["test"] for seed, d in dirs.items()}
            out[i] = (val, test)
        return out

    def _scores(self, jobs: dict[str, list[str]], clock: Clock) -> dict[str, dict[str, float]]:
        """Accuracy per checkpoint and split: from the cache where a checkpoint of a cache entry
        was scored before on every split asked, from the evaluator otherwise (then cached)."""
        inputs = score_inputs(self.task, self._task_identity(), self.runtime, self._local, self.jobs.threads(1)) \
            if self.cache else None
        return cached_scores(self.cache, jobs, lambda c: checkpoint_identity(Path(c)), inputs,
                             lambda todo: self._evaluator(todo, clock))

    def _evaluator(self, jobs: dict[str, list[str]], clock: Clock) -> dict[str, dict[str, float]]:
        """Accuracy per checkpoint and split (retrain.evaluate: a process with no harness code)."""
        t = time.time()
        try:
            return evaluate(self.task, jobs, self.cfg.budget.trial_timeout_s,
                            self.runtime, self.cfg.worker_memory_mb, self.jobs)
        except RetrainFailed as e:
            raise ControlFailed(str(e)) from None
        finally:
            clock.eval_s += time.time() - t

    def _pool(self, calls: list[Call], clock: Clock, on_poll: Callable[[], None] | None, batch: int) -> list:
        """Training calls, all on the executor (a local pool: `workers` at once, threads shared),
        each with the threads it has in the whole batch of `batch` jobs (the rest reused)."""
        t = time.time()

        def poll() -> None:  # the caller's thread, while the jobs run: a cancel stops them (run_all kills them)
            if self.cancel is not None and self.cancel.is_set():
                raise Cancelled("the run stopped while this trial trained")
            if on_poll is not None:
                on_poll()
        results = self.jobs.part_of(batch).run(calls, self.cfg.budget.trial_timeout_s, self.cfg.worker_memory_mb,
                                               poll)
        clock.train_s += time.time() - t
        return results
