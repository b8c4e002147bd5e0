"""Synthetic train directories: rollout evidence shaped like a low-accuracy arith run.

Each group is one 3-digit addition (answer written reversed, as the task does). Half the
groups are hard (almost never solved: dead under a binary reward), half are mixed. A
wrong answer is a near miss (one digit off) or a wrong-length string of digits, so
length, closeness to the answer and correctness vary independently enough for the
backtest to tell them apart. Rewards and advantages are recomputed from `reward_fn`
the way the trainer does (GRPO, normalised per group).
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from evotrainer.evidence import EvidenceWriter, RolloutRecord
from evotrainer.harness import REFERENCE

MAX_NEW_TOKENS = 9


def binary(rows, step):
    return [r["score"] for r in rows]


def _completion(rng, answer, correct):
    if correct:
        return answer
    if rng.random() < 0.5:  # near miss: one digit changed
        i = rng.randrange(len(answer))
        return answer[:i] + str((int(answer[i]) + rng.randrange(1, 10)) % 10) + answer[i + 1:]
    return "".join(rng.choice("0123456789") for _ in range(rng.choice([2, 3, 5, 6, 8, 9])))


def write_train_dir(path: Path, steps: int = 12, groups: int = 16, G: int = 8, seed: int = 0,
                    p_mixed=lambda step: 0.35, reward_fn=binary, length_drift: float = 0.0) -> Path:
    """A train directory (evidence.jsonl, metrics.jsonl, run.json, harness/) of `steps` steps."""
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REFERENCE, path / "harness", dirs_exist_ok=True)
    (path / "run.json").write_text(json.dumps({"group_size": G, "max_new_tokens": MAX_NEW_TOKENS}))
    w = EvidenceWriter(path / "evidence.jsonl")
    metrics = []
    for step in range(1, steps + 1):
        step_recs = []
        for g in range(groups):
            a, b = rng.randrange(100, 1000), rng.randrange(100, 1000)
            answer = str(a + b)[::-1]
            p = 0.02 if g % 2 else p_mixed(step)
            rows = []
            for _ in range(G):
                comp = _completion(rng, answer, rng.random() < p)
                if rng.random() < length_drift * step / steps:  # runs on past the answer
                    comp = (comp + "9" * MAX_NEW_TOKENS)[:MAX_NEW_TOKENS]
                truncated = len(comp) >= MAX_NEW_TOKENS
                rows.append({"prompt_id": f"{a}+{b}", "prompt": f"{a}+{b}=", "answer": answer, "completion": comp,
                             "score": float(comp == answer), "length": min(len(comp) + 1, MAX_NEW_TOKENS),
                             "truncated": truncated})
            rewards = reward_fn(rows, step)
            mean = sum(rewards) / G
            sd = (sum((x - mean) ** 2 for x in rewards) / (G - 1)) ** 0.5
            for r, rew in zip(rows, rewards):
                step_recs.append(RolloutRecord(
                    step=step, group_id=g, level=3, reward=rew, advantage=(rew - mean) / (sd + 1e-4),
                    mean_logprob=-0.5 + 0.01 * step, entropy=0.6 - 0.01 * step, kept=True, **r))
        w.write(step_recs)
        metrics.append({"step": step, "reward_mean": sum(r.reward for r in step_recs) / len(step_recs),
                        "score_mean": sum(r.score for r in step_recs) / len(step_recs), "kl": 0.0})
    w.close()
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return path

