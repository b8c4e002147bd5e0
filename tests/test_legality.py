"""Static legality: each illegal candidate is named, with file, line and rule; legal ones pass.

Candidates are written as real harness directories next to a parent (a copy of the
reference harness); nothing here imports or runs the candidate code.
"""
import os
import re
import shutil
from pathlib import Path

import pytest

from helpers import write_harness
from evotrainer.cli import main
from evotrainer.errors import UsageError
from evotrainer.harness.knobs import FIELDS, MEASUREMENT_KEYS
from evotrainer.harness.legality import (
    HARNESS_FILES, Verdict, check_harness, check_patch, check_patch_paths, patch_paths,
)
from evotrainer.harness.load import REFERENCE, SLOTS, inspect_harness, load_harness

LEGAL_REWARD = '''\
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from evotrainer.harness.rollouts import Rollouts


def length_aware(r: Rollouts) -> torch.Tensor:
    """Score, minus a small log-length penalty on wrong answers."""
    penalty = torch.tensor([math.log1p(n) for n in r.lengths.tolist()]) * 0.01
    return F.relu(r.scores - (1 - r.scores) * penalty)
'''


@pytest.fixture
def parent(tmp_path):
    return shutil.copytree(REFERENCE, tmp_path / "parent")


def candidate(tmp_path, files=None, **knobs):
    """A copy of the reference harness (the parent's budget) plus `files` (name -> text) and `knobs`."""
    return write_harness(tmp_path / "cand", files, small=False, **knobs)


def all_reasons(verdict: Verdict) -> str:
    assert not verdict.legal
    assert len(verdict.reasons) >= 1, verdict
    return "\n".join(verdict.reasons)


def test_reference_harness_is_legal(parent):
    assert check_harness(REFERENCE) == Verdict(True, [])
    assert check_harness(REFERENCE, parent_dir=parent) == Verdict(True, [])


def test_legal_custom_reward_using_torch_and_math(tmp_path, parent):
    d = candidate(tmp_path, {"reward.py": LEGAL_REWARD})
    (d / "knobs.yaml").write_text((d / "knobs.yaml").read_text().replace("reward: binary", "reward: length_aware")
                                  .replace("lr: 3.0e-4", "lr: 1.0e-4"))
    assert check_harness(d, parent_dir=parent) == Verdict(True, [])
    assert load_harness(d).knobs.reward == "length_aware"  # and it is a working harness


def test_slot_list_follows_the_loader():
    assert HARNESS_FILES == {"knobs.yaml", "diagnostics.py", *(f"{s}.py" for s in SLOTS)}


