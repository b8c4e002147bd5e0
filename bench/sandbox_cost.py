"""What the sandbox costs: a worker start, a program run, a group of programs and a codegen step.

    .venv/bin/python bench/sandbox_cost.py [--rounds 10] [--steps 8]

First, a job's start: milliseconds from a job submitted to its harness code running (torch and
the reference harness loaded, as a training job has them before its first slot call), each
job a fresh sandboxed interpreter (cold) against a fork of the fork server
(sandbox/forkserver.py: warm), alternating; the warm side's first job, which starts the
server, is reported on its own.

Rounds interleave the two (plain, sandboxed, plain, ...) so that the machine's drift falls
on both. A *worker* is `run_in_worker` of a trivial target (Python start, our child, the
result back); a *program* is `python3 -c pass` started in a sandbox of its own; a *group of
8 programs* is one `run_programs` batch (one sandboxed driver, a fork per program under its
own limits), as a GRPO group of model-written solutions is scored; its plain side is the
same batch with the driver unsandboxed (Isolation.NONE). Prints medians in milliseconds and
the sandboxed/plain ratio.

Then the share of a training step: the embedded trainer runs `--steps` GRPO steps of the
reference harness (64 prompts x 8 samples) on `codegen` level 2 from a cached SFT base,
three times, judging each step's 512 programs (one batch): with one unsandboxed driver, one
sandboxed driver, and the default (a sandboxed driver per core); it prints the median
step, the median judging time each way, and what the sandbox adds as a share of the step.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # worker_targets: the trivial target

from evotrainer.executors import run_in_worker, use_isolation  # noqa: E402
from worker_targets import add, harness_ready  # noqa: E402
from evotrainer.executors.worker import close_fork_servers, use_fork_server  # noqa: E402
from evotrainer.sandbox import Isolation, Jail, command, probe  # noqa: E402
from evotrainer.sandbox.programs import Program, run_programs  # noqa: E402

GROUP = [Program(f"def add(a, b):\n    return a + b + {i} - {i}\n", "add", ((1, 2), (3, 4)), (3, 7))
         for i in range(8)]


def worker_ms(level: Isolation) -> float:
    use_isolation(level)
    t = time.perf_counter()
    r = run_in_worker(add, {"a": 1, "b": 2}, timeout_s=60, cwd=ROOT / "tests", poll_s=0.01)
    assert r.ok and r.value == 3, r.log_tail
    return 1000 * (time.perf_counter() - t)


def job_start_ms(level: Isolation, warm: bool) -> float:
    """Submitted -> the job's harness code running, as a fresh interpreter or a fork of the server."""
    use_isolation(level)
    use_fork_server(warm)
    t = time.time()
    r = run_in_worker(harness_ready, timeout_s=120, cwd=ROOT / "tests", poll_s=0.01)
    assert r.ok, r.log_tail
    return 1000 * (r.value - t)


def program_ms(level: Isolation) -> float:
    with tempfile.TemporaryDirectory(prefix="evotrainer-bench-") as d:
        argv, env = command([sys.executable, "-c", "pass"], Jail(), level, job_dir=Path(d))
        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True)
        return 1000 * (time.perf_counter() - t)


def group_ms(level: Isolation) -> float:
    t = time.perf_counter()
    outcomes = run_programs(GROUP, level=level)
    assert all(o.status == "passed" for o in outcomes), outcomes
    return 1000 * (time.perf_counter() - t)


def codegen_steps(level: Isolation, steps: int, drivers: int | None) -> tuple[list[float], list[float]]:
    """(step seconds, judging seconds) of `steps` reference-harness steps on codegen, its
    programs judged by `drivers` sandboxes side by side (None: the default)."""
    from evotrainer.sandbox import programs
    from evotrainer.harness import REFERENCE, load_harness
    from evotrainer.trainer.grpo import GRPOTrainer
    from evotrainer.policy import load_policy
    from evotrainer.trainer.pretrain import PretrainConfig, pretrain
    from evotrainer.catalog import get_task
    use_isolation(level)
    task = get_task("codegen")
    base, _ = pretrain(task, PretrainConfig(), ROOT / "bench-runs" / "sandbox-cost" / "cache")
    model, tok = load_policy(base)
    judged: list[float] = []
    judge = task.judge_many

    def timed(problems, completions):
        t = time.perf_counter()
        out = judge(problems, completions)
        judged.append(time.perf_counter() - t)
        return out
    task.judge_many = timed
    run = programs.run_programs
    programs.run_programs = functools.partial(run, drivers=drivers)  # codegen imports it when it judges
    try:
        trainer = GRPOTrainer(model, tok, task, load_harness(REFERENCE), seed=0)
        step_s = []
        for _ in range(steps):
            t = time.perf_counter()
            trainer.step()
            step_s.append(time.perf_counter() - t)
    finally:
        programs.run_programs = run
    return step_s, judged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=8, help="codegen training steps per side (0: skip)")
    args = p.parse_args()
    level = probe()
    if level is not Isolation.NAMESPACES:
        print(f"note: this machine allows only '{level.value}' isolation; measuring that")
    close_fork_servers()
    first = job_start_ms(level, warm=True)  # starts the server: its imports, once per controller
    cold, warm = [], []
    for _ in range(args.rounds):
        cold.append(job_start_ms(level, warm=False))
        warm.append(job_start_ms(level, warm=True))
    mc, mw = statistics.median(cold), statistics.median(warm)
    print(f"job start to harness code ({level.value}): fresh interpreter {mc:7.1f} ms  fork server {mw:7.1f} ms  "
          f"ratio {mc / mw:5.1f}  (medians of {args.rounds}; the server's own start, with its first job: "
          f"{first:.0f} ms)")
    use_fork_server(True)
    for name, fn in (("worker start", worker_ms), ("program run", program_ms), ("group of 8 programs", group_ms)):
        plain, boxed = [], []
        for _ in range(args.rounds):
            plain.append(fn(Isolation.NONE))
            boxed.append(fn(level))
        mp, mb = statistics.median(plain), statistics.median(boxed)
        print(f"{name:19} plain {mp:7.1f} ms  sandboxed ({level.value}) {mb:7.1f} ms  "
              f"+{mb - mp:6.1f} ms  ratio {mb / mp:4.2f}  (medians of {args.rounds})")
    if args.steps:
        med = statistics.median
        _, judge_p = codegen_steps(Isolation.NONE, args.steps, 1)
        steps_1, judge_1 = codegen_steps(level, args.steps, 1)
        steps_n, judge_n = codegen_steps(level, args.steps, None)
        jp, j1, jn, step1, stepn = med(judge_p), med(judge_1), med(judge_n), med(steps_1), med(steps_n)
        print(f"codegen step (64 prompts x 8, level 2; medians of {args.steps} steps): judging its 512 programs "
              f"{1000 * jp:.0f} ms with one plain driver, {1000 * j1:.0f} ms with one sandboxed driver: the sandbox "
              f"adds {1000 * (j1 - jp):+.0f} ms, {100 * (j1 - jp) / step1:+.1f}% of a {1000 * step1:.0f} ms step; "
              f"a sandboxed driver per core: {1000 * jn:.0f} ms, {100 * jn / stepn:.1f}% of a "
              f"{1000 * stepn:.0f} ms step")


if __name__ == "__main__":
    main()
