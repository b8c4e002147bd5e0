"""The evolving search controller: its policy, the rules that revise it on hand-made trial
histories, its lineage event and files, the config key, and the agents' use of its family
weights (pure functions; nothing trains here but the one slow run at the end)."""
import dataclasses
from types import SimpleNamespace

import pytest
import yaml
from helpers import agent_context

from evotrainer.agents import Escalation
from evotrainer.agents.rules import FAMILY_ORDER, candidates, draw, family_order, propose_random
from evotrainer.config import config_from_dict
from evotrainer.errors import UsageError
from evotrainer.evolve.search.policy import (
    COVER,
    FAMILIES,
    FRONTIER,
    TEMPERATURE,
    WEIGHT,
    ControllerPolicy,
    current,
    decide,
    revise,
    weights_now,
    write_files,
)
from evotrainer.lineage import LineageStore, TrialRecord
from evotrainer.lineage.events import ControllerRevised

ROOT = TrialRecord(0, "v0", [], "-", "root", 1, "", "-", "", "kept")


def rec(n, parent, intervention, label, gain=None, agent="rules"):
    return TrialRecord(n, f"v{n}", [parent], agent, intervention, 2, "", "-", "", label,
                       fitness={} if gain is None else {"gain": gain})


def test_nothing_is_revised_before_revise_every_trials():
    policy = ControllerPolicy()
    two = [ROOT, rec(1, "v0", "drop_dead", "discarded"), rec(2, "v0", "dr_grpo", "discarded")]
    assert revise(policy, two, {}) is None
    assert revise(policy, two + [rec(3, "v0", "clip_higher", "discarded")], {}) is not None
    # counted from the last revision: trials up to 3 were read already
    assert revise(policy, two + [rec(3, "v0", "clip_higher", "discarded"), rec(4, "v0", "seq_mean", "discarded")],
                  {}, since=3) is None
    # `equivalent` trials cost no budget and count for nothing
    same = [ROOT] + [rec(n, "v0", "drop_dead", "equivalent") for n in (1, 2, 3)]
    assert revise(policy, same, {}) is None


def test_a_family_that_gains_gets_more_weight_and_one_that_loses_less():
    trials = [ROOT, rec(1, "v0", "clip_higher", "discarded", 0.025), rec(2, "v0", "drop_dead", "discarded", -0.01),
              rec(3, "v0", "entropy_bonus", "discarded", 0.045), rec(4, "v0", "dr_grpo", "discarded", -0.02)]
    rev = revise(ControllerPolicy(), trials, {})
    w = rev.policy.family_weights
    assert w["exploration"] == 2.0       # +7 points over 2 + 1 trials: 2 ** (2.33 / 2) = 2.2, the cap
    assert w["group_filter"] == 0.84     # -1 point over 1 + 1: 2 ** (-0.5 / 2)
    assert w["signal"] == 0.71           # -2 points over 1 + 1: 2 ** (-1 / 2)
    assert w["reward"] == 1.0            # untried: the prior
    assert "weight exploration 1 -> 2" in rev.changes
    assert "exploration gained +2.3 points a trial (summed over n + 1), kept 0 of 2 (trials 1, 3)" in rev.reason
    assert {1, 2, 3, 4} <= set(rev.cites)
    # the rules agent now tries exploration changes before the fixed order's first families
    assert candidates(agent_context())[0].family != "exploration"
    assert candidates(agent_context(family_weights=w))[0].family == "exploration"


