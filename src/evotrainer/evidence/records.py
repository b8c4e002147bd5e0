"""Rollout evidence: one record per sampled completion, appended as JSON lines.

Diagnostics and backtests read these without loading the model. Another trainer's export
may leave out what it does not know (evidence/external.py: the documented form and its
defaults); `read_evidence` completes such a file.
"""
from __future__ import annotations

import json
import os
import typing
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from evotrainer import jobfiles


@dataclass
class RolloutRecord:
    step: int
    group_id: int        # index of the prompt group within the step
    prompt_id: str
    prompt: str
    answer: str          # the train problem's reference answer (train data: harness may see it)
    level: int
    completion: str
    score: float         # verifier
    reward: float        # harness
    advantage: float
    length: int          # completion tokens, end token included
    truncated: bool
    mean_logprob: float | None  # mean log-prob of the sampled tokens under the sampling policy
    entropy: float | None       # mean per-token entropy there (None: the trainer that wrote it did not say)
    kept: bool           # its group passed the group filter
    # multi-turn (agentic) tasks only; None where the task has no turns or tools
    turns: int | None = None          # policy turns
    tool_calls: int | None = None
    tool_failures: int | None = None  # calls that failed: unparsed, bad arguments, no match, locked
    tool_sequence: str | None = None  # tool names in call order, space-separated ("look look answer")
    stop: str | None = None           # how it ended: success, fail, turn_cap, token_cap, invalid_action, echo, abandon
    terminated: bool | None = None    # ended on its own (False: a cap cut it; `truncated` is then True)
    files_read: str | None = None     # repositories: paths read, space-separated
    files_edited: str | None = None   # paths edited
    target_files: str | None = None   # paths the fix belongs in (edit coverage reads it)
    tests_run: int | None = None      # runs of the visible tests
    git_access: int | None = None     # calls that reached for version-control history
    partial: float | None = None      # share of hidden tests passed, beside the 0/1 reward
    # tasks that run programs (codegen, humaneval) only: what happened to the program
    outcome: str | None = None   # passed, failed, syntax_error, runtime_error, timeout, memory
    failure: str | None = None   # the kind of failure: an exception type, "wrong output", "timeout"


class EvidenceWriter:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, records: list[RolloutRecord]) -> None:
        # vars(), not asdict(): the record is flat, and asdict's deep copy cost ~10 ms a step
        self._f.write("".join(json.dumps(vars(r)) + "\n" for r in records))
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def load_records(run_dir: Path) -> list[RolloutRecord]:
    """All rollout records of a train directory (its evidence.jsonl), in step order."""
    return list(read_evidence(Path(run_dir) / "evidence.jsonl"))


def evidence_of(path: Path | str) -> tuple[RolloutRecord, ...]:
    """An evidence.jsonl's records, parsed once while the file is unchanged.

    The controller reads one train directory several times in a trial (the backtest reads
    the parent's, findings and the evidence store the child's): parsing 38k records costs
    ~0.4 s each time. Keyed by size and mtime, so a file that grew is read again. The records
    are shared between callers: read them, never change them. A job wrote the file: it is
    read as jobfiles reads (no link, capped) and every record checked (BadOutput if not)."""
    st = os.lstat(path)
    return _parsed(str(path), st.st_size, st.st_mtime_ns)


# A trial's parent, its child's seeds and the last child's (the next parent need not be the
# last child: restart mode branches from any kept state); a 38k-record file holds ~40 MB.
@lru_cache(maxsize=6)
def _parsed(path: str, size: int, mtime_ns: int) -> tuple[RolloutRecord, ...]:
    return tuple(read_evidence(Path(path)))


FIELDS = tuple(f.name for f in fields(RolloutRecord))
_ALL = frozenset(FIELDS)


def _kinds() -> tuple[tuple[str, tuple[type, ...], bool], ...]:
    """(field, the JSON types it takes, whether null is allowed), from RolloutRecord's hints."""
    out = []
    for name, hint in typing.get_type_hints(RolloutRecord).items():
        args = typing.get_args(hint) or (hint,)
        base = next(a for a in args if a is not type(None))
        kinds = {float: (int, float), int: (int,), bool: (bool,), str: (str,)}[base]
        out.append((name, kinds, type(None) in args))
    return tuple(out)


_KINDS = _kinds()


_SEEN: set[tuple] = set()  # (field order, value types) of rows already checked: records repeat both


def checked(row: dict) -> RolloutRecord:
    """A record from a JSON object that has every field, each of its type (TypeError if not)."""
    shape = (tuple(row), tuple(map(type, row.values())))
    if shape not in _SEEN:
        if row.keys() != _ALL:
            raise TypeError(f"fields {sorted(row.keys() ^ _ALL)[:4]} missing or unknown")
        for name, kinds, optional in _KINDS:
            v = row[name]
            if not (isinstance(v, kinds) and (bool not in kinds) == (not isinstance(v, bool))
                    or v is None and optional):
                raise TypeError(f"{name} is {type(v).__name__}, not {kinds[-1].__name__}")
        _SEEN.add(shape)
    return RolloutRecord(**row)


def read_evidence(path: Path) -> Iterator[RolloutRecord]:
    """The records of an evidence.jsonl: ours, or another trainer's export (evidence/external.py
    fills in what that form leaves out); every record checked, the file read as jobfiles reads."""
    path = Path(path)
    rows = jobfiles.read_jsonl(path.parent, path.name, jobfiles.EVIDENCE_CAP, dict)
    if any(row.keys() != _ALL for row in rows):  # another trainer's export: fill in what it left out
        from evotrainer.evidence.external import complete
        rows = complete(rows, FIELDS, jobfiles.shown(path))  # (a UsageError where the export is malformed)
    for n, row in enumerate(rows, 1):
        try:
            yield checked(row)
        except TypeError as e:
            raise jobfiles.BadOutput(f"{jobfiles.shown(path)} record {n}: {e}") from None


def metrics_row(obj: dict) -> dict:
    """A metrics.jsonl line: an integer step and plain values (TypeError if not)."""
    step = obj["step"]
    if not isinstance(step, int) or isinstance(step, bool):
        raise TypeError(f"step is {type(step).__name__}, not int")
    for k, v in obj.items():
        if not isinstance(v, (int, float, str, bool, type(None))):
            raise TypeError(f"{jobfiles.shown(k)[:40]} is {type(v).__name__}, not a plain value")
    return obj


def read_metrics(train_dir: Path | str, growing: bool = False) -> list[dict]:
    """A train directory's step metrics (metrics.jsonl: one object per step), [] where there are
    none yet; `growing`: a job may still be writing it (jobfiles.read_jsonl)."""
    try:
        return jobfiles.read_jsonl(train_dir, "metrics.jsonl", jobfiles.METRICS_CAP, metrics_row, growing)
    except jobfiles.Missing:
        return []
