"""What a job wrote, as the trusted side reads it: the one way into a job's directory.

Inside a job assume arbitrary code with a shell (the sandbox, not the static checks, is what
holds). So the controller, the evaluator's launcher and the CLI open a file under a job's
output directory only through this module: every component below the directory the
controller named is opened with O_NOFOLLOW (a link is refused, never followed), a file must
be a regular one and is opened non-blocking (a FIFO would hang the reader, and with it the
pool's watchdog), every read stops at a cap, and JSON is checked for its shape. Whatever is
wrong raises `BadOutput`, one line naming the file, which the caller turns into a label on
that trial (`bad_output`), never an error of the run.

The directory itself (`root`) is the caller's: it made it, and a job cannot replace its own
mount point. What the controller writes into a job's directory (a cache key, a run.json that
names this run's train spec) is written as a new file renamed into place under the directory's
descriptor, so a link planted at that name is replaced, never written through.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import uuid
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")
KiB, MiB, GiB = 2 ** 10, 2 ** 20, 2 ** 30

# caps on what one read takes in: far above what an honest job writes, far below what would
# take the controller's memory (a real model's 150-step segment writes ~100 MB of evidence)
JSON_CAP = 1 * MiB           # run.json, a cache marker, a small config
METRICS_CAP = 64 * MiB       # one line per step
EVIDENCE_CAP = 1 * GiB       # one line per rollout
ENTRIES_CAP = 100_000        # files and directories in one job's output

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class BadOutput(ValueError):
    """A job's file the trusted side refuses: one line naming it and why."""


class Missing(BadOutput):
    """The file is not there (some readers take that as 'nothing yet')."""


def shown(name: object) -> str:
    """A name or value a job chose, safe in a one-line message."""
    return ascii(str(name))[1:-1][:160]


def _parts(rel: str | PurePosixPath) -> tuple[str, ...]:
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("..", ".") for p in parts):
        raise ValueError(f"not a relative path inside a job's directory: {rel!r}")
    return parts


def open_dir(root: Path | str, rel: str | PurePosixPath = "") -> int:
    """A descriptor of `root`/`rel`, no link followed from `root`'s own name down."""
    fd = _open(os.open, str(root), _DIR, root)
    for part in (_parts(rel) if str(rel) not in ("", ".") else ()):
        try:
            nxt = _open(lambda p, f: os.open(p, f, dir_fd=fd), part, _DIR, Path(root, rel))
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _open(opener, name: str, flags: int, shown_as) -> int:
    try:
        return opener(name, flags)
    except FileNotFoundError:
        raise Missing(f"{shown(shown_as)} does not exist") from None
    except OSError as e:  # ELOOP / ENOTDIR: a link or a file where a directory should be
        raise BadOutput(f"{shown(shown_as)} {_why(e)}") from None


def _why(e: OSError) -> str:
    if e.errno in (errno.ELOOP, errno.EMLINK):
        return "is a symbolic link"
    if e.errno == errno.ENOTDIR:
        return "has a link or a file where a directory should be"
    return f"cannot be opened ({e.strerror or type(e).__name__})"


def open_file(root: Path | str, rel: str | PurePosixPath) -> tuple[int, os.stat_result]:
    """(descriptor, its stat) of the regular file `root`/`rel`, opened without following a link
    and without blocking (a FIFO or a device is refused after an open that cannot hang)."""
    parts = _parts(rel)
    d = open_dir(root, PurePosixPath(*parts[:-1])) if len(parts) > 1 else open_dir(root)
    try:
        fd = _open(lambda p, f: os.open(p, f, dir_fd=d), parts[-1], _FILE, Path(root, rel))
    finally:
        os.close(d)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BadOutput(f"{shown(Path(root, rel))} is not a regular file")
    return fd, st


