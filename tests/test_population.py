"""Selection, promotion and crossover on hand-made populations (pure functions)."""
import math

import pytest

from evotrainer.evolve.search.population import (
    Child,
    Elite,
    SelectionConfig,
    crossover_due,
    mates,
    merge,
    parent_scores,
    promote,
    roles,
    select_parent,
    usage,
)

CFG = SelectionConfig(capacity=3, replace_margin=0.01, near_tie=0.01)


def e(version, fitness, changes=(), surface="root", depth=1):
    return Elite(version, depth, fitness, frozenset(changes), surface)


def test_usage_credits_the_first_parent_fully_and_a_crossovers_second_by_half():
    kids = [Child(1, (("v0", 1),), 0.04), Child(2, (("v1", 2), ("v0", 1)), 0.02, crossover=True)]
    assert usage(kids) == {("v0", 1): (1.5, 0.05, 2), ("v1", 2): (1.0, 0.02, 2)}


def test_a_productive_parent_outscores_an_unproductive_one():
    a, b = e("a", 0.5), e("b", 0.5)
    kids = [Child(1, (a.key,), 0.05), Child(2, (b.key,), -0.03)]
    s = parent_scores([a, b], kids, trial=9, cfg=CFG)
    assert s[a.key] - s[b.key] == pytest.approx(0.08)
    assert select_parent([a, b], kids, 9, cfg=CFG) == a


def test_unexpanded_elites_get_the_exploration_bonus_and_recent_parents_a_penalty():
    fresh, used = e("fresh", 0.5), e("used", 0.5)
    kids = [Child(1, (used.key,), 0.0), Child(2, (used.key,), 0.0)]
    s = parent_scores([fresh, used], kids, trial=3, cfg=CFG)
    assert s[fresh.key] > s[used.key]
    # the same history long ago: no recency penalty, the gap is the exploration bonus alone
    late = parent_scores([fresh, used], kids, trial=30, cfg=CFG)
    assert s[fresh.key] - s[used.key] == pytest.approx(late[fresh.key] - late[used.key] + CFG.recency)


def test_novelty_and_coverage_favour_what_the_search_has_not_been_doing():
    same = e("same", 0.5, {"partial_credit"}, "reward")
    other = e("other", 0.5, {"clip_higher"}, "exploration")
    crowd = e("crowd", 0.5, {"partial_credit", "drop_dead"}, "reward")
    s = parent_scores([same, other, crowd], [], trial=1, cfg=CFG, recent_parents=[frozenset({"partial_credit"})])
    assert s[other.key] > s[same.key]           # novel, and alone on its surface
    assert select_parent([same, other, crowd], [], 1, cfg=CFG, recent_parents=[frozenset({"partial_credit"})]) == other


def test_ties_go_to_the_fitter_state():
    assert select_parent([e("a", 0.4), e("b", 0.6)], [], 1, cfg=CFG).version == "b"
    assert select_parent([], [], 1, cfg=CFG) is None


def test_promotion_fills_then_replaces_the_best_or_the_weakest():
    pop, how = [], None
    for name, fit in (("a", 0.50), ("b", 0.40), ("c", 0.30)):
        pop, how = promote(pop, e(name, fit), CFG)
        assert how == "fill"
    pop, how = promote(pop, e("d", 0.52), CFG)       # beats the best by more than the margin
    assert how == "replace_best" and {x.version for x in pop} == {"d", "b", "c"}
    pop, how = promote(pop, e("f", 0.35), CFG)       # beats only the weakest
    assert how == "replace_weakest" and {x.version for x in pop} == {"d", "b", "f"}
    pop2, how = promote(pop, e("g", 0.10), CFG)
    assert how == "rejected" and pop2 == pop


def test_a_near_tie_of_the_best_is_not_a_new_best():
    pop = [e("a", 0.50), e("b", 0.40), e("c", 0.30)]
    pop, how = promote(pop, e("d", 0.505), CFG)      # within the margin: it replaces the weakest only
    assert how == "replace_weakest" and {x.version for x in pop} == {"a", "b", "d"}


def test_a_diverse_near_tie_replaces_the_weakest_a_copy_does_not():
    pop = [e("a", 0.5, {"x"}), e("b", 0.4, {"x"}), e("c", 0.3, {"x"})]
    _, how = promote(pop, e("copy", 0.295, {"x"}), CFG)
    assert how == "rejected"
    pop, how = promote(pop, e("new", 0.295, {"y"}), CFG)
    assert how == "diverse" and {x.version for x in pop} == {"a", "b", "new"}


def test_promotion_keeps_one_entry_per_state():
    pop, _ = promote([e("a", 0.5)], e("a", 0.6), CFG)
    assert [(x.version, x.fitness) for x in pop] == [("a", 0.6)]


def test_roles_name_the_best_a_lean_near_tie_and_the_most_diverse():
    pop = roles([e("best", 0.50, {"p", "q"}), e("lean", 0.495, {"p"}), e("far", 0.30, {"z"}), e("m", 0.31, {"p", "q"})],
                CFG)
    assert {x.version: x.role for x in pop} == {"best": "best", "lean": "lean", "far": "diverse", "m": "member"}


