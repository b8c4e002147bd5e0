"""`evotrainer train`: one harness trained from a checkpoint, then scored.

`train_run` is the controller side of one segment: it checks the harness statically, runs
`jobs.train_segment` in a worker with a hard deadline, then has the evaluator score the
base and the saved checkpoints in a process of its own (it imports no harness code), and
writes summary.json.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from evotrainer import jobfiles
from evotrainer.evaluate.greedy import load_error
from evotrainer.evaluate.launch import EvaluatorFailed, run_evaluator
from evotrainer.evidence import read_metrics
from evotrainer.executors import WorkerResult, run_in_worker
from evotrainer.harness import REFERENCE, inspect_harness
from evotrainer.jobfiles import BadOutput
from evotrainer.labels import Label
from evotrainer.runtime import Runtime
from evotrainer.tasks import Task
from evotrainer.trainer.backends import check_backend
from evotrainer.trainer.jobs import handed_draws, train_segment
from evotrainer.trainer.outputs import keep_log, log_path, refused, scheduled_checkpoints


class TrainingFailed(RuntimeError):
    def __init__(self, result: WorkerResult, out: Path, stage: str = "training"):
        self.result = result
        super().__init__(f"{stage} {result.label}: {result.error} (log tail in {log_path(out)})")


def _metrics_follower(out: Path, on_step: Callable[[dict], None]) -> Callable[[], None]:
    """Call on_step for each new line of the growing metrics.jsonl in train directory `out`."""
    seen = [0]

    def poll():
        try:
            rows = read_metrics(out, growing=True)
        except BadOutput:  # a link or a FIFO there: refused when the job ends
            return
        for row in rows[seen[0]:]:
            on_step(row)
        seen[0] = len(rows)
    return poll


def train_run(task: Task, harness_dir: Path | None, base: Path, out: Path, *, seed: int = 0,
              steps: int | None = None, timeout_s: float = 3600.0,
              on_step: Callable[[dict], None] | None = None, runtime: Runtime | None = None,
              memory_mb: int | None = 8192, eval_every: int = 25) -> dict:
    """Train one segment in a worker, then have the evaluator score the base, the checkpoints
    saved every `eval_every` steps (the caller's schedule: `evotrainer train --eval-every`)
    and the final one; writes and returns summary.json."""
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runtime = (runtime or Runtime()).on_base(base)  # a LoRA run's adapters sit on its base
    knobs = inspect_harness(harness_dir)
    check_backend(runtime, knobs, str(harness_dir or "the reference harness"), task)
    steps = knobs.steps if steps is None else steps
    follow = _metrics_follower(out, on_step) if on_step else None
    level = task.target_level  # the spec and this level rebuild the same task in every process
    harness = str(harness_dir or REFERENCE)
    train_spec = task.train_spec(out.with_name(out.name + ".train-data"))
    result = run_in_worker(train_segment, dict(
        task=train_spec, level=level, harness=harness,
        base=str(base), out=str(out), seed=seed, steps=steps, runtime=runtime.to_dict(),
        draws=handed_draws(task, harness, seed, steps), eval_every=eval_every),
        timeout_s=timeout_s, memory_mb=memory_mb, on_poll=follow, writes=(str(out),),
        reads=(harness, str(base), *task.files(train_spec), *runtime.policy.reads()))
    keep_log(out, result.log_tail)
    if not result.ok:
        raise TrainingFailed(result, out)
    why = refused(out, steps, eval_every, str(base))
    if why:
        raise TrainingFailed(WorkerResult(Label.BAD_OUTPUT, error=why), out)
    # the evaluator: a process of its own that loads checkpoints and the verifier only
    *saved, final = scheduled_checkpoints(out, steps, eval_every)
    jobs = {str(base): ["val", "test"], **{str(c): ["val"] for c in saved}, str(final): ["val", "test"]}
    try:
        acc = run_evaluator(task, jobs, timeout_s, runtime=runtime, memory_mb=memory_mb)
    except EvaluatorFailed as e:
        keep_log(out, e.result.log_tail)
        raise TrainingFailed(e.result, out, stage="evaluation") from None
    if why := load_error(acc):
        raise TrainingFailed(WorkerResult(Label.BAD_OUTPUT, error=f"the evaluator could not load {why}"), out,
                             stage="evaluation")
    base_val, base_test = acc[str(base)]["val"], acc[str(base)]["test"]
    val, test = acc[str(out / "checkpoint")]["val"], acc[str(out / "checkpoint")]["test"]
    evals = [{"step": 0, "val": base_val}, *({"step": int(c.name[5:]), "val": acc[str(c)]["val"]} for c in saved),
             {"step": steps, "val": val}]
    metrics = read_metrics(out)
    summary = {
        "task": task.spec, "level": task.target_level, "seed": seed, "steps": steps, "backend": runtime.backend,
        "harness": str(harness_dir or "reference"), "harness_hash": result.value["harness_hash"],
        "base": str(base), "base_val": base_val, "base_test": base_test, "val": val, "test": test, "evals": evals,
        "reward_first": metrics[0]["reward_mean"] if metrics else None,
        "reward_last": metrics[-1]["reward_mean"] if metrics else None,
        "seconds": round(time.time() - t0, 1), "worker_seconds": round(result.seconds, 1),
    }
    jobfiles.write_text(out, "summary.json", json.dumps(summary, indent=2))
    return summary
