"""Tasks: the arith generator and verifier, splits, train streams, the reasoning-gym adapter."""
import json
import random

import pytest

from evotrainer.catalog import get_task
from evotrainer.errors import UsageError
from evotrainer.tasks.arith import ArithTask


class FixedRng:
    """Hands out the given operands in order, to pin a specific problem."""

    def __init__(self, *values):
        self.values = list(values)

    def randrange(self, lo, hi):
        v = self.values.pop(0)
        assert lo <= v < hi
        return v


# --------------------------------------------------------------------------- arith

def test_arith_answer_is_reversed_sum_and_verifier():
    task = get_task("arith")
    p = task.generate(FixedRng(123, 459), 3)
    assert (p.id, p.prompt, p.answer, p.level) == ("123+459", "123+459=", "285", 3)  # 582 reversed
    assert task.score(p, "285") == 1.0
    assert task.score(p, "582") == 0.0   # the sum written the usual way is wrong
    assert task.score(p, "28") == 0.0
    assert task.score(p, "2850") == 0.0
    assert task.score(p, "") == 0.0
    # carry into a new digit: 999+1 -> 1000 -> "0001"
    q = task.generate(FixedRng(999, 100), 3)
    assert q.answer == "9901"  # 1099 reversed
    assert task.score(q, "9901") == 1.0


def test_arith_reference_answers_score_one():
    task = get_task("arith")
    for p in task.split("val", n=50):
        assert task.score(p, p.answer) == 1.0
        assert task.score(p, p.answer + "1") == 0.0


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5, 6])
def test_arith_level_is_operand_digits(level):
    task = ArithTask()
    rng = random.Random(level)
    lens = set()
    for _ in range(300):
        p = task.generate(rng, level)
        a, b = p.id.split("+")
        lens |= {len(a), len(b)}
        assert p.level == level
        assert p.answer == p.answer.lstrip() and p.prompt == f"{a}+{b}="
    assert lens == {level}  # no leading zeros, no shorter operands


def test_arith_splits_sizes_unique_disjoint():
    task = get_task("arith")
    assert task.target_level == 3
    val, test = task.split("val"), task.split("test")
    assert len(val) == 500 and len(test) == 500
    v, t = {p.id for p in val}, {p.id for p in test}
    assert len(v) == 500 and len(t) == 500
    assert not v & t
    assert all(p.level == 3 for p in val + test)


def test_arith_splits_reproducible():
    a, b = get_task("arith"), get_task("arith")
    assert [p.id for p in a.split("val")] == [p.id for p in b.split("val")]
    assert [p.id for p in a.split("test")] == [p.id for p in b.split("test")]
    # other levels too, and each level has its own split
    assert [p.id for p in a.split("val", level=2)] == [p.id for p in b.split("val", level=2)]
    assert {p.id for p in a.split("val", level=2)}.isdisjoint({p.id for p in a.split("test", level=2)})
    with pytest.raises(ValueError):
        a.split("train")


def test_arith_test_subset_disjoint_from_full_val():
    # split(which, level, n) promises disjoint splits; a smaller test draw (n=100) must not
    # contain problems of the full validation split. Level 2 (8100 problems) makes overlaps likely.
    task = get_task("arith", 2)
    val = {p.id for p in task.split("val")}
    for n in (100, 200):
        test = {p.id for p in task.split("test", n=n)}
        assert len(test) == n
        assert not test & val, f"test(n={n}) shares {len(test & val)} problems with val"


def test_arith_train_stream_never_yields_held_out(monkeypatch):
    task = get_task("arith", 2)  # 90*90 = 8100 problems, 1000 of them in val and test
    held = {p.id for s in ("val", "test") for p in task.split(s)}
    assert len(held) == 1000 and all(task.held_out(p) for s in ("val", "test") for p in task.split(s))
    # the test has teeth: plain draws at this level hit val/test often
    rng = random.Random(0)
    raw_hits = sum(task.generate(rng, 2).id in held for _ in range(3000))
    assert raw_hits > 100
    # a training stream (what a worker runs beside harness code) never builds a split ...
    monkeypatch.setattr(type(task), "split", lambda *a, **k: pytest.fail("the train stream built a split"))
    stream = task.train_stream(seed=0)
    drawn = [stream.draw(2) for _ in range(3000)]
    # ... and still never yields a held-out problem, nor anything from the held-out pool
    assert all(p.level == 2 for p in drawn)
    assert not {p.id for p in drawn} & held and not any(task.held_out(p) for p in drawn)
    # batch() honours the per-item level
    assert [p.level for p in stream.batch([2, 3, 2])] == [2, 3, 2]


