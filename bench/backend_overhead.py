"""What our TRL backend costs on top of plain TRL: the same GRPOTrainer at the same config.

The TRL backend is TRL's GRPOTrainer with the harness's slots hooked in (trainer/trl_backend.py):
our prompt stream and encoding, the harness's reward, filter and advantage, and the evidence
records and step metrics every backend writes. Plain TRL (bench/peers.py) runs the same
reference recipe with a reward function that returns the verifier's score. Both train the
same policy for --steps steady-state steps (after 2 warm-up steps) per round, A/B
interleaved, the order alternating; reported: steps/s of each, the median ratio, and the
backend's overhead, 1 - backend/plain (goal: 5% or less on a GPU).

    .venv/bin/python bench/backend_overhead.py                         # CPU, the cached tiny base, 64 x 8
    .venv/bin/python bench/backend_overhead.py --model DIR --device cuda --bf16   # a GPU
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from peers import StampLog, plain_trl, reference_harness, steady_rate  # noqa: E402
from evotrainer.harness import load_harness  # noqa: E402
from evotrainer.trainer.trl_backend import run_trl  # noqa: E402
from evotrainer.policy import load_policy  # noqa: E402
from evotrainer.policy.config import PolicyConfig  # noqa: E402
from evotrainer.trainer.pretrain import pretrain  # noqa: E402
from evotrainer.runtime import Runtime  # noqa: E402
from evotrainer.catalog import get_task  # noqa: E402

WARMUP = 2


def backend_rate(model_dir, harness_dir, task, args, out) -> float:
    runtime = Runtime("trl", PolicyConfig("bf16" if args.bf16 else "fp32", args.device))
    model, tok = load_policy(model_dir, runtime.policy)
    log = StampLog(out, WARMUP + args.steps, 0)
    run_trl(model, tok, task, load_harness(harness_dir), seed=args.seed, steps=WARMUP + args.steps, log=log,
            optimizer_state=None, runtime=runtime)
    log.close()
    return steady_rate(log.ends, WARMUP)


def plain_rate(model_dir, task, args, out) -> float:
    trainer, clock = plain_trl(model_dir, task, args.prompts, args.group, WARMUP + args.steps, args.seed, out,
                               device=args.device, bf16=args.bf16)
    trainer.train()
    return steady_rate(clock.ends, WARMUP)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, default=None, help="policy directory (default: the cached tiny SFT base)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast in both")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    import trl
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(f"torch {torch.__version__} threads={torch.get_num_threads()}, transformers {transformers.__version__}, "
          f"trl {trl.__version__}; {args.device}{' bf16' if args.bf16 else ''}; batch {args.prompts} x {args.group}, "
          f"{args.steps} timed steps x {args.rounds} rounds")
    task = get_task("arith")
    model = args.model or pretrain(task)[0]
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        harness = reference_harness(tmp / "harness", args.prompts, args.group)
        for r in range(args.rounds):
            res = {}
            for who in (("backend", "plain") if r % 2 == 0 else ("plain", "backend")):
                if who == "backend":
                    res[who] = backend_rate(model, harness, task, args, tmp / f"backend{r}")
                else:
                    res[who] = plain_rate(model, task, args, tmp / f"plain{r}")
                gc.collect()
            rows.append(res)
            print(f"round {r + 1}: TRL backend {res['backend']:.3f} steps/s, plain TRL {res['plain']:.3f} steps/s, "
                  f"backend/plain {res['backend'] / res['plain']:.3f}", flush=True)
    ratios = [x["backend"] / x["plain"] for x in rows]
    print("\n| round | TRL backend steps/s | plain TRL steps/s | backend/plain |\n|---|---|---|---|")
    for i, (x, q) in enumerate(zip(rows, ratios), 1):
        print(f"| {i} | {x['backend']:.3f} | {x['plain']:.3f} | {q:.3f} |")
    med = statistics.median(ratios)
    print(f"\nmedian backend/plain {med:.3f} (spread {min(ratios):.3f}-{max(ratios):.3f}): the TRL backend's "
          f"overhead {100 * (1 - med):+.1f}%; total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
