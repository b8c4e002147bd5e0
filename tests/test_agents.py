"""The rules agent and its catalog on hand-made findings and knobs."""
from dataclasses import replace

import pytest
import yaml

from helpers import agent_context as ctx
from evotrainer.agents import INTERVENTIONS, Escalation, propose, propose_random, set_knob
from evotrainer.agents.rules import candidates, family_of, space_moves
from evotrainer.agents.space import Parent, space
from evotrainer.skills import SkillLibrary
from evotrainer.harness import REFERENCE
from evotrainer.harness.knobs import Knobs, knobs_from_dict, load_knobs

REF = load_knobs(REFERENCE / "knobs.yaml")
DEAD = {"diagnostic": "dead_group_ratio", "severity": "critical", "evidence": "dead_group_ratio = 0.957 (last window)",
        "suggest": "reward: make the reward more continuous (partial credit), most groups share one score"}


HACK = {"diagnostic": "reward_score_divergence", "severity": "critical", "evidence": "reward_score_divergence = 0.18",
        "suggest": "reward hacking: simplify the reward back towards the verifier score"}


def test_family_of_a_suggestion():
    assert family_of(DEAD["suggest"]) == "reward" and family_of(HACK["suggest"]) == "reward_hacking"
    assert family_of("no family here") is None


def test_dead_groups_get_partial_credit_with_the_evidence_in_the_hypothesis():
    p = propose(ctx([DEAD]))
    assert p.intervention == "partial_credit" and p.knobs == {"reward": "partial_credit"}
    assert p.hypothesis.startswith("changing reward from binary to partial_credit")
    assert "dead_group_ratio = 0.957" in p.hypothesis and p.rollback == "revert reward to binary"
    assert p.frozen and p.success_criterion and p.trigger == "dead_group_ratio:critical"


def test_tried_ideas_are_skipped_and_the_agent_moves_to_the_next_family():
    # the finding's family goes on with the search space's moves after the catalog's
    assert propose(ctx([DEAD], tried={"partial_credit"})).intervention == "mix_score1_partial0p5"
    reward = {p.intervention for p in candidates(ctx([DEAD])) if p.family == "reward"}
    p = propose(ctx([DEAD], tried=reward))
    assert p.intervention == "drop_dead"  # reward spent: the fixed order's next family


def test_a_hack_is_answered_by_subtracting():
    shaped = Knobs(reward="partial_credit")
    assert propose(ctx([HACK, DEAD], shaped)).intervention == "binary_reward"


def test_every_proposal_is_one_legal_knob_change_and_the_catalog_runs_dry():
    tried, k = set(), REF
    while (p := propose(ctx([], k, tried))) is not None:
        # one variable: one knob, or the group size at equal rollouts per step
        assert len(p.knobs) == 1 or set(p.knobs) == {"group_size", "prompts_per_step"}
        assert p.knobs["group_size"] * p.knobs["prompts_per_step"] == REF.group_size * REF.prompts_per_step \
            if "group_size" in p.knobs else True
        knobs_from_dict({**yaml.safe_load((REFERENCE / "knobs.yaml").read_text()), **p.knobs})  # valid knob values
        tried.add(p.intervention)
    # the reference already pays the verifier score, trains on one level and by token mean, keeps
    # every group (nothing to refill), samples without a filter and updates once per batch
    # (every ratio 1: the ratio-shaped losses are its own, and no clip bound is reached)
    conditional = {"dynamic_sampling", "token_level", "tis", "gspo", "cispo", "two_sided_clip", "clip_higher"}
    assert tried & set(INTERVENTIONS.names()) == set(INTERVENTIONS.names()) - {"binary_reward", "frontier_curriculum"} - conditional
    assert tried - set(INTERVENTIONS.names()) == {p.intervention for p in space_moves(ctx([]))}  # then the space's


def test_set_knob_keeps_comments_and_order():
    text = "# recipe\nreward: binary\nlr: 3.0e-4  # tuned\n"
    assert set_knob(text, "reward", "partial_credit") == "# recipe\nreward: partial_credit\nlr: 3.0e-4  # tuned\n"
    assert set_knob(text, "train_levels", [2, 3]).endswith("train_levels: [2, 3]\n")
    assert yaml.safe_load(set_knob(text, "lr", 1.5e-4))["lr"] == 1.5e-4


def test_the_skill_library_reorders_the_rules_by_what_the_same_finding_led_to(tmp_path):
    lib = SkillLibrary(tmp_path / "skills.sqlite")
    assert propose(ctx([DEAD], skills=lib.skills())).intervention == "partial_credit"  # no evidence: the rules
    for trial, (name, label, gain) in enumerate([("partial_credit", "discarded", -0.02),
                                                 ("partial_credit", "invalid", 0.01),
                                                 ("raise_temperature", "kept", 0.04)]):
        lib.record(run="r", trial=trial, task="arith", trigger="dead_group_ratio:critical", intervention=name,
                   family="x", patch={}, expected="", label=label, gain=gain)
    p = propose(ctx([DEAD], skills=lib.skills(), task="arith"))
    assert p.intervention == "raise_temperature"     # held before on this signature
    # the measured loser goes last, not out: with everything else tried it is still proposed
    others = (set(INTERVENTIONS.names()) | {p.intervention for p in candidates(ctx([DEAD]))}) - {"partial_credit"}
    assert propose(ctx([DEAD], tried=others - {"drop_dead"}, skills=lib.skills(), task="arith")).intervention \
        == "drop_dead"
    assert propose(ctx([DEAD], tried=others, skills=lib.skills(), task="arith")).intervention == "partial_credit"
    # on another task of arith's family nothing; on another family arith's evidence is far: what
    # held moves up a little, the failure back a little, and the rules' first pick stays first
    assert propose(ctx([DEAD], skills=lib.skills(), task="rg:chain_sum")).intervention == "partial_credit"
    # a skill learned on another finding does not steer this one
    other = {**DEAD, "diagnostic": "entropy_collapse"}
    assert propose(ctx([other], skills=lib.skills())).intervention == "partial_credit"