# (what, slot file source, expected line, words the reason must contain)
ILLEGAL_CODE = [
    ("reads the test split with open()",
     'def reward(r):\n    rows = open("splits/test.jsonl").read()\n    return r.scores\n',
     2, ["open()", "file access"]),
    ("reads the test split with pathlib",
     'import torch\nfrom pathlib import Path\n\ndef reward(r):\n    return Path("splits/test.jsonl").read_text()\n',
     2, ["pathlib", "file access"]),
    ("reads the test split through the task module",
     'from evotrainer.tasks import get_task\n\ndef reward(r):\n'
     '    test = get_task("arith").split("test")\n    return r.scores\n',
     1, ["evotrainer.tasks", "split"]),
    ("reads the test split through get_task's own module",
     'from evotrainer.catalog import get_task\n\ndef reward(r):\n'
     '    test = get_task("arith").split("test")\n    return r.scores\n',
     1, ["evotrainer.catalog", "split"]),
    ("imports the evaluator",
     'import torch\nfrom evotrainer.evaluate import accuracy\n\ndef reward(r):\n    return r.scores\n',
     2, ["evotrainer.evaluate", "evaluator"]),
    ("opens a socket",
     'import socket\n\ndef reward(r):\n    socket.create_connection(("example.com", 80))\n    return r.scores\n',
     1, ["socket", "network"]),
    ("spawns a process with subprocess.run",
     'import subprocess\n\ndef reward(r):\n    subprocess.run(["curl", "x"])\n    return r.scores\n',
     4, ["subprocess.run", "process"]),
    ("spawns a process with os.system",
     'import os\n\ndef reward(r):\n    os.system("cat splits/test.jsonl")\n    return r.scores\n',
     4, ["os.system", "process"]),
    ("imports socket through __import__",
     'def reward(r):\n    s = __import__("socket")\n    return r.scores\n',
     2, ["__import__", "dynamic code"]),
    ("runs eval",
     'def reward(r):\n    return eval("r.scores * 2")\n',
     2, ["eval()", "dynamic code"]),
    ("reaches globals through a dunder",
     'def reward(r):\n    g = reward.__globals__["__builtins__"]\n    return r.scores\n',
     2, ["__globals__", "dunder"]),
    ("walks subclasses",
     'def reward(r):\n    return ().__class__.__base__.__subclasses__()\n',
     2, ["__subclasses__", "dunder"]),
    ("getattr with a computed name",
     'import torch\n\ndef reward(r):\n    return getattr(torch, "lo" + "ad")("x.pt")\n',
     4, ["getattr()", "computed"]),
    ("reaches os through torch",
     'import torch\n\ndef reward(r):\n    torch.os.system("ls")\n    return r.scores\n',
     4, ["'os'", "attribute"]),
    ("loads a tensor file with torch.load",
     'import torch\n\ndef reward(r):\n    return torch.load("/data/test.pt")\n',
     4, ["torch.load", "file access"]),
    ("imports an aliased ctypes",
     'import ctypes as c\n\ndef reward(r):\n    return r.scores\n',
     1, ["ctypes", "foreign"]),
    ("imports a module off the allow-list",
     'import numpy as np\n\ndef reward(r):\n    return r.scores\n',
     1, ["numpy", "not an allowed module"]),
    ("imports another evotrainer package",
     'from evotrainer.trainer.jobs import train_segment\n\ndef reward(r):\n    return r.scores\n',
     1, ["evotrainer.trainer.jobs", "evotrainer.harness"]),
    ("loads another harness's code",
     'from evotrainer.harness import load_harness\n\ndef reward(r):\n    return r.scores\n',
     1, ["load_harness", "controller-side"]),
    ("hides names behind a star import",
     'from torch import *\n\ndef reward(r):\n    return r.scores\n',
     1, ["import *"]),
]


@pytest.mark.parametrize("what,source,line,words", ILLEGAL_CODE, ids=[c[0] for c in ILLEGAL_CODE])
def test_illegal_code_is_named_with_file_line_and_rule(tmp_path, parent, what, source, line, words):
    verdict = check_harness(candidate(tmp_path, {"reward.py": source}), parent_dir=parent)
    hit = [r for r in verdict.reasons if r.startswith(f"reward.py:{line}: ")]
    assert not verdict.legal and hit, verdict.reasons
    assert all(any(w in r for r in hit) for w in words), (words, verdict.reasons)


def test_every_violation_in_a_file_is_named(tmp_path, parent):
    src = "import socket\nimport subprocess\n\ndef reward(r):\n    eval('1')\n    return open('x')\n"
    reasons = check_harness(candidate(tmp_path, {"advantage.py": src}), parent).reasons
    assert [r.split(": ")[0] for r in reasons] == ["advantage.py:1", "advantage.py:2", "advantage.py:5", "advantage.py:6"]


def test_syntax_error_is_a_reason_not_an_exception(tmp_path, parent):
    d = candidate(tmp_path, {"group_filter.py": "import torch\n\ndef f(r:\n    return r\n"})
    verdict = check_harness(d, parent)
    assert not verdict.legal
    assert len(verdict.reasons) == 1 and verdict.reasons[0].startswith("group_filter.py:3: syntax error"), verdict


