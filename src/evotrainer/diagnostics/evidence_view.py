"""The read-only view of rollout evidence that every diagnostic function receives.

Plain data in, no model, no files: a diagnostic is a pure function of an `Evidence`.
Rollouts are grouped as the trainer sampled them (step, group id); `first` and `last`
are the first and last fifth of the steps, the two windows trend diagnostics compare.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

from evotrainer.evidence.records import RolloutRecord

WINDOW = 0.2  # share of the steps in the first and last windows


@dataclass(frozen=True)
class Evidence:
    records: tuple[RolloutRecord, ...]
    steps: tuple[dict, ...] = field(default=())  # the trainer's per-step metrics, where kept

    @classmethod
    def of(cls, records, steps=()) -> "Evidence":
        return cls(tuple(records), tuple(steps))

    def __len__(self) -> int:
        return len(self.records)

    @cached_property
    def step_numbers(self) -> list[int]:
        return sorted({r.step for r in self.records})

    @cached_property
    def groups(self) -> list[list[RolloutRecord]]:
        """Rollouts of one prompt at one step, in sampling order."""
        by = defaultdict(list)
        for r in self.records:
            by[(r.step, r.group_id)].append(r)
        return [by[k] for k in sorted(by)]

    def between(self, lo: int, hi: int) -> "Evidence":
        """The rollouts (and step metrics) of steps lo..hi inclusive."""
        return Evidence(tuple(r for r in self.records if lo <= r.step <= hi),
                        tuple(s for s in self.steps if lo <= s.get("step", 0) <= hi))

    @cached_property
    def first(self) -> "Evidence":
        s = self.step_numbers
        return self.between(s[0], s[max(math.ceil(len(s) * WINDOW), 1) - 1]) if s else self

    @cached_property
    def last(self) -> "Evidence":
        s = self.step_numbers
        return self.between(s[-max(math.ceil(len(s) * WINDOW), 1)], s[-1]) if s else self

    def span(self) -> str:
        s = self.step_numbers
        return f"steps {s[0]}-{s[-1]}" if s else "no steps"

    def column(self, name: str) -> list:
        return [getattr(r, name) for r in self.records]

    def step_metric(self, name: str) -> list[float]:
        """One of the trainer's per-step metrics (kl, loss, ...), where the steps carry it."""
        return [float(s[name]) for s in self.steps if s.get(name) is not None]


# ------------------------------------------------------------------ small statistics

def mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def std(xs) -> float:
    xs = list(xs)
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def quantile(xs, q: float) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ranks(xs) -> list[float]:
    """Average ranks (ties share the mean of their positions), as Spearman needs."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def pearson(xs, ys) -> float | None:
    """None when either side is constant (no correlation to speak of)."""
    xs, ys = list(map(float, xs)), list(map(float, ys))
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 1e-12 or syy <= 1e-12:
        return None
    return sxy / math.sqrt(sxx * syy)


def spearman(xs, ys) -> float | None:
    return pearson(ranks(list(xs)), ranks(list(ys)))
