"""Slot functions against hand-computed numbers.

Every expected value below is written out literally and derived by hand in a comment;
none re-implements the formula under test.
"""
import random
import textwrap

import pytest
import torch

from evotrainer.errors import UsageError
from evotrainer.harness import Rollouts, load_harness
from evotrainer.harness.advantages import ADVANTAGES, dr_grpo, grpo, rloo
from evotrainer.harness.filters import GROUP_FILTERS, drop_dead, keep_all, score_spread
from evotrainer.harness.knobs import Knobs, knobs_from_dict, load_knobs
from evotrainer.harness.losses import (
    KL_ESTIMATORS, LOSS_AGGS, POLICY_LOSSES, clipped, k1, k2, k3, seq_mean_token_mean,
    seq_mean_token_sum, seq_mean_token_sum_norm, token_mean,
)
from evotrainer.harness.rewards import REWARDS, binary, partial_credit
from evotrainer.tasks.arith import ArithTask
from evotrainer.tasks.base import Problem


def close(actual, expected, atol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), f"\n{actual}\n!=\n{expected}"


# --------------------------------------------------------------------------- advantages

def test_grpo_normalises_by_unbiased_group_std():
    # group [1,0,0,1]: mean 0.5, deviations +-0.5, unbiased var = 4*0.25/3 = 1/3,
    #   std = 0.57735027; adv = +-0.5 / (0.57735027 + 1e-4) = +-0.5 / 0.57745027 = +-0.865875
    #   (a biased std of 0.5 would give +-0.9998 instead)
    # group [1,1,1,1]: all equal -> mean 1, deviations 0 -> adv 0 (dead group)
    adv = grpo(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    close(adv, [[0.865875, -0.865875, -0.865875, 0.865875], [0.0, 0.0, 0.0, 0.0]], atol=1e-5)


def test_grpo_one_correct_of_four():
    # [1,0,0,0]: mean 0.25, deviations 0.75, -0.25 x3; var = (0.5625 + 3*0.0625)/3 = 0.25,
    #   std 0.5; adv = 0.75/0.5001 = 1.4997001, -0.25/0.5001 = -0.4999000
    adv = grpo(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    close(adv, [[1.4997001, -0.4999000, -0.4999000, -0.4999000]], atol=1e-5)


def test_grpo_dead_groups_are_exactly_zero():
    adv = grpo(torch.tensor([[0.0, 0.0, 0.0], [0.3, 0.3, 0.3]]))
    assert torch.equal(adv, torch.zeros(2, 3))


def test_dr_grpo_subtracts_mean_without_std():
    # [1,0,0,0]: mean 0.25 -> [0.75, -0.25, -0.25, -0.25]
    # [2,0,1,1]: mean 1    -> [1, -1, 0, 0]   (grpo would divide by std 0.8165)
    adv = dr_grpo(torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 0.0, 1.0, 1.0]]))
    close(adv, [[0.75, -0.25, -0.25, -0.25], [1.0, -1.0, 0.0, 0.0]])


