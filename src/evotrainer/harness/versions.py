"""Harness versions as commits in a git repository inside the run directory.

Each version is a tag on a commit whose only parent is its parent version's commit, so
`git diff PARENT CHILD` is exactly the intervention. The repository is an ordinary one
(`RUN/harness-repo`, work tree checked out at the root version) that a person can
browse with `git log --all --graph` and `git diff v3 v7`.

Children are built on a temporary index (read-tree, apply --cached, write-tree,
commit-tree, tag): the work tree and the repository's own index are never touched, so a
patch that does not apply leaves nothing behind but unreachable objects.

Controller-side code: it runs the `git` CLI. Harness code never imports it (legality).
Git runs with no system or global config (no user hooks, signing or diff settings), so
output and behaviour are the same on every machine.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath
from typing import Callable

ROOT_VERSION = "v0"
VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
IDENTITY = ("evotrainer", "evotrainer@localhost")
_GIT_OPTS = ("-c", f"core.hooksPath={os.devnull}", "-c", "commit.gpgsign=false",
             "-c", "tag.gpgsign=false", "-c", "core.autocrlf=false")


class GitError(RuntimeError):
    """git is missing, or a git command failed where it should not."""


class VersionError(ValueError):
    """An unknown version, or a new version name that is taken or not a valid tag."""


class PatchError(ValueError):
    """The change does not apply to the parent (or changes nothing); the repo is unchanged."""


class HarnessRepo:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        if not (self.path / ".git").is_dir():
            raise GitError(f"{self.path} is not a harness repository (HarnessRepo.init creates one)")
        self._shas: dict[str, str] = {}  # version -> commit: a version's tag is made once and never moves
        self._trees: dict[str, str] = {}  # version -> its files' tree id

    # ------------------------------------------------------------------ creating

    @classmethod
    def init(cls, path: Path | str, root_harness_dir: Path | str) -> "HarnessRepo":
        """A new repository at `path` holding the root harness as version v0."""
        path, root = Path(path), Path(root_harness_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"root harness '{root}' is not a directory")
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"'{path}' exists and is not empty")
        _git_binary()
        path.mkdir(parents=True, exist_ok=True)
        _run(path, "init", "-q", "-b", "main")
        # also in the repo's own config, so a person running git there gets the same
        for key, value in [("user.name", IDENTITY[0]), ("user.email", IDENTITY[1]),
                           *(opt.split("=", 1) for opt in _GIT_OPTS[1::2])]:
            _run(path, "config", key, value)
        shutil.copytree(root, path, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", ".git"))
        _run(path, "add", "-A")
        _run(path, "commit", "-q", "--allow-empty", "-m", f"{ROOT_VERSION}: root harness")
        _run(path, "tag", ROOT_VERSION)
        return cls(path)

    def create_child(self, parent: str, patch: str, version: str, message: str) -> str:
        """Apply a unified diff (as `git diff` writes it) to `parent`; commit; tag `version`."""
        data = patch.encode("utf-8", "surrogateescape")
        if data and not data.endswith(b"\n"):
            data += b"\n"

        def stage(env):
            r = _run(self.path, "apply", "--cached", "-", input=data, env=env, check=False)
            if r.returncode:
                detail = " ".join(r.stderr.decode(errors="replace").split())
                raise PatchError(f"patch does not apply to {parent}: {detail}")
        return self._commit_child(parent, version, message, stage)

    def create_child_from_files(self, parent: str, files: dict[str, str | None],
                                version: str, message: str) -> str:
        """`parent` with whole files replaced or added (str) or deleted (None)."""
        before = self._ls_tree(self._commit(parent))

        def stage(env):
            for name, content in files.items():
                path = _repo_path(name)
                if content is None:
                    if path not in before:
                        raise PatchError(f"cannot delete '{path}': {parent} has no such file")
                    _run(self.path, "update-index", "--force-remove", "--", path, env=env)
                else:
                    blob = _run(self.path, "hash-object", "-w", "--stdin",
                                input=content.encode("utf-8", "surrogateescape")).stdout.decode().strip()
                    mode = "100755" if before.get(path, ("",))[0] == "100755" else "100644"
                    _run(self.path, "update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}", env=env)
        return self._commit_child(parent, version, message, stage)

    def _commit_child(self, parent: str, version: str, message: str, stage: Callable[[dict], None]) -> str:
        parent_sha = self._commit(parent)
        self._check_new_version(version)
        with tempfile.TemporaryDirectory(prefix="evotrainer-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            _run(self.path, "read-tree", parent_sha, env=env)
            stage(env)
            tree = self._out("write-tree", env=env)
        if tree == self._out("rev-parse", f"{parent_sha}^{{tree}}"):
            raise PatchError(f"the change leaves {parent} as it is; a child must change something")
        commit = self._out("commit-tree", tree, "-p", parent_sha, "-m", message or version)
        _run(self.path, "tag", version, commit)
        return version

    # ------------------------------------------------------------------ reading

    def versions(self) -> list[str]:
        """All versions, in natural order of their names (v0, v1, ..., v10)."""
        return sorted(self._out("tag", "--list").split(), key=_natural)

    def parent_of(self, version: str) -> str | None:
        """The parent version; None for the root."""
        commits = self._out("rev-list", "--parents", "-n", "1", self._commit(version)).split()
        if len(commits) < 2:
            return None
        tags = sorted(self._out("tag", "--points-at", commits[1]).split(), key=_natural)
        return tags[0] if tags else None

    def tree(self, version: str) -> str:
        """The id of `version`'s files (git's tree): equal for two versions with the same files."""
        if version not in self._trees:  # a version's files never change
            self._trees[version] = self._out("rev-parse", f"{self._commit(version)}^{{tree}}")
        return self._trees[version]

    def diff(self, a: str, b: str) -> str:
        """`git diff a b`: exactly the intervention from version a to version b."""
        out = _run(self.path, "diff", self._commit(a), self._commit(b), "--").stdout
        return out.decode("utf-8", "surrogateescape")

    def files_changed(self, a: str, b: str) -> list[str]:
        """Paths that differ between a and b (a rename lists both names)."""
        out = _run(self.path, "diff", "--name-only", "--no-renames", "-z",
                   self._commit(a), self._commit(b), "--").stdout
        return sorted(p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p)

    def checkout(self, version: str, dest_dir: Path | str) -> Path:
        """Write exactly the files of `version` into `dest_dir` (new or empty); no .git."""
        dest = Path(dest_dir)
        if dest.exists() and any(dest.iterdir()):
            raise FileExistsError(f"'{dest}' exists and is not empty")
        entries = self._ls_tree(self._commit(version))
        blobs = self._blobs([sha for _, sha in entries.values()])
        dest.mkdir(parents=True, exist_ok=True)
        for path, (mode, sha) in entries.items():
            target = dest / _repo_path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if mode == "120000":
                os.symlink(blobs[sha].decode("utf-8", "surrogateescape"), target)
            else:
                target.write_bytes(blobs[sha])
                target.chmod(0o755 if mode == "100755" else 0o644)
        return dest

    # ------------------------------------------------------------------ helpers

    def _commit(self, version: str) -> str:
        if version in self._shas:
            return self._shas[version]
        r = None
        if _valid_name(version):
            r = _run(self.path, "rev-parse", "--verify", "--quiet", f"refs/tags/{version}^{{commit}}", check=False)
        if r is None or r.returncode:
            raise VersionError(f"unknown version '{version}'; versions: {', '.join(self.versions())}")
        self._shas[version] = r.stdout.decode().strip()
        return self._shas[version]

    def _check_new_version(self, version: str) -> None:
        if not _valid_name(version):
            raise VersionError(f"'{version}' is not a valid version name (letters, digits, '.', '_', '-')")
        if version in self.versions():
            raise VersionError(f"version '{version}' already exists")

    def _ls_tree(self, commit: str) -> dict[str, tuple[str, str]]:
        """path -> (mode, blob sha) for every file of a commit."""
        out = {}
        for rec in _run(self.path, "ls-tree", "-r", "-z", "--full-tree", commit).stdout.split(b"\0"):
            if rec:
                meta, path = rec.split(b"\t", 1)
                mode, kind, sha = meta.decode().split()
                if kind != "blob":
                    raise GitError(f"{commit}: '{path.decode(errors='replace')}' is a {kind}, not a file")
                out[path.decode("utf-8", "surrogateescape")] = (mode, sha)
        return out

    def _blobs(self, shas: list[str]) -> dict[str, bytes]:
        """Blob contents in one `git cat-file --batch` call."""
        data = _run(self.path, "cat-file", "--batch", input="".join(f"{s}\n" for s in shas).encode()).stdout
        out, pos = {}, 0
        while pos < len(data):
            header_end = data.index(b"\n", pos)
            sha, _, size = data[pos:header_end].decode().split()
            start = header_end + 1
            out[sha] = data[start:start + int(size)]
            pos = start + int(size) + 1
        return out

    def _out(self, *args: str, env: dict | None = None) -> str:
        return _run(self.path, *args, env=env).stdout.decode().strip()


def _git_binary() -> str:
    git = shutil.which("git")
    if git is None:
        raise GitError("git is not installed (or not on PATH); harness versioning needs the git CLI")
    return git


def _env(extra: dict | None) -> dict:
    """The caller's environment without any GIT_* variable, and no system or global config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0",
               GIT_AUTHOR_NAME=IDENTITY[0], GIT_AUTHOR_EMAIL=IDENTITY[1],
               GIT_COMMITTER_NAME=IDENTITY[0], GIT_COMMITTER_EMAIL=IDENTITY[1], LC_ALL="C")
    env.update(extra or {})
    return env


def _run(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    cmd = [_git_binary(), *_GIT_OPTS, "-C", str(repo), *args]
    r = subprocess.run(cmd, input=input, capture_output=True, env=_env(env), timeout=120)
    if check and r.returncode:
        detail = " ".join(r.stderr.decode(errors="replace").split())
        raise GitError(f"git {' '.join(args[:2])} failed (exit {r.returncode}): {detail}")
    return r


def _repo_path(name: str) -> str:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] == ".git":
        raise PatchError(f"'{name}' is not a path inside the harness")
    return p.as_posix()


def _valid_name(version: str) -> bool:
    """A plain tag name: no revision syntax (`v1^`, `v1~2`), no '/', nothing git refuses."""
    return bool(VERSION_NAME.fullmatch(version)) and ".." not in version and not version.endswith((".", ".lock"))


def _natural(name: str) -> list:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]
