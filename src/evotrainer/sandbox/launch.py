"""The controller's side of the sandbox: what this machine allows, and how a job is started in it.

Every process that runs untrusted code (harness code in training, backtest and diagnostics
workers; model-written programs) starts through `command()`. Static checks (legality.py)
name plain attempts early; this is what holds when they are bypassed.

Isolation levels, probed once per process (`probe()`):

    namespaces  util-linux `unshare`: new mount, network, PID, IPC and UTS namespaces (plus a
                user namespace when we are not root). The job's filesystem is a fresh root
                built for it (`root_contents()`): the Python environment, the system's own files,
                its declared inputs read-only, its declared outputs writable, a private /tmp
                and nothing else (no home, no working directory, no other run, no other
                version of this run). An unprivileged user (a uid of its own when we are
                root, users.py; else a user namespace whose capabilities are dropped) with
                no_new_privs; resource limits; an empty environment. The job is PID 1 of its
                namespace, so killing it kills everything it started (setsid() included), and
                it dies with the controller.
    limits      where namespaces are unavailable (a container that forbids them, macOS):
                resource limits, an empty environment, no_new_privs where setpriv exists, its
                own process group, death with the controller on Linux. No filesystem or network
                isolation: the job reads whatever the controller's user can, declared or not,
                and a process that calls setsid() escapes the kill: every report says so.
    none        the explicit opt-out (`sandbox: none`): a plain worker process, as trusted code
                (it dies with its caller where setpriv exists, nothing more).
"""
from __future__ import annotations

import enum
import functools
import glob
import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from evotrainer.errors import UsageError
from evotrainer.sandbox.inside import mount_points

NOBODY = 65534
# non-secret variables a job may need (which GPUs; library and module paths, whose directories
# the job sees; OpenBLAS fixes for some CPUs)
PASS_THROUGH = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
                "PYTHONPATH", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TZ")
# the system's own files in a job's root, read-only: programs and libraries, and /sys, which
# CUDA and the OpenMP runtime read (hardware, no one's data). Merged-/usr links come as links
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# of /etc only what the C library, Python and compilers look up: users (nobody's name), the
# loader's cache, time zone, names of protocols; never keys, shadow files or service configs
ETC = ("passwd", "group", "nsswitch.conf", "hosts", "host.conf", "gai.conf", "ld.so.cache", "ld.so.conf",
       "ld.so.conf.d", "localtime", "timezone", "os-release", "alternatives", "mime.types", "protocols",
       "services", "python3", f"python3.{sys.version_info.minor}")
# of /dev the usual character devices and the GPUs' (NVIDIA, AMD, DRM render nodes)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "nvidia*", "nvidia-caps", "dri", "kfd")
WALK_LIMIT = 4096  # entries looked at when deciding whether nobody can read an input


class Isolation(str, enum.Enum):
    NAMESPACES = "namespaces"
    LIMITS = "limits"
    NONE = "none"


CHOICES = ("auto", *(i.value for i in Isolation))


@dataclass(frozen=True)
class Limits:
    """Per-job resource limits (setrlimit; a job cannot raise them again). Memory is also
    watched by resident size over the job's whole process tree, with what its private /tmp
    and /dev/shm hold (executors.worker), since an address-space limit breaks CUDA, which
    reserves far more than it uses."""
    cpu_s: int | None = None          # CPU seconds, all threads together (None: from the deadline)
    # threads count too (torch and OpenMP start about two per core), the job's own: each job
    # is a uid of its own (users.py), or in a user namespace of its own
    processes: int = 4096
    file_mb: int = 65536              # largest file the job may write (a real model's shard is ~5 GB)
    open_files: int = 4096
    address_mb: int | None = None     # virtual memory; set it for CPU-only jobs such as programs
    tmp_mb: int = 1024                # the private /tmp and /dev/shm, each (memory: counted as the job's)

    def rlimits(self) -> dict[str, int | None]:
        mb = 2 ** 20
        return {"RLIMIT_CPU": self.cpu_s, "RLIMIT_NPROC": self.processes,
                "RLIMIT_FSIZE": self.file_mb * mb, "RLIMIT_NOFILE": self.open_files,
                "RLIMIT_AS": self.address_mb * mb if self.address_mb else None, "RLIMIT_CORE": 0}


