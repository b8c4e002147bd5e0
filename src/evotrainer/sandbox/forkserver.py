"""Warm workers: a fork server that has imported torch and our package starts every job.

A cold job (launch.command) is a fresh interpreter that imports torch, transformers and
evotrainer before it does anything: seconds of CPU for a job whose work may take a fraction
of that. Here one server process per controller (and per sandbox level) imports them once,
then forks for each job. The fork is a fresh process with nothing of any other job in it:
the server never runs a job, never imports harness code, never initialises CUDA (a forked
CUDA context is unusable: were a preloaded module ever to, each job would exec a fresh
interpreter in its sandbox instead), and holds no secret (it starts with a job's own
environment).
Each job is still alone in its own sandbox, built exactly as for a cold job (inside.py):

    server            imports, then waits on its socket for requests (job dir, and the
                      job's log and writer locks as file descriptors)
      wrapper (fork)  closes every descriptor of the server, reports its pid, unshares the
                      namespaces (as `unshare` does), forks the job, waits for it and
                      reports its exit status; it is what the controller kills
        job (fork)    PID 1 of the new namespaces: mounts its /proc, builds and enters its
                      root (inside.confine), drops every privilege (inside.drop_privileges),
                      takes the job's environment, and runs its `python -m MODULE`

What holds for a cold job holds here: the job sees only its root, no network, no other
process; it is a user of its own (or capability-less); it dies with the wrapper
(parent-death signal), the wrapper with the server, the server when the controller's end of
its socket closes (the controller died), and every process in the job's namespace with the
job. The server reads each job's spec from a directory only the controller writes.

Linux only (fork, namespaces); the controller side (`Server`) falls back to cold jobs where
the server cannot start.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

MAX_FDS = 64


# --- the controller's side ------------------------------------------------------------------

class Forked:
    """A job started by the server, as the worker sees a Popen: pid (the wrapper's; None until
    it reported), poll(), returncode (negative: killed by that signal), kill()."""

    def __init__(self, report: socket.socket):
        self._report, self.pid, self.returncode = report, None, None

    def _read(self) -> None:
        while self.returncode is None:
            try:
                msg = self._report.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                msg = b""
            if not msg:  # the wrapper died before it reported: killed
                self.returncode = -signal.SIGKILL
                return
            news = json.loads(msg)
            if self.pid is None and "pid" in news:
                self.pid = int(news["pid"])
            elif "code" in news:
                self.returncode = int(news["code"])

    def poll(self) -> int | None:
        self._read()
        return self.returncode

    def kill(self) -> None:
        """Kill the wrapper, its group and every descendant, and wait until they are gone (the
        job's namespace goes with its PID 1); before it reported, make sure it never runs (it
        kills its job when our end of the socket closes). Once: the wrapper's pid is ours to
        signal only while that socket is open (the wrapper lives until it closes)."""
        if self._report.fileno() < 0:
            return
        self._read()
        if self.pid is not None:
            from evotrainer.sandbox.processes import kill_all, tree
            pids = tree(self.pid)
            handles = []  # opened before the kill: a pid reused meanwhile is not waited for
            for pid in pids:
                try:
                    handles.append(os.pidfd_open(pid))
                except OSError:
                    pass
            kill_all(self.pid, pids)
            for fd in handles:
                select.select([fd], [], [], 10)  # readable once that process has ended
                os.close(fd)
        if self.returncode is None:
            self.returncode = -signal.SIGKILL
        self._report.close()  # a wrapper not yet started finds no one to report to, and ends


class Server:
    """One fork server, started on the first job (its imports take the time one cold job's
    would) and restarted where it died; `start` returns None where it cannot serve (the
    caller starts a cold job)."""

    def __init__(self, preload: tuple[str, ...], env: dict[str, str], cwd: str):
        self.preload, self.env, self.cwd = preload, env, cwd
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None

    def _ensure(self) -> socket.socket:
        if self._proc is not None and self._proc.poll() is None:
            return self._sock
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # no parent-death signal: it would fire when the thread that started it ends; the
        # server ends instead when our end of the socket closes, which the kernel does when we die
        self._proc = subprocess.Popen([sys.executable, "-m", "evotrainer.sandbox.forkserver", str(theirs.fileno()),
                                       *self.preload], pass_fds=[theirs.fileno()], env=self.env, cwd=self.cwd,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self._sock = ours
        return ours

    def start(self, job_dir: Path, log: int, locks: list[int]) -> Forked | None:
        """Ask for the job whose sandbox.json is in `job_dir` (launch.prepare; its command
        `python -m MODULE ARGS...`): its output to `log`, holding `locks` while it lives."""
        report, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                for attempt in (1, 2):  # a server that died since is started again, once
                    try:
                        socket.send_fds(self._ensure(), [json.dumps({"job_dir": str(job_dir)}).encode()],
                                        [theirs.fileno(), log, *locks])
                        break
                    except OSError:
                        self.close()
                        if attempt == 2:
                            report.close()
                            return None
        finally:
            theirs.close()
        return Forked(report)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the server ends on EOF
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


# --- the server, its wrapper and the job ------------------------------------------------------

def _close_all_but(keep: set[int]) -> None:
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor


def _send(sock_fd: int, msg: dict) -> bool:
    try:
        os.write(sock_fd, json.dumps(msg).encode())
        return True
    except OSError:
        return False


def _job(spec: dict, job_dir: str, last_cap: int, fresh: bool) -> None:
    from evotrainer.sandbox import inside
    inside._check(inside._libc.prctl(inside.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if spec["mounts"]:  # what `unshare --mount-proc` does for a cold job: this PID namespace's /proc
        inside._mount(None, "/", None, inside.MS_REC | inside.MS_PRIVATE)
        inside._mount("proc", "/proc", "proc", inside.MS_NOSUID | inside.MS_NODEV | inside.MS_NOEXEC)
    inside.confine(spec)
    inside.drop_privileges(spec, last_cap)
    if fresh:
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    os.environ.clear()
    os.environ.update(spec["env"])
    # the job's command, `python -m MODULE ARGS...`, as that interpreter would run it: its
    # working directory first on the path, the module as __main__, its exit status ours
    sys.path[0] = spec["cwd"]
    importlib.invalidate_caches()
    _, flag, module, *args = spec["argv"]
    sys.argv = [flag, *args]  # runpy puts the module's file first
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)


def _wrapper(request: dict, fds: list[int], server_pid: int, fresh: bool) -> None:
    from evotrainer.sandbox import inside
    report, log, *locks = fds
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's SIG_IGN would make waitpid fail
    inside._check(inside._libc.prctl(inside.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    if os.getppid() != server_pid:
        os._exit(1)  # the server died while forking us
    os.setsid()  # a group of its own, as a cold job's: the controller kills the group
    os.dup2(log, 1)
    os.dup2(log, 2)
    _close_all_but({0, 1, 2, report, log, *locks})  # the server's socket above all: a job never reaches it
    if not _send(report, {"pid": os.getpid()}):
        os._exit(1)  # nobody waits for this job any more
    job_dir = request["job_dir"]
    with open(os.path.join(job_dir, "sandbox.json")) as f:
        spec = json.load(f)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    if spec["mounts"]:
        user = os.geteuid() != 0
        uid, gid = os.geteuid(), os.getegid()
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWUSER if user else 0)
        inside._check(inside._libc.unshare(flags), "unshare")
        if user:  # as `unshare --map-root-user`: root inside is our own user outside
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
    pid = os.fork()
    if pid == 0:
        os.close(report)
        os.close(log)
        try:
            _job(spec, job_dir, last_cap, fresh)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(126)
    os.close(log)
    for fd in locks:  # the job holds them now, and its processes after it
        os.close(fd)
    # wait for the job, or for the controller to close its end (it gave up on this job, or
    # died): then the job goes at once, whatever the parent-death chain would do
    try:
        job = os.pidfd_open(pid)  # Linux 5.3; before it, only the parent-death chain
        readable, _, _ = select.select([job, report], [], [])
        if report in readable and job not in readable:
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    _send(report, {"code": code})
    try:
        os.read(report, 1)  # until the controller has read it and closed its end (our pid stays valid for it)
    finally:
        os._exit(0)


def serve(fd: int, preload: list[str]) -> None:
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch.cuda.is_available() without initialising CUDA
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as e:  # an optional dependency: its jobs import it themselves
            print(f"evotrainer fork server: not preloaded: {name}: {e}", file=sys.stderr)
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # wrappers are reaped as they end
    me = os.getpid()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 65536, MAX_FDS)
        except OSError:
            msg = b""
        if not msg:  # the controller is gone: at once, without the interpreter's shutdown, so
            os._exit(0)  # that the wrappers' parent-death signal, and their jobs', fire now
        # a preloaded module that initialised CUDA would hand every fork an unusable context:
        # then each job execs a fresh interpreter in its sandbox instead (slower, never wrong)
        torch = sys.modules.get("torch")
        fresh = torch is not None and torch.cuda.is_initialized()
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                _wrapper(json.loads(msg), fds, me, fresh)
            finally:
                os._exit(1)
        for f in fds:
            os.close(f)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
