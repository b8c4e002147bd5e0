"""The segment cache (evolve/segment_cache.py): a segment's key holds what determines it and
nothing else; a second request reuses the stored outcome, inside a run and across runs that
share a cache, and a run's numbers are the same with the cache and without it."""
import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml

from helpers import tiny_run_config, write_harness
from evotrainer.config import config_from_dict
from evotrainer.errors import UsageError
from evotrainer.evolve.segment_cache import (KEY_FILE, SegmentCache, SegmentInputs, segment_key, start_identity,
                                             tree_digest)
from evotrainer.evolve.state import Clock, Segment, SegmentFailed, State

INPUTS = SegmentInputs(start="files:abc", harness="h1", seed=1001, replica=0, steps=2, task='["arith", []]',
                       level=1, draws="d1", runtime={"backend": "embedded", "threads": 1}, eval_every=1)


# ---------------------------------------------------------------------------- the key


@pytest.mark.parametrize("change", [
    {"start": "segment:k2"}, {"harness": "h2"}, {"seed": 1002}, {"replica": 1}, {"steps": 3},
    {"task": '["arith", ["x"]]'}, {"level": 2}, {"draws": "d2"}, {"eval_every": 2}, {"version": "9.9"},
    {"runtime": {"backend": "embedded", "threads": 2}}, {"runtime": {"backend": "trl", "threads": 1}},
])
def test_the_key_changes_with_every_input_that_determines_the_outcome(change):
    assert segment_key(dataclasses.replace(INPUTS, **change)) != segment_key(INPUTS)


def test_the_key_is_the_same_for_the_same_inputs_whatever_their_order():
    same = dataclasses.replace(INPUTS, runtime={"threads": 1, "backend": "embedded"})
    assert segment_key(same) == segment_key(INPUTS) == segment_key(dataclasses.replace(INPUTS))


def test_a_harness_digest_is_its_files_bytes_not_its_path_or_bytecode(tmp_path):
    a = write_harness(tmp_path / "a")
    b = write_harness(tmp_path / "b")                      # a renamed copy: one harness
    (b / "__pycache__").mkdir()
    (b / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert tree_digest(a) == tree_digest(b)
    (b / "knobs.yaml").write_text((b / "knobs.yaml").read_text() + "\n")  # one byte more: another harness
    assert tree_digest(a) != tree_digest(b)


def test_a_start_is_named_by_the_entry_its_directory_holds_else_by_its_bytes(tmp_path):
    d = tmp_path / "seed-0"
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "model.bin").write_bytes(b"weights")
    assert start_identity(d / "checkpoint") == f"files:{tree_digest(d / 'checkpoint')}"
    (d / KEY_FILE).write_text("k1\n")
    assert start_identity(d / "checkpoint") == "segment:k1"


# ---------------------------------------------------------------------------- entries


def _train_dir(path: Path, text: str = "w") -> Path:
    (path / "checkpoint").mkdir(parents=True)
    (path / "checkpoint" / "model.bin").write_text(text)
    (path / "evidence.jsonl").write_text("{}\n")
    (path / "run.json").write_text(json.dumps({"task": "arith"}))
    (path / "worker.log").write_text("the job's own log\n")
    return path


def test_an_entry_is_whole_or_ignored_and_its_materialised_copy_is_marked(tmp_path):
    cache = SegmentCache(tmp_path / "cache")
    out = _train_dir(tmp_path / "a")
    assert cache.lookup("k1") is None and not cache.materialise("k1", tmp_path / "b")
    cache.store("k1", out)
    assert (out / KEY_FILE).read_text().strip() == "k1"     # `out` is exactly the entry now
    assert not (cache.entry("k1") / "worker.log").exists()   # the run's account of the job is not its outcome
    for rel in ("checkpoint/model.bin", "evidence.jsonl", "run.json"):  # held once: `out` links the entry's files
        assert (out / rel).stat().st_ino == (cache.entry("k1") / rel).stat().st_ino
    assert (out / "worker.log").read_text() == "the job's own log\n" and cache.lookup("k1") is not None
    assert cache.materialise("k1", tmp_path / "b")
    b = tmp_path / "b"
    assert (b / "checkpoint" / "model.bin").read_text() == "w" and (b / KEY_FILE).read_text().strip() == "k1"
    if os.geteuid() != 0:  # a link to the entry cannot be written through (root may write anything)
        with pytest.raises(PermissionError):
            (b / "evidence.jsonl").write_text("changed")
    # a truncated file: the entry is ignored (the segment trains again), then replaced whole
    entry = cache.entry("k1")
    (entry / "evidence.jsonl").chmod(0o644)
    (entry / "evidence.jsonl").write_text("")
    assert cache.lookup("k1") is None and not cache.materialise("k1", tmp_path / "c")
    cache.store("k1", _train_dir(tmp_path / "a2"))  # (not `out`: it links the entry, so it was truncated too)
    assert cache.lookup("k1") is not None
    assert not list(entry.parent.glob(".tmp-*"))              # nothing half-built left beside it


