"""The controller's side of the sandbox: what this machine allows, and how a job is started in it.

Every process that runs untrusted code (harness code in training, backtest and diagnostics
workers; model-written programs) starts through `command()`. Static checks (legality.py)
name plain attempts early; this is what holds when they are bypassed.

Isolation levels, probed once per process (`probe()`):

    namespaces  util-linux `unshare`: new mount, network, PID, IPC and UTS namespaces (plus a
                user namespace when we are not root); the filesystem read-only but the job's
                declared output directories and a private /tmp; home directories and /run
                (the host's unix sockets) empty but the paths the job reads; an unprivileged user (nobody when we are root, else a
                user namespace whose capabilities are dropped) with no_new_privs; resource
                limits; an empty environment. The job is PID 1 of its namespace, so killing it
                kills everything it started (setsid() included), and it dies with the controller.
    limits      where namespaces are unavailable (a container that forbids them, macOS):
                resource limits, an empty environment, no_new_privs where setpriv exists, its
                own process group, death with the controller on Linux. No filesystem or network
                isolation, and a process that calls setsid() escapes the kill: every report says so.
    none        the explicit opt-out (`sandbox: none`): a plain worker process, as trusted code
                (it dies with its caller where setpriv exists, nothing more).
"""
from __future__ import annotations

import enum
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from evotrainer.errors import UsageError

NOBODY = 65534
# non-secret variables a job may need (which GPUs; library and module paths, whose directories
# are on sys.path and so visible to the job; OpenBLAS fixes for some CPUs)
PASS_THROUGH = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
                "PYTHONPATH", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TZ")
# replaced by an empty tmpfs inside: homes hold keys and tokens; /run holds the host's
# unix sockets (a read-only mount does not stop a connect to a world-writable one)
HIDDEN = ("/root", "/home", "/run")


class Isolation(str, enum.Enum):
    NAMESPACES = "namespaces"
    LIMITS = "limits"
    NONE = "none"


CHOICES = ("auto", *(i.value for i in Isolation))


@dataclass(frozen=True)
class Limits:
    """Per-job resource limits (setrlimit; a job cannot raise them again). Memory is also
    watched by resident size over the job's whole process tree (executors.worker), since an
    address-space limit breaks CUDA, which reserves far more than it uses."""
    cpu_s: int | None = None          # CPU seconds, all threads together (None: from the deadline)
    # threads count too, and as nobody the count is the whole uid's on the machine: torch and
    # OpenMP start about two per core in each worker, and a GPU node runs several workers
    processes: int = 4096
    file_mb: int = 65536              # largest file the job may write (a real model's shard is ~5 GB)
    open_files: int = 4096
    address_mb: int | None = None     # virtual memory; set it for CPU-only jobs such as programs
    tmp_mb: int = 1024                # the private /tmp and /dev/shm (memory-backed)

    def rlimits(self) -> dict[str, int | None]:
        mb = 2 ** 20
        return {"RLIMIT_CPU": self.cpu_s, "RLIMIT_NPROC": self.processes,
                "RLIMIT_FSIZE": self.file_mb * mb, "RLIMIT_NOFILE": self.open_files,
                "RLIMIT_AS": self.address_mb * mb if self.address_mb else None, "RLIMIT_CORE": 0}


@dataclass(frozen=True)
class Jail:
    """What one job may reach: the paths it reads and writes (besides the Python environment
    and the working directory, which every job reads), its limits and its environment."""
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    env: dict = field(default_factory=dict)
    reveal: tuple[str, ...] = ()  # concealed paths this job may see after all (the evaluator's data)
    hide: tuple[str, ...] = ()    # paths hidden from this job alone (conceal: from every job)


_concealed: set[str] = set()


def conceal(*paths: str | Path) -> None:
    """Hide these paths from every job this process starts, even where a read path or the
    working directory contains them: the split keys, a task's file of held-out rows. (Under
    `limits` nothing is hidden: that level has no filesystem isolation, and says so.)"""
    _concealed.update(str(Path(p).resolve()) for p in paths)


