"""A cache of trained segments: a second request for the same segment reuses the stored
outcome instead of training again, inside a run (a resume, a twin) and, where several runs
or benchmark arms point at one directory, across them.

A segment is identified by what determines its outcome (`SegmentInputs`): the start
checkpoint, the harness files' bytes, the segment seed and replica, the steps, the task and
its level, the handed-in draws, the runtime settings that change numbers, the checkpoint
schedule, and the code that computes it (`code_identity`: a digest of this package's source and
the versions of the libraries that do the arithmetic). Its key is a hash of those (`segment_key`:
pure). Entries and scores stored before the code was part of a key (under the package's version
number) are never found again: they miss, train once more, and may be deleted.

The start checkpoint's identity is cheap and exact: a train directory that holds exactly a
cache entry's content carries that entry's key (KEY_FILE, written when the directory was
published to the cache or materialised from it), so a continued segment names its start by
the key of the segment that trained it; any other checkpoint (the base, a directory trained
with the cache off) by a digest of its files' bytes.

An entry is the whole train directory (checkpoint/, checkpoints/, metrics.jsonl,
evidence.jsonl, run.json, harness/, whatever a backend adds) and MANIFEST, every file's size.
It is built aside and renamed into place, so a killed run never leaves half an entry, and a
lookup that finds a file missing or of another size ignores the entry (the segment trains
again and replaces it). Materialising hard-links the entry's files (read-only, so no run can
change an entry through its link) into the segment's directory, where possible; a trained
directory, once published, has its files replaced by links to the entry's the same way, so a
segment is held on disk once.

Scores are cached too (`ScoreInputs`): the evaluator's accuracy of one checkpoint of an entry
on one split, under one split key and policy; evaluation is a large share of a trial's time.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Callable, Iterable

from evotrainer import jobfiles
from evotrainer.tasks.keys import key_digest
from evotrainer.tasks.registry import user_code_files
from evotrainer.trainer.outputs import KEY_FILE  # in a train directory: the entry its content is exactly

if TYPE_CHECKING:  # the runtime's module imports torch: a key is computed without it
    from evotrainer.runtime import Runtime
    from evotrainer.tasks.base import Task

MANIFEST = "MANIFEST"      # in an entry: relative path -> size of every file
NOT_STORED = (KEY_FILE,)  # the run's own mark on a directory, not the job's outcome
PACKAGE_DIR = Path(__file__).resolve().parents[2]  # the evotrainer package this process runs
NOT_CODE = ("agents/prompts",)  # package files that change what an agent proposes, never a job's numbers
LIBRARIES = ("torch", "transformers", "tokenizers", "trl", "peft")  # whose versions change numbers


def code_identity() -> dict:
    """The code an outcome was computed by: this package's source (`source_digest`: an edit
    trains differently under the same version number) and the versions of the libraries that
    do the arithmetic (`library_versions`). Both are read once per process and depend on
    nothing but the installed files, so every process of one install agrees on a key."""
    return {"package": source_digest(), "libraries": dict(library_versions())}


@functools.cache
def source_digest() -> str:
    """`package_digest` of the package this process runs, read at its first key (once: every
    key of a process is made by the same code)."""
    return package_digest(PACKAGE_DIR)


def package_digest(root: Path) -> str:
    """sha256 over a package's files, relative paths and bytes in sorted order: every module
    and the data it ships (the reference recipe's knobs.yaml, a task's files), not where it is
    installed. Bytecode is left out (it is the modules again), and so are the agents' prompts
    (NOT_CODE): they shape what an agent writes, which a key holds as the harness digest."""
    def code(rel: PurePath) -> bool:
        return rel.suffix != ".pyc" and not any(rel.is_relative_to(d) for d in NOT_CODE)
    return _files_digest(Path(root), (rel for rel in _files(Path(root)) if code(rel)))


@functools.cache
def library_versions() -> tuple[tuple[str, str], ...]:
    """(library, installed version) for each of LIBRARIES, from the installed metadata: torch
    itself is never imported to ask (a key is computed without it)."""
    return tuple((name, library_version(name)) for name in LIBRARIES)


def library_version(name: str) -> str:
    """The installed distribution's version; "absent" where it is not installed (trl and peft
    are optional extras)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@dataclass(frozen=True)
