"""LoRA adapters, weights held in bf16 and gradient checkpointing, on the tiny Qwen2 of the tests."""
import json

import pytest
import torch
import yaml
from safetensors import safe_open

from helpers import DIGITS, cli, here, readable, write_harness
from evotrainer.catalog import get_task
from evotrainer.config import config_from_dict
from evotrainer.errors import UsageError
from evotrainer.harness import load_harness
from evotrainer.policy import load_policy, save_policy
from evotrainer.policy.adapters import LoraSpec, trainable
from evotrainer.policy.config import PolicyConfig
from evotrainer.policy.model import BadCheckpoint
from evotrainer.trainer.grpo import GRPOTrainer
from evotrainer.trainer.logprobs import checkpointed, completion_logprobs, enable_checkpointing


@pytest.fixture(scope="session")
def peaked_qwen(tmp_path_factory):
    """The tiny Qwen2 with weights drawn at std 0.2: at Qwen2's 0.02 a random model's next-token
    distribution is nearly uniform (logits within about +-1 over 400 tokens) and its tied output
    embeddings are what full fine-tuning grows first; adapters on the linear layers cannot
    reach them, so a model that has never been trained is no test of LoRA. A pretrained model's
    outputs are peaked; this one's are too."""
    from tiny_hf import build_tiny_qwen
    return readable(build_tiny_qwen(tmp_path_factory.mktemp("peaked-qwen"), init=0.2))


def lora(base, rank=8, **kw) -> PolicyConfig:
    return PolicyConfig(device="cpu", lora=LoraSpec(rank, 2.0 * rank, base=str(base)), **kw)


def logits(model, tok, text="12+34="):
    with torch.no_grad():
        return model(input_ids=tok([text], return_tensors="pt").input_ids).logits


def trained_adapter(base, cfg, out):
    """An adapter as a segment leaves it: B moved off zero (here by hand), saved by save_policy."""
    model, tok = load_policy(base, cfg, trainable=True)
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    save_policy(model, tok, out)
    return model, tok


def test_lora_config_errors_are_one_line_naming_the_key():
    for lora_cfg, words in (({"rank": 0}, "lora.rank must be an integer >= 1"),
                            ({"rank": 8, "alpah": 16}, "lora has no key 'alpah'"),
                            ({"dropout": 1.5}, "lora.dropout must be in [0, 1)"),
                            ("yes", "'lora' must be dict")):
        with pytest.raises(UsageError, match=words.replace("[", r"\[").replace(")", r"\)")) as e:
            config_from_dict({"task": "arith", "lora": lora_cfg}).validate()
        assert "\n" not in str(e.value) and str(e.value).startswith("config: ")
    with pytest.raises(UsageError, match="weights must be one of fp32, bf16"):
        config_from_dict({"task": "arith", "weights": "int4"}).validate()


def test_a_checkpoint_holds_the_adapter_only_and_the_evaluator_scores_base_plus_adapter(tmp_path, peaked_qwen):
    cfg = lora(peaked_qwen)
    trained, tok = trained_adapter(peaked_qwen, cfg, tmp_path / "ckpt")
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files and "README.md" not in files
    base_bytes = (peaked_qwen / "model.safetensors").stat().st_size
    assert (tmp_path / "ckpt" / "adapter_model.safetensors").stat().st_size < base_bytes / 2
    # the evaluator's load (not trainable): base + adapter merged into a plain model
    merged, _ = load_policy(tmp_path / "ckpt", cfg)
    assert not hasattr(merged, "peft_config")
    base, _ = load_policy(peaked_qwen, PolicyConfig(device="cpu"))
    trained.eval()
    assert torch.allclose(logits(merged, tok), logits(trained, tok), atol=1e-4)
    assert (logits(merged, tok) - logits(base, tok)).abs().max() > 0.1  # the adapter is in what it scores
    # an adapter is never read as a whole model, nor whole weights as a LoRA run's checkpoint
    with pytest.raises(BadCheckpoint, match="is a LoRA adapter"):
        load_policy(tmp_path / "ckpt", PolicyConfig(device="cpu"))
    save_policy(base, tok, tmp_path / "whole")
    with pytest.raises(BadCheckpoint, match="holds whole weights, but this run trains LoRA adapters"):
        load_policy(tmp_path / "whole", cfg)