def test_merge_takes_each_sides_change_and_names_conflicts():
    base = {"reward": "binary", "lr": 3e-4, "clip_high": 0.2}
    m = merge(base, {**base, "reward": "partial_credit"}, {**base, "clip_high": 0.28}, base_files={}, a_files={},
              b_files={})
    assert m.knobs == {"reward": "partial_credit", "clip_high": 0.28} and not m.conflicts
    m = merge(base, {**base, "lr": 1e-4}, {**base, "lr": 6e-4}, base_files={"r.py": "0"}, a_files={"r.py": "1"},
              b_files={"r.py": "2"})
    assert m.conflicts == ("knob lr: 0.0001 vs 0.0006", "file r.py")
    m = merge(base, {**base, "lr": 1e-4}, {**base, "lr": 1e-4}, base_files={}, a_files={"new.py": "x"}, b_files={})
    assert m.knobs == {"lr": 1e-4} and m.files == {"new.py": "x"} and not m.conflicts


@pytest.mark.parametrize("ops, due", [
    ([], False),
    (["mutation"] * 3, False),                            # too early to tell
    (["mutation"] * 4, True),                             # none in the last 4
    (["mutation"] * 4 + ["crossover"], False),            # a mutation follows a crossover
    (["mutation", "crossover", "mutation", "mutation"], False),
    (["crossover"] + ["mutation"] * 7, True),             # rate 1/8 < 25%
])
def test_crossover_is_due_when_none_happened_lately_but_never_twice_in_a_row(ops, due):
    assert crossover_due(ops) is due


def test_mates_are_elites_with_something_the_first_lacks():
    first = e("a", 0.5, {"p"})
    pop = [first, e("sub", 0.6, set()), e("same", 0.4, {"p"}), e("near", 0.3, {"p", "q"}), e("far", 0.2, {"r"})]
    assert [x.version for x in mates(pop, first)] == ["far", "near"]


def test_a_spent_parent_pays_the_exhausted_penalty():
    a, b = e("a", 0.5), e("b", 0.5)
    base = parent_scores([a, b], [], trial=9, cfg=CFG)
    # the agent had nothing left for a's harness at another depth
    s = parent_scores([a, b], [], trial=9, cfg=CFG, exhausted={"a"})
    assert s[b.key] == base[b.key] and base[a.key] - s[a.key] == pytest.approx(CFG.exhausted)
    # its last three children failed (no gain measured: never trained), one more than b's two
    kids = [Child(t, (a.key,), None, failed=True) for t in (1, 2, 3)] + \
           [Child(t, (b.key,), None, failed=True) for t in (4, 5)]
    s = parent_scores([a, b], kids, trial=30, cfg=CFG)
    explore = CFG.exploration * (math.sqrt(math.log(7) / 4) - math.sqrt(math.log(7) / 3))  # a: 3 children, b: 2
    assert s[a.key] - s[b.key] == pytest.approx(explore - CFG.exhausted)
    # a kept child ends the streak: no penalty
    s = parent_scores([a, b], kids + [Child(6, (a.key,), 0.0)], trial=30, cfg=CFG)
    assert s[a.key] - s[b.key] == pytest.approx(CFG.exploration * (math.sqrt(math.log(8) / 5)
                                                                   - math.sqrt(math.log(8) / 3)))


def test_temperature_zero_is_the_argmax_and_a_draw_repeats_for_its_seed():
    pop = [e("a", 0.50), e("b", 0.49), e("c", 0.48)]
    best = select_parent(pop, [], 1, cfg=CFG)
    assert best.version == "a" and select_parent(pop, [], 1, cfg=CFG, temperature=0.0, seed="x") == best
    draws = [select_parent(pop, [], 1, cfg=CFG, temperature=0.01, seed=f"parent 0 {n}").version for n in range(40)]
    assert draws == [select_parent(pop, [], 1, cfg=CFG, temperature=0.01, seed=f"parent 0 {n}").version
                     for n in range(40)]                    # a resume draws the same parents
    assert set(draws) == {"a", "b", "c"} and draws.count("a") > draws.count("c")
    cold = {select_parent(pop, [], 1, cfg=CFG, temperature=1e-4, seed=n).version for n in range(20)}
    assert cold == {"a"}                                    # cold: the argmax again


def test_lean_is_the_smallest_diff_from_the_reference_that_keeps_most_of_the_gain():
    best = e("best", 0.50, {"p", "q", "r"})
    most = e("most", 0.47, {"p", "q"})       # 85% of the best's 0.20 over the reference
    least = e("least", 0.45, {"p"})          # 75%: smaller, but gives up too much
    far = e("far", 0.31, {"z"})
    pop = roles([best, most, least, far], CFG, reference=0.30)
    assert {x.version: x.role for x in pop}["most"] == "lean"
    # 70% is enough for the smallest one
    pop = roles([best, most, least, far], SelectionConfig(capacity=4, lean_share=0.7), reference=0.30)
    assert {x.version: x.role for x in pop}["least"] == "lean"
    # no reference: only a near-tie of the best (within near_tie) is lean
    assert "lean" not in {x.role for x in roles([best, most, least, far], CFG)}


def test_a_pair_already_crossed_is_tried_after_every_fresh_mate():
    first = e("a", 0.5, {"p"})
    pop = [first, e("far", 0.2, {"r"}), e("near", 0.3, {"p", "q"})]
    assert [x.version for x in mates(pop, first)] == ["far", "near"]
    assert [x.version for x in mates(pop, first, {frozenset({"a", "far"}): 1})] == ["near", "far"]
