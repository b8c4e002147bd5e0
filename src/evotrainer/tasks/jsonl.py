"""A finite task from the user's own data: `jsonl:PATH[?verifier=exact|numeric|math]`.

One JSON object per line: `prompt` and `answer` (strings; a numeric answer becomes its
string), optional `id` (default: a short hash of the prompt), optional integer `level`
(default 0) and optional `split` (train, val or test) that pins the row.

Splits. Unpinned rows are held out where the public held-out hash (`Task.held_out` in
base.py) puts them, at most as many per level as validation and test have room for (each is
capped at `split_size`, less its pinned rows; the first candidates in hash order are held
out and the surplus trains, so no row is wasted). Which held-out rows are validation and
which are test follows an order keyed by the run's split secret (`use_key`), so the key
moves rows between validation and test but never between training and the held-out rows:
the train rows, and a worker's file of them, are the same under every key. The assignment
is computed once per file and `held_out` answers from it, so a `TrainStream` keeps its usual
guarantee. The task's `name` is the file's stem, not its path: moving the file keeps its
splits; editing a row's prompt or id moves only that row.

A training worker never reads the user's file (the sandbox hides it): the controller writes
the train rows to a file of their own (`train_spec`) and the worker's spec names that file
with `rows=train`, which makes every row a training row.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from evotrainer.errors import UsageError
from evotrainer.tasks.base import (
    HELD_OUT_SHARE,
    SPLITS,
    Problem,
    Task,
    budget_from_answers,
    pool_digest,
)
from evotrainer.tasks.spec import canonical
from evotrainer.tasks.verifiers import VERIFIERS, answer_problem

ROW_SPLITS = ("train",) + SPLITS
QUERY_KEYS = ("verifier", "rows")
ROWS = ("all", "train")  # rows=train: a training worker's file of train rows only (train_spec)


@dataclass
class JsonlConfig:
    path: Path                 # absolute (the canonical spec carries it to other processes)
    verifier: str = "exact"
    level: int | None = None   # target level; None: the highest level in the file
    split_size: int = 500      # cap on each of validation and test
    rows: str = "all"          # "train": every row trains (a worker's train_spec file), no val/test

    def validate(self) -> None:
        if self.verifier not in VERIFIERS:
            raise UsageError(f"unknown verifier '{self.verifier}' for jsonl:{self.path}; "
                             f"valid verifiers: {', '.join(VERIFIERS)}")
        if self.verifier == "math":
            try:
                import math_verify  # noqa: F401  (fail now, not as a silent 0.0 per completion)
            except ImportError as e:
                raise UsageError(f"verifier=math needs math-verify (pip install 'math-verify>=0.8'): {e}") from None
        if not self.path.is_file():
            raise UsageError(f"jsonl task file not found: {self.path}")
        if self.split_size < 1:
            raise UsageError(f"split_size must be positive, got {self.split_size}")
        if self.rows not in ROWS:
            raise UsageError(f"rows must be one of {', '.join(ROWS)}, got '{self.rows}' for jsonl:{self.path}")


class JsonlTask(Task):
    def __init__(self, config: JsonlConfig):
        config.validate()
        self.config = config
        self.name = f"jsonl:{config.path.stem}"
        self.spec = f"jsonl:{config.path}?verifier={config.verifier}"
        self.split_size = config.split_size
        self._verify = VERIFIERS[config.verifier]
        rows = read_rows(config.path, config.verifier)
        if config.rows == "train":
            rows = [(p, "train") for p, _ in rows]
        self.levels = tuple(sorted({p.level for p, _ in rows}))
        self.target_level = max(self.levels) if config.level is None else config.level
        if self.target_level not in self.levels:
            raise UsageError(f"level {self.target_level} is not a level of {self.name}; "
                             f"levels present: {', '.join(map(str, self.levels))}")
        self._all_rows = rows
        self.max_new_tokens = budget_from_answers(p.answer for p, _ in rows)
        self.use_key(None)

    def use_key(self, key: bytes | None) -> None:
        self.key = key
        self._split_of, self._rows = assign_splits(self.name, self._all_rows, self.config.split_size, key)
        self._check_target(self.config.path)

    def data_files(self) -> tuple[str, ...]:
        return (str(self.config.path),)

    def train_spec(self, directory: Path) -> str:
        """Write the train rows (every level, file order) to DIRECTORY/<stem>.jsonl; the spec
        a training worker gets: it rebuilds the same training problems and no other."""
        directory.mkdir(parents=True, exist_ok=True)
        out = directory / self.config.path.name
        rows = [{"id": p.id, "prompt": p.prompt, "answer": p.answer, "level": p.level}
                for p, _ in self._all_rows if self._split_of[p.id] == "train"]
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(out)  # whole or not at all: a worker may be reading the last one
        # canonical: a directory whose name holds '?' or '%' (a run named `lr=1e-5?b`) is escaped
        return canonical(f"jsonl:{out}", {"max_new_tokens": self.max_new_tokens, "rows": "train",
                                          "verifier": self.config.verifier})

    def _check_target(self, path: Path) -> None:
        """The target level needs rows to train on and to validate and test with."""
        lv = self.target_level
        if self.config.rows == "train":
            return  # a worker's train_spec: validation and test live only in the controller
        if not self._rows["train"].get(lv):
            raise UsageError(f"{path}: no train rows at level {lv} (all of them are held out or pinned "
                             f"to val/test); add rows or pin some with \"split\": \"train\"")
        for which in SPLITS:
            if not self._rows[which].get(lv):
                raise UsageError(f"{path}: no {which} rows at level {lv} (about 1 row in {HELD_OUT_SHARE * 2} "
                                 f"lands there); add rows or pin some with \"split\": \"{which}\"")

    def problem_space(self, level: int) -> int:
        return len(self._rows["train"].get(level, ()))

    def generate(self, rng: random.Random, level: int) -> Problem:
        # train rows only: whatever draws from here (a stream, a warm start) never sees val/test
        rows = self._rows["train"].get(level)
        if not rows:
            raise UsageError(f"{self.name} has no train rows at level {level}")
        return rows[rng.randrange(len(rows))]

    def split(self, which: str, level: int | None = None, n: int | None = None) -> list[Problem]:
        if which not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {which!r}")
        rows = self._rows[which].get(self.target_level if level is None else level, [])
        return list(rows if n is None else rows[:n])

    def held_out(self, problem: Problem) -> bool:
        which = self._split_of.get(problem.id)
        return super().held_out(problem) if which is None else which != "train"

    def score(self, problem: Problem, completion: str) -> float:
        return self._verify(problem.answer, completion)


def read_rows(path: Path, verifier: str) -> list[tuple[Problem, str | None]]:
    """Every row as (problem, pinned split or None); any bad line is a one-line UsageError."""
    rows: list[tuple[Problem, str | None]] = []
    first_line: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read jsonl task file {path}: {e}") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            raise UsageError(f"{where}: not a JSON object")
        problem, split = _row(where, obj, verifier)
        if problem.id in first_line:
            raise UsageError(f"{where}: duplicate id '{problem.id}' (first on line {first_line[problem.id]}); "
                             f"ids must be unique (give rows with the same prompt their own 'id')")
        first_line[problem.id] = n
        rows.append((problem, split))
    if not rows:
        raise UsageError(f"{path}: no rows; each line needs a JSON object with 'prompt' and 'answer'")
    return rows


def _row(where: str, obj: dict, verifier: str) -> tuple[Problem, str | None]:
    for key in ("prompt", "answer"):
        if key not in obj:
            raise UsageError(f"{where}: row has no '{key}' field; each row needs 'prompt' and 'answer'")
    prompt, answer = obj["prompt"], obj["answer"]
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(prompt, str) or not isinstance(answer, str):
        bad = "prompt" if not isinstance(prompt, str) else "answer"
        raise UsageError(f"{where}: '{bad}' must be a string, got {type(obj[bad]).__name__}")
    if (why := answer_problem(verifier, answer)) is not None:
        raise UsageError(f"{where}: {why}")
    pid = obj.get("id", hashlib.sha256(prompt.encode()).hexdigest()[:16])
    if isinstance(pid, int) and not isinstance(pid, bool):
        pid = str(pid)
    if not isinstance(pid, str) or not pid:
        raise UsageError(f"{where}: 'id' must be a non-empty string, got {pid!r}")
    level = obj.get("level", 0)
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise UsageError(f"{where}: 'level' must be a non-negative integer, got {level!r}")
    split = obj.get("split")
    if split is not None and split not in ROW_SPLITS:
        raise UsageError(f"{where}: 'split' must be one of {', '.join(ROW_SPLITS)}, got {split!r}")
    return Problem(id=pid, prompt=prompt, answer=answer, level=level), split


def assign_splits(name: str, rows, split_size: int, key: bytes | None = None):
    """Each row's split, and the rows of each split by level (train in file order). Which rows
    train depends on the public hash alone; the key only orders the held-out ones into val
    and test."""
    split_of: dict[str, str] = {}
    by_split: dict[str, dict[int, list[Problem]]] = {s: {} for s in ROW_SPLITS}
    hashed: dict[int, list[tuple[bytes, Problem]]] = {}
    pinned_count: dict[tuple[str, int], int] = {}
    for problem, pinned in rows:
        digest = pool_digest(name, problem)   # public: no key
        if pinned is not None:
            split_of[problem.id] = pinned
            pinned_count[(pinned, problem.level)] = pinned_count.get((pinned, problem.level), 0) + 1
        elif digest[0] % HELD_OUT_SHARE == 0:   # the held-out rule of base.py, byte for byte
            hashed.setdefault(problem.level, []).append((digest, problem))
        else:
            split_of[problem.id] = "train"
    for level, cands in hashed.items():
        room = {w: max(split_size - pinned_count.get((w, level), 0), 0) for w in SPLITS}
        cands = [p for _, p in sorted(cands, key=lambda c: c[0])]
        pool, surplus = cands[:room["val"] + room["test"]], cands[room["val"] + room["test"]:]
        for problem in surplus:   # the cap is public too: the surplus trains under every key
            split_of[problem.id] = "train"
        # the secret: which pool rows are val and which test (halves, within each one's room)
        pool.sort(key=lambda p: pool_digest(name, p, key))
        n_val = min(room["val"], len(pool) - min(room["test"], len(pool) // 2))
        for i, problem in enumerate(pool):
            split_of[problem.id] = "val" if i < n_val else "test"
    for problem, _ in rows:
        by_split[split_of[problem.id]].setdefault(problem.level, []).append(problem)
    return split_of, by_split


def make(spec_base: str, query: dict[str, str], level: int | None) -> JsonlTask:
    """Build from the part after `jsonl:` and the task-specific query options."""
    raw_path = spec_base[len("jsonl:"):]
    if not raw_path:
        raise UsageError("jsonl task needs a path: jsonl:PATH[?verifier=exact|numeric|math]")
    path = Path(os.path.abspath(os.path.expanduser(raw_path)))
    return JsonlTask(JsonlConfig(path=path, verifier=query.get("verifier", "exact"), level=level,
                                 rows=query.get("rows", "all")))