def test_a_lost_race_with_other_content_leaves_the_directory_unmarked(tmp_path):
    cache = SegmentCache(tmp_path / "cache")
    cache.store("k1", _train_dir(tmp_path / "a", "first"))
    late = _train_dir(tmp_path / "b", "other")
    cache.store("k1", late)
    assert not (late / KEY_FILE).exists()   # its children name their start by its bytes
    assert (cache.entry("k1") / "checkpoint" / "model.bin").read_text() == "first"


def test_the_jobs_that_train_beside_reused_ones_keep_the_whole_batchs_threads():
    from evotrainer.executors import LocalPool
    pool = LocalPool()
    assert pool.part_of(4).threads(1) == pool.threads(4) and pool.part_of(1).threads(1) == pool.threads(1)
    assert LocalPool(3).part_of(8) == LocalPool(3)


def test_what_a_job_wrote_to_claim_an_entry_or_leak_a_file_is_never_stored(tmp_path):
    cache = SegmentCache(tmp_path / "cache")
    forged = _train_dir(tmp_path / "a")
    (forged / KEY_FILE).write_text("someone-elses-key\n")  # the harness's own claim: dropped, then marked honestly
    cache.store("k1", forged)
    assert (forged / KEY_FILE).read_text().strip() == "k1" and not (cache.entry("k1") / KEY_FILE).exists()
    leaky = _train_dir(tmp_path / "b")
    (tmp_path / "secret").write_text("split key")
    (leaky / "checkpoint" / "extra").symlink_to(tmp_path / "secret")  # a copy would follow it
    (leaky / KEY_FILE).write_text("k1\n")
    cache.store("k2", leaky)
    assert cache.lookup("k2") is None and not (leaky / KEY_FILE).exists()


# ---------------------------------------------------------------------------- the config


@pytest.mark.parametrize("value, want", [("run", "cache"), ("off", None), (False, None), (True, "cache"),
                                         ("/srv/shared-cache", "/srv/shared-cache")])
def test_the_cache_key_of_a_run_config(tmp_path, value, want):
    cfg = config_from_dict({"task": "arith", "cache": value}).validate()
    got = cfg.cache_dir(tmp_path)
    assert got == (None if want is None else tmp_path / want if want == "cache" else Path(want))


def test_a_bad_cache_value_is_one_line_naming_the_choices(tmp_path):
    with pytest.raises(UsageError, match=r"'cache' must be run .*, off, or an absolute directory path"):
        config_from_dict({"task": "arith", "cache": "relative/dir"}).validate()
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is a file"):
        config_from_dict({"task": "arith", "cache": str(tmp_path / "f")}).validate()


# ---------------------------------------------------------------------------- Training.train


def _training(tmp_path: Path, ckpt: Path, cache: Path | None, harness: Path):
    from evotrainer.catalog import get_task
    from evotrainer.evolve.training import Training
    from evotrainer.runtime import Runtime
    cfg = config_from_dict({"task": "arith", "level": 1, "seeds": [0], "final_seeds": [],
                            "budget": {"steps_per_segment": 2, "total_steps": 6, "trial_timeout_s": 120},
                            "evaluation": {"every": 1}}).validate()
    return Training(cfg, get_task("arith", 1), Runtime(), str(ckpt), tmp_path, lambda v: harness,
                    cache=None if cache is None else SegmentCache(cache))


def _first_and_again(tmp_path: Path, ckpt: Path):
    """One segment from the base, trained, then asked for again: (training, clock, both states)."""
    harness = write_harness(tmp_path / "h")
    training = _training(tmp_path, ckpt, tmp_path / "cache", harness)
    root = State("v0", 0, {}, {}, {})
    clock = Clock()
    (first,) = training.train([Segment("v0", root, 1, tmp_path / "a")], clock)
    assert (clock.trained, clock.reused) == (1, 0)
    (again,) = training.train([Segment("v0", root, 1, tmp_path / "b")], clock)
    return training, clock, first, again


def test_the_same_segment_twice_trains_once_and_scores_alike(tmp_path, ckpt):
    _, clock, first, again = _first_and_again(tmp_path, ckpt)
    assert (clock.trained, clock.reused) == (1, 1) and clock.steps == 2
    assert (again.val, again.test) == (first.val, first.test)
    a, b = tmp_path / "a" / "seed-0", tmp_path / "b" / "seed-0"
    assert "reused from the segment cache" in (b / "worker.log").read_text()
    assert tree_digest(a, skip=("worker.log",)) == tree_digest(b, skip=("worker.log",))
    assert clock.budgets()["segments_trained"] == 1 and clock.budgets()["segments_reused"] == 1


