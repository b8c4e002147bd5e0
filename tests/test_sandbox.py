"""The sandbox holds with arbitrary Python inside: every job here tries what untrusted code
must not do, and the test checks the outside world, not just what the job reports."""
import json
import os
import re
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
from evotrainer.executors import Call, run_all, run_in_worker
from evotrainer.sandbox import Isolation, probe, users

HERE = Path(__file__).parent
pytestmark = pytest.mark.skipif(probe() is not Isolation.NAMESPACES,
                                reason="this machine allows no namespaces (the fallback has its own test)")


def test_a_job_sees_no_secret_no_home_and_is_a_user_of_its_own():
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
    if os.geteuid() == 0:  # a user of its own, lent for its life: never root, never another job's
        assert r.value["uid"] in range(users.FIRST_UID, users.FIRST_UID + users.COUNT)
        a, b = run_all([Call(worker_targets.whoami), Call(worker_targets.whoami)], workers=2, timeout_s=60, cwd=HERE)
        assert a.value["uid"] != b.value["uid"]
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


def test_a_job_reads_exactly_the_files_its_call_names_whatever_their_names(tmp_path):
    """A JSONL file and a run directory named with the characters a spec is made of: the
    training job reads its train view, and neither `exp` beside `exp=2,a:b?c` nor `lr` beside
    `lr=1e-5,x:y?z` (what cutting the spec at its punctuation would have shown it)."""
    from helpers import readable
    from evotrainer.catalog import get_task
    from evotrainer.tasks.spec import canonical
    data = tmp_path / "exp=2,a:b?c" / "t.jsonl"
    data.parent.mkdir()
    data.write_text("".join(f'{{"prompt": "{i}+0=", "answer": "{i}"}}\n' for i in range(80)))
    siblings = [tmp_path / "exp", tmp_path / "lr"]
    for d in siblings:
        d.mkdir()
        (d / "secret.txt").write_text("not the job's")
    task = get_task(canonical(f"jsonl:{data}", {}))
    view = task.train_spec(tmp_path / "lr=1e-5,x:y?z" / "train-data")
    readable(tmp_path)
    assert task.files() == (str(data),) and task.files(view) == (str(tmp_path / "lr=1e-5,x:y?z" / "train-data" / "t.jsonl"),)
    others = [str(p) for p in (*siblings, data)]
    r = run_in_worker(worker_targets.train_rows, {"spec": view, "others": others}, timeout_s=120, cwd=HERE,
                      reads=task.files(view))
    assert r.ok, r.log_tail
    assert r.value == {"rows": task.problem_space(0), "others": dict.fromkeys(others, False)}


@pytest.mark.parametrize("kind, why", [("link", "result.json is a symbolic link"),
                                       ("fifo", "result.json is not a regular file"),
                                       ("huge", "more than the 16777216 read")])
def test_a_result_the_job_planted_is_refused_never_followed_nor_waited_on(tmp_path, kind, why):
    """The controller reads a job's result as hostile: a link to a file the job could not
    read (which holds a result the controller would take), a fifo (which would hang a plain
    read), a file past the cap: each a crash with one line, in well under a second."""
    secret = tmp_path / "secret.json"
    secret.write_text('{"label": "ok", "value": "the controller\'s secret"}')
    t0 = time.monotonic()
    r = run_in_worker(worker_targets.plant_result, {"kind": kind, "target": str(secret)}, timeout_s=60, cwd=HERE)
    assert r.label == "crash" and r.value is None and why in r.error and "\n" not in r.error, (r.error, r.log_tail)
    assert time.monotonic() - t0 < 30


def test_a_job_cannot_rewrite_its_own_spec(monkeypatch):
    """sandbox.json (which root reads to build the jail) and job.json lie where only the
    controller writes: the job reads job.json through a read-only bind and never sees
    sandbox.json; both are as the controller wrote them when the job has ended."""
    from evotrainer.executors import worker
    after, release = {}, worker._Job._release

    def spy(job):
        after.update({f: (job.dir / f).read_text() for f in ("sandbox.json", "job.json")})
        release(job)
    monkeypatch.setattr(worker._Job, "_release", spy)
    r = run_in_worker(worker_targets.rewrite_spec, timeout_s=60, cwd=HERE)
    assert r.ok, r.log_tail
    assert r.value["job.json"] == "refused: OSError"  # a read-only filesystem
    if os.geteuid() == 0:  # (else its own /tmp's copy of the directory is its user's: a file there is its own)
        assert r.value["sandbox.json"] == "refused: PermissionError"
    assert json.loads(after["sandbox.json"])["argv"] != ["/bin/sh"] and json.loads(after["job.json"])["target"]


@pytest.mark.skipif(os.geteuid() != 0 and tuple(map(int, re.findall(r"\d+", os.uname().release)[:2])) < (5, 14),
                    reason="in user namespaces, Linux counts processes per namespace since 5.14 (sandbox/users.py)")
def test_a_fork_bomb_leaves_a_concurrent_sibling_room_to_start_processes(tmp_path, monkeypatch):
    """Two jobs at once, each with a limit of 32 processes: one forks until refused and
    holds them; the other, started beside it, still starts its own. (Were both the one uid,
    the first would have spent the count of both.)"""
    import functools
    from evotrainer.executors import worker
    from evotrainer.sandbox import Jail, Limits
    monkeypatch.setattr(worker, "Jail", functools.partial(Jail, limits=Limits(processes=32)))
    bomb, sibling = tmp_path / "bomb", tmp_path / "sibling"
    bomb.mkdir()
    sibling.mkdir()
    a, b = run_all([Call(worker_targets.fork_to_limit, {"out": str(bomb), "until": str(sibling / "done")},
                         writes=(str(bomb),), reads=(str(sibling),)),
                    Call(worker_targets.start_processes, {"n": 8, "after": str(bomb / "full"), "out": str(sibling)},
                         writes=(str(sibling),), reads=(str(bomb),))],
                   workers=2, timeout_s=120, memory_mb=None, cwd=HERE)
    assert a.ok and b.ok, (a.log_tail, b.log_tail)
    assert 10 < a.value < 32 and b.value == 8, (a.value, b.value)


def test_what_its_dev_shm_holds_counts_toward_a_jobs_memory():
    """/tmp and /dev/shm are memory (tmpfs) that no process's resident size shows: a job that
    writes 900 MB there, its processes far under an 800 MB limit (~300 MB), is out of memory."""
    r = run_in_worker(worker_targets.fill_shm, {"mb": 900}, timeout_s=120, memory_mb=800, cwd=HERE)
    assert r.label == "oom" and "/dev/shm" in r.error, (r.label, r.error)


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs have users of their own only when the controller is root")
def test_what_an_earlier_job_left_private_the_next_job_reads(tmp_path):
    """A checkpoint an earlier job (another uid) wrote 0600 is read through an idmapped bind
    that shows its owner's files as the reading job's own; its owner and modes stay."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "weights").write_text("an earlier job's")
    earlier = users.FIRST_UID + users.COUNT - 1  # a uid no job of this test holds
    for p in (out, out / "weights"):
        os.chown(p, earlier, earlier)
    os.chmod(out / "weights", 0o600)
    r = run_in_worker(worker_targets.probe, {"paths": [str(out / "weights")]}, timeout_s=60, cwd=HERE, reads=(str(out),))
    assert r.ok and r.value[str(out / "weights")] == "read: an earlier job's", r.value
    st = (out / "weights").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (earlier, 0o600)