def test_the_adapters_shape_is_the_runs_never_the_checkpoints_config(tmp_path, peaked_qwen):
    cfg = lora(peaked_qwen)
    trained_adapter(peaked_qwen, cfg, tmp_path / "ckpt")
    conf = tmp_path / "ckpt" / "adapter_config.json"
    conf.write_text(json.dumps({**json.loads(conf.read_text()), "r": 2, "lora_alpha": 1000,
                                "base_model_name_or_path": "/elsewhere"}))
    model, _ = load_policy(tmp_path / "ckpt", cfg, trainable=True)
    assert model.peft_config["default"].r == 8 and model.peft_config["default"].lora_alpha == 16
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "qwen2", "auto_map": {}}))
    with pytest.raises(BadCheckpoint, match="holds an adapter and a model config.json"):
        load_policy(tmp_path / "ckpt", cfg)
    (tmp_path / "ckpt" / "config.json").unlink()
    conf.write_text(json.dumps({"peft_type": "PREFIX_TUNING"}))
    with pytest.raises(BadCheckpoint, match="not a LoRA adapter's config"):
        load_policy(tmp_path / "ckpt", cfg)


def small_harness(tmp_path, **knobs):
    return load_harness(write_harness(tmp_path / "h", {"reward.py": DIGITS}, reward="digit_share", **knobs))


def test_only_adapters_train_and_the_kl_reference_is_the_segment_start_without_a_second_model(tmp_path, peaked_qwen):
    cfg = lora(peaked_qwen)
    h = small_harness(tmp_path, kl_coef=0.1, lr=0.02)
    task = get_task("arith", 2)
    # a new adapter: the reference is the base, the adapter disabled
    model, tok = load_policy(peaked_qwen, cfg, trainable=True)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    tr = GRPOTrainer(model, tok, task, h, seed=0, policy=cfg)
    assert tr.ref[0] is model and {id(p) for p in tr.params} == {id(p) for p in trainable(model)}
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    first = tr.step()[0]
    assert first.kl == 0.0  # the policy is its reference at the first step
    for _ in range(3):
        tr.step()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in model.named_parameters() if "lora_B" in n)
    save_policy(model, tok, tmp_path / "seg1")
    # a continued adapter: the reference is a frozen copy of it (the base would be a KL > 0 at step 1)
    model2, _ = load_policy(tmp_path / "seg1", cfg, trainable=True)
    tr2 = GRPOTrainer(model2, tok, task, h, seed=1, policy=cfg)
    assert "ref" in model2.peft_config and not any(p.requires_grad for n, p in model2.named_parameters() if ".ref." in n)
    assert tr2.step()[0].kl == 0.0
    assert tr2.step()[0].kl > 0.0
    with model2.disable_adapter():
        assert (logits(model2, tok) - logits(load_policy(peaked_qwen, PolicyConfig(device="cpu"))[0], tok)).abs().max() < 1e-5


def dtypes_in(path):
    with safe_open(str(path), "pt") as f:
        return {f.get_tensor(k).dtype for k in f.keys()}


def test_weights_held_in_bf16_train_save_and_load_in_bf16(tmp_path, peaked_qwen):
    h = small_harness(tmp_path, lr=0.02)
    cfg = PolicyConfig(device="cpu", weights="bf16")
    model, tok = load_policy(peaked_qwen, cfg, trainable=True)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    before = [p.detach().clone() for p in model.parameters()]
    tr = GRPOTrainer(model, tok, get_task("arith", 2), h, seed=0, policy=cfg)
    tr.step()
    assert {s["exp_avg"].dtype for s in tr.opt.state.values()} == {torch.bfloat16}  # moments in the weights' dtype
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    save_policy(model, tok, tmp_path / "ckpt")
    assert dtypes_in(tmp_path / "ckpt" / "model.safetensors") == {torch.bfloat16}
    # LoRA on bf16 weights: the base frozen in bf16, the adapters (and their moments) fp32
    cfg = lora(peaked_qwen, weights="bf16")
    model, tok = load_policy(peaked_qwen, cfg, trainable=True)
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    tr = GRPOTrainer(model, tok, get_task("arith", 2), h, seed=0, policy=cfg)
    tr.step()
    save_policy(model, tok, tmp_path / "adapter")
    assert dtypes_in(tmp_path / "adapter" / "adapter_model.safetensors") == {torch.float32}
    merged, _ = load_policy(tmp_path / "adapter", cfg)
    assert {p.dtype for p in merged.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("adapters", [False, True])
def test_gradient_checkpointing_gives_the_update_it_gives_without(tmp_path, peaked_qwen, adapters):
    h = small_harness(tmp_path, lr=0.02)
    cfg = lora(peaked_qwen) if adapters else PolicyConfig(device="cpu")
    after = []
    for checkpointing in (False, True):
        model, tok = load_policy(peaked_qwen, cfg, trainable=True)
        if checkpointing:
            enable_checkpointing(model)
        assert checkpointed(model) == checkpointing
        tr = GRPOTrainer(model, tok, get_task("arith", 2), h, seed=0, policy=cfg)
        tr.step()
        # the gradients, not the weights: Adam's first step is lr x sign(gradient), so a gradient
        # of 1e-12 either way moves a weight by 2 lr
        after.append([p.grad.clone() for p in trainable(model)])
    # the loss forward took the path without a shared prompt cache, to the same log-probs
    gen = tr.sample()[1]
    cached = completion_logprobs(model.eval(), gen, 1.0)[0]
    whole = completion_logprobs(model.train(), gen, 1.0)[0]
    mask = gen.completion_mask.bool()
    assert torch.allclose(cached[mask], whole[mask], atol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(*after))
    assert any(not torch.equal(a, torch.zeros_like(a)) for a in after[0])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["embedded", "trl"])