def test_rloo_uses_mean_of_the_others():
    # [1,0,0,0]: r0 = 1 - mean(0,0,0) = 1; r1..3 = 0 - mean(1,0,0) = -1/3
    # [3,1,2]:   3 - mean(1,2) = 1.5; 1 - mean(3,2) = -1.5; 2 - mean(3,1) = 0
    adv = rloo(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    close(adv, [[1.0, -1 / 3, -1 / 3, -1 / 3]])
    close(rloo(torch.tensor([[3.0, 1.0, 2.0]])), [[1.5, -1.5, 0.0]])
    # [1,1,1,1]: everybody equals the others' mean -> 0
    close(rloo(torch.tensor([[1.0, 1.0, 1.0, 1.0]])), [[0.0, 0.0, 0.0, 0.0]])


# --------------------------------------------------------------------------- policy loss

RATIOS = [0.5, 0.9, 1.0, 1.1, 1.25, 1.5]
MASK = torch.ones(2, 6, dtype=torch.float64)


def ratio_batch():
    """B=2 rollouts x T=6 tokens with the ratios above; advantages +2 and -0.5."""
    old = torch.full((2, 6), -1.0, dtype=torch.float64)
    logp = (old + torch.log(torch.tensor([RATIOS, RATIOS], dtype=torch.float64))).requires_grad_(True)
    adv = torch.tensor([2.0, -0.5], dtype=torch.float64)
    return logp, old, adv


def test_clipped_symmetric():
    # loss = max(-A r, -A clip(r, 0.8, 1.2))
    # A = +2: r = .5 -> max(-1.0, -1.6) = -1.0; .9 -> -1.8; 1 -> -2.0; 1.1 -> -2.2;
    #         1.25 -> max(-2.5, -2.4) = -2.4; 1.5 -> max(-3.0, -2.4) = -2.4   (capped at 1+0.2)
    # A = -.5: r = .5 -> max(0.25, 0.4) = 0.4 (floored at 1-0.2); .9 -> .45; 1 -> .5; 1.1 -> .55;
    #          1.25 -> max(.625, .6) = .625; 1.5 -> max(.75, .6) = .75
    logp, old, adv = ratio_batch()
    loss = clipped(logp, old, adv, MASK, Knobs(clip_low=0.2, clip_high=0.2))
    close(loss, [[-1.0, -1.8, -2.0, -2.2, -2.4, -2.4],
                 [0.4, 0.45, 0.5, 0.55, 0.625, 0.75]], atol=1e-9)


def test_clipped_clip_higher():
    # clip range [0.8, 1.28]: positive advantage is now capped at 1.28:
    # A = +2: 1.25 is inside -> -2.5; 1.5 -> max(-3.0, -2.56) = -2.56
    # A = -.5: unchanged from the symmetric case (only 1-clip_low bounds it)
    logp, old, adv = ratio_batch()
    loss = clipped(logp, old, adv, MASK, Knobs(clip_low=0.2, clip_high=0.28))
    close(loss, [[-1.0, -1.8, -2.0, -2.2, -2.5, -2.56],
                 [0.4, 0.45, 0.5, 0.55, 0.625, 0.75]], atol=1e-9)


def test_clipped_clip_low_only_bounds_negative_advantage():
    # clip range [0.6, 1.2]:
    # A = +2: identical to symmetric (r=.5 is never clipped from below with A > 0)
    # A = -.5: r = .5 -> max(.25, .5*.6 = .3) = .3; .9 -> .45 (inside now, no floor at .8)
    logp, old, adv = ratio_batch()
    loss = clipped(logp, old, adv, MASK, Knobs(clip_low=0.4, clip_high=0.2))
    close(loss, [[-1.0, -1.8, -2.0, -2.2, -2.4, -2.4],
                 [0.3, 0.45, 0.5, 0.55, 0.625, 0.75]], atol=1e-9)


@pytest.mark.parametrize("clip_high, grad_pos", [
    # d(-A r)/d logp = -A r where the unclipped surrogate is the max; 0 where the clipped one is
    # A = +2: r = .5,.9,1,1.1 unclipped -> -1.0,-1.8,-2.0,-2.2; 1.25 and 1.5 clipped at 1.2 -> 0
    (0.2, [-1.0, -1.8, -2.0, -2.2, 0.0, 0.0]),
    # clip-higher 0.28: 1.25 is back inside -> -2.5; 1.5 still clipped -> 0
    (0.28, [-1.0, -1.8, -2.0, -2.2, -2.5, 0.0]),
])
def test_clipped_gradient_is_zero_where_clip_is_active(clip_high, grad_pos):
    # A = -.5: r = .5 is clipped at .8 -> 0; others -A r = .45, .5, .55, .625, .75
    logp, old, adv = ratio_batch()
    clipped(logp, old, adv, MASK, Knobs(clip_low=0.2, clip_high=clip_high)).sum().backward()
    close(logp.grad, [grad_pos, [0.0, 0.45, 0.5, 0.55, 0.625, 0.75]], atol=1e-9)


def test_clipped_ratio_one_gives_minus_advantage():
    # on-policy (num_iterations=1): ratio 1 everywhere -> loss = -A per token
    logp = torch.tensor([[-0.3, -2.0], [-1.0, -0.1]])
    loss = clipped(logp, logp.clone(), torch.tensor([1.5, -0.25]), torch.ones(2, 2), Knobs())
    close(loss, [[-1.5, -1.5], [0.25, 0.25]])


# --------------------------------------------------------------------------- aggregation

# row 0: 3 live tokens [1,2,3]; row 1: 1 live token [4], the 100s are masked padding
AGG_LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
AGG_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize("fn, expected", [
    (token_mean, 2.5),                      # (1+2+3+4) / 4 tokens
    (seq_mean_token_mean, 3.0),             # mean(6/3, 4/1) = mean(2, 4)
    (seq_mean_token_sum, 5.0),              # mean(6, 4)
    (seq_mean_token_sum_norm, 10.0 / 6.0),  # (6+4) / (B*T = 2*3)
])
def test_loss_aggregation(fn, expected):
    out = fn(AGG_LOSS, AGG_MASK)
    assert out.shape == ()
    assert out.item() == pytest.approx(expected, abs=1e-6)


def test_token_mean_differs_from_seq_mean_on_ragged_lengths():
    assert token_mean(AGG_LOSS, AGG_MASK).item() != pytest.approx(seq_mean_token_mean(AGG_LOSS, AGG_MASK).item())
    # equal lengths: the two coincide: full mask over [[1,2,3],[4,5,6]] -> 21/6 = 3.5 both ways
    full = torch.ones(2, 3)
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert token_mean(loss, full).item() == pytest.approx(3.5)
    assert seq_mean_token_mean(loss, full).item() == pytest.approx(3.5)


def test_aggregation_accepts_bool_mask():
    assert token_mean(AGG_LOSS, AGG_MASK.bool()).item() == pytest.approx(2.5)
    assert seq_mean_token_mean(AGG_LOSS, AGG_MASK.bool()).item() == pytest.approx(3.0)


# --------------------------------------------------------------------------- KL

def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.0, -1.0, -1.5])
    # k1 = logp - ref = [0, -1, 1]   (a sample estimate: can be negative)
    close(k1(logp, ref), [0.0, -1.0, 1.0])
    # d = ref - logp = [0, 1, -1]; k3 = e^d - d - 1:
    #   d=0 -> 1 - 0 - 1 = 0; d=1 -> 2.7182818 - 2 = 0.7182818; d=-1 -> 0.3678794 + 1 - 1 = 0.3678794
    close(k3(logp, ref), [0.0, 0.7182818, 0.3678794], atol=1e-6)
    # k2 = 0.5 (logp - ref)^2 = 0.5 * [0, 1, 1]
    close(k2(logp, ref), [0.0, 0.5, 0.5])


