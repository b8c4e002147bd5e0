import torch

from evotrainer.policy import build_model, build_tokenizer, load_policy, save_policy
from evotrainer.policy.generate import decode, generate
from evotrainer.policy.prompts import encode_prompts


def test_tokenizer_is_character_level_and_round_trips():
    tok = build_tokenizer()
    text = "123+456=975 ab\nZ~"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.padding_side == "left"
    assert {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id} == {0, 1, 2}


def test_model_is_about_one_million_parameters_and_saves_in_hf_format(tmp_path):
    tok = build_tokenizer()
    model = build_model(len(tok))
    n = sum(p.numel() for p in model.parameters())
    assert 0.9e6 < n < 1.2e6
    save_policy(model, tok, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "config.json").exists()
    m2, tok2 = load_policy(tmp_path / "ckpt")
    x = torch.tensor([[1, 5, 6, 7]])
    assert torch.allclose(model(x).logits, m2(x).logits)
    assert tok2.decode(tok2("9+9=", add_special_tokens=False)["input_ids"]) == "9+9="


def test_kv_cached_greedy_matches_transformers_generate_with_left_padding():
    tok = build_tokenizer()
    model = build_model(len(tok), seed=3).eval()
    ids, mask = encode_prompts(tok, ["1+2=", "345+678=", "12+34="])
    ours = generate(model, ids, mask, max_new_tokens=6, stop_ids=tok.eos_token_id, pad_id=tok.pad_token_id, greedy=True)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                         eos_token_id=-1, pad_token_id=0)[:, ids.shape[1]:]
    n = ours.completion_ids.shape[1]
    # rows that never wrote the end token must agree token for token
    for row in range(3):
        m = ours.completion_mask[row].bool()
        assert torch.equal(ours.completion_ids[row][m], ref[row, :n][m])


def test_finished_rows_leave_the_batch_and_every_row_still_matches_transformers_generate():
    """Rows that end early drop out of the model's batch; the rest go on as if alone."""
    tok = build_tokenizer()
    model = build_model(len(tok), seed=1).eval()
    prompts = ["1+2=", "345+678=", "12+34=", "9+9=", "77+1=", "5+50=", "800+8=", "3+3="]
    ids, mask = encode_prompts(tok, prompts)
    stops = [10, 17, 23]  # this model's greedy rows write these at steps 1, 2 and 4, or never
    sizes = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: sizes.append(kw["input_ids"].shape[0]), with_kwargs=True)
    ours = generate(model, ids, mask, max_new_tokens=8, stop_ids=stops, pad_id=tok.pad_token_id, greedy=True)
    hook.remove()
    assert sizes[:2] == [len(prompts), len(prompts) - 3] and min(sizes) == 3  # the batch shrank as rows ended
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                         eos_token_id=-1, pad_token_id=0)[:, ids.shape[1]:]
    n = ours.completion_ids.shape[1]
    for row in range(len(prompts)):
        m = ours.completion_mask[row].bool()
        assert torch.equal(ours.completion_ids[row][m], ref[row, :n][m])
        assert (ours.completion_ids[row][~m] == tok.pad_token_id).all()
        assert (ours.logprobs[row][~m] == 0).all() and (ours.entropy[row][~m] == 0).all()
    assert ours.lengths.tolist() == [1, 4, 1, 8, 1, 2, 8, 8] and ours.truncated.sum() == 3


def test_a_seed_samples_the_same_completions_whether_finished_rows_leave_the_batch_or_not(monkeypatch):
    import evotrainer.policy.generate as gen_module
    tok = build_tokenizer()
    model = build_model(len(tok), seed=1).eval()
    ids, mask = encode_prompts(tok, ["1+2=", "345+678=", "12+34=", "9+9="])
    sample = lambda: generate(model, ids, mask, max_new_tokens=12, stop_ids=list(range(3, 13)),  # noqa: E731
                              pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(7), repeats=8)
    dropping = sample()
    monkeypatch.setattr(gen_module, "LEAVE_SHARE", 2.0)  # never: every row stays to the end
    staying = sample()
    assert len(set(dropping.lengths.tolist())) > 3 and dropping.completion_ids.shape[1] > 4  # rows end at many steps
    assert torch.equal(dropping.completion_ids, staying.completion_ids)
    assert torch.allclose(dropping.logprobs, staying.logprobs, atol=1e-5)
    assert torch.allclose(dropping.entropy, staying.entropy, atol=1e-5)


