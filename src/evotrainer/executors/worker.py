"""Run untrusted work (harness code, training segments) in a sandboxed worker process.

The controller never imports harness code. `run_in_worker(function, kwargs)` (a module-level
function, which the worker imports by its name: targets.py) starts a fresh Python process in
the sandbox (evotrainer.sandbox: its own namespaces, a root that holds the Python
environment, the call's declared `reads` read-only and its `writes` and nothing else, an
unprivileged user, limits, an empty environment) and waits with a deadline; past it the
whole process tree is killed with SIGKILL (a thread cannot be stopped, a process can).
Memory is watched the same way: the caller sums the resident memory of the worker's process
tree as it polls and kills it past `memory_mb`. (An address-space limit would be simpler, but
CUDA reserves far more address space than it ever uses and fails to start under one.)
Arguments go in and results come back as JSON, never pickles: nothing a worker writes is
executed by its caller, and what it wrote is vetted when it ends (`refused_output`: no
links, no special files, every checkpoint exactly what save_policy writes). Every file a job
could write is read as hostile, through evotrainer.jobfiles: its result (never through a
link, never waiting on a fifo, a regular file of at most RESULT_LIMIT bytes) and its log
(only its end). The job's spec lies where only the controller writes (child.py has the layout). The
outcome is labelled:

    ok       the function returned; `value` holds its (JSON) result
    crash    it raised, or the process died, or its result could not be read; `log_tail` holds the traceback
    bad_output  it returned, but what it wrote is refused (a link, a FIFO, a checkpoint that is
             not what save_policy writes: `refused_output`)
    timeout  it ran past the deadline and was killed
    oom      it passed its memory limit (resident memory and what its private /tmp and
             /dev/shm hold, MemoryError, or killed by the kernel)
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evotrainer import jobfiles, sandbox
from evotrainer.executors.targets import target_of
from evotrainer.sandbox import Isolation, Jail, users
from evotrainer.sandbox.forkserver import Forked, Server
# the level in force and the tree kill live in the sandbox (programs.py needs them too); named here as before
from evotrainer.sandbox.processes import isolation, kill_tree, use_isolation  # noqa: F401
from evotrainer.sandbox.processes import tree as _tree

LABELS = ("ok", "crash", "timeout", "oom")
TAIL_CHARS = 4000
RESULT_LIMIT = 16 * 2**20  # bytes of a job's result.json, at most (a larger one is a crash)
# a job directory (the controller's): the job reads JOB_DIR/JOB and writes JOB_DIR/OUT/RESULT (child.py)
JOB, OUT, RESULT = "job.json", "out", "result.json"


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
    """One job for `run_all`: `target(**kwargs)` in a worker of its own, `target` a module-level
    function (targets.target_of; a lambda or a method is refused here). Besides the Python
    environment it sees `reads`, read-only (files and directories, each a whole path: a task
    spec is not one, its files are, Task.files; None: every argument that is a whole existing
    path), and `writes`, the directories it may write (created for it; one writer at a time,
    see `_writer_lock`), and nothing else. `clean`: empty them first, once no earlier job
    writes them (a job cut off by a kill starts over)."""
    target: Callable[..., Any]
    kwargs: dict = field(default_factory=dict)
    writes: tuple[str, ...] = ()
    clean: bool = False
    reveal: tuple[str, ...] = ()  # concealed paths (sandbox.conceal) this trusted job reads: the evaluator's
    reads: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        target_of(self.target)  # a target no worker could import fails here, in the caller

    def named(self) -> NamedCall:
        """What leaves this process: the Call with its target by name."""
        return NamedCall(target_of(self.target), self.kwargs, self.writes, self.clean, self.reveal, self.reads)


@dataclass(frozen=True)
class NamedCall:
    """A Call as plain data, its target named "module:qualname": what crosses a process
    boundary (a worker's job.json, a Ray task's argument), where the target is imported by
    the worker that runs it and nowhere before."""
    target: str
    kwargs: dict = field(default_factory=dict)
    writes: tuple[str, ...] = ()
    clean: bool = False
    reveal: tuple[str, ...] = ()
    reads: tuple[str, ...] | None = None

    def inputs(self, cwd: Path | None = None) -> tuple[str, ...]:
        """The existing paths it reads: those `reads` names, else those its kwargs name (whole)."""
        if self.reads is None:
            return tuple(sorted(sandbox.named_paths(self.kwargs, cwd)))
        return tuple(sorted(sandbox.declared_paths(self.reads, cwd)))


def run_in_worker(target: Callable[..., Any], kwargs: dict | None = None, *, timeout_s: float = 600.0,
                  memory_mb: int | None = 8192, cwd: Path | None = None,
                  on_poll: Callable[[], None] | None = None, poll_s: float = 0.5,
                  threads: int | None = None, writes: tuple[str, ...] = (),
                  reveal: tuple[str, ...] = (), reads: tuple[str, ...] | None = None) -> WorkerResult:
    """Run `target(**kwargs)` in a worker of its own; `on_poll` runs in the caller while it
    waits; `reads`, `writes` and `reveal` as in Call."""
    call = Call(target, kwargs or {}, tuple(writes), reveal=tuple(reveal), reads=None if reads is None else tuple(reads))
    return run_all([call], 1, timeout_s=timeout_s, memory_mb=memory_mb, cwd=cwd, on_poll=on_poll, poll_s=poll_s,
                   threads=threads)[0]


def run_all(calls: list[Call], workers: int = 1, *, timeout_s: float = 600.0, memory_mb: int | None = 8192,
            cwd: Path | None = None, on_poll: Callable[[], None] | None = None, poll_s: float = 0.5,
            threads: int | None = None, slots: threading.Semaphore | None = None) -> list[WorkerResult]:
    """Run the calls, at most `workers` at a time, each in its own process group with its own
    deadline (`timeout_s` from its own start) and memory limit; results in the calls' order.
    `slots`: shared with other callers in other threads, each job holds one while it runs.

    `threads` caps each worker's intra-op threads (OMP/MKL and torch), so that `workers`
    processes share the cores instead of oversubscribing them."""
    return run_named([c.named() for c in calls], workers, timeout_s=timeout_s, memory_mb=memory_mb, cwd=cwd,
                     on_poll=on_poll, poll_s=poll_s, threads=threads, slots=slots)


def run_named(calls: list[NamedCall], workers: int = 1, *, timeout_s: float = 600.0, memory_mb: int | None = 8192,
              cwd: Path | None = None, on_poll: Callable[[], None] | None = None, poll_s: float = 0.5,
              threads: int | None = None, slots: threading.Semaphore | None = None) -> list[WorkerResult]:
    """`run_all` of calls already named: a Ray task runs its driver's call here, on its node,
    without importing the target (only the worker does)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    results: list[WorkerResult | None] = [None] * len(calls)
    waiting, running = list(enumerate(calls)), []
    try:
        while waiting or running:
            while waiting and len(running) < workers and (slots is None or slots.acquire(blocking=False)):
                i, call = waiting.pop(0)
                running.append((i, _Job(call, cwd, threads, timeout_s)))
            for _, job in running:
                job.check_memory(memory_mb)
            for i, job in [r for r in running if r[1].done(timeout_s)]:
                results[i] = job.finish(timeout_s)
                running.remove((i, job))
                if slots is not None:
                    slots.release()
            if on_poll:
                on_poll()
            if (running or waiting) and not any(j.done(timeout_s) for _, j in running):
                time.sleep(min(poll_s, 0.1))  # a finished worker is noticed within 0.1 s
    finally:  # the caller died or was interrupted: no worker outlives it
        for i, job in running:
            results[i] = job.finish(timeout_s)
            if slots is not None:
                slots.release()
        if on_poll:
            on_poll()
    return results


