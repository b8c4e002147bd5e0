"""Run untrusted work (harness code, training segments) in a worker process.

The controller never imports harness code. `run_in_worker("pkg.module:function", kwargs)`
starts a fresh Python process in its own process group and waits with a deadline; past it
the whole group is killed with SIGKILL (a thread cannot be stopped, a process group can).
Memory is watched the same way: the caller reads the worker's resident memory as it polls
and kills the group past `memory_mb`. (An address-space limit would be simpler, but CUDA
reserves far more address space than it ever uses and fails to start under one.) The
outcome is labelled:

    ok       the function returned; `value` holds its (picklable) result
    crash    it raised, or the process died; `log_tail` holds the traceback
    timeout  it ran past the deadline and was killed
    oom      it passed its memory limit (resident memory, MemoryError, or killed by the kernel)
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

LABELS = ("ok", "crash", "timeout", "oom")
TAIL_CHARS = 4000


@dataclass
class WorkerResult:
    label: str
    value: Any = None
    error: str | None = None      # one line: the exception, or why the process ended
    log_tail: str = ""            # last lines of the worker's stdout/stderr, traceback included
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.label == "ok"


@dataclass(frozen=True)
class Call:
    """One job for `run_all`: `target(**kwargs)` in a worker of its own."""
    target: str
    kwargs: dict = field(default_factory=dict)


def run_in_worker(target: str, kwargs: dict | None = None, timeout_s: float = 600.0,
                  memory_mb: int | None = 8192, cwd: Path | None = None,
                  on_poll: Callable[[], None] | None = None, poll_s: float = 0.5,
                  threads: int | None = None, warm: Warm | None = None) -> WorkerResult:
    """Run `target(**kwargs)` in a fresh process (or in `warm`, started earlier); `on_poll`
    runs in the caller while it waits."""
    return run_all([Call(target, kwargs or {})], 1, timeout_s, memory_mb, cwd, on_poll, poll_s, threads, warm)[0]


def run_all(calls: list[Call], workers: int = 1, timeout_s: float = 600.0, memory_mb: int | None = 8192,
            cwd: Path | None = None, on_poll: Callable[[], None] | None = None, poll_s: float = 0.5,
            threads: int | None = None, warm: Warm | None = None) -> list[WorkerResult]:
    """Run the calls, at most `workers` at a time, each in its own process group with its own
    deadline (`timeout_s` from its own start) and memory limit; results in the calls' order.

    `threads` caps each worker's intra-op threads (OMP/MKL and torch), so that `workers`
    processes share the cores instead of oversubscribing them. The first call runs in `warm`
    where it is given and still alive (it was started with its own `cwd` and `threads`)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    results: list[WorkerResult | None] = [None] * len(calls)
    waiting, running = list(enumerate(calls)), []
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                i, call = waiting.pop(0)
                job = warm.take() if warm is not None else None
                running.append((i, job.give(call) if job is not None else _Job(call, cwd, threads)))
            for _, job in running:
                job.check_memory(memory_mb)
            for i, job in [r for r in running if r[1].done(timeout_s)]:
                results[i] = job.finish(timeout_s)
                running.remove((i, job))
            if on_poll:
                on_poll()
            if running and not any(j.done(timeout_s) for _, j in running):
                time.sleep(min(poll_s, 0.1))  # a finished worker is noticed within 0.1 s
    finally:  # the caller died or was interrupted: no worker outlives it
        for i, job in running:
            results[i] = job.finish(timeout_s)
        if on_poll:
            on_poll()
    return results


class Warm:
    """A worker started before its job is known: Python, torch and our modules imported, it
    waits on its stdin for the job. A backtest's rescore takes ~2.5 s in a fresh worker, ~1.5 s
    of it starting up; started while the controller works on one core (scoring the last trial)
    and the other is idle, that start-up leaves the critical path. Give it to `run_in_worker`
    (it runs one job, the first), and `close()` it whether or not it ran one: a warm worker
    never used is killed there, and dies by itself when the caller's end of its stdin closes."""

    def __init__(self, cwd: Path | None = None, threads: int | None = None):
        self._job: _Job | None = _Job(None, cwd, threads)

    def take(self) -> _Job | None:
        """Its started worker, once, if it is still waiting (else None: start a fresh one)."""
        job, self._job = self._job, None
        if job is not None and job.proc.poll() is not None:
            job.discard()
            return None
        return job

    def close(self) -> None:
        if self._job is not None:
            self._job.discard()
            self._job = None


