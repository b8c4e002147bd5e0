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
plain TRL. Each run's greedy accuracy on the 500 validation problems is the mean of the
evaluator's scores at steps 80, 90 and 100 (of 100): one evaluation alone spreads up to 16
points across seeds. Beside it, the training score: the mean verifier score of the rollouts
each run trained on over its last quarter, 25 x 512 samples, a far less noisy reading of
how it learns. The tables give each arm's mean and sd and the paired differences with 95%
CIs over seeds (percentile bootstrap, and Student's t, which is wider at few seeds).
Results are written as they come to --out/learning.json, and a rerun skips what is there.

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
from evotrainer.evolve.stats.paired import bootstrap_ci  # noqa: E402
from evotrainer.harness import load_harness  # noqa: E402
from evotrainer.trainer.backends import run_embedded  # noqa: E402
from evotrainer.policy import load_policy  # noqa: E402
from evotrainer.trainer.pretrain import pretrain  # noqa: E402
from evotrainer.runtime import Runtime  # noqa: E402
from evotrainer.catalog import get_task  # noqa: E402
from evotrainer.trainer.jobs import train_segment  # noqa: E402

WARMUP = 2
ARMS = ("ours", "trl_backend", "plain_trl")
LAST_K = 3  # one greedy evaluation spreads up to 16 points across seeds: average the last three
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20,
       12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11, 18: 2.10, 19: 2.09}  # Student's t, 97.5%


def speed_ours(policy_dir, harness_dir, task, steps, seed, out):
    model, tok = load_policy(policy_dir)
    log = StampLog(out, WARMUP + steps, 0)
    run_embedded(model, tok, task, load_harness(harness_dir), seed=seed, steps=WARMUP + steps, log=log,
                 optimizer_state=None, runtime=Runtime())
    log.close()
    return steady_rate(log.ends, WARMUP)


def speed_trl(policy_dir, task, args, out):
    trainer, clock = plain_trl(policy_dir, task, args.prompts, args.group, WARMUP + args.steps, args.seed, out)
    trainer.train()
    return steady_rate(clock.ends, WARMUP)


def speed(args, base, task, tmp: Path) -> None:
    harness = reference_harness(tmp / "harness", args.prompts, args.group)
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


def train_arm(arm: str, base: Path, task, harness: Path, seed: int, steps: int, out: Path, args):
    """Train one arm from the base; return its last LAST_K checkpoints and its per-step mean verifier
    score (of the rollouts it trained on)."""
    shutil.rmtree(out, ignore_errors=True)
    every = steps // 10
    last = [steps - every * i for i in range(LAST_K - 1, 0, -1)]  # e.g. steps 80 and 90 of 100
    if arm == "plain_trl":
        trainer, clock = plain_trl(base, task, args.prompts, args.group, steps, seed, out, save_at=tuple(last))
        trainer.train()
        trainer.save_model(str(out / "checkpoint"))
        scores = clock.scores
    else:
        runtime = Runtime("embedded" if arm == "ours" else "trl")
        train_segment(task.spec, task.target_level, str(harness), str(base), str(out), seed=seed, steps=steps,
                      runtime=runtime.to_dict(), eval_every=every)
        scores = [json.loads(line)["score_mean"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [out / "checkpoints" / f"step-{s}" for s in last] + [out / "checkpoint"], scores


def table(title: str, seeds: list[int], acc: dict[str, list[float]]) -> None:
    print(f"\n{title}\n\n| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | sd |\n|---|"
          + "---|" * (len(seeds) + 2))
    for arm in ARMS:
        xs = acc[arm]
        print(f"| {arm} | " + " | ".join(f"{x:.1f}" for x in xs) + f" | {statistics.mean(xs):.1f} | "
              f"{statistics.stdev(xs) if len(xs) > 1 else 0:.1f} |")
    print("\n| difference | mean | 95% CI (bootstrap) | 95% CI (t) |\n|---|---|---|---|")
    for a, b in (("ours", "plain_trl"), ("trl_backend", "plain_trl"), ("ours", "trl_backend")):
        d = [x - y for x, y in zip(acc[a], acc[b])]
        lo, hi = bootstrap_ci(d)
        half = T95[len(d) - 1] * statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
        m = statistics.mean(d)
        print(f"| {a} - {b} | {m:+.1f} | [{lo:+.1f}, {hi:+.1f}] | [{m - half:+.1f}, {m + half:+.1f}] |")


def learning(args, base, task, tmp: Path) -> None:
    out_file = args.out / "learning.json"
    args.out.mkdir(parents=True, exist_ok=True)
    done = json.loads(out_file.read_text()) if out_file.exists() else {}
    harness = reference_harness(tmp / "harness-learn", args.prompts, args.group)
    seeds = list(range(args.first_seed, args.first_seed + args.learn_seeds))
    for seed in seeds:
        for arm in ARMS:
            key = f"{arm}/{seed}"
            if key in done:
                continue
            t0 = time.time()
            ckpts, scores = train_arm(arm, base, task, harness, seed, args.learn_steps, tmp / key, args)
            acc = evaluate_checkpoints(task.spec, task.target_level, {str(c): ["val"] for c in ckpts})
            done[key] = {"val": [acc[str(c)]["val"] for c in ckpts], "train_score": scores,
                         "seconds": round(time.time() - t0, 1)}
            out_file.write_text(json.dumps(done, indent=2))
            print(f"seed {seed} {arm}: val {', '.join(f'{100 * v:.1f}' for v in done[key]['val'])}% "
                  f"({done[key]['seconds']} s)", flush=True)
            gc.collect()
    n = args.learn_steps
    table(f"Greedy validation accuracy (%), the mean of the evaluations at steps {n - 2 * n // 10}, {n - n // 10} and "
          f"{n}, {len(seeds)} paired seeds {seeds}", seeds,
          {arm: [100 * statistics.mean(done[f"{arm}/{s}"]["val"]) for s in seeds] for arm in ARMS})
    table("Training score (%): mean verifier score of the rollouts of the last quarter of the steps", seeds,
          {arm: [100 * statistics.mean(done[f"{arm}/{s}"]["train_score"][-(n // 4):]) for s in seeds] for arm in ARMS})


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
