"""Worker side of a backtest: the candidate's reward, group filter and advantage over
cached rollouts, step by step, exactly as the trainer would call them.

This runs the candidate's code, so it runs only in a worker process. It reads the
evidence (train rollouts only) and returns plain lists, one entry per record, for the
controller to analyse.

Truncation rule: where the candidate's `max_new_tokens` is below the budget the
evidence was sampled under, a rollout longer than it would have been cut: it loses its
end token and its text past the budget, and counts as wrong (an answer that never
ended is not a finished answer).
"""
from __future__ import annotations

from itertools import groupby
from pathlib import Path

import torch

from evotrainer import jobfiles
from evotrainer.envs.base import Trace

from evotrainer.evidence.records import RolloutRecord, read_evidence
from evotrainer.harness import Rollouts, load_harness
from evotrainer.harness.signal import harness_signal
from evotrainer.tasks.base import Problem


def sampling_meta(evidence_dir: Path, records: list[RolloutRecord]) -> dict:
    """Group size and token budget of the evidence: run.json, else read off the records."""
    meta = jobfiles.read_json(evidence_dir, "run.json") if jobfiles.exists(evidence_dir, "run.json") else {}
    if "group_size" not in meta:
        sizes = {len(list(g)) for _, g in groupby(records, key=lambda r: (r.step, r.group_id))}
        if len(sizes) != 1:
            raise ValueError(f"{evidence_dir}: groups of unequal size {sorted(sizes)} and no run.json")
        meta["group_size"] = sizes.pop()
    meta.setdefault("max_new_tokens", max((r.length for r in records), default=1))
    return meta


def _cut(r: RolloutRecord, budget: int) -> tuple[str, int, bool, float]:
    """(completion, length, truncated, score) once the budget applies (character tokens)."""
    if r.length <= budget:
        return r.completion, r.length, r.truncated, r.score
    return r.completion[:budget], budget, True, 0.0


def episodes_of(rows: list[RolloutRecord]) -> dict:
    """A multi-turn task's Rollouts fields rebuilt from its records (turns, stops, traces), so
    a reward that reads them rescores as it trains; nothing for single-turn records."""
    if any(r.turns is None for r in rows):
        return {}
    traces = [Trace(tools=(r.tool_sequence or "").split(), failures=r.tool_failures or 0,
                    files_read=(r.files_read or "").split(), files_edited=(r.files_edited or "").split(),
                    target_files=(r.target_files or "").split(), tests_run=r.tests_run or 0,
                    git_access=r.git_access or 0, partial=r.partial) for r in rows]
    return {"turns": torch.tensor([r.turns for r in rows]), "stops": [r.stop for r in rows], "traces": traces}


def rescore(evidence_dir: str, harness_dir: str) -> dict:
    """Worker entry point: per record, the candidate's reward, advantage and keep flag."""
    d = Path(evidence_dir)
    h = load_harness(harness_dir)
    records = list(read_evidence(d / "evidence.jsonl"))
    meta = sampling_meta(d, records)
    G, T_old = meta["group_size"], meta["max_new_tokens"]
    T = min(h.knobs.max_new_tokens, T_old) if h.knobs.max_new_tokens else T_old
    out = {"reward": [], "advantage": [], "kept": [], "score": [], "cut": [],
           "group_size": G, "max_new_tokens": T, "evidence_max_new_tokens": T_old}
    for step, rows in groupby(records, key=lambda r: r.step):
        rows = list(rows)
        if len(rows) % G:
            raise ValueError(f"step {step}: {len(rows)} rollouts is not a whole number of groups of {G}")
        cut = [_cut(r, T) for r in rows]
        scores = torch.tensor([c[3] for c in cut], dtype=torch.float32)
        ro = Rollouts(problems=[Problem(r.prompt_id, r.prompt, r.answer, r.level) for r in rows],
                      completions=[c[0] for c in cut], scores=scores,
                      lengths=torch.tensor([c[1] for c in cut]), truncated=torch.tensor([c[2] for c in cut]),
                      group_size=G, max_new_tokens=T, **episodes_of(rows))
        sig = harness_signal(h, ro)
        out["reward"] += sig.rewards.tolist()
        out["advantage"] += sig.advantages.tolist()
        out["kept"] += sig.row_keep.tolist()
        out["score"] += scores.tolist()
        out["cut"] += [r.length > T for r in rows]
    return out
