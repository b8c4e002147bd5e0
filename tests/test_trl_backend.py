"""The TRL backend: the same harness means the same thing as in the embedded trainer."""
import json

import pytest
import torch
import yaml

from helpers import write_harness
from evotrainer.catalog import get_task
from evotrainer.errors import UsageError
from evotrainer.harness import load_harness
from evotrainer.trainer.backends import check_backend
from evotrainer.trainer.grpo import GRPOTrainer
from evotrainer.trainer.segment import SegmentLog
from evotrainer.policy import load_policy
from evotrainer.policy.prompts import prompt_token_ids
from evotrainer.runtime import Runtime

trl = pytest.importorskip("trl")


@pytest.mark.parametrize("knobs, slot", [
    ({"kl_coef": 0.1, "kl_estimator": "k2"}, "kl_estimator 'k2'"),
    ({"loss_agg": "seq_mean_token_sum"}, "loss_agg 'seq_mean_token_sum' has no TRL loss_type"),
    ({"policy_loss": "mine"}, "policy_loss 'mine'"),
    ({"entropy_coef": 0.01, "loss_agg": "seq_mean_token_mean"}, "entropy_coef"),
    ({"policy_loss": "cispo", "loss_agg": "seq_mean_token_mean"}, "policy_loss 'cispo' under loss_agg"),
    ({"tis_cap": 2.0}, "tis_cap > 0 without use_vllm"),
    ({"refill_rounds": 2, "group_filter": "drop_dead"}, "refill_rounds 2: TRL samples one batch a step"),
    ({"top_entropy_quantile": 0.2, "entropy_coef": 0.01}, "top_entropy_quantile < 1 with entropy_coef"),
])
def test_what_trl_cannot_express_is_refused_in_one_line_naming_the_slot(tmp_path, knobs, slot):
    files = {"policy_loss.py": "def mine(logp, old_logp, adv, mask, k):\n    return -adv[:, None] * logp\n"}
    h = load_harness(write_harness(tmp_path / "h", files, **knobs))
    check_backend(Runtime("embedded"), h.knobs)  # the embedded trainer takes anything
    with pytest.raises(UsageError) as e:
        check_backend(Runtime("trl"), h.knobs)
    msg = str(e.value)
    assert slot in msg and "\n" not in msg and ("backend: embedded" in msg or "kl_coef: 0" in msg)


def test_an_entropy_bonus_under_micro_batches_is_refused_naming_both(tmp_path):
    """TRL's entropy bonus is a token mean per micro-batch, ours one over the batch: they agree
    only when the batch is one micro-batch (4 x 4 = 16 rollouts here)."""
    knobs = load_harness(write_harness(tmp_path / "h", entropy_coef=0.01)).knobs
    for micro in (0, 16):
        check_backend(Runtime("trl", micro_batch_size=micro), knobs)
    check_backend(Runtime("embedded", micro_batch_size=4), knobs)          # ours accumulates exactly
    check_backend(Runtime("trl", micro_batch_size=4), load_harness(write_harness(tmp_path / "plain")).knobs)
    with pytest.raises(UsageError) as e:
        check_backend(Runtime("trl", micro_batch_size=4), knobs)
    assert str(e.value) == (
        "backend trl cannot train the harness: entropy_coef > 0 with micro_batch_size 4 (of a batch of 16 "
        "rollouts): TRL averages its entropy bonus per micro-batch, ours over the whole batch; use "
        "micro_batch_size: 0, entropy_coef: 0, or backend: embedded")


