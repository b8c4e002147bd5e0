"""Harness versions in a git repository: children from patches or whole files, exact
diffs and checkouts, and a failed patch that leaves the repository as it was."""
import os
import shutil
import subprocess

import pytest

from evotrainer.harness.load import REFERENCE
from evotrainer.harness.versions import GitError, HarnessRepo, PatchError, VersionError

REWARD = "import torch\n\n\ndef shaped(r):\n    return r.scores.clone()\n"


def git(cwd, *args):
    """Plain git, as an agent in a worktree would run it (no user config)."""
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(cwd), *args],
                          env=env, check=True, capture_output=True, text=True).stdout


def files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def repo_state(repo):
    """Everything a failed child must leave alone: refs, HEAD, index, work tree."""
    return (git(repo.path, "for-each-ref"), git(repo.path, "rev-parse", "HEAD"),
            (repo.path / ".git" / "index").read_bytes(), git(repo.path, "status", "--porcelain", "--ignored"),
            repo.versions())


@pytest.fixture
def root(tmp_path):
    d = shutil.copytree(REFERENCE, tmp_path / "root")
    (d / "reward.py").write_text(REWARD)
    (d / "__pycache__").mkdir()
    (d / "__pycache__" / "reward.cpython-311.pyc").write_bytes(b"\0junk")
    return d


@pytest.fixture
def repo(tmp_path, root):
    return HarnessRepo.init(tmp_path / "run" / "harness-repo", root)


def edit_patch(repo, version, tmp_path, edit):
    """Check a version out, let `edit` change the files, return `git diff` of the edit."""
    work = repo.checkout(version, tmp_path / f"work-{version}")
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "base")
    edit(work)
    git(work, "add", "-N", ".")  # new files show in `git diff`
    return git(work, "diff")


def test_init_commits_the_root_harness_as_v0(tmp_path, repo, root):
    assert repo.versions() == ["v0"] and repo.parent_of("v0") is None
    out = repo.checkout("v0", tmp_path / "v0")
    assert files(out) == {"knobs.yaml": (root / "knobs.yaml").read_bytes(), "reward.py": REWARD.encode()}
    assert git(repo.path, "status", "--porcelain") == ""
    assert HarnessRepo(repo.path).versions() == ["v0"]  # reopened from the run directory
    with pytest.raises(FileExistsError):
        HarnessRepo.init(repo.path, root)
    with pytest.raises(GitError, match="not a harness repository"):
        HarnessRepo(tmp_path)


def test_child_from_a_git_diff_round_trips(tmp_path, repo):
    def edit(work):
        (work / "knobs.yaml").write_text((work / "knobs.yaml").read_text().replace("reward: binary", "reward: shaped"))
        (work / "advantage.py").write_text("import torch\n\n\ndef centered(a):\n    return a - a.mean(1, keepdim=True)\n")
    patch = edit_patch(repo, "v0", tmp_path, edit)
    assert repo.create_child("v0", patch, "v1", "reward: shaped") == "v1"

    assert repo.diff("v0", "v1") == patch  # the diff between versions is exactly the intervention
    assert repo.files_changed("v0", "v1") == ["advantage.py", "knobs.yaml"]
    edited = {k: v for k, v in files(tmp_path / "work-v0").items() if not k.startswith(".git/")}
    assert files(repo.checkout("v1", tmp_path / "v1")) == edited
    assert repo.parent_of("v1") == "v0" and repo.versions() == ["v0", "v1"]
    # applying diff(v0, v1) to v0 again gives v1's files
    repo.create_child("v0", repo.diff("v0", "v1"), "v1b", "replay")
    assert repo.diff("v1", "v1b") == "" and repo.parent_of("v1b") == "v0"
    assert git(repo.path, "log", "-1", "--format=%s", "v1") == "reward: shaped\n"


BAD_PATCHES = {
    "stale context": "diff --git a/knobs.yaml b/knobs.yaml\n--- a/knobs.yaml\n+++ b/knobs.yaml\n"
                     "@@ -1,2 +1,2 @@\n-lr: 9.9\n+lr: 1.0\n steps: 300\n",
    "not a patch": "please make the reward more continuous\n",
    "empty": "",
    "outside the tree": "diff --git a/../evil.py b/../evil.py\nnew file mode 100644\n--- /dev/null\n"
                        "+++ b/../evil.py\n@@ -0,0 +1 @@\n+x = 1\n",
    "half applies": "diff --git a/diagnostics.py b/diagnostics.py\nnew file mode 100644\n--- /dev/null\n"
                    "+++ b/diagnostics.py\n@@ -0,0 +1 @@\n+x = 1\n"
                    "diff --git a/reward.py b/reward.py\n--- a/reward.py\n+++ b/reward.py\n"
                    "@@ -1 +1 @@\n-import math\n+import torch\n",
}