def test_a_keep_spends_what_its_family_gained_and_its_later_trials_count_from_there():
    """arith3-weak's evolving r0: one reward move gained +24 and was kept; weighed by that gain,
    the reward family was tried four times more from the new parent and lost every time."""
    trials = [ROOT, rec(1, "v0", "partial_credit", "discarded", 0.026),
              rec(2, "v0", "mix_score1_partial0p5", "kept", 0.24), rec(3, "v2", "raise_temperature", "discarded", -0.071)]
    plans = {2: SimpleNamespace(family="reward")}
    first = revise(ControllerPolicy(), trials, plans)
    assert first.policy.family_weights["reward"] == 1.0       # was 2 (+13.3 a trial over 2 + 1)
    assert first.policy.family_weights["exploration"] == 0.29
    # a weight that had risen before the keep returns to 1, and says why
    favoured = ControllerPolicy(family_weights={**ControllerPolicy().family_weights, "reward": 2.0})
    rev = revise(favoured, trials, plans)
    assert "weight reward 2 -> 1" in rev.changes
    assert "reward's gains were spent by its keep (trial 2): from 1 again" in rev.reason and 2 in rev.cites
    # the family's trials after its keep are its evidence from then on
    later = trials + [rec(4, "v2", "partial_credit", "discarded", -0.117), rec(5, "v2", "drop_dead", "discarded", 0.0),
                      rec(6, "v2", "larger_groups", "discarded", 0.0)]
    second = revise(first.policy, later, plans, since=3)
    assert second.policy.family_weights["reward"] == 0.25     # -11.7 over 1 + 1, at the floor
    assert "reward gained -5.9 points a trial since its keep (trial 2)" in second.reason


def test_from_the_first_revision_s_turn_each_untried_surface_gets_one_trial_at_the_coverage_weight():
    trials = [ROOT, rec(1, "v0", "partial_credit", "discarded", 0.026),
              rec(2, "v0", "mix_score1_partial0p5", "kept", 0.24), rec(3, "v2", "raise_temperature", "discarded", -0.071)]
    plans = {1: SimpleNamespace(intervention="partial_credit", family="reward"),
             2: SimpleNamespace(intervention="mix_score1_partial0p5", family="reward"),
             3: SimpleNamespace(intervention="raise_temperature", family="exploration")}
    policy = revise(ControllerPolicy(), trials, plans).policy
    assert weights_now(policy, trials[:3], plans) == policy.family_weights     # before the first revision: as fixed
    w = weights_now(policy, trials, plans)
    assert {f for f, x in w.items() if x == COVER} == {"group_filter", "signal", "curriculum", "optimisation",
                                                       "efficiency"}
    assert w["reward"] == 1.0 and w["exploration"] == 0.29 and w["reward_hacking"] == w["subtract"] == 1.0
    # the rules agent goes to the first untried surface, and says why it is there
    first = candidates(agent_context(family_weights=w))[0]
    assert first.family == "group_filter" and "(the search controller weighs group_filter 1.41)" in first.hypothesis
    # a family in flight is being tried; one whose only trial was `equivalent` was not
    plans[4] = SimpleNamespace(intervention="drop_dead", family="group_filter")
    plans[5] = SimpleNamespace(intervention="lower_lr", family="optimisation")
    done = trials + [rec(5, "v2", "lower_lr", "equivalent")]
    w = weights_now(policy, done, plans)
    assert w["group_filter"] == 1.0 and w["optimisation"] == COVER
    assert candidates(agent_context(family_weights=w))[0].family == "signal"
    # a surface that weighs more than the bonus keeps its weight
    rich = dataclasses.replace(policy, family_weights={**policy.family_weights, "signal": 2.0})
    assert weights_now(rich, trials, plans)["signal"] == 2.0
    # the revision's turn gives coverage even where it moved nothing
    flat = [ROOT, rec(1, "v0", "partial_credit", "kept", 0.05), rec(2, "v1", "drop_dead", "discarded", 0.0),
            rec(3, "v1", "raise_temperature", "discarded", 0.0)]
    assert revise(ControllerPolicy(), flat, {}) is None
    flat_plans = {t.id: SimpleNamespace(intervention=t.intervention, family="") for t in flat[1:]}
    assert weights_now(ControllerPolicy(), flat, flat_plans)["optimisation"] == COVER
    assert weights_now(ControllerPolicy(), flat[:3], flat_plans)["optimisation"] == 1.0


