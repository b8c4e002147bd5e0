"""The search space beside the catalog (agents/space.py): one variable a move, values in their
ranges, seeded resamples, the registries' implementations, composed rewards that pass the
legality check and compute their weighted sum; and the agents that propose from it."""
import shutil
from dataclasses import replace

import pytest
import torch

from helpers import agent_context as ctx
from evotrainer.agents import INTERVENTIONS, propose, propose_random, set_knob
from evotrainer.agents.rules import FAMILY_ORDER, candidates, space_moves
from evotrainer.agents.space import (COMPOSED, RANGES, Parent, RewardSpec, Term, composed, render, space)
from evotrainer.harness import REFERENCE
from evotrainer.harness.advantages import ADVANTAGES
from evotrainer.harness.knobs import Knobs, knobs_from_dict, load_knobs
from evotrainer.harness.legality import check_harness
from evotrainer.harness.load import load_harness
from evotrainer.harness.losses import LOSS_AGGS
from evotrainer.harness.rollouts import Rollouts
from evotrainer.tasks.base import Problem

REF = load_knobs(REFERENCE / "knobs.yaml")
# every coefficient on, two levels and two updates per batch, so every kind of move applies
ON = replace(REF, kl_coef=0.01, entropy_coef=0.005, warmup_steps=20, weight_decay=0.01, train_levels=(2, 3),
             num_iterations=2)
DEAD = {"diagnostic": "dead_group_ratio", "severity": "critical", "evidence": "dead_group_ratio = 0.957",
        "suggest": "reward: make the reward more continuous (partial credit), most groups share one score"}


def moves(knobs=REF, files=None, seed=0) -> dict:
    return {p.intervention: p for p in space(Parent(knobs, 3, files or {}, seed))}


def child(tmp_path, p, parent=REFERENCE):
    """The parent's harness with the proposal applied, as the controller's _candidate does."""
    d = shutil.copytree(parent, tmp_path / "child")
    text = (d / "knobs.yaml").read_text()
    for key, value in p.knobs.items():
        text = set_knob(text, key, value)
    (d / "knobs.yaml").write_text(text)
    for name, source in p.files.items():
        (d / name).write_text(source)
    return d


@pytest.mark.parametrize("knobs", [REF, ON], ids=["reference", "all-on"])
def test_every_move_changes_one_variable_to_a_valid_value_in_its_range(knobs):
    ms = moves(knobs)
    assert len(ms) > 30
    for name, p in ms.items():
        assert set(p.knobs) == {"group_size", "prompts_per_step"} or len(p.knobs) == 1, name
        assert set(p.files) <= {"reward.py"} and (not p.files or set(p.knobs) == {"reward"}), name
        knob, value = next(iter(p.knobs.items()))
        assert value != getattr(knobs, knob), name                      # it changes something
        if knob in RANGES:
            assert RANGES[knob].lo <= value <= RANGES[knob].hi, name
        replace(knobs, **p.knobs).validate()
        assert p.family in FAMILY_ORDER and p.hypothesis.startswith(f"changing {knob} from ")
        assert p.frozen and p.success_criterion and p.rollback.startswith("revert ")
    # the run's budget never moves; the group size only with prompts per step, at equal rollouts
    assert not {"steps", "prompts_per_step", "num_iterations", "max_new_tokens"} & {k for p in ms.values()
                                                                                     for k in p.knobs if len(p.knobs) == 1}
    g = ms["group_size_x0.5"].knobs
    assert g["group_size"] * g["prompts_per_step"] == knobs.group_size * knobs.prompts_per_step
    assert not set(ms) & set(INTERVENTIONS.names())                          # its own names


def test_perturbation_math_clamps_and_never_reverses():
    ms = moves(REF)
    assert ms["lr_x0.8"].knobs == {"lr": 2.4e-4} and ms["lr_x1.25"].knobs == {"lr": 3.75e-4}
    assert ms["temperature_x0.8"].knobs == {"temperature": 0.8}
    assert moves(ON)["clip_low_x1.25"].knobs == {"clip_low": 0.25}
    assert "top_p_x1.25" not in ms                                      # at its range's top: no move
    assert moves(replace(REF, temperature=1.4))["temperature_x1.25"].knobs == {"temperature": 1.5}  # clamped
    high = moves(replace(REF, lr=2e-3))                                 # a parent above the range
    assert high["lr_x0.8"].knobs == {"lr": 1e-3} and "lr_x1.25" not in high
    assert moves(ON)["warmup_steps_x1.25"].knobs == {"warmup_steps": 25}  # integers stay integers