def test_checking_never_runs_the_candidate(tmp_path, parent, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = candidate(tmp_path, {"reward.py": "import os\nos.mkdir('RAN')\n"})
    assert not check_harness(d, parent).legal
    assert not (tmp_path / "RAN").exists()


# --------------------------------------------------------------------------- files

@pytest.mark.parametrize("name", ["evaluate.py", "notes.txt", "sub/reward.py", "__pycache__/reward.cpython-311.pyc"])
def test_non_harness_file_is_illegal(tmp_path, parent, name):
    verdict = check_harness(candidate(tmp_path, {name: "x = 1\n"}), parent)
    assert not verdict.legal
    assert any(r.startswith(f"{name}: ") and "harness file" in r for r in verdict.reasons), verdict.reasons


def test_symlinked_slot_file_is_illegal(tmp_path, parent):
    secret = tmp_path / "test.jsonl"
    secret.write_text('{"q": "1+1", "a": "2"}\n')
    d = candidate(tmp_path)
    os.symlink(secret, d / "reward.py")
    assert check_harness(d, parent).reasons == ["reward.py: is a symlink; harness files must be plain files"]


def test_missing_knobs_is_illegal(tmp_path):
    d = tmp_path / "h"
    d.mkdir()
    assert "knobs.yaml: missing" in all_reasons(check_harness(d))


# --------------------------------------------------------------------------- knobs

def test_model_size_knob_is_illegal(tmp_path, parent):
    reasons = check_harness(candidate(tmp_path, hidden_size=256, layers=12), parent).reasons
    assert reasons == ["knobs.yaml: knob 'hidden_size' changes the model size, which the run fixes",
                       "knobs.yaml: knob 'layers' changes the model size, which the run fixes"]


def test_unknown_knob_is_illegal(tmp_path):
    assert "unknown knob 'turbo'" in all_reasons(check_harness(candidate(tmp_path, turbo=True)))


@pytest.mark.parametrize("knob,old,new", [("steps", 300, 600), ("group_size", 8, 16), ("prompts_per_step", 64, 128),
                                          ("num_iterations", 1, 4)])
def test_compute_budget_must_match_the_parent(tmp_path, parent, knob, old, new):
    d = candidate(tmp_path)
    text = "".join(l for l in (REFERENCE / "knobs.yaml").read_text().splitlines(True) if not l.startswith(f"{knob}:"))
    (d / "knobs.yaml").write_text(text + f"{knob}: {new}\n")
    assert check_harness(d, parent).reasons == [
        f"knobs.yaml: knob '{knob}' changes the compute budget ({old} -> {new}), which the run fixes"]
    (d / "knobs.yaml").write_text(text + f"{knob}: {old}\n")
    assert check_harness(d, parent).legal


def test_group_size_may_be_reshaped_at_equal_rollouts_per_step(tmp_path, parent):
    d = candidate(tmp_path)
    text = "".join(l for l in (REFERENCE / "knobs.yaml").read_text().splitlines(True)
                   if not l.startswith(("group_size:", "prompts_per_step:")))
    (d / "knobs.yaml").write_text(text + "group_size: 16\nprompts_per_step: 32\n")   # 64 x 8 = 32 x 16
    assert check_harness(d, parent).legal
    (d / "knobs.yaml").write_text(text + "group_size: 16\nprompts_per_step: 48\n")
    assert len(check_harness(d, parent).reasons) == 2


@pytest.mark.parametrize("old,new,legal", [(0, 6, True), (8, 6, True), (8, 8, True), (6, 8, False), (6, 0, False)])
def test_max_new_tokens_may_only_be_lowered(tmp_path, old, new, legal):
    """A truncation rule spends less; 0 is the task's own budget, the most there is."""
    parent = tmp_path / "p"
    parent.mkdir()
    (parent / "knobs.yaml").write_text(f"max_new_tokens: {old}\n")
    d = candidate(tmp_path, max_new_tokens=new)
    reasons = check_harness(d, parent).reasons
    assert reasons == ([] if legal else [
        f"knobs.yaml: knob 'max_new_tokens' changes the compute budget ({old} -> {new}), which the run fixes"])


def test_budget_is_compared_with_the_parents_values_not_the_defaults(tmp_path):
    parent = tmp_path / "p"
    parent.mkdir()
    (parent / "knobs.yaml").write_text("steps: 40\n")
    d = candidate(tmp_path)  # steps: 300, the reference value
    assert check_harness(d, parent).reasons == [
        "knobs.yaml: knob 'steps' changes the compute budget (40 -> 300), which the run fixes"]
    assert check_harness(d).legal  # without a parent there is nothing to compare with


@pytest.mark.parametrize("key, value, owner", [
    ("eval_every", 1000, "the checkpoint schedule is the run's (evaluation.every in the run config)"),
    ("last_k", 1, "how many evaluations fitness averages is the run's (evaluation.last_k in the run config)"),
    ("evaluation", {"every": 0}, "what the evaluator measures is the run's (evaluation in the run config)"),
])
def test_a_harness_may_not_set_what_the_evaluator_measures(tmp_path, parent, capsys, ckpt, key, value, owner):
    """A harness that saved checkpoints only at its end would be read there while its control is
    an average of earlier ones: the schedule is the run's, and setting it is refused everywhere
    a harness is read, in one line."""
    d = candidate(tmp_path, **{key: value})
    why = f"sets '{key}': {owner}, a harness may not change what the evaluator measures"
    assert check_harness(d, parent).reasons == [f"knobs.yaml {why}"]   # the controller's check
    for load in (load_harness, inspect_harness):                       # a worker's and the train command's
        with pytest.raises(UsageError, match="^" + re.escape(f"{d / 'knobs.yaml'} {why}") + "$"):
            load(d)
    code = main(["train", "--harness", str(d), "--model", str(ckpt), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err == f"evotrainer: error: {d / 'knobs.yaml'} {why}\n"
    assert not (tmp_path / "out").exists()


def test_every_knob_is_in_the_audit_of_what_a_harness_may_change():
    """docs/harness.md classifies every knob (training-only or measurement): a new knob needs a row."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "harness.md").read_text()
    audit = text.split("## What a harness may not change", 1)[1].split("\n## ", 1)[0]
    rows = {name for row in re.findall(r"^\| ([^|]+) \|", audit, re.M) for name in re.findall(r"`(\w+)`", row)}
    assert set(FIELDS) <= rows, set(FIELDS) - rows
    assert set(MEASUREMENT_KEYS) <= rows and not set(MEASUREMENT_KEYS) & set(FIELDS)


def test_k1_is_refused_as_a_kl_penalty_and_harmless_without_one(tmp_path):
    d = candidate(tmp_path, kl_coef=0.1, kl_estimator="k1")
    assert check_harness(d).reasons == [
        "knobs.yaml: knob kl_estimator 'k1' with kl_coef > 0: k1's expected gradient on-policy is zero, so the "
        "penalty would be noise; use kl_estimator: k2 (the KL's own gradient) or k3"]
    with pytest.raises(UsageError, match="kl_estimator 'k1' with kl_coef > 0"):
        load_harness(d)
    for i, knobs in enumerate(({"kl_coef": 0.1, "kl_estimator": "k2"}, {"kl_estimator": "k1"})):  # k2; k1, no penalty
        assert check_harness(candidate(tmp_path / str(i), **knobs)).legal


def test_bad_knob_value_is_a_reason(tmp_path):
    reasons = check_harness(candidate(tmp_path, {"knobs.yaml": "lr: -1\n"})).reasons
    assert reasons == ["knobs.yaml: knob lr must be > 0, got -1.0"]
    reasons = check_harness(candidate(tmp_path / "x", {"knobs.yaml": "lr: [1\n"})).reasons
    assert len(reasons) == 1 and reasons[0].startswith("knobs.yaml:") and "malformed YAML" in reasons[0]


# --------------------------------------------------------------------------- patches

def test_check_patch_paths():
    assert check_patch_paths(["reward.py", "knobs.yaml", "./diagnostics.py"]) == []
    reasons = check_patch_paths(["../evaluate.py", "/etc/passwd", "evaluate.py", "sub/reward.py",
                                 "splits/test.jsonl", "C:\\x\\reward.py"])
    assert [r.split(": ", 1)[0] for r in reasons] == [
        "../evaluate.py", "/etc/passwd", "evaluate.py", "sub/reward.py", "splits/test.jsonl", "C:\\x\\reward.py"]
    assert "'..'" in reasons[0] and "absolute" in reasons[1] and "not a harness file" in reasons[2]


GIT_PATCH = """\
diff --git a/knobs.yaml b/knobs.yaml
index 9bbcc51..02def7a 100644
--- a/knobs.yaml
+++ b/knobs.yaml
@@ -1 +1 @@
-lr: 3.0e-4
+lr: 1.0e-4
diff --git a/evaluate.py b/evaluate.py
new file mode 100644
--- /dev/null
+++ b/evaluate.py
@@ -0,0 +1 @@
+x = 1
diff --git a/empty b/empty
new file mode 100644
diff --git a/reward.py b/reward.py
new file mode 120000
--- /dev/null
+++ b/reward.py
@@ -0,0 +1 @@
+../../splits/test.jsonl
"""


def test_patch_paths_and_check_patch():
    assert patch_paths(GIT_PATCH) == ["knobs.yaml", "evaluate.py", "empty", "reward.py"]
    reasons = check_patch(GIT_PATCH)
    assert [r.split(":")[0] for r in reasons[:2]] == ["evaluate.py", "empty"]
    assert "patch creates a symlink; harness files must be plain files" in reasons
    assert check_patch(GIT_PATCH.split("diff --git a/evaluate.py")[0]) == []