@pytest.mark.parametrize("kind", list(BAD_PATCHES))
def test_patch_that_does_not_apply_leaves_the_repo_unchanged(tmp_path, repo, kind):
    before = repo_state(repo)
    with pytest.raises(PatchError, match="patch does not apply to v0"):
        repo.create_child("v0", BAD_PATCHES[kind], "v1", "bad")
    assert repo_state(repo) == before and git(repo.path, "status", "--porcelain") == ""
    # the name was not used up: a good patch takes it
    good = edit_patch(repo, "v0", tmp_path, lambda w: (w / "reward.py").write_text(REWARD + "\n# v1\n"))
    assert repo.create_child("v0", good, "v1", "good") == "v1"


def test_create_child_from_files(tmp_path, repo, root):
    knobs = (root / "knobs.yaml").read_text().replace("lr: 3.0e-4", "lr: 1.0e-4")
    repo.create_child_from_files("v0", {"knobs.yaml": knobs, "reward.py": None,
                                        "curriculum.py": "def easy(s):\n    return {1: 1.0}"}, "v1", "lower lr")
    assert files(repo.checkout("v1", tmp_path / "v1")) == {
        "knobs.yaml": knobs.encode(), "curriculum.py": b"def easy(s):\n    return {1: 1.0}"}
    assert repo.files_changed("v0", "v1") == ["curriculum.py", "knobs.yaml", "reward.py"]
    diff = repo.diff("v0", "v1")
    assert "deleted file mode 100644" in diff and "-lr: 3.0e-4\n+lr: 1.0e-4" in diff
    assert "\\ No newline at end of file" in diff  # bytes kept exactly as handed

    repo.create_child_from_files("v1", {"reward.py": REWARD}, "v2", "reward back")
    assert repo.parent_of("v2") == "v1" and repo.files_changed("v1", "v2") == ["reward.py"]
    assert repo.files_changed("v0", "v2") == ["curriculum.py", "knobs.yaml"]

    before = repo_state(repo)
    with pytest.raises(PatchError, match="leaves v2 as it is"):
        repo.create_child_from_files("v2", {"reward.py": REWARD}, "v3", "no-op")
    with pytest.raises(PatchError, match="no such file"):
        repo.create_child_from_files("v2", {"advantage.py": None}, "v3", "delete a missing file")
    with pytest.raises(PatchError, match="not a path inside the harness"):
        repo.create_child_from_files("v2", {"../evaluate.py": "x = 1\n"}, "v3", "escape")
    assert repo_state(repo) == before


def test_version_names_and_lookups(repo):
    for v in ["v2", "v10", "v9"]:
        repo.create_child_from_files("v0", {"reward.py": REWARD + f"# {v}\n"}, v, v)
    assert repo.versions() == ["v0", "v2", "v9", "v10"]
    with pytest.raises(VersionError, match="already exists"):
        repo.create_child_from_files("v0", {"reward.py": "x = 1\n"}, "v2", "again")
    for bad in ["", "v1^", "a/b", "-v", "v1..v2", "v 1"]:
        with pytest.raises(VersionError, match="not a valid version name"):
            repo.create_child_from_files("v0", {"reward.py": "x = 1\n"}, bad, "bad name")
    with pytest.raises(VersionError, match="unknown version 'v7'"):
        repo.create_child_from_files("v7", {"reward.py": "x = 1\n"}, "v8", "no parent")
    for lookup in [lambda: repo.diff("v0", "v2^"), lambda: repo.parent_of("main"), lambda: repo.checkout("HEAD", "x")]:
        with pytest.raises(VersionError, match="unknown version"):
            lookup()


