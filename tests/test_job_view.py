"""A job reads only its inputs: harness code (arbitrary Python, no static check in the way)
looks for what it must not see, and the evaluator refuses checkpoints that are not plain data."""
import json
import os
import pwd
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import worker_targets
from helpers import write_harness
from evotrainer.evaluate.greedy import evaluate_checkpoints
from evotrainer.executors import run_in_worker
from evotrainer.policy import build_model, build_tokenizer, save_policy
from evotrainer.sandbox import Isolation, probe
from evotrainer.sandbox import launch
from evotrainer.sandbox.launch import _environment_paths
from evotrainer.trainer.jobs import train_segment

HERE = Path(__file__).parent
pytestmark = pytest.mark.skipif(probe() is not Isolation.NAMESPACES, reason="needs namespaces")

# a reward that, as it trains, records what the job sees of PATHS into its own output
SEEING_REWARD = """
import json, os, sys
PATHS = {paths!r}

def seen(path):
    try:
        if os.path.isdir(path):
            return "listed: " + ",".join(sorted(os.listdir(path)))
        with open(path) as f:
            return "read: " + f.read(100)
    except OSError as e:
        return "refused: " + type(e).__name__

def r(x):
    out = json.load(open(os.path.join(sys.argv[1], "job.json")))["kwargs"]["out"]
    with open(os.path.join(out, "seen.json"), "w") as f:
        json.dump({{p: seen(p) for p in PATHS}}, f)
    {extra}
    return x.scores.float()
"""


def seeing_harness(d: Path, paths=(), extra: str = "pass") -> Path:
    """A harness whose reward looks at `paths` (then runs `extra`)."""
    reward = SEEING_REWARD.format(paths=[str(p) for p in paths], extra=extra)
    return write_harness(d, {"reward.py": reward}, prompts_per_step=2, group_size=2, reward="r")


def train(h: Path, base: Path, out: Path, **kw):
    """A training job as the search starts one (Training.train): it reads its harness and its base."""
    return run_in_worker(train_segment, dict(
        task="arith", level=1, harness=str(h), base=str(base), out=str(out), seed=0, steps=1),
        timeout_s=120, writes=(str(out),), reads=(str(h), str(base)), **kw)


