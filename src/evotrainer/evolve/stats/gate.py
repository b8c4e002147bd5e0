"""The promotion gate: a sequential test of a child's paired gain against the run's null.

Per trial the child and its control train on the run's seeds, paired (the same problems per
seed, each sampling with its own stream). The gains (child - control, one per seed pair) are
tested against the null the run measured: the differences between the root harness and its
noise replicas (the same problems, other sampling seeds), pooled with the gains' own spread
(stats.pooled_test). Three outcomes at each look:

- keep: the one-sided lower confidence bound of the mean gain clears `min_gain`;
- more: not yet, but promising (the mean clears `min_gain` by at least one standard error)
  and looks are left: the trial trains one more seed pair and looks again;
- discard: otherwise.

The error rate: each of the 1 + `extra_pairs` looks tests at alpha / (1 + extra_pairs)
(Bonferroni), so a child with no effect is kept at most `alpha` of the time over all its
looks together, whatever the looks' correlation; bench/null_calibration.py measures it.
A blocking finding (reward coupled to length or to the number of turns, diagnostics that
failed) labels the child `invalid` at once, however well it scores. One kind is a claim the
evaluator can check: that the reward rose while the verifier's score did not (UNBACKED, read
off the training rollouts, where a short segment's score trend is noisy). The child is judged
as any other, and the claim stands (`invalid`) unless the gate keeps it: a validation gain
whose lower bound clears `min_gain` is the verifier's score on held-out problems, risen beyond
the noise. On codegen-weak from one machine's base, per-test partial credit gained +5.5
validation points over two seeds while its training score rose less than its reward (a
divergence of 0.05, where 0.03 blocks).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

from evotrainer.config import PromotionConfig
from evotrainer.evolve.stats.paired import paired_differences, pooled_test
from evotrainer.labels import Label

PROMISING_SE = 1.0  # "more" needs the mean gain above min_gain by this many standard errors
# blocking diagnostics whose claim is that the verifier's score did not rise: a kept
# validation gain refutes them (see the module's docstring)
UNBACKED = frozenset({"reward_score_divergence"})


@dataclass(frozen=True)
class GateDecision:
    label: str | None          # kept | discarded | invalid; None: inconclusive, train another seed pair
    gain: float                # mean paired difference, child - control
    se: float                  # its standard error (pooled with the null)
    threshold: float           # what the gain had to beat: min_gain + t x se (the lower bound's margin)
    rule: str                  # which rule decided: keep (lower bound), more (promising), discard, blocking
    reasons: tuple[str, ...]

    @property
    def more(self) -> bool:
        return self.label is None


def looks(cfg: PromotionConfig) -> int:
    """How many times a trial may be judged: on the run's seeds, then after each extra pair."""
    return 1 + cfg.extra_pairs


def gate(child: Mapping[int, float], control: Mapping[int, float], blocking: Sequence[str] = (),
         *, unbacked: Sequence[str] = (), cfg: PromotionConfig = PromotionConfig(), null: Sequence[float] = (),
         extra: Sequence[tuple[float, float]] = ()) -> GateDecision:
    """child, control: validation fitness per run seed (each an average of the last evaluations);
    blocking, unbacked: the blocking findings ("name = value"), those of UNBACKED apart; null:
    the run's null differences (stats.null_differences); extra: (child, control) fitness of the
    extra seed pairs trained so far. Pure: the caller trains a pair where it says `more`."""
    diffs = paired_differences(child, control) + [c - k for c, k in extra]
    if blocking:
        return GateDecision(Label.INVALID, sum(diffs) / len(diffs), float("nan"), float("nan"), "blocking",
                            tuple(f"blocking finding: {b}" for b in [*blocking, *unbacked]))
    d = _test(diffs, null, cfg, 1 + len(extra))
    if not unbacked or d.label is None:
        return d
    if d.label == Label.KEPT:
        return dataclasses.replace(d, reasons=d.reasons + tuple(
            f"blocking finding refuted: {b}, but the validation score rose beyond the noise" for b in unbacked))
    return dataclasses.replace(d, label=Label.INVALID, rule="blocking",
                               reasons=tuple(f"blocking finding: {b}" for b in unbacked) + d.reasons)


def _test(diffs: list[float], null: Sequence[float], cfg: PromotionConfig, look: int) -> GateDecision:
    """The sequential test of the paired gains at this look: keep, more or discard."""
    test = pooled_test(diffs, null)
    alpha = cfg.alpha / looks(cfg)
    lower = test.lower(alpha)
    threshold = test.mean - lower + cfg.min_gain
    said = (f"gain {test.mean:+.3f} over {test.n} paired seeds, se {test.se:.3f} (pooled with "
            f"{len(null)} null differences, {test.df} df); one-sided {100 * (1 - alpha):.2f}% lower bound "
            f"{lower:+.3f}")
    if lower > cfg.min_gain:
        return GateDecision(Label.KEPT, test.mean, test.se, threshold, "keep",
                            (f"{said} clears min_gain {cfg.min_gain:g} (look {look} of {looks(cfg)}, "
                             f"alpha {cfg.alpha:g} split over the looks)",))
    if look < looks(cfg) and test.t(cfg.min_gain) >= PROMISING_SE:
        return GateDecision(None, test.mean, test.se, threshold, "more",
                            (f"{said} does not clear min_gain {cfg.min_gain:g} yet, but the gain is "
                             f"{test.t(cfg.min_gain):.1f} se above it: one more seed pair (look {look + 1} "
                             f"of {looks(cfg)})",))
    why = "no looks left" if look >= looks(cfg) else f"under {PROMISING_SE:g} se above min_gain: not promising"
    return GateDecision(Label.DISCARDED, test.mean, test.se, threshold, "discard",
                        (f"{said} does not clear min_gain {cfg.min_gain:g} (look {look} of {looks(cfg)}; {why})",))