class SegmentInputs:
    """Everything a training segment's outcome depends on."""
    start: str            # the start checkpoint: "segment:KEY" or "files:DIGEST" (start_identity)
    harness: str          # digest of the harness directory's files
    seed: int             # the segment seed (depth and data offset included)
    replica: int
    steps: int
    task: str             # the task's identity (task_identity): canonical spec, data files, a user task's code
    level: int | None
    draws: str            # digest of the handed-in training indices
    runtime: dict         # backend, resolved device and dtype, micro batch, threads, vLLM, trackers
    eval_every: int
    code: dict = field(default_factory=code_identity)  # this package's source and the libraries' versions


@dataclass(frozen=True)
class ScoreInputs:
    """Everything an evaluator score of a checkpoint depends on."""
    checkpoint: str       # its identity: "segment:KEY/checkpoint", "segment:KEY/checkpoints/step-N", "files:DIGEST"
    split: str
    task: str
    level: int | None
    split_key: str        # digest of the run's split key (which problems val and test hold)
    runtime: dict         # what the evaluator loads the policy with, and its threads (segment_cache.numbers)
    code: dict = field(default_factory=code_identity)  # this package's source and the libraries' versions


def digest(inputs: SegmentInputs | ScoreInputs) -> str:
    """The hash of a record of inputs (canonical JSON: key order never matters)."""
    blob = json.dumps(dataclasses.asdict(inputs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{type(inputs).__name__}:{blob}".encode()).hexdigest()


def segment_key(inputs: SegmentInputs) -> str:
    return digest(inputs)


def chain_inputs(start: str, harnesses: list[str], seeds: list[int], draws: list[str],
                 **same) -> list[SegmentInputs]:
    """The inputs of a schedule of segments, each from the last one's checkpoint (named by its
    key): one per harness digest, with its segment seed and draws digest (`same`: the other
    SegmentInputs). A search segment is a schedule of length one."""
    out = []
    for harness, seed, d in zip(harnesses, seeds, draws):
        out.append(SegmentInputs(start=start, harness=harness, seed=seed, draws=d, **same))
        start = f"segment:{segment_key(out[-1])}"
    return out


def checkpoint_identity(checkpoint: Path) -> str | None:
    """A checkpoint of a train directory that holds a cache entry exactly, by the entry's key and
    its path inside it (its scores can be cached); None for any other."""
    checkpoint = Path(checkpoint)
    train_dir = checkpoint.parent if checkpoint.name == "checkpoint" else checkpoint.parent.parent
    key = marked_key(train_dir)
    return None if key is None else f"segment:{key}/{checkpoint.relative_to(train_dir).as_posix()}"


def marked_key(train_dir: Path) -> str | None:
    """The entry key the controller marked a train directory with (KEY_FILE), else None. A job
    never leaves one (trainer/outputs.py refuses it), and it is read as jobfiles reads."""
    if not jobfiles.exists(train_dir, KEY_FILE):
        return None
    key = jobfiles.read_text(train_dir, KEY_FILE, 200).strip()
    return key if key and len(key) <= 128 and key.replace("-", "").replace("_", "").isalnum() else None


def cached_scores(cache: "SegmentCache | None", jobs: dict[str, list[str]], identity: Callable[[str], str | None],
                  inputs: Callable[[str, str], ScoreInputs] | None, evaluate: Callable[[dict], dict]) -> dict:
    """Accuracy per checkpoint and split (`jobs`: checkpoint -> splits): from the cache where a
    checkpoint with an identity was scored before on every split asked, from `evaluate` for the
    rest (then cached). `inputs(identity, split)` is what its score depends on (None with no cache).
    A checkpoint the evaluator could not load comes back as {"error": why}, and is not cached."""
    ids = {c: identity(c) for c in jobs} if cache else {}
    known = {}
    for c, ident in ids.items():
        got = {split: cache.score(inputs(ident, split)) for split in jobs[c]} if ident else {}
        if got and None not in got.values():
            known[c] = got
    todo = {c: splits for c, splits in jobs.items() if c not in known}
    acc = evaluate(todo) if todo else {}
    for c, splits in todo.items():
        if ids.get(c) and "error" not in acc[c]:  # a checkpoint the evaluator could not load: no score
            for split in splits:
                cache.store_score(inputs(ids[c], split), acc[c][split])
    return known | acc


def score_inputs(task: Task, task_id: str, runtime: Runtime, local: bool,
                 threads: int | None) -> Callable[[str, str], ScoreInputs]:
    """(checkpoint identity, split) -> what that score depends on, for `task` (its identity
    `task_id`) scored under `runtime`: one rule for a run's trials and for its retraining."""
    fixed = dict(task=task_id, level=task.target_level, split_key=key_digest(task.key) or "public",
                 runtime=numbers(runtime, local, threads))
    return lambda checkpoint, split: ScoreInputs(checkpoint=checkpoint, split=split, **fixed)


def numbers(runtime: Runtime, local: bool, threads: int | None) -> dict:
    """The runtime settings that change a job's numbers (a Runtime's, as a dict): on this
    machine the device and dtype as they resolve here (`auto` is one thing on a GPU, another
    on a laptop), and the job's intra-op threads (they move the last digits)."""
    rt = runtime.to_dict()
    rt["policy"].pop("base", None)  # where the base lies is no number's input (its identity is in the key as a digest)
    if local:
        pol = runtime.policy
        rt["policy"] |= {"device": str(pol.resolved_device()), "dtype": str(pol.compute_dtype())}
    return rt | {"threads": threads}


def draws_digest(draws: dict[str, list[int]] | None) -> str:
    return hashlib.sha256(json.dumps(draws, sort_keys=True).encode()).hexdigest()


def tree_digest(path: Path, skip: tuple[str, ...] = (), job: bool = False) -> str:
    """sha256 over a directory's files: relative paths and bytes, in sorted order
    (__pycache__ and the names in `skip` at its top left out). `job`: a directory a job wrote,
    read as jobfiles reads (a link or a FIFO in it raises BadOutput); otherwise links are
    followed (a Hugging Face cache snapshot's files are links into its blobs)."""
    path = Path(path)
    rels = _job_files(path) if job else _files(path)
    return _files_digest(path, (rel for rel in rels if rel.parts[0] not in skip), job)


def _files(root: Path) -> list[PurePath]:
    """Every file under `root`, as its path relative to it, sorted; __pycache__ left out."""
    rels = (p.relative_to(root) for p in root.rglob("*") if p.is_file())
    return sorted(rel for rel in rels if "__pycache__" not in rel.parts)


def _job_files(root: Path) -> list[PurePath]:
    rels = (PurePath(rel) for rel, is_dir, _ in jobfiles.walk(root) if not is_dir)
    return sorted(rel for rel in rels if "__pycache__" not in rel.parts)


def _files_digest(root: Path, rels: Iterable[PurePath], job: bool = False) -> str:
    h = hashlib.sha256()
    for rel in rels:
        fd = jobfiles.open_file(root, rel)[0] if job else os.open(root / rel, os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            h.update(f"{rel.as_posix()}\0{os.fstat(fd).st_size}\0".encode())
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def start_identity(checkpoint: Path, job: bool = False) -> str:
    """A start checkpoint's identity: the key of the segment whose entry its directory holds,
    else the digest of its files (the base, or a directory trained with the cache off; `job`:
    a job wrote it, tree_digest's)."""
    key = marked_key(Path(checkpoint).parent) if Path(checkpoint).name == "checkpoint" else None
    return f"segment:{key}" if key else f"files:{tree_digest(Path(checkpoint), job=job)}"


def task_identity(spec: str, data_files: tuple[str, ...]) -> str:
    """The task's canonical spec, its data files' bytes (a JSONL file edited in place is
    another task; the spec alone names only its path) and, for a user task, its code's bytes
    (`user_code_files`: a factory edited in place is another task under the same spec). A
    built-in task's code is this package's, which every key holds (`code_identity`)."""
    code = user_code_files(spec)
    return json.dumps([spec, [file_digest(Path(f)) for f in data_files]] + ([code_digest(code)] if code else []))


def code_digest(files: tuple[str, ...]) -> str:
    """sha256 over source files: each one's path relative to their common directory, and its
    bytes (where a user's package is installed does not matter, what it holds does)."""
    root = os.path.commonpath([os.path.dirname(f) for f in files])
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f"{os.path.relpath(f, root)}\0{file_digest(Path(f))}\0".encode())
    return h.hexdigest()


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class SegmentCache:
    """Entries under ROOT/segments/KEY[:2]/KEY, scores under ROOT/scores/KEY[:2]/KEY.json."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def entry(self, key: str) -> Path:
        return self.root / "segments" / key[:2] / key

    def lookup(self, key: str) -> Path | None:
        """The entry of `key` when it is whole: every file of its manifest there, at its size."""
        entry = self.entry(key)
        try:
            sizes = json.loads((entry / MANIFEST).read_text())
            whole = all((entry / rel).stat().st_size == size for rel, size in sizes.items())
        except (OSError, ValueError):
            return None
        return entry if whole else None

    def materialise(self, key: str, out: Path) -> bool:
        """The entry of `key` as train directory `out` (what was there is removed), marked with
        its key; False where there is no whole entry (or it broke while being linked)."""
        entry = self.lookup(key)
        if entry is None:
            return False
        out = Path(out)
        shutil.rmtree(out, ignore_errors=True)
        try:
            shutil.copytree(entry, out, copy_function=_link_or_copy, ignore=shutil.ignore_patterns(MANIFEST))
        except (OSError, shutil.Error):
            shutil.rmtree(out, ignore_errors=True)
            return False
        jobfiles.write_text(out, KEY_FILE, key + "\n")
        return True

    def store(self, key: str, out: Path) -> None:
        """Train directory `out` published as the entry of `key` (copied aside, renamed into
        place; a whole entry already there is kept), and `out` marked with the key where its
        content is now exactly the entry's."""
        out, entry = Path(out), self.entry(key)
        # the job wrote `out`, and its harness is untrusted: its outputs were vetted before this
        # (trainer/outputs.py), and still a key file is never taken from it (it would claim
        # another entry's scores), and the copy reads through descriptors that follow no link
        (out / KEY_FILE).unlink(missing_ok=True)  # (unlink never follows a link)
        if self.lookup(key) is None:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.parent / f".tmp-{key[:16]}-{uuid.uuid4().hex[:8]}"
            try:
                jobfiles.copy_tree(out, tmp, skip=NOT_STORED)
                sizes = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in tmp.rglob("*") if p.is_file()}
                (tmp / MANIFEST).write_text(json.dumps(sizes, sort_keys=True))
                _read_only(tmp)
                if entry.exists():  # a broken entry: replaced
                    _remove(entry)
                os.rename(tmp, entry)
            except jobfiles.BadOutput:  # it changed since it was vetted: not kept
                _remove(tmp)
                return
            except OSError:  # another run published it first (rename onto a full directory)
                _remove(tmp)
                if self.lookup(key) is None:
                    return
                if not _same(entry, out):
                    return  # its content differs from ours: `out` is no copy of the entry
        elif not _same(entry, out):
            return
        _share(entry, out)
        jobfiles.write_text(out, KEY_FILE, key + "\n")

    def score(self, inputs: ScoreInputs) -> float | None:
        try:
            return float(json.loads(self._score_file(inputs).read_text())["accuracy"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store_score(self, inputs: ScoreInputs, accuracy: float) -> None:
        path = self._score_file(inputs)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tmp-{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps({"accuracy": accuracy, "inputs": dataclasses.asdict(inputs)}))
        os.replace(tmp, path)

    def _score_file(self, inputs: ScoreInputs) -> Path:
        key = digest(inputs)
        return self.root / "scores" / key[:2] / f"{key}.json"


def name_train_spec(out: Path, train_spec: str) -> None:
    """A materialised directory's run.json names this run's train train_spec (a JSONL task's file
    lives in the run that trained the entry; its rows are the same, the task's identity says)."""
    meta = jobfiles.read_json(out, "run.json")
    if meta.get("task") != train_spec:  # a new file: the entry's, linked here, stays as it was
        jobfiles.write_text(out, "run.json", json.dumps(meta | {"task": train_spec}, indent=2))


def _same(entry: Path, out: Path) -> bool:
    """Whether train directory `out` (a job's) holds exactly the entry's files."""
    try:
        return tree_digest(entry, skip=(MANIFEST,)) == tree_digest(out, skip=NOT_STORED, job=True)
    except jobfiles.BadOutput:
        return False


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def _share(entry: Path, out: Path) -> None:
    """`out`'s files, now the entry's bytes, replaced by links to the entry's: a trained segment
    is held once on disk (a checkpoint of a real model is gigabytes), as a materialised one is.
    The entry was copied, not linked, from what the job wrote, so nothing the job left open can
    reach it; a file that cannot be linked (another file system) stays a copy."""
    for p in entry.rglob("*"):
        rel = p.relative_to(entry)
        if not p.is_file() or rel.as_posix() == MANIFEST:
            continue
        tmp = (out / rel).with_name(f".link-{uuid.uuid4().hex[:8]}")
        try:
            os.link(p, tmp)
            os.replace(tmp, out / rel)
        except OSError:
            tmp.unlink(missing_ok=True)


def _read_only(path: Path) -> None:
    """Files read-only (a materialised directory links them: writing one in place fails
    instead of changing the entry); directories stay writable, so `rm -r` still works."""
    for p in path.rglob("*"):
        if p.is_file():
            p.chmod(0o444)


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)  # read-only files go too: their directories are writable