def test_escalation_subtracts_first_then_switches_layer():
    shaped = Knobs(reward="partial_credit", clip_high=0.28)
    p = propose(ctx([DEAD], shaped, escalation=Escalation(avoid=frozenset({"reward"}))))
    assert p.family == "subtract" and p.intervention in ("revert_reward", "revert_clip_high")
    assert p.knobs in ({"reward": "binary"}, {"clip_high": 0.2})
    spent = {"revert_reward", "revert_clip_high"}
    p = propose(ctx([DEAD], shaped, tried=spent, escalation=Escalation(avoid=frozenset({"reward"}))))
    assert p.family != "reward"                       # the layer that failed is left
    assert p.intervention == "lower_lr"               # for the learning rate, where a sweep starts
    weighed = propose(ctx([DEAD], shaped, tried=spent, escalation=Escalation(avoid=frozenset({"reward"})),
                          family_weights={"curriculum": 2.0}))
    assert weighed.family == "curriculum"             # unless the controller weighs another family more
    ignored = Escalation(avoid=frozenset(), ignore=frozenset({"dead_group_ratio"}), subtract=False)
    assert propose(ctx([DEAD], tried={"partial_credit"}, escalation=ignored)).trigger == "none"


def test_random_agent_draws_any_applicable_untried_intervention_by_seed():
    drawn = {propose_random(ctx([DEAD], seed=s)).intervention for s in range(40)}
    assert len(drawn) > 5 and "binary_reward" not in drawn
    assert propose_random(ctx([], seed=3)) == propose_random(ctx([], seed=3))
    assert propose_random(ctx([], seed=3)).agent == "random"


def finding(name: str, value: float) -> dict:
    """A critical finding of a built-in diagnostic, with the suggestion that diagnostic makes."""
    import evotrainer.diagnostics.library  # noqa: F401  (registers the built-ins)
    from evotrainer.diagnostics.spec import DIAGNOSTICS
    spec = DIAGNOSTICS.get(name)
    suggest = spec.suggest({}) if callable(spec.suggest) else spec.suggest
    return {"diagnostic": name, "severity": "critical", "evidence": f"{name} = {value}", "suggest": suggest}


@pytest.mark.parametrize("name, parent, proposed", [
    ("entropy_drop", {"num_iterations": 2}, ["clip_higher", "entropy_tokens"]),
    ("entropy_drop", {}, ["entropy_tokens"]),    # one update per batch: no clip bound is reached
    ("truncation_rate", {"reward": "partial_credit"}, ["mask_truncated"]),  # shaping is one reward at a time
    ("truncation_rate", {}, ["overlong_shaping", "mask_truncated"]),
    ("dead_group_ratio", {"group_filter": "drop_dead"}, ["dynamic_sampling", "score_spread"]),
    ("length_drift", {"loss_agg": "seq_mean_token_mean"}, ["token_level", "dr_grpo"]),
])
def test_a_finding_leads_to_the_recipe_components_its_diagnostic_names(name, parent, proposed):
    """What the diagnostic sees (entropy falling, completions cut, groups dead, length without
    accuracy) is answered by the components it names, in the order it names them."""
    k, tried = replace(REF, **parent), set()
    for expected in proposed:
        p = propose(ctx([finding(name, 0.9)], k, tried))
        assert p.intervention == expected and f"{name} = 0.9" in p.hypothesis, (expected, p.intervention)
        tried.add(p.intervention)


def test_the_ratio_and_sampler_components_apply_only_where_they_change_the_update():
    on_policy, reused = REF, replace(REF, num_iterations=2)
    for name in ("gspo", "cispo", "two_sided_clip"):
        assert INTERVENTIONS.get(name)(on_policy, 3) is None and INTERVENTIONS.get(name)(reused, 3) is not None
    assert INTERVENTIONS.get("tis")(REF, 3) is None and INTERVENTIONS.get("tis")(replace(REF, top_p=0.9), 3).knobs == {"tis_cap": 2.0}
    assert INTERVENTIONS.get("dynamic_sampling")(REF, 3) is None  # keep_all drops nothing, so nothing refills
    assert INTERVENTIONS.get("dynamic_sampling")(replace(REF, group_filter="score_spread"), 3).knobs == {"refill_rounds": 3}
    # the search space's swaps of the loss form wait for the same condition
    swaps = lambda k: {p.intervention for p in space(Parent(k, 3)) if p.intervention.startswith("policy_loss_")}  # noqa: E731
    assert swaps(on_policy) == set() and swaps(reused) >= {"policy_loss_gspo", "policy_loss_cispo"}