def test_a_coefficient_at_zero_is_switched_on_at_its_low_end_not_perturbed():
    ms = moves(REF)
    for knob in ("kl_coef", "weight_decay", "entropy_coef", "warmup_steps"):
        assert f"{knob}_x0.8" not in ms and f"{knob}_x1.25" not in ms
        assert ms[f"{knob}_on"].knobs == {knob: RANGES[knob].lo}
    assert moves(replace(REF, max_grad_norm=0.0))["max_grad_norm_on"].knobs == {"max_grad_norm": 1.0}
    assert not {n for n in moves(ON) if n.endswith("_on")}             # nothing off, nothing to switch on


def test_a_resample_is_deterministic_for_a_seed_and_differs_across_seeds():
    draws = [{k: moves(ON, seed=s)[f"{k}_resample"].knobs[k] for k in RANGES} for s in (1, 1, 2)]
    assert draws[0] == draws[1] and draws[0] != draws[2]
    assert all(draws[0][k] != draws[2][k] for k in ("lr", "temperature", "kl_coef"))
    lrs = [moves(REF, seed=s)["lr_resample"].knobs["lr"] for s in range(200)]
    assert all(1e-7 <= x <= 1e-3 for x in lrs)
    assert sum(x < 1e-5 for x in lrs) > 50                              # log scale: decades, not the top one


def test_a_clip_bound_moves_only_where_the_parent_reuses_its_batch():
    """With one update per sampled batch every ratio is 1: no clip bound is ever reached, and a
    clip move would train a noise replica of its parent (a trial spent on nothing)."""
    on_policy, reused = moves(REF), moves(replace(REF, num_iterations=2))
    clips = {"clip_low_x0.8", "clip_low_x1.25", "clip_high_x0.8", "clip_high_x1.25", "clip_low_resample",
             "clip_high_resample"}
    assert not clips & set(on_policy) and clips <= set(reused)
    assert "clip_higher" not in {p.intervention for p in candidates(ctx([], REF))}
    assert "clip_higher" in {p.intervention for p in candidates(ctx([], replace(REF, num_iterations=2)))}


def test_structural_moves_list_the_registries_implementations():
    ms = moves(REF)
    assert {n for n in ms if n.startswith("advantage_")} == {f"advantage_{a}" for a in ADVANTAGES.names()} - {"advantage_grpo"}
    assert {n for n in ms if n.startswith("loss_agg_")} == \
        {f"loss_agg_{a}" for a in LOSS_AGGS.names()} - {"loss_agg_token_mean"}
    # the KL estimator only where there is a KL term (k1 with kl_coef > 0 is refused); the
    # curriculum only with two levels to weigh
    assert not any(n.startswith(("kl_estimator_", "curriculum_")) for n in ms)
    on = moves(ON)
    assert {n for n in on if n.startswith("kl_estimator_")} == {"kl_estimator_k2"}
    assert "curriculum_frontier" in on
    # a harness's own implementation is a choice too (read from its file, not run)
    own = moves(REF, {"reward.py": 'import torch\n\ndef digit_share(r):\n    """Share of digits."""\n'
                                   '    return r.scores\n\ndef _helper(r):\n    return 0\n'})
    assert own["reward_digit_share"].knobs == {"reward": "digit_share"} and "reward__helper" not in own


def rollouts() -> Rollouts:
    prob = Problem(id="123+459", prompt="123+459=", answer="285", level=3)
    comps = ["285", "281", "", "28x", "2850"]
    return Rollouts(problems=[prob] * 5, completions=comps, scores=torch.tensor([1.0, 0, 0, 0, 0]),
                    lengths=torch.tensor([4, 4, 1, 4, 9]), truncated=torch.tensor([False, False, False, False, True]),
                    group_size=5, max_new_tokens=9)


@pytest.mark.parametrize("spec, expected", [
    # score + 0.5 x share of answer positions right: 285 exact, 281 2/3, "" 0, 28x 2/3, 2850 3/4
    (COMPOSED[0][0], [1 + 0.5, 0.5 * 2 / 3, 0.0, 0.5 * 2 / 3, 0.5 * 0.75]),
    # score + 0.2 x well formed: empty, a letter the answer never uses and a cut-off completion are not
    (COMPOSED[1][0], [1 + 0.2, 0.2, 0.0, 0.0, 0.0]),
    # score - 0.1 x share of the 9-token budget
    (COMPOSED[2][0], [1 - 0.1 * 4 / 9, -0.1 * 4 / 9, -0.1 / 9, -0.1 * 4 / 9, -0.1]),
], ids=["partial", "format", "length"])
def test_a_composed_reward_passes_the_legality_check_and_computes_its_weighted_sum(tmp_path, spec, expected):
    p = moves(REF)[spec.name]
    assert p.knobs == {"reward": spec.name} and set(p.files) == {"reward.py"}
    d = child(tmp_path, p)
    verdict = check_harness(d, REFERENCE)
    assert verdict.legal, verdict.reasons
    out = load_harness(d).reward(rollouts())
    assert out.shape == (5,) and torch.allclose(out, torch.tensor(expected), atol=1e-6)
    assert composed(p.files["reward.py"]) == {spec.name: spec}          # the spec reads back from the file


