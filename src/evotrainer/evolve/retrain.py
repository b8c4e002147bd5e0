"""Retrain harness schedules from the base on fresh seeds: the measurement that every
comparison of harnesses rests on (the run's final comparison, the benchmarks).

Each *arm* is a schedule (one harness directory per segment, each segment continuing from
the last one's checkpoint) trained from the base on every seed, all arms and seeds in one
pool of workers, then scored by one evaluator process that loads checkpoints and the task's
verifier and no harness code. A seed's accuracy is the mean of the last `last_k`
evaluations (the saved steps of the last segment, then its final checkpoint).

With a segment cache (evolve/segment_cache.py) an arm and seed whose every segment was
trained before (the reference arm of another benchmark arm, say) is materialised instead,
and a checkpoint scored before is not scored again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from evotrainer.config import EvalConfig
from evotrainer.evaluate.greedy import evaluate_checkpoints, load_error
from evotrainer.evolve.progress import Job, Progress, Watcher
from evotrainer.evolve.segment_cache import (SegmentCache, cached_scores, chain_keys, checkpoint_identity,
                                             draws_digest, name_train_spec, numbers, score_inputs, start_identity,
                                             task_identity, tree_digest)
from evotrainer.executors import Call, Executor, LocalPool
from evotrainer.runtime import Runtime
from evotrainer.tasks import Task
from evotrainer.labels import Label
from evotrainer.trainer.jobs import handed_draws, segment_seed, train_schedule
from evotrainer.trainer.outputs import keep_log, refused, scheduled_checkpoints

SPLITS = ("val", "test")


class RetrainFailed(RuntimeError):
    """A retraining worker or the evaluator failed."""


def evaluate(task: Task, jobs: dict[str, list[str]], timeout_s: float,
             runtime: Runtime | None = None, memory_mb: int | None = 8192,
             executor: Executor | None = None) -> dict[str, dict[str, float]]:
    """Accuracy per checkpoint and split, from the evaluator: a process of its own that loads
    checkpoints and the task's verifier, and no harness code; the one job given the split key."""
    policy = (runtime or Runtime()).policy.to_dict()
    (ev,) = (executor or LocalPool(1)).run([Call(evaluate_checkpoints, dict(
        task=task.spec, level=task.target_level, jobs=jobs, policy=policy,
        key=task.key.hex() if task.key else None), reveal=task.data_files(),
        reads=(*jobs, *task.files(), *task.data_files(), *(runtime or Runtime()).policy.reads()))], timeout_s, memory_mb)
    if not ev.ok:
        raise RetrainFailed(f"the evaluator failed: {ev.label}: {ev.error}")
    return ev.value


@dataclass(frozen=True)
class Arm:
    harnesses: tuple[str, ...]  # harness directories, one per segment
    steps: int                  # training steps of each segment


@dataclass
class Retrained:
    scores: dict[str, dict[int, dict[str, float]]]  # arm -> seed -> split -> accuracy
    base: dict[str, float]                          # the base checkpoint's accuracy per split
    train_s: float = 0.0
    eval_s: float = 0.0
    trained: int = 0                                # segments trained (per seed and schedule step)
    reused: int = 0                                 # and materialised from the segment cache


