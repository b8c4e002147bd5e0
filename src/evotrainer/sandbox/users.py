"""A user of its own for every sandboxed job, where the controller is root.

RLIMIT_NPROC counts the processes (threads included) of a real uid, machine-wide. Were every
job `nobody`, one job that forked up to its limit would leave its concurrent siblings (the
control trained beside a child, an evaluator) no room to start a thread. So each running job
is lent a uid of its own from FIRST_UID on: its limit counts its own processes only, and
what it writes is its own. The uid goes back when the job's process tree is gone, and the
next job may get it again.

The range is one that systemd leaves unused (its UIDS-GIDS.md: 1879048192-2147352575), far
from the 100000+ ranges /etc/subuid usually lends to rootless containers, and no account
owns it: a job has no entry in /etc/passwd (its environment says USER, which is what
getpass and most libraries ask first). Two controllers on one machine (two runs, Ray tasks
on one node) never lend one uid twice: a lease holds an exclusive lock on a file named for
its uid in LOCK_DIR (root's own directory, on /run: gone at reboot), which the kernel
releases when the controller dies, with its jobs.

Where the controller is not root, jobs run in user namespaces and have no uid to lend: each
is the controller's own user outside its namespace. Since Linux 5.14 the kernel also counts
processes per user namespace, and each job has its own, so a job's RLIMIT_NPROC still counts
its own processes (all of them together stay under the controller's own RLIMIT_NPROC);
before 5.14 there is one count for the controller's uid and every job.
"""
from __future__ import annotations

import fcntl
import os
import stat
import threading
from dataclasses import dataclass

FIRST_UID = 0x7000_0000  # 1879048192
COUNT = 65536            # uids in the range: more jobs than any machine runs at once
LOCK_DIR = "/run/evotrainer-uids"

_held: set[int] = set()  # this process's leases (the lock files say it across processes)
_lock = threading.Lock()


@dataclass
class Lease:
    """One uid lent to one job, until `release` (once the job's processes are gone)."""
    uid: int
    _fd: int | None = None

    def release(self) -> None:
        with _lock:
            if self._fd is not None:
                os.close(self._fd)  # the lock goes with it
                self._fd = None
            _held.discard(self.uid)


def lease() -> Lease:
    """The lowest uid of the range that no job of this or another controller holds."""
    locks = _lock_dir()
    with _lock:
        for uid in range(FIRST_UID, FIRST_UID + COUNT):
            if uid in _held:
                continue
            fd = _try_lock(locks, uid) if locks else None
            if fd == BUSY:
                continue  # another controller's job has it
            _held.add(uid)
            return Lease(uid, fd)
    raise RuntimeError(f"all {COUNT} job uids from {FIRST_UID} are in use")


def _lock_dir() -> str | None:
    """LOCK_DIR, made if need be, where it is root's own directory (not a link, not writable
    by others); else None: leases are then unique within this process only."""
    try:
        os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
        st = os.lstat(LOCK_DIR)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        return None
    return LOCK_DIR


BUSY = -1


def _try_lock(locks: str, uid: int) -> int | None:
    """The locked file's descriptor; BUSY where another holds it; None where no lock file can
    be had (a full /run): unique within this process, as without LOCK_DIR."""
    try:
        fd = os.open(os.path.join(locks, str(uid)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return BUSY
