"""Any causal LM: loading, prompting, stopping, sampling knobs, device-free trainer mechanics."""
import os
import subprocess
import sys

import pytest
import torch
from transformers import T5Config

from helpers import DIGITS, write_harness
from evotrainer.errors import UsageError
from evotrainer.harness import load_harness
from evotrainer.harness.losses import seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm, token_mean
from evotrainer.harness.rollouts import SlotError
from evotrainer.trainer.accumulate import aggregation_weights
from evotrainer.trainer.logprobs import completion_logprobs
from evotrainer.policy import build_tokenizer, load_policy
from evotrainer.policy.config import PolicyConfig
from evotrainer.policy.generate import decode, filter_logits, generate
from evotrainer.policy.model import resolve_model
from evotrainer.policy.prompts import encode_prompts, prompt_token_ids, stop_token_ids
from test_policy import ScriptedLM, full_forward_logprobs


def test_a_user_model_loads_pads_left_and_is_prompted_through_its_chat_template(tiny_qwen):
    model, tok = load_policy(tiny_qwen)
    assert type(model).__name__ == "Qwen2ForCausalLM" and tok.padding_side == "left"
    chat = tok.convert_ids_to_tokens(prompt_token_ids(tok, ["12+34="], chat_template=True)[0])
    assert chat[0] == "<|im_start|>" and "<|im_end|>" in chat and "".join(chat[-4:]).endswith("Ċ")
    raw = prompt_token_ids(tok, ["12+34="], chat_template=False)[0]
    assert tok.decode(raw) == "12+34="  # Qwen's tokenizer adds no BOS, and neither do we
    # every end-of-turn id the generation config lists stops a completion
    assert set(stop_token_ids(model, tok)) == set(tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    # the built-in tokenizer writes its own <bos>; a prompt gets exactly one
    ctok = build_tokenizer()
    assert prompt_token_ids(ctok, ["1+2="], chat_template=True)[0] == [ctok.bos_token_id] + \
        ctok("1+2=", add_special_tokens=False)["input_ids"]


def test_generation_stops_at_any_stop_id_and_decode_drops_it():
    tok = build_tokenizer()
    five, six, pad = tok.convert_tokens_to_ids(["5", "6"]) + [tok.pad_token_id]
    stop_a, stop_b = tok.eos_token_id, tok.convert_tokens_to_ids("~")
    script = [[five, stop_b, six], [stop_a, five, five], [six, six, six]]
    ids, mask = encode_prompts(tok, ["1+1=", "2+2=", "3+3="])
    gen = generate(ScriptedLM(script), ids, mask, max_new_tokens=3, stop_ids=[stop_a, stop_b], pad_id=pad, greedy=True)
    assert gen.completion_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert gen.truncated.tolist() == [False, False, True]
    assert decode(tok, gen) == ["5", "", "666"]


def test_top_k_and_top_p_filtering_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    inf = float("-inf")
    assert torch.equal(torch.isinf(filter_logits(logits, top_k=2)), torch.tensor([[False, False, True, True]]))
    # nucleus 0.7: 0.5 alone is short of it, 0.5 + 0.3 reaches it: two tokens stay
    assert torch.equal(torch.isinf(filter_logits(logits, top_p=0.7)), torch.tensor([[False, False, True, True]]))
    assert torch.equal(torch.isinf(filter_logits(logits, top_p=0.5)), torch.tensor([[False, True, True, True]]))
    assert torch.equal(filter_logits(logits), logits) and filter_logits(logits, top_p=0.01)[0, 0] != inf


def test_shared_prompt_cache_matches_a_full_forward_for_a_qwen2_model_with_left_padding(tiny_qwen):
    model, tok = load_policy(tiny_qwen)
    ids, mask = encode_prompts(tok, ["1+2=", "345+678=", "12+34= what is the sum"], chat_template=True)
    assert bool((mask == 0).any())  # left padding in play
    gen = generate(model, ids, mask, max_new_tokens=6, stop_ids=stop_token_ids(model, tok), pad_id=tok.pad_token_id,
                   generator=torch.Generator().manual_seed(0), repeats=3)
    logp, _ = completion_logprobs(model, gen, 1.0)
    ref_logp = full_forward_logprobs(model, gen)
    m = gen.completion_mask.bool()
    assert torch.allclose(logp[m], ref_logp[m], atol=1e-4) and torch.allclose(gen.logprobs[m], ref_logp[m], atol=1e-4)


def test_bad_models_are_named_in_one_line(tmp_path, ckpt):
    assert resolve_model(ckpt) == str(ckpt.resolve())
    with pytest.raises(UsageError, match="no model at"):
        resolve_model(tmp_path / "missing")
    T5Config(vocab_size=10, d_model=8, num_layers=1, num_heads=1, d_ff=8).save_pretrained(tmp_path / "t5")
    with pytest.raises(UsageError, match="t5 model, which is not a causal LM"):
        resolve_model(tmp_path / "t5")
    (tmp_path / "no_tok").mkdir()
    (tmp_path / "no_tok" / "config.json").write_text((ckpt / "config.json").read_text())
    with pytest.raises(UsageError, match="no tokenizer files"):
        resolve_model(tmp_path / "no_tok")
    with pytest.raises(UsageError, match="neither a directory nor in the local Hugging Face cache"):
        resolve_model("nobody/no-such-model")
    for bad in (PolicyConfig(dtype="fp8"), PolicyConfig(device="tpu")):
        with pytest.raises(UsageError):
            bad.validate()
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="no CUDA device"):
            PolicyConfig(device="cuda").validate()