def on_policy_gradient(estimator, theta, ref_logp):
    """E_{x ~ pi}[grad estimator(log pi(x), log ref(x))] over a categorical pi = softmax(theta),
    computed exactly: the sample's probability weighs it but is not differentiated, as when
    a sampled token's KL term is added to the loss."""
    theta = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    (grad,) = torch.autograd.grad((logp.exp().detach() * estimator(logp, ref_logp)).sum(), theta)
    return grad


def kl_gradient(theta, ref_logp, reverse: bool):
    """The analytic gradient of KL(pi || ref) (reverse=False) or KL(ref || pi), by autograd."""
    theta = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    kl = (logp.exp() * (logp - ref_logp)).sum() if not reverse else (ref_logp.exp() * (ref_logp - logp)).sum()
    (grad,) = torch.autograd.grad(kl, theta)
    return grad


def test_k2_as_a_loss_term_has_the_kl_gradient_and_k1_has_none():
    """On a 5-way categorical far from its reference: k2's expected gradient on-policy is the
    gradient of KL(pi || ref) itself, k1's is zero (so as a penalty it is noise: Knobs refuse it
    with kl_coef > 0), and k3's is the gradient of the other direction, KL(ref || pi)."""
    theta = torch.tensor([1.5, -0.3, 0.2, -2.0, 0.9], dtype=torch.float64)
    ref = torch.log_softmax(torch.tensor([-1.0, 0.4, 1.1, 0.3, -0.6], dtype=torch.float64), -1)
    target = kl_gradient(theta, ref, reverse=False)
    assert target.norm() > 0.5                        # a real pull towards the reference, not ~0
    close(on_policy_gradient(k2, theta, ref), target, atol=1e-12)
    close(on_policy_gradient(k1, theta, ref), torch.zeros(5), atol=1e-12)
    k3_grad = on_policy_gradient(k3, theta, ref)
    close(k3_grad, kl_gradient(theta, ref, reverse=True), atol=1e-12)
    assert (k3_grad - target).norm() > 0.1           # not the same gradient as k2's


