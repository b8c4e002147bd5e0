"""Training a harness from a checkpoint: the worker side and the `evotrainer train` command.

`train_segment` runs in a worker process (it loads, and so runs, the harness's code; it
holds no validation or test data and cannot derive them: the controller hands it its
training problems as indices, `handed_draws`, and the task's view without held-out rows,
`Task.train_view`): it trains, and writes to OUT run.json (task, seed,
group size and token budget the evidence was sampled under), checkpoint/ (Hugging Face
format, plus optimizer.pt: AdamW's state, which the next segment continues), checkpoints/step-N every `eval_every` steps, metrics.jsonl (one line per step),
evidence.jsonl (one line per rollout) and harness/ (a copy of the harness that ran).

`train_run` is the controller side: it checks the harness statically, runs the segment in
a worker with a hard deadline, then has the evaluator score the base and the saved
checkpoints in a process of its own (it imports no harness code), and writes summary.json.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from evotrainer.executors import WorkerResult, run_in_worker
from evotrainer.harness import REFERENCE, inspect_harness
from evotrainer.inner.backends import check_backend
from evotrainer.runtime import Runtime
from evotrainer.tasks import Task
from evotrainer.tasks.base import train_draws


OPTIMIZER_FILE = "optimizer.pt"


class TrainingFailed(RuntimeError):
    def __init__(self, result: WorkerResult, out: Path, stage: str = "training"):
        self.result = result
        super().__init__(f"{stage} {result.label}: {result.error} (log tail in {out / 'worker.log'})")


def handed_draws(task: Task, harness: str | Path | None, seed: int, steps: int) -> dict[str, list[int]]:
    """Controller side: the training problems of a `steps`-step segment on stream `seed`, as
    indices per level (base.train_draws): steps x prompts_per_step for every level its
    curriculum may pick, and a few steps' more (TRL's loader draws ahead). A built-in
    curriculum picks from `train_levels` (the target level when unset); one the harness
    writes itself may pick any level of the task. They are the same under any split key or
    none (the held-out pool they skip is public, tasks/base.py), so a worker learns nothing
    from them about which problems validation and test hold."""
    knobs = inspect_harness(harness)
    own = Path(harness or REFERENCE, "curriculum.py").is_file()
    picks = task.levels if own else (knobs.train_levels or (task.target_level,))
    levels = tuple(lv for lv in picks if lv in task.levels)  # a level the task lacks: the worker's curriculum
    # check refuses it (a labelled crash of the trial), not this process
    draws = train_draws(task, seed, (steps + 2) * knobs.prompts_per_step + 16, levels)
    return {str(lv): ix for lv, ix in draws.items()}


def train_segment(task: str, level: int | None, harness: str, base: str, out: str, seed: int,
                  steps: int, runtime: dict | None = None, draws: dict | None = None,
                  eval_every: int = 25, replica: int = 0) -> dict:
    """Worker entry point: plain arguments in, a plain dict out. `task` is the spec of the
    task's train view; `draws` the handed-in training indices (None: the worker draws from
    the public, unkeyed pool: library use outside a run); `runtime`
    (evotrainer.runtime.Runtime as a dict) names the backend, device and precision.
    `seed` draws the data; the sampling seed is `sampling_seed(seed, harness, replica)`.
    `eval_every` is the run's checkpoint schedule (never the harness's: it decides what the
    evaluator scores)."""
    import torch

    from evotrainer.catalog import get_task
    from evotrainer.harness import load_harness
    from evotrainer.inner.backends import get_backend
    from evotrainer.inner.grpo import completion_width
    from evotrainer.inner.segment import SegmentLog
    from evotrainer.policy import load_policy, save_policy
    from evotrainer.runtime import Runtime

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    h = load_harness(harness)
    shutil.copytree(h.path, out_dir / "harness", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    rt = Runtime.of(runtime)
    model, tok = load_policy(base, rt.policy)
    t = get_task(task, level)
    if draws is not None:
        t.use_draws(draws)
    carried = Path(base, OPTIMIZER_FILE)
    # a segment after the first: Adam goes on where the parent's stopped
    state = torch.load(carried, weights_only=True, map_location=model.device) if carried.exists() else None
    # what the evidence was sampled under: backtests re-score it against these
    (out_dir / "run.json").write_text(json.dumps({
        "task": task, "level": level, "seed": seed, "steps": steps, "group_size": h.knobs.group_size,
        "prompts_per_step": h.knobs.prompts_per_step, "max_new_tokens": completion_width(t, h.knobs),
        "harness_hash": h.content_hash, "backend": rt.backend}, indent=2))
    log = SegmentLog(out_dir, steps, eval_every)
    try:
        state = get_backend(rt.backend).run(model, tok, t, h, seed=seed, steps=steps, log=log,
                                            optimizer_state=state, runtime=rt,
                                            sample_seed=sampling_seed(seed, h.content_hash, replica))
    finally:
        log.close()
    save_policy(model, tok, out_dir / "checkpoint")
    torch.save(state, out_dir / "checkpoint" / OPTIMIZER_FILE)
    return {"steps": steps, "harness_hash": h.content_hash[:12]}


def sampling_seed(seed: int, harness_hash: str, replica: int = 0) -> int:
    """The sampling seed of a segment: its data seed, the harness's content and the replica.

    Versions at one depth see the same problems (paired by `seed`) but sample independently:
    a child whose change has no effect then differs from its control exactly as much as two
    runs of one harness with other sampling seeds (the noise replicas, `replica` > 0) do, which
    is the null the gate tests against. A renamed copy (the same content) trains identically."""
    digest = hashlib.sha256(f"{seed}/{harness_hash}/{replica}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def segment_seed(seed: int, depth: int) -> int:
    """The data and sampling seed of run seed `seed`'s segment at lineage depth `depth`:
    every version at one depth sees the same prompts per seed, so their gains are paired."""
    return 1000 * seed + depth


def train_schedule(task: str, level: int | None, harnesses: list[str], base: str, out: str, seed: int,
                   steps: int, runtime: dict | None = None, draws: list[dict] | None = None,
                   eval_every: int = 25) -> dict:
    """Worker entry point: one segment of `steps` per harness, each from the last one's
    checkpoint, in OUT/segment-1, segment-2, ... (segment d seeded by `segment_seed(seed, d)`,
    as in the search; `draws[d-1]` its handed-in problems). The last segment's directory holds the result."""
    start = base
    for d, harness in enumerate(harnesses, 1):
        seg = Path(out) / f"segment-{d}"
        train_segment(task, level, harness, start, str(seg), segment_seed(seed, d), steps, runtime,
                      None if draws is None else draws[d - 1], eval_every)
        start = str(seg / "checkpoint")
    return {"last": str(Path(out) / f"segment-{len(harnesses)}")}