class ScriptedLM(torch.nn.Module):
    """Emits a fixed token sequence per row, whatever the input: tests generate's bookkeeping.
    Its cache follows the rows generate keeps in the batch."""

    def __init__(self, script, vocab=100):
        super().__init__()
        self.script, self.vocab, self.calls = torch.tensor(script), vocab, 0
        self.rows = torch.arange(len(script))

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True):
        t = self.calls
        self.calls += 1
        assert input_ids.shape[0] == len(self.rows)
        logits = torch.full((input_ids.shape[0], input_ids.shape[1], self.vocab), -1e9)
        logits[torch.arange(input_ids.shape[0]), -1, self.script[self.rows, t]] = 0.0
        lm = self
        cache = type("Cache", (), {"batch_select_indices": lambda self, idx: setattr(lm, "rows", lm.rows[idx])})()
        return type("Out", (), {"logits": logits, "past_key_values": cache})()


def test_completion_mask_stops_after_first_end_token_and_flags_truncation():
    tok = build_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    five, six = tok.convert_tokens_to_ids(["5", "6"])
    # row 0 ends at its 2nd token; row 1 never ends; row 2 ends at once
    script = [[five, eos, six, six], [six, six, six, six], [eos, five, five, five]]
    ids, mask = encode_prompts(tok, ["1+1=", "2+2=", "3+3="])
    gen = generate(ScriptedLM(script), ids, mask, max_new_tokens=4, stop_ids=eos, pad_id=pad, greedy=True)
    assert gen.completion_ids.tolist() == [[five, eos, pad, pad], [six] * 4, [eos, pad, pad, pad]]
    assert gen.completion_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert gen.truncated.tolist() == [False, True, False]
    assert gen.lengths.tolist() == [2, 4, 1]
    assert decode(tok, gen) == ["5", "6666", ""]


def test_generation_stops_early_once_every_row_has_ended():
    tok = build_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    lm = ScriptedLM([[eos] * 8, [eos] * 8])
    ids, mask = encode_prompts(tok, ["1+1=", "2+2="])
    gen = generate(lm, ids, mask, max_new_tokens=8, stop_ids=eos, pad_id=pad, greedy=True)
    assert gen.completion_ids.shape == (2, 1)
    assert lm.calls == 1  # the prompt forward only


def full_forward_logprobs(model, gen) -> torch.Tensor:
    """The reference: every row's prompt + completion through the model in one plain forward."""
    ids, mask = gen.prompt_ids, gen.prompt_mask
    full = torch.cat([ids[gen.prompt_index], gen.completion_ids], 1)
    fmask = torch.cat([mask[gen.prompt_index], torch.ones_like(gen.completion_ids)], 1)
    pos = (fmask.cumsum(-1) - 1).clamp(min=0)
    L, T = ids.shape[1], gen.completion_ids.shape[1]
    ref = torch.log_softmax(model(input_ids=full, attention_mask=fmask, position_ids=pos).logits[:, L - 1:L - 1 + T], -1)
    return ref.gather(-1, gen.completion_ids[..., None]).squeeze(-1)


def test_shared_prompt_cache_gives_the_same_logprobs_as_a_full_forward():
    from evotrainer.trainer.logprobs import completion_logprobs
    from evotrainer.policy.generate import select_rows
    tok = build_tokenizer()
    model = build_model(len(tok), seed=1)
    ids, mask = encode_prompts(tok, ["1+2=", "345+678=", "12+34="])  # left padding in play
    gen = generate(model, ids, mask, max_new_tokens=6, stop_ids=tok.eos_token_id, pad_id=tok.pad_token_id,
                   temperature=1.0, generator=torch.Generator().manual_seed(0), repeats=4)
    assert gen.completion_ids.shape[0] == 12 and gen.prompt_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    logp, ent = completion_logprobs(model, gen, 1.0, with_entropy=True)
    ref_logp = full_forward_logprobs(model, gen)
    m = gen.completion_mask.bool()
    assert torch.allclose(logp[m], ref_logp[m], atol=1e-4)
    # the sampler's own log-probs agree too (they are the evidence records' source)
    assert torch.allclose(gen.logprobs[m], ref_logp[m], atol=1e-4)
    # selecting rows keeps only the prompts they answer
    sub = select_rows(gen, torch.tensor([5, 6, 9]))
    assert sub.prompt_ids.shape[0] == 2 and sub.prompt_index.tolist() == [0, 0, 1]
    sub_logp, _ = completion_logprobs(model, sub, 1.0)
    assert torch.allclose(sub_logp, logp[[5, 6, 9]], atol=1e-5)


class _Boom:
    """A pickle that runs code when loaded (what a hostile harness could leave as weights)."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_never_runs_code_when_loaded(tmp_path):
    import pickle
    import pytest
    ckpt = tmp_path / "ckpt"
    tok = build_tokenizer()
    save_policy(build_model(len(tok)), tok, ckpt)
    (ckpt / "model.safetensors").unlink()  # weights only as a pickle, which would run code
    marker = tmp_path / "ran"
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Boom(str(marker))}, protocol=2))
    with pytest.raises(Exception):
        load_policy(ckpt)
    assert not marker.exists()
