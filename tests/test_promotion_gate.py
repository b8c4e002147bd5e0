"""The gate and its statistics on hand-made numbers; the simulations of bench/calibration.py
(what bench/null_calibration.py reports) on the real gate."""
import importlib.util
import math
import random
import sys
from pathlib import Path

import pytest

from evotrainer.config import PromotionConfig, config_from_dict
from evotrainer.evolve.stats.gate import gate
from evotrainer.evolve.stats.paired import (
    average_last,
    bootstrap_ci,
    clustered_t_interval,
    crossed_t_interval,
    mean_se,
    paired_differences,
    pooled_test,
    t_interval,
)


ROOT = Path(__file__).resolve().parents[1]


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod   # its dataclasses look their module up there, other benches import it
    spec.loader.exec_module(mod)
    return mod


calibration = _bench_module("calibration")


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


CFG = PromotionConfig(alpha=0.025, min_gain=0.01, replicas=2, extra_pairs=2)
NULL = [0.022, -0.022, 0.022, -0.022]  # 2 replicas x 2 seeds: a noise sd of 2.2 points


def test_the_fresh_clone_gain_of_54_and_16_points_is_kept():
    """Issue 32's case: partial credit +54.3 and +16.0 points over a control near 0, noise sd 2.2.
    The old gate's bar came from the two seeds' own spread (one degree of freedom) and discarded
    it; pooled with the measured null it is kept at the first look."""
    d = gate({0: 0.549, 1: 0.162}, {0: 0.006, 1: 0.002}, cfg=CFG, null=NULL)
    assert d.label == "kept" and d.rule == "keep" and d.gain == pytest.approx(0.3515)
    assert "lower bound" in d.reasons[0] and "look 1 of 3" in d.reasons[0]
    # with one replica (2 null differences) the same two seeds are promising but not yet decisive:
    # one more pair in their range decides it
    one = gate({0: 0.549, 1: 0.162}, {0: 0.006, 1: 0.002}, cfg=CFG, null=NULL[:2])
    assert one.more and one.rule == "more" and "one more seed pair" in one.reasons[0]
    assert gate({0: 0.549, 1: 0.162}, {0: 0.006, 1: 0.002}, cfg=CFG, null=NULL[:2],
                extra=[(0.30, 0.004)]).label == "kept"


def test_consistent_gain_beyond_the_noise_is_kept():
    d = gate({0: 0.60, 1: 0.62, 2: 0.61}, {0: 0.50, 1: 0.51, 2: 0.52}, cfg=CFG, null=[0.02, -0.01, 0.015])
    assert d.label == "kept" and d.gain == pytest.approx(0.1, abs=1e-9)


def test_gain_inside_the_measured_noise_is_discarded():
    # the two seeds agree closely, but the measured null says pairs spread 16 points
    d = gate({0: 0.60, 1: 0.61}, {0: 0.55, 1: 0.56}, cfg=CFG, null=[0.16, -0.15, 0.17, -0.16])
    assert d.label == "discarded" and d.rule == "discard" and "not promising" in d.reasons[0]
    assert d.threshold > 0.2


def test_one_lucky_seed_is_not_a_gain():
    d = gate({0: 0.90, 1: 0.50, 2: 0.49}, {0: 0.50, 1: 0.51, 2: 0.50}, cfg=CFG, null=NULL)
    assert d.label != "kept"


def test_tiny_gain_below_the_absolute_floor_is_discarded():
    d = gate({0: 0.505, 1: 0.505}, {0: 0.5, 1: 0.5}, cfg=CFG, null=[1e-4, -1e-4])
    assert d.label == "discarded"


def test_a_promising_child_gets_its_extra_pairs_and_then_a_decision():
    args = ({0: 0.56, 1: 0.57}, {0: 0.50, 1: 0.50})
    first = gate(*args, cfg=CFG, null=[0.03, -0.03])
    assert first.more
    assert gate(*args, cfg=CFG, null=[0.03, -0.03], extra=[(0.50, 0.50)]).more   # still promising
    last = gate(*args, cfg=CFG, null=[0.03, -0.03], extra=[(0.50, 0.50), (0.50, 0.50)])
    assert last.label == "discarded" and "no looks left" in last.reasons[0]
    # no extra pairs configured: decided at once
    assert gate(*args, cfg=PromotionConfig(extra_pairs=0), null=[0.03, -0.03]).label == "discarded"


def test_blocking_finding_makes_it_invalid_however_well_it_scores():
    d = gate({0: 0.9, 1: 0.9}, {0: 0.5, 1: 0.5}, ["reward_length_coupling = 0.9"], cfg=CFG, null=NULL)
    assert d.label == "invalid" and d.reasons == ("blocking finding: reward_length_coupling = 0.9",)
    assert gate({0: 0.9, 1: 0.9}, {0: 0.5, 1: 0.5}, ["reward_length_coupling = 0.9"],
                unbacked=["reward_score_divergence = 0.18"], cfg=CFG, null=NULL).label == "invalid"


