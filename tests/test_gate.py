"""The gate and its statistics on hand-made numbers."""
import math

import pytest

from evotrainer.config import GateConfig
from evotrainer.evolve.gate import gate
from evotrainer.evolve.stats import average_last, bootstrap_ci, crossed_bootstrap_ci, mean_se, paired_differences


def test_statistics():
    assert average_last([0.1, 0.5, 0.7], 2) == pytest.approx(0.6)
    assert average_last([0.3], 5) == 0.3
    assert paired_differences({0: 0.5, 1: 0.6, 2: 0.9}, {0: 0.4, 1: 0.7}) == pytest.approx([0.1, -0.1])
    with pytest.raises(ValueError, match="no seed in common"):
        paired_differences({0: 1.0}, {1: 1.0})
    m, se = mean_se([0.1, 0.3])
    assert m == pytest.approx(0.2) and se == pytest.approx(0.1)
    assert math.isnan(mean_se([0.2])[1])
    lo, hi = bootstrap_ci([0.05, 0.06, 0.04, 0.05, 0.07])
    assert 0.04 <= lo < 0.054 < hi <= 0.07
    lo, hi = bootstrap_ci([-0.1, 0.1, -0.05, 0.08, 0.0])
    assert lo < 0 < hi  # a coin flip's interval straddles zero


CFG = GateConfig(z=2.0, min_gain=0.01)


def test_consistent_gain_beyond_the_noise_is_kept():
    d = gate({0: 0.60, 1: 0.62, 2: 0.61}, {0: 0.50, 1: 0.51, 2: 0.52}, cfg=CFG, noise_sd=0.02)
    assert d.label == "kept" and d.gain == pytest.approx(0.1, abs=1e-9)


def test_gain_inside_the_measured_noise_floor_is_discarded():
    # the two seeds agree closely, but the measured floor says seeds spread 16 points
    d = gate({0: 0.60, 1: 0.61}, {0: 0.55, 1: 0.56}, cfg=CFG, noise_sd=0.16)
    assert d.label == "discarded" and d.threshold == pytest.approx(2 * 0.16 / math.sqrt(2))
    assert "does not beat" in d.reasons[0]


def test_one_lucky_seed_is_not_a_gain():
    d = gate({0: 0.90, 1: 0.50, 2: 0.49}, {0: 0.50, 1: 0.51, 2: 0.50}, cfg=CFG)
    assert d.label == "discarded"


def test_tiny_gain_below_the_absolute_floor_is_discarded():
    d = gate({0: 0.505, 1: 0.505}, {0: 0.5, 1: 0.5}, cfg=CFG)
    assert d.label == "discarded" and d.threshold == 0.01


def test_blocking_finding_makes_it_invalid_however_well_it_scores():
    d = gate({0: 0.9, 1: 0.9}, {0: 0.5, 1: 0.5}, ["reward_score_divergence = 0.18"], cfg=CFG)
    assert d.label == "invalid" and d.reasons == ("blocking finding: reward_score_divergence = 0.18",)


def test_controller_time_adds_up_sessions_not_the_gap_between_a_kill_and_a_resume():
    from evotrainer.evolve.report import controller_seconds
    ev = [{"kind": "session_started", "t": 0}, {"kind": "x", "t": 10},
          {"kind": "session_started", "t": 1000}, {"kind": "x", "t": 1005}]
    assert controller_seconds(ev) == 15
    assert controller_seconds([]) == 0.0
    assert controller_seconds([{"kind": "run_started", "t": 5}, {"kind": "x", "t": 9}]) == 4  # a log from before sessions


def test_noise_floor_is_the_rms_of_paired_differences_between_runs_of_one_harness():
    from evotrainer.evolve.stats import noise_floor
    run = {0: 0.50, 1: 0.40}
    assert noise_floor(run, []) == 0.0
    assert noise_floor(run, [{0: 0.53, 1: 0.36}]) == pytest.approx(((0.03 ** 2 + 0.04 ** 2) / 2) ** 0.5)
    # a measured floor raises the bar that two agreeing seeds alone would set
    quiet = gate({0: 0.52, 1: 0.52}, {0: 0.50, 1: 0.50}, cfg=CFG)
    noisy = gate({0: 0.52, 1: 0.52}, {0: 0.50, 1: 0.50}, cfg=CFG, noise_sd=0.05)
    assert quiet.label == "kept" and noisy.label == "discarded" and noisy.threshold > 0.07


def test_crossed_bootstrap_carries_the_spread_between_search_replicates():
    # every replicate's seeds agree closely, but the replicates disagree: resampling seeds
    # alone would give a narrow interval; resampling replicates too must widen it
    rows = [[0.05, 0.06, 0.05], [-0.04, -0.03, -0.05], [0.02, 0.01, 0.02]]
    lo, hi = crossed_bootstrap_ci(rows)
    grand = sum(map(sum, rows)) / 9
    assert lo < grand < hi and lo < 0 < hi
    seeds_only = bootstrap_ci([sum(col) / 3 for col in zip(*rows)])
    assert hi - lo > 3 * (seeds_only[1] - seeds_only[0])
    lo1, hi1 = crossed_bootstrap_ci([[0.05, 0.06, 0.04, 0.05, 0.07]])  # one replicate: the seeds' bootstrap
    assert 0.04 <= lo1 < 0.054 < hi1 <= 0.07
