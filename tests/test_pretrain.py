import json
import shutil

import pytest

from evotrainer.catalog import get_task
from evotrainer.trainer.pretrain import (PretrainConfig, PretrainFailed, announce, base_path, cache_key, pretrain,
                                         resolved, stages_to_build)
from evotrainer.policy import build_model, load_policy
from evotrainer.tasks.keys import key_path, split_key


@pytest.mark.slow
def test_pretrain_is_cached_and_deterministic(tmp_path):
    task = get_task("arith", 2)
    cfg = PretrainConfig(max_steps=4, check_every=2, probe_size=8, batch_size=16, target_acc=1.0)
    with pytest.raises(PretrainFailed, match="short of target_acc 1"):  # a base RL cannot use is never cached
        pretrain(task, cfg, tmp_path / "a")
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["keys"]  # the base's split key, and no base
    path, meta = pretrain(task, cfg, tmp_path / "a", require_target=False)
    assert meta["steps"] == 4 and meta["sft_levels"] == [1, 2]
    assert json.loads((path / "base_meta.json").read_text()) == meta
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    again, meta2 = pretrain(task, cfg, tmp_path / "a", require_target=False)  # served from the cache, not retrained
    assert again == path and meta2 == meta and (path / "model.safetensors").stat().st_mtime_ns == stamp
    # the same config elsewhere, with the same split key, gives the same weights (a new cache
    # makes a new key: another held-out pool, so other training problems)
    shutil.copytree(tmp_path / "a" / "keys", tmp_path / "b" / "keys")
    other, _ = pretrain(task, cfg, tmp_path / "b", require_target=False)
    m1, _ = load_policy(path)
    m2, _ = load_policy(other)
    assert all((p1 == p2).all() for p1, p2 in zip(m1.parameters(), m2.parameters()))
    # a different config is a different cache entry
    path3, _ = pretrain(task, PretrainConfig(**{**cfg.__dict__, "seed": 1}), tmp_path / "a", require_target=False)
    assert path3 != path


@pytest.mark.slow
def test_pretrain_stops_at_the_target_accuracy(tmp_path):
    task = get_task("arith", 1)
    # 1-digit sums are learnt quickly; a low target stops long before max_steps
    cfg = PretrainConfig(max_steps=400, check_every=10, probe_size=20, batch_size=64, target_acc=0.3)
    seen = []
    path, meta = pretrain(task, cfg, tmp_path / "a", progress=lambda p: seen.append(p.step))
    assert meta["probe_acc"] >= 0.3 and meta["steps"] < 400
    # the smoothed mean of 3 checks describes the model at its middle check, which is the base
    assert meta["steps"] == seen[-1] - cfg.check_every
    cut_cfg = PretrainConfig(**{**cfg.__dict__, "max_steps": meta["steps"]})
    # the same SFT cut off at that step, on the same training problems (the same split key)
    same = key_path(base_path(task, cut_cfg, tmp_path / "b").name, tmp_path / "b")
    same.parent.mkdir(parents=True)
    same.write_text(split_key(path.name, tmp_path / "a").hex())
    cut, _ = pretrain(task, cut_cfg, tmp_path / "b", require_target=False)
    m1, _ = load_policy(path)
    m2, _ = load_policy(cut)
    assert all((p1 == p2).all() for p1, p2 in zip(m1.parameters(), m2.parameters()))


def test_sft_stuck_below_half_the_target_restarts_only_where_the_target_is_required(tmp_path, monkeypatch):
    import evotrainer.trainer.pretrain as pretrain_mod
    inits = []
    monkeypatch.setattr(pretrain_mod, "build_model", lambda *a, **k: inits.append(k["seed"]) or build_model(*a, **k))
    task = get_task("arith", 2)
    stuck = PretrainConfig(max_steps=4, check_every=2, probe_size=8, batch_size=16, target_acc=1.0, patience=2,
                           restarts=1)
    with pytest.raises(PretrainFailed):  # gave up at step 2, a new init ran to max_steps, still short
        pretrain(task, stuck, tmp_path, require_target=True)
    assert len(inits) == 2 and inits[0] != inits[1]
    inits.clear()
    # kept short of the target: one capped attempt, as announced ("at most max_steps")
    _, meta = pretrain(task, stuck, tmp_path, require_target=False)
    assert meta["attempts"] == 1 and meta["steps"] == 4 and len(inits) == 1