def test_where_nothing_is_kept_a_near_miss_outweighs_a_loss_and_a_gamed_score_counts_as_refused():
    """The vault3 search's first six trials: nothing cleared the gate, so a kept rate says
    nothing; the gains say reward changes lost points and the curriculum change nearly won."""
    trials = [ROOT, rec(1, "v0", "partial_credit", "discarded", -0.025),
              rec(2, "v0", "mix_score1_partial0p5", "discarded", -0.04),
              rec(3, "v0", "mix_score1_format0p2", "discarded", 0.008),
              rec(4, "v0", "easier_mix", "discarded", 0.014),
              rec(5, "v0", "raise_temperature", "invalid", 0.05),        # a blocking finding: its score was gamed
              rec(6, "v0", "drop_dead", "backtest_rejected")]            # refused before training
    plans = {n: SimpleNamespace(family="reward") for n in (2, 3)}  # the space's moves: their plans name the family
    w = revise(ControllerPolicy(), trials, plans).policy.family_weights
    assert w["reward"] == 0.61                               # -5.7 points over 3 + 1 trials
    assert w["curriculum"] == 1.27                           # +1.4 over 1 + 1: the near miss, above untried
    assert w["exploration"] == w["group_filter"] == 0.84     # refused or gamed: -1 point over 1 + 1
    assert w["optimisation"] == 1.0


def test_a_streak_of_failures_grows_the_frontier_and_the_temperature_within_bounds():
    policy, trials, since, seen = ControllerPolicy(), [ROOT], 0, []
    names = ["drop_dead", "dr_grpo", "clip_higher", "seq_mean", "entropy_bonus", "raise_lr"]
    for n in range(1, 61):
        trials.append(rec(n, "v0", names[n % len(names)], "discarded", -0.01))
        rev = revise(policy, trials, {}, since)
        if rev is not None:
            policy, since = rev.policy, n
            seen.append(rev)
    first = seen[0]
    assert first.changes[-3:] == ("temperature 0 -> 0.005", "frontier 4 -> 5", "merge near misses off -> on")
    assert "nothing kept in trials 1, 2, 3" in first.reason and first.cites == (1, 2, 3)
    assert policy.frontier == FRONTIER[1] and policy.temperature == TEMPERATURE[1]
    assert all(WEIGHT[0] <= policy.family_weights[f] <= WEIGHT[1] for f in FAMILIES)  # no family dies
    assert max(policy.family_weights.values()) == 1.0 and min(policy.family_weights.values()) < 1.0
    # bounded moves: never more than one elite or one temperature step per revision
    frontiers = [4] + [r.policy.frontier for r in seen]
    assert all(0 <= b - a <= 1 for a, b in zip(frontiers, frontiers[1:]))


def test_a_branch_that_keeps_improving_narrows_and_cools_the_search():
    hot = ControllerPolicy(frontier=5, temperature=0.01)
    trials = [ROOT, rec(1, "v0", "partial_credit", "kept", 0.05), rec(2, "v1", "drop_dead", "discarded"),
              rec(3, "v1", "clip_higher", "kept", 0.03)]
    rev = revise(hot, trials, {})
    assert (rev.policy.frontier, rev.policy.temperature) == (4, 0.005)
    assert "a branch keeps improving (kept trials 1, 3" in rev.reason
    # two kept trials on separate branches are not one branch improving
    apart = [ROOT, rec(1, "v0", "partial_credit", "kept", 0.05), rec(2, "v0", "drop_dead", "discarded"),
             rec(3, "v0", "clip_higher", "kept", 0.03)]
    assert (revise(hot, apart, {}).policy.frontier, revise(hot, apart, {}).policy.temperature) == (5, 0.01)
    # the floor holds
    low = ControllerPolicy(frontier=2, temperature=0.0, family_weights=revise(hot, trials, {}).policy.family_weights)
    assert revise(low, trials, {}) is None


