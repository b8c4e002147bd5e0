"""The evaluator scores a checkpoint's weights, nothing else of the job's: tokenizer, chat
template, special tokens, generation and model config come from the run's base; a checkpoint
that does not load is an error line of its own; `check_weights` says so before it is loaded."""
import json
import os
import shutil

import pytest
import torch
from helpers import readable, write_harness
from safetensors.torch import load_file, save_file

from evotrainer.catalog import get_task
from evotrainer.evaluate.greedy import accuracy, evaluate_checkpoints
from evotrainer.evolve.segments.cache import numbers
from evotrainer.policy import load_policy, save_policy
from evotrainer.policy.adapters import LoraSpec
from evotrainer.policy.config import PolicyConfig
from evotrainer.policy.model import BadCheckpoint, check_checkpoint
from evotrainer.policy.prompts import prompt_token_ids, stop_token_ids
from evotrainer.policy.weights import check_weights
from evotrainer.runtime import Runtime

GRADED = '''from evotrainer.tasks.arith import ArithConfig, ArithTask


class Graded(ArithTask):
    """arith's problems with partial credit, so that a random model scores something: half for
    the digits of its completion, half for its length. Whatever changes what the model is
    asked, or where it stops, moves the score."""

    def score(self, problem, completion):
        digits = sum(c.isdigit() for c in completion) / max(len(completion), 1)
        return 0.5 * digits + 0.5 * min(len(completion) / self.max_new_tokens, 1.0)


def make(level=None):
    return Graded(ArithConfig(target_level=level or 2, split_size=12))
'''
# what a job could leave beside its weights, each a way to change what the evaluator asks or where it stops
REWRITE = "{% for m in messages %}Say nothing. {{ m['content'] | reverse | join('') }}{% endfor %}"
RAISES = "{{ raise_exception('a planted template') }}"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    path = readable(tmp_path_factory.mktemp("graded")) / "graded.py"
    path.write_text(GRADED)
    return f"{path}:make"


@pytest.fixture(params=["ckpt", "tiny_qwen"])
def base(request):
    """The built-in tiny model (no chat template), and a Qwen2 with one."""
    return request.getfixturevalue(request.param)


def planted(base, where, **files):
    """A copy of the base's weights, as a job's checkpoint, with `files` written beside them."""
    ckpt = shutil.copytree(base, where)
    for name, text in files.items():
        (ckpt / name.replace("__", ".")).write_text(text)
    return ckpt


def edited_json(path, **changes):
    return json.dumps({**(json.loads(path.read_text()) if path.is_file() else {}), **changes})


def plants(base, tmp_path):
    """{name: checkpoint}: identical weights, each with other files of the job's."""
    vocab = len(load_policy(base, PolicyConfig(device="cpu"))[1])
    return {
        "template": planted(base, tmp_path / "template", chat_template__jinja=REWRITE),
        "raising": planted(base, tmp_path / "raising", chat_template__jinja=RAISES),
        # every id an end token: a completion would stop at once
        "generation": planted(base, tmp_path / "generation", generation_config__json=edited_json(
            base / "generation_config.json", eos_token_id=list(range(vocab)))),
        "special": planted(base, tmp_path / "special",
                           special_tokens_map__json=json.dumps({"eos_token": "1", "pad_token": "2"}),
                           tokenizer_config__json=edited_json(base / "tokenizer_config.json", eos_token="1",
                                                              chat_template=REWRITE)),
        "tokenizer": planted(base, tmp_path / "tokenizer", tokenizer__json=other_tokenizer(base)),
    }


def other_tokenizer(base) -> str:
    """Another tokenizer's tokenizer.json (the Qwen's for the built-in model, and the other way
    round): its ids name other strings."""
    from tiny_hf import build_tokenizer as qwen_tokenizer

    from evotrainer.policy import build_tokenizer
    qwen = (base / "chat_template.jinja").is_file() or "chat_template" in (base / "tokenizer_config.json").read_text()
    return (build_tokenizer() if qwen else qwen_tokenizer()).backend_tokenizer.to_str()


