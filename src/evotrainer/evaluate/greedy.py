from __future__ import annotations

from pathlib import Path

import torch

from evotrainer.policy import load_policy
from evotrainer.policy.generate import decode, encode_prompts, generate
from evotrainer.tasks import Problem, Task


def accuracy(model, tok, task: Task, problems: list[Problem], batch_size: int = 512) -> float:
    """Mean verifier score of greedy completions."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        ids, mask = encode_prompts(tok, [p.prompt for p in chunk])
        gen = generate(model, ids, mask, task.max_new_tokens, tok.eos_token_id,
                       tok.pad_token_id, greedy=True)
        total += sum(task.score(p, c) for p, c in zip(chunk, decode(tok, gen)))
    model.train(was_training)
    return total / max(len(problems), 1)


def evaluate_checkpoint(path: Path, task: Task, split: str, level: int | None = None) -> float:
    model, tok = load_policy(path)
    with torch.inference_mode():
        return accuracy(model, tok, task, task.split(split, level))


def evaluate_checkpoints(task: str, level: int | None, jobs: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Evaluator process entry point: {checkpoint: {split: accuracy}} for {checkpoint: [splits]}.

    Loads only checkpoints and the task (no harness code), so it runs in a process of its
    own, apart from the controller and from every training worker.
    """
    from evotrainer.tasks import get_task
    t = get_task(task, level)
    sets = {s: t.split(s) for s in sorted({s for splits in jobs.values() for s in splits})}
    out = {}
    for ckpt, splits in jobs.items():
        model, tok = load_policy(ckpt)
        with torch.inference_mode():
            out[ckpt] = {s: accuracy(model, tok, t, sets[s]) for s in splits}
    return out