def test_crossovers_and_subtractions_that_pay_are_done_more_and_sooner():
    cross = lambda n, label: TrialRecord(n, f"v{n}", ["v1", "v2"], "crossover", "crossover", 2, "", "-", "", label)  # noqa: E731
    trials = [ROOT, rec(1, "v0", "partial_credit", "kept", 0.05), rec(2, "v0", "drop_dead", "discarded"),
              rec(3, "v0", "clip_higher", "discarded"), rec(4, "v0", "seq_mean", "discarded"), cross(5, "kept"),
              rec(6, "v5", "revert_reward", "kept", 0.01), cross(7, "kept"), rec(8, "v7", "revert_lr", "kept", 0.01)]
    rev = revise(ControllerPolicy(), trials, {})
    assert rev.policy.crossover_min_rate == 0.38         # kept 2 of 2 (0.75) against 3 of 6 (0.5): 0.25 x 1.5
    assert rev.policy.revert_after == 2                  # subtractions kept 2 of 2
    assert "crossover min rate 0.25 -> 0.38" in rev.changes and "revert after 3 -> 2" in rev.changes
    assert {5, 6, 7, 8} <= set(rev.cites)


def test_a_revision_is_an_event_that_round_trips_and_the_policy_files_keep_each_one(tmp_path):
    trials = [ROOT] + [rec(n, "v0", "drop_dead", "discarded") for n in (1, 2, 3)]
    initial = ControllerPolicy(frontier=3)
    first = decide(initial, trials, {}, [])
    assert (first.revision, first.after) == (1, 3) and first.cites == [1, 2, 3]
    assert decide(current([first], initial), trials, {}, [first]) is None   # decided once: not due again
    store = LineageStore(tmp_path / "lineage.sqlite")
    store.append(first)
    (back,) = store.events(ControllerRevised)
    assert back == first and current([back], initial) == ControllerPolicy.from_json(first.policy)
    assert current([back], initial).frontier == 4 and current([], initial) == initial
    store.close()
    write_files(tmp_path / "controller", initial, [back])
    assert yaml.safe_load((tmp_path / "controller" / "policy-r0.yaml").read_text()) == initial.to_json()
    text = (tmp_path / "controller" / "policy.yaml").read_text()
    assert text == (tmp_path / "controller" / "policy-r1.yaml").read_text()
    assert text.startswith("# revision 1 after trial 3: ") and yaml.safe_load(text) == back.policy
    # a policy from a newer writer: its unknown keys are passed over, missing ones take the default
    assert ControllerPolicy.from_json({"frontier": 6, "mood": "bold"}) == ControllerPolicy(frontier=6)


def test_search_controller_is_fixed_by_default_and_a_bad_value_is_refused_naming_the_choices():
    assert config_from_dict({"task": "arith"}).validate().search.controller == "fixed"
    with pytest.raises(UsageError, match=r"'search.controller' must be one of fixed, evolving, got 'bogus'"):
        config_from_dict({"task": "arith", "search": {"controller": "bogus"}}).validate()
    with pytest.raises(UsageError, match=r"'search.revise_every' must be >= 1"):
        config_from_dict({"task": "arith", "search": {"revise_every": 0}}).validate()
    cfg = config_from_dict({"task": "arith", "search": {"population": 6, "revise_every": 2}}).validate()
    assert ControllerPolicy.initial(cfg.search) == ControllerPolicy(frontier=6, revise_every=2)


def test_family_weights_order_what_the_agents_try_and_findings_lead_among_equals():
    catalog_first = [(f, "catalog") for f in FAMILY_ORDER] + [(f, "space") for f in FAMILY_ORDER]
    assert family_order([], {}) == catalog_first                       # no weights: the fixed order
    assert family_order(["reward"], {})[:2] == [("reward", "catalog"), ("reward", "space")]
    heavy = {"exploration": 2.0, "reward": 0.25}
    order = family_order([], heavy)
    assert order[:2] == [("exploration", "catalog"), ("exploration", "space")]
    assert order[-2:] == [("reward", "catalog"), ("reward", "space")]
    middle = [f for f, kind in order[2:-2] if kind == "catalog"]
    assert middle == [f for f in FAMILY_ORDER if f not in heavy]      # equal weights keep their order
    finding = {"diagnostic": "dead_group_ratio", "severity": "critical", "value": 0.8, "thresholds": "",
               "suggest": "reward: give partial credit", "evidence": "80% of groups all wrong"}
    # the finding's family leads among equal weights ...
    assert candidates(agent_context([finding], family_weights={"exploration": 1.0}))[0].family == "reward"
    # ... and goes after every other family once the run has shown it loses points
    fams = [p.family for p in candidates(agent_context([finding], family_weights=heavy))]
    assert fams[0] == "exploration" and set(fams[fams.index("reward"):]) == {"reward"}