def test_files_planted_beside_the_weights_change_no_score_and_the_tokenizer_is_the_bases(tmp_path, base, graded):
    cfg = PolicyConfig(device="cpu", base=str(base))
    checkpoints = plants(base, tmp_path)
    acc = evaluate_checkpoints(graded, 2, {str(base): ["val"], **{str(c): ["val"] for c in checkpoints.values()}},
                               policy=cfg.to_dict())
    want = acc[str(base)]["val"]
    assert 0 < want < 1
    assert {name: acc[str(c)] for name, c in checkpoints.items()} == {name: {"val": want} for name in checkpoints}
    base_model, base_tok = load_policy(base, cfg)
    task = get_task(graded, 2)
    for name, c in checkpoints.items():
        model, tok = load_policy(c, cfg)
        assert tok.chat_template == base_tok.chat_template and tok.get_vocab() == base_tok.get_vocab(), name
        assert stop_token_ids(model, tok) == stop_token_ids(base_model, base_tok), name
        assert prompt_token_ids(tok, ["12+34="]) == prompt_token_ids(base_tok, ["12+34="]), name
    # the plants do bite where a checkpoint is its own base (library use): the test can tell
    for name in ("template", "generation"):
        model, tok = load_policy(checkpoints[name], PolicyConfig(device="cpu"))
        with torch.inference_mode():
            assert accuracy(model, tok, task, task.split("val"), policy=cfg) != want, name