def test_a_composed_reward_is_reweighed_and_appended_to_the_harness_own_rewards(tmp_path):
    parent = child(tmp_path / "p", moves(REF)["mix_score1_partial0p5"])
    own = "import torch\n\n\ndef digit_share(r):\n    return r.scores\n"
    (parent / "reward.py").write_text(own + "\n\n" + (parent / "reward.py").read_text())
    files = {"reward.py": (parent / "reward.py").read_text()}
    ms = moves(load_knobs(parent / "knobs.yaml"), files)
    down, up = ms["partial_weight_x0.8"], ms["partial_weight_x1.25"]
    assert down.knobs == {"reward": "mix_score1_partial0p4"} and up.knobs == {"reward": "mix_score1_partial0p625"}
    assert down.files["reward.py"].startswith(files["reward.py"])       # nothing of the parent's is lost
    d = child(tmp_path / "c", down, parent)
    assert check_harness(d, parent).legal
    assert set(composed(down.files["reward.py"])) == {"mix_score1_partial0p5", "mix_score1_partial0p4"}
    assert torch.allclose(load_harness(d).reward(rollouts()), torch.tensor([1.4, 0.4 * 2 / 3, 0, 0.4 * 2 / 3, 0.3]))
    # back to a sum the file already holds is the knob alone; a hand-edited sum is not reweighed
    assert moves(load_knobs(d / "knobs.yaml"), down.files)["partial_weight_x1.25"].files == {}
    edited = files["reward.py"].replace("0.5 * partial", "0.7 * partial")
    assert "partial_weight_x0.8" not in moves(load_knobs(parent / "knobs.yaml"), {"reward.py": edited})


def test_render_writes_negative_weights_as_a_difference():
    src = render(RewardSpec((Term("score", 1.0), Term("length", -0.1))))
    assert "return 1.0 * score - 0.1 * length" in src and src.startswith("def mix_score1_lengthm0p1(r):")


def test_the_space_leaves_out_what_the_catalog_names_even_once_tried():
    names = {p.intervention for p in space_moves(ctx([]))}
    # the catalog's entropy_bonus (0 -> 0.001), warmup (0 -> 10), partial_credit, drop_dead, dr_grpo
    assert not {"entropy_coef_on", "warmup_steps_on", "reward_partial_credit", "group_filter_drop_dead",
                "advantage_dr_grpo"} & names
    tried = {p.intervention for p in candidates(ctx([], tried={"entropy_bonus"}))}
    assert "entropy_coef_on" not in tried and "kl_coef_on" in tried


def test_the_rules_agent_leads_with_the_catalog_then_the_space_within_the_finding_family(tmp_path):
    c = ctx([DEAD], tmp_path=tmp_path)                                   # the parent's files on disk
    cands = candidates(c)
    names = [p.intervention for p in cands]
    assert propose(c).intervention == "partial_credit"
    # the finding's family: the catalog's move, then the space's composed rewards
    assert names[:3] == ["partial_credit", "mix_score1_partial0p5", "mix_score1_format0p2"]
    assert cands[1].files["reward.py"] and cands[1].trigger == "dead_group_ratio:critical"
    # then every other family's catalog moves, and only then the space's
    in_catalog = [n in INTERVENTIONS.names() for n in names[3:]]
    assert in_catalog == sorted(in_catalog, reverse=True) and any(in_catalog) and not all(in_catalog)
    assert len(names) == len(set(names))                                 # finite, each move once


def test_the_random_agent_reaches_the_space_with_its_seed():
    drawn = {propose_random(ctx([DEAD], seed=s)).intervention for s in range(40)}
    assert drawn - set(INTERVENTIONS.names()) and drawn & set(INTERVENTIONS.names())
    assert propose_random(ctx([], seed=5)) == propose_random(ctx([], seed=5))
    p = propose_random(ctx([], seed=5))
    knobs_from_dict({**Knobs().to_dict(), **p.knobs})
