"""What a task is: prompts, a fixed verifier, and three disjoint splits.

The verifier's output is the *score* (correct or not). It is fixed per task and never
depends on the harness; the harness turns scores into *rewards* on its own.

Which problems may ever be held out is decided by a stable hash of the problem id: one in
`HELD_OUT_SHARE` belongs to the held-out pool, and validation and test are drawn from it
only, while training streams skip it. So a training worker keeps its stream disjoint
from validation and test without ever building either: harness code runs beside no
held-out problem.
"""
from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator

SPLIT_SEEDS = {"val": 10_000_001, "test": 20_000_002}  # train streams use the run's seed
SPLITS = ("val", "test")
HELD_OUT_SHARE = 4  # one problem in four belongs to the held-out pool (256 divides evenly)


@dataclass(frozen=True)
class Problem:
    id: str          # stable key: the same problem always has the same id
    prompt: str
    answer: str      # reference answer, as the policy should write it
    level: int       # difficulty level (digits for arith; 0 where a task has one level)
    entry: Any = field(default=None, compare=False, repr=False)  # verifier's private data


class Task(ABC):
    """A task family. Subclasses generate problems; splits and streams come from here."""

    name: str             # stable identity: hashes splits and streams (never a path)
    spec: str             # canonical spec string: get_task(spec, level) rebuilds this task anywhere
    levels: tuple[int, ...]
    target_level: int
    max_new_tokens: int   # completion budget the task needs (answer + end token, with slack)
    split_size: int = 500

    @abstractmethod
    def generate(self, rng: random.Random, level: int) -> Problem:
        """Draw one problem of the given level from rng."""

    @abstractmethod
    def problem_space(self, level: int) -> int:
        """How many distinct problems the level has (an upper bound is fine)."""

    @abstractmethod
    def score(self, problem: Problem, completion: str) -> float:
        """The verifier: 1.0 if the completion solves the problem, else 0.0 (or in [0, 1])."""

    def split(self, which: str, level: int | None = None, n: int | None = None) -> list[Problem]:
        """Validation or test problems: fixed seeds, no duplicates, disjoint from each other."""
        if which not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {which!r}")
        level = self.target_level if level is None else level
        # both splits must fit in the pool (1-digit sums: 100 problems, a pool of ~25)
        full = min(self.split_size, self.problem_space(level) // HELD_OUT_SHARE // 2)
        n = full if n is None else min(n, full)
        # test excludes the *whole* validation split, so a test subset never meets validation
        exclude = set() if which == "val" else {p.id for p in self.split("val", level)}
        rng = random.Random(f"{self.name}/{which}/{level}/{SPLIT_SEEDS[which]}")
        return self._draw_unique(rng, level, full, exclude)[:n]

    def held_out(self, problem: Problem) -> bool:
        """Whether the problem is in the held-out pool (validation and test come from it only)."""
        return pool_digest(self.name, problem)[0] % HELD_OUT_SHARE == 0

    def train_stream(self, seed: int) -> "TrainStream":
        return TrainStream(self, seed)

    def _draw_unique(self, rng, level, n, exclude) -> list[Problem]:
        out, seen, tries = [], set(exclude), 0
        while len(out) < n:
            p = self.generate(rng, level)
            tries += 1
            if p.id not in seen and self.held_out(p):
                seen.add(p.id)
                out.append(p)
            if tries > 50 * HELD_OUT_SHARE * n:  # tiny problem spaces run out of distinct items
                break
        return out


def pool_digest(task_name: str, problem: Problem) -> bytes:
    """The stable hash behind the held-out rule; its later bytes are free for other fixed choices."""
    return hashlib.sha256(f"{task_name}/{problem.level}/{problem.id}".encode()).digest()


def budget_from_answers(answers) -> int:
    """Default completion budget from reference answers: the longest, plus half again (at least 4).

    The built-in character model writes one token per character, so the longest answer plus
    the end token is the least it needs; the slack lets over-long answers show up as wrong
    rather than cut off. Models that reason before answering need far more: they pass
    `?max_new_tokens=N` in the task spec.
    """
    longest = max((len(a) for a in answers), default=0)
    return longest + max(4, longest // 2)


class TrainStream:
    """Endless training problems for any level, never one from the held-out pool."""

    def __init__(self, task: Task, seed: int):
        self.task = task
        self.rng = random.Random(f"{task.name}/train/{seed}")

    def draw(self, level: int) -> Problem:
        while True:
            p = self.task.generate(self.rng, level)
            if not self.task.held_out(p):
                return p

    def batch(self, levels: list[int]) -> list[Problem]:
        return [self.draw(lv) for lv in levels]

    def __iter__(self) -> Iterator[Problem]:
        while True:
            yield self.draw(self.task.target_level)