def replay_generation(trainer, completions):
    """Make a TRL trainer 'sample' the given completion ids (each with its end token, if any)."""
    def fake(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        trainer.seen_prompt_ids = prompt_ids
        return [list(c) for c in completions], None
    trainer._generate_single_turn = fake


def embedded_step(tiny_qwen, task, h, seed=3):
    """One embedded step; returns the model, the evidence, and the batch it sampled."""
    model, tok = load_policy(tiny_qwen)
    emb = GRPOTrainer(model, tok, task, h, seed=seed)
    sampled = {}
    sample = emb.sample
    emb.sample = lambda: sampled.setdefault("x", sample())
    _, records = emb.step()
    rows, gen, _, _ = sampled["x"]
    return model, records, rows, gen


def trl_replay(tmp_path, tiny_qwen, task, h, gen, seed=3):
    """One TRL step from the same initial weights, made to sample exactly `gen`'s completions;
    returns the model, the evidence and what TRL's scoring handed its loss."""
    from evotrainer.trainer import trl_backend
    from evotrainer.trainer.trl_backend import run_trl
    completions = [ids[:n] for ids, n in zip(gen.completion_ids.tolist(), gen.lengths.tolist())]
    model, tok = load_policy(tiny_qwen)
    captured = {}
    init = trl_backend.HarnessGRPOTrainer.__init__

    def patched_init(self, *a, **kw):
        init(self, *a, **kw)
        replay_generation(self, completions)
        score = self._generate_and_score_completions
        self._generate_and_score_completions = lambda inputs: captured.setdefault("out", score(inputs))
    trl_backend.HarnessGRPOTrainer.__init__ = patched_init
    try:
        out = tmp_path / "trl"
        out.mkdir()
        log = SegmentLog(out, 1, 0)
        run_trl(model, tok, task, h, seed=seed, steps=1, log=log, optimizer_state=None, runtime=Runtime("trl"))
        log.close()
    finally:
        trl_backend.HarnessGRPOTrainer.__init__ = init
    records = [json.loads(line) for line in (out / "evidence.jsonl").read_text().splitlines()]
    return model, records, captured["out"]


def distance(a, b) -> float:
    return float(max((x - y).abs().max() for x, y in zip(a.parameters(), b.parameters())))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_same_completions_give_identical_rewards_advantages_and_evidence_in_both_backends(tmp_path, tiny_qwen, agg):
    task = get_task("arith", 2)
    # a graded reward and a filter that drops the groups whose rewards are all equal
    h = load_harness(write_harness(tmp_path / "h", reward="partial_credit", group_filter="drop_dead", loss_agg=agg))
    model, emb_records, rows, gen = embedded_step(tiny_qwen, task, h)
    model2, trl_records, o = trl_replay(tmp_path, tiny_qwen, task, h, gen)

    assert [r.prompt_id for r in emb_records] == [r["prompt_id"] for r in trl_records]  # the same prompts
    for e, t in zip(emb_records, trl_records):
        for key in ("completion", "score", "reward", "advantage", "kept", "length", "truncated"):
            assert getattr(e, key) == t[key], key
        # the sampling policy's log-probs and entropies: the same weights, computed by two code paths
        assert t["mean_logprob"] == pytest.approx(e.mean_logprob, abs=1e-4)
        assert t["entropy"] == pytest.approx(e.entropy, abs=1e-4)
    kept = torch.tensor([r.kept for r in emb_records])
    assert 0 < kept.sum() < len(kept), "the test needs both kept and dropped groups"
    # TRL was handed our prompt encoding (the chat template) and our advantages, dropped rows masked out
    assert o["prompt_ids"].shape[0] == len(rows)
    ids = prompt_token_ids(load_policy(tiny_qwen)[1], [p.prompt for p in rows], True)
    assert [list(x) for x in trainer_prompts(o)] == ids
    adv = torch.tensor([r.advantage for r in emb_records])
    scale = 1.0 if agg == "token_mean" else len(kept) / kept.sum()  # TRL's per-row mean counts every row
    assert torch.allclose(o["advantages"].cpu(), adv * scale)
    assert torch.equal(o["tool_mask"].bool().all(-1).cpu(), kept)
    assert int(o["num_items_in_batch"]) == int((o["completion_mask"].cpu() * kept[:, None]).sum())
    # and the update: the same loss from the same weights, so AdamW's first step agrees
    moved = distance(model, load_policy(tiny_qwen)[0])
    assert moved > 1e-4 and distance(model, model2) < 0.02 * moved  # measured: 1.5e-6 against 3e-4


# Each recipe component TRL has an option for, against the plain clipped loss on the same
# completions. A ratio only differs from 1 after the first update, so the ratio-shaped losses
# take two updates of the batch at a learning rate that moves the ratios past their clip.
COMPONENTS = {
    "gspo": dict(policy_loss="gspo", num_iterations=2, lr=0.02),
    "cispo": dict(policy_loss="cispo", num_iterations=2, lr=0.02, clip_high=0.05),
    "clip_delta": dict(clip_delta=1.25, num_iterations=2, lr=0.02),
    "top_entropy_quantile": dict(top_entropy_quantile=0.2),
    "mask_truncated": dict(mask_truncated=True),
}


@pytest.mark.parametrize("name", list(COMPONENTS))
def test_each_mapped_component_updates_the_weights_alike_in_both_backends(tmp_path, tiny_qwen, name):
    task = get_task("arith", 2)
    knobs = dict(reward="partial_credit", max_grad_norm=0) | COMPONENTS[name]
    plain = {k: v for k, v in knobs.items() if k in ("reward", "max_grad_norm", "num_iterations", "lr")}
    h = load_harness(write_harness(tmp_path / "h", **knobs))
    model, _, _, gen = embedded_step(tiny_qwen, task, h)
    control, _, _, same = embedded_step(tiny_qwen, task, load_harness(write_harness(tmp_path / "p", **plain)))
    assert torch.equal(gen.completion_ids, same.completion_ids)  # sampling precedes the update
    if name == "mask_truncated":
        assert 0 < int(gen.truncated.sum()) < len(gen.truncated), "the test needs both kinds of completion"
    model2, _, _ = trl_replay(tmp_path, tiny_qwen, task, h, gen)
    effect, gap = distance(model, control), distance(model, model2)
    assert gap < 0.05 * effect, (name, gap, effect)  # the component changes the update; TRL's is ours


def trainer_prompts(out):
    return [row[m.bool()].tolist() for row, m in zip(out["prompt_ids"].cpu(), out["prompt_mask"].cpu())]


def test_a_proposal_the_runs_backend_cannot_train_is_illegal_and_never_runs(tmp_path, tiny_run):
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller
    cfg_path, run = tiny_run
    raw = yaml.safe_load(cfg_path.read_text()) | {"backend": "trl"}
    ctl = Controller(config_from_dict(raw).validate(), run)
    ctl.setup()
    proposal = {"knobs": {"loss_agg": "seq_mean_token_sum"}, "files": {}, "hypothesis": "sum per sequence"}
    cand = ctl.harnesses.candidate("v0", "v1", **proposal)
    assert cand.label == "illegal" and "backend trl cannot train v1: loss_agg 'seq_mean_token_sum'" in cand.reasons[0]
    ok = ctl.harnesses.candidate("v0", "v2", knobs={"loss_agg": "seq_mean_token_mean"}, files={}, hypothesis="x")
    assert ok.legal
    # and a root harness it cannot train stops the run before any work, in one line
    (tmp_path / "root" / "knobs.yaml").write_text((tmp_path / "root" / "knobs.yaml").read_text()
                                                   + "kl_coef: 0.1\nkl_estimator: k2\n")
    with pytest.raises(UsageError, match="backend trl cannot train the root harness: kl_estimator 'k2'"):
        Controller(config_from_dict(raw).validate(), tmp_path / "run2")


def test_a_batch_whose_groups_the_filter_all_dropped_leaves_the_weights_alone_in_both_backends(tmp_path, tiny_qwen):
    from evotrainer.trainer.backends import get_backend
    files = {"group_filter.py": "import torch\n\ndef drop_all(rewards, scores):\n"
                                "    return torch.zeros(rewards.shape[0], dtype=torch.bool)\n"}
    h = load_harness(write_harness(tmp_path / "h", files, group_filter="drop_all", kl_coef=0.1))
    for backend in ("embedded", "trl"):
        model, tok = load_policy(tiny_qwen)
        before = [p.detach().clone() for p in model.parameters()]
        (tmp_path / backend).mkdir()
        log = SegmentLog(tmp_path / backend, 2, 0)
        state = get_backend(backend).run(model, tok, get_task("arith", 1), h, seed=0, steps=2, log=log,
                                         optimizer_state=None, runtime=Runtime(backend))
        log.close()
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), backend
        assert state["steps"] == 2 and not state["optimizer"]["state"]  # Adam never stepped