def test_a_training_job_sees_its_inputs_and_nothing_else_of_the_run_the_cwd_or_home(tmp_path, ckpt, monkeypatch):
    work = tmp_path / "work"  # the controller's working directory, runs under it
    run, other = work / "runs" / "r", work / "runs" / "other"
    base, sibling = run / "versions" / "v1" / "seed-0" / "checkpoint", run / "versions" / "v2" / "seed-0"
    shutil.copytree(ckpt, base)
    shutil.copytree(ckpt, sibling / "checkpoint")
    (sibling / "evidence.jsonl").write_text("{}\n")
    for f in (run / "evidence.sqlite", other / "evidence.sqlite", work / "notes.txt"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("not for the job")
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    env = _environment_paths()
    # entries of the user's home that are not on the way to the Python environment (~/.pyenv)
    private = [p for p in sorted(home.iterdir()) if not any(e == str(p) or e.startswith(f"{p}/") for e in env)][:3]
    hidden = [sibling / "checkpoint", sibling / "checkpoint" / "config.json", sibling / "evidence.jsonl",
              run / "evidence.sqlite", other, other / "evidence.sqlite", work / "notes.txt", *private]
    listed = {work: "runs", run: "harnesses,versions", run / "versions": "v1,v3"}  # the way to its inputs and output
    h = seeing_harness(run / "harnesses" / "v1",
                       [*hidden, *listed, home, base / "config.json", run / "harnesses" / "v1"])
    monkeypatch.chdir(work)
    out = run / "versions" / "v3" / "seed-0"
    r = train(h, base, out)
    assert r.ok, r.log_tail
    seen = json.loads((out / "seen.json").read_text())
    for p in hidden:
        assert seen[str(p)] == "refused: FileNotFoundError", (p, seen[str(p)])
    for p, names in listed.items():
        assert seen[str(p)] == f"listed: {names}", (p, seen[str(p)])
    assert not {p.name for p in private} & set(seen[str(home)].removeprefix("listed: ").split(","))
    # and its own inputs it reads
    assert seen[str(base / "config.json")].startswith("read: {")
    assert "reward.py" in seen[str(run / "harnesses" / "v1")]


def test_jobs_forked_from_one_server_each_see_their_own_inputs_and_no_more(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "rows.jsonl").write_text(f"rows of {d.name}")
    both = [str(a / "rows.jsonl"), str(b / "rows.jsonl")]
    first = run_in_worker(worker_targets.probe, {"paths": both}, timeout_s=60, cwd=HERE, reads=(str(a),))
    second = run_in_worker(worker_targets.probe, {"paths": both}, timeout_s=60, cwd=HERE, reads=(str(b),))
    assert first.ok and second.ok, first.log_tail + second.log_tail
    assert first.value[both[0]] == "read: rows of a" and first.value[both[1]] == "refused: FileNotFoundError"
    # the next job of the same server: its own input, nothing of the job before
    assert second.value[both[1]] == "read: rows of b" and second.value[both[0]] == "refused: FileNotFoundError"
    assert first.value["job"] != second.value["job"]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as nobody only when the controller is root")
def test_a_model_only_root_can_read_trains_and_is_scored_without_changing_its_modes(tmp_path):
    model = Path(tempfile.mkdtemp(prefix="evotrainer-root-only-"))  # 0700, root's, as mktemp -d makes it
    try:
        tok = build_tokenizer()
        save_policy(build_model(len(tok)), tok, model)
        for f in model.iterdir():
            f.chmod(0o600)
        modes = {f: f.stat().st_mode for f in [model, *model.iterdir()]}
        out = tmp_path / "out"
        r = train(seeing_harness(tmp_path / "h"), model, out)
        assert r.ok, r.log_tail
        jobs = {str(model): ["val"], str(out / "checkpoint"): ["val"]}
        ev = run_in_worker(evaluate_checkpoints, dict(task="arith", level=1, jobs=jobs),
                           timeout_s=120, reads=tuple(jobs))
        assert ev.ok and set(ev.value) == set(jobs), ev.log_tail
        assert {f: f.stat().st_mode for f in modes} == modes and model.stat().st_uid == 0
    finally:
        shutil.rmtree(model)


def test_the_evaluator_refuses_a_checkpoint_that_links_out_or_has_only_pickled_weights(tmp_path, ckpt):
    (tmp_path / "secret.json").write_text("{}")
    linked = shutil.copytree(ckpt, tmp_path / "linked")
    (linked / "tokenizer.json").unlink()
    (linked / "tokenizer.json").symlink_to(tmp_path / "secret.json")
    pickled = shutil.copytree(ckpt, tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    for bad, why in ((linked, "tokenizer.json links outside the checkpoint"), (pickled, "has no *.safetensors weights")):
        r = run_in_worker(evaluate_checkpoints,
                          dict(task="arith", level=1, jobs={str(bad): ["val"]}), timeout_s=120, reads=(str(bad),))
        error = r.value[str(bad)]["error"]  # that checkpoint's error line; the evaluator goes on
        assert r.ok and error.startswith("BadCheckpoint: ") and why in error, r.log_tail
        assert "\n" not in error


@pytest.mark.parametrize("plant, why", [
    ("os.symlink('/etc/hostname', os.path.join(out, 'checkpoint', 'notes'))", "checkpoint/notes in"),
    ("open(os.path.join(out, 'checkpoint', 'pytorch_model.bin'), 'wb').write(b'pickle')",
     "pytorch_model.bin: weights must be *.safetensors"),
])
def test_a_checkpoint_a_job_planted_a_link_or_a_pickle_in_is_refused_with_a_label(tmp_path, ckpt, plant, why):
    # the harness plants it before the trainer saves the final checkpoint into the same directory
    extra = f"os.makedirs(os.path.join(out, 'checkpoint'), exist_ok=True)\n    " \
            f"if not os.listdir(os.path.join(out, 'checkpoint')):\n        {plant}"
    r = train(seeing_harness(tmp_path / "h", extra=extra), ckpt, tmp_path / "out")
    assert r.label == "bad_output" and r.error.startswith("its output was refused: ") and why in r.error, r.error
    assert "\n" not in r.error


def test_of_a_sys_path_entry_that_holds_the_runs_a_job_sees_only_the_modules(tmp_path, monkeypatch):
    """`python -m` or PYTHONPATH=. put the working directory on sys.path, and runs lie under it;
    a job sees the modules and packages Python would import from there, not the runs."""
    from evotrainer.sandbox import root_contents
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "mytasks").mkdir(parents=True)
    (project / "mytasks" / "__init__.py").write_text("")
    (project / "helpers.py").write_text("")
    out = project / "runs" / "r" / "versions" / "v1" / "seed-0"
    out.mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.syspath_prepend(str(project))
    for cwd in (project, elsewhere):  # the runs under the working directory, or only under the entry
        monkeypatch.chdir(cwd)
        bound = {p for p, _ in root_contents(read=(), write=(str(out),))["binds"]}
        assert {str(project / "mytasks"), str(project / "helpers.py"), str(out)} <= bound
        assert not {str(project), str(project / "runs")} & bound


def test_a_library_directory_on_a_mount_of_its_own_is_bound_as_that_mount(tmp_path, monkeypatch):
    """A GPU machine mounts its driver at /usr/local/nvidia, inside /usr, with LD_LIBRARY_PATH
    naming /usr/local/nvidia/lib (a link to lib64). A bind of /usr does not carry another mount,
    and the job's root cannot create lib64 inside the read-only /usr, so every CUDA job crashed
    (seen on an H200): the whole driver mount is bound, where the /usr bind shows its mount point."""
    usr = tmp_path / "usr"
    driver = usr / "local" / "nvidia"
    (driver / "lib64").mkdir(parents=True)
    (driver / "lib").symlink_to("lib64")
    monkeypatch.setattr(sys, "path", [*sys.path, str(usr)])  # an environment path: bound read-only
    monkeypatch.setenv("LD_LIBRARY_PATH", str(driver / "lib"))
    monkeypatch.setattr(launch, "mount_points", lambda: ["/", str(driver)])
    seen = launch.root_contents([], [])
    binds = dict(seen["binds"])
    assert binds[str(usr)] == "ro" and binds[str(driver)] == "ro" and str(driver / "lib64") not in binds
    assert (str(driver / "lib"), "lib64") in seen["links"]
    monkeypatch.setattr(launch, "mount_points", lambda: ["/"])  # one filesystem: the /usr bind carries it
    assert str(driver) not in dict(launch.root_contents([], [])["binds"])
