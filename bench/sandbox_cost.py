"""What the sandbox costs: a worker start, a program run, a group of programs and a codegen step.

    .venv/bin/python bench/sandbox_cost.py [--rounds 10] [--steps 8]

Rounds interleave the two (plain, sandboxed, plain, ...) so that the machine's drift falls
on both. A *worker* is `run_in_worker` of a trivial target (Python start, our child, the
result back); a *program* is `python3 -c pass` started in a sandbox of its own; a *group of
8 programs* is one `run_programs` batch (one sandboxed driver, a fork per program under its
own limits), as a GRPO group of model-written solutions is scored; its plain side is the
same batch with the driver unsandboxed (Isolation.NONE). Prints medians in milliseconds and
the sandboxed/plain ratio.

Then the share of a training step: the embedded trainer runs `--steps` GRPO steps of the
reference harness (64 prompts x 8 samples) on `codegen` level 2 from a cached SFT base,
twice, judging each step's 512 programs (one batch) sandboxed and with the driver
unsandboxed; it prints the median step, the median judging time either way, and what the
sandbox adds as a share of the step.
"""
from __future__ import annotations

import argparse
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
from evotrainer.sandbox import Isolation, Jail, command, probe  # noqa: E402
from evotrainer.sandbox.programs import Program, run_programs  # noqa: E402

GROUP = [Program(f"def add(a, b):\n    return a + b + {i} - {i}\n", "add", ((1, 2), (3, 4)), (3, 7))
         for i in range(8)]


def worker_ms(level: Isolation) -> float:
    use_isolation(level)
    t = time.perf_counter()
    r = run_in_worker("worker_targets:add", {"a": 1, "b": 2}, timeout_s=60, cwd=ROOT / "tests", poll_s=0.01)
    assert r.ok and r.value == 3, r.log_tail
    return 1000 * (time.perf_counter() - t)


def program_ms(level: Isolation) -> float:
    with tempfile.TemporaryDirectory(prefix="evotrainer-bench-") as d:
        argv, env = command([sys.executable, "-c", "pass"], Jail(), level, Path(d))
        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True)
        return 1000 * (time.perf_counter() - t)


def group_ms(level: Isolation) -> float:
    t = time.perf_counter()
    outcomes = run_programs(GROUP, level=level)
    assert all(o.status == "passed" for o in outcomes), outcomes
    return 1000 * (time.perf_counter() - t)


def codegen_steps(level: Isolation, steps: int) -> tuple[list[float], list[float]]:
    """(step seconds, judging seconds) of `steps` reference-harness steps on codegen."""
    from evotrainer.harness import REFERENCE, load_harness
    from evotrainer.inner.grpo import GRPOTrainer
    from evotrainer.policy import load_policy
    from evotrainer.pretrain import PretrainConfig, pretrain
    from evotrainer.tasks import get_task
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
    trainer = GRPOTrainer(model, tok, task, load_harness(REFERENCE), seed=0)
    step_s = []
    for _ in range(steps):
        t = time.perf_counter()
        trainer.step()
        step_s.append(time.perf_counter() - t)
    return step_s, judged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=8, help="codegen training steps per side (0: skip)")
    args = p.parse_args()
    level = probe()
    if level is not Isolation.NAMESPACES:
        print(f"note: this machine allows only '{level.value}' isolation; measuring that")
    for name, fn in (("worker start", worker_ms), ("program run", program_ms), ("group of 8 programs", group_ms)):
        plain, boxed = [], []
        for _ in range(args.rounds):
            plain.append(fn(Isolation.NONE))
            boxed.append(fn(level))
        mp, mb = statistics.median(plain), statistics.median(boxed)
        print(f"{name:19} plain {mp:7.1f} ms  sandboxed ({level.value}) {mb:7.1f} ms  "
              f"+{mb - mp:6.1f} ms  ratio {mb / mp:4.2f}  (medians of {args.rounds})")
    if args.steps:
        steps_p, judge_p = codegen_steps(Isolation.NONE, args.steps)
        steps_b, judge_b = codegen_steps(level, args.steps)
        step, jp, jb = statistics.median(steps_b), statistics.median(judge_p), statistics.median(judge_b)
        print(f"codegen step (64 prompts x 8, level 2): {1000 * step:.0f} ms sandboxed; judging its 512 programs "
              f"{1000 * jb:.0f} ms sandboxed, {1000 * jp:.0f} ms with the driver plain; the sandbox adds "
              f"{1000 * (jb - jp):+.0f} ms, {100 * (jb - jp) / step:+.1f}% of the step (judging in all: "
              f"{100 * jb / step:.1f}%; medians of {args.steps} steps)")


if __name__ == "__main__":
    main()