class _Job:
    """One started worker: its sandboxed process tree, its job directory and its log.

    The job directory is the controller's (mode 0700): the sandbox's spec (sandbox.json),
    the job's arguments (JOB, which the job reads through a read-only bind of that one file)
    and the log the job's output goes to. The job writes only OUT there, its result."""

    def __init__(self, call: NamedCall, cwd: Path | None, threads: int | None, timeout_s: float):
        self.t0, self.call = time.monotonic(), call
        self._tmp = tempfile.TemporaryDirectory(prefix="evotrainer-worker-")
        self.dir, self.threads = Path(self._tmp.name), threads
        self.level = isolation()
        # a uid of its own, where it switches user: its process limit counts its processes only
        self.user = users.lease() if self.level is Isolation.NAMESPACES and os.geteuid() == 0 else None
        try:
            self._start(call, cwd, threads, timeout_s)
        except BaseException:
            for f in getattr(self, "locks", ()):
                f.close()
            self._release()
            raise

    def _start(self, call: NamedCall, cwd: Path | None, threads: int | None, timeout_s: float) -> None:
        self.locks = [_writer_lock(Path(w)) for w in call.writes]
        if call.clean:
            for w in call.writes:
                shutil.rmtree(w, ignore_errors=True)
        spec = self.dir / JOB
        spec.write_text(json.dumps({"target": call.target, "kwargs": call.kwargs, "threads": threads,
                                    "isolation": self.level.value}))
        spec.chmod(0o644)  # the job reads it, whatever the controller's umask
        (self.dir / OUT).mkdir()
        extra = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
        # read by the OpenMP/MKL runtimes when torch loads; the child also calls set_num_threads
        self.over_memory: tuple[int, int] | None = None  # (resident, scratch) MB when it was killed for memory
        self.log = open(self.dir / "log.txt", "w+b")
        argv = [sys.executable, "-m", "evotrainer.executors.child", str(self.dir)]
        jail = Jail(read=(*call.inputs(cwd), str(spec)), write=(*call.writes, str(self.dir / OUT)), env=extra,
                    reveal=tuple(call.reveal), user=self.user.uid if self.user else None)
        server = _server(self.level)
        self.proc: subprocess.Popen | Forked | None = None
        if server is not None:  # a fork of a process that has imported torch: no start-up
            sandbox.prepare(argv, jail, self.level, job_dir=self.dir, cwd=cwd, timeout_s=timeout_s)
            self.proc = server.start(self.dir, self.log.fileno(), [f.fileno() for f in self.locks])
        if self.proc is None:  # a fresh interpreter (sandbox: none, or no fork server here)
            argv, env = sandbox.command(argv, jail, self.level, job_dir=self.dir, cwd=cwd, timeout_s=timeout_s)
            if env is None:  # sandbox: none, the caller's own environment
                env = dict(os.environ) | extra
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                         cwd=cwd, env=env,
                                         pass_fds=[f.fileno() for f in self.locks],  # held by the job while it lives
                                         start_new_session=True)  # its own process group
        for f in self.locks:  # the job's copy holds the lock now
            f.close()

    def done(self, timeout_s: float) -> bool:
        return self.proc.poll() is not None or time.monotonic() - self.t0 > timeout_s

    def check_memory(self, memory_mb: int | None) -> None:
        """Kill the tree once the resident memory of the worker's processes, with what its
        private /tmp and /dev/shm hold (memory too, in no process's resident size), passes
        memory_mb (Linux /proc; without it, macOS, the kernel's own limits apply)."""
        if not memory_mb or self.over_memory is not None or self.proc.poll() is not None:
            return
        if self.proc.pid is None:
            return  # a forked job not started yet
        pids = _tree(self.proc.pid)
        if isinstance(self.proc, Forked):
            pids = pids[1:]  # its wrapper: a fork of the server, whose pages the job's count already
        rss_mb = sum(map(_rss_pages, pids)) * os.sysconf("SC_PAGE_SIZE") // 2**20
        scratch_mb = _scratch_bytes(pids) // 2**20 if self.level is Isolation.NAMESPACES else 0
        if rss_mb + scratch_mb > memory_mb:
            self.over_memory = (rss_mb, scratch_mb)
            _stop(self.proc)

    def finish(self, timeout_s: float) -> WorkerResult:
        was_running = self.proc.poll() is None
        killed = was_running and time.monotonic() - self.t0 > timeout_s
        _stop(self.proc)  # also reaps grandchildren a finished worker left behind
        tail = _tail(self.log)
        self.log.close()
        seconds = time.monotonic() - self.t0
        try:
            res = self._label(killed, was_running, tail, seconds, timeout_s)
        finally:
            self._release()
        why = refused_output(self.call.writes) if res.ok else None
        if why:  # the job's own failure (harness code ran in it), said in one line
            return WorkerResult("bad_output", error=f"its output was refused: {why}", log_tail=tail, seconds=seconds)
        return res

    def _release(self) -> None:
        """Its directory goes, and its uid back to the pool: its processes are gone by now."""
        self._tmp.cleanup()
        if self.user is not None:
            self.user.release()
            self.user = None

    def _label(self, killed: bool, was_running: bool, tail: str, seconds: float, timeout_s: float) -> WorkerResult:
        if self.over_memory is not None:
            rss, scratch = self.over_memory
            held = f" and its /tmp and /dev/shm {scratch} MB" if scratch else ""
            return WorkerResult("oom", error=f"resident memory {rss} MB{held} passed the worker's limit",
                                log_tail=tail, seconds=seconds)
        if killed:
            return WorkerResult("timeout", error=f"killed after {timeout_s:g} s", log_tail=tail, seconds=seconds)
        if was_running:  # the caller was interrupted (Ctrl-C, an exception) and took its workers down with it
            return WorkerResult("crash", error="stopped: the caller was interrupted", log_tail=tail, seconds=seconds)
        try:
            blob = jobfiles.read_bytes(self.dir / OUT, RESULT, RESULT_LIMIT)
        except jobfiles.Missing:
            blob = None
        except jobfiles.BadOutput as e:
            why = str(e).replace(str(self.dir / OUT) + "/", "")  # the job's own directory: a temporary name
            return WorkerResult("crash", error=f"its result was refused: {why}", log_tail=tail, seconds=seconds)
        if blob is not None:
            try:
                out = json.loads(blob)
                return WorkerResult(str(out["label"]) if out["label"] in LABELS else "crash", out.get("value"),
                                    out.get("error"), tail, seconds)
            except (ValueError, KeyError, TypeError) as e:
                error = " ".join(f"unreadable result: {e}".split())[:500]
                return WorkerResult("crash", error=error, log_tail=tail, seconds=seconds)
        if self.proc.returncode == -signal.SIGKILL:  # not us: the kernel's OOM killer
            return WorkerResult("oom", error="killed by SIGKILL (out of memory)", log_tail=tail, seconds=seconds)
        return WorkerResult("crash", error=f"worker exited with code {self.proc.returncode}", log_tail=tail,
                            seconds=seconds)


