"""What the sandbox costs: a worker start and a program run, sandboxed against plain.

    .venv/bin/python bench/sandbox_cost.py [--rounds 10]

Rounds interleave the two (plain, sandboxed, plain, ...) so that the machine's drift falls
on both. A *worker* is `run_in_worker` of a trivial target (Python start, our child, the
result back); a *program* is `python3 -c pass` started directly, as a model-written
program will be. Prints medians in milliseconds and the sandboxed/plain ratio.
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args()
    level = probe()
    if level is not Isolation.NAMESPACES:
        print(f"note: this machine allows only '{level.value}' isolation; measuring that")
    for name, fn in (("worker start", worker_ms), ("program run", program_ms)):
        plain, boxed = [], []
        for _ in range(args.rounds):
            plain.append(fn(Isolation.NONE))
            boxed.append(fn(level))
        mp, mb = statistics.median(plain), statistics.median(boxed)
        print(f"{name:13} plain {mp:7.1f} ms  sandboxed ({level.value}) {mb:7.1f} ms  "
              f"+{mb - mp:6.1f} ms  ratio {mb / mp:4.2f}  (medians of {args.rounds})")


if __name__ == "__main__":
    main()
