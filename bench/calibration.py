"""How often the gate and the final interval err when nothing changed: pure simulations.

The gate promises that a child with no effect is kept at most `promotion.alpha` of the time, and
the final comparison that its interval covers the true difference at its stated level. Both
rest on the paired differences being roughly normal with a spread the run measures; these
simulations draw such differences (null: mean 0) and run the real gate and interval code
on them, so a change to either is checked in milliseconds (the tests), while
bench/null_calibration.py checks the same on real training runs. The previous rules are here
too, for the before/after table.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from scipy import stats as _scipy_stats

from evotrainer.config import PromotionConfig
from evotrainer.evolve.stats.gate import gate
from evotrainer.evolve.stats.paired import bootstrap_ci, mean_se, t_interval
from evotrainer.labels import Label


@dataclass(frozen=True)
class Rate:
    """k events in n trials, with a Clopper-Pearson (exact binomial) interval."""
    k: int
    n: int
    level: float = 0.95

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else math.nan

    @property
    def ci(self) -> tuple[float, float]:
        ci = _scipy_stats.binomtest(self.k, self.n).proportion_ci(self.level, method="exact")
        return ci.low, ci.high

    def __str__(self) -> str:
        lo, hi = self.ci
        return f"{100 * self.rate:.1f}% ({self.k}/{self.n}; {int(100 * self.level)}% CI {100 * lo:.1f}-{100 * hi:.1f}%)"


def old_gate_keeps(diffs: Sequence[float], null: Sequence[float], z: float = 2.0, min_gain: float = 0.01) -> bool:
    """The gate before issue 32: gain > max(min_gain, z x max(se of the seeds, noise_sd / sqrt(n))),
    noise_sd the root mean square of the null differences."""
    gain, se_seen = mean_se(diffs)
    noise_sd = math.sqrt(sum(r * r for r in null) / len(null)) if null else 0.0
    se = max(0.0 if math.isnan(se_seen) else se_seen, noise_sd / math.sqrt(len(diffs)))
    return gain > max(min_gain, z * se)


def gate_run(draw: Callable[[], float], seeds: int, null: Sequence[float], cfg: PromotionConfig,
             unbacked: Sequence[str] = ()) -> tuple[str, int]:
    """One trial through the real gate: `draw()` gives one seed pair's gain; extra pairs are
    drawn while the gate says `more`; `unbacked`: the child's refutable blocking claims.
    Returns (label, seed pairs used)."""
    child = {s: draw() for s in range(seeds)}
    control = {s: 0.0 for s in range(seeds)}
    extra: list[tuple[float, float]] = []
    while True:
        d = gate(child, control, unbacked=unbacked, cfg=cfg, null=null, extra=extra)
        if not d.more:
            return d.label, seeds + len(extra)
        extra.append((draw(), 0.0))


def simulate_gate(effect: float | Sequence[float] = 0.0, sd: float = 0.022, seeds: int = 2, replicas: int = 2,
                  cfg: PromotionConfig = PromotionConfig(), trials: int = 20_000, seed: int = 0,
                  unbacked: Sequence[str] = ()) -> dict:
    """Trials of a child whose pairs differ from the control by `effect` (one value, or one per
    pair, cycled) plus normal noise of sd `sd`; the null measured from `replicas` x `seeds`
    differences of the same noise. The new gate's keep rate and the old one's, and the mean
    seed pairs the new one spent; `unbacked`: a refutable blocking claim on every child."""
    rng = random.Random(seed)
    effects = [effect] if isinstance(effect, (int, float)) else list(effect)
    new = old = pairs = 0
    for _ in range(trials):
        null = [rng.gauss(0, sd) for _ in range(replicas * seeds)]
        pair = itertools.count()

        def draw() -> float:
            return effects[next(pair) % len(effects)] + rng.gauss(0, sd)
        label, used = gate_run(draw, seeds, null, cfg, unbacked)
        new += label == Label.KEPT
        pairs += used
        first = [effects[j % len(effects)] + rng.gauss(0, sd) for j in range(seeds)]
        old += old_gate_keeps(first, null, min_gain=cfg.min_gain)
    return {"new": Rate(new, trials), "old": Rate(old, trials), "mean_pairs": pairs / trials}


def simulate_interval(n: int, sd: float = 0.02, level: float = 0.95, trials: int = 4_000, seed: int = 0,
                      n_boot: int = 1_000) -> dict:
    """Null final comparisons of n paired seeds: how often the t interval and the old percentile
    bootstrap miss 0 (say 'beat' or 'worse'), and how often they say 'beat' (lower bound > 0)."""
    rng = random.Random(seed)
    miss_t = miss_b = beat_t = beat_b = 0
    for k in range(trials):
        xs = [rng.gauss(0, sd) for _ in range(n)]
        lo, hi = t_interval(xs, level)
        miss_t += not lo <= 0 <= hi
        beat_t += lo > 0
        blo, bhi = bootstrap_ci(xs, level, n_boot=n_boot, seed=k)
        miss_b += not blo <= 0 <= bhi
        beat_b += blo > 0
    return {"t_miss": Rate(miss_t, trials), "boot_miss": Rate(miss_b, trials),
            "t_beat": Rate(beat_t, trials), "boot_beat": Rate(beat_b, trials)}


@dataclass(frozen=True)
class SubsetRate:
    """How often `event` happens over every k-subset of n seeds (a U-statistic), with a
    jackknife-over-seeds interval. Overlapping subsets share seeds, so a binomial interval over
    them would be far too narrow; disjoint subsets alone are independent but few. Leaving one
    seed out at a time measures how much the rate leans on each seed (Efron & Stein, 1981)."""
    rate: float
    se: float
    subsets: int
    seeds: int
    level: float = 0.95

    @property
    def ci(self) -> tuple[float, float]:
        z = _scipy_stats.norm.ppf(0.5 + self.level / 2)
        return max(0.0, self.rate - z * self.se), min(1.0, self.rate + z * self.se)

    def __str__(self) -> str:
        lo, hi = self.ci
        return (f"{100 * self.rate:.1f}% (over {self.subsets} subsets of {self.seeds} seeds; "
                f"{int(100 * self.level)}% jackknife CI {100 * lo:.1f}-{100 * hi:.1f}%)")


def subset_rate(values: Sequence[float], k: int, event: Callable[[Sequence[float]], bool],
                level: float = 0.95) -> SubsetRate:
    """`event` over every k-subset of `values`, and its jackknife standard error: the rate
    without seed i is (all hits - hits that include i) / C(n-1, k)."""
    n = len(values)
    if n < k + 2:
        raise ValueError(f"subset_rate needs at least k + 2 = {k + 2} values, got {n}")
    hits_with = [0] * n
    total = subsets = 0
    for idx in itertools.combinations(range(n), k):
        subsets += 1
        if event([values[i] for i in idx]):
            total += 1
            for i in idx:
                hits_with[i] += 1
    left_out = [(total - h) / math.comb(n - 1, k) for h in hits_with]
    mean = sum(left_out) / n
    se = math.sqrt((n - 1) / n * sum((r - mean) ** 2 for r in left_out))
    return SubsetRate(total / subsets, se, subsets, n, level)
