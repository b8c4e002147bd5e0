"""Rollouts another trainer wrote: the documented JSONL form, completed into evidence records.

Any trainer can export its rollouts as `evidence.jsonl`, one JSON object per completion, and
evotrainer's `diagnose`, `backtest` and `report` read that directory as they read their own
runs. Only what every GRPO trainer knows is required; the rest has a stated default:

    required   step (int), prompt (str), completion (str),
               score (the verifier's, held fixed: 1 correct, 0 wrong, or partial credit),
               reward (what the trainer optimised: the score plus any shaping)
    defaults   group_id     rollouts of one prompt at one step form a group, numbered in
                            order of first appearance
               advantage    reward minus its group's mean (GRPO without std scaling)
               prompt_id    a hash of the prompt
               answer ""    level 0    kept true    truncated false
               length       the completion's length in characters (the trainer's tokens
                            are unknown: export `length` where you have it)
               mean_logprob, entropy    null (not measured: their diagnostics say n/a)
    optional   every other field of RolloutRecord (multi-turn: turns, tool_calls, stop, ...;
               programs: outcome, failure), null where absent

Beside it, `metrics.jsonl` (optional): one object per optimizer step with `step` and any of
`kl`, `entropy`, `loss`; `run.json` (optional): `group_size` and `max_new_tokens`, which a
backtest otherwise reads off the records. A field this form does not know is refused by
name: a typo would otherwise drop a column silently.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict

from evotrainer.errors import UsageError

REQUIRED = ("step", "prompt", "completion", "score", "reward")


def complete(rows: list[dict], fields: tuple[str, ...], source: str) -> list[dict]:
    """Every row with each field of `fields` (RolloutRecord's, in order), defaults filled in."""
    for i, row in enumerate(rows, 1):
        missing = [k for k in REQUIRED if row.get(k) is None]
        if missing:
            raise UsageError(f"{source} line {i}: missing {', '.join(missing)}; every rollout needs "
                             f"{', '.join(REQUIRED)} (the rest has defaults)")
        unknown = sorted(set(row) - set(fields))
        if unknown:
            raise UsageError(f"{source} line {i}: unknown field {', '.join(map(repr, unknown))}; "
                             f"valid fields: {', '.join(fields)}")
        for k in ("score", "reward"):
            if not isinstance(row[k], (int, float)) or isinstance(row[k], bool):
                raise UsageError(f"{source} line {i}: {k} must be a number, got {row[k]!r}")
        if not isinstance(row["step"], int) or isinstance(row["step"], bool):
            raise UsageError(f"{source} line {i}: step must be an integer, got {row['step']!r}")
    groups: dict[tuple[int, str], int] = {}
    per_step: dict[int, int] = defaultdict(int)
    members: dict[tuple[int, int], list[dict]] = defaultdict(list)
    out = []
    for row in rows:
        r = {k: None for k in fields} | {"answer": "", "level": 0, "kept": True, "truncated": False} | row
        if r["group_id"] is None:
            key = (r["step"], r["prompt"])
            if key not in groups:
                groups[key] = per_step[r["step"]]
                per_step[r["step"]] += 1
            r["group_id"] = groups[key]
        if r["prompt_id"] is None:
            r["prompt_id"] = prompt_id(r["prompt"])
        if r["length"] is None:
            r["length"] = len(r["completion"])
        members[(r["step"], r["group_id"])].append(r)
        out.append(r)
    for group in members.values():
        mean = sum(float(r["reward"]) for r in group) / len(group)
        for r in group:
            if r["advantage"] is None:
                r["advantage"] = float(r["reward"]) - mean
    # the trainer and the store read records in step order, a group's rollouts together
    return sorted(out, key=lambda r: (r["step"], r["group_id"]))


def prompt_id(prompt: str) -> str:
    """A prompt's id where the trainer gave none: the same text, the same id."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:12]
