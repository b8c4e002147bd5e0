"""The final comparison's pure parts: which schedule a winner replays, and the paired table."""
import math
from types import SimpleNamespace as T

import pytest

from evotrainer.evolve.stats.final import compare, extend, schedule, table, verdict, winner


def trial(version, depth, parent=None):
    return T(version=version, depth=depth, parents=[parent] if parent else [])


TRIALS = [trial("v0", 1), trial("v1", 2, "v0"), trial("v2", 3, "v1"), trial("v3", 3, "v0"), trial(None, 2, "v0")]


@pytest.mark.parametrize("state, expected", [
    (("v0", 3), ["v0", "v0", "v0"]),      # the root continued as its own control
    (("v1", 2), ["v0", "v1"]),            # a child at the depth it was made
    (("v1", 4), ["v0", "v1", "v1", "v1"]),  # ... continued below that
    (("v2", 3), ["v0", "v1", "v2"]),      # a grandchild
    (("v3", 3), ["v0", "v0", "v3"]),      # made from the root's control at depth 2
])
def test_schedule_walks_the_lineage(state, expected):
    assert schedule(TRIALS, *state) == expected


def test_short_schedules_continue_with_their_last_harness():
    assert extend(["v0", "v1"], 4) == ["v0", "v1", "v1", "v1"]
    assert extend(["v0", "v1"], 2) == ["v0", "v1"]


def test_winner_is_chosen_on_validation_only():
    a = T(version="v1", depth=2, mean_val=0.30, test={0: 0.9})
    b = T(version="v2", depth=2, mean_val=0.35, test={0: 0.1})
    assert winner([a, b]) is b


def test_the_report_says_the_winner_is_the_best_validated_state_not_the_last_kept():
    from evotrainer.report.gather import Version
    from evotrainer.report.page import why_winner

    def v(n, depth, label, val):
        return Version(n, f"v{n}", ["v0"], "x", label, depth, "", val, {}, None, None, {}, "", [], "")
    data = T(versions=[v(1, 2, "kept", {"0": 0.70, "1": 0.64}), v(2, 3, "rejected", {"0": 0.9}),
                       v(3, 4, "kept", {"0": 0.60, "1": 0.62})])
    text = why_winner(data)
    assert "not the last version kept" in text and "v1@2 67.0%, v3@4 61.0%" in text and "v2" not in text
    assert "none" in why_winner(T(versions=[]))


def test_compare_pairs_seeds_and_gives_a_ci():
    ref = {100: {"val": 0.10, "test": 0.12}, 101: {"val": 0.20, "test": 0.18}, 102: {"val": 0.00, "test": 0.02}}
    evo = {100: {"val": 0.15, "test": 0.16}, 101: {"val": 0.26, "test": 0.22}, 102: {"val": 0.04, "test": 0.07}}
    c = compare(ref, evo)
    d = c["val"]["difference"]
    assert d["per_seed"] == [5.0, 6.0, 4.0] and d["mean"] == pytest.approx(5.0)
    # seed effects cancel (the spread of ref, 10 points, does not enter): a t interval over the
    # three paired differences, 2 degrees of freedom
    half = 4.302653 * 1.0 / math.sqrt(3)
    assert d["ci"] == pytest.approx([5.0 - half, 5.0 + half], abs=1e-4) and d["interval"] == "t"
    assert c["val"]["reference"]["sd"] == pytest.approx(10.0)
    text = table({"val": 0.05, "test": 0.04}, c, [100, 101, 102])
    assert "reference" in text and "10.0 ±" in text and "95% t interval, 2 df [+2.5, +7.5]" in text


def test_one_seed_has_no_spread():
    c = compare({1: {"val": 0.1, "test": 0.1}}, {1: {"val": 0.2, "test": 0.2}})
    assert math.isnan(c["test"]["evolved"]["sd"])
    assert "±" not in table({"val": 0.0, "test": 0.0}, c, [1]).splitlines()[3]


def test_verdict_reads_the_test_ci():
    ref = {s: {"val": 0.10, "test": 0.10} for s in (1, 2, 3)}
    better = compare(ref, {s: {"val": 0.15, "test": 0.12 + 0.001 * s} for s in (1, 2, 3)})
    assert verdict(better).startswith("verdict: the evolved harness beat the reference recipe by +2.2 test points, "
                                      "95% t interval, 2 df [+2.0, +2.4]")
    # the same mean with seeds 1 point apart: 2 degrees of freedom cannot show it above zero
    spread = compare(ref, {s: {"val": 0.15, "test": 0.11 + 0.01 * (s - 1)} for s in (1, 2, 3)})
    assert "no difference shown" in verdict(spread)
    assert table({"val": 0.0, "test": 0.0}, better, [1, 2, 3]).splitlines()[-1] == verdict(better)
    mixed = compare(ref, {1: {"val": 0.1, "test": 0.12}, 2: {"val": 0.1, "test": 0.08}, 3: {"val": 0.1, "test": 0.1}})
    assert "no difference shown" in verdict(mixed) and "contains zero" in verdict(mixed)
    worse = compare(ref, {s: {"val": 0.1, "test": 0.05} for s in (1, 2, 3)})
    assert "did worse" in verdict(worse)
