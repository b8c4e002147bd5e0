"""Untrusted work runs in a worker process: hard kills, memory limits, labelled outcomes."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import worker_targets
from evotrainer.executors import run_in_worker
from evotrainer.trainer.jobs import train_segment

HERE = Path(__file__).parent


def test_ok_returns_the_value():
    r = run_in_worker(worker_targets.add, {"a": 2, "b": 3}, timeout_s=60, cwd=HERE)
    assert r.label == "ok" and r.value == 5


def test_exception_is_a_crash_with_the_traceback():
    r = run_in_worker(worker_targets.boom, timeout_s=60, cwd=HERE)
    assert r.label == "crash"
    assert r.error == "ValueError: the harness broke"
    assert "Traceback" in r.log_tail and "worker_targets.py" in r.log_tail


def test_process_that_dies_is_a_crash():
    r = run_in_worker(worker_targets.hard_exit, timeout_s=60, cwd=HERE)
    assert r.label == "crash" and "code 7" in r.error


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for init to reap it."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.05)
    return True


def test_timeout_kills_the_whole_process_group():
    from helpers import processes_with
    marker = f"evotrainer-spin-{time.monotonic_ns()}"
    t0 = time.monotonic()
    r = run_in_worker(worker_targets.spin_with_child, {"marker": marker}, timeout_s=3, cwd=HERE)
    assert r.label == "timeout"
    assert time.monotonic() - t0 < 30
    assert processes_with(marker + "-child") == []


def test_memory_limit_gives_oom():
    r = run_in_worker(worker_targets.hog, timeout_s=60, memory_mb=400, cwd=HERE)
    assert r.label == "oom"


def broken_harness(tmp_path, knobs: str, reward_py: str):
    d = tmp_path / "h"
    d.mkdir()
    (d / "knobs.yaml").write_text("prompts_per_step: 2\ngroup_size: 2\n" + knobs)
    (d / "reward.py").write_text(textwrap.dedent(reward_py))
    return d


@pytest.mark.parametrize("reward_py, label, expect", [
    ("def r(x):\n    return 1 / 0\n", "crash", "ZeroDivisionError"),
    ("import torch\ndef r(x):\n    return torch.full((len(x.completions),), float('nan'))\n", "crash", "non-finite"),
    ("import torch\ndef r(x):\n    return torch.zeros(3, 3)\n", "crash", "shape"),
    ("def r(x):\n    while True:\n        pass\n", "timeout", "killed after"),
    ("def r(x:\n    return 0\n", "crash", "syntax error"),
])
def test_broken_harness_code_is_a_labelled_failure_not_a_crash_of_the_caller(tmp_path, ckpt, reward_py, label, expect):
    h = broken_harness(tmp_path, "reward: r\n", reward_py)
    r = run_in_worker(train_segment, dict(
        task="arith", level=1, harness=str(h), base=str(ckpt), out=str(tmp_path / "out"), seed=0, steps=2),
        timeout_s=8 if label == "timeout" else 15, writes=(str(tmp_path / "out"),))  # the loop waits out its deadline
    assert r.label == label, r.log_tail
    assert expect in (r.error or "") + r.log_tail
    if label == "crash":
        assert "Traceback" in r.log_tail


def test_pool_runs_workers_side_by_side_and_keeps_the_calls_order():
    from evotrainer.executors import Call, run_all
    calls = [Call(worker_targets.interval, {"seconds": 1.0}) for _ in range(2)] + [Call(worker_targets.add, {"a": 1, "b": 1})]
    (a, b, c) = run_all(calls, workers=2, timeout_s=60, cwd=HERE)
    assert a.ok and b.ok and c.value == 2
    (s1, e1), (s2, e2) = a.value, b.value
    assert s2 < e1 and s1 < e2  # the two sleeps overlapped: two workers ran at once


def test_pool_with_one_worker_runs_them_in_turn():
    from evotrainer.executors import Call, run_all
    a, b = run_all([Call(worker_targets.interval, {"seconds": 0.3})] * 2, workers=1, timeout_s=60, cwd=HERE)
    assert a.value[1] <= b.value[0]


def test_pool_times_out_one_worker_and_keeps_the_others_results():
    from evotrainer.executors import Call, run_all
    slow, fast = run_all([Call(worker_targets.sleep_forever), Call(worker_targets.add, {"a": 2, "b": 2})],
                         workers=2, timeout_s=3, cwd=HERE)
    assert slow.label == "timeout" and fast.ok and fast.value == 4


def test_pool_caps_each_workers_threads():
    from evotrainer.executors import Call, run_all
    (r,) = run_all([Call(worker_targets.torch_threads)], workers=1, timeout_s=120, cwd=HERE, threads=1)
    assert r.value == [1, "1"]  # a tuple comes back as JSON


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs 2 cores")
def test_a_pools_threads_and_workers_come_from_the_cores_this_process_may_use():
    """Confined to one core (taskset, a cpuset), a pool runs one job at a time with one thread,
    though the machine has more cores: more threads than cores spin against each other."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from evotrainer.executors import LocalPool; p = LocalPool(); print(p.threads(1), p._workers(4))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "1"], out.stderr


