"""What the Ray executor costs against the local pool, on one machine.

    .venv/bin/python bench/executor_overhead.py [--trials 2] [--steps 4] [--rounds 2] [--jobs 8]

Two measurements, each executor in the same process and the same run of this script:
  1. trivial jobs (`platform.python_version` in a sandboxed worker: the worker's start-up and
     its torch import, no work), `--jobs` of them, as many at once as there are cores: seconds
     per job on the local pool and as Ray tasks on a local Ray cluster, and the difference.
  2. the same short search (the rules agent, `--trials` trials, `--steps` steps a segment, one
     training seed, the final comparison on one fresh seed) with `executor: local` and
     `executor: ray`, `--rounds` times, the order alternating: wall time of each, the ratio,
     and Ray's overhead per job ((ray - local) / jobs the search ran).
The policy is a random-initialised built-in model (plumbing, not learning: both executors run
the same jobs, so what differs is how they are run). Starting the Ray cluster is reported on
its own: a run pays it once.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evotrainer.config import RunConfig, config_from_dict  # noqa: E402
from evotrainer.evolve.controller import Controller  # noqa: E402
from evotrainer.executors import Call, Executor, LocalPool  # noqa: E402
from evotrainer.harness import REFERENCE  # noqa: E402
from evotrainer.policy.model import build_model, build_tokenizer, save_policy  # noqa: E402


class Counting(Executor):
    """An executor that counts the jobs it is handed (what the overhead is divided by)."""
    jobs = 0

    def __init__(self, inner: Executor):
        self.inner = inner

    def run(self, calls, timeout_s, memory_mb=8192, on_poll=None):
        Counting.jobs += len(calls)
        return self.inner.run(calls, timeout_s, memory_mb, on_poll)


def setup(work: Path, steps: int, trials: int) -> dict:
    """A random-init policy, a small copy of the reference harness, the run config as data."""
    for p in (work, *work.parents):  # sandboxed jobs run as nobody when we are root: make it readable
        if p == Path(tempfile.gettempdir()):
            break
        p.chmod(p.stat().st_mode | 0o055)
    ckpt, root = work / "ckpt", work / "root"
    tok = build_tokenizer()
    save_policy(build_model(len(tok)), tok, ckpt)
    shutil.copytree(REFERENCE, root)
    knobs = (root / "knobs.yaml").read_text()
    for old, new in [("prompts_per_step: 64", "prompts_per_step: 16"), ("group_size: 8", "group_size: 4")]:
        knobs = knobs.replace(old, new)
    (root / "knobs.yaml").write_text(knobs)
    for p in work.rglob("*"):
        p.chmod(p.stat().st_mode | (0o055 if p.is_dir() else 0o044))
    return {"task": "arith", "level": 1, "model": str(ckpt), "harness": str(root), "seeds": [0], "final_seeds": [100],
            "search": {"skills": None, "selection": "greedy"},
            "budget": {"trials": trials, "steps_per_segment": steps, "total_steps": steps * 3, "trial_timeout_s": 600},
            "evaluation": {"every": steps}}  # the final checkpoint only, as before


def search(raw: dict, executor: str, out: Path) -> tuple[float, int]:
    """One search and its final comparison: (wall seconds, jobs run)."""
    cfg = config_from_dict(raw | {"executor": executor}).validate()
    inner = RunConfig.job_executor
    RunConfig.job_executor = lambda self: Counting(inner(self))
    Counting.jobs = 0
    try:
        t = time.perf_counter()
        ctl = Controller(cfg, out)
        ctl.run()
        ctl.final()
        return time.perf_counter() - t, Counting.jobs
    finally:
        RunConfig.job_executor = inner


def trivial(executor: Executor, n: int) -> float:
    calls = [Call(platform.python_version) for _ in range(n)]
    t = time.perf_counter()
    results = executor.run(calls, timeout_s=300)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return (time.perf_counter() - t) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--jobs", type=int, default=8)
    args = p.parse_args()
    import ray

    from evotrainer.executors.ray_tasks import RayExecutor, connect
    cores = os.cpu_count() or 1
    t = time.perf_counter()
    connect("local", cores)
    print(f"{cores} cores; a local Ray cluster started in {time.perf_counter() - t:.1f} s (once per run)\n")
    trivial(LocalPool(cores), cores)  # warm the page cache and Ray's worker pool alike
    trivial(RayExecutor(), cores)
    local_job, ray_job = trivial(LocalPool(cores), args.jobs), trivial(RayExecutor(), args.jobs)
    print(f"trivial jobs ({args.jobs}, {cores} at once): local pool {local_job:.2f} s/job, Ray {ray_job:.2f} s/job "
          f"({ray_job - local_job:+.2f} s/job)\n")

    with tempfile.TemporaryDirectory(prefix="evotrainer-bench-") as tmp:
        raw = setup(Path(tmp), args.steps, args.trials)
        walls: dict[str, list[float]] = {"local": [], "ray": []}
        jobs = 0
        for r in range(args.rounds):
            for executor in (("local", "ray") if r % 2 == 0 else ("ray", "local")):
                wall, jobs = search(raw, executor, Path(tmp) / f"run-{executor}-{r}")
                walls[executor].append(wall)
                print(f"round {r}: {executor:5s} {wall:6.1f} s, {jobs} jobs")
        ratios = [ry / lo for ry, lo in zip(walls["ray"], walls["local"])]
        per_job = [(ry - lo) / jobs for ry, lo in zip(walls["ray"], walls["local"])]
        print(f"\nshort search ({args.trials} trials, {args.steps} steps a segment, final on 1 seed; {jobs} jobs), "
              f"{args.rounds} rounds:")
        print(f"  local pool  {statistics.mean(walls['local']):6.1f} s  (each: "
              f"{', '.join(f'{w:.1f}' for w in walls['local'])})")
        print(f"  Ray         {statistics.mean(walls['ray']):6.1f} s  (each: {', '.join(f'{w:.1f}' for w in walls['ray'])})")
        print(f"  ratio Ray / local {statistics.median(ratios):.3f} (rounds: {', '.join(f'{x:.3f}' for x in ratios)}); "
              f"overhead per job {statistics.median(per_job):+.2f} s")
    ray.shutdown()


if __name__ == "__main__":
    main()
