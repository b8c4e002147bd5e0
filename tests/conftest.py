import json
import os
from pathlib import Path

import pytest

# the tests never download: every model they use is built on the fly (set before transformers loads)
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_var] = "1"

# Each pytest-xdist worker runs on its own share of the cores (scripts/test.sh runs two on a
# 2-core machine), and so does everything it starts: a job's threads come from the affinity
# (sandbox.processes.usable_cores). Two workers whose torch threads outnumber the cores spin
# against each other and run many times slower (20 tiny GRPO steps took 122 s in each of two
# 2-thread processes, 2.8 s in each of two 1-thread ones). Set before torch loads.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cores, _n = sorted(os.sched_getaffinity(0)), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if _n > 1 and len(_cores) > 1:
        os.sched_setaffinity(0, _cores[int(_WORKER[2:]) % _n::_n] or _cores)

# nothing lands in the user's cache or data: the tests' split keys, cached bases and skill
# libraries stay in the clone (.gitignore'd), reused by its next test run. Set before
# evotrainer is imported (evotrainer/paths.py reads them once) and inherited by every
# command the tests start. Each pytest-xdist worker (scripts/test.sh runs two) has its own,
# so that two never build one cached base or split key at once.
TEST_HOME = Path(__file__).resolve().parents[1] / ".test-home" / os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ["XDG_CACHE_HOME"] = str(TEST_HOME / "cache")
os.environ["XDG_DATA_HOME"] = str(TEST_HOME / "data")


def pytest_addoption(parser):
    parser.addoption("--times", metavar="FILE", default=None,
                     help="write each test phase's seconds and pytest-xdist worker to FILE, a JSON line "
                          "each (scripts/test_profile.py reads it: per file, per worker, idle at the end)")


_TIMES: list[dict] = []


def pytest_runtest_logreport(report):
    """Every phase's time, recorded where the reports meet (the xdist controller, or the only
    process): `report.node` is the worker that ran it."""
    node = getattr(report, "node", None)
    _TIMES.append({"test": report.nodeid, "when": report.when, "seconds": round(report.duration, 3),
                   "start": report.start, "stop": report.stop,
                   "worker": node.gateway.id if node is not None else "main"})


def pytest_sessionfinish(session):
    path = session.config.getoption("--times")
    if path and not hasattr(session.config, "workerinput"):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("".join(json.dumps(t) + "\n" for t in _TIMES))


from helpers import readable, tiny_run_config
from evotrainer.policy import build_model, build_tokenizer, save_policy


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


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    """A tiny Qwen2-architecture model with a byte-level BPE tokenizer and a chat template, built
    locally: a user's Hugging Face model as evotrainer sees it."""
    from tiny_hf import build_tiny_qwen
    return readable(build_tiny_qwen(tmp_path_factory.mktemp("qwen")))