def _tail(log) -> str:
    """The last TAIL_CHARS characters of a job's log, read from its end only: a job may have
    written gigabytes to its stdout."""
    log.flush()
    path = Path(log.name)  # UTF-8: at most 4 bytes a character
    return jobfiles.read_text(path.parent, path.name, 4 * TAIL_CHARS, tail=True)[-TAIL_CHARS:]


SCRATCH = ("tmp", "dev/shm")  # a job's private tmpfs mounts (sandbox/inside.py)


def _scratch_bytes(pids: list[int]) -> int:
    """What the private /tmp and /dev/shm of a job's processes hold, each tmpfs once, seen
    through each process's root: memory that no resident size shows. The job owns its
    namespace but not the kernel's count of a filesystem's blocks; a mount that is still the
    controller's own (a job building its root), or one that cannot be read, counts 0. (A job
    that moved every process into a mount namespace of its own could hide them here; each
    is still capped at its size, Limits.tmp_mb.)"""
    seen: dict[int, int] = {}
    for d in SCRATCH:
        try:
            ours = os.stat(f"/{d}").st_dev
        except OSError:
            ours = None
        for pid in pids:
            try:
                where = f"/proc/{pid}/root/{d}"
                dev, st = os.stat(where).st_dev, os.statvfs(where)
            except OSError:
                continue  # gone, or no such directory there
            if dev != ours:
                seen[dev] = max(st.f_blocks - st.f_bfree, 0) * st.f_frsize
    return sum(seen.values())