def concealed() -> frozenset[str]:
    """The paths `conceal` hides from this process's jobs (an executor on another node hides them too)."""
    return frozenset(_concealed)


def resolve(choice: str) -> Isolation:
    """`sandbox:` from the config: auto takes the strongest this machine allows."""
    if choice == "auto":
        return probe()
    level = Isolation(choice)
    if level is Isolation.NAMESPACES and probe() is not Isolation.NAMESPACES:
        raise UsageError(f"sandbox: namespaces is not available here ({why_not()}); "
                           "use sandbox: auto to fall back to process limits")
    return level


def _unshare_args() -> list[str]:
    args = ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child=SIGKILL",
            "--mount-proc"]
    return args + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"])


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[Isolation, str]:
    if sys.platform != "linux":
        return Isolation.LIMITS, f"no Linux namespaces on {sys.platform}"
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            return Isolation.LIMITS, f"util-linux `{tool}` is not installed"
    try:  # the real thing: namespaces, a private mount, a read-only remount
        r = subprocess.run([*_unshare_args(), "sh", "-c", "mount --make-rprivate / && mount -o remount,bind,ro /"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Isolation.LIMITS, f"unshare failed: {e}"
    if r.returncode != 0:
        return Isolation.LIMITS, f"unshare refused: {(r.stderr.strip().splitlines() or ['exit ' + str(r.returncode)])[-1]}"
    return Isolation.NAMESPACES, ""


def probe() -> Isolation:
    """The strongest isolation this machine allows (probed once per process)."""
    return _probe()[0]


def why_not() -> str:
    """Why namespaces are unavailable ('' when they are)."""
    return _probe()[1]


def describe(level: Isolation) -> str:
    """One line for `status` and every report."""
    if level is Isolation.NAMESPACES:
        return "namespaces (no network, read-only filesystem, unprivileged, limits, subtree killed)"
    if level is Isolation.LIMITS:
        return (f"WARNING: process limits only ({why_not() or 'chosen'}): untrusted code can read files, "
                "reach the network and leave processes behind")
    return "WARNING: none (sandbox: none): untrusted code runs with the controller's rights"


def _paths_in(value, cwd: Path) -> set[str]:
    """Existing paths named anywhere in a job's arguments (task specs such as
    'jsonl:/data/x.jsonl?max_new_tokens=8' included): what the job reads."""
    out: set[str] = set()
    if isinstance(value, dict):  # keys too: the evaluator's jobs are {checkpoint: splits}
        for k, v in value.items():
            out |= _paths_in(k, cwd) | _paths_in(v, cwd)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out |= _paths_in(v, cwd)
    elif isinstance(value, str) and ("/" in value or os.sep in value):
        for part in {value, *re.split(r"[:?=,;]", value)}:
            p = (cwd / part) if not os.path.isabs(part) else Path(part)
            if part and p.exists():
                p = p.resolve()
                out.add(str(p))
                if "/snapshots/" in str(p):  # a Hugging Face cache snapshot links into the repo's blobs/
                    out.add(str(p).split("/snapshots/")[0])
    return out


def _unreadable_by_others(paths) -> str | None:
    """The first of `paths` (or of the files right inside one) that a job running as nobody
    could not read, else None. Only the paths themselves: their parents are rebuilt inside
    the sandbox where they are hidden (homes, /tmp), and are the machine's own elsewhere."""
    for p in map(Path, paths):
        for t in [p, *(sorted(p.iterdir())[:256] if p.is_dir() else [])]:
            need = 0o005 if t.is_dir() else 0o004
            try:
                if t.stat().st_mode & need != need:
                    return str(t)
            except OSError:
                continue
    return None


def _environment_paths() -> set[str]:
    """The Python environment every job runs in: interpreter, stdlib, site-packages, our sources."""
    import evotrainer
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(evotrainer.__file__).resolve().parents[1]),
             str(Path(sys.executable).resolve().parent)}
    paths |= {p for p in sys.path if p and os.path.isabs(p)}
    return {str(Path(p).resolve()) for p in paths if os.path.exists(p)}