def read_bytes(root: Path | str, rel: str | PurePosixPath, cap: int, tail: bool = False) -> bytes:
    """The bytes of `root`/`rel`, at most `cap` of them: a larger file is refused (or, with
    `tail`, only its last `cap` bytes are read: a log)."""
    fd, st = open_file(root, rel)
    try:
        if st.st_size > cap:
            if not tail:
                raise BadOutput(f"{shown(Path(root, rel))} holds {st.st_size} bytes, more than the {cap} read")
            os.lseek(fd, st.st_size - cap, os.SEEK_SET)
        chunks, left = [], cap
        while left > 0 and (chunk := os.read(fd, min(left, MiB))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(root: Path | str, rel: str | PurePosixPath, cap: int, tail: bool = False) -> str:
    return read_bytes(root, rel, cap, tail).decode("utf-8", "replace")


def exists(root: Path | str, rel: str | PurePosixPath) -> bool:
    """Whether `root`/`rel` is there as a regular file (a link, a FIFO, a directory: False)."""
    try:
        fd, _ = open_file(root, rel)
    except BadOutput:
        return False
    os.close(fd)
    return True


def read_json(root: Path | str, rel: str | PurePosixPath, cap: int = JSON_CAP) -> dict:
    """A JSON object from `root`/`rel` (anything else is refused)."""
    try:
        obj = json.loads(read_bytes(root, rel, cap))
    except ValueError as e:
        if isinstance(e, BadOutput):
            raise
        raise BadOutput(f"{shown(Path(root, rel))} is not JSON ({str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise BadOutput(f"{shown(Path(root, rel))} is not a JSON object")
    return obj


def read_jsonl(root: Path | str, rel: str | PurePosixPath, cap: int, row: Callable[[dict], T],
               growing: bool = False) -> list[T]:
    """`row(obj)` of every line of `root`/`rel`, each a JSON object; `row` checks its shape and
    raises ValueError, TypeError or KeyError where it is wrong. `growing`: a file a job is
    still writing: an unfinished last line is left for the next read, and past `cap` only
    the first `cap` bytes count (progress, never a decision)."""
    data = read_bytes(root, rel, cap) if not growing else _head(root, rel, cap)
    lines = data.split(b"\n")
    if growing:
        lines = lines[:-1]  # what follows the last newline is being written
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise TypeError("not a JSON object")
            out.append(row(obj))
        except (ValueError, TypeError, KeyError) as e:
            if growing:
                continue
            raise BadOutput(f"{shown(Path(root, rel))} line {n}: {shown(e)[:120]}") from None
    return out


def _head(root: Path | str, rel: str | PurePosixPath, cap: int) -> bytes:
    fd, _ = open_file(root, rel)
    try:
        return os.read(fd, cap)
    finally:
        os.close(fd)


def count_lines(root: Path | str, rel: str | PurePosixPath, cap: int) -> int:
    """Newlines in the first `cap` bytes of `root`/`rel` (0 where it is not a regular file yet)."""
    try:
        fd, _ = open_file(root, rel)
    except BadOutput:
        return 0
    try:
        n, left = 0, cap
        while left > 0 and (chunk := os.read(fd, min(left, MiB))):
            n += chunk.count(b"\n")
            left -= len(chunk)
        return n
    finally:
        os.close(fd)


def walk(root: Path | str, limit: int = ENTRIES_CAP) -> Iterator[tuple[str, bool, int]]:
    """(relative path, is a directory, size) of everything under `root`, directories before
    what they hold, no link followed; a link, FIFO, socket or device, or more than `limit`
    entries, raises BadOutput."""
    seen = 0
    fd = open_dir(root)
    try:
        for top, dirs, files, dfd in os.fwalk(".", dir_fd=fd):  # fwalk never follows a link
            seen += len(dirs) + len(files)
            if seen > limit:
                raise BadOutput(f"{shown(root)} holds more than {limit} files")
            for name in sorted(dirs) + sorted(files):
                rel = os.path.normpath(os.path.join(top, name))
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise BadOutput(f"{shown(rel)} in {shown(root)} is a symbolic link")
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                    raise BadOutput(f"{shown(rel)} in {shown(root)} is not a regular file")
                yield rel, stat.S_ISDIR(st.st_mode), st.st_size
    finally:
        os.close(fd)


def listdir(root: Path | str, rel: str | PurePosixPath = "") -> list[str]:
    """The names in directory `root`/`rel` (no link followed on the way); [] where it is missing."""
    try:
        fd = open_dir(root, rel)
    except Missing:
        return []
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def copy_tree(root: Path | str, dst: Path, skip: tuple[str, ...] = ()) -> None:
    """`root`'s directories and regular files copied to `dst` (a new directory of the caller's),
    read through descriptors that followed no link; anything else in it raises BadOutput.
    `skip`: top-level names left out."""
    dst = Path(dst)
    dst.mkdir(parents=True)
    for rel, is_dir, _ in walk(root):
        if rel.split("/")[0] in skip:
            continue
        if is_dir:
            (dst / rel).mkdir()
            continue
        fd, _ = open_file(root, rel)
        try:
            with open(dst / rel, "xb") as out:
                while chunk := os.read(fd, 8 * MiB):
                    out.write(chunk)
        finally:
            os.close(fd)


def write_text(root: Path | str, rel: str, text: str) -> None:
    """Write the controller's own file `rel` (a name directly in `root`) as a new file renamed
    into place: a link or anything else the job left at that name is replaced, never followed."""
    if "/" in rel:
        raise ValueError(f"write_text writes directly inside the directory, not {rel!r}")
    fd = open_dir(root)
    tmp = f".{rel}.{uuid.uuid4().hex[:8]}"
    try:
        f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        with os.fdopen(f, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, rel, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError as e:  # a directory the job made at that name
        raise BadOutput(f"{shown(Path(root, rel))} cannot be replaced ({e.strerror})") from None
    finally:
        os.close(fd)
