"""Where evotrainer keeps bases, keys and skills: the XDG base directories, and in the tests
the clone's own (conftest.py), never the user's."""
import os
import subprocess
import sys
from pathlib import Path

from evotrainer.paths import xdg_dir

CLONE = Path(__file__).resolve().parents[1]


def test_the_directories_follow_xdg_and_default_to_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert xdg_dir("XDG_CACHE_HOME", ".cache") == tmp_path / "xdg" / "evotrainer"
    for unset in ("", "relative/cache"):  # the spec: an empty or relative value is ignored
        monkeypatch.setenv("XDG_CACHE_HOME", unset)
        assert xdg_dir("XDG_CACHE_HOME", ".cache") == tmp_path / "home" / ".cache" / "evotrainer"
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert xdg_dir("XDG_DATA_HOME", ".local/share") == tmp_path / "home" / ".local" / "share" / "evotrainer"


def defaults(env: dict) -> list[str]:
    """The cache the CLI, the split keys and the skill library default to, in a fresh process."""
    code = ("from evotrainer.cli import build_parser\nfrom evotrainer.tasks.keys import key_dir\n"
            "from evotrainer.skills import DEFAULT_LIBRARY\n"
            "print(build_parser().parse_args(['pretrain']).cache_dir, key_dir(), DEFAULT_LIBRARY)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_a_user_with_xdg_variables_gets_their_directories(tmp_path):
    env = os.environ | {"XDG_CACHE_HOME": str(tmp_path / "c"), "XDG_DATA_HOME": str(tmp_path / "d")}
    cache = str(tmp_path / "c" / "evotrainer")
    assert defaults(env) == [cache, f"{cache}/keys", str(tmp_path / "d" / "evotrainer" / "skills.sqlite")]


def test_the_tests_and_every_command_they_start_use_the_clones_own_directories():
    test_home = CLONE / ".test-home" / os.environ.get("PYTEST_XDIST_WORKER", "main")  # one per test process
    assert defaults(dict(os.environ)) == [str(test_home / "cache" / "evotrainer"),
                                          str(test_home / "cache" / "evotrainer" / "keys"),
                                          str(test_home / "data" / "evotrainer" / "skills.sqlite")]
    from evotrainer.tasks.keys import DEFAULT_CACHE  # ... and this process
    assert DEFAULT_CACHE == test_home / "cache" / "evotrainer"
    assert ".test-home/" in (CLONE / ".gitignore").read_text().splitlines()
