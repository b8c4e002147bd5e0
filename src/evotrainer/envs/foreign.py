"""What every adapter of another library's environments shares (envs/trl_factory.py,
envs/textarena_games.py, envs/openenv_envs.py): where problems come from, and tools read off
an object's methods.

Problems come from one of two places. A procedural environment owns its problems: a problem
is a seed (`seeded_problem`), and the first observation is what `reset` returns in the job
that plays it. An environment with a dataset has rows (`RowsMixin`): a JSONL file, one row a
problem, its id the row's `id` or a hash of the row; the held-out pool is the task's public
hash rule (tasks/base.py), and a training worker is handed a file of the training rows only
(`train_spec`), so nothing held out reaches a process that runs harness code.

The environment's code (its `reset`, its tools, its reward) runs only where episodes are
played: training and evaluation jobs, both in the sandbox (docs/sandbox.md). The controller
imports the class, reads the rows and draws problems; it never opens an environment.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
from pathlib import Path
from typing import Any, Callable

from evotrainer.envs.base import Caps, ToolCall, Tools
from evotrainer.errors import UsageError
from evotrainer.tasks.base import Problem
from evotrainer.tasks.spec import Spec

SEEDS = 10 ** 9  # a procedural environment's problem space: seeds 0 .. SEEDS - 1
# Spec options every adapter takes: its caps, and how many held-out problems validation and
# test each play (an episode costs many generations: swe-mini's 100, not a single-turn 500)
EPISODE_KEYS = ("max_turns", "turn_tokens", "split_size")
SPLIT_SIZE = 100


def episode_options(s: Spec, max_turns: int) -> tuple[Caps, int, dict[str, object]]:
    """The caps and split size a spec asks for (each a positive integer), and the query
    entries the canonical spec keeps (only those that differ from the defaults)."""
    defaults = {"max_turns": max_turns, "turn_tokens": Caps().turn_tokens, "split_size": SPLIT_SIZE}
    got = {}
    for key, default in defaults.items():
        value = s.query.get(key, str(default))
        if not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise UsageError(f"{key} must be a positive integer, got '{value}' in task spec '{s.raw}'")
        got[key] = int(value)
    caps = Caps(max_turns=got["max_turns"], turn_tokens=got["turn_tokens"],
                max_tokens=max(Caps().max_tokens, got["max_turns"] * got["turn_tokens"]))
    return caps, got["split_size"], {k: (v if v != defaults[k] else None) for k, v in got.items()}


def seeded_problem(rng: random.Random, name: str) -> Problem:
    """A procedural environment's problem: a seed. Its prompt is a label; the first
    observation, the real prompt, comes from `reset` where the episode is played."""
    seed = rng.randrange(SEEDS)
    return Problem(id=f"seed-{seed}", prompt=f"{name} (seed {seed})", answer="", level=0, entry=seed)


def text_of(x: Any) -> str:
    """A prompt as text: a string, or chat messages whose contents are joined."""
    if isinstance(x, str):
        return x
    if isinstance(x, list):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in x)
    return "" if x is None else str(x)


def read_rows(path: Path) -> list[dict]:
    """A JSONL file of rows (objects), each given an `id` where it has none."""
    if not path.is_file():
        raise UsageError(f"no data file at '{path}'")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{path} line {i}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise UsageError(f"{path} line {i}: a row must be a JSON object")
        row.setdefault("id", hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()[:16])
        rows.append(row)
    if not rows:
        raise UsageError(f"{path}: no rows")
    return rows


class RowsMixin:
    """An environment task whose problems are a file's rows, or, with no rows, seeds (see the
    module docstring). The class using it sets `rows` (empty: seeds), `data_path` and `name`."""
    rows: list[dict]
    data_path: Path | None
    name: str
    spec: str

    def row_problem(self, row: dict) -> Problem:
        return Problem(id=str(row["id"]), prompt=text_of(row.get("prompt")), answer=str(row.get("answer", "")),
                       level=0, entry=row)

    def generate(self, rng: random.Random, level: int) -> Problem:
        if not self.rows:
            return seeded_problem(rng, self.name)
        return self.row_problem(self.rows[rng.randrange(len(self.rows))])

    def problem_space(self, level: int) -> int:
        return len(self.rows) if self.rows else SEEDS

    def data_files(self) -> tuple[str, ...]:
        return (str(self.data_path),) if self.rows else ()

    def train_spec(self, directory: Path) -> str:
        """The spec a training worker gets: with rows, one naming a file of the training rows only."""
        if not self.rows:
            return self.spec
        return self.spec.replace(f"data={self.data_path}", f"data={self.training_rows(directory)}")

    def training_rows(self, directory: Path) -> Path:
        """The rows outside the held-out pool, written to DIRECTORY (whole or not at all)."""
        directory.mkdir(parents=True, exist_ok=True)
        out = directory / f"{self.data_path.stem}.train.jsonl"
        keep = [r for r in self.rows if not self.held_out(self.row_problem(r))]
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        tmp.replace(out)
        return out


# ------------------------------------------------------------------ tools from methods

def method_tools(obj: Any, exclude: tuple[str, ...]) -> dict[str, Callable[..., Any]]:
    """An object's public methods, its tools (TRL's rule: every public method but `exclude`)."""
    return {name: getattr(obj, name) for name, _ in inspect.getmembers(type(obj), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in exclude}


def tool_params(methods: dict[str, Callable[..., Any]]) -> Tools:
    """name -> its parameter names, in order (what an action parser reads arguments into)."""
    return {name: tuple(p for p in inspect.signature(fn).parameters if p != "self") for name, fn in methods.items()}


def call_tool(fn: Callable[..., Any], call: ToolCall) -> tuple[str, bool]:
    """Run a parsed call: (the observation, whether it failed). Arguments arrive as text and
    are converted to the parameter's annotated type; a tool that raises answers its error."""
    try:
        params = inspect.signature(fn).parameters
        args = {k: _convert(v, params[k].annotation) for k, v in call.args.items()}
        return str(fn(**args)), False
    except Exception as e:  # the tool's own failure is the episode's evidence, not a crash
        return f"error: {type(e).__name__}: {e}", True


def _convert(value: str, annotation: Any) -> Any:
    kind = annotation if isinstance(annotation, type) else {"int": int, "float": float, "bool": bool}.get(
        str(annotation), str)
    if kind is bool:
        return value.strip().lower() in ("1", "true", "yes")
    return kind(value.strip()) if kind in (int, float) else value
