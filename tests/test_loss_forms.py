"""The recipe components of the last year's GRPO recipes, each against a hand computation on a
small tensor (its loss and its gradient), and each learning on the tiny policy."""
import math

import pytest
import torch

from helpers import DIGITS
from evotrainer.harness.knobs import Knobs
from evotrainer.harness.losses import cispo, clipped, gspo, tis_weights
from evotrainer.harness.signal import trained_rows
from evotrainer.trainer.distributed import World
from evotrainer.harness.signal import Signal
from evotrainer.policy.generate import Generation, concat_generations
from evotrainer.trainer.grpo import Round, Share, high_entropy_tokens, join_rounds
from test_slots import MASK, close, ratio_batch
from test_trainer import tiny_trainer


def test_two_sided_clipping_caps_the_ratio_of_a_negative_advantage_at_delta():
    # clip 0.2, delta 1.3; loss = max(-A min(r, 1.3), -A clip(r, .8, 1.2))
    # A = +2: as without delta (min(r, delta) A >= clip(r) A wherever r > 1.2): -1, -1.8, -2, -2.2, -2.4, -2.4
    # A = -.5: r = .5 -> max(.25, .4) = .4; .9 -> .45; 1 -> .5; 1.1 -> .55; 1.25 -> max(.625, .6) = .625;
    #          1.5 -> max(.5 x 1.3 = .65, .6) = .65 (unbounded without delta: .75)
    logp, old, adv = ratio_batch()
    loss = clipped(logp, old, adv, MASK, Knobs(clip_delta=1.3))
    close(loss, [[-1.0, -1.8, -2.0, -2.2, -2.4, -2.4], [0.4, 0.45, 0.5, 0.55, 0.625, 0.65]], atol=1e-9)
    # d/dlogp = -A r where the unclipped, uncapped term is the max; 0 at r = .5 (floor) and 1.5 (delta)
    loss.sum().backward()
    close(logp.grad, [[-1.0, -1.8, -2.0, -2.2, 0.0, 0.0], [0.0, 0.45, 0.5, 0.55, 0.625, 0.0]], atol=1e-9)


def test_gspo_clips_one_ratio_per_sequence_the_geometric_mean_of_its_tokens():
    # row 0: log-ratios .1, -.1, .3 (mean .1, s = e^.1); row 1: .2, .4 and a pad (mean .3, s = e^.3)
    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.tensor([[0.1, -0.1, 0.3], [0.2, 0.4, 9.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    s0, s1 = math.exp(0.1), math.exp(0.3)
    # clip .2: A = 1, s0 = 1.105 inside -> -s0 on every token; A = -2, s1 = 1.35 -> max(2 s1, 2 x 1.2) = 2 s1
    loss = gspo(logp, old, adv, mask, Knobs())
    close(loss, [[-s0] * 3, [2 * s1] * 3], atol=1e-9)
    # the token sum of row i is n_i x loss_i, and d s / d logp_t = s / n_i: every token of row 0 gets
    # -s0, the two real tokens of row 1 get 2 s1, the pad nothing
    (loss * mask).sum().backward()
    close(logp.grad, [[-s0] * 3, [2 * s1, 2 * s1, 0.0]], atol=1e-9)
    # the paper's tiny range (3e-4, 4e-4): both sequences are clipped, so no gradient at all
    logp.grad = None
    tight = gspo(logp, old, adv, mask, Knobs(clip_low=3e-4, clip_high=4e-4))
    close(tight, [[-1.0004] * 3, [2 * s1] * 3], atol=1e-9)  # A < 0 and s > 1: -A s is the max, unclipped
    (tight * mask).sum().backward()
    close(logp.grad, [[0.0] * 3, [2 * s1, 2 * s1, 0.0]], atol=1e-9)


def test_cispo_weights_every_token_by_its_clipped_stop_gradient_ratio():
    # w = min(r, 1 + clip_high) = .5, .9, 1, 1.1, 1.2, 1.2 (clip_high .2), never below: loss = -w A logp
    logp, old, adv = ratio_batch()
    w = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.2, 1.2], dtype=torch.float64)
    loss = cispo(logp, old, adv, MASK, Knobs())
    close(loss, torch.stack([-2.0 * w * logp[0].detach(), 0.5 * w * logp[1].detach()]), atol=1e-9)
    # the gradient is -w A on every token: clipped tokens keep theirs (PPO's clip zeroes r = 1.25, 1.5)
    loss.sum().backward()
    close(logp.grad, torch.stack([-2.0 * w, 0.5 * w]), atol=1e-9)


def test_tis_weights_are_the_truncated_stop_gradient_ratio_of_trainer_to_sampler():
    train = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    sampler = torch.tensor([[-1.5, -1.0, -0.5]])
    w = tis_weights(train, sampler, cap=1.5)
    close(w, [[1.5, math.exp(-1.0), 1.0]])  # e^.5 = 1.65 truncated at 1.5
    assert not w.requires_grad  # a weight on the loss, not a term of it


def test_mask_truncated_takes_cut_rows_out_of_the_loss_and_nothing_else():
    keep = torch.tensor([True, True, False, True])
    cut = torch.tensor([False, True, True, False])
    assert trained_rows(keep, cut, Knobs(mask_truncated=True)).tolist() == [True, False, False, True]
    assert trained_rows(keep, cut, Knobs()).tolist() == keep.tolist()


def test_high_entropy_tokens_keep_the_top_quantile_of_the_tokens_in_the_loss():
    ent = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 0.8]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # .8 is a pad: not in the pool, never kept
    # pool .1 .3 .5 .7 .9; its .6 quantile (linear) is .5 + .4 x (.7 - .5) = .58: .9 and .7 stay
    sel = high_entropy_tokens(ent, mask, 0.4, World())
    assert sel.tolist() == [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    assert high_entropy_tokens(ent, mask, 1.0, World()) is None


def test_a_harness_that_masks_truncated_rows_does_not_train_on_an_all_truncated_batch(tmp_path):
    # max_new_tokens 1: every completion of a 2-digit answer is cut at the budget
    on = tiny_trainer(tmp_path / "on", {"max_new_tokens": 1, "mask_truncated": True, "reward": "digit_share"},
                      {"reward.py": DIGITS})
    before = [p.detach().clone() for p in on.model.parameters()]
    m, recs = on.step()
    assert m.truncated == 1.0 and all(r.truncated for r in recs)
    assert all(torch.equal(a, b) for a, b in zip(before, on.model.parameters()))
    off = tiny_trainer(tmp_path / "off", {"max_new_tokens": 1, "reward": "digit_share"}, {"reward.py": DIGITS})
    off.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, off.model.parameters()))