def test_k3_zero_when_equal_and_never_negative():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(1000, generator=g) * 5
    ref = -torch.rand(1000, generator=g) * 5
    assert torch.equal(k3(logp, logp), torch.zeros(1000))
    assert (k3(logp, ref) >= 0).all()
    assert (k3(logp, ref) > 0).sum() > 990  # strictly positive off the diagonal


# --------------------------------------------------------------------------- group filters

def test_group_filters():
    rewards = torch.tensor([
        [1.0, 0.0, 0.0, 1.0],      # 0: mixed rewards, mixed scores
        [1.0, 1.0, 1.0, 1.0],      # 1: all solved: dead
        [0.5, 0.2, 0.5, 0.5],      # 2: shaped rewards vary, but every score is 0
        [0.0, 0.0, 0.0, 0.0],      # 3: all failed: dead
        [1.0, 1.0, 1.0, 1.0],      # 4: a hacked reward says "all good", scores disagree
        [0.5, 0.5, 0.5, 0.5001],   # 5: reward std 4.3e-5 < 1e-3 threshold: dead
    ])
    scores = torch.tensor([
        [1.0, 0.0, 0.0, 1.0],
        [1.0, 1.0, 1.0, 1.0],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
    ])
    assert keep_all(rewards, scores).tolist() == [True] * 6
    assert drop_dead(rewards, scores).tolist() == [True, False, True, False, False, False]
    assert score_spread(rewards, scores).tolist() == [True, False, False, False, True, False]
    for fn in (keep_all, drop_dead, score_spread):
        assert fn(rewards, scores).dtype == torch.bool


def test_std_filter_keeps_live_groups_until_warm_then_drops_the_low_spread_tail(tmp_path):
    from evotrainer.harness.filters import StdGroupFilter
    f = StdGroupFilter(z=1.0, decay=0.5, warmup=2)
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0]])          # std 0.5 live; std 0 dead
    assert f(r, r).tolist() == [True, False]            # warming up: live groups pass, dead never do
    # seen: 0.5 (first, mean 0.5, var 0), then 0.5 again: mean 0.5, var 0 -> threshold 0.5 - 1 * 0 = 0.5
    assert f(r, r).tolist() == [True, False] and f.seen == 2
    low = torch.tensor([[0.0, 0.2], [0.0, 1.0]])        # stds 0.1 and 0.5
    assert f(low, low).tolist() == [False, True]        # 0.1 < 0.5: the low-spread group goes
    fresh = f.fresh()
    assert fresh.seen == 0 and fresh(low, low).tolist() == [True, True]  # a new load starts warm-up again
    (tmp_path / "knobs.yaml").write_text("group_filter: std_ema\n")
    a, b = load_harness(tmp_path).group_filter, load_harness(tmp_path).group_filter
    assert isinstance(a, StdGroupFilter) and a is not b and a is not GROUP_FILTERS.get("std_ema")  # each load its own


# --------------------------------------------------------------------------- rewards

def arith_rollouts(completions):
    task = ArithTask()
    prob = Problem(id="123+459", prompt="123+459=", answer="285", level=3)  # 582 reversed
    n = len(completions)
    return Rollouts(
        problems=[prob] * n, completions=list(completions),
        scores=torch.tensor([task.score(prob, c) for c in completions]),
        lengths=torch.tensor([len(c) + 1 for c in completions]),
        truncated=torch.zeros(n, dtype=torch.bool), group_size=n, max_new_tokens=9,
    )


COMPLETIONS = ["285", "281", "28", "2850", "", "582"]