def test_the_fork_server_dies_with_its_caller():
    """Killed with SIGKILL (no cleanup runs), the caller leaves no fork server behind: it
    reads EOF on its socket, which the kernel closes with the caller."""
    import signal
    import subprocess
    import sys
    script = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import os, signal, worker_targets; "
              "from pathlib import Path; from evotrainer.executors import run_in_worker, worker; "
              f"assert run_in_worker(worker_targets.add, {{'a': 1, 'b': 1}}, timeout_s=120, cwd=Path({str(HERE)!r})).value == 2; "
              "print(worker._server(worker.isolation())._proc.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def test_the_limits_fallback_still_empties_the_environment_and_says_so(capsys, monkeypatch):
    """Where namespaces are unavailable the job still runs, with limits and an empty
    environment, and the weaker level is said on stderr (never silently)."""
    from evotrainer.executors import worker
    from evotrainer.sandbox import Isolation, processes
    monkeypatch.setattr(processes, "_isolation", None)  # the level in force lives in the sandbox
    monkeypatch.setattr(processes, "_warned", set())
    monkeypatch.setenv("EVOTRAINER_TEST_SECRET", "hunter2")
    assert worker.use_isolation("limits") is Isolation.LIMITS
    assert "WARNING: process limits only" in capsys.readouterr().err
    r = run_in_worker(worker_targets.whoami, timeout_s=60, cwd=HERE)
    assert r.ok and "EVOTRAINER_TEST_SECRET" not in r.value["env"] and r.value["pid"] != 1
    worker.use_isolation("none")  # the explicit opt-out: the caller's own environment
    r = run_in_worker(worker_targets.whoami, timeout_s=60, cwd=HERE)
    assert r.ok and "EVOTRAINER_TEST_SECRET" in r.value["env"]
    assert "WARNING: none" in capsys.readouterr().err


def test_the_local_pool_is_an_executor_that_keeps_the_calls_order():
    from evotrainer.executors import Call, Executor, LocalPool
    pool = LocalPool(2, cwd=HERE)
    assert isinstance(pool, Executor) and pool.run([], timeout_s=10) == []
    results = pool.run([Call(worker_targets.add, {"a": i, "b": 1}) for i in range(3)], timeout_s=60)
    assert [r.value for r in results] == [1, 2, 3] and all(r.ok for r in results)


def test_the_log_tail_is_read_from_its_end_only(tmp_path):
    """A job may write gigabytes to its stdout: the controller reads the last few KB."""
    from evotrainer.executors import worker
    with open(tmp_path / "log.txt", "w+b") as log:
        log.truncate(64 * 2**30)  # sparse: 64 GiB that reading whole would take
        log.seek(0, os.SEEK_END)
        log.write("the last line: é\n".encode())
        tail = worker._tail(log)
    assert tail.endswith("the last line: é\n") and len(tail) == worker.TAIL_CHARS