@pytest.mark.slow
def test_a_task_may_stop_sft_on_sampled_accuracy_and_its_bases_get_their_own_key(tmp_path):
    """RL samples, so a multi-turn task's SFT stop can read accuracy as sampled (vault: a base
    probed 37% greedy was right 0.6% of the time at temperature 1). The probe really samples at
    the task's temperature, and such a base never shares a cache entry with a greedy-probed one."""
    import copy
    from evotrainer.trainer.pretrain import probe_accuracy
    task = get_task("arith", 1)
    cfg = PretrainConfig(max_steps=400, check_every=10, probe_size=20, batch_size=64, target_acc=0.5)
    path, _ = pretrain(task, cfg, tmp_path, require_target=False)
    model, tok = load_policy(path)
    stream = task.train_stream(7)
    probe = [stream.draw(1) for _ in range(100)]
    hot = copy.copy(task)
    hot.sft_probe_temperature = 1000.0  # next to uniform over the vocabulary: almost never right
    greedy = probe_accuracy(model, tok, task, probe, seed=0)
    # SFT stopped once 20 probe problems hit 0.5; on 100 others that reads 0.5 +- ~0.11 (seen: 0.38)
    assert greedy >= 0.25 and probe_accuracy(model, tok, hot, probe, seed=0) < greedy / 4
    assert base_path(hot, cfg, tmp_path) != base_path(task, cfg, tmp_path)
    from evotrainer.trainer.pretrain import resolved
    vault = get_task("vault")   # its own stop: 10% sampled at temperature 1; arith keeps 25% greedy
    assert (vault.sft_probe_temperature, resolved(vault, PretrainConfig()).target_acc) == (1.0, 0.1)
    assert resolved(task, PretrainConfig()).target_acc == 0.25 and resolved(task, cfg).target_acc == 0.5


def test_each_task_builds_its_default_base_its_own_way_and_says_so_before_sft(tmp_path):
    arith3 = get_task("arith", 3)
    assert resolved(arith3, PretrainConfig()).warm_start == 2  # 3 digits from scratch: a long plateau
    assert resolved(get_task("arith", 2), PretrainConfig()).warm_start == 0
    assert resolved(arith3, PretrainConfig(warm_start=0)).warm_start == 0  # an explicit 0: from scratch
    swe = get_task("swe-mini")
    own = resolved(swe, PretrainConfig())  # short, one small probe at the end: its episodes are what cost
    assert (own.max_steps, own.batch_size, own.check_every, own.probe_size, swe.sft_require_target) == \
        (150, 16, 150, 20, False)
    assert resolved(get_task("arith", 2), PretrainConfig()).probe_size == 200
    # recipes that did not change keep their cache keys, so bases already built stay valid
    assert [cache_key(get_task("arith", 2), PretrainConfig()), cache_key(get_task("vault"), PretrainConfig()),
            cache_key(arith3, PretrainConfig(target_acc=0.05, warm_start=2)),
            cache_key(swe, PretrainConfig(max_steps=250, batch_size=32, check_every=50, probe_size=200))] == \
        ["914ec1475fba", "436ce22db219", "6cd2ca3af255", "2903f290b125"]
    stages = stages_to_build(arith3, PretrainConfig(), tmp_path)
    assert [s.label for s in stages] == ["arith level 2 from scratch", "arith level 3 from level 2's base"]
    text = announce(stages)
    assert "arith level 2 from scratch to 25% of a train probe, then arith level 3" in text
    assert f"about {sum(s.typical for s in stages)} SFT steps" in text and "\n" not in text
    assert all(s.typical > 0 for s in stages)
    # the main job's weak base (stopped at 5%) was measured too
    weak = stages_to_build(arith3, PretrainConfig(target_acc=0.05, warm_start=2), tmp_path)
    assert [s.typical for s in weak] == [320, 170] and "measured: about 490 SFT steps" in announce(weak)
    # another recipe was not measured: the cap is said instead of a time
    assert "not measured for this recipe: at most 3000 SFT steps" in announce(
        stages_to_build(arith3, PretrainConfig(target_acc=0.4), tmp_path))
    # a stage already cached is not built again
    two = base_path(get_task("arith", 2), PretrainConfig(), tmp_path)
    two.mkdir(parents=True)
    (two / "base_meta.json").write_text("{}")
    assert [s.label for s in stages_to_build(arith3, PretrainConfig(), tmp_path)] == ["arith level 3 from level 2's base"]
