from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError

from evotrainer.envs import EnvTask
from evotrainer.harness.actions import ACTION_PARSERS
from evotrainer.envs.play import play
from evotrainer.policy import load_policy
from evotrainer.policy.config import PolicyConfig
from evotrainer.policy.model import BadCheckpoint
from evotrainer.policy.generate import decode, generate
from evotrainer.policy.prompts import encode_prompts, stop_token_ids
from evotrainer.tasks import Problem, Task


def accuracy(model, tok, task: Task, problems: list[Problem], *, batch_size: int = 512,
             policy: PolicyConfig | None = None) -> float:
    """Mean verifier score (as the task credits it) of greedy completions, prompted as in training."""
    policy = policy or PolicyConfig()
    was_training = model.training
    model.eval()
    device, stops = next(model.parameters()).device, stop_token_ids(model, tok)
    total = 0.0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        if isinstance(task, EnvTask):
            total += sum(task.credit(p.reward) for p in play_task(model, tok, task, chunk, stops=stops, policy=policy,
                                                                  greedy=True))
            continue
        ids, mask = encode_prompts(tok, [p.prompt for p in chunk], policy.chat_template, device)
        with policy.autocast():
            gen = generate(model, ids, mask, max_new_tokens=task.max_new_tokens, stop_ids=stops,
                           pad_id=tok.pad_token_id, greedy=True)
        total += sum(map(task.credit, task.score_many(chunk, decode(tok, gen))))
    model.train(was_training)
    return total / max(len(problems), 1)


def play_task(model, tok, task: EnvTask, problems: list[Problem], *, stops: list[int], policy: PolicyConfig,
              **sampling):
    """Episodes of a multi-turn task (greedy=True, or temperature and generator). Actions are read
    with the task's built-in parser, never a harness's: the evaluator runs no harness code, so a
    harness that evolves its parser changes what its training sees, not how it is judged."""
    parse = ACTION_PARSERS.get(task.action_format)
    return play(model, tok, [task.environment(p, parse) for p in problems], task.caps, stops,
                chat_template=policy.chat_template, **sampling)


def evaluate_checkpoint(path: Path, task: Task, split: str, level: int | None = None,
                        policy: PolicyConfig | None = None) -> float:
    model, tok = load_policy(path, policy)
    with torch.inference_mode():
        return accuracy(model, tok, task, task.split(split, level), policy=policy)


def evaluate_checkpoints(task: str, level: int | None, jobs: dict[str, list[str]],
                         *, policy: dict | None = None, batch_size: int = 512,
                         key: str | None = None) -> dict[str, dict]:
    """Evaluator process entry point: {checkpoint: {split: accuracy}} for {checkpoint: [splits]};
    {checkpoint: {"error": one line}} for a checkpoint that does not load (`unloadable`), and
    the others are scored all the same: one job's bad checkpoint costs no other its score.

    `task` is the task's spec string, `key` the run's split key (hex; tasks/keys.py), which
    only this process receives. Loads only checkpoints and the task (no harness code), so it
    runs in a process of its own, apart from the controller and from every training worker.
    `policy` names the run's base: every checkpoint is its weights on the base's config,
    tokenizer, chat template and stop tokens (load_policy), so what the evaluator asks, how it
    decodes and where it stops are the run's, whatever files a job left beside its weights.
    """
    from evotrainer.catalog import get_task
    t = get_task(task, level)
    if key:
        t.use_key(bytes.fromhex(key))
    cfg = PolicyConfig.of(policy)
    sets = {s: t.split(s) for s in sorted({s for splits in jobs.values() for s in splits})}
    out = {}
    for ckpt, splits in jobs.items():
        try:
            model, tok = load_policy(ckpt, cfg)
        except UNLOADABLE as e:
            out[ckpt] = {"error": unloadable(e)}
            continue
        with torch.inference_mode():
            out[ckpt] = {s: accuracy(model, tok, t, sets[s], batch_size=batch_size, policy=cfg) for s in splits}
        del model  # its memory back before the next checkpoint loads
    return out


# what a checkpoint's load raises when the checkpoint is at fault: check_checkpoint's refusals, and
# what safetensors (SafetensorError: a header that does not tile its file) and transformers raise on
# files that are not the base's weights
UNLOADABLE = (BadCheckpoint, SafetensorError, OSError, ValueError, RuntimeError)


def unloadable(e: BaseException) -> str:
    """A load failure in one line: the exception's name and its message's first line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else 'no message'}"[:500]


def load_error(acc: dict[str, dict]) -> str | None:
    """The first checkpoint of evaluate_checkpoints' answer that did not load, with why; None
    where every one was scored."""
    return next((f"{c}: {a['error']}" for c, a in acc.items() if "error" in a), None)