def generation(prompts: list[list[int]], completions: list[list[int]], index: list[int]) -> Generation:
    ids = torch.tensor(completions)
    return Generation(torch.tensor(prompts), (torch.tensor(prompts) > 0).long(), torch.tensor(index), ids,
                      (ids > 0).long(), torch.zeros(len(ids), dtype=torch.bool), -ids.float(), ids.float() / 10)


def test_rounds_of_generations_join_into_one_batch_each_row_on_its_own_prompt():
    a = generation([[0, 5]], [[1, 2], [3, 0]], [0, 0])
    b = generation([[6, 7, 8], [0, 0, 9]], [[4, 4, 4], [5, 0, 0]], [1, 0])
    c = concat_generations([a, b], pad_id=0)
    assert c.prompt_ids.tolist() == [[0, 0, 5], [6, 7, 8], [0, 0, 9]]
    assert c.prompt_mask.tolist() == [[0, 0, 1], [1, 1, 1], [0, 0, 1]]
    assert c.prompt_index.tolist() == [0, 0, 2, 1]
    assert c.completion_ids.tolist() == [[1, 2, 0], [3, 0, 0], [4, 4, 4], [5, 0, 0]]
    assert c.lengths.tolist() == [2, 1, 3, 1] and c.logprobs[0].tolist() == [-1.0, -2.0, 0.0]
    assert concat_generations([a], pad_id=0) is a


def round_of(keep: list[bool], G: int = 2, mine: slice | None = None) -> Round:
    n = len(keep) * G
    share = Share(list(range(n)), [""] * n, *(torch.zeros(n) for _ in range(5)), [None] * n)
    sig = Signal(torch.arange(n).float(), torch.tensor(keep), torch.ones(n))
    return Round(share, sig, None, mine or slice(0, n), None)


def test_joined_rounds_train_the_first_groups_the_filter_kept_up_to_the_batch_size():
    rounds = [round_of([True, False, False]), round_of([False, True, True]), round_of([True, True, False])]
    b, sig, played, mine = join_rounds(rounds, target=3)
    assert sig.keep.tolist() == [True, False, False, False, True, True, False, False, False]
    assert len(b.rows) == 18 and sig.rewards.tolist() == [float(i % 6) for i in range(18)]
    assert mine.tolist() == list(range(18)) and played is None
    # under data parallelism a rank's rows are its slice of every round
    _, _, _, mine = join_rounds([round_of([True, False], mine=slice(2, 4))] * 2, target=2)
    assert mine.tolist() == [2, 3, 6, 7]


HALF = """
    import torch

    def every_other(rewards, scores):
        return torch.arange(rewards.shape[0]) % 2 == 0
"""


