"""pass@k of a checkpoint: n sampled completions per problem, the unbiased estimator over them.

Greedy accuracy (greedy.py) is what a run's gates read; pass@k is what code benchmarks
report (HumanEval's pass@1, pass@10). Sampling uses the training prompt format and the
task's completion budget; a sample counts as correct only at full credit (passk.solved;
codegen: every hidden test passed), never partly. Every problem's n programs are judged in
one batch, so a code task starts its sandbox once per batch of prompts.
"""
from __future__ import annotations

import torch

from evotrainer.envs import EnvTask
from evotrainer.evaluate.greedy import play_task
from evotrainer.evaluate.passk import mean_pass_at_k, solved
from evotrainer.policy.config import PolicyConfig
from evotrainer.policy.generate import decode, generate
from evotrainer.policy.prompts import encode_prompts, stop_token_ids
from evotrainer.tasks import Problem, Task


def correct_counts(model, tok, task: Task, problems: list[Problem], *, n: int, temperature: float = 0.8,
                   seed: int = 0, batch_size: int = 16, policy: PolicyConfig | None = None) -> list[int]:
    """How many of n samples solve each problem (at full credit)."""
    policy = policy or PolicyConfig()
    was_training = model.training
    model.eval()
    device, stops = next(model.parameters()).device, stop_token_ids(model, tok)
    gen_rng = torch.Generator(device=device).manual_seed(seed)
    counts: list[int] = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        if isinstance(task, EnvTask):  # n episodes of each problem, played as the evaluator reads actions
            rows = [p for p in chunk for _ in range(n)]
            with torch.inference_mode(), policy.autocast():
                played = play_task(model, tok, task, rows, stops=stops, policy=policy, temperature=temperature,
                                   generator=gen_rng)
            credits = [task.credit(e.reward) for e in played]
            counts += [solved(credits[j * n:(j + 1) * n]) for j in range(len(chunk))]
            continue
        ids, mask = encode_prompts(tok, [p.prompt for p in chunk], policy.chat_template, device)
        with torch.inference_mode(), policy.autocast():
            gen = generate(model, ids, mask, max_new_tokens=task.max_new_tokens, stop_ids=stops,
                           pad_id=tok.pad_token_id, temperature=temperature, generator=gen_rng, repeats=n)
        rows = [p for p in chunk for _ in range(n)]
        credits = [task.credit(s) for s in task.score_many(rows, decode(tok, gen))]
        counts += [solved(credits[j * n:(j + 1) * n]) for j in range(len(chunk))]
    model.train(was_training)
    return counts


def pass_at(model, tok, task: Task, problems: list[Problem], *, n: int, ks: list[int], **kw) -> dict[str, float]:
    """{"pass@k": value} for every k <= n, from n samples per problem."""
    counts = [(n, c) for c in correct_counts(model, tok, task, problems, n=n, **kw)]
    return {f"pass@{k}": mean_pass_at_k(counts, k) for k in ks if 1 <= k <= n}


def evaluate_sampled(task: str, level: int | None, checkpoint: str, *, split: str, samples: int, ks: list[int],
                     temperature: float = 0.8, policy: dict | None = None, key: str | None = None,
                     seed: int = 0) -> dict:
    """Evaluator process entry point (`evotrainer evaluate`): greedy accuracy, and pass@k from
    `samples` completions per problem, of one checkpoint on one split ("all": every problem
    of an evaluation set such as humaneval). Loads the checkpoint and the verifier only."""
    from evotrainer.catalog import get_task
    from evotrainer.evaluate.greedy import accuracy
    from evotrainer.policy import load_policy
    t = get_task(task, level)
    if key:
        t.use_key(bytes.fromhex(key))
    problems = t.problems() if split == "all" else t.split(split)
    cfg = PolicyConfig.of(policy)
    model, tok = load_policy(checkpoint, cfg)
    with torch.inference_mode():
        out = {"task": t.spec, "split": split, "problems": len(problems),
               "greedy": accuracy(model, tok, t, problems, policy=cfg)}
    if samples:
        out |= {"samples": samples, "temperature": temperature}
        out |= pass_at(model, tok, t, problems, n=samples, ks=ks, temperature=temperature, seed=seed, policy=cfg)
    return out
