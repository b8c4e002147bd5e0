"""Where evotrainer keeps bases, keys and skills: the XDG base directories, and in the tests
the clone's own (conftest.py), never the user's; and paths named with any character, in task
specs and in what a job reads (a whole run over such paths: test_real_use's JSONL task)."""
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


# ----------------------------------------------------------- paths inside specs and jobs' reads
# A file may be named with any character a task spec is made of ('=', ':', '?', ',', '&'):
# a spec carries it escaped, and a job is shown exactly the files its Call names.

WEIRD = "/data/exp=2,a:b?c%3F&d+e;f/t.jsonl"


def test_a_spec_carries_any_path_and_names_exactly_its_files():
    from evotrainer.tasks.spec import canonical, parse_spec, spec_files
    spec = canonical(f"jsonl:{WEIRD}", {"data": WEIRD, "verifier": "exact"})
    s = parse_spec(spec)
    assert s.base == f"jsonl:{WEIRD}" and s.query == {"data": WEIRD, "verifier": "exact"}
    assert canonical(s.base, s.query) == spec and spec_files(spec) == (WEIRD, WEIRD)
    # a spec with nothing to escape reads and writes as it always has
    assert canonical("jsonl:/data/x,y:z=1.jsonl", {"verifier": "exact"}) == "jsonl:/data/x,y:z=1.jsonl?verifier=exact"
    assert spec_files("/p/x:y/tasks.py:Make") == ("/p/x:y/tasks.py",)
    assert spec_files("trl-env:/p/x:y/env.py:Env?data=/r/a=b,c.jsonl&max_turns=2") == ("/p/x:y/env.py", "/r/a=b,c.jsonl")
    assert spec_files("arith") == spec_files("rg:composite?families=a,b:2") == spec_files("pkg.mod:Make") == ()


def test_a_job_without_declared_reads_reads_whole_paths_never_a_prefix_of_one(tmp_path):
    from evotrainer.sandbox import declared_paths, named_paths
    data = tmp_path / "exp=2,a:b" / "t.jsonl"
    data.parent.mkdir()
    data.write_text("{}\n")
    (tmp_path / "exp").mkdir()  # what cutting 'jsonl:/.../exp=2,a:b/t.jsonl' at '=' would name
    assert named_paths({"task": f"jsonl:{data}?verifier=exact", "level": 1}) == set()
    assert named_paths({"rows": [str(data)], "jobs": {str(data.parent): ["val"]}}) == {str(data), str(data.parent)}
    assert declared_paths((f"jsonl:{data}", str(data), str(tmp_path / "gone"))) == {str(data)}
