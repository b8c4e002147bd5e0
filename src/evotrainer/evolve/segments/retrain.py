"""Retrain harness schedules from the base on fresh seeds: the measurement that every
comparison of harnesses rests on (the run's final comparison, the benchmarks).

Each *arm* is a schedule (one harness directory per segment, each segment continuing from
the last one's checkpoint) trained from the base on every seed, under OUT/ARM/seed-S/segment-D:
all arms and seeds one batch of the segment pipeline (evolve/segments/pipeline.py), scored by one
evaluator process. A seed's accuracy on each split is the mean of the last `last_k`
evaluations (the saved steps of the last segment, then its final checkpoint). Here, unlike in
the search, any failure is an error: a comparison with a seed missing is no comparison.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from evotrainer.config import EvalConfig
from evotrainer.evaluate.greedy import load_error
from evotrainer.evaluate.launch import EvaluatorFailed
from evotrainer.evolve.segments.cache import SegmentCache
from evotrainer.evolve.segments.pipeline import Segments, TrainJob
from evotrainer.evolve.segments.progress import Progress
from evotrainer.evolve.segments.state import Clock
from evotrainer.executors import Executor, LocalPool
from evotrainer.runtime import Runtime
from evotrainer.tasks import Task
from evotrainer.trainer.jobs import handed_draws, segment_seed

SPLITS = ("val", "test")


class RetrainFailed(RuntimeError):
    """A retraining worker or the evaluator failed."""


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


def retrain(task: Task, base: str, arms: Mapping[str, Arm], seeds: Sequence[int], out_root: Path, *,
            evaluation: EvalConfig, timeout_s: float, workers: int = 0, runtime: Runtime | None = None,
            memory_mb: int | None = 8192, on_progress: Callable[[Progress], None] | None = None,
            executor: Executor | None = None, cache: SegmentCache | None = None) -> Retrained:
    """Train every arm on every seed from `base` under out_root/ARM/seed-S and score them, on
    `executor` (default: a local pool of `workers`), `timeout_s` per segment; `on_progress`
    hears the steps as they go. `evaluation` (the run's) says when checkpoints are saved and how
    many are averaged. `cache`: schedules and scores found there are reused, the rest stored there."""
    runtime = (runtime or Runtime()).on_base(base)  # every checkpoint loads on the base's config and tokenizer
    segments = Segments(task=task, base=base, runtime=runtime, executor=executor or LocalPool(workers), cache=cache,
                        timeout_s=timeout_s, memory_mb=memory_mb, on_progress=on_progress)
    train_spec = task.train_spec(Path(out_root) / "train-data")
    named = [(name, seed) for name in arms for seed in seeds]
    jobs = []
    for name, seed in named:  # segment d on segment_seed(seed, d), as at depth d of the search
        arm = arms[name]
        seg_seeds = tuple(segment_seed(seed, d) for d in range(1, len(arm.harnesses) + 1))
        jobs.append(TrainJob(
            name=f"{name} seed {seed}", train_spec=train_spec, level=task.target_level, harnesses=tuple(arm.harnesses),
            start=base, out=Path(out_root) / name / f"seed-{seed}", seeds=seg_seeds, steps=arm.steps,
            draws=tuple(handed_draws(task, h, s, arm.steps) for h, s in zip(arm.harnesses, seg_seeds)),
            runtime=runtime, eval_every=evaluation.every, nested=True))
    clock = Clock()
    failures = segments.train(jobs, f"retraining {', '.join(arms)} on seeds {list(seeds)}", clock)
    for (name, seed), failed in zip(named, failures):
        if failed is not None:
            raise RetrainFailed(f"the retraining of {name}, seed {seed}, failed: {failed.label}: {failed.detail}")
    try:
        means, acc = segments.score(jobs, {split: evaluation.last_k for split in SPLITS}, clock, also=(base,))
    except EvaluatorFailed as e:
        raise RetrainFailed(str(e)) from None
    if why := load_error(acc):
        raise RetrainFailed(f"the evaluator could not load {why}")
    scores: dict[str, dict[int, dict[str, float]]] = {name: {} for name in arms}
    for (name, seed), m in zip(named, means):
        scores[name][seed] = m
    return Retrained(scores, acc[base], clock.train_s, clock.eval_s, clock.trained, clock.reused)
