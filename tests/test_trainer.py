import pytest
import torch

from helpers import DIGITS, write_harness
from evotrainer.catalog import get_task
from evotrainer.harness import load_harness
from evotrainer.trainer.grpo import GRPOTrainer
from evotrainer.harness.rollouts import SlotError
from evotrainer.policy import build_model, build_tokenizer


def tiny_trainer(tmp_path, knobs, files=None, seed=0):
    tok = build_tokenizer()
    model = build_model(len(tok), seed=seed)
    h = load_harness(write_harness(tmp_path / "h", files, **{"prompts_per_step": 8, "group_size": 8, **knobs}))
    return GRPOTrainer(model, tok, get_task("arith", 1), h, seed=seed)


@pytest.mark.slow
def test_short_run_raises_mean_reward(tmp_path):
    tr = tiny_trainer(tmp_path, {"reward": "digit_share", "lr": 3e-3}, {"reward.py": DIGITS})
    rewards = [tr.step()[0].reward_mean for _ in range(40)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, (first, last)


def test_evidence_has_one_record_per_rollout_with_consistent_fields(tmp_path):
    tr = tiny_trainer(tmp_path, {})
    m, recs = tr.step()
    assert len(recs) == 8 * 8
    assert [r.group_id for r in recs] == [i // 8 for i in range(64)]
    for r in recs:
        assert r.step == 1 and r.score in (0.0, 1.0) and r.reward == r.score  # binary reward
        assert 1 <= r.length <= tr.T
        assert r.truncated <= (r.length == tr.T)  # truncated rollouts used the whole budget
        assert r.mean_logprob <= 0 and r.entropy >= 0
    # one group's rollouts share a prompt
    assert len({r.prompt_id for r in recs[:8]}) == 1
    assert m.reward_mean == pytest.approx(sum(r.reward for r in recs) / 64)
    assert m.dead_groups == pytest.approx(
        sum(len({r.reward for r in recs[g * 8:(g + 1) * 8]}) == 1 for g in range(8)) / 8)


def test_kl_entropy_and_multiple_iterations_paths_train(tmp_path):
    tr = tiny_trainer(tmp_path, {"reward": "digit_share", "lr": 3e-3, "kl_coef": 0.1, "entropy_coef": 0.01,
                                 "num_iterations": 2, "clip_high": 0.28, "loss_agg": "seq_mean_token_mean",
                                 "advantage": "dr_grpo"}, {"reward.py": DIGITS})
    kls = [tr.step()[0].kl for _ in range(6)]
    assert all(k >= 0 for k in kls)
    assert kls[-1] > 0  # the policy moved away from the frozen reference


def test_filter_that_drops_everything_skips_the_optimizer_step(tmp_path):
    files = {"group_filter.py": """
        import torch

        def drop_all(rewards, scores):
            return torch.zeros(rewards.shape[0], dtype=torch.bool)
    """}
    tr = tiny_trainer(tmp_path, {"group_filter": "drop_all"}, files)
    before = [p.detach().clone() for p in tr.model.parameters()]
    m, recs = tr.step()
    assert m.kept_groups == 0 and not any(r.kept for r in recs)
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


@pytest.mark.parametrize("body, msg", [
    ("def bad(r):\n    return torch.zeros(3)\n", "shape"),
    ("def bad(r):\n    return torch.full((len(r.completions),), float('nan'))\n", "non-finite"),
    ("def bad(r):\n    return [0.0] * len(r.completions)\n", "expected a tensor"),
])
def test_broken_reward_raises_a_named_slot_error(tmp_path, body, msg):
    tr = tiny_trainer(tmp_path, {"reward": "bad"}, {"reward.py": "import torch\n" + body})
    with pytest.raises(SlotError, match=msg):
        tr.step()


CLIPPED_COPY = """
    import torch

    def clipped_copy(logp, old_logp, adv, mask, k):
        ratio = torch.exp(logp - old_logp)
        a = adv.unsqueeze(-1)
        return torch.maximum(-a * ratio, -a * ratio.clamp(1 - k.clip_low, 1 + k.clip_high))
"""


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_skipping_zero_advantage_rows_gives_the_same_update_as_the_full_batch(tmp_path, agg):
    # the built-in `clipped` lets the trainer skip rows with zero advantage; a harness copy of the
    # same function does not, so both must end with the same weights
    knobs = {"reward": "digit_share", "lr": 3e-3, "loss_agg": agg, "advantage": "dr_grpo"}
    # digit_share rounded to 0/1 makes many groups dead, so there are rows to skip
    files = {"reward.py": DIGITS.replace("/ max(len(t), 1)", "/ max(len(t), 1) > 0.3")}
    fast = tiny_trainer(tmp_path / "a", knobs, files)
    slow = tiny_trainer(tmp_path / "b", {**knobs, "policy_loss": "clipped_copy"},
                        {**files, "policy_loss.py": CLIPPED_COPY})
    _, recs = fast.step()
    slow.step()
    assert sum(r.advantage == 0 for r in recs) > 0
    # one step from the same weights: the gradients agree up to float reduction order
    # (gradients, not weights: Adam's first update is blind to the gradient's scale)
    g_fast = torch.cat([p.grad.flatten() for p in fast.model.parameters()])
    g_slow = torch.cat([p.grad.flatten() for p in slow.model.parameters()])
    assert g_fast.norm() > 0
    assert (g_fast - g_slow).norm() / g_fast.norm() < 1e-4


def test_resumed_optimizer_continues_adams_moments_and_steps_under_its_own_knobs(tmp_path):
    a = tiny_trainer(tmp_path, {"reward": "digit_share", "lr": 1e-3}, {"reward.py": DIGITS})
    for _ in range(3):
        a.step()
    state = a.optimizer_state()
    assert state["steps"] == 3
    h = load_harness(write_harness(tmp_path / "child", {"reward.py": DIGITS}, prompts_per_step=8, group_size=8,
                                   reward="digit_share", lr=5e-4, adam_beta2=0.99, warmup_steps=4))
    b = GRPOTrainer(a.model, a.tok, get_task("arith", 1), h, seed=1)
    b.resume_optimizer(state)
    p = next(a.model.parameters())
    assert a.opt.state[p]["exp_avg"].abs().sum() > 0
    assert torch.equal(b.opt.state[p]["exp_avg"], a.opt.state[p]["exp_avg"])  # the moments carry over
    assert int(b.opt.state[p]["step"]) == 3                                   # and Adam's bias correction
    group = b.opt.param_groups[0]                                              # the knobs are the child's
    assert group["betas"] == (h.knobs.adam_beta1, 0.99) and group["weight_decay"] == h.knobs.weight_decay
    m, _ = b.step()
    assert m.lr == 5e-4  # warm-up counts the 3 steps before: step 4 of 4 is at full rate, not 1/4
    assert b.optimizer_state()["steps"] == 4


def test_a_schedule_of_segments_carries_the_optimizer_from_one_to_the_next(tmp_path, ckpt):
    from evotrainer.trainer.jobs import OPTIMIZER_FILE, train_schedule
    assert not (ckpt / OPTIMIZER_FILE).exists()  # the base starts a fresh AdamW
    h = load_harness(write_harness(tmp_path / "h", prompts_per_step=2, group_size=2))
    train_schedule("arith", 1, [str(h.path)] * 2, str(ckpt), str(tmp_path / "out"), seeds=[1, 2], steps=2)
    for d, steps in ((1, 2), (2, 4)):
        state = torch.load(tmp_path / "out" / f"segment-{d}" / "checkpoint" / OPTIMIZER_FILE, weights_only=True)
        assert state["steps"] == steps
        assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {steps}