def test_tiny_levels_still_have_disjoint_splits():
    task = get_task("arith", 1)  # 100 problems: a held-out pool of about 25
    val, test = task.split("val"), task.split("test")
    assert len(val) == 12 and 5 <= len(test) <= 12  # the pool is hashed: test gets what val leaves
    assert not {p.id for p in val} & {p.id for p in test}


def test_arith_train_streams_seeded():
    task = get_task("arith")

    def ids(seed):
        stream = task.train_stream(seed)
        return [stream.draw(3).id for _ in range(50)]

    assert ids(0) == ids(0)
    assert len(set(ids(0)) & set(ids(1))) < 5  # 810000 problems: different seeds, different streams
    # iterating a stream draws at the task's target level
    it = iter(task.train_stream(0))
    assert [next(it).id for _ in range(50)] == ids(0)


def test_arith_splits_and_streams_are_pinned():
    # other runs' evidence and checkpoints refer to these problems: they must never move
    # (the train stream moved once, on purpose, when streams became indexed for split keys)
    task = get_task("arith")
    assert (task.name, task.spec, task.max_new_tokens) == ("arith", "arith", 9)
    assert [p.id for p in task.split("val")[:4]] == ["820+702", "701+580", "597+940", "602+333"]
    assert [p.id for p in task.split("test")[:4]] == ["563+793", "573+495", "906+422", "537+439"]
    assert task.train_stream(0).draw(3).id == "988+700"


def test_a_split_key_picks_val_and_test_from_the_public_pool_and_a_worker_trains_on_handed_indices(monkeypatch):
    from evotrainer.tasks.base import train_draws
    public, a, b = get_task("arith", 2), get_task("arith", 2), get_task("arith", 2)
    a.use_key(b"\x01" * 32)
    b.use_key(b"\x02" * 32)
    held = {t: {p.id for s in ("val", "test") for p in t.split(s)} for t in (public, a, b)}
    # the pool is public (about 2060 problems here); each key scores another 1000 of them, so
    # two keys share about half (1000 x 1000 / 2060), not all
    assert all(len(h) == 1000 for h in held.values())
    assert 350 < len(held[a] & held[b]) < 650 and 350 < len(held[a] & held[public]) < 650
    assert all(public.held_out(p) for p in a.split("val") + b.split("test"))
    # the controller (with the key) draws indices; the worker (no key) rebuilds the same problems
    draws = train_draws(a, seed=5, per_level=300)
    worker = get_task("arith", 2)
    worker.use_draws({str(lv): ix for lv, ix in draws.items()})
    ref = a.train_stream(5)
    want = [ref.draw(lv).id for lv in [2, 3, 2] * 100]
    monkeypatch.setattr(type(worker), "held_out", lambda *_: pytest.fail("a worker computed held_out"))
    stream = worker.train_stream(5)
    got = [stream.draw(lv) for lv in [2, 3, 2] * 100]
    assert [p.id for p in got] == want
    assert not {p.id for p in got} & held[a]
    with pytest.raises(RuntimeError, match="used up"):
        for _ in range(200):
            stream.draw(2)


def test_split_keys_are_kept_private_and_stable(tmp_path):
    from evotrainer.tasks.keys import key_digest, key_dir, split_key
    k = split_key("base-arith-3-abc", tmp_path)
    assert len(k) == 32 and split_key("base-arith-3-abc", tmp_path) == k != split_key("other", tmp_path)
    assert key_dir(tmp_path).stat().st_mode & 0o777 == 0o700
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in key_dir(tmp_path).iterdir())
    assert key_digest(k) == key_digest(bytes(k)) != key_digest(split_key("other", tmp_path))


def test_arith_bad_level_is_usage_error():
    with pytest.raises(UsageError, match="level"):
        get_task("arith", 9)
    assert get_task("arith", 5).target_level == 5