def test_the_spread_order_tries_every_family_once_before_any_twice_findings_leading_among_equals():
    finding = {"diagnostic": "dead_group_ratio", "severity": "critical", "value": 0.8, "thresholds": "",
               "suggest": "reward: give partial credit", "evidence": "80% of groups all wrong"}
    assert family_order(["reward"], {}, {}) == family_order(["reward"], {})  # nothing tried yet: as findings
    order = family_order(["reward"], {}, {"reward": 1, "signal": 2})
    firsts = [f for f, kind in order if kind == "catalog"]
    assert firsts[-2:] == ["reward", "signal"]                          # the least tried lead
    assert firsts[:-2] == [f for f in FAMILY_ORDER if f not in ("reward", "signal")]
    assert order[order.index(("reward", "catalog")) + 1] == ("reward", "space")  # a family's space after its catalog
    ctx = agent_context([finding], family_trials={"reward": 1})
    assert candidates(ctx)[0].family != "reward"                        # the finding's family waits its turn
    assert candidates(agent_context([finding], family_trials={}))[0].family == "reward"
    heavy = {"exploration": 2.0}                                        # an evolving controller's weights still rule
    assert candidates(agent_context([finding], family_weights=heavy, family_trials={"exploration": 3}))[0].family \
        == "exploration"
    assert config_from_dict({"task": "arith"}).validate().search.order == "findings"
    with pytest.raises(UsageError, match=r"'search.order' must be one of findings, spread, got 'wide'"):
        config_from_dict({"task": "arith", "search": {"order": "wide"}}).validate()


def test_an_escalation_does_not_leave_a_family_the_weights_favour():
    esc = Escalation(avoid=frozenset({"curriculum", "reward"}), subtract=False)
    weights = {"curriculum": 1.27, "reward": 0.61}
    fams = [p.family for p in candidates(agent_context(escalation=esc, family_weights=weights))]
    assert fams[0] == "curriculum" and "reward" not in fams      # a near miss is followed, a loss left
    assert "curriculum" not in [p.family for p in candidates(agent_context(escalation=esc))]


def test_the_random_agent_draws_by_family_weight_and_as_before_without_weights():
    ctx = agent_context(seed=7)
    cands = candidates(dataclasses.replace(ctx, findings=()))
    assert propose_random(ctx).intervention == draw(cands, {}, 7).intervention   # uniform: rng.choice as always
    only = {f: (1.0 if f == "exploration" else 1e-9) for f in FAMILIES}
    picks = {draw(cands, only, s).family for s in range(20)}
    assert picks == {"exploration"}
    assert draw(cands, only, 3) == draw(cands, only, 3)


def test_status_and_the_report_show_each_revision_with_the_trials_it_cites(tmp_path, capsys):
    from helpers import run_cli

    from evotrainer.evolve.status import status
    from evotrainer.report.gather import gather
    from evotrainer.report.page import render
    trials = [ROOT] + [rec(n, "v0", "drop_dead", "discarded") for n in (1, 2, 3)]
    revised = decide(ControllerPolicy(), trials, {}, [])
    run = tmp_path / "run"
    run.mkdir()
    store = LineageStore(run / "lineage.sqlite")
    for t in trials:  # as a run records them: a validation score each
        store.finish_trial(dataclasses.replace(t, fitness={"val": {0: 0.1}, "test": {0: 0.1}}))
    store.append(revised)
    store.close()
    (shown,) = status(run)["controller_revisions"]
    assert shown == {"revision": 1, "after": 3, "changes": revised.changes, "reason": revised.reason,
                     "cites": [1, 2, 3]}
    page = render(gather(run), engine="svg")
    assert '<table id="controller">' in page and "frontier 4 -&gt; 5" in page and "<td>1, 2, 3</td>" in page
    code, _, err = run_cli(capsys, "status", run)
    assert code == 0 and "controller r1 after trial 3: " in err and "cites trials 1, 2, 3" in err