def test_binary_reward_is_the_score():
    r = arith_rollouts(COMPLETIONS)
    out = binary(r)
    close(out, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    out[0] = 5.0  # a harness editing its reward must not edit the verifier score
    assert r.scores[0].item() == 1.0


def test_partial_credit_reward():
    # answer "285":
    #   "285"  exact                              -> 1
    #   "281"  2 of 3 positions right             -> 2/3
    #   "28"   2 right / max(3, 2)                -> 2/3 (short answer)
    #   "2850" 3 right / max(3, 4): extra digit   -> 3/4 (long answer costs)
    #   ""     nothing                            -> 0
    #   "582"  unreversed: only the middle 8 hits -> 1/3
    close(partial_credit(arith_rollouts(COMPLETIONS)), [1.0, 2 / 3, 2 / 3, 0.75, 0.0, 1 / 3])


def test_overlong_penalty_is_zero_until_the_last_quarter_then_linear():
    # budget 9 tokens, cache = 9 // 4 = 2: lengths 7 and below pay 0; length 8 pays (8 - 7) / 2 = 0.5;
    # 9 pays 1. Completions of lengths 4, 5, 3, 5, 1, 4 (text + end token) all pay 0.
    r = arith_rollouts(COMPLETIONS)
    from evotrainer.harness.rewards import overlong_penalty
    close(overlong_penalty(r), [1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    r.lengths = torch.tensor([8, 9, 7, 9, 1, 4])
    close(overlong_penalty(r), [0.5, -1.0, 0.0, -1.0, 0.0, 0.0])


def test_partial_credit_on_generated_problems():
    task = ArithTask()
    probs = [task.generate(random.Random(s), 3) for s in range(4)]
    r = Rollouts(problems=probs, completions=[probs[0].answer, "", probs[2].answer + "7", "x" * 3],
                 scores=torch.tensor([1.0, 0.0, 0.0, 0.0]), lengths=torch.tensor([4, 1, 5, 4]),
                 truncated=torch.zeros(4, dtype=torch.bool), group_size=2, max_new_tokens=9)
    out = partial_credit(r)
    assert out[0].item() == 1.0 and out[1].item() == 0.0 and out[3].item() == 0.0
    # a correct answer plus one extra character: len(ans) hits out of len(ans)+1
    n = len(probs[2].answer)
    assert out[2].item() == pytest.approx(n / (n + 1))


# --------------------------------------------------------------------------- registry

@pytest.mark.parametrize("reg, name, valid", [
    (ADVANTAGES, "ppo", ["dr_grpo", "grpo", "rloo"]),
    (REWARDS, "nope", ["binary", "partial_credit"]),
    (GROUP_FILTERS, "nope", ["drop_dead", "keep_all", "score_spread"]),
    (LOSS_AGGS, "nope", ["seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "token_mean"]),
    (POLICY_LOSSES, "nope", ["clipped"]),
    (KL_ESTIMATORS, "k4", ["k1", "k2", "k3"]),
])
def test_unknown_slot_name_lists_valid_choices(reg, name, valid):
    with pytest.raises(UsageError) as e:
        reg.get(name)
    msg = str(e.value)
    assert f"'{name}'" in msg
    for v in valid:
        assert v in msg


def test_builtin_names_resolve_to_the_functions():
    assert ADVANTAGES.get("grpo") is grpo
    assert REWARDS.get("partial_credit") is partial_credit
    assert KL_ESTIMATORS.get("k3") is k3


CUSTOM_REWARD = """
    import torch
    from evotrainer.harness.rewards import binary   # imported, so not one of this file's names

    def length_bonus(r):
        return torch.tensor([float(len(c)) for c in r.completions])

    def _helper():
        return 0
"""


def test_harness_directory_supplies_its_own_reward(tmp_path):
    h1 = tmp_path / "h1"
    h1.mkdir()
    (h1 / "knobs.yaml").write_text("reward: length_bonus\nadvantage: rloo\n")
    (h1 / "reward.py").write_text(textwrap.dedent(CUSTOM_REWARD))
    h = load_harness(h1)
    assert h.knobs.reward == "length_bonus"
    close(h.reward(arith_rollouts(["285", "28", ""])), [3.0, 2.0, 0.0])
    assert h.advantage is rloo and h.loss_agg is token_mean  # built-ins still selectable
    # the harness's function did not leak into the built-in registry
    assert "length_bonus" not in REWARDS.names()
    with pytest.raises(UsageError):
        REWARDS.get("length_bonus")
    # a second harness without the file cannot name it, and is told what it can name
    h2 = tmp_path / "h2"
    h2.mkdir()
    (h2 / "knobs.yaml").write_text("reward: length_bonus\n")
    with pytest.raises(UsageError, match="length_bonus") as e:
        load_harness(h2)
    assert "binary" in str(e.value) and "partial_credit" in str(e.value)


def test_harness_private_and_imported_functions_are_not_names(tmp_path):
    d = tmp_path / "h"
    d.mkdir()
    (d / "reward.py").write_text(textwrap.dedent(CUSTOM_REWARD))
    (d / "knobs.yaml").write_text("reward: _helper\n")
    with pytest.raises(UsageError, match="unknown reward '_helper'") as e:
        load_harness(d)
    assert "length_bonus" in str(e.value)  # its own public function is offered
    # importing a built-in into the slot file does not register it twice
    (d / "knobs.yaml").write_text("reward: binary\n")
    assert load_harness(d).reward is binary


def test_load_harness_requires_knobs_yaml(tmp_path):
    with pytest.raises(UsageError, match="knobs.yaml"):
        load_harness(tmp_path)


def test_reference_harness_is_the_reference_recipe():
    h = load_harness()
    assert (h.reward, h.advantage, h.group_filter, h.policy_loss, h.loss_agg) == \
        (binary, grpo, keep_all, clipped, token_mean)
    assert h.knobs == Knobs()


# --------------------------------------------------------------------------- knobs

def test_knobs_reject_unknown_key_naming_it_and_the_valid_ones():
    with pytest.raises(UsageError) as e:
        knobs_from_dict({"learning_rate": 1e-3})
    msg = str(e.value)
    assert "'learning_rate'" in msg
    for k in ("lr", "group_size", "clip_high", "loss_agg", "kl_coef"):
        assert k in msg


@pytest.mark.parametrize("raw, fragment", [
    ({"lr": "fast"}, "lr"),
    ({"steps": -1}, "steps"),
    ({"group_size": 1}, "group_size"),
    ({"group_size": 2.5}, "group_size"),
    ({"steps": True}, "steps"),
    ({"lr": None}, "lr"),
    ({"lr": 0.0}, "lr"),
    ({"clip_low": 1.0}, "clip_low"),
    ({"temperature": 0}, "temperature"),
    ({"train_levels": 3}, "train_levels"),
    ({"train_levels": [1, "x"]}, "train_levels"),
    ({"reward": ["binary"]}, "reward"),
])
def test_knobs_reject_bad_values(raw, fragment):
    with pytest.raises(UsageError, match=fragment):
        knobs_from_dict(raw)


def test_knobs_accept_and_coerce_good_values():
    k = knobs_from_dict({"lr": 1, "group_size": 4.0, "train_levels": [2, 3], "clip_high": 0.28})
    assert k.lr == 1.0 and isinstance(k.lr, float)
    assert k.group_size == 4 and isinstance(k.group_size, int)
    assert k.train_levels == (2, 3)
    assert k.clip_high == 0.28 and k.clip_low == 0.2
    assert knobs_from_dict({}) == Knobs()
    with pytest.raises(UsageError, match="mapping"):
        knobs_from_dict(["lr", 1])


def test_load_knobs_yaml(tmp_path):
    f = tmp_path / "knobs.yaml"
    # PyYAML reads 1e-3 (no dot) as a string; the loader still makes it a float
    f.write_text("lr: 1e-3\nsteps: 10\ntrain_levels: [1, 2]\n")
    k = load_knobs(f)
    assert (k.lr, k.steps, k.train_levels) == (0.001, 10, (1, 2))
    f.write_text("")
    assert load_knobs(f) == Knobs()


def test_load_knobs_malformed_yaml(tmp_path):
    f = tmp_path / "knobs.yaml"
    f.write_text("lr: 3e-4\nsteps: [1, 2\ngroup_size: 8\n")
    with pytest.raises(UsageError, match="malformed YAML"):
        load_knobs(f)
    f.write_text("- lr\n- steps\n")
    with pytest.raises(UsageError, match="mapping"):
        load_knobs(f)
    f.write_text("group_sise: 8\n")
    with pytest.raises(UsageError, match="group_sise"):
        load_knobs(f)