def test_checkout_exports_exact_files(tmp_path, repo):
    content = {"reward.py": "# caf\u00e9\r\nx = 1  \n\n", "knobs.yaml": "reward: binary", "loss_agg.py": ""}
    repo.create_child_from_files("v0", content, "v1", "odd bytes")
    out = repo.checkout("v1", tmp_path / "deep" / "dest")
    assert files(out) == {k: v.encode() for k, v in content.items()}
    assert not (out / ".git").exists()
    with pytest.raises(FileExistsError):
        repo.checkout("v0", out)


def test_the_users_git_config_and_hooks_are_ignored(tmp_path, root, monkeypatch):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ["pre-commit", "commit-msg", "post-commit", "reference-transaction"]:
        (hooks / hook).write_text("#!/bin/sh\necho hooked >> %s\nexit 1\n" % (tmp_path / "ran"))
        (hooks / hook).chmod(0o755)
    cfg = tmp_path / "gitconfig"
    cfg.write_text(f"[core]\n\thooksPath = {hooks}\n[commit]\n\tgpgsign = true\n[tag]\n\tgpgsign = true\n"
                   "[diff]\n\tnoprefix = true\n\tmnemonicPrefix = true\n[color]\n\tui = always\n"
                   "[user]\n\tuseConfigOnly = true\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    repo = HarnessRepo.init(tmp_path / "repo", root)
    repo.create_child_from_files("v0", {"reward.py": REWARD + "# v1\n"}, "v1", "child")
    assert repo.diff("v0", "v1").startswith("diff --git a/reward.py b/reward.py\n")
    assert not (tmp_path / "ran").exists()


def test_missing_git_is_a_clear_error(tmp_path, root, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(GitError, match="git is not installed"):
        HarnessRepo.init(tmp_path / "repo", root)


# --------------------------------------------------------------------------- proposals: patch -> labelled candidate

PROPOSALS = {  # what, edit of the parent's files, words the reason must contain
    "reads the test split": (
        {"reward.py": "def shaped(r):\n    open('splits/test.jsonl').read()\n    return r.scores\n"},
        ["reward.py:2", "open()", "file access"]),
    "imports the evaluator": (
        {"reward.py": "from evotrainer.evaluate import accuracy\n\n\ndef shaped(r):\n    return r.scores\n"},
        ["reward.py:1", "evotrainer.evaluate", "evaluator"]),
    "opens a socket": (
        {"reward.py": "import socket\n\n\ndef shaped(r):\n    socket.create_connection(('x', 1))\n    return r.scores\n"},
        ["reward.py:1", "socket", "network"]),
    "spawns a process": (
        {"reward.py": "import subprocess\n\n\ndef shaped(r):\n    subprocess.Popen(['sh'])\n    return r.scores\n"},
        ["reward.py:1", "subprocess", "process"]),
    "changes the model size": (
        {"knobs.yaml": "hidden_size: 512\n"}, ["knob 'hidden_size' changes the model size"]),
}


@pytest.mark.parametrize("what", list(PROPOSALS))
def test_illegal_patch_is_committed_for_the_record_and_labelled_illegal(tmp_path, repo, what):
    from evotrainer.harness.candidate import propose
    files, words = PROPOSALS[what]

    def edit(work):
        for name, text in files.items():
            path = work / name
            path.write_text((path.read_text() if name == "knobs.yaml" else "") + text)
    cand = propose(repo, "v0", edit_patch(repo, "v0", tmp_path, edit), "v1", what)
    assert cand.label == "illegal" and not cand.legal and cand.version == "v1"
    reasons = " ".join(cand.reasons)
    assert all(w in reasons for w in words), cand.reasons
    assert repo.files_changed("v0", "v1") == sorted(files)  # the exact proposal stays auditable


def test_legal_patch_and_a_patch_outside_the_harness(tmp_path, repo):
    from evotrainer.harness.candidate import propose

    def edit(work):
        (work / "knobs.yaml").write_text((work / "knobs.yaml").read_text().replace("lr: 3.0e-4", "lr: 1.0e-4"))
    cand = propose(repo, "v0", edit_patch(repo, "v0", tmp_path, edit), "v1")
    assert (cand.label, cand.reasons) == ("legal", [])

    def escape(work):
        (work / "evaluate.py").write_text("x = 1\n")
    cand = propose(repo, "v1", edit_patch(repo, "v1", tmp_path, escape), "v2")
    assert cand.label == "illegal" and cand.version is None and "not a harness file" in cand.reasons[0]
    assert repo.versions() == ["v0", "v1"]  # refused before anything was committed
