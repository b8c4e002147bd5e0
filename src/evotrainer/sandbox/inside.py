"""The sandbox's first process: runs as PID 1 of fresh namespaces, sets the jail up, then
becomes the job.

`launch.py` starts it under util-linux `unshare` (new mount, network, PID, IPC and UTS
namespaces, plus a user namespace when the controller is not root), with the job's spec
(JSON) as its only argument. Here, still privileged inside those namespaces, it:

1. opens every path the job may reach (before anything covers them);
2. remounts every mount read-only, so that no bind of the host's files is writable by chance;
3. builds the job's root on an empty tmpfs: the spec's binds at their own names (the
   system's files, the Python environment and the job's inputs read-only, an input only its
   owner can read idmapped so that the job's user reads it as that owner; the job's outputs
   writable), the links on the way to them, a minimal /dev, the PID namespace's /proc, a
   private /tmp and /dev/shm, an empty /run; covers the concealed paths (split keys,
   held-out data) even inside those binds; makes that root read-only and pivots into it,
   the host's tree detached: nothing else of the machine is reachable, by any name;
4. brings the network namespace's loopback up (its only interface: the job's own processes
   may talk to each other, nothing beyond), and sets resource limits (CPU time, processes,
   file size, open files, address space);
5. execs `setpriv`, which drops to an unprivileged user (or, in a user namespace, drops every
   capability), sets no_new_privs and the parent-death signal, and execs the job with the
   spec's environment and nothing else.

Because the job is PID 1 of its PID namespace, the kernel kills every process in it, those
that called setsid() included, the moment the job exits or is killed; and `unshare` (outside)
kills the job when it dies itself, which happens when the controller dies (see launch.py).

A job forked from the fork server (forkserver.py) goes through steps 1-4 here too
(`confine`), and step 5 in its own process (`drop_privileges`), without an exec.

Only the standard library here: this runs before the job's own interpreter set-up.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import stat
import struct
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MNT_DETACH = 2
# the per-mount flags a remount must repeat (a user namespace may not clear locked ones)
KEEP = MS_NOSUID | MS_NODEV | MS_NOEXEC | 16 | 64 | 1024 | 2048 | 4096  # ST_* equal MS_* here
# the new mount API (open_tree, move_mount: Linux 5.2; mount_setattr: 5.12), one number everywhere
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, AT_FDCWD, AT_EMPTY_PATH, AT_RECURSIVE = 1, -100, 0x1000, 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 1, 2, 4, 0x100000
CLONE_NEWUSER, PR_SET_DUMPABLE = 0x10000000, 4
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
NEW_ROOT = "/tmp"  # where the job's root is built: any directory will do, every source is open by then

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source} on {target}")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def mount_points() -> list[str]:
    """Every mount point, outermost first (mountinfo escapes spaces as octal)."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    return sorted(set(points), key=len)


def _read_only_everywhere() -> None:
    for mp in mount_points():
        if _within(mp, "/proc"):
            continue  # unshare mounted a fresh /proc for the new PID namespace
        try:
            keep = os.statvfs(mp).f_flag & KEEP
            _mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            if mp == "/":
                raise  # the root must be read-only, or there is no jail
            # an overmounted or vanished point (nothing reachable through it stays writable:
            # everything under / was remounted read-only)


def _tmpfs(path: str, size_mb: float, mode: str, flags: int = 0) -> None:
    os.makedirs(path, exist_ok=True)
    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | flags, f"size={max(int(size_mb * 1024), 4)}k,mode={mode}")


def _point(target: str, is_dir: bool) -> None:
    """A mount point for a bind: a directory, or an empty file."""
    if os.path.lexists(target):
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if is_dir:
        os.mkdir(target)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


# --- idmapped binds: the new mount API -------------------------------------------------------

_userns_fds: dict[tuple[int, ...], int] = {}


