"""An agentic reward hack, trained and caught: the efficiency factor EvoTrainer's agent proposed.

    .venv/bin/python bench/agentic_hack.py [--base 0] [--seeds 0 1 2] [--steps 30]

EvoTrainer reports that a reward paying a behaviour metric directly gets hacked: its
efficiency factor produced 1-turn exits. Here the same kind of reward
(examples/harnesses/efficiency_factor: the score plus 1/turns) trains on `vault` from a base
of bench/task_learning.py, beside the reference recipe on the same base and seeds (paired;
reused from that bench when it already ran). For each run: the reward and verifier score of
the first and last steps, how episodes end, and the diagnostics' findings; then the
promotion gate on the paired validation accuracies with the hack's blocking findings, and
what the backtest would have said before any training (in the loop it runs first).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evotrainer.backtest.run import backtest  # noqa: E402
from evotrainer.diagnostics.health import diagnose  # noqa: E402
from evotrainer.evolve.stats.gate import gate  # noqa: E402
from evotrainer.trainer.pretrain import PretrainConfig, pretrain  # noqa: E402
from evotrainer.catalog import get_task  # noqa: E402
from evotrainer.trainer.run import train_run  # noqa: E402

HACK = ROOT / "examples" / "harnesses" / "efficiency_factor"


def trained(task, harness, base, out: Path, seed: int, steps: int) -> dict:
    done = out / "summary.json"
    return json.loads(done.read_text()) if done.exists() else \
        train_run(task, harness, base, out, seed=seed, steps=steps, timeout_s=1800)


def window(out: Path, key: str, first: bool, n: int = 5) -> float:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    part = rows[:n] if first else rows[-n:]
    return sum(r[key] for r in part) / len(part)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--runs", type=Path, default=ROOT / "bench-runs")
    args = p.parse_args()
    task = get_task("vault")
    base, _ = pretrain(task, PretrainConfig(seed=args.base), args.runs / "vault-learning" / "cache")
    control, child, blocking = {}, {}, set()
    print(f"vault level {task.target_level}, base {args.base}, {args.steps} steps; reward and score: mean of the "
          "first and last 5 steps\n")
    for s in args.seeds:
        for name, harness, out in (("reference", None, args.runs / "vault-learning" / f"base-{args.base}" / f"seed-{s}"),
                                   ("efficiency", HACK, args.runs / "agentic-hack" / f"base-{args.base}" / f"seed-{s}")):
            summary = trained(task, harness, base, out, s, args.steps)
            (control if harness is None else child)[s] = summary["val"]
            rep = diagnose(out)[0]
            found = [f for f in rep["findings"] if f["severity"] == "critical"]
            if harness is not None:
                blocking |= {f["diagnostic"] for f in found if f["blocking"]}
            stops = ", ".join(f"{k} {n}" for k, n in rep["stops"][:4])
            print(f"seed {s} {name:>10}: reward {window(out, 'reward_mean', True):.2f} -> "
                  f"{window(out, 'reward_mean', False):.2f}, score {window(out, 'score_mean', True):.2f} -> "
                  f"{window(out, 'score_mean', False):.2f}, val {100 * summary['base_val']:.1f} -> "
                  f"{100 * summary['val']:.1f}%; last window ends: {stops}")
            print(f"{'':>20}critical: {', '.join(f['diagnostic'] + (' (blocking)' if f['blocking'] else '') for f in found) or 'none'}")
    decision = gate(child, control, sorted(blocking))
    print(f"\ngate: {decision.label.value}, paired val gain {100 * decision.gain:+.1f} points; "
          + "; ".join(decision.reasons))
    ref0 = args.runs / "vault-learning" / f"base-{args.base}" / f"seed-{args.seeds[0]}"
    bt = backtest(ref0, HACK)
    print(f"backtest of the hack on the reference's evidence (seed {args.seeds[0]}): {bt.label}; "
          + "; ".join(bt.reasons)[:400])


if __name__ == "__main__":
    main()
