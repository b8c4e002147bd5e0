import os
import shutil
from pathlib import Path

import pytest

# the tests never download: every model they use is built on the fly (set before transformers loads)
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_var] = "1"

# nothing lands in the user's cache or data: the tests' split keys, cached bases and skill
# libraries stay in the clone (.gitignore'd), reused by its next test run. Set before
# evotrainer is imported (evotrainer/paths.py reads them once) and inherited by every
# command the tests start.
TEST_HOME = Path(__file__).resolve().parents[1] / ".test-home"
os.environ["XDG_CACHE_HOME"] = str(TEST_HOME / "cache")
os.environ["XDG_DATA_HOME"] = str(TEST_HOME / "data")


from evotrainer.harness import REFERENCE
from evotrainer.policy import build_model, build_tokenizer, save_policy


def readable(path):
    """pytest makes its temporary directories 0700 (and transformers writes weights 0600); a
    sandboxed job runs as nobody when the tests run as root, so what a job reads must be
    readable by others, as under umask 022."""
    os.chmod(path, 0o755)
    for sub in path.rglob("*"):
        sub.chmod(sub.stat().st_mode | (0o055 if sub.is_dir() else 0o044))
    return path


@pytest.fixture(autouse=True)
def _readable_tmp_path(request):
    if "tmp_path" in request.fixturenames:
        readable(request.getfixturevalue("tmp_path"))


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    """A randomly initialised policy checkpoint: enough for tests of plumbing, not of learning."""
    path = readable(tmp_path_factory.mktemp("ckpt"))
    tok = build_tokenizer()
    save_policy(build_model(len(tok)), tok, path)
    return path


@pytest.fixture
def tiny_run(tmp_path, ckpt):
    """A run config over a small root harness and a random-init base: plumbing, not learning."""
    return tiny_run_config(tmp_path, ckpt)


def tiny_run_config(tmp_path, ckpt):
    root = shutil.copytree(REFERENCE, tmp_path / "root")
    text = (root / "knobs.yaml").read_text()
    for old, new in [("prompts_per_step: 64", "prompts_per_step: 4"), ("group_size: 8", "group_size: 4")]:
        text = text.replace(old, new)
    (root / "knobs.yaml").write_text(text)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"task: arith\nlevel: 1\nharness: {root}\nseeds: [0]\nfinal_seeds: [100]\n"
                   f"model: {ckpt}\nsearch: {{skills: {tmp_path / 'skills.sqlite'}}}\n"
                   "budget: {trials: 2, steps_per_segment: 2, total_steps: 6, trial_timeout_s: 120}\n"
                   "evaluation: {every: 1}\n"   # 2-step segments: a checkpoint after step 1 too
                   "promotion: {replicas: 1}\n")     # the least the gate needs with one seed: plumbing, not gains
    return cfg, tmp_path / "run"


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    """A tiny Qwen2-architecture model with a byte-level BPE tokenizer and a chat template, built
    locally: a user's Hugging Face model as evotrainer sees it."""
    from tiny_hf import build_tiny_qwen
    return readable(build_tiny_qwen(tmp_path_factory.mktemp("qwen")))
