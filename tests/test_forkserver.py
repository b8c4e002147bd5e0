"""Warm workers: a job forked from the fork server is the same job a fresh interpreter is
(the same sandbox, user, capabilities, environment and view), only started without the
imports; the server itself is out of every job's reach and goes with its controller."""
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

import worker_targets
from evotrainer.executors import run_in_worker
from evotrainer.executors import worker
from evotrainer.sandbox import Isolation, probe
from evotrainer.sandbox.users import FIRST_UID

HERE = Path(__file__).parent
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server is Linux's")


@pytest.fixture
def cold():
    worker.use_fork_server(False)
    yield
    worker.use_fork_server(True)


def _identity(tmp_path):
    r = run_in_worker(worker_targets.identity, timeout_s=120, cwd=HERE, writes=(str(tmp_path / "out"),))
    assert r.ok, r.log_tail
    return r.value


def test_a_forked_job_has_the_cold_jobs_sandbox_without_its_imports(tmp_path, cold):
    cold_id, cold_who = _identity(tmp_path), run_in_worker(worker_targets.whoami, timeout_s=60, cwd=HERE).value
    worker.use_fork_server(True)
    warm_id, warm_who = _identity(tmp_path), run_in_worker(worker_targets.whoami, timeout_s=60, cwd=HERE).value
    assert not cold_id.pop("preloaded") and warm_id.pop("preloaded")  # torch was there before the job began
    # a lent uid is the lowest one free machine-wide: another test's job in flight may hold it
    same = lambda who: {k: v for k, v in who.items() if k not in ("home", "uid")}  # noqa: E731
    assert same(warm_who) == same(cold_who)
    assert (warm_who["uid"] >= FIRST_UID) == (cold_who["uid"] >= FIRST_UID)  # both lent one, or neither
    cold_fds, warm_fds = cold_id.pop("fds"), warm_id.pop("fds")
    assert warm_id == cold_id  # capabilities, no_new_privs, the same either way
    if probe() is Isolation.NAMESPACES:
        assert warm_who["pid"] == 1 and warm_id["CapEff"] == warm_id["CapBnd"] == warm_id["CapPrm"] == "0" * 16
        assert warm_id["NoNewPrivs"] == "1"
    # its descriptors: stdin, its log, and the writer's lock on its output; nothing of the server's
    for fds in (cold_fds, warm_fds):
        assert not any(t.startswith("socket:") for t in fds.values()), fds
        assert any(t.endswith(".out.lock") for t in fds.values()), fds


def test_a_dead_server_is_started_again_and_a_job_never_lands_in_it(tmp_path):
    assert run_in_worker(worker_targets.add, {"a": 1, "b": 2}, timeout_s=60, cwd=HERE).value == 3
    server = worker._server(worker.isolation())
    os.kill(server._proc.pid, signal.SIGKILL)
    server._proc.wait()
    r = run_in_worker(worker_targets.identity, timeout_s=120, cwd=HERE)
    assert r.ok and r.value["preloaded"], r.log_tail


def test_a_job_killed_at_its_deadline_takes_its_children_and_leaves_the_server(tmp_path):
    from helpers import processes_with
    marker = f"evotrainer-fork-spin-{time.monotonic_ns()}"
    r = run_in_worker(worker_targets.spin_with_child, {"marker": marker}, timeout_s=3, cwd=HERE)
    assert r.label == "timeout" and processes_with(marker + "-child") == []
    server = worker._server(worker.isolation())
    assert server._proc.poll() is None  # still serving
    assert run_in_worker(worker_targets.add, {"a": 2, "b": 2}, timeout_s=60, cwd=HERE).value == 4


def test_a_forked_training_job_trains_bit_for_bit_as_a_fresh_one(tmp_path, ckpt, cold):
    """The same segment (3 steps, a reward that moves the weights; one thread and the
    default) cold and forked: the same metrics and the same weights, to the bit."""
    from safetensors.torch import load_file
    from helpers import write_harness
    from evotrainer.trainer.jobs import train_segment
    h = write_harness(tmp_path / "h", {"reward.py": "def r(x):\n    return x.lengths.float()\n"}, reward="r")
    base = load_file(str(ckpt / "model.safetensors"))

    def segment(out: Path, threads):
        r = run_in_worker(train_segment, dict(task="arith", level=1, harness=str(h), base=str(ckpt),
                                              out=str(out), seed=3, steps=3),
                          timeout_s=300, writes=(str(out),), reads=(str(h), str(ckpt)), threads=threads)
        assert r.ok, r.log_tail
        clock = ("seconds", "generate_seconds", "peak_rss_mb", "peak_gpu_mb")
        metrics = [{k: v for k, v in json.loads(line).items() if k not in clock}
                   for line in (out / "metrics.jsonl").read_text().splitlines()]
        weights = load_file(str(out / "checkpoint" / "model.safetensors"))
        return metrics, weights

    for threads in (1, None):
        worker.use_fork_server(False)
        cold_m, cold_w = segment(tmp_path / f"cold-{threads}", threads)
        worker.use_fork_server(True)
        warm_m, warm_w = segment(tmp_path / f"warm-{threads}", threads)
        assert warm_m == cold_m and len(cold_m) == 3 and any(m["loss"] != 0 for m in cold_m)
        assert any(not torch.equal(cold_w[k], base[k]) for k in base)  # it trained
        assert cold_w.keys() == warm_w.keys() and all(torch.equal(cold_w[k], warm_w[k]) for k in cold_w)