def retrain(task: Task, base: str, arms: Mapping[str, Arm], seeds: Sequence[int], out_root: Path,
            evaluation: EvalConfig, timeout_s: float, workers: int = 0, runtime: Runtime | None = None,
            memory_mb: int | None = 8192, on_progress: Callable[[Progress], None] | None = None,
            executor: Executor | None = None, cache: SegmentCache | None = None) -> Retrained:
    """Train every arm on every seed from `base` under out_root/ARM/seed-S and score them, on
    `executor` (default: a local pool of `workers`); `on_progress` hears the steps as they go.
    `evaluation` (the run's) says when checkpoints are saved and how many are averaged.
    `cache`: schedules and scores found there are reused, the rest stored there."""
    executor = executor or LocalPool(workers)
    runtime = (runtime or Runtime()).on_base(base)  # every checkpoint loads on the base's config and tokenizer
    jobs = []  # (arm, seed, out, train_schedule's arguments)
    train_spec = task.train_spec(Path(out_root) / "train-data")
    for name, arm in arms.items():
        for seed in seeds:
            out = Path(out_root) / name / f"seed-{seed}"
            draws = [handed_draws(task, h, segment_seed(seed, d), arm.steps) for d, h in enumerate(arm.harnesses, 1)]
            jobs.append((name, seed, out, dict(
                task=train_spec, level=task.target_level, base=base, out=str(out), harnesses=list(arm.harnesses),
                seed=seed, steps=arm.steps, runtime=runtime.to_dict(), draws=draws, eval_every=evaluation.every)))
    local, task_id = isinstance(executor, LocalPool), task_identity(task.spec, task.data_files()) if cache else ""
    base_id = start_identity(Path(base)) if cache else ""
    calls, trained = [], []
    for name, seed, out, args in jobs:
        keys = chain_keys(base_id, [tree_digest(Path(h)) for h in args["harnesses"]],
                          [segment_seed(seed, d) for d in range(1, len(args["harnesses"]) + 1)],
                          [draws_digest(d) for d in args["draws"]], replica=0, steps=args["steps"], task=task_id,
                          level=task.target_level, runtime=numbers(runtime, local, executor.threads(len(jobs))),
                          eval_every=evaluation.every) if cache else []
        if keys and all(cache.lookup(k) for k in keys) and \
                all(cache.materialise(k, out / f"segment-{d}") for d, k in enumerate(keys, 1)):
            for d in range(1, len(keys) + 1):
                name_train_spec(out / f"segment-{d}", train_spec)
            continue
        calls.append(Call(train_schedule, args, writes=(str(out),), clean=True,  # a kill mid-way: starts clean
                          reads=(base, *task.files(train_spec), *args["harnesses"], *runtime.policy.reads())))
        trained.append((name, seed, out, keys))
    where = [(name, seed, out / f"segment-{len(arms[name].harnesses)}") for name, seed, out, _ in jobs]
    watch = Watcher(f"retraining {', '.join(arms)} on seeds {list(seeds)}", [
        Job(f"{name} seed {seed}", out, arms[name].steps * len(arms[name].harnesses)) for name, seed, out, _ in trained],
        on_progress) if on_progress and calls else None
    t = time.time()
    results = executor.part_of(len(jobs)).run(calls, timeout_s * max(len(a.harnesses) for a in arms.values()),
                                              memory_mb, watch)
    if watch is not None:
        watch.flush()
    train_s = time.time() - t
    for (name, seed, out, keys), res in zip(trained, results):
        keep_log(out, res.log_tail)
        if not res.ok:
            raise RetrainFailed(f"the retraining of {name}, seed {seed}, failed: {res.label}: {res.error}")
        why = refused(out, arms[name].steps, evaluation.every, base, segments=len(arms[name].harnesses))
        if why:
            raise RetrainFailed(f"the retraining of {name}, seed {seed}, failed: {Label.BAD_OUTPUT}: {why}")
        for d, k in enumerate(keys, 1):  # each from the last: stored while the last is the entry exactly
            cache.store(k, out / f"segment-{d}")
            if not checkpoint_identity(out / f"segment-{d}" / "checkpoint"):
                break
    last = {(name, seed): [str(c) for c in scheduled_checkpoints(d, arms[name].steps, evaluation.every)[-evaluation.last_k:]]
            for name, seed, d in where}
    to_score = {base: list(SPLITS)} | {c: list(SPLITS) for cs in last.values() for c in cs}
    t = time.time()

    def identity(c: str) -> str | None:
        return base_id if c == base else checkpoint_identity(Path(c))

    inputs = score_inputs(task, task_id, runtime, local, executor.threads(1)) if cache else None
    acc = cached_scores(cache, to_score, identity, inputs,
                        lambda todo: evaluate(task, todo, timeout_s, runtime, memory_mb, executor))
    eval_s = time.time() - t
    if why := load_error(acc):
        raise RetrainFailed(f"the evaluator could not load {why}")
    scores: dict[str, dict[int, dict[str, float]]] = {name: {} for name in arms}
    for (name, seed), cs in last.items():
        scores[name][seed] = {split: sum(acc[c][split] for c in cs) / len(cs) for split in SPLITS}
    segments = {name: len(arm.harnesses) for name, arm in arms.items()}
    n_trained = sum(segments[name] for name, *_ in trained)
    return Retrained(scores, acc[base], train_s, eval_s, n_trained, sum(segments[n] for n, *_ in jobs) - n_trained)
