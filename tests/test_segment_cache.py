"""The segment cache (evolve/segments/cache.py): a segment's key holds what determines it and
nothing else; a second request reuses the stored outcome, inside a run and across runs that
share a cache, and a run's numbers are the same with the cache and without it."""
import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml
from helpers import PARITY_TASK, tiny_run_config, write_harness

from evotrainer.config import config_from_dict
from evotrainer.errors import UsageError
from evotrainer.evolve.segments import cache as segment_cache
from evotrainer.evolve.segments.cache import (
    KEY_FILE,
    LIBRARIES,
    ScoreInputs,
    SegmentCache,
    SegmentInputs,
    digest,
    package_digest,
    segment_key,
    start_identity,
    task_identity,
    tree_digest,
)
from evotrainer.evolve.segments.state import Clock, Segment, SegmentFailed, State
from evotrainer.trainer.outputs import log_path

INPUTS = SegmentInputs(start="files:abc", harness="h1", seed=1001, replica=0, steps=2, task='["arith", []]',
                       level=1, draws="d1", runtime={"backend": "embedded", "threads": 1}, eval_every=1)


# ---------------------------------------------------------------------------- the key


@pytest.mark.parametrize("change", [
    {"start": "segment:k2"}, {"harness": "h2"}, {"seed": 1002}, {"replica": 1}, {"steps": 3},
    {"task": '["arith", ["x"]]'}, {"level": 2}, {"draws": "d2"}, {"eval_every": 2},
    {"code": {"package": "edited", "libraries": {}}},
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


# ---------------------------------------------------------------------------- the code in the key


SCORE = ScoreInputs(checkpoint="segment:k1/checkpoint", split="val", task='["arith", []]', level=1, split_key="s",
                    runtime={"threads": 1})


def _keys() -> tuple[str, str]:
    """A segment's and a score's key as this process makes them now: records built afresh, so
    their code is read again (a replace() would copy the old record's)."""
    seg = {f.name: getattr(INPUTS, f.name) for f in dataclasses.fields(INPUTS) if f.name != "code"}
    score = {f.name: getattr(SCORE, f.name) for f in dataclasses.fields(SCORE) if f.name != "code"}
    return segment_key(SegmentInputs(**seg)), digest(ScoreInputs(**score))


@pytest.fixture
def versions_read_again():
    """The libraries' versions are read once per process: read again, under the test's lookup."""
    segment_cache.library_versions.cache_clear()
    yield
    segment_cache.library_versions.cache_clear()


def test_an_edit_to_the_package_source_changes_every_key(monkeypatch):
    before = _keys()
    assert _keys() == before  # the same code, the same keys: read once, never from the clock or a path
    monkeypatch.setattr(segment_cache, "source_digest", lambda: "the package, one line edited")
    after = _keys()
    assert after[0] != before[0] and after[1] != before[1]


@pytest.mark.parametrize("library", LIBRARIES)
def test_another_version_of_a_library_that_computes_the_numbers_changes_every_key(monkeypatch, versions_read_again,
                                                                                 library):
    real = segment_cache.library_version
    before = _keys()
    segment_cache.library_versions.cache_clear()
    monkeypatch.setattr(segment_cache, "library_version", lambda name: "9.9.9" if name == library else real(name))
    after = _keys()
    assert after[0] != before[0] and after[1] != before[1]


def test_a_library_not_installed_is_absent_and_none_is_imported_to_ask():
    import subprocess
    import sys
    assert segment_cache.library_version("no-such-distribution-xyz") == "absent"
    probe = ("import sys\nfrom evotrainer.evolve.segments.cache import code_identity\ncode_identity()\n"
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_package_digest_is_its_code_and_shipped_data_wherever_it_is_installed(tmp_path):
    pkg = tmp_path / "a" / "evotrainer"
    for rel, text in {"__init__.py": "", "tasks/arith.py": "N = 3\n", "recipes/reference/knobs.yaml": "lr: 0.1\n",
                      "agents/prompts/system.md": "You are", "__pycache__/x.pyc": "\0"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    first = package_digest(pkg)
    import shutil
    shutil.copytree(pkg, tmp_path / "b" / "evotrainer")
    assert package_digest(tmp_path / "b" / "evotrainer") == first       # installed elsewhere: the same code
    (pkg / "agents" / "prompts" / "system.md").write_text("You were")   # what an agent is told: not a job's numbers
    (pkg / "__pycache__" / "x.pyc").write_text("\1")
    assert package_digest(pkg) == first
    (pkg / "recipes" / "reference" / "knobs.yaml").write_text("lr: 0.2\n")  # the reference recipe: numbers
    assert package_digest(pkg) != first
    (pkg / "recipes" / "reference" / "knobs.yaml").write_text("lr: 0.1\n")
    (pkg / "tasks" / "arith.py").write_text("N = 4\n")
    assert package_digest(pkg) != first
    assert segment_cache.PACKAGE_DIR / "evolve" / "segments" / "cache.py" == Path(segment_cache.__file__).resolve()




def test_a_user_tasks_identity_holds_its_files_bytes(tmp_path):
    from evotrainer.catalog import get_task
    (tmp_path / "parity.py").write_text(PARITY_TASK)
    task = get_task(f"{tmp_path / 'parity.py'}:Parity", 1)
    before = task_identity(task.spec, task.data_files())
    assert task_identity(task.spec, task.data_files()) == before
    (tmp_path / "parity.py").write_text(PARITY_TASK.replace('"yes"', '"even"'))  # the same spec, another task
    after = task_identity(task.spec, task.data_files())
    assert after != before
    assert segment_key(dataclasses.replace(INPUTS, task=after)) != segment_key(dataclasses.replace(INPUTS, task=before))
    assert task_identity("arith", ()) == '["arith", []]'  # a built-in: the package's code, in every key


def test_a_user_modules_identity_holds_its_modules_or_packages_bytes(tmp_path, monkeypatch):
    (tmp_path / "parity_mod_xyz.py").write_text(PARITY_TASK)
    (tmp_path / "parity_pkg_xyz" / "sub").mkdir(parents=True)
    (tmp_path / "parity_pkg_xyz" / "__init__.py").write_text("from parity_pkg_xyz.sub.impl import Parity\n")
    (tmp_path / "parity_pkg_xyz" / "sub" / "impl.py").write_text(PARITY_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod, pkg = task_identity("parity_mod_xyz:Parity", ()), task_identity("parity_pkg_xyz:Parity", ())
    assert mod != task_identity("parity_pkg_xyz.sub.impl:Parity", ())  # where the code is, too
    (tmp_path / "parity_mod_xyz.py").write_text(PARITY_TASK + "\n# edited\n")
    (tmp_path / "parity_pkg_xyz" / "sub" / "impl.py").write_text(PARITY_TASK + "\n# edited\n")  # a module inside
    assert task_identity("parity_mod_xyz:Parity", ()) != mod and task_identity("parity_pkg_xyz:Parity", ()) != pkg
    assert "parity_mod_xyz" not in __import__("sys").modules  # found, not imported


def test_the_code_of_a_task_is_the_users_only():
    import evotrainer.catalog  # noqa: F401  (the environment families, as a run has them)
    from evotrainer.tasks.registry import user_code_files
    json_module = user_code_files("json.decoder:JSONDecoder")
    assert json_module and user_code_files("trl-env:json.decoder:JSONDecoder") == json_module  # a family's factory
    for builtin in ("arith", "vault?tool=on", "rg:chain_sum", "jsonl:/data/rows.jsonl?verifier=exact",
                    "textarena:GuessTheNumber-v0"):
        assert user_code_files(builtin) == (), builtin


# ---------------------------------------------------------------------------- entries


def _train_dir(path: Path, text: str = "w") -> Path:
    (path / "checkpoint").mkdir(parents=True)
    (path / "checkpoint" / "model.bin").write_text(text)
    (path / "evidence.jsonl").write_text("{}\n")
    (path / "run.json").write_text(json.dumps({"task": "arith"}))
    return path


def test_an_entry_is_whole_or_ignored_and_its_materialised_copy_is_marked(tmp_path):
    cache = SegmentCache(tmp_path / "cache")
    out = _train_dir(tmp_path / "a")
    assert cache.lookup("k1") is None and not cache.materialise("k1", tmp_path / "b")
    cache.store("k1", out)
    assert (out / KEY_FILE).read_text().strip() == "k1"     # `out` is exactly the entry now
    assert not (cache.entry("k1") / KEY_FILE).exists()   # the run's mark on the directory is not its outcome
    for rel in ("checkpoint/model.bin", "evidence.jsonl", "run.json"):  # held once: `out` links the entry's files
        assert (out / rel).stat().st_ino == (cache.entry("k1") / rel).stat().st_ino
    assert cache.lookup("k1") is not None
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
    from evotrainer.evolve.segments.training import Training
    from evotrainer.runtime import Runtime
    cfg = config_from_dict({"task": "arith", "level": 1, "seeds": [0], "final_seeds": [],
                            "budget": {"steps_per_segment": 2, "total_steps": 6, "trial_timeout_s": 120},
                            "evaluation": {"every": 1}}).validate()
    return Training(cfg=cfg, task=get_task("arith", 1), runtime=Runtime(), base=str(ckpt), run_dir=tmp_path,
                    harness_dir=lambda v: harness, cache=None if cache is None else SegmentCache(cache))


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
    assert "reused from the segment cache" in log_path(b).read_text()  # the log is kept beside the directory
    assert tree_digest(a) == tree_digest(b)
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
        trials = [(t.id, t.label, t.fitness.val, t.fitness.test) for t in store.trials()]
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
    from evotrainer.evolve.segments.retrain import Arm, retrain
    task, cache = get_task("arith", 1), SegmentCache(tmp_path / "cache")
    same = Arm((str(write_harness(tmp_path / "h")),), 2)
    one, two = (Arm((str(write_harness(tmp_path / f"h{t}", temperature=t)),), 2) for t in (0.7, 0.8))

    def arms(out: str, **named):  # a benchmark arm's final comparison: the reference and its own winner
        return retrain(task, str(ckpt), named, [100], tmp_path / out, evaluation=EvalConfig(every=1), timeout_s=120,
                       cache=cache)
    first = arms("one", reference=same, evolved=one)
    assert (first.trained, first.reused) == (2, 0)
    second = arms("two", reference=same, evolved=two)
    assert (second.trained, second.reused) == (1, 1)
    assert second.scores["reference"] == first.scores["reference"] and second.base == first.base
