"""Our embedded GRPO trainer vs TRL's GRPOTrainer on a CPU: speed, and learning at equal steps.

Both start from the same policy, the tiny (~1M-parameter) Llama model's cached SFT base
(`evotrainer pretrain`; built here if missing, or --base PATH), on `arith` (3-digit
addition, the verifier's score as reward) under the reference recipe: --prompts x --group
rollouts a step, one optimizer step per batch, the task's completion budget (9 tokens),
temperature 1.0, lr 3e-4, no KL. The peer is plain TRL as bench/peers.py sets it up.

Speed. A/B interleaved in one process: each round times --steps steady-state steps of ours
(the embedded backend, writing its evidence as in a run) and of TRL (2 warm-up steps
dropped from each, trainer start-up included there); the order alternates. Reported:
steps/s per round, the medians, the median ours/TRL ratio and the spread of the ratios.
Where the speed comes from (the same update, computed with less work): ours runs each
distinct prompt through the model once and shares its KV cache across the group's rows, in
sampling and in the training forward; rows whose advantage is exactly 0 (dead groups) skip
the training forward and backward, which leaves the clipped-surrogate gradient unchanged
(tests/test_trainer.py); and sampling is a plain KV-cached loop without `generate`'s
processors.

Learning. On each of --learn-seeds paired seeds (the seed of the train stream and of
sampling, the same for every arm), three arms train --learn-steps steps from the base:
ours (embedded backend), our TRL backend (TRL's GRPOTrainer under the same harness) and
plain TRL. Each final checkpoint's greedy accuracy on the 500 validation problems is
measured by the evaluator; the table gives each arm's mean and sd and the paired
differences with 95% bootstrap CIs over seeds. Results are written as they come to
--out/learning.json, and a rerun skips what is there.

    .venv/bin/python bench/trainer_vs_trl.py                      # speed (3 rounds x 20 steps) and learning (5 seeds x 100 steps)
    .venv/bin/python bench/trainer_vs_trl.py --only speed --quick # 1 round x 5 steps (smoke test)
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
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
from evotrainer.evaluate.greedy import evaluate_checkpoints  # noqa: E402
from evotrainer.evolve.stats import bootstrap_ci  # noqa: E402
from evotrainer.harness import load_harness  # noqa: E402
from evotrainer.inner.backends import run_embedded  # noqa: E402
from evotrainer.policy import load_policy  # noqa: E402
from evotrainer.pretrain import pretrain  # noqa: E402
from evotrainer.runtime import Runtime  # noqa: E402
from evotrainer.tasks import get_task  # noqa: E402
from evotrainer.train import train_segment  # noqa: E402

WARMUP = 2
ARMS = ("ours", "trl_backend", "plain_trl")


def speed_ours(policy_dir, harness_dir, task, steps, seed, out):
    model, tok = load_policy(policy_dir)
    log = StampLog(out, WARMUP + steps, 0)
    run_embedded(model, tok, task, load_harness(harness_dir), seed, WARMUP + steps, log, None, Runtime())
    log.close()
    return steady_rate(log.ends, WARMUP)


def speed_trl(policy_dir, task, args, out):
    trainer, clock = plain_trl(policy_dir, task, args.prompts, args.group, WARMUP + args.steps, args.seed, out)
    trainer.train()
    return steady_rate(clock.ends, WARMUP)


def speed(args, base, task, tmp: Path) -> None:
    harness = reference_harness(tmp / "harness", args.prompts, args.group, eval_every=0)
    rows = []
    for r in range(args.rounds):
        res = {}
        for who in (("ours", "trl") if r % 2 == 0 else ("trl", "ours")):
            if who == "ours":
                res["ours"] = speed_ours(base, harness, task, args.steps, args.seed, tmp / f"ours{r}")
            else:
                res["trl"] = speed_trl(base, task, args, tmp / f"trl{r}")
            gc.collect()
        rows.append(res)
        print(f"round {r + 1}: ours {res['ours']:.3f} steps/s, TRL {res['trl']:.3f} steps/s, "
              f"ours/TRL {res['ours'] / res['trl']:.2f}", flush=True)
    ratios = [x["ours"] / x["trl"] for x in rows]
    med_o, med_t = statistics.median(x["ours"] for x in rows), statistics.median(x["trl"] for x in rows)
    print("\n| round | ours steps/s | TRL steps/s | ours/TRL |\n|---|---|---|---|")
    for i, (x, q) in enumerate(zip(rows, ratios), 1):
        print(f"| {i} | {x['ours']:.3f} | {x['trl']:.3f} | {q:.2f} |")
    print(f"| median | {med_o:.3f} | {med_t:.3f} | {med_o / med_t:.2f} |")
    print(f"\nours/TRL of medians {med_o / med_t:.2f}; median of per-round ratios {statistics.median(ratios):.2f}, "
          f"spread {min(ratios):.2f}-{max(ratios):.2f}")


def train_arm(arm: str, base: Path, task, harness: Path, seed: int, steps: int, out: Path, args) -> Path:
    """Train one arm from the base; return its final checkpoint."""
    shutil.rmtree(out, ignore_errors=True)
    if arm == "plain_trl":
        trainer, _ = plain_trl(base, task, args.prompts, args.group, steps, seed, out / "trl")
        trainer.train()
        trainer.save_model(str(out / "checkpoint"))
        trainer.processing_class.save_pretrained(out / "checkpoint")
    else:
        runtime = Runtime("embedded" if arm == "ours" else "trl")
        train_segment(task.spec, task.target_level, str(harness), str(base), str(out), seed, steps, runtime.to_dict())
    return out / "checkpoint"


def learning(args, base, task, tmp: Path) -> None:
    out_file = args.out / "learning.json"
    args.out.mkdir(parents=True, exist_ok=True)
    done = json.loads(out_file.read_text()) if out_file.exists() else {}
    harness = reference_harness(tmp / "harness-learn", args.prompts, args.group, eval_every=0)
    seeds = list(range(args.first_seed, args.first_seed + args.learn_seeds))
    for seed in seeds:
        for arm in ARMS:
            key = f"{arm}/{seed}"
            if key in done:
                continue
            t0 = time.time()
            ckpt = train_arm(arm, base, task, harness, seed, args.learn_steps, tmp / key, args)
            val = evaluate_checkpoints(task.spec, task.target_level, {str(ckpt): ["val"]})[str(ckpt)]["val"]
            done[key] = {"val": val, "seconds": round(time.time() - t0, 1)}
            out_file.write_text(json.dumps(done, indent=2))
            print(f"seed {seed} {arm}: val {100 * val:.1f}% ({done[key]['seconds']} s)", flush=True)
            gc.collect()
    acc = {arm: [100 * done[f"{arm}/{s}"]["val"] for s in seeds] for arm in ARMS}
    print(f"\nGreedy validation accuracy (%) after {args.learn_steps} steps, {len(seeds)} paired seeds {seeds}")
    print("\n| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | sd |\n|---|" + "---|" * (len(seeds) + 2))
    for arm in ARMS:
        xs = acc[arm]
        print(f"| {arm} | " + " | ".join(f"{x:.1f}" for x in xs) + f" | {statistics.mean(xs):.1f} | "
              f"{statistics.stdev(xs) if len(xs) > 1 else 0:.1f} |")
    print("\n| difference | mean | 95% CI |\n|---|---|---|")
    for a, b in (("ours", "plain_trl"), ("trl_backend", "plain_trl"), ("ours", "trl_backend")):
        d = [x - y for x, y in zip(acc[a], acc[b])]
        lo, hi = bootstrap_ci(d)
        print(f"| {a} - {b} | {statistics.mean(d):+.1f} | [{lo:+.1f}, {hi:+.1f}] |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round (speed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--learn-steps", type=int, default=100)
    ap.add_argument("--learn-seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--only", choices=("speed", "learning"), default=None)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the speed rounds")
    ap.add_argument("--base", type=Path, default=None, help="policy checkpoint (default: the cached SFT base)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-runs" / "trainer-vs-trl")
    ap.add_argument("--quick", action="store_true", help="1 round of 5 steps; learning: 2 seeds x 10 steps")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.learn_seeds, args.learn_steps = 1, 5, 2, 10
        args.out = args.out.with_name(args.out.name + "-quick")
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import transformers
    import trl
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(f"torch {torch.__version__} threads={torch.get_num_threads()}, transformers {transformers.__version__}, "
          f"trl {trl.__version__}; batch {args.prompts} prompts x {args.group}")
    task = get_task("arith")
    t_start = time.perf_counter()
    base = args.base or pretrain(task)[0]
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "speed"):
            print(f"\n## Speed: {args.steps} timed steps x {args.rounds} rounds")
            speed(args, base, task, Path(tmp))
        if args.only in (None, "learning"):
            print(f"\n## Learning: {args.learn_steps} steps x {args.learn_seeds} seeds")
            learning(args, base, task, Path(tmp))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