def test_lora_trains_with_each_backend_its_reward_rises_and_checkpoints_hold_adapters_only(
        tmp_path, peaked_qwen, backend, capsys):
    h = write_harness(tmp_path / "h", {"reward.py": DIGITS}, rewrite=True, reward="digit_share", lr=2e-2,
                      prompts_per_step=8, group_size=8)
    out = tmp_path / "out"
    summary = here(capsys, "train", "--task", "arith", "--level", "2", "--model", peaked_qwen, "--harness", h,
                   "--backend", backend, "--lora-rank", 8, "--steps", 30, "--eval-every", 15, "--out", out).json
    rewards = [json.loads(line)["reward_mean"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.15, (first, last)
    run = json.loads((out / "run.json").read_text())
    total = sum(p.numel() for p in load_policy(peaked_qwen, PolicyConfig(device="cpu"))[0].parameters())
    assert run["lora"]["rank"] == 8 and 0 < run["trainable_params"] < total / 4
    for ckpt in (out / "checkpoints" / "step-15", out / "checkpoint"):
        names = {p.name for p in ckpt.iterdir()}
        assert "adapter_model.safetensors" in names and "model.safetensors" not in names
    # the evaluator scored the base, the step-15 adapter and the final one, each on the base
    assert [e["step"] for e in json.loads((out / "summary.json").read_text())["evals"]] == [0, 15, 30]
    assert 0 <= summary["val"] <= 1 and 0 <= summary["test"] <= 1


@pytest.mark.slow
def test_a_lora_run_continues_adapters_across_segments_and_the_final_replay_and_report_show_them(tmp_path, peaked_qwen,
                                                                                                 capsys):
    root = write_harness(tmp_path / "root", {"reward.py": DIGITS}, reward="digit_share", lr=2e-2)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "task": "arith", "level": 1, "model": str(peaked_qwen), "harness": str(root), "device": "cpu",
        "lora": {"rank": 4, "alpha": 8}, "seeds": [0], "final_seeds": [100],
        "search": {"mode": "continue", "skills": str(tmp_path / "skills.sqlite")},
        "budget": {"trials": 1, "steps_per_segment": 2, "total_steps": 4, "trial_timeout_s": 300},
        "promotion": {"replicas": 1}, "evaluation": {"every": 1}}))
    run = tmp_path / "run"
    status = here(capsys, "run", cfg, "--out", run, "--json").json
    assert status["state"] == "finished"
    assert status["policy"].startswith("LoRA r4 (alpha 8, all-linear) on fp32 weights: adapters of ")
    # every checkpoint any job wrote is an adapter; the depth-2 segments trained on from depth 1's adapter
    ckpts = [p.parent for p in run.glob("**/adapter_model.safetensors")]
    assert ckpts and not list(run.glob("**/checkpoint*/model.safetensors"))
    second = [json.loads(p.read_text()) for p in run.glob("final/*/seed-100/segment-2/run.json")]
    assert second and all(r["lora"]["rank"] == 4 and r["trainable_params"] > 0 for r in second)
    final = json.loads((run / "final.json").read_text())
    assert {"val", "test"} <= set(final["comparison"])
    here(capsys, "report", run)
    assert "LoRA r4" in (run / "report.html").read_text()
    # a user scores a checkpoint of the run: its base and adapter spec come from the run's record
    ckpt = sorted(run.glob("final/*/seed-100/segment-2/checkpoint"))[0]
    scored = here(capsys, "evaluate", "--task", "arith", "--level", 1, "--model", ckpt, "--run", run,
                  "--split", "val").json
    assert 0 <= scored["greedy"] <= 1
    # the refusal is a user's command line: one error line, exit 2, no traceback (a subprocess shows all three)
    refused = cli("evaluate", "--task", "arith", "--level", 1, "--model", ckpt, code=2)
    assert "is a LoRA adapter: pass --run RUN" in refused.err and "Traceback" not in refused.err
