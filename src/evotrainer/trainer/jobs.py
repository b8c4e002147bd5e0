"""Training jobs: a segment, or a schedule of them, in a worker process, and what the
caller hands them and reads back.

`train_segment` runs in a worker process (it loads, and so runs, the harness's code; it
holds no validation or test data and cannot derive them: the controller hands it its
training problems as indices, `handed_draws`, and the task's view without held-out rows,
`Task.train_spec`): it trains, and writes to OUT run.json (task, seed,
group size and token budget the evidence was sampled under), checkpoint/ (Hugging Face
format, plus optimizer.pt: AdamW's state, which the next segment continues), checkpoints/step-N
every `eval_every` steps (the run's schedule: outputs.scheduled_checkpoints), metrics.jsonl (one line per step),
evidence.jsonl (one line per rollout) and harness/ (a copy of the harness that ran).
`train_schedule` runs several segments in a row, as the final comparison retrains a winner.

Callers name these functions as job targets (executors.Call), so the controller imports
this module: what trains (the backends, the policy) is imported inside `train_segment`, in
the worker only.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
from pathlib import Path

from evotrainer.harness import REFERENCE, inspect_harness
from evotrainer.tasks import Task
from evotrainer.tasks.base import train_draws


OPTIMIZER_FILE = "optimizer.pt"


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


def train_segment(task: str, level: int | None, harness: str, base: str, out: str, *, seed: int,
                  steps: int, runtime: dict | None = None, draws: dict | None = None,
                  eval_every: int = 25, replica: int = 0) -> dict:
    """Worker entry point: plain arguments in, a plain dict out. `task` is the spec of the
    task's train spec; `draws` the handed-in training indices (None: the worker draws from
    the public, unkeyed pool: library use outside a run); `runtime`
    (evotrainer.runtime.Runtime as a dict) names the backend, device and precision.
    `seed` draws the data; the sampling seed is `sampling_seed(seed, harness, replica)`.
    `eval_every` is the run's checkpoint schedule (never the harness's: it decides what the
    evaluator scores). With `data_parallel` N > 1 this process starts N training processes,
    one model copy each (trainer/distributed.py), and waits for them; rank 0 writes."""
    from evotrainer.harness import load_harness
    from evotrainer.runtime import Runtime

    rt = Runtime.of(runtime)
    kwargs = dict(task=task, level=level, harness=harness, base=base, out=out, seed=seed, steps=steps,
                  runtime=rt.to_dict(), draws=draws, eval_every=eval_every, replica=replica)
    if rt.data_parallel == 1:
        return _segment(0, **kwargs)
    import torch.multiprocessing as mp
    Path(out).mkdir(parents=True, exist_ok=True)
    meet = Path(out, ".rendezvous")  # where the ranks find each other (gone when they are done)
    meet.unlink(missing_ok=True)
    try:  # spawn calls its function with the rank alone: the rest travels in the partial, by name
        mp.spawn(functools.partial(_segment, **kwargs), nprocs=rt.data_parallel, join=True)
    finally:
        meet.unlink(missing_ok=True)
    return {"steps": steps, "harness_hash": load_harness(harness).content_hash[:12]}


def _segment(rank: int, *, task: str, level: int | None, harness: str, base: str, out: str, seed: int, steps: int,
             runtime: dict, draws: dict | None, eval_every: int, replica: int) -> dict:
    """One training process of a segment: all of it, or rank `rank` of `data_parallel`."""
    import torch

    from evotrainer.catalog import get_task
    from evotrainer.harness import load_harness
    from evotrainer.trainer.backends import get_backend
    from evotrainer.trainer.grpo import completion_width
    from evotrainer.trainer.segment import SegmentLog
    from evotrainer.policy import load_policy, save_policy
    from evotrainer.policy.adapters import is_adapter, trainable
    from evotrainer.runtime import Runtime
    from evotrainer.trainer.distributed import join, leave

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rt = Runtime.of(runtime)
    world = join(rank, rt.data_parallel, str(out_dir / ".rendezvous"),
                 "nccl" if rt.policy.resolved_device().type == "cuda" else "gloo")
    if world.parallel:  # rank r on GPU r of the job's; the job's CPU threads split among the ranks
        if rt.policy.resolved_device().type == "cuda":
            rt = dataclasses.replace(rt, policy=dataclasses.replace(rt.policy, device=f"cuda:{rank}"))
        torch.set_num_threads(max(1, torch.get_num_threads() // world.size))
    h = load_harness(harness)
    if rank == 0:
        shutil.copytree(h.path, out_dir / "harness", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    # the weights of `base` (the run's base or the parent's checkpoint) on the run's base: its config,
    # tokenizer, chat template and stop tokens, never the parent job's files (rt.policy.base, Runtime.on_base)
    model, tok = load_policy(base, rt.policy, trainable=True)
    t = get_task(task, level)
    if draws is not None:
        t.use_draws(draws)
    carried = Path(base, OPTIMIZER_FILE)
    # a segment after the first: Adam goes on where the parent's stopped (a LoRA run's first
    # segment starts a new adapter, whatever optimizer its base came with)
    own = rt.policy.lora is None or is_adapter(base)
    state = torch.load(carried, weights_only=True, map_location=model.device) if own and carried.exists() else None
    # what the evidence was sampled under: backtests re-score it against these
    if rank == 0:
        (out_dir / "run.json").write_text(json.dumps({
            "task": task, "level": level, "seed": seed, "steps": steps, "group_size": h.knobs.group_size,
            "prompts_per_step": h.knobs.prompts_per_step, "max_new_tokens": completion_width(t, h.knobs),
            "harness_hash": h.content_hash, "backend": rt.backend,
            "trainable_params": sum(p.numel() for p in trainable(model)),
            "lora": None if rt.policy.lora is None else rt.policy.lora.to_dict(),
            "data_parallel": world.size}, indent=2))
    log = SegmentLog(out_dir, steps, eval_every) if rank == 0 else None  # the other ranks record nothing
    try:
        state = get_backend(rt.backend).run(model, tok, t, h, seed=seed, steps=steps, log=log,
                                            optimizer_state=state, runtime=rt,
                                            sample_seed=sampling_seed(seed, h.content_hash, replica), world=world)
    finally:
        if log is not None:
            log.close()
        leave(world)
    if rank == 0:
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


def train_schedule(task: str, level: int | None, harnesses: list[str], base: str, out: str, *, seeds: list[int],
                   steps: int, runtime: dict | None = None, draws: list[dict] | None = None,
                   eval_every: int = 25, replica: int = 0) -> dict:
    """Worker entry point: one segment of `steps` per harness, each from the last one's
    checkpoint, in OUT/segment-1, segment-2, ... (segment d seeded by `seeds[d-1]`, which the
    caller chose: `segment_seed(seed, d)`, as in the search; `draws[d-1]` its handed-in
    problems). The last segment's directory holds the result."""
    start = base
    for d, (harness, seed) in enumerate(zip(harnesses, seeds, strict=True), 1):
        seg = Path(out) / f"segment-{d}"
        train_segment(task, level, harness, start, str(seg), seed=seed, steps=steps, runtime=runtime,
                      draws=None if draws is None else draws[d - 1], eval_every=eval_every, replica=replica)
        start = str(seg / "checkpoint")
    return {"last": str(Path(out) / f"segment-{len(harnesses)}")}
