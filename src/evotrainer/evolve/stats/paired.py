"""Statistics for comparisons that have to survive RL noise: paired seeds, averaged
evaluations, t intervals and the gate's pooled test. Pure functions over plain numbers.

One greedy evaluation at one checkpoint spread up to 16 points across seeds, so nothing here
compares single numbers. Intervals are Student t intervals on paired differences (n - 1
degrees of freedom): with the 2-3 seeds a run affords, a percentile bootstrap is just
[min, max] (three values: the all-minimum resample has probability 1/27) and covered a null
difference 75% of the time where it claimed 95%; the t interval holds its level for normal
noise at any n >= 2 (bench/null_calibration.py measures both).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Mapping, Sequence

from scipy import stats as _scipy_stats


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
    diffs = null_differences(run, replicas)
    return math.sqrt(sum(d * d for d in diffs) / len(diffs)) if diffs else 0.0


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (nan with one value: one seed says nothing about spread)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, math.nan
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, sd / math.sqrt(n)


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with df degrees of freedom."""
    return float(_scipy_stats.t.ppf(p, df))


def t_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The two-sided Student t interval of the mean of xs (paired differences, one per seed),
    n - 1 degrees of freedom; (-inf, inf) with one value (one seed says nothing of spread)."""
    if not xs:
        raise ValueError("no values")
    m, se = mean_se(xs)
    if math.isnan(se):
        return -math.inf, math.inf
    h = t_quantile((1 + level) / 2, len(xs) - 1) * se
    return m - h, m + h


def null_differences(run: Mapping[int, float], replicas: Sequence[Mapping[int, float]]) -> list[float]:
    """Paired differences between runs of one harness on the same problems (replica - run, seed
    by seed): draws of what a gain looks like when nothing changed."""
    return [d for r in replicas for d in paired_differences(r, run)]


@dataclass(frozen=True)
class PooledTest:
    """A one-sided pooled t test of a mean gain against the run's measured null.

    The gain's spread is estimated from the null differences (known mean 0: each is a degree
    of freedom) pooled with the gains' own deviations from their mean (n - 1 more): under the
    null of no effect both come from one distribution, so the test is exact for normal noise,
    and a child whose seeds disagree widely (a real effect of varying size, or an unstable
    harness) widens its own interval instead of borrowing the null's narrow one."""
    mean: float
    se: float
    df: int
    n: int

    def lower(self, alpha: float) -> float:
        """The one-sided (1 - alpha) lower confidence bound of the mean gain."""
        return self.mean - t_quantile(1 - alpha, self.df) * self.se

    def t(self, floor: float = 0.0) -> float:
        """How many standard errors the mean clears `floor` by."""
        return (self.mean - floor) / self.se if self.se > 0 else math.copysign(math.inf, self.mean - floor)


def pooled_test(diffs: Sequence[float], null: Sequence[float]) -> PooledTest:
    """The pooled test of `diffs` (child - control per seed pair) against `null` (differences
    between runs of one harness); needs len(null) + len(diffs) >= 2."""
    n, m = len(diffs), len(null)
    if n < 1 or n + m < 2:
        raise ValueError(f"a pooled test needs a gain and two values in all, got {n} gains and {m} null differences")
    mean = sum(diffs) / n
    ss = sum(r * r for r in null) + sum((d - mean) ** 2 for d in diffs)
    df = m + n - 1
    return PooledTest(mean, math.sqrt(ss / df) / math.sqrt(n), df, n)


def bootstrap_ci(xs: Sequence[float], level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of xs (paired differences, one per seed)."""
    if not xs:
        raise ValueError("no values")
    rng = random.Random(seed)
    n = len(xs)
    return _percentiles([sum(rng.choice(xs) for _ in range(n)) / n for _ in range(n_boot)], level)


def clustered_t_interval(rows: Sequence[Sequence[float]], level: float = 0.95) -> tuple[float, float]:
    """The t interval of the grand mean of a unit x seed table (a paired difference per search
    replicate or base, and fresh seed), with the units as the independent draws: each row's
    mean is one value, R - 1 degrees of freedom. Seeds within a unit share its noise (its
    search, its base), so resampling them as if independent would claim too much; with one
    row it is the t interval over that row's seeds."""
    if not rows or not rows[0]:
        raise ValueError("no values")
    return t_interval(list(rows[0]) if len(rows) == 1 else [sum(r) / len(r) for r in rows], level)


def crossed_t_interval(rows: Sequence[Sequence[float]], level: float = 0.95) -> tuple[float, float]:
    """The t interval of the grand mean of a unit x seed table in which every unit was measured
    on the SAME seeds (a crossed design: each search replicate's winner replayed on one shared
    set of fresh seeds). Units and seeds are both random: y[u][s] = m + a[u] + b[s] + e[u][s],
    and the grand mean's variance a[u]/U + b[s]/S + e/(U S) is estimated from the two-way mean
    squares, (MS_unit + MS_seed - MS_resid) / (U S), with Satterthwaite's degrees of freedom.
    The clustered interval (units as the draws) misses the seed term, which the units share:
    units that agree (every replicate's winner the root) give it zero width, however much
    the seeds disagree. One row or one column: the t interval over the other axis."""
    if not rows or not rows[0]:
        raise ValueError("no values")
    if len(rows) == 1:
        return t_interval(list(rows[0]), level)
    if len(rows[0]) == 1:
        return t_interval([r[0] for r in rows], level)
    u, n = len(rows), len(rows[0])
    if any(len(r) != n for r in rows):
        raise ValueError("every unit needs a value per seed")
    grand = sum(map(sum, rows)) / (u * n)
    unit = [sum(r) / n for r in rows]
    seed = [sum(r[s] for r in rows) / u for s in range(n)]
    ms_unit = n * sum((x - grand) ** 2 for x in unit) / (u - 1)
    ms_seed = u * sum((x - grand) ** 2 for x in seed) / (n - 1)
    resid = sum((rows[i][s] - unit[i] - seed[s] + grand) ** 2 for i in range(u) for s in range(n))
    ms_resid = resid / ((u - 1) * (n - 1))
    # a negative estimate (MS_resid above the others, by chance) is floored at what the
    # residual alone gives; the terms kept set the degrees of freedom
    terms = [(ms_unit, u - 1), (ms_seed, n - 1), (ms_resid, (u - 1) * (n - 1))]
    var = (ms_unit + ms_seed - ms_resid) / (u * n)
    if var < ms_resid / (u * n):
        var, terms = ms_resid / (u * n), [(ms_resid, (u - 1) * (n - 1))]
    if var == 0:
        return grand, grand  # every value the same: nothing varies
    df = (var * u * n) ** 2 / sum(ms ** 2 / d for ms, d in terms if ms > 0)
    h = t_quantile((1 + level) / 2, df) * math.sqrt(var)
    return grand - h, grand + h


def _percentiles(means: list[float], level: float) -> tuple[float, float]:
    """The central `level` interval of bootstrap means."""
    means = sorted(means)
    n = len(means)
    return means[int((1 - level) / 2 * n)], means[min(int((1 + level) / 2 * n), n - 1)]
