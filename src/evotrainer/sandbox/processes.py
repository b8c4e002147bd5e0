"""The process-wide sandbox level, and killing a started job's whole process tree.

Both belong to the sandbox, not to whoever starts jobs: the worker (executors.worker) and
the caller of the program driver (programs.py) each start sandboxed processes at the level
in force and kill them past a deadline, so both import these from here and the sandbox
never imports the executors above it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from evotrainer.sandbox.launch import Isolation, describe, resolve

_isolation: Isolation | None = None
_warned: set[Isolation] = set()  # weaker levels this process has said it runs at


def use_isolation(level: Isolation | str) -> Isolation:
    """Set this process's sandbox level for every worker it starts (the controller does, from
    the run config's `sandbox:`); 'auto' probes. Returns the level in force."""
    global _isolation
    new = level if isinstance(level, Isolation) else resolve(level)  # (an Isolation is a str too)
    if new is not Isolation.NAMESPACES and new not in _warned:
        print(f"evotrainer sandbox: {describe(new)}", file=sys.stderr)  # never silently weaker
        _warned.add(new)
    _isolation = new
    return _isolation


def isolation() -> Isolation:
    """The level in force: what `use_isolation` set, else the strongest this machine allows."""
    return _isolation if _isolation is not None else use_isolation("auto")


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a started job's whole process tree and group (its children included) and reap it.
    In the sandbox, the job is PID 1 of its namespace: when it dies the kernel kills the rest,
    setsid() or not; the explicit kill of every descendant covers the other levels too."""
    kill_all(proc.pid, tree(proc.pid))
    proc.wait()


def kill_all(leader: int, pids: list[int]) -> None:
    """SIGKILL the process group `leader` leads and each of `pids` (those already gone skipped)."""
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def tree(pid: int) -> list[int]:
    """pid and its descendants (Linux /proc; [pid] elsewhere)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a cgroup cpuset, a
    cluster's allocation), not every core the machine has. Jobs are given threads from this:
    two processes whose threads outnumber the cores run many times slower, not twice (two
    tiny GRPO jobs of 2 OpenMP threads each on 2 cores: 122 s for 20 steps, against 2.8 s
    with 1 thread each), because OpenMP threads spin while they wait for the cores."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
