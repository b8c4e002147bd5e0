"""Steady-state training speed on a CPU: our embedded GRPO trainer vs TRL's GRPOTrainer.

Both train the same tiny (~1M-parameter) Llama policy, loaded fresh each round from the
cached SFT base (`evotrainer pretrain`; built here if missing, or --base PATH), so that
completions, dead groups and lengths are those of a real run rather than of a random
init, on `arith` (3-digit addition, binary verifier reward) with the same
batch (prompts x group completions, one optimizer step per batch), the same completion
budget (the task's max_new_tokens, 9), temperature 1.0, lr 3e-4, no KL (beta 0, so
neither builds a reference model), no eval, no checkpoints, no logging. TRL runs with
loss_type="dapo" (token mean over the batch, like our reference `token_mean`), fp32
(bf16 off), gradient checkpointing off (TRL's default is on), transformers generate
(no vLLM), constant lr, AdamW betas (0.9, 0.99), grad-norm clip 1.0, like ours.

Where the speed comes from (the same update, computed with less work): ours runs each
distinct prompt through the model once and shares its KV cache across the group's 8 rows,
in sampling and in the training forward; rows whose advantage is exactly 0 (dead groups)
skip the training forward and backward, which leaves the clipped-surrogate gradient
unchanged (tests/test_trainer.py checks both against a full pass); and sampling is a plain
KV-cached loop without `generate`'s processors. TRL does each of these the long way.

A/B interleaved in one process: each round times --steps steps of ours (after 2
untimed warm-up steps) and --steps steady-state steps of TRL (a callback stamps each
step end; the first 2 steps, with trainer start-up, are dropped); the order alternates.
Reported: steps/s per round, the median of each, the median ours/TRL ratio and the
spread of the per-round ratios.

    .venv/bin/python bench/trainer_vs_trl.py            # 3 rounds x 20 steps, 64 x 8 (the reference batch)
    .venv/bin/python bench/trainer_vs_trl.py --quick    # 1 round x 5 steps (smoke test)
"""
from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import yaml

import evotrainer  # sets the HF offline mode before transformers/trl are imported
from evotrainer.harness import REFERENCE, load_harness
from evotrainer.inner import GRPOTrainer as OurTrainer
from evotrainer.policy import build_tokenizer, load_policy
from evotrainer.policy.generate import encode_prompts
from evotrainer.pretrain import pretrain
from evotrainer.tasks import get_task

WARMUP = 2


def run_ours(policy_dir, harness_dir, task, steps, seed):
    model, tok = load_policy(policy_dir)
    trainer = OurTrainer(model, tok, task, load_harness(harness_dir), seed=seed)
    for _ in range(WARMUP):
        trainer.step()
    gen_s, t0 = 0.0, time.perf_counter()
    for _ in range(steps):
        m, _ = trainer.step()
        gen_s += m.generate_seconds
    wall = time.perf_counter() - t0
    return steps / wall, gen_s / wall


def run_trl(policy_dir, task, args, out_dir, report_bos=False):
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    n_steps = WARMUP + args.steps
    problems = task.train_stream(args.seed + 1).batch([task.target_level] * (args.prompts * n_steps))
    # Plain-text prompts, BOS written in the text exactly as ours encodes them.
    bos = build_tokenizer().bos_token
    by_prompt = {bos + p.prompt: p for p in problems}
    dataset = Dataset.from_dict({"prompt": list(by_prompt)})

    def arith_score(prompts, completions, **_):
        return [task.score(by_prompt[p], c) for p, c in zip(prompts, completions)]

    class StepClock(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, *_, **__):
            self.ends.append(time.perf_counter())

    B = args.prompts * args.group
    config = GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=B, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=args.group, num_iterations=1, max_steps=n_steps,
        max_completion_length=task.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, loss_type="dapo", epsilon=0.2, scale_rewards="group",
        learning_rate=3e-4, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.99, max_grad_norm=1.0,
        use_vllm=False, log_completions=False, report_to="none", save_strategy="no",
        eval_strategy="no", logging_steps=10**9, disable_tqdm=True, seed=args.seed,
        dataloader_pin_memory=False,
    )
    clock = StepClock()
    trainer = GRPOTrainer(model=str(policy_dir), reward_funcs=arith_score, args=config,
                          train_dataset=dataset, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # no end-of-training metrics dump
    if report_bos:
        ids = trainer._tokenize_prompts(dataset["prompt"][:1])[0][0]
        ours = encode_prompts(trainer.processing_class, [problems[0].prompt])[0][0].tolist()
        print(f"TRL prompt ids {ids} vs ours {ours}: {'identical' if ids == ours else 'DIFFERENT'}; "
              f"TRL eos ids {trainer.eos_token_ids}; per step {config.generation_batch_size} completions "
              f"= {config.generation_batch_size // args.group} prompts x {args.group}, "
              f"steps_per_generation {config.steps_per_generation}")
    trainer.train()
    ends = clock.ends[WARMUP - 1:]  # end of the last warm-up step .. end of the last step
    return (len(ends) - 1) / (ends[-1] - ends[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads for both (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base", type=Path, default=None, help="policy checkpoint (default: the cached SFT base)")
    ap.add_argument("--quick", action="store_true", help="1 round of 5 steps")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps = 1, 5
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import transformers
    import trl
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(f"torch {torch.__version__} threads={torch.get_num_threads()}, transformers "
          f"{transformers.__version__}, trl {trl.__version__}; batch {args.prompts} prompts x "
          f"{args.group}, {args.steps} timed steps x {args.rounds} rounds")

    task = get_task("arith")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.base is None:
            args.base, _ = pretrain(task)
        shutil.copytree(args.base, tmp / "policy")
        shutil.copytree(REFERENCE, tmp / "harness")
        knobs = yaml.safe_load((tmp / "harness" / "knobs.yaml").read_text())
        knobs.update(prompts_per_step=args.prompts, group_size=args.group)
        (tmp / "harness" / "knobs.yaml").write_text(yaml.safe_dump(knobs))

        rows = []
        for r in range(args.rounds):
            res = {}
            for who in (("ours", "trl") if r % 2 == 0 else ("trl", "ours")):
                if who == "ours":
                    res["ours"], res["gen"] = run_ours(tmp / "policy", tmp / "harness", task, args.steps, args.seed)
                else:
                    res["trl"] = run_trl(tmp / "policy", task, args, tmp / f"trl{r}", report_bos=r == 0)
                gc.collect()
            rows.append(res)
            print(f"round {r + 1}: ours {res['ours']:.3f} steps/s (generation {res['gen']:.0%} of its time), "
                  f"TRL {res['trl']:.3f} steps/s, ours/TRL {res['ours'] / res['trl']:.2f}", flush=True)

    ratios = [x["ours"] / x["trl"] for x in rows]
    med_o = statistics.median(x["ours"] for x in rows)
    med_t = statistics.median(x["trl"] for x in rows)
    print("\n| round | ours steps/s | TRL steps/s | ours/TRL |\n|---|---|---|---|")
    for i, (x, q) in enumerate(zip(rows, ratios), 1):
        print(f"| {i} | {x['ours']:.3f} | {x['trl']:.3f} | {q:.2f} |")
    print(f"| median | {med_o:.3f} | {med_t:.3f} | {med_o / med_t:.2f} |")
    print(f"\nours/TRL of medians {med_o / med_t:.2f}; median of per-round ratios "
          f"{statistics.median(ratios):.2f}, spread {min(ratios):.2f}-{max(ratios):.2f}; "
          f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
