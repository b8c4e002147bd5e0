"""The sandbox holds with arbitrary Python inside: every job here tries what untrusted code
must not do, and the test checks the outside world, not just what the job reports."""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import worker_targets
from helpers import descends_from, processes_with
from evotrainer.executors import run_in_worker
from evotrainer.sandbox import Isolation, probe

HERE = Path(__file__).parent
pytestmark = pytest.mark.skipif(probe() is not Isolation.NAMESPACES,
                                reason="this machine allows no namespaces (the fallback has its own test)")


def test_a_job_sees_no_secret_no_home_and_is_nobody():
    os.environ["EVOTRAINER_TEST_SECRET"] = "hunter2"
    sentinel = Path("/tmp") / f"evotrainer-sentinel-{os.getpid()}"  # in the machine's /tmp, not the job's
    sentinel.write_text("the machine's /tmp")
    try:
        r = run_in_worker(worker_targets.whoami, timeout_s=60, cwd=HERE)
    finally:
        del os.environ["EVOTRAINER_TEST_SECRET"]
        sentinel.unlink()
    assert r.ok, r.log_tail
    assert "EVOTRAINER_TEST_SECRET" not in r.value["env"] and not any("KEY" in k or "TOKEN" in k for k in r.value["env"])
    assert r.value["pid"] == 1  # PID 1 of its own namespace: its death takes every process in it
    if os.geteuid() == 0:
        assert r.value["uid"] == 65534
    # HOME is the private /tmp: it holds the job's own directory (its arguments and result) and
    # the paths the job reads that happen to lie under /tmp (a checkout there), nothing else
    assert sentinel.name not in r.value["home"] and any(n.startswith("evotrainer-worker-") for n in r.value["home"])
    assert not any(n.startswith("pytest-of-") for n in r.value["home"])  # other tests' files stay out


def test_a_job_started_from_tmp_keeps_its_own_writable_tmp():
    # a job whose working directory is /tmp reads it, and it holds the machine's /tmp: bound
    # read-only over the job's own, every library's tempfile would fail (torch's import does)
    r = run_in_worker(tempfile.gettempdir, timeout_s=60, cwd=Path("/tmp"))  # it tries to write there
    assert r.ok and r.value == "/tmp", r.log_tail


def test_no_network_not_even_the_hosts_loopback_only_the_jobs_own():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        r = run_in_worker(worker_targets.try_connect, {"port": port}, timeout_s=60, cwd=HERE)
        assert r.ok and r.value.startswith("refused"), r.value
        with pytest.raises(socket.timeout):
            server.accept()  # nothing reached the listener
    finally:
        server.close()
    # the job's namespace has a loopback of its own, up (data-parallel ranks meet there), and no other interface
    r = run_in_worker(worker_targets.own_loopback, timeout_s=60, cwd=HERE)
    assert r.ok and r.value == "connected", r.value
    r = run_in_worker(worker_targets.try_connect, {"port": 53, "host": "1.1.1.1"}, timeout_s=60, cwd=HERE)
    assert r.ok and r.value.startswith("refused") and "unreachable" in r.value, r.value


def test_the_hosts_unix_sockets_are_out_of_reach():
    """A read-only mount does not stop connect() on a world-writable socket, so /run (where
    the host's daemons listen) is an empty tmpfs inside."""
    r = run_in_worker(worker_targets.list_run, timeout_s=60, cwd=HERE)
    assert r.ok and r.value == [], r.value