def _userns(uid: int, gid: int, to_uid: int, to_gid: int) -> int:
    """A user namespace in which uid/gid are to_uid/to_gid (the job's user): as a bind's idmap,
    the files that owner owns read as the job's (their modes unchanged). A child process holds
    it while we open it."""
    ids = (uid, gid, to_uid, to_gid)
    if ids in _userns_fds:
        return _userns_fds[ids]
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(done_w)
        os.write(ready_w, b"1" if _libc.unshare(CLONE_NEWUSER) == 0 else b"0")
        os.read(done_r, 1)
        os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(errno.EPERM, "cannot create a user namespace for an idmapped bind")
        for name, inner, outer in (("uid_map", uid, to_uid), ("gid_map", gid, to_gid)):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"{inner} {outer} 1\n")
        _userns_fds[ids] = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)
    return _userns_fds[ids]


def _clone(fd: int) -> int:
    """A detached copy of the mount tree `fd` opened (a plain copy, else with its submounts:
    in a nested sandbox the outer one's mounts under it are locked to it)."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH
    try:
        return _check(_libc.syscall(SYS_OPEN_TREE, fd, b"", flags), "open_tree")
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return _check(_libc.syscall(SYS_OPEN_TREE, fd, b"", flags | AT_RECURSIVE), "open_tree")


def _read_only(tree: int, owner: list[int] | None) -> None:
    """Make a detached tree read-only, and idmapped where `owner` ([uid, gid, job uid, job
    gid]: the owner's files shown as the job's) is given."""
    attr = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_IDMAP if owner else 0)
    buf = ctypes.create_string_buffer(struct.pack("QQQQ", attr, 0, 0, _userns(*owner) if owner else 0))
    _check(_libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE, buf, ctypes.c_size_t(32)),
           "mount_setattr (idmapped mounts need Linux 5.12 and a filesystem that supports them)")


def _attach(tree: int, target: str) -> None:
    _check(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH),
           f"move_mount on {target}")


# --- the job's root -------------------------------------------------------------------------

def _bind(fd: int, target: str, how) -> None:
    """Bind what `fd` opened at `target`: "ro"/"rw", [uid, gid, job uid, job gid] (read-only,
    idmapped), or as it is ("proc", "dev": /proc and device nodes keep their own flags)."""
    _point(target, stat.S_ISDIR(os.fstat(fd).st_mode))
    if isinstance(how, list):
        tree = _clone(fd)
        _read_only(tree, how)
        _attach(tree, target)
        os.close(tree)
        return
    try:
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
    except OSError as e:
        # in a sandbox nested in another (a worker judging programs) the outer one's mounts
        # under the path are locked, and the kernel refuses a plain bind over them (EINVAL)
        if e.errno != errno.EINVAL:
            raise
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    if how in ("ro", "rw"):
        keep = os.statvfs(target).f_flag & KEEP
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | keep | (MS_RDONLY if how == "ro" else 0))


def _links(links: list, root: str) -> None:
    for link, target in links:
        if not os.path.lexists(root + link):
            os.makedirs(os.path.dirname(root + link), exist_ok=True)
            os.symlink(target, root + link)


def _cover(paths: list[str], root: str) -> None:
    """Concealed paths: an empty unreadable directory, or /dev/null for a file, over each."""
    for path in paths:
        if os.path.isdir(root + path):
            _tmpfs(root + path, 0, "0000")
        elif os.path.exists(root + path):
            _mount("/dev/null", root + path, None, MS_BIND)


def _pivot() -> None:
    """Enter the root built at NEW_ROOT, the host's tree detached."""
    os.chdir(NEW_ROOT)
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:  # no pivot_root number known here
        _mount(".", "/", None, MS_MOVE)  # the root moved over the host's, which a job without
        os.chroot(".")                   # capabilities cannot climb out of
        os.chdir("/")
        return
    # the old root, stacked on the new one by pivot_root(".", "."), goes
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount the host's root")
    os.chdir("/")