def saved_checkpoints(out: Path) -> list[Path]:
    """A train directory's checkpoints/step-N, in step order (the final one is checkpoint/)."""
    return sorted(Path(out, "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))


def _metrics_follower(path: Path, on_step: Callable[[dict], None]) -> Callable[[], None]:
    """Call on_step for each new line of a growing metrics.jsonl."""
    seen = [0]

    def poll():
        if not path.exists():
            return
        lines = path.read_text().splitlines()
        for line in lines[seen[0]:]:
            if line.strip():
                on_step(json.loads(line))
        seen[0] = len(lines)
    return poll


def train_run(task: Task, harness_dir: Path | None, base: Path, out: Path, seed: int = 0,
              steps: int | None = None, timeout_s: float = 3600.0,
              on_step: Callable[[dict], None] | None = None, runtime: Runtime | None = None,
              memory_mb: int | None = 8192, eval_every: int = 25) -> dict:
    """Train one segment in a worker, then have the evaluator score the base, the checkpoints
    saved every `eval_every` steps (the caller's schedule: `evotrainer train --eval-every`)
    and the final one; writes and returns summary.json."""
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runtime = runtime or Runtime()
    knobs = inspect_harness(harness_dir)
    check_backend(runtime, knobs, str(harness_dir or "the reference harness"), task)
    steps = knobs.steps if steps is None else steps
    follow = _metrics_follower(out / "metrics.jsonl", on_step) if on_step else None
    level = task.target_level  # the spec and this level rebuild the same task in every process
    harness = str(harness_dir or REFERENCE)
    view = task.train_view(out.with_name(out.name + ".train-data"))
    result = run_in_worker("evotrainer.train:train_segment", dict(
        task=view, level=level, harness=harness,
        base=str(base), out=str(out), seed=seed, steps=steps, runtime=runtime.to_dict(),
        draws=handed_draws(task, harness, seed, steps), eval_every=eval_every),
        timeout_s=timeout_s, memory_mb=memory_mb, on_poll=follow, writes=(str(out),), reads=(harness, str(base), view))
    (out / "worker.log").write_text(result.log_tail)
    if not result.ok:
        raise TrainingFailed(result, out)
    # the evaluator: a process of its own that loads checkpoints and the verifier only
    saved = saved_checkpoints(out)
    jobs = {str(base): ["val", "test"], **{str(c): ["val"] for c in saved}, str(out / "checkpoint"): ["val", "test"]}
    ev = run_in_worker("evotrainer.evaluate.greedy:evaluate_checkpoints",
                       dict(task=task.spec, level=level, jobs=jobs, policy=runtime.policy.to_dict(),
                            key=task.key.hex() if task.key else None),
                       timeout_s=timeout_s, memory_mb=memory_mb, reveal=task.data_files(),
                       reads=(*jobs, task.spec, *task.data_files()))
    if not ev.ok:
        (out / "worker.log").write_text(ev.log_tail)
        raise TrainingFailed(ev, out, stage="evaluation")
    acc = ev.value
    base_val, base_test = acc[str(base)]["val"], acc[str(base)]["test"]
    val, test = acc[str(out / "checkpoint")]["val"], acc[str(out / "checkpoint")]["test"]
    evals = [{"step": 0, "val": base_val}, *({"step": int(c.name[5:]), "val": acc[str(c)]["val"]} for c in saved),
             {"step": steps, "val": val}]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = {
        "task": task.spec, "level": task.target_level, "seed": seed, "steps": steps, "backend": runtime.backend,
        "harness": str(harness_dir or "reference"), "harness_hash": result.value["harness_hash"],
        "base": str(base), "base_val": base_val, "base_test": base_test, "val": val, "test": test, "evals": evals,
        "reward_first": metrics[0]["reward_mean"] if metrics else None,
        "reward_last": metrics[-1]["reward_mean"] if metrics else None,
        "seconds": round(time.time() - t0, 1), "worker_seconds": round(result.seconds, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