@dataclass(frozen=True)
class Jail:
    """What one job may reach: the paths it reads and writes (each a whole path, never cut at
    its punctuation; besides the Python environment and the system's files, which every job
    reads), its limits, its environment, and who it is."""
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    env: dict = field(default_factory=dict)
    reveal: tuple[str, ...] = ()  # concealed paths this job may see after all (the evaluator's data)
    hide: tuple[str, ...] = ()    # paths hidden from this job alone (conceal: from every job)
    user: int | None = None       # its uid where we are root at `namespaces` (users.lease); None: nobody


_concealed: set[str] = set()


def conceal(*paths: str | Path) -> None:
    """Hide these paths from every job this process starts, even where a path it reads or the
    Python environment contains them: the split keys, a task's file of held-out rows. (Under
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
        return "namespaces (no network, sees only its inputs, read-only but its outputs, unprivileged, limits, subtree killed)"
    if level is Isolation.LIMITS:
        return (f"WARNING: process limits only ({why_not() or 'chosen'}): untrusted code can read files, "
                "reach the network and leave processes behind")
    return "WARNING: none (sandbox: none): untrusted code runs with the controller's rights"


def declared_paths(reads, cwd: Path | None = None) -> set[str]:
    """The existing paths among `reads` (a Call's declared inputs), each taken whole and made
    absolute: exactly what the job reads. A string that is no existing path names nothing
    (a task spec is never one: its caller declares the task's files, Task.files)."""
    cwd = Path(cwd or os.getcwd())
    return {str((cwd / p).absolute()) for p in map(str, reads) if p and (cwd / p).exists()}


def named_paths(value, cwd: Path | None = None) -> set[str]:
    """The existing paths that `value` (a job's arguments: lists, dicts and their keys,
    strings) holds whole, each with a '/' in it: what a job whose Call declares no `reads`
    reads. A string is a path as a whole or not at all: never a prefix of it (`/data/exp` of
    '/data/exp=2/t.jsonl', which would show the job a directory beside its own)."""
    cwd = Path(cwd or os.getcwd())
    if isinstance(value, dict):  # keys too: the evaluator's jobs are {checkpoint: splits}
        return set().union(*(named_paths(k, cwd) | named_paths(v, cwd) for k, v in value.items()))
    if isinstance(value, (list, tuple, set, frozenset)):
        return set().union(*(named_paths(v, cwd) for v in value))
    if isinstance(value, (str, Path)) and ("/" in str(value) or os.sep in str(value)):
        return declared_paths([value], cwd)
    return set()


def _environment_paths(outputs=()) -> set[str]:
    """The Python environment every job runs in: interpreter, stdlib, site-packages, our sources,
    the directories on sys.path and LD_LIBRARY_PATH. Of a sys.path entry that holds the
    controller's working directory (`python -m` or PYTHONPATH=. put it there) or one of
    `outputs`, only what Python imports from it, its modules and packages: not the runs
    beside them."""
    import site

    import evotrainer
    here = [os.getcwd(), *outputs]
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             str(Path(evotrainer.__file__).resolve().parents[1]), str(Path(sys.executable).resolve().parent),
             *site.getsitepackages()}
    for p in filter(os.path.isabs, sys.path):
        if not any(_within(h, p) for h in here):
            paths.add(p)
        elif os.path.isdir(p):
            paths |= {str(c) for c in Path(p).iterdir() if c.suffix == ".py" or (c / "__init__.py").is_file()}
    paths |= {p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if os.path.isabs(p)}
    return {p for p in paths if os.path.exists(p) and p != "/"}


def _mount_of(path: str, mounts: list[str]) -> str:
    """The mount point `path` lives on (the longest that holds it)."""
    return max((m for m in mounts if _within(path, m)), key=len, default="/")


def _within(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies under it (both absolute, normalised)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _holds_scratch(path: str) -> bool:
    """Whether binding `path` would cover the job's own /tmp, /dev or /proc with the host's
    (a run started from /tmp, or from /): such a path is not bound; what a job needs inside it
    is named on its own."""
    return any(_within(own, path) or _within(path, own) and own != "/tmp" for own in ("/tmp", "/dev", "/proc"))


def _links_to(path: str) -> dict[str, str]:
    """The symbolic links met on the way to `path` (its last component included), link ->
    target: the job's root has them too, so the job reaches each path by the name it was given
    (/lib -> usr/lib, a data directory linked from elsewhere)."""
    out: dict[str, str] = {}
    todo = [os.path.abspath(path)]
    while todo and len(out) < 40:
        parts, cur = todo.pop().strip("/").split("/"), "/"
        for i, part in enumerate(parts):
            nxt = os.path.join(cur, part)
            if part and os.path.islink(nxt):
                out[nxt] = os.readlink(nxt)
                todo.append(os.path.normpath(os.path.join(cur, out[nxt], *parts[i + 1:])))
                break
            cur = nxt
    return out


def _unreadable_by_others(path: str) -> bool:
    """Whether a job running as nobody could not read some of `path` by its mode bits (the
    first WALK_LIMIT entries of a tree). Its parents do not matter: the job's root has its own."""
    todo, seen = [path], 0
    while todo and seen < WALK_LIMIT:
        p = todo.pop()
        seen += 1
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        need = 0o005 if stat.S_ISDIR(st.st_mode) else 0o004
        if st.st_mode & need != need:
            return True
        if stat.S_ISDIR(st.st_mode):
            todo += [os.path.join(p, n) for n in os.listdir(p)]
    return False


_idmappable: dict[int, str] = {}


def _idmap_refused(path: str) -> str:
    """Why the filesystem `path` lies on cannot be bound idmapped ('' if it can): tried once
    per filesystem, on a detached copy of the mount that is never attached."""
    dev = os.stat(path).st_dev
    if dev not in _idmappable:
        try:
            r = subprocess.run([sys.executable, "-I", "-S", str(Path(__file__).with_name("inside.py")), "--idmap", path],
                               capture_output=True, text=True, timeout=30)
            _idmappable[dev] = "" if r.returncode == 0 else (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
    return _idmappable[dev]


def _owner_map(path: str, user: int | None) -> list[int] | None:
    """For an input the job's `user` (None: we are not root, the job reads as we do) cannot
    read by its mode: [uid, gid] of its owner, then the job's, for an idmapped bind that shows
    the owner's files as the job's (read-only; the files' modes stay as they are). None when
    the job reads it as it is."""
    if user is None or not _unreadable_by_others(path):
        return None
    st = os.stat(path)
    if st.st_uid == user:
        return None
    why = _idmap_refused(path)
    if why:
        raise UsageError(f"sandboxed jobs run as users of their own (evotrainer runs as root here) and cannot read "
                         f"'{path}', and its filesystem refuses an idmapped bind that would let them ({why}): make it "
                         "readable by others (chmod -R o+rX), or run as a non-root user")
    return [st.st_uid, st.st_gid, user, user]


def root_contents(read, write=(), user: int | None = None, cwd: Path | None = None) -> dict:
    """What a job's root holds besides its tmpfs mounts: binds [[path, how], ...] (how: "rw",
    "ro", or [uid, gid, job uid, job gid]: read-only, idmapped so that this owner reads as the
    job's `user`), the links on the way to them, and the devices: the system's files, the
    Python environment and the devices every job has, and its own `read` and `write`, each
    a whole path. Paths are bound at their real location, outer first; a read path inside
    another read path of the same kind is not bound again."""
    cwd = Path(cwd or os.getcwd())
    binds: dict[str, object] = {}
    links: dict[str, str] = {}
    mounts = mount_points()
    on = functools.partial(_mount_of, mounts=mounts)

    def carried(path: str, by: str) -> bool:
        """A bind of `by` shows `path`: a bind carries its own mount's files, not those of a mount
        inside it (a GPU driver's directory mounted under /usr, say)."""
        return _within(path, by) and on(path) == on(by)

    def add(path, how) -> None:
        p = os.path.join(cwd, path)
        if not os.path.lexists(p):
            return
        links.update(_links_to(p))
        real = os.path.realpath(p)
        if how == "read" and any(carried(real, q) and binds[q] == "ro" for q in binds):
            return  # the system's files or the environment hold it already
        if os.path.exists(real) and not _holds_scratch(real) and real not in binds:
            binds[real] = how if how != "read" else (_owner_map(real, user) or "ro")
            if "/snapshots/" in real:  # a Hugging Face cache snapshot links into the repo's blobs/
                add(real.split("/snapshots/")[0], how)

    for p in write:
        add(p, "rw")
    for p in (*SYSTEM, *_environment_paths(binds), *(f"/etc/{e}" for e in ETC)):
        add(p, "ro")
    for p in read:
        add(p, "read")
    # a system or library path on a mount of its own inside another bind is bound as that whole
    # mount: the outer bind shows its mount point, but the job's root cannot create a deeper one
    for p, how in list(binds.items()):
        m = on(p)
        if how == "ro" and m != p and any(q != m and _within(m, q) for q in binds):
            binds.setdefault(m, binds.pop(p))
    kept = [(p, how) for p, how in binds.items()
            if how == "rw" or not any(q != p and carried(p, q) and binds[q] == how for q in binds)]
    devices = sorted(d for pattern in DEVICES for d in glob.glob(f"/dev/{pattern}"))
    return {"binds": sorted(kept, key=lambda b: (len(b[0]), b[0])), "links": sorted(links.items()), "dev": devices}


def job_env(extra: dict | None = None) -> dict[str, str]:
    """The whole environment a job sees: no keys, no tokens, nothing of the caller's but PASS_THROUGH."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp",
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env |= {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
    return env | (extra or {})


def _masks(jail: Jail) -> list[str]:
    return sorted((_concealed | {str(Path(p).resolve()) for p in jail.hide}) - {str(Path(p).resolve()) for p in jail.reveal})


def command(argv: list[str], jail: Jail, level: Isolation, *, job_dir: Path, cwd: Path | None = None,
            timeout_s: float | None = None) -> tuple[list[str], dict[str, str] | None]:
    """(argv, env) to start `argv` as a sandboxed job at `level`, its spec in `job_dir`
    (prepare). With Isolation.NONE it is the plain command in the caller's environment."""
    if level is Isolation.NONE:  # trusted, but still dies with its caller (a Ray worker cancelled with force)
        setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
        return ([setpriv, "--pdeathsig", "KILL", *argv] if setpriv else argv), None
    spec = prepare(argv, jail, level, job_dir=job_dir, cwd=cwd, timeout_s=timeout_s)
    inside = [sys.executable, "-I", "-S", str(Path(__file__).with_name("inside.py")), str(job_dir / "sandbox.json")]
    if spec["mounts"]:
        # setpriv first: unshare (our child) dies with us, and its child, the job, with it
        return [spec["setpriv"], "--pdeathsig", "KILL", *_unshare_args(), *inside], spec["env"]
    return ([spec["setpriv"], "--pdeathsig", "KILL", *inside] if spec["setpriv"] else inside), spec["env"]


def prepare(argv: list[str], jail: Jail, level: Isolation, *, job_dir: Path, cwd: Path | None = None,
            timeout_s: float | None = None) -> dict:
    """The spec of a job at `level` (NAMESPACES or LIMITS), written to job_dir/sandbox.json for
    the sandbox's first process (inside.py, the fork server's wrapper) and returned: its root
    (binds, links, devices, masks), limits, user and environment. `job_dir` is the
    controller's: the job never writes it (nor sees it, but for what `jail.read` names), so
    no process of any job can rewrite the spec that root reads. Its output directories are
    made and, where the job has a user of its own, given to it."""
    cwd = Path(cwd or os.getcwd()).resolve()
    env = job_env(jail.env)
    limits = jail.limits.rlimits()
    if limits["RLIMIT_CPU"] is None and timeout_s:
        # the deadline kills on wall time; this stops a job that escaped it, with room for every core
        limits["RLIMIT_CPU"] = int(timeout_s * (os.cpu_count() or 1)) + 60
    write = sorted({str(Path(p).resolve()) for p in jail.write})
    for p in write:
        Path(p).mkdir(parents=True, exist_ok=True)
    mounts = level is Isolation.NAMESPACES
    user = (NOBODY if jail.user is None else jail.user) if os.geteuid() == 0 and mounts else None
    if user is not None:  # its output directories, and what they hold, must be its own
        for p in write:
            _give(p, user)
        if user != NOBODY:  # no account owns it: what getpass.getuser() and libraries ask first
            env |= {"USER": "evotrainer-job", "LOGNAME": "evotrainer-job"}
    spec = {"argv": argv, "env": env, "cwd": str(cwd), "tmp_mb": jail.limits.tmp_mb, "limits": limits,
            "uid": user, "gid": user, "setpriv": shutil.which("setpriv"), "mounts": mounts, "mask": _masks(jail)}
    if mounts:
        spec |= root_contents(jail.read, write, user, cwd)
    fd = os.open(job_dir / "sandbox.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w") as f:
        json.dump(spec, f)
    return spec


def _give(path: str, user: int) -> None:
    """Make `path` and everything under it `user`'s (links themselves, never what they lead
    to): a job resumed in a directory an earlier job (another uid) wrote."""
    os.lchown(path, user, user)
    for top, dirs, files in os.walk(path):  # links are not followed
        for name in dirs + files:
            os.lchown(os.path.join(top, name), user, user)


def record(level: Isolation) -> dict:
    """What a run stores of its sandbox (status and every report show it)."""
    return {"level": level.value, "detail": describe(level)}
