"""`evotrainer train`: one training run of a harness from the base, with evaluation.

Writes to OUT: checkpoint/ (Hugging Face format), metrics.jsonl (one line per step, plus
evaluation lines), evidence.jsonl (one line per rollout), harness/ (a copy of the harness
that ran) and summary.json; returns the summary.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from evotrainer.evaluate import accuracy
from evotrainer.evidence import EvidenceWriter
from evotrainer.harness import Harness
from evotrainer.inner import GRPOTrainer, StepMetrics
from evotrainer.policy import load_policy, save_policy
from evotrainer.tasks import Task


def train_run(task: Task, harness: Harness, base: Path, out: Path, seed: int = 0,
              steps: int | None = None,
              on_step: Callable[[StepMetrics, float | None], None] | None = None) -> dict:
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_policy(base)
    steps = harness.knobs.steps if steps is None else steps
    val_set, test_set = task.split("val"), task.split("test")
    base_val = accuracy(model, tok, task, val_set)
    base_test = accuracy(model, tok, task, test_set)
    shutil.copytree(harness.path, out / "harness", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    trainer = GRPOTrainer(model, tok, task, harness, seed=seed)
    evidence = EvidenceWriter(out / "evidence.jsonl")
    evals = [{"step": 0, "val": base_val}]
    first = last = None
    eval_every = harness.knobs.eval_every
    with open(out / "metrics.jsonl", "w") as mf:
        for _ in range(steps):
            m, recs = trainer.step()
            evidence.write(recs)
            first = first or m
            last = m
            val = None
            if eval_every and m.step % eval_every == 0 and m.step < steps:
                val = accuracy(model, tok, task, val_set)
                evals.append({"step": m.step, "val": val})
            mf.write(json.dumps({**m.to_dict(), **({"val": val} if val is not None else {})}) + "\n")
            mf.flush()
            if on_step:
                on_step(m, val)
    evidence.close()
    with torch.inference_mode():
        val, test = accuracy(model, tok, task, val_set), accuracy(model, tok, task, test_set)
    evals.append({"step": steps, "val": val})
    save_policy(model, tok, out / "checkpoint")
    summary = {
        "task": task.name, "level": task.target_level, "seed": seed, "steps": steps,
        "harness": str(harness.path), "harness_hash": harness.content_hash[:12],
        "base_val": base_val, "base_test": base_test, "val": val, "test": test,
        "evals": evals,
        "reward_first": first.reward_mean if first else None,
        "reward_last": last.reward_mean if last else None,
        "seconds": round(time.time() - t0, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
