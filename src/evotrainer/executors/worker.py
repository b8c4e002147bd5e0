"""Run untrusted work (harness code, training segments) in a worker process.

The controller never imports harness code. `run_in_worker("pkg.module:function", kwargs)`
starts a fresh Python process in its own process group with an address-space limit, and
waits with a deadline; past it the whole group is killed with SIGKILL (a thread cannot be
stopped, a process group can). The outcome is labelled:

    ok       the function returned; `value` holds its (picklable) result
    crash    it raised, or the process died; `log_tail` holds the traceback
    timeout  it ran past the deadline and was killed
    oom      it ran out of the memory it was allowed (MemoryError, or killed by the kernel)
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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


def run_in_worker(target: str, kwargs: dict | None = None, timeout_s: float = 600.0,
                  memory_mb: int | None = 8192, cwd: Path | None = None,
                  on_poll: Callable[[], None] | None = None, poll_s: float = 0.5) -> WorkerResult:
    """Run `target(**kwargs)` in a fresh process; `on_poll` runs in the caller while it waits."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="evotrainer-worker-") as tmp:
        tmp = Path(tmp)
        (tmp / "job.pkl").write_bytes(pickle.dumps({"target": target, "kwargs": kwargs or {},
                                                    "memory_mb": memory_mb}))
        log = open(tmp / "log.txt", "w+b")
        proc = subprocess.Popen([sys.executable, "-m", "evotrainer.executors.child", str(tmp)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=cwd, start_new_session=True)  # its own process group
        killed = False
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    killed = True
                    break
                if on_poll:
                    on_poll()
                try:
                    proc.wait(timeout=min(poll_s, max(timeout_s - (time.monotonic() - t0), 0.01)))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            _kill_group(proc)
            if on_poll:
                on_poll()
        log.seek(0)
        tail = log.read().decode("utf-8", "replace")[-TAIL_CHARS:]
        log.close()
        seconds = time.monotonic() - t0
        if killed:
            return WorkerResult("timeout", error=f"killed after {timeout_s:g} s", log_tail=tail, seconds=seconds)
        result_file = tmp / "result.pkl"
        if result_file.exists():
            out = pickle.loads(result_file.read_bytes())
            return WorkerResult(out["label"], out.get("value"), out.get("error"), tail, seconds)
        if proc.returncode == -signal.SIGKILL:  # not us: the kernel's OOM killer
            return WorkerResult("oom", error="killed by SIGKILL (out of memory)", log_tail=tail, seconds=seconds)
        return WorkerResult("crash", error=f"worker exited with code {proc.returncode}", log_tail=tail,
                            seconds=seconds)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the worker's whole process group (its children included) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