def _stop(proc: subprocess.Popen | Forked) -> None:
    """Kill a started job's whole tree and reap it, however it was started."""
    if isinstance(proc, Forked):
        proc.kill()
    else:
        kill_tree(proc)


# what every job imports: loaded once by the fork server, never again by a job
PRELOAD = ("torch", "transformers", "evotrainer.executors.child", "evotrainer.harness", "evotrainer.trainer.jobs",
           "evotrainer.trainer.grpo", "evotrainer.evaluate.greedy", "evotrainer.backtest.rescore")
_servers: dict[Isolation, Server] = {}
_servers_lock = threading.Lock()
_fork = sys.platform == "linux"


def use_fork_server(on: bool) -> None:
    """Whether this process starts its jobs from a fork server (the default on Linux: no
    seconds of imports per job) or each as a fresh interpreter (a cold job)."""
    global _fork
    _fork = on and sys.platform == "linux"


def close_fork_servers() -> None:
    with _servers_lock:
        for server in _servers.values():
            server.close()
        _servers.clear()


def _server(level: Isolation) -> Server | None:
    """The fork server for sandboxed jobs at `level` (started on its first job), or None: the
    explicit opt-out (sandbox: none) runs cold jobs in the caller's own environment."""
    if not _fork or level is Isolation.NONE:
        return None
    with _servers_lock:
        if level not in _servers:
            _servers[level] = Server(PRELOAD, sandbox.job_env(), os.getcwd())
        return _servers[level]