@pytest.mark.slow
def test_an_evolving_controller_records_a_revision_citing_trials_in_a_tiny_run(tiny_run):
    """The loop itself: revise_every 1 and two trials, so the second trial's parent is chosen
    under a revised policy that cites the first trial; the report and status show it."""
    from evotrainer.evolve.controller import Controller
    from evotrainer.evolve.status import status
    from evotrainer.report.gather import gather
    from evotrainer.report.page import render
    cfg_path, run = tiny_run
    raw = yaml.safe_load(cfg_path.read_text()) | {"final_seeds": []}
    raw["search"] |= {"controller": "evolving", "revise_every": 1}
    Controller(config_from_dict(raw).validate(), run).run()
    store = LineageStore(run / "lineage.sqlite")
    (revised,) = store.events(ControllerRevised)
    assert [t.id for t in store.trials()] == [0, 1, 2]
    store.close()
    assert (revised.revision, revised.after, revised.cites) == (1, 1, [1]) and revised.changes and revised.reason
    assert yaml.safe_load((run / "controller" / "policy.yaml").read_text()) == revised.policy
    assert (run / "controller" / "policy-r0.yaml").exists()
    (shown,) = status(run)["controller_revisions"]
    assert shown["cites"] == [1] and shown["changes"] == revised.changes
    page = render(gather(run), engine="svg")
    assert "Search controller" in page and revised.reason.split(":")[0] in page


# ---------------------------------------------------------------------------- near-miss merges

def single(n, parent, intervention, family, label, gain, knobs=None, files=None, agent="rules"):
    """A finished trial and the plan it started with, from `parent` (v0 at depth 1)."""
    from evotrainer.lineage.plan import TrialPlan
    from evotrainer.lineage.state import State
    t = rec(n, "v0", intervention, label, gain)
    p = TrialPlan(parent=State(parent, 1, {0: "a", 1: "b"}, {0: 0.11, 1: 0.11}, {0: 0.1, 1: 0.1}),
                  version=f"v{n}", round=0, intervention=intervention, family=family, hypothesis="-", frozen=None,
                  success_criterion="-", rollback=None, knobs=knobs, files=files, agent=agent, trigger="none",
                  expected=None, usage=None)
    return t, p


def vault3_trials():
    """evolving-r0 of the vault3 suite (results/search-suite): every move discarded off v0."""
    return [single(1, "v0", "partial_credit", "reward", "discarded", -0.025, files={"reward.py": "a"}),
            single(2, "v0", "mix_score1_partial0p5", "reward", "discarded", -0.04, files={"reward.py": "b"}),
            single(3, "v0", "mix_score1_format0p2", "reward", "discarded", 0.008, files={"reward.py": "c"}),
            single(4, "v0", "larger_groups", "signal", "discarded", -0.011, {"group_size": 8, "prompts_per_step": 4}),
            single(5, "v0", "drop_dead", "group_filter", "discarded", -0.004, files={"group_filter.py": "d"}),
            single(6, "v0", "easier_mix", "curriculum", "discarded", 0.014, {"curriculum_mix": [0.5, 0.5]}),
            single(7, "v0", "raise_temperature", "exploration", "discarded", 0.016, {"temperature": 1.2}),
            single(8, "v0", "lower_lr", "optimisation", "discarded", 0.0205, {"lr": 1e-5})]