def test_a_checkpoints_config_and_generation_config_are_never_read(tmp_path, tiny_qwen):
    """transformers is handed the base's config and generation config, so it opens neither file
    of the checkpoint: one that is not JSON, one naming other weights, custom code and another
    shape load as the base's."""
    marker = tmp_path / "ran"
    ckpt = planted(tiny_qwen, tmp_path / "ckpt", generation_config__json="not JSON {",
                   config__json=json.dumps({"model_type": "t5", "num_hidden_layers": 1, "hidden_size": 8,
                                            "transformers_weights": "elsewhere.safetensors",
                                            "auto_map": {"AutoModelForCausalLM": "evil.Model"}}),
                   evil__py=f"open({str(marker)!r}, 'w')\n")
    cfg = PolicyConfig(device="cpu", base=str(tiny_qwen))
    model, tok = load_policy(ckpt, cfg)
    base_model, _ = load_policy(tiny_qwen, cfg)
    assert type(model) is type(base_model) and model.config.to_dict() | {"_name_or_path": ""} == \
        base_model.config.to_dict() | {"_name_or_path": ""}
    assert model.generation_config.to_dict() == base_model.generation_config.to_dict()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), base_model.state_dict().values()))
    assert not marker.exists()
    # a job's own checkpoint with such a config is refused when it ends, in one line
    for config, words in (({"model_type": "qwen2", "auto_map": {}}, "with custom code (auto_map)"),
                          ({"model_type": "t5"}, "names a t5 model")):
        (ckpt / "config.json").write_text(json.dumps(config))
        (ckpt / "evil.py").unlink(missing_ok=True)
        with pytest.raises(BadCheckpoint, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
            check_checkpoint(ckpt, written=True)
        assert "\n" not in str(e.value)


def test_whole_weights_with_an_adapter_config_beside_them_are_refused(tmp_path, ckpt):
    bad = planted(ckpt, tmp_path / "bad", adapter_config__json=json.dumps(
        {"peft_type": "LORA", "base_model_name_or_path": str(tmp_path / "elsewhere")}))
    for written in (False, True):
        with pytest.raises(BadCheckpoint, match="holds whole weights and an adapter_config.json"):
            check_checkpoint(bad, written=written)


def test_an_adapter_is_scored_with_the_bases_tokenizer_not_the_one_saved_beside_it(tmp_path, tiny_qwen):
    cfg = PolicyConfig(device="cpu", lora=LoraSpec(4, 8.0), base=str(tiny_qwen))
    model, tok = load_policy(tiny_qwen, cfg, trainable=True)
    save_policy(model, tok, tmp_path / "adapter")
    (tmp_path / "adapter" / "chat_template.jinja").write_text(REWRITE)
    _, loaded = load_policy(tmp_path / "adapter", cfg)
    assert loaded.chat_template == tok.chat_template != REWRITE


def test_every_runs_policy_carries_its_base_and_no_cache_key_holds_where_it_lies(tmp_path, ckpt):
    rt = Runtime(policy=PolicyConfig(device="cpu"))
    a = rt.on_base(ckpt)
    elsewhere = shutil.copytree(ckpt, tmp_path / "elsewhere")
    assert a.policy.base == str(ckpt.resolve()) and a.policy.reads() == (str(ckpt.resolve()),)
    assert Runtime.of(a.to_dict()) == a  # it travels with the runtime's dict to every job
    assert numbers(a, True, 1) == numbers(rt.on_base(elsewhere), True, 1) == numbers(rt, True, 1)
    lora = Runtime(policy=PolicyConfig(device="cpu", lora=LoraSpec(4, 8.0))).on_base(ckpt)
    assert lora.policy.base_dir() == str(ckpt.resolve())
    # `evotrainer evaluate --run` names a LoRA run's base on its spec
    assert PolicyConfig(lora=LoraSpec(4, 8.0, base="/b")).base_dir() == "/b"


def test_a_segment_from_a_parents_checkpoint_trains_on_the_runs_tokenizer_and_template(tmp_path, tiny_qwen):
    """A parent job's checkpoint with a template that raises: the child's segment prompts
    through the base's template, trains, and saves the base's tokenizer and template."""
    from evotrainer.trainer.jobs import train_segment
    parent = planted(tiny_qwen, tmp_path / "parent", chat_template__jinja=RAISES,
                     tokenizer_config__json=edited_json(tiny_qwen / "tokenizer_config.json", chat_template=RAISES))
    runtime = Runtime(policy=PolicyConfig(device="cpu")).on_base(tiny_qwen)
    train_segment(task="arith", level=1, harness=str(write_harness(tmp_path / "h")), base=str(parent),
                  out=str(tmp_path / "seg"), seed=0, steps=1, runtime=runtime.to_dict())
    _, tok = load_policy(tmp_path / "seg" / "checkpoint", PolicyConfig(device="cpu"))  # its own files, as saved
    assert tok.chat_template == load_policy(tiny_qwen, PolicyConfig(device="cpu"))[1].chat_template != RAISES


# ------------------------------------------------------------------ one bad checkpoint, the others scored

def test_a_checkpoint_that_does_not_load_is_an_error_line_and_the_others_are_scored(tmp_path, ckpt, graded):
    cfg = PolicyConfig(device="cpu", base=str(ckpt)).to_dict()
    truncated = shutil.copytree(ckpt, tmp_path / "truncated")
    with open(truncated / "model.safetensors", "r+b") as f:
        f.truncate(os.path.getsize(truncated / "model.safetensors") - 100)
    reshaped = shutil.copytree(ckpt, tmp_path / "reshaped")
    w = load_file(reshaped / "model.safetensors")
    w["model.norm.weight"] = torch.ones(7)
    save_file(w, reshaped / "model.safetensors", metadata={"format": "pt"})
    missing = tmp_path / "missing"
    good = shutil.copytree(ckpt, tmp_path / "good")
    alone = evaluate_checkpoints(graded, 2, {str(good): ["val", "test"]}, policy=cfg)
    acc = evaluate_checkpoints(graded, 2, {str(truncated): ["val"], str(good): ["val", "test"], str(reshaped): ["val"],
                                           str(missing): ["val"]}, policy=cfg)
    assert acc[str(good)] == alone[str(good)] and set(alone[str(good)]) == {"val", "test"}
    for bad in (truncated, reshaped, missing):
        assert set(acc[str(bad)]) == {"error"}, acc[str(bad)]
        assert "\n" not in acc[str(bad)]["error"] and len(acc[str(bad)]["error"]) <= 500
    assert acc[str(missing)]["error"].startswith("BadCheckpoint: no checkpoint at")


# ------------------------------------------------------------------ check_weights

def rewrite(path, edit):
    w = load_file(path)
    edit(w)
    save_file(w, path, metadata={"format": "pt"})


def test_check_weights_passes_the_bases_weights_and_names_each_fault_in_one_line(tmp_path, ckpt):
    same = shutil.copytree(ckpt, tmp_path / "same")
    assert check_weights(same, ckpt) is None and check_weights(same, ckpt, weights="fp32") is None
    assert check_weights(ckpt, ckpt) is None
    cases = {}
    cases["renamed"] = shutil.copytree(ckpt, tmp_path / "renamed")
    rewrite(cases["renamed"] / "model.safetensors",
            lambda w: w.__setitem__("model.extra.weight", w.pop("model.norm.weight")))
    cases["reshaped"] = shutil.copytree(ckpt, tmp_path / "reshaped")
    rewrite(cases["reshaped"] / "model.safetensors", lambda w: w.__setitem__("model.norm.weight", torch.ones(7)))
    cases["bf16"] = shutil.copytree(ckpt, tmp_path / "bf16")
    rewrite(cases["bf16"] / "model.safetensors", lambda w: w.update({k: v.bfloat16() for k, v in w.items()}))
    cases["truncated"] = shutil.copytree(ckpt, tmp_path / "truncated")
    with open(cases["truncated"] / "model.safetensors", "r+b") as f:
        f.truncate(os.path.getsize(f.name) - 1)
    cases["header"] = shutil.copytree(ckpt, tmp_path / "header")
    size = os.path.getsize(cases["header"] / "model.safetensors")
    with open(cases["header"] / "model.safetensors", "r+b") as f:
        f.write(size.to_bytes(8, "little"))
    cases["huge-header"] = shutil.copytree(ckpt, tmp_path / "huge-header")
    with open(cases["huge-header"] / "model.safetensors", "r+b") as f:
        f.write((2 ** 40).to_bytes(8, "little"))
    cases["linked"] = shutil.copytree(ckpt, tmp_path / "linked")
    (cases["linked"] / "model.safetensors").unlink()
    (cases["linked"] / "model.safetensors").symlink_to(ckpt / "model.safetensors")
    cases["fifo"] = shutil.copytree(ckpt, tmp_path / "fifo")
    (cases["fifo"] / "model.safetensors").unlink()
    os.mkfifo(cases["fifo"] / "model.safetensors")
    cases["dir-link"] = tmp_path / "dir-link"
    cases["dir-link"].symlink_to(same)
    cases["base-link"] = tmp_path / "base-link"
    cases["base-link"].symlink_to(ckpt)
    words = {"renamed": "its tensors are not the base's: 1 not the base's ('model.extra.weight'), "
                        "1 of the base's missing ('model.norm.weight')",
             "reshaped": "tensor 'model.norm.weight' has shape [7], the base's [128]",
             "bf16": "is BF16, expected F32", "truncated": "truncated",
             "header": "runs past the end of the file", "huge-header": "is over 104857600",
             "linked": "model.safetensors is a symbolic link", "fifo": "model.safetensors is not a regular file",
             "dir-link": "is a symbolic link", "base-link": "is a symbolic link"}
    for name, path in cases.items():
        why = check_weights(path, ckpt, weights="fp32")
        assert why and words[name] in why and "\n" not in why, (name, why)
    assert check_weights(cases["bf16"], ckpt) is None  # without the run's `weights`: any float the loader casts


def test_check_weights_reads_a_sharded_checkpoint_as_transformers_does(tmp_path, ckpt):
    sharded = shutil.copytree(ckpt, tmp_path / "sharded")
    w = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    names = sorted(w)
    halves = {"model-00001-of-00002.safetensors": names[:5], "model-00002-of-00002.safetensors": names[5:]}
    for shard, keys in halves.items():
        save_file({k: w[k] for k in keys}, sharded / shard, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: s for s, keys in halves.items() for k in keys}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert check_weights(sharded, ckpt) is None
    index["weight_map"][names[0]] = "model-00002-of-00002.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "is not listed there in model.safetensors.index.json" in check_weights(sharded, ckpt)


def test_check_weights_of_an_adapter_wants_lora_weights_of_the_bases_linear_modules(tmp_path, tiny_qwen):
    cfg = PolicyConfig(device="cpu", lora=LoraSpec(4, 8.0), base=str(tiny_qwen))
    model, tok = load_policy(tiny_qwen, cfg, trainable=True)
    adapter = tmp_path / "adapter"
    save_policy(model, tok, adapter)
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 64}))  # never read
    assert check_weights(adapter, tiny_qwen, rank=4) is None
    assert "rank 4, the run's lora rank is 8" in check_weights(adapter, tiny_qwen, rank=8)
    weights = adapter / "adapter_model.safetensors"
    name = next(k for k in load_file(weights) if k.endswith("lora_A.weight"))
    for edit, words in (
            (lambda w: w.__setitem__("base_model.model.lm_head.weight", torch.zeros(4, 4)), "is not a LoRA weight"),
            (lambda w: w.__setitem__(name.replace("layers.0", "layers.9"), w.pop(name)), "adapts no linear module"),
            (lambda w: w.pop(name), "without its other half"),
            (lambda w: w.__setitem__(name, w[name].to(torch.int32)), "is I32, not a float"),
            (lambda w: w.__setitem__(name, torch.zeros(4, 3)), "do not fit its weight")):
        shutil.copy(adapter / "adapter_model.safetensors", tmp_path / "kept")
        rewrite(weights, edit)
        why = check_weights(adapter, tiny_qwen, rank=4)
        assert why and words in why and "\n" not in why, (words, why)
        shutil.copy(tmp_path / "kept", weights)