# --------------------------------------------------------------------------- reasoning gym

def test_rg_families_listed():
    from reasoning_gym.factory import DATASETS
    assert "chain_sum" in DATASETS and "basic_arithmetic" in DATASETS


@pytest.mark.parametrize("family", ["chain_sum", "basic_arithmetic"])
def test_rg_reference_scores_one_and_garbage_zero(family):
    task = get_task(f"rg:{family}")
    assert task.name == task.spec == f"rg:{family}" and task.levels == (0,)
    probs = task.split("val", n=10)
    assert len(probs) == 10
    for p in probs:
        assert p.prompt.startswith(p.id) and p.answer
        assert task.score(p, p.answer) == 1.0
        assert task.score(p, " " + p.answer + "\n") == 1.0
        assert task.score(p, "garbage") == 0.0
        assert task.score(p, "") == 0.0
        assert task.score(p, str(int(p.answer) + 1)) == 0.0  # off by one is wrong


def test_rg_levels_are_the_familys_curriculum_and_a_bad_level_names_the_valid_ones():
    default, lv1, lv2 = get_task("rg:chain_sum"), get_task("rg:chain_sum", 1), get_task("rg:chain_sum", 2)
    assert default.levels == (0,) and lv2.levels[:2] == (1, 2) and lv2.target_level == 2
    rng = random.Random(0)
    one = [lv1.generate(rng, 1) for _ in range(30)]
    two = [lv2.generate(rng, 2) for _ in range(60)]
    terms = lambda p: p.id.count(" + ") + p.id.count(" - ") + 1  # noqa: E731
    assert {terms(p) for p in one} == {2} and all(abs(int(p.answer)) <= 18 for p in one)  # 2 terms of 1 digit
    assert {terms(p) for p in two} == {2, 3}                                              # 2-3 terms of 1-2 digits
    assert all(lv2.score(p, p.answer) == 1.0 for p in two)
    with pytest.raises(UsageError, match=r"level 40 is not a level of rg:chain_sum; valid levels: 0 .* or 1\.\.11"):
        get_task("rg:chain_sum", 40)


def test_rg_unknown_family_lists_valid_ones():
    with pytest.raises(UsageError) as e:
        get_task("rg:no_such_family")
    msg = str(e.value)
    assert "'no_such_family'" in msg
    assert "chain_sum" in msg and "basic_arithmetic" in msg


def test_rg_splits_reproducible_and_disjoint():
    a, b = get_task("rg:chain_sum"), get_task("rg:chain_sum")
    va, ta = a.split("val"), a.split("test")
    assert len(va) == 200 and len(ta) == 200
    assert [p.id for p in va] == [p.id for p in b.split("val")]
    assert [p.answer for p in ta] == [p.answer for p in b.split("test")]
    v, t = {p.id for p in va}, {p.id for p in ta}
    assert len(v) == 200 and len(t) == 200 and not v & t
    stream = a.train_stream(seed=0)
    assert not {stream.draw(0).id for _ in range(50)} & (v | t)


def test_rg_budget_fits_the_familys_answers():
    # the budget comes from the family's answers (no longer a fixed 16): every reference
    # answer fits with room for the end token, and a family with long answers gets more
    short, long = get_task("rg:chain_sum"), get_task("rg:spell_backward")
    for task in (short, long):
        answers = [p.answer for p in task.split("val", n=100)]
        assert max(map(len, answers)) < task.max_new_tokens
    assert long.max_new_tokens > short.max_new_tokens


def test_rg_sft_cap_shrinks_with_the_longest_rows_so_every_base_builds_in_about_the_same_time():
    from evotrainer.tasks.reasoning_gym import SFT_CHARS, SFT_STEPS
    from evotrainer.trainer.pretrain import PretrainConfig, resolved
    short, mix = get_task("rg:chain_sum"), get_task("rg:composite")
    longest = lambda t: max(len(p.prompt) + len(p.answer) for p in t.split("val", n=100))  # noqa: E731
    assert longest(mix) > 2 * longest(short)  # leg_counting's questions pad the mix's batches
    assert short.sft_max_steps == SFT_STEPS[1] and SFT_STEPS[0] < mix.sft_max_steps < SFT_STEPS[1] / 2
    assert abs(mix.sft_max_steps * longest(mix) - SFT_CHARS) < 0.2 * SFT_CHARS  # the characters SFT reads
    assert resolved(mix, PretrainConfig()).max_steps == mix.sft_max_steps  # the base's recipe, and its key
    assert resolved(mix, PretrainConfig(max_steps=500)).max_steps == 500  # a config's own cap stands