def test_near_misses_are_discarded_single_changes_whose_mean_gain_reached_the_minimum():
    from evotrainer.evolve.search.near_miss import best_pair, near_misses
    planned = vault3_trials() + [
        single(9, "v0", "clip_higher", "exploration", "invalid", 0.05, {"clip_high": 0.28}),      # gamed score
        single(10, "v3", "kl_anchor", "optimisation", "discarded", 0.03, {"kl_coef": 0.02}),       # another version
        single(11, "v0", "warmup", "optimisation", "discarded", 0.03),                            # changed nothing
        single(12, "v0", "lower_lr+easier_mix", "merge", "discarded", 0.03, {"lr": 1}, agent="merge"),
        single(13, "v0", "clip+kl", "optimisation", "discarded", 0.03, {"clip_high": 0.3})]     # a "+" in its name
    misses = near_misses(planned, "v0", 0.01)
    assert [m.trial for m in misses] == [8, 7, 6]     # best first; +0.8 (trial 3) fell short of the minimum
    assert [m.family for m in misses] == ["optimisation", "exploration", "curriculum"]
    a, b = best_pair(misses, set())
    assert (a.trial, b.trial) == (7, 8)                # the largest summed gain, in trial order
    assert [m.trial for m in best_pair(misses, {frozenset((7, 8))})] == [6, 8]
    assert best_pair(misses, {frozenset((7, 8)), frozenset((6, 8)), frozenset((6, 7))}) is None
    # two from one family, or two that set the same knob, never merge: their gains would not separate
    same = [single(1, "v0", "lower_lr", "optimisation", "discarded", 0.02, {"lr": 1e-5}),
            single(2, "v0", "kl_anchor", "optimisation", "discarded", 0.02, {"kl_coef": 0.02}),
            single(3, "v0", "raise_temperature", "exploration", "discarded", 0.02,
                   {"lr": 2e-5, "kl_coef": 0.05, "temperature": 1.2})]
    assert best_pair(near_misses(same, "v0", 0.01), set()) is None


def test_a_stall_turns_merging_on_and_the_merge_is_one_trial_from_the_parent_with_both_changes():
    from evotrainer.evolve.search import history
    from evotrainer.evolve.search.parents import merge_near_misses
    from evotrainer.evolve.search.view import RunView
    from evotrainer.lineage.events import TrialStarted
    planned = vault3_trials()
    trials = [ROOT] + [t for t, _ in planned]
    plans = {t.id: p for t, p in planned}
    rev = revise(ControllerPolicy(), trials[:4], plans)
    assert rev.policy.merge_near_misses and "merge near misses off -> on" in rev.changes
    assert rev.reason.endswith("a wider frontier and a hotter selection, and near misses merged")
    again = revise(rev.policy, trials[:7], plans, since=3)      # a second stall says nothing more of merging
    assert again.policy.merge_near_misses and "near misses" not in again.reason
    assert not ControllerPolicy.from_json({"frontier": 5}).merge_near_misses   # a policy stored before it: off

    view = RunView(tuple(trials), tuple(TrialStarted.of(t.id, p) for t, p in planned))
    parent = planned[0][1].parent
    assert merge_near_misses(view, 9, parent, 0.01, ControllerPolicy()) is None   # the fixed controller: never
    m = merge_near_misses(view, 9, parent, 0.01, rev.policy)
    assert (m.intervention, m.family, m.agent, m.merged) == ("raise_temperature+lower_lr", "merge", "merge", (7, 8))
    assert (m.parent, m.mate, m.version, m.knobs) == (parent, None, "v9", {"temperature": 1.2, "lr": 1e-5})
    assert "trial 7, +1.6 points" in m.hypothesis and "trial 8, +2.1" in m.hypothesis
    assert type(m).from_json(m.to_json()) == m                  # the lineage's record round-trips
    # once merged (its plan recorded), the pair is not merged again: the next best is
    merged = rec(9, "v0", m.intervention, "discarded", 0.012, agent=m.agent)
    view = RunView(view.trials + (merged,), view.events + (TrialStarted.of(9, m),))
    assert merge_near_misses(view, 10, parent, 0.01, rev.policy).merged == (6, 8)
    assert history.changes([ROOT, merged])["v9"] == {"raise_temperature", "lower_lr"}
    named = rec(10, "v0", "clip+kl", "discarded")  # an agent's own name with a "+": one change
    assert history.changes([ROOT, named])["v10"] == {"clip+kl"}
    assert history.family(m.intervention, m.family) == "merge"