def test_a_reward_rise_the_score_did_not_back_stands_unless_validation_rose_beyond_the_noise():
    """reward_score_divergence says the verifier's score did not rise with the reward, read off
    the training rollouts; a validation gain the gate keeps is that score, on held-out problems,
    risen beyond the noise. Short of a keep the claim stands: invalid, never discarded."""
    claim = ["reward_score_divergence = 0.05"]
    kept = gate({0: 0.9, 1: 0.9}, {0: 0.5, 1: 0.5}, unbacked=claim, cfg=CFG, null=NULL)
    assert kept.label == "kept" and kept.rule == "keep"
    assert kept.reasons[-1] == ("blocking finding refuted: reward_score_divergence = 0.05, "
                                "but the validation score rose beyond the noise")
    flat = gate({0: 0.51, 1: 0.5}, {0: 0.5, 1: 0.5}, unbacked=claim, cfg=CFG, null=NULL)
    assert gate({0: 0.51, 1: 0.5}, {0: 0.5, 1: 0.5}, cfg=CFG, null=NULL).label == "discarded"
    assert flat.label == "invalid" and flat.rule == "blocking" and flat.reasons[0] == f"blocking finding: {claim[0]}"
    args = ({0: 0.549, 1: 0.162}, {0: 0.006, 1: 0.002})  # promising, not yet kept: one more pair first
    assert gate(*args, unbacked=claim, cfg=CFG, null=NULL[:2]).more and gate(*args, cfg=CFG, null=NULL[:2]).more


def test_the_gate_keeps_a_null_child_no_more_often_than_alpha_and_keeps_real_gains():
    """The simulated mode of bench/null_calibration.py: the real gate on normal noise."""
    simulate_gate = calibration.simulate_gate
    null = simulate_gate(0.0, trials=4000, seed=1)
    assert null["new"].ci[0] <= CFG.alpha and null["new"].rate <= CFG.alpha
    assert null["old"].rate > 0.03  # the old rule's rate, for the record: over its ~2.3%
    strong = simulate_gate([0.547, 0.16], trials=300, seed=2)   # large, of varying size
    assert strong["new"].rate > 0.99 and strong["old"].rate < 0.5
    moderate = simulate_gate(0.066, trials=1000, seed=3)         # 3 noise sd
    assert moderate["new"].rate > 0.85
    # a child every look of which carries a reward-score divergence: kept only where the test keeps
    claim = ["reward_score_divergence = 0.05"]
    claimed = simulate_gate(0.0, trials=4000, seed=1, unbacked=claim)
    assert claimed["new"].rate <= CFG.alpha and claimed["new"].rate == null["new"].rate
    assert simulate_gate(0.066, trials=1000, seed=3, unbacked=claim)["new"].rate == moderate["new"].rate


def test_the_t_interval_holds_its_level_where_the_bootstrap_did_not():
    simulate_interval = calibration.simulate_interval
    r = simulate_interval(3, trials=1500, seed=4, n_boot=400)
    lo, hi = r["t_miss"].ci
    assert lo <= 0.05 <= hi
    assert r["boot_miss"].rate > 0.15   # [min, max] of three values
    assert t_interval([0.1]) == (-math.inf, math.inf)
    lo, hi = t_interval([0.05, 0.06, 0.04])
    assert lo == pytest.approx(0.05 - 4.302653 * 0.01 / math.sqrt(3), abs=1e-6) and hi > 0.06


def test_subset_rate_is_the_rate_over_every_subset_with_a_leave_one_seed_out_error():
    from itertools import combinations
    subset_rate = calibration.subset_rate
    values = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0]
    r = subset_rate(values, 3, lambda xs: min(xs) > 0)
    assert r.subsets == 20 and r.rate == pytest.approx(4 / 20)
    # the jackknife by brute force: the rate over the triples of the other five seeds
    rates = [sum(min(c) > 0 for c in combinations(values[:i] + values[i + 1:], 3)) / 10 for i in range(6)]
    m = sum(rates) / 6
    assert r.se == pytest.approx(math.sqrt(5 / 6 * sum((x - m) ** 2 for x in rates)))
    # a null that holds: normal differences, the t interval misses 0 about 5% of the time
    rng = random.Random(7)
    null = subset_rate([rng.gauss(0, 1) for _ in range(40)], 3, lambda xs: not t_interval(xs)[0] <= 0 <= t_interval(xs)[1])
    assert null.ci[0] <= 0.05 <= null.ci[1] and null.ci[1] - null.ci[0] < 0.12
    with pytest.raises(ValueError, match="at least"):
        subset_rate([0.1, 0.2, 0.3, 0.4], 3, bool)