@pytest.mark.slow
def test_continued_segments_are_reused_and_the_numbers_match_the_cache_off(tmp_path, ckpt):
    training, clock, first, again = _first_and_again(tmp_path, ckpt)
    harness = tmp_path / "h"
    root = State("v0", 0, {}, {}, {})
    # continued: the child names its start by its parent's key; a second child of it is reused too
    (deeper,) = training.train([Segment("v0", first, 2, tmp_path / "c")], clock)
    (deeper2,) = training.train([Segment("v0", again, 2, tmp_path / "d")], clock)
    assert (clock.trained, clock.reused) == (2, 2) and deeper2.val == deeper.val
    # the cache off: the same numbers, everything trained
    plain = _training(tmp_path / "off", ckpt, None, harness)
    off = Clock()
    (p1,) = plain.train([Segment("v0", root, 1, tmp_path / "off" / "a")], off)
    (p2,) = plain.train([Segment("v0", p1, 2, tmp_path / "off" / "c")], off)
    assert (off.trained, off.reused) == (2, 0)
    assert (p1.val, p1.test, p2.val, p2.test) == (first.val, first.test, deeper.val, deeper.test)
    assert not (tmp_path / "off" / "a" / "seed-0" / KEY_FILE).exists()


def test_a_failed_segment_is_never_cached(tmp_path, ckpt):
    bad = write_harness(tmp_path / "bad", {"reward.py": "raise RuntimeError('a broken harness')\n"})
    training = _training(tmp_path, ckpt, tmp_path / "cache", bad)
    clock = Clock()
    (res,) = training.train([Segment("v1", State("v0", 0, {}, {}, {}), 1, tmp_path / "x")], clock)
    assert isinstance(res, SegmentFailed) and clock.trained == 1
    assert not list((tmp_path / "cache").glob("segments/*/*"))


# ---------------------------------------------------------------------------- runs sharing a cache


def _run(tmp_path: Path, ckpt: Path, name: str, cache: str):
    from evotrainer.evolve.controller import Controller
    from evotrainer.evolve.status import open_run, status
    cfg_path, _ = tiny_run_config(tmp_path / name, ckpt)
    raw = yaml.safe_load(cfg_path.read_text()) | {"cache": cache, "final_seeds": []}
    raw["budget"] |= {"trials": 2}
    run = tmp_path / name / "run"
    Controller(config_from_dict(raw).validate(), run).run()
    store = open_run(run)
    try:
        trials = [(t.id, t.label, t.fitness.get("val"), t.fitness.get("test")) for t in store.trials()]
    finally:
        store.close()
    return trials, status(run)["segments"]


@pytest.mark.slow
def test_two_runs_sharing_a_cache_train_a_segment_once_and_record_the_same_fitness(tmp_path, ckpt):
    shared = str(tmp_path / "shared-cache")
    first, first_counts = _run(tmp_path, ckpt, "one", shared)
    second, second_counts = _run(tmp_path, ckpt, "two", shared)
    off, off_counts = _run(tmp_path, ckpt, "off", "off")
    assert first == second == off
    assert first_counts["trained"] > 0 and first_counts["trained"] + first_counts["reused"] == off_counts["trained"]
    assert second_counts == {"trained": 0, "reused": off_counts["trained"]} and off_counts["reused"] == 0


# ---------------------------------------------------------------------------- retraining arms


@pytest.mark.slow
def test_a_second_arm_that_repeats_a_harness_reuses_it(tmp_path, ckpt):
    from evotrainer.catalog import get_task
    from evotrainer.config import EvalConfig
    from evotrainer.evolve.retrain import Arm, retrain
    task, cache = get_task("arith", 1), SegmentCache(tmp_path / "cache")
    same = Arm((str(write_harness(tmp_path / "h")),), 2)
    one, two = (Arm((str(write_harness(tmp_path / f"h{t}", temperature=t)),), 2) for t in (0.7, 0.8))

    def arms(out: str, **named):  # a benchmark arm's final comparison: the reference and its own winner
        return retrain(task, str(ckpt), named, [100], tmp_path / out, EvalConfig(every=1), 120, cache=cache)
    first = arms("one", reference=same, evolved=one)
    assert (first.trained, first.reused) == (2, 0)
    second = arms("two", reference=same, evolved=two)
    assert (second.trained, second.reused) == (1, 1)
    assert second.scores["reference"] == first.scores["reference"] and second.base == first.base