atexit.register(close_fork_servers)


OUTPUT_LIMIT = jobfiles.ENTRIES_CAP  # entries of one job's output directory, at most


def refused_output(writes) -> str | None:
    """Why what a finished job wrote is refused, else None. Its output is data for the
    controller and the next jobs: no symbolic link (which would have them read what the job
    could not: the controller reads as itself), no fifo, socket or device, no more than
    OUTPUT_LIMIT entries (jobfiles.walk), and every checkpoint (a directory holding
    config.json, checkpoint/, checkpoints/*) exactly what save_policy writes
    (policy.model.check_checkpoint, written=True). A training job's output is vetted further
    against the run's schedule and records (trainer/outputs.py)."""
    checkpoints = []
    for out in map(Path, writes):
        try:
            entries = list(jobfiles.walk(out, OUTPUT_LIMIT))
        except jobfiles.BadOutput as e:
            return str(e)
        names = {rel for rel, _, _ in entries}
        for rel, is_dir, _ in [(".", True, 0), *entries]:
            path = Path(out, rel)
            if path.parent.name == "checkpoints" and path != out or is_dir and (
                    path.name == "checkpoint" or os.path.normpath(f"{rel}/config.json") in names):
                checkpoints.append(path)  # (a file where a checkpoint should be is refused below)
    if checkpoints:
        from evotrainer.policy.model import BadCheckpoint, check_checkpoint
        for c in checkpoints:
            try:
                check_checkpoint(c, written=True)
            except BadCheckpoint as e:
                return str(e)
    return None


def _rss_pages(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0  # gone already


WRITER_WAIT_S = 30.0


def _writer_lock(out: Path):
    """An exclusive lock beside a job's output directory (.OUT.lock), passed to the job, whose
    processes hold it while any of them lives: a resumed run's job for the same directory
    waits here for the killed controller's job to be gone before it writes (no two writers)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    f = open(out.parent / f".{out.name}.lock", "a")
    deadline = time.monotonic() + WRITER_WAIT_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise RuntimeError(f"another worker still writes {out} after {WRITER_WAIT_S:g} s")
            time.sleep(0.1)
