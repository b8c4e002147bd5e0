"""Statistics for comparisons that have to survive RL noise: paired seeds, averaged
evaluations, and a bootstrap confidence interval. Pure functions over plain numbers.

One greedy evaluation at one checkpoint spread up to 16 points across seeds
(shared/MEASUREMENTS.md), so nothing here compares single numbers.
"""
from __future__ import annotations

import math
import random
from typing import Mapping, Sequence


def average_last(evals: Sequence[float], k: int) -> float:
    """Mean of the last k evaluations of a run (k >= 1)."""
    if not evals:
        raise ValueError("no evaluations to average")
    tail = list(evals)[-k:]
    return sum(tail) / len(tail)


def paired_differences(a: Mapping[int, float], b: Mapping[int, float]) -> list[float]:
    """a[s] - b[s] for every seed both have, in seed order."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(f"no seed in common: {sorted(a)} vs {sorted(b)}")
    return [a[s] - b[s] for s in seeds]


def noise_floor(run: Mapping[int, float], replicas: Sequence[Mapping[int, float]]) -> float:
    """Standard deviation of a paired difference between two runs of the *same* harness,
    seed by seed (their true difference is 0, so the root mean square of the observed ones
    estimates it); 0.0 with no replica."""
    diffs = [d for r in replicas for d in paired_differences(r, run)]
    return math.sqrt(sum(d * d for d in diffs) / len(diffs)) if diffs else 0.0


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (nan with one value: one seed says nothing about spread)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, math.nan
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, sd / math.sqrt(n)


def bootstrap_ci(xs: Sequence[float], level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of xs (paired differences, one per seed)."""
    if not xs:
        raise ValueError("no values")
    rng = random.Random(seed)
    n = len(xs)
    return _percentiles([sum(rng.choice(xs) for _ in range(n)) / n for _ in range(n_boot)], level)


def crossed_bootstrap_ci(rows: Sequence[Sequence[float]], level: float = 0.95, n_boot: int = 10_000,
                         seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the grand mean of a replicate x seed table (a paired
    difference per search replicate and fresh seed): each draw resamples the rows and the
    columns, both with replacement, so the interval carries the search's noise as well as
    the training seeds'. With one row it is the plain bootstrap over columns."""
    if not rows or not rows[0]:
        raise ValueError("no values")
    rng = random.Random(seed)
    R, S = len(rows), len(rows[0])
    means = []
    for _ in range(n_boot):
        rs = [rng.randrange(R) for _ in range(R)]
        cs = [rng.randrange(S) for _ in range(S)]
        means.append(sum(rows[r][c] for r in rs for c in cs) / (R * S))
    return _percentiles(means, level)


def _percentiles(means: list[float], level: float) -> tuple[float, float]:
    """The central `level` interval of bootstrap means."""
    means = sorted(means)
    n = len(means)
    return means[int((1 - level) / 2 * n)], means[min(int((1 + level) / 2 * n), n - 1)]
