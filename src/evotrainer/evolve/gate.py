"""The promotion gate: a pure decision over paired per-seed fitness and the findings.

A version is promoted (`kept`) only when its validation gain over the control, paired by
seed, beats both an absolute floor and z standard errors, where the standard error is
the larger of what its own seeds show and the noise floor measured beforehand (re-runs
of the parent with paired seeds): two seeds alone cannot show how noisy they are. A
blocking finding (reward rising while the verifier score is not, reward coupled to
length) labels it `invalid`, however well it scores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from evotrainer.config import GateConfig
from evotrainer.evolve.stats import mean_se, paired_differences
from evotrainer.labels import Label


@dataclass(frozen=True)
class GateDecision:
    label: Label               # kept | discarded | invalid
    gain: float                # mean paired difference, child - control
    se: float                  # the standard error the gain was judged against
    threshold: float           # what the gain had to beat
    reasons: tuple[str, ...]


def gate(child: Mapping[int, float], control: Mapping[int, float], blocking: Sequence[str] = (),
         cfg: GateConfig = GateConfig(), noise_sd: float = 0.0) -> GateDecision:
    """child, control: validation fitness per seed (each already an average of the last evaluations)."""
    diffs = paired_differences(child, control)
    gain, se_seen = mean_se(diffs)
    se = max(0.0 if math.isnan(se_seen) else se_seen, noise_sd / math.sqrt(len(diffs)))
    threshold = max(cfg.min_gain, cfg.z * se)
    if blocking:
        return GateDecision(Label.INVALID, gain, se, threshold, tuple(f"blocking finding: {b}" for b in blocking))
    if gain > threshold:
        return GateDecision(Label.KEPT, gain, se, threshold,
                            (f"gain {gain:+.3f} over {len(diffs)} paired seeds beats {threshold:.3f}",))
    return GateDecision(Label.DISCARDED, gain, se, threshold,
                        (f"gain {gain:+.3f} over {len(diffs)} paired seeds does not beat {threshold:.3f} "
                         f"(max of min_gain {cfg.min_gain:g} and {cfg.z:g} x se {se:.3f})",))
