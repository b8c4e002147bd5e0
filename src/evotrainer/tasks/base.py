"""What a task is: prompts, a fixed verifier, and three disjoint splits.

The verifier's output is the *score* (correct or not). It is fixed per task and never
depends on the harness; the harness turns scores into *rewards* on its own.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator

SPLIT_SEEDS = {"val": 10_000_001, "test": 20_000_002}  # train streams use the run's seed
SPLITS = ("val", "test")


@dataclass(frozen=True)
class Problem:
    id: str          # stable key: the same problem always has the same id
    prompt: str
    answer: str      # reference answer, as the policy should write it
    level: int       # difficulty level (digits for arith; 0 where a task has one level)
    entry: Any = field(default=None, compare=False, repr=False)  # verifier's private data


class Task(ABC):
    """A task family. Subclasses generate problems; splits and streams come from here."""

    name: str
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
        # a small problem space (1-digit sums: 100 problems) keeps half of itself for training
        full = min(self.split_size, self.problem_space(level) // 4)
        n = full if n is None else min(n, full)
        # test excludes the *whole* validation split, so a test subset never meets validation
        exclude = set() if which == "val" else {p.id for p in self.split("val", level)}
        rng = random.Random(f"{self.name}/{which}/{level}/{SPLIT_SEEDS[which]}")
        return self._draw_unique(rng, level, full, exclude)[:n]

    def held_out_ids(self, level: int) -> set[str]:
        return {p.id for s in SPLITS for p in self.split(s, level)}

    def train_stream(self, seed: int) -> "TrainStream":
        return TrainStream(self, seed)

    def _draw_unique(self, rng, level, n, exclude) -> list[Problem]:
        out, seen, tries = [], set(exclude), 0
        while len(out) < n:
            p = self.generate(rng, level)
            tries += 1
            if p.id not in seen:
                seen.add(p.id)
                out.append(p)
            elif tries > 50 * n:  # tiny problem spaces (1-digit sums) run out of distinct items
                break
        return out


class TrainStream:
    """Endless training problems for any level, never one from validation or test."""

    def __init__(self, task: Task, seed: int):
        self.task = task
        self.rng = random.Random(f"{task.name}/train/{seed}")
        self._held: dict[int, set[str]] = {}

    def draw(self, level: int) -> Problem:
        if level not in self._held:
            self._held[level] = self.task.held_out_ids(level)
        held = self._held[level]
        while True:
            p = self.task.generate(self.rng, level)
            if p.id not in held or len(held) >= self.task.problem_space(level):
                return p

    def batch(self, levels: list[int]) -> list[Problem]:
        return [self.draw(lv) for lv in levels]

    def __iter__(self) -> Iterator[Problem]:
        while True:
            yield self.draw(self.task.target_level)
