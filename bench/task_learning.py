"""Does the tiny policy learn a task by RL? Base against trained, several bases and seeds.

    .venv/bin/python bench/task_learning.py --task codegen [--bases 0 1 2] [--seeds 0 1 2] [--steps 40]
    .venv/bin/python bench/task_learning.py --task vault --steps 30
    .venv/bin/python bench/task_learning.py --task "vault?tool=off" --steps 30   # the no-tool control

Each base is its own SFT (`evotrainer pretrain --task T --base-seed B`, stopped at 25% on a
train-stream probe, with its own split key: its own validation and test problems), cached
under --out (a control such as `vault?tool=off` shares the open task's bases). Each (base,
seed) trains the reference harness `--steps` steps in a sandboxed worker, and the evaluator
scores the base and the result on the test split (greedy; codegen: solved only when every
hidden test passes; vault: the episode played to its answer). The gain is trained minus base, paired
by construction; per base the mean over seeds with a t interval, over all a t interval over
the bases' means (bases are the independent draws), so the claim does not hinge on one base or one seed.

`--sampled N` adds pass@1 at temperature 1 from N samples per test problem (what RL sees),
base and trained, scored by the evaluator in its own process. A multi-turn base can be far
better greedily than sampled (vault bases: 86-97% greedy at 10% sampled).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evotrainer.evolve.stats import paired as stats  # noqa: E402
from evotrainer.evolve.stats.paired import clustered_t_interval  # noqa: E402
from evotrainer.evaluate.sampled import evaluate_sampled  # noqa: E402
from evotrainer.executors.worker import run_in_worker  # noqa: E402
from evotrainer.trainer.pretrain import PretrainConfig, pretrain  # noqa: E402
from evotrainer.catalog import get_task  # noqa: E402
from evotrainer.trainer.run import train_run  # noqa: E402

def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and the 95% t interval (stats.t_interval; n - 1 degrees of freedom)."""
    return (sum(xs) / len(xs), *stats.t_interval(xs))


def sampled_pass1(task, checkpoint: Path, n: int) -> float:
    """pass@1 at temperature 1 on the test split, n samples a problem, in an evaluator process."""
    ev = run_in_worker(evaluate_sampled,
                       dict(task=task.spec, level=task.target_level, checkpoint=str(checkpoint), split="test",
                            samples=n, ks=[1], temperature=1.0, key=task.key.hex() if task.key else None),
                       timeout_s=1800, reveal=task.data_files())
    if not ev.ok:
        raise SystemExit(f"sampled evaluation of {checkpoint} failed:\n{ev.log_tail}")
    return ev.value["pass@1"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="codegen")
    p.add_argument("--bases", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--level", type=int, default=None, help="default: the task's target level")
    p.add_argument("--out", type=Path, default=None, help="default bench-runs/<task>-learning")
    p.add_argument("--sampled", type=int, default=0, metavar="N",
                   help="also pass@1 at temperature 1 from N samples per test problem")
    p.add_argument("--target-acc", type=float, default=PretrainConfig().target_acc,
                   help="the bases' SFT stop (0: the task's own; vault samples its probe at temperature 1)")
    args = p.parse_args()
    name = args.task.replace("?", "-").replace("=", "-")
    out_root = args.out or ROOT / "bench-runs" / f"{name}-learning"
    cache = (args.out or ROOT / "bench-runs" / f"{args.task.split('?')[0]}-learning") / "cache"  # controls share bases
    rows: dict[int, dict[int, dict]] = {}
    sampled: dict[int, float] = {}  # base seed -> the base's sampled pass@1
    for b in args.bases:
        task = get_task(args.task, args.level)
        t = time.time()
        base, meta = pretrain(task, PretrainConfig(seed=b, target_acc=args.target_acc), cache)
        print(f"base {b}: SFT {meta['steps']} steps, probe {meta['probe_acc']:.2f} ({time.time() - t:.0f} s)", flush=True)
        rows[b] = {}
        for s in args.seeds:
            out = out_root / f"base-{b}" / f"seed-{s}"
            done = out / "summary.json"
            summary = json.loads(done.read_text()) if done.exists() else \
                train_run(task, None, base, out, seed=s, steps=args.steps, timeout_s=1800)
            if args.sampled:
                summary["sampled"] = sampled_pass1(task, out / "checkpoint", args.sampled)
                if b not in sampled:
                    sampled[b] = sampled_pass1(task, base, args.sampled)
                summary["base_sampled"] = sampled[b]
            rows[b][s] = summary
            print(f"  seed {s}: test {100 * summary['base_test']:.1f} -> {100 * summary['test']:.1f} "
                  f"({summary['seconds']:.0f} s)"
                  + (f"; sampled {100 * summary['base_sampled']:.1f} -> {100 * summary['sampled']:.1f}"
                     if args.sampled else ""), flush=True)
    print(f"\n{args.task} level {task.target_level}, reference harness, {args.steps} steps; test accuracy %\n")
    print(f"{'base':>4} {'base test':>9} {'trained (per seed)':>24} {'gain':>6} {'95% t interval':>18}")
    table(rows, "test")
    if args.sampled:
        print(f"\nsampled at temperature 1, pass@1 from {args.sampled} samples per test problem, %\n")
        table(rows, "sampled")


def table(rows: dict[int, dict[int, dict]], key: str) -> None:
    """Per base: its accuracy, the trained seeds', their mean gain with a t interval; then all
    pairs with a t interval over the bases' means. key: "test" (greedy) or "sampled"; the base's is base_<key>."""
    gains_by_base = []
    for b, by_seed in rows.items():
        gains = [100 * (r[key] - r[f"base_{key}"]) for r in by_seed.values()]
        gains_by_base.append(gains)
        m, lo, hi = t_interval(gains)
        trained = " ".join(f"{100 * r[key]:.1f}" for r in by_seed.values())
        print(f"{b:>4} {100 * next(iter(by_seed.values()))[f'base_{key}']:>9.1f} {trained:>24} {m:>+6.1f} "
              f"[{lo:+6.1f}, {hi:+6.1f}]")
    flat = [g for row in gains_by_base for g in row]
    lo, hi = clustered_t_interval(gains_by_base)
    print(f"\nall {len(flat)} (base, seed) pairs: mean gain {sum(flat) / len(flat):+.1f} points, "
          f"95% t interval over the {len(gains_by_base)} bases' means [{lo:+.1f}, {hi:+.1f}], smallest {min(flat):+.1f}")


if __name__ == "__main__":
    main()