def test_pooled_test_counts_the_null_as_degrees_of_freedom():
    t = pooled_test([0.3, 0.5], [0.01, -0.01, 0.02, -0.02])
    assert t.df == 5 and t.mean == pytest.approx(0.4)
    assert t.se == pytest.approx(math.sqrt((0.0001 * 2 + 0.0004 * 2 + 0.02) / 5 / 2))
    with pytest.raises(ValueError):
        pooled_test([0.3], [])


def test_controller_time_adds_up_sessions_not_the_gap_between_a_kill_and_a_resume():
    from evotrainer.evolve.status import controller_seconds
    from evotrainer.lineage import Logged
    from evotrainer.lineage.events import SessionStarted, Stopped
    session, other = SessionStarted(), Stopped("x")
    ev = [Logged(1, 0, session), Logged(2, 10, other), Logged(3, 1000, session), Logged(4, 1005, other)]
    assert controller_seconds(ev) == 15
    assert controller_seconds([]) == 0.0
    assert controller_seconds([Logged(1, 5, other), Logged(2, 9, other)]) == 4  # a log from before sessions


def test_noise_floor_is_the_rms_of_paired_differences_between_runs_of_one_harness():
    from evotrainer.evolve.stats.paired import noise_floor
    run = {0: 0.50, 1: 0.40}
    assert noise_floor(run, []) == 0.0
    assert noise_floor(run, [{0: 0.53, 1: 0.36}]) == pytest.approx(((0.03 ** 2 + 0.04 ** 2) / 2) ** 0.5)


def test_crossed_t_interval_keeps_the_shared_seeds_spread_and_holds_its_level_on_null_tables():
    # two replicates whose winners are the same arm: identical rows. The clustered interval
    # (replicates as the draws) is a point; the seeds still disagree, and the crossed one says so
    rows = [[0.02, -0.01, 0.04, 0.00, -0.03]] * 2
    lo, hi = clustered_t_interval(rows)
    assert hi - lo == pytest.approx(0.0)
    assert crossed_t_interval(rows) == pytest.approx(t_interval(rows[0]))
    assert crossed_t_interval([rows[0]]) == t_interval(rows[0])              # one row: over its seeds
    assert crossed_t_interval([[0.1], [0.2], [0.4]]) == t_interval([0.1, 0.2, 0.4])  # one seed: over the rows
    assert crossed_t_interval([[0.01] * 5] * 3) == pytest.approx((0.01, 0.01))  # nothing varies
    # null tables y[u][s] = a[u] + b[s] + e, true mean 0, at the suite's sizes: the crossed
    # interval covers 0 at about its level whichever term dominates; the clustered one does
    # not where the shared seeds carry the spread
    rng = random.Random(0)

    def coverage(interval, u, sa, sb, se, n=1500):
        hit = 0
        for _ in range(n):
            a, b = [rng.gauss(0, sa) for _ in range(u)], [rng.gauss(0, sb) for _ in range(5)]
            lo, hi = interval([[a[i] + b[s] + rng.gauss(0, se) for s in range(5)] for i in range(u)])
            hit += lo <= 0 <= hi
        return hit / n
    for u in (2, 3):
        for sa, sb, se in ((0, 2, 0.01), (2, 2, 1), (1, 1, 1), (2, 0, 1)):
            assert coverage(crossed_t_interval, u, sa, sb, se) >= 0.90, (u, sa, sb, se)
        assert coverage(clustered_t_interval, u, 0, 2, 0.01) < 0.1


def test_clustered_t_interval_carries_the_spread_between_search_replicates():
    # every replicate's seeds agree closely, but the replicates disagree: the replicates are
    # the independent draws, so the interval must be wide
    rows = [[0.05, 0.06, 0.05], [-0.04, -0.03, -0.05], [0.02, 0.01, 0.02]]
    lo, hi = clustered_t_interval(rows)
    grand = sum(map(sum, rows)) / 9
    assert lo < grand < hi and lo < 0 < hi
    seeds_only = t_interval([sum(col) / 3 for col in zip(*rows)])
    assert hi - lo > 3 * (seeds_only[1] - seeds_only[0])
    assert clustered_t_interval([[0.05, 0.06, 0.04]]) == t_interval([0.05, 0.06, 0.04])


def test_null_calibration_runs_the_quickstart_in_its_own_search_mode():
    # the real-mode null bench overrides the search's selection; it dropped `search.mode` once,
    # so in continue mode at one segment's budget no child could be trained and every run ended
    # after its root
    raw = _bench_module("null_calibration").bench_config(
        ROOT / "configs" / "quickstart.yaml", ROOT / "examples" / "harnesses" / "partial_credit", [10, 11], 6, 60)
    cfg = config_from_dict(raw).validate()
    assert cfg.search.restarts and cfg.search.selection == "greedy"
    assert cfg.budget.total_steps == cfg.budget.steps_per_segment == 60