def test_dynamic_sampling_refills_the_step_to_the_batch_size_and_stops_at_its_cap(tmp_path):
    # half the groups pass: a second round fills the batch of 8 groups, and the third is never drawn
    tr = tiny_trainer(tmp_path / "half", {"group_filter": "every_other", "refill_rounds": 2},
                      {"group_filter.py": HALF})
    m, recs = tr.step()
    assert m.groups_sampled == 16 and m.kept_groups == 0.5 and len(recs) == 16 * 8
    assert sum(r.kept for r in recs) == 8 * 8
    # nothing passes: the cap stops it after 1 + 2 rounds, and nothing trains
    tr = tiny_trainer(tmp_path / "none", {"group_filter": "drop_all", "refill_rounds": 2},
                      {"group_filter.py": HALF + "\n    def drop_all(rewards, scores):\n"
                                                 "        return torch.zeros(rewards.shape[0], dtype=torch.bool)\n"})
    before = [p.detach().clone() for p in tr.model.parameters()]
    m, recs = tr.step()
    assert m.groups_sampled == 24 and m.kept_groups == 0 and not any(r.kept for r in recs)
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    # without refill a step samples its batch once, whatever the filter keeps
    m, _ = tiny_trainer(tmp_path / "off", {"group_filter": "every_other"}, {"group_filter.py": HALF}).step()
    assert m.groups_sampled == 8 and m.kept_groups == 0.5


def step_gradient(trainer) -> torch.Tensor:
    trainer.step()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters()])


def test_tis_corrects_a_sampler_that_differs_from_the_trainer_and_only_then(tmp_path):
    """Sampling with top_p < 1 draws from a distribution the loss's log-probs do not have (as a
    vLLM or bf16 sampler does): there the correction reweights the update; where sampler and
    trainer agree (fp32, no filter) every weight is 1 to rounding and the update is the same."""
    def grad(name, **knobs):  # unclipped: the gradient's size is part of what the weights change
        return step_gradient(tiny_trainer(tmp_path / name, {"reward": "digit_share", "max_grad_norm": 0, **knobs},
                                          {"reward.py": DIGITS}))
    plain, corrected = grad("plain"), grad("tis", tis_cap=2.0)
    assert plain.norm() > 0 and (plain - corrected).norm() / plain.norm() < 1e-4
    nucleus, nucleus_tis = grad("p", top_p=0.7), grad("p-tis", top_p=0.7, tis_cap=2.0)
    assert (nucleus - nucleus_tis).norm() / nucleus.norm() > 0.05


# digit_share paid only to completions that end within the budget: with truncated rows masked,
# what trains is the ended rows' positive advantage, so ending (and the reward) must rise
ENDED_DIGITS = """
    def ended_digits(r):
        share = [sum(c.isdigit() for c in t) / max(len(t), 1) for t in r.completions]
        return torch.tensor(share) * (~r.truncated).float()
"""


# a sparse reward: at the random init about 1 group in 10 has a rollout above the bar, so most
# groups are dead and dynamic sampling refills the step with live ones
MOSTLY_DIGITS = """
    def mostly_digits(r):
        share = torch.tensor([sum(c.isdigit() for c in t) / max(len(t), 1) for t in r.completions])
        return (share > 0.3).float()
"""


@pytest.mark.slow
@pytest.mark.parametrize("knobs", [
    {"policy_loss": "gspo", "num_iterations": 2, "clip_low": 3e-4, "clip_high": 4e-4},
    {"policy_loss": "cispo", "num_iterations": 2, "clip_high": 4.0},
    {"clip_delta": 3.0, "num_iterations": 2},
    {"mask_truncated": True, "reward": "ended_digits"},
    {"top_entropy_quantile": 0.2},
    {"tis_cap": 2.0, "top_p": 0.9},
    {"reward": "mostly_digits", "group_filter": "drop_dead", "refill_rounds": 3},
], ids=["gspo", "cispo", "two_sided_clip", "mask_truncated", "entropy_tokens", "tis", "dynamic_sampling"])
def test_each_component_learns_on_the_tiny_policy(tmp_path, knobs):
    tr = tiny_trainer(tmp_path, {"reward": "digit_share", "lr": 3e-3, **knobs},
                      {"reward.py": DIGITS + ENDED_DIGITS + MOSTLY_DIGITS})
    # measured over 20 steps (gspo; dynamic sampling and its control, 2 seeds each): from about 0.1
    # in the first 3 steps to above 0.9 by step 10, so 10 steps leave a wide margin over 0.2
    rewards = [tr.step()[0].reward_mean for _ in range(10)]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.2, (first, last)