def _jail(spec: dict) -> None:
    os.umask(0o022)
    # 1. everything the job reaches, opened while it is still visible
    opened = [(path, how, os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC))
              for path, how in [*spec["binds"], *((d, "dev") for d in spec["dev"]), ("/proc", "proc")]
              if os.path.exists(path)]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing here propagates back out
    # 2. read-only everywhere
    _read_only_everywhere()
    # 3. the job's root: outer paths first, so a writable directory inside a read-only one stays writable
    _tmpfs(NEW_ROOT, 16, "0755")
    scratch = [("/tmp", "1777"), ("/dev", "0755"), ("/dev/shm", "1777")]
    for path, how, fd in sorted([*opened, *((p, mode, None) for p, mode in scratch)], key=lambda e: len(e[0])):
        if fd is None:
            _tmpfs(NEW_ROOT + path, 1 if path == "/dev" else spec["tmp_mb"], how)
        else:
            _bind(fd, NEW_ROOT + path, how)
            os.close(fd)
    _links([*spec["links"], ("/dev/fd", "/proc/self/fd"), *((f"/dev/{s}", f"/proc/self/fd/{i}")
                                                             for i, s in enumerate(("stdin", "stdout", "stderr")))],
           NEW_ROOT)
    _mount(None, NEW_ROOT + "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.makedirs(NEW_ROOT + "/run", exist_ok=True)  # empty: the host's sockets live in its own
    os.makedirs(NEW_ROOT + spec["cwd"], exist_ok=True)
    _cover(spec["mask"], NEW_ROOT)
    _mount(None, NEW_ROOT, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _pivot()


def _limits(lim: dict) -> None:
    for name, value in lim.items():
        if value is not None:
            res = getattr(resource, name)
            resource.setrlimit(res, (int(value), int(value)))


def _loopback_up() -> None:
    """The new network namespace's loopback, up: the processes of one job (data-parallel ranks,
    trainer/distributed.py) meet on its 127.0.0.1. The namespace has no other interface, so
    nothing reaches out of it, and the host's own loopback is another namespace's."""
    import fcntl
    import socket
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # struct ifreq: a name, then the flags
        flags = struct.unpack_from("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def confine(spec: dict) -> None:
    """Steps 1-4 in this process (PID 1 of the new namespaces): the root, the loopback, the
    limits, the job's working directory."""
    if spec["mounts"]:
        _jail(spec)
        _loopback_up()
    # 4. limits, which the job cannot raise again
    _limits(spec["limits"])
    os.chdir(spec["cwd"])


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    confine(spec)
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


# --- step 5 without exec: a job forked from a process that has imported torch (forkserver.py) ---

PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 38, 47, 4
CAP_VERSION_3 = 0x20080522


def drop_privileges(spec: dict, last_cap: int) -> None:
    """What `setpriv` does for a cold job (main above), in this process: with namespaces every
    capability gone (bounding, ambient, inheritable, permitted, effective), then the job's own
    user and no groups where the controller is root; no_new_privs; death with the parent, set again
    after the change of user, which clears it."""
    if spec["mounts"]:
        for cap in range(last_cap + 1):
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop a capability from the bounding set")
        _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    if spec["uid"] is not None:
        os.setgroups([])
        os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    if spec["mounts"]:  # header {version, pid 0: this thread}, then two all-zero {effective, permitted, inheritable}
        header, data = struct.pack("Ii", CAP_VERSION_3, 0), bytes(24)
        _check(_libc.capset(header, data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "parent-death signal")


def can_idmap(path: str) -> None:
    """`inside.py --idmap PATH` (the controller, once per filesystem): exit 0 when a bind of
    PATH can be idmapped here, else 1 with why on stderr. The copy is never attached."""
    st = os.stat(path)
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        _read_only(_clone(fd), [st.st_uid, st.st_gid, 65534, 65534])
    except OSError as e:
        print(e, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1] == "--idmap":
        can_idmap(sys.argv[2])
    else:
        main(sys.argv[1])