def test_writes_land_only_in_declared_directories(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "outside.txt"
    r = run_in_worker(worker_targets.try_write, {"path": str(outside)}, timeout_s=60, cwd=HERE, writes=(str(out),))
    assert r.ok and r.value.startswith("refused") and not outside.exists()
    repo = HERE.parent / "evotrainer-sandbox-probe.txt"
    r = run_in_worker(worker_targets.try_write, {"path": str(repo)}, timeout_s=60, cwd=HERE)
    assert r.value.startswith("refused") and not repo.exists()
    r = run_in_worker(worker_targets.try_write, {"path": str(out / "ok.txt")}, timeout_s=60, cwd=HERE,
                      writes=(str(out),))
    assert r.value == "written" and (out / "ok.txt").read_text() == "written by a sandboxed job"


def test_concealed_paths_stay_hidden_even_inside_a_path_the_job_reads(tmp_path):
    from evotrainer.sandbox import launch
    data = tmp_path / "data"
    (data / "keys").mkdir(parents=True)
    (data / "keys" / "run.key").write_text("s3cret")
    (data / "heldout.jsonl").write_text("test rows")
    (data / "train.jsonl").write_text("train rows")
    os.chmod(data / "keys", 0o755)
    saved = set(launch._concealed)
    try:
        launch.conceal(data / "keys", data / "heldout.jsonl")
        r = run_in_worker(worker_targets.read_tree, {"root": str(data)}, timeout_s=60, cwd=HERE)
        assert r.ok and r.value == {"train.jsonl": "train rows"}, r.value  # the rows file is /dev/null there
        # the evaluator's call reveals what it needs (the held-out rows), and only that
        r = run_in_worker(worker_targets.read_tree, {"root": str(data)}, timeout_s=60, cwd=HERE,
                          reveal=(str(data / "heldout.jsonl"),))
        assert r.ok and r.value == {"heldout.jsonl": "test rows", "train.jsonl": "train rows"}, r.value
    finally:
        launch._concealed.clear()
        launch._concealed.update(saved)


def test_a_setsid_daemon_dies_with_its_job():
    marker = f"evotrainer-daemon-{os.getpid()}-{time.monotonic_ns()}"
    r = run_in_worker(worker_targets.escape_with_setsid, {"marker": marker}, timeout_s=60, cwd=HERE)
    assert r.ok and r.value == "started"
    deadline = time.monotonic() + 2
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def test_allocating_30_gb_is_oom_and_a_loop_is_a_timeout():
    assert run_in_worker(worker_targets.allocate, {"gb": 30}, timeout_s=60, memory_mb=2000, cwd=HERE).label == "oom"
    assert run_in_worker(worker_targets.sleep_forever, timeout_s=2, cwd=HERE).label == "timeout"


def test_the_result_is_json_data_never_a_pickle(tmp_path):
    r = run_in_worker(worker_targets.not_json, timeout_s=60, cwd=HERE)
    assert r.label == "crash" and "not plain JSON" in r.error


def test_sigkill_of_the_controller_kills_every_worker_within_2_seconds(tmp_path):
    """A controller dies with SIGKILL (no cleanup runs) while its workers train; they and
    everything they started (a setsid daemon included) are gone 2 s later."""
    marker = f"evotrainer-orphan-{os.getpid()}-{time.monotonic_ns()}"
    script = f"""
import sys; sys.path.insert(0, {str(HERE)!r})
from evotrainer.executors import Call, run_all
import worker_targets
run_all([Call(worker_targets.daemon_then_sleep, {{"marker": {marker!r}}}),
         Call(worker_targets.sleep_forever, {{}})], workers=2, timeout_s=600, cwd={str(HERE)!r})
"""
    ctl = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    daemon = marker + "-daemon"  # a name only the job builds (the script's own command line holds the marker)
    deadline = time.monotonic() + 60
    while not processes_with(daemon) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(daemon), "the daemon never started"
    # every process it started: the fork server, each job's wrapper and job, or a cold job's
    # unshare and job, and what the jobs started
    family = [p for p in processes_with("") if descends_from(p, ctl.pid)]
    assert len(family) >= 3
    os.kill(ctl.pid, signal.SIGKILL)
    ctl.wait()
    time.sleep(2)
    assert processes_with(daemon) == [] and set(family) & set(processes_with("")) == set()