def test_rg_composite_mixes_families_each_scored_by_its_own_and_its_spec_names_the_mix():
    task = get_task("rg:composite")
    assert task.spec == "rg:composite?families=basic_arithmetic:1,chain_sum:1,leg_counting:1"
    assert get_task(task.spec).spec == task.spec  # a worker rebuilds the same task from its spec
    probs = task.split("val", n=60)
    sources = {p.entry["metadata"]["source_dataset"] for p in probs}
    assert sources == {"basic_arithmetic", "chain_sum", "leg_counting"}
    assert all(task.score(p, p.answer) == 1.0 and task.score(p, "garbage") == 0.0 for p in probs)
    assert {p.id for p in probs}.isdisjoint(p.id for p in task.split("test", n=60))

    weighted = get_task("rg:composite?families=chain_sum:9,leg_counting")
    assert weighted.spec == "rg:composite?families=chain_sum:9,leg_counting:1"
    counts = [p.entry["metadata"]["source_dataset"] for p in weighted.split("val", n=100)]
    assert counts.count("chain_sum") > 70 and "basic_arithmetic" not in counts  # weights, and only the named


@pytest.mark.parametrize("spec, message", [
    ("rg:composite?families=nope", r"unknown reasoning-gym family in rg:composite's families 'nope'; valid choices: .*chain_sum"),
    ("rg:composite?families=chain_sum:0", r"weight of chain_sum .* must be a positive number, got '0'"),
    ("rg:composite?families=chain_sum,chain_sum:2", r"chain_sum is named twice"),
    ("rg:chain_sum?families=leg_counting", r"unknown option 'families' .*valid options: max_new_tokens"),
])
def test_rg_composite_bad_mix_is_one_usage_error(spec, message):
    with pytest.raises(UsageError, match=message):
        get_task(spec)


# --------------------------------------------------------------------------- registry

def test_unknown_task_names_valid_tasks():
    with pytest.raises(UsageError) as e:
        get_task("nope")
    msg = str(e.value)
    assert "'nope'" in msg and "arith" in msg and "rg:" in msg
    assert "jsonl:PATH" in msg and "module:Factory" in msg and "file.py:Factory" in msg


def test_handed_draws_cover_the_levels_the_harness_curriculum_can_pick(tmp_path):
    from helpers import write_harness
    from evotrainer.trainer.jobs import handed_draws
    task = get_task("arith", 3)
    assert set(handed_draws(task, None, 1, 5)) == {"3"}  # the reference: fixed at the target level
    h = write_harness(tmp_path / "h", small=False, train_levels=[2, 3, 9])
    draws = handed_draws(task, h, 1, 5)
    # 9 is no level of the task: the worker's curriculum check refuses it, the controller does not crash
    assert set(draws) == {"2", "3"} and all(len(ix) == 7 * 64 + 16 for ix in draws.values())
    (h / "curriculum.py").write_text("def mine(s):\n    return {1: 1.0}\n")  # its own: it may pick any level
    assert set(handed_draws(task, h, 1, 5)) == {str(lv) for lv in task.levels}


@pytest.mark.slow
def test_rg_composite_trains_and_the_evaluator_scores_its_held_out_mix(tmp_path, tiny_qwen, capsys):
    from helpers import here, write_harness
    out = tmp_path / "out"
    h = write_harness(tmp_path / "h")  # a few prompts a step: the mix's plumbing, not its learning
    summary = here(capsys, "train", "--task", "rg:composite", "--model", tiny_qwen, "--harness", h, "--steps", 2,
                   "--out", out).json
    records = [json.loads(line) for line in (out / "evidence.jsonl").read_text().splitlines()]
    assert {r["prompt"] != "" for r in records} == {True} and 0 <= summary["val"] <= 1 and 0 <= summary["test"] <= 1
    assert json.loads((out / "run.json").read_text())["task"].startswith("rg:composite?families=")