def _holds_scratch(path: str) -> bool:
    """Whether binding `path` would cover the job's private /tmp or /dev/shm with the host's,
    read-only (a run started from /tmp, or from /): such a path is not bound; what a job needs
    inside it is named in its arguments and bound on its own."""
    return any(scratch == path or scratch.startswith(path.rstrip("/") + "/") for scratch in ("/tmp", "/dev/shm"))


def job_env(extra: dict | None = None) -> dict[str, str]:
    """The whole environment a job sees: no keys, no tokens, nothing of the caller's but PASS_THROUGH."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp",
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env |= {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
    return env | (extra or {})


def command(argv: list[str], jail: Jail, level: Isolation, job_dir: Path, cwd: Path | None = None,
            kwargs: dict | None = None, timeout_s: float | None = None) -> tuple[list[str], dict[str, str] | None]:
    """(argv, env) to start `argv` as a sandboxed job at `level`. `job_dir` (the job's own
    files: its spec, arguments and result) is writable; `kwargs` are scanned for the paths
    the job reads. With Isolation.NONE it is the plain command in the caller's environment."""
    if level is Isolation.NONE:  # trusted, but still dies with its caller (a Ray worker cancelled with force)
        setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
        return ([setpriv, "--pdeathsig", "KILL", *argv] if setpriv else argv), None
    cwd = Path(cwd or os.getcwd()).resolve()
    env = job_env(jail.env)
    limits = jail.limits.rlimits()
    if limits["RLIMIT_CPU"] is None and timeout_s:
        # the deadline kills on wall time; this stops a job that escaped it, with room for every core
        limits["RLIMIT_CPU"] = int(timeout_s * (os.cpu_count() or 1)) + 60
    write = sorted({str(Path(p).resolve()) for p in (*jail.write, job_dir)})
    for p in write:
        Path(p).mkdir(parents=True, exist_ok=True)
    root = os.geteuid() == 0 and level is Isolation.NAMESPACES
    reads = _paths_in(kwargs or {}, cwd) | set(jail.read)
    if root:  # the job runs as nobody: its output directories must be its own, its inputs readable
        for p in write:
            os.chown(p, NOBODY, NOBODY)
        bad = _unreadable_by_others(reads - set(write))
        if bad:
            raise UsageError(f"sandboxed jobs run as nobody (evotrainer runs as root here) and cannot read "
                             f"'{bad}': make it readable by others (chmod -R o+rX), or run as a non-root user")
    setpriv = shutil.which("setpriv")
    homes = {h for h in (*HIDDEN, str(Path.home())) if os.path.isdir(h)}
    spec = {"argv": argv, "env": env, "cwd": str(cwd),
            "read": sorted(r for r in (_environment_paths() | {str(cwd)} | reads) - set(write)  # rw only
                           if not _holds_scratch(r)),
            "write": write, "hide": sorted(homes), "mask": sorted((_concealed | {str(Path(p).resolve()) for p in jail.hide})
                                                       - {str(Path(p).resolve()) for p in jail.reveal}),
            "tmp_mb": jail.limits.tmp_mb, "limits": limits,
            "uid": NOBODY if root else None, "gid": NOBODY if root else None, "setpriv": setpriv,
            "mounts": level is Isolation.NAMESPACES}
    spec_file = job_dir / "sandbox.json"
    spec_file.write_text(json.dumps(spec))
    inside = [sys.executable, "-I", "-S", str(Path(__file__).with_name("inside.py")), str(spec_file)]
    if level is Isolation.NAMESPACES:
        # setpriv first: unshare (our child) dies with us, and its child, the job, with it
        return [setpriv, "--pdeathsig", "KILL", *_unshare_args(), *inside], env
    return ([setpriv, "--pdeathsig", "KILL", *inside] if setpriv else inside), env


def record(level: Isolation) -> dict:
    """What a run stores of its sandbox (status and every report show it)."""
    return {"level": level.value, "detail": describe(level)}
