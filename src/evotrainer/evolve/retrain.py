"""Retrain harness schedules from the base on fresh seeds: the measurement that every
comparison of harnesses rests on (the run's final comparison, the benchmarks).

Each *arm* is a schedule (one harness directory per segment, each segment continuing from
the last one's checkpoint) trained from the base on every seed, all arms and seeds in one
pool of workers, then scored by one evaluator process that loads checkpoints and the task's
verifier and no harness code. A seed's accuracy is the mean of the last `last_k`
evaluations (the saved steps of the last segment, then its final checkpoint).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from evotrainer.config import EvalConfig
from evotrainer.evaluate.greedy import evaluate_checkpoints
from evotrainer.evolve.progress import Job, Progress, watcher
from evotrainer.executors import Call, Executor, LocalPool
from evotrainer.runtime import Runtime
from evotrainer.tasks import Task
from evotrainer.trainer.jobs import handed_draws, saved_checkpoints, segment_seed, train_schedule

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
        reads=(*jobs, task.spec, *task.data_files()))], timeout_s, memory_mb)
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


def retrain(task: Task, base: str, arms: Mapping[str, Arm], seeds: Sequence[int], out_root: Path,
            evaluation: EvalConfig, timeout_s: float, workers: int = 0, runtime: Runtime | None = None,
            memory_mb: int | None = 8192, on_progress: Callable[[Progress], None] | None = None,
            executor: Executor | None = None) -> Retrained:
    """Train every arm on every seed from `base` under out_root/ARM/seed-S and score them, on
    `executor` (default: a local pool of `workers`); `on_progress` hears the steps as they go.
    `evaluation` (the run's) says when checkpoints are saved and how many are averaged."""
    executor = executor or LocalPool(workers)
    runtime = runtime or Runtime()
    calls, where = [], []
    view = task.train_view(Path(out_root) / "train-data")
    for name, arm in arms.items():
        for seed in seeds:
            out = Path(out_root) / name / f"seed-{seed}"
            draws = [handed_draws(task, h, segment_seed(seed, d), arm.steps) for d, h in enumerate(arm.harnesses, 1)]
            calls.append(Call(train_schedule, dict(
                task=view, level=task.target_level, base=base, out=str(out), harnesses=list(arm.harnesses),
                seed=seed, steps=arm.steps, runtime=runtime.to_dict(), draws=draws,
                eval_every=evaluation.every),
                writes=(str(out),), clean=True,  # a retraining cut off by a kill starts clean
                reads=(base, view, *arm.harnesses)))
            where.append((name, seed, out / f"segment-{len(arm.harnesses)}"))
    watch = on_progress and watcher(f"retraining {', '.join(arms)} on seeds {list(seeds)}", [
        Job(f"{name} seed {seed}", out.parent, arms[name].steps * len(arms[name].harnesses)) for name, seed, out in where],
        on_progress)
    t = time.time()
    results = executor.run(calls, timeout_s * max(len(a.harnesses) for a in arms.values()), memory_mb, watch)
    train_s = time.time() - t
    for (name, seed, _), res in zip(where, results):
        if not res.ok:
            raise RetrainFailed(f"the retraining of {name}, seed {seed}, failed: {res.label}: {res.error}")
    last = {(name, seed): [str(c) for c in [*saved_checkpoints(d), d / "checkpoint"][-evaluation.last_k:]]
            for name, seed, d in where}
    jobs = {base: list(SPLITS)} | {c: list(SPLITS) for cs in last.values() for c in cs}
    t = time.time()
    acc = evaluate(task, jobs, timeout_s, runtime, memory_mb, executor)
    eval_s = time.time() - t
    scores: dict[str, dict[int, dict[str, float]]] = {name: {} for name in arms}
    for (name, seed), cs in last.items():
        scores[name][seed] = {split: sum(acc[c][split] for c in cs) / len(cs) for split in SPLITS}
    return Retrained(scores, acc[base], train_s, eval_s)
