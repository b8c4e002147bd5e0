"""The sandbox's first process: runs as PID 1 of fresh namespaces, sets the jail up, then
becomes the job.

`launch.py` starts it under util-linux `unshare` (new mount, network, PID, IPC and UTS
namespaces, plus a user namespace when the controller is not root), with the job's spec
(JSON) as its only argument. Here, still privileged inside those namespaces, it:

1. opens every path the job must reach (before anything hides them);
2. remounts every mount read-only, and puts an empty tmpfs over home directories (where
   keys and tokens live), /tmp (the job's private scratch) and /dev/shm;
3. binds back the paths the job reads (read-only) and writes (read-write) at their own names,
   then covers the concealed ones (split keys, held-out data) even inside those;
4. sets resource limits (CPU time, processes, file size, open files, address space);
5. execs `setpriv`, which drops to an unprivileged user (or, in a user namespace, drops every
   capability), sets no_new_privs and the parent-death signal, and execs the job with the
   spec's environment and nothing else.

Because the job is PID 1 of its PID namespace, the kernel kills every process in it, those
that called setsid() included, the moment the job exits or is killed; and `unshare` (outside)
kills the job when it dies itself, which happens when the controller dies (see launch.py).
Only the standard library here: this runs before the job's own interpreter set-up.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
# the per-mount flags a remount must repeat (a user namespace may not clear locked ones)
KEEP = MS_NOSUID | MS_NODEV | MS_NOEXEC | 16 | 64 | 1024 | 2048 | 4096  # ST_* equal MS_* here

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _mount_points() -> list[str]:
    """Every mount point, outermost first (mountinfo escapes spaces as octal)."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    return sorted(set(points), key=len)


def _read_only_everywhere() -> None:
    for mp in _mount_points():
        if mp == "/proc" or mp.startswith("/proc/"):
            continue  # unshare mounted a fresh /proc for the new PID namespace
        try:
            keep = os.statvfs(mp).f_flag & KEEP
            _mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            if mp == "/":
                raise  # the root must be read-only, or there is no jail
            # an overmounted or vanished point (nothing reachable through it stays writable:
            # everything under / was remounted read-only)


def _tmpfs(path: str, size_mb: int, mode: str) -> None:
    if os.path.isdir(path):
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_mb}m,mode={mode}")


def _bind(fd: int, path: str, writable: bool, is_dir: bool) -> None:
    """Bind what `fd` opened (before the tmpfs mounts hid it) at `path`, read-only unless writable."""
    if is_dir:
        os.makedirs(path, exist_ok=True)
    elif not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()
    try:
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
    except OSError as e:
        # in a sandbox nested in another (a worker judging programs) the outer one's mounts
        # under `path` are locked, and the kernel refuses a plain bind over them (EINVAL); a
        # recursive one takes them along. Not always recursive: that would also take along
        # the tmpfs this jail just put over the path (a read path /tmp would come back empty)
        if e.errno != errno.EINVAL:
            raise
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY)
    _mount(None, path, None, flags)


def _limits(lim: dict) -> None:
    for name, value in lim.items():
        if value is not None:
            res = getattr(resource, name)
            resource.setrlimit(res, (int(value), int(value)))


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    if spec["mounts"]:
        _jail(spec)
    # 4. limits, which the job cannot raise again
    _limits(spec["limits"])
    os.chdir(spec["cwd"])
    # 5. an unprivileged job, with only the spec's environment
    argv = spec["argv"]
    if spec["setpriv"]:
        drop = ["--no-new-privs", "--pdeathsig", "KILL"]  # pdeathsig again: a change of user clears it
        if spec["mounts"]:
            drop += ["--inh-caps=-all", "--bounding-set=-all", "--ambient-caps=-all"]
        if spec["uid"] is not None:
            drop += ["--reuid", str(spec["uid"]), "--regid", str(spec["gid"]), "--clear-groups"]
        # (without --reuid, in a user namespace, the job's root is the controller's own user outside)
        argv = [spec["setpriv"], *drop, "--", *argv]
    os.execve(argv[0], argv, spec["env"])


def _jail(spec: dict) -> None:
    # 1. everything the job reaches, opened while it is still visible
    keep = [(p, w, os.open(p, os.O_PATH | os.O_CLOEXEC), os.path.isdir(p))
            for p, w in [(p, False) for p in spec["read"]] + [(p, True) for p in spec["write"]]
            if os.path.exists(p)]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing here propagates back out
    # 2. read-only everywhere; empty homes, a private /tmp and /dev/shm
    _read_only_everywhere()
    for d in spec["hide"]:
        _tmpfs(d, 16, "0755")
    _tmpfs("/tmp", spec["tmp_mb"], "1777")
    _tmpfs("/dev/shm", spec["tmp_mb"], "1777")
    # 3. the job's paths at their own names (a path under /tmp or a hidden home too);
    # outer paths first, so that a writable directory inside a read-only one stays writable
    for path, writable, fd, is_dir in sorted(keep, key=lambda k: len(k[0])):
        _bind(fd, path, writable, is_dir)
        os.close(fd)
    # concealed paths last: an empty directory, or /dev/null for a file, over each
    for path in spec["mask"]:
        if os.path.isdir(path):
            _tmpfs(path, 1, "0000")
        elif os.path.exists(path):
            _mount("/dev/null", path, None, MS_BIND)


if __name__ == "__main__":
    main(sys.argv[1])
