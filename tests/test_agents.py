"""The rules agent and its catalog on hand-made findings and knobs."""
import yaml

from evotrainer.agents import CATALOG, propose, set_knob
from evotrainer.agents.rules import family_of
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
    p = propose([DEAD], REF, 3)
    assert p.intervention == "partial_credit" and p.knobs == {"reward": "partial_credit"}
    assert p.hypothesis.startswith("changing reward from binary to partial_credit")
    assert "dead_group_ratio = 0.957" in p.hypothesis and p.rollback == "revert reward to binary"
    assert p.frozen and p.success_criterion


def test_tried_ideas_are_skipped_and_the_agent_moves_to_the_next_family():
    p = propose([DEAD], REF, 3, tried={"partial_credit"})
    assert p.intervention == "drop_dead"  # reward spent: the fixed order's next family


def test_a_hack_is_answered_by_subtracting():
    shaped = Knobs(reward="partial_credit")
    assert propose([HACK, DEAD], shaped, 3).intervention == "binary_reward"


def test_every_proposal_is_one_legal_knob_change_and_the_catalog_runs_dry():
    tried, k = set(), REF
    while (p := propose([], k, 3, tried)) is not None:
        assert len(p.knobs) == 1
        knobs_from_dict({**yaml.safe_load((REFERENCE / "knobs.yaml").read_text()), **p.knobs})  # valid knob values
        tried.add(p.intervention)
    assert tried == set(CATALOG.names()) - {"binary_reward"}  # the reference already pays the verifier score


def test_set_knob_keeps_comments_and_order():
    text = "# recipe\nreward: binary\nlr: 3.0e-4  # tuned\n"
    assert set_knob(text, "reward", "partial_credit") == "# recipe\nreward: partial_credit\nlr: 3.0e-4  # tuned\n"
    assert set_knob(text, "train_levels", [2, 3]).endswith("train_levels: [2, 3]\n")
    assert yaml.safe_load(set_knob(text, "lr", 1.5e-4))["lr"] == 1.5e-4