def test_importing_the_package_leaves_hugging_face_offline_mode_alone():
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", "import os, evotrainer, evotrainer.policy, evotrainer.trainer.grpo; "
                          "print(os.environ.get('HF_HUB_OFFLINE'), os.environ.get('TRANSFORMERS_OFFLINE'))"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["None", "None"], out.stderr[-500:]


# --------------------------------------------------------------------------- loss aggregation, by hand

def test_sequence_mean_aggregations_leave_dropped_rows_out_of_their_denominators():
    loss = torch.tensor([[1.0, 3.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # row 2 dropped
    assert seq_mean_token_mean(loss, mask).item() == pytest.approx((2.0 + 2.0) / 2)      # not / 3
    assert seq_mean_token_sum(loss, mask).item() == pytest.approx((4.0 + 2.0) / 2)
    # Dr. GRPO: token sums over live rows, divided by the constant budget (the mask's width, 4)
    assert seq_mean_token_sum_norm(loss, mask).item() == pytest.approx((4.0 + 2.0) / (2 * 4))
    assert token_mean(loss, mask).item() == pytest.approx(6.0 / 3)


def test_the_trainer_hands_aggregations_a_mask_as_wide_as_the_budget_with_dropped_rows_zero(tmp_path):
    from evotrainer.catalog import get_task
    from evotrainer.trainer.grpo import GRPOTrainer
    from evotrainer.policy import build_model
    files = {"loss_agg.py": """
        import torch
        SEEN = []

        def probe(loss, mask):
            SEEN.append(mask.clone())
            return (loss * mask).sum() / mask.sum().clamp(min=1)
    """, "group_filter.py": """
        import torch

        def odd_groups(rewards, scores):
            return torch.arange(rewards.shape[0]) % 2 == 1
    """}
    h = load_harness(write_harness(tmp_path / "h", files, prompts_per_step=4, group_size=4, loss_agg="probe",
                                   group_filter="odd_groups", kl_coef=0.1))
    tok = build_tokenizer()
    tr = GRPOTrainer(build_model(len(tok)), tok, get_task("arith", 1), h, seed=0)
    tr.step()
    (mask,) = h.loss_agg.__globals__["SEEN"]
    assert mask.shape == (16, tr.T) == (16, 9)   # the budget, whatever the longest completion was
    assert mask[:4].sum() == 0 and mask[8:12].sum() == 0 and (mask[4:8].sum(-1) > 0).all()


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_accumulate_the_same_gradient_as_the_whole_batch(tmp_path, agg):
    from evotrainer.trainer.grpo import GRPOTrainer
    from evotrainer.policy import build_model
    from evotrainer.catalog import get_task
    knobs = {"prompts_per_step": 4, "group_size": 4, "reward": "digit_share", "loss_agg": agg, "kl_coef": 0.05,
             "group_filter": "drop_dead"}
    grads = []
    for micro in (0, 3):
        tok = build_tokenizer()
        h = load_harness(write_harness(tmp_path / f"m{micro}", {"reward.py": DIGITS}, **knobs))
        tr = GRPOTrainer(build_model(len(tok)), tok, get_task("arith", 1), h, seed=0, micro_batch_size=micro)
        tr.step()
        grads.append(torch.cat([p.grad.flatten() for p in tr.model.parameters()]))
    assert grads[0].norm() > 0
    assert (grads[0] - grads[1]).norm() / grads[0].norm() < 1e-4


def test_an_aggregation_that_is_not_linear_cannot_be_split_into_micro_batches():
    mask = torch.ones(3, 4)
    w = aggregation_weights(token_mean, mask)
    assert torch.allclose(w, torch.full((3, 4), 1 / 12))
    with pytest.raises(SlotError, match="not linear"):
        aggregation_weights(lambda loss, m: ((loss * m).sum(-1) ** 2).mean(), mask)


def test_clip_fraction_and_approximate_kl_appear_with_several_updates_per_batch(tmp_path):
    from evotrainer.trainer.grpo import GRPOTrainer
    from evotrainer.policy import build_model
    from evotrainer.catalog import get_task
    out = {}
    for it in (1, 4):
        tok = build_tokenizer()
        h = load_harness(write_harness(tmp_path / str(it), {"reward.py": DIGITS}, prompts_per_step=8, group_size=8,
                                       reward="digit_share", lr=1e-2, num_iterations=it, clip_low=0.05,
                                       clip_high=0.05))
        tr = GRPOTrainer(build_model(len(tok)), tok, get_task("arith", 1), h, seed=0)
        out[it] = tr.step()[0]
    assert out[1].clip_frac == 0 and out[1].approx_kl == pytest.approx(0, abs=1e-7)  # ratio 1 on the only update
    assert 0 < out[4].clip_frac < 1 and out[4].approx_kl > 0


def test_top_k_one_samples_the_greedy_completion(tmp_path):
    from evotrainer.trainer.grpo import GRPOTrainer
    from evotrainer.policy import build_model
    from evotrainer.catalog import get_task
    tok = build_tokenizer()
    h = load_harness(write_harness(tmp_path / "h", prompts_per_step=2, group_size=4, top_k=1))
    tr = GRPOTrainer(build_model(len(tok), seed=2), tok, get_task("arith", 2), h, seed=0)
    rows, gen, texts, _ = tr.sample()
    ids, mask = encode_prompts(tok, [p.prompt for p in rows[::4]])
    greedy = decode(tok, generate(tr.model, ids, mask, max_new_tokens=tr.T, stop_ids=tr.stop_ids,
                                  pad_id=tok.pad_token_id, greedy=True))
    assert texts == [t for t in greedy for _ in range(4)]