class _Job:
    """One started worker: its process group, its scratch directory and its log. Started with
    no call, it is warm: it waits for `give`."""

    def __init__(self, call: Call | None, cwd: Path | None, threads: int | None):
        self.t0 = time.monotonic()
        self._tmp = tempfile.TemporaryDirectory(prefix="evotrainer-worker-")
        self.dir, self.threads = Path(self._tmp.name), threads
        if call is not None:
            self._write(call)
        env = dict(os.environ)
        if threads:  # read by the OpenMP/MKL runtimes when torch loads; the child also calls set_num_threads
            env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        self.over_memory: int | None = None  # resident MB when it was killed for memory
        self.log = open(self.dir / "log.txt", "w+b")
        wait = [] if call is not None else ["--wait"]
        self.proc = subprocess.Popen([sys.executable, "-m", "evotrainer.executors.child", str(self.dir), *wait],
                                     stdin=subprocess.PIPE if wait else subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                     start_new_session=True)  # its own process group

    def _write(self, call: Call) -> None:
        (self.dir / "job.pkl").write_bytes(pickle.dumps({"target": call.target, "kwargs": call.kwargs,
                                                         "threads": self.threads}))

    def give(self, call: Call) -> _Job:
        """A warm worker's job: written, then its stdin closed, which starts it; the deadline
        counts from here."""
        self._write(call)
        self.t0 = time.monotonic()
        self.proc.stdin.close()
        return self

    def discard(self) -> None:
        """Kill it and remove its files, without a result (a warm worker never given a job)."""
        _kill_group(self.proc)
        if self.proc.stdin:
            self.proc.stdin.close()
        self.log.close()
        self._tmp.cleanup()

    def done(self, timeout_s: float) -> bool:
        return self.proc.poll() is not None or time.monotonic() - self.t0 > timeout_s

    def check_memory(self, memory_mb: int | None) -> None:
        """Kill the group once the worker's resident memory passes memory_mb (Linux /proc)."""
        if not memory_mb or self.over_memory is not None or self.proc.poll() is not None:
            return
        try:
            pages = int(Path(f"/proc/{self.proc.pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return  # gone already, or no /proc (macOS): the kernel's own limits apply
        rss_mb = pages * os.sysconf("SC_PAGE_SIZE") // 2**20
        if rss_mb > memory_mb:
            self.over_memory = rss_mb
            _kill_group(self.proc)

    def finish(self, timeout_s: float) -> WorkerResult:
        was_running = self.proc.poll() is None
        killed = was_running and time.monotonic() - self.t0 > timeout_s
        _kill_group(self.proc)  # also reaps grandchildren a finished worker left behind
        self.log.seek(0)
        tail = self.log.read().decode("utf-8", "replace")[-TAIL_CHARS:]
        self.log.close()
        seconds = time.monotonic() - self.t0
        try:
            return self._label(killed, was_running, tail, seconds, timeout_s)
        finally:
            self._tmp.cleanup()

    def _label(self, killed: bool, was_running: bool, tail: str, seconds: float, timeout_s: float) -> WorkerResult:
        if self.over_memory is not None:
            return WorkerResult("oom", error=f"resident memory {self.over_memory} MB passed the worker's limit",
                                log_tail=tail, seconds=seconds)
        if killed:
            return WorkerResult("timeout", error=f"killed after {timeout_s:g} s", log_tail=tail, seconds=seconds)
        if was_running:  # the caller was interrupted (Ctrl-C, an exception) and took its workers down with it
            return WorkerResult("crash", error="stopped: the caller was interrupted", log_tail=tail, seconds=seconds)
        result_file = self.dir / "result.pkl"
        if result_file.exists():
            out = pickle.loads(result_file.read_bytes())
            return WorkerResult(out["label"], out.get("value"), out.get("error"), tail, seconds)
        if self.proc.returncode == -signal.SIGKILL:  # not us: the kernel's OOM killer
            return WorkerResult("oom", error="killed by SIGKILL (out of memory)", log_tail=tail, seconds=seconds)
        return WorkerResult("crash", error=f"worker exited with code {self.proc.returncode}", log_tail=tail,
                            seconds=seconds)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the worker's whole process group (its children included) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
