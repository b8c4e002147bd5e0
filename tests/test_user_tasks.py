"""Tasks from users (JSONL files, module/file factories, entry points) and spec strings."""
import hashlib
import json
import random
import subprocess
import sys

import pytest

from evotrainer.catalog import get_task
from evotrainer.errors import UsageError
from evotrainer.tasks.base import (
    HELD_OUT_SHARE,
    Problem,
    budget_from_answers,
    pool_digest,
)
from evotrainer.tasks.jsonl import JsonlConfig, JsonlTask
from evotrainer.tasks.verifiers import VERIFIERS, last_number


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def numbered(n, level=0, start=0):
    return [{"prompt": f"What is {i} + 0? (level {level})", "answer": str(i), "level": level}
            for i in range(start, start + n)]


def ids(problems):
    return [p.id for p in problems]


def one_line_usage_error(spec, level=None, match=None):
    with pytest.raises(UsageError) as e:
        get_task(spec, level)
    msg = str(e.value)
    assert "\n" not in msg, msg
    if match is not None:
        assert match in msg, msg
    return msg


@pytest.fixture
def clean_imports(monkeypatch):
    """Undo what loading user task modules does to sys.path and sys.modules."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


# --------------------------------------------------------------------------- verifiers

def test_verifier_registry_is_documented():
    assert set(VERIFIERS) == {"exact", "numeric", "math"}
    assert all(fn.__doc__ and fn.__doc__.strip() for fn in VERIFIERS.values())


def test_jsonl_exact_verifier(tmp_path):
    path = write_jsonl(tmp_path / "exact.jsonl", numbered(80))
    task = get_task(f"jsonl:{path}")
    assert task.name == "jsonl:exact" and task.spec == f"jsonl:{path}?verifier=exact"
    p = task.split("val")[0]
    assert task.score(p, f"  {p.answer}\n") == 1.0
    assert task.score(p, p.answer + "0") == 0.0 and task.score(p, f"= {p.answer}") == 0.0
    assert task.score(p, "") == 0.0


def test_jsonl_numeric_verifier(tmp_path):
    rows = numbered(79) + [{"prompt": "How many?", "answer": 1234}]  # a JSON number becomes "1234"
    task = get_task(f"jsonl:{write_jsonl(tmp_path / 'num.jsonl', rows)}?verifier=numeric")
    p = Problem(id="x", prompt="How many?", answer="1234", level=0)
    assert task.score(p, "The answer is 1,234.") == 1.0
    assert task.score(p, "1234.0") == 1.0 and task.score(p, "so 12 ... then 1234") == 1.0
    assert task.score(p, "1234 apples, 12 left") == 0.0      # the LAST number counts
    assert task.score(p, "The answer is 1,235.") == 0.0
    assert task.score(p, "no number here") == 0.0
    assert task.score(Problem("y", "", "-3", 0), "x = -3") == 1.0
    assert task.score(Problem("y", "", "0.3", 0), "0.30000000000000004") == 1.0  # rounding noise
    assert task.score(Problem("y", "", "1000000000", 0), "1000000001") == 0.0     # a wrong digit
    assert [r.answer for r in task.split("val") + task.split("test")] and \
        all(task.score(r, f"I think {r.answer}.") == 1.0 for r in task.split("val"))
    assert last_number("1,000 and 5-3") == 3 and last_number("none") is None


def test_jsonl_math_verifier(tmp_path, monkeypatch):
    rows = numbered(79) + [{"prompt": "Half?", "answer": "\\frac{1}{2}"}]
    task = get_task(f"jsonl:{write_jsonl(tmp_path / 'm.jsonl', rows)}?verifier=math")
    half = Problem(id="h", prompt="Half?", answer="\\frac{1}{2}", level=0)
    assert task.score(half, "0.5") == 1.0
    assert task.score(half, "$\\frac12$") == 1.0
    assert task.score(half, "The answer is \\boxed{1/2}") == 1.0
    assert task.score(half, "1/3") == 0.0 and task.score(half, "") == 0.0
    import math_verify

    def boom(*a, **k):
        raise RuntimeError("parser blew up")
    monkeypatch.setattr(math_verify, "parse", boom)
    assert task.score(half, "0.5") == 0.0  # an exception from math-verify scores 0, never raises


# --------------------------------------------------------------------------- jsonl splits

def test_jsonl_splits_disjoint_deterministic_and_from_the_held_out_hash(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", numbered(400))
    a, b = get_task(f"jsonl:{path}"), get_task(f"jsonl:{path}")
    val, test = a.split("val"), a.split("test")
    assert 20 <= len(val) <= 80 and 20 <= len(test) <= 80    # ~1 in 8 rows each
    assert not set(ids(val)) & set(ids(test))
    assert ids(val) == ids(b.split("val")) and ids(test) == ids(b.split("test"))
    assert all(pool_digest(a.name, p)[0] % HELD_OUT_SHARE == 0 for p in val + test)
    assert all(a.held_out(p) for p in val + test)
    # every row is in exactly one of train, val, test
    train = [p for p in a._rows["train"][0]]
    assert len(train) + len(val) + len(test) == 400 == a.problem_space(0) + len(val) + len(test)
    assert not any(a.held_out(p) for p in train)
    assert a.split("val", n=5) == val[:5]
    with pytest.raises(ValueError):
        a.split("train")


def test_jsonl_pinned_rows_go_where_they_say(tmp_path):
    rows = numbered(200)
    name = "jsonl:pinned"

    def default_id(row):
        return hashlib.sha256(row["prompt"].encode()).hexdigest()[:16]

    held = [r for r in rows if pool_digest(name, Problem(default_id(r), "", "", 0))[0] % HELD_OUT_SHARE == 0]
    free = [r for r in rows if r not in held]
    held[0]["split"] = "train"          # the hash would hold it out; the pin keeps it in training
    free[0]["split"] = "val"            # the hash would train on it; the pin puts it in val
    free[1]["split"] = "test"
    rows.append({"prompt": "pinned with id", "answer": "1", "id": "my-id", "split": "test"})
    task = get_task(f"jsonl:{write_jsonl(tmp_path / 'pinned.jsonl', rows)}")
    val, test = set(ids(task.split("val"))), set(ids(task.split("test")))
    assert default_id(free[0]) in val and default_id(free[1]) in test and "my-id" in test
    train = task._rows["train"][0]
    assert default_id(held[0]) in ids(train) and not task.held_out(train[ids(train).index(default_id(held[0]))])
    stream = task.train_stream(0)
    drawn = {stream.draw(0).id for _ in range(2000)}
    assert default_id(held[0]) in drawn and not drawn & (val | test)


def test_jsonl_keyed_split_and_the_workers_train_view(tmp_path):
    from evotrainer.tasks.base import train_draws
    path = write_jsonl(tmp_path / "k.jsonl", numbered(400))
    task = get_task(f"jsonl:{path}")
    public_val = set(ids(task.split("val")))
    public = public_val | set(ids(task.split("test")))
    task.use_key(b"\x07" * 32)
    held = set(ids(task.split("val"))) | set(ids(task.split("test")))
    # the held-out rows are public (about 100 here, all scored); the key picks which are val
    assert held == public and set(ids(task.split("val"))) != public_val and task.data_files() == (str(path),)
    # the worker's file holds the training rows and nothing else; with handed indices it
    # trains on exactly the controller's problems
    spec = task.train_spec(tmp_path / "view")
    assert "rows=train" in spec and str(path) not in spec
    worker = get_task(spec)
    assert worker.spec == spec and worker.max_new_tokens == task.max_new_tokens
    view_ids = {json.loads(line)["id"] for line in (tmp_path / "view" / "k.jsonl").read_text().splitlines()}
    assert view_ids == set(ids(task._rows["train"][0])) and not view_ids & held
    worker.use_draws({str(lv): ix for lv, ix in train_draws(task, 3, 100).items()})
    ref, stream = task.train_stream(3), worker.train_stream(3)
    assert [stream.draw(0).id for _ in range(100)] == [ref.draw(0).id for _ in range(100)]


def test_jsonl_train_stream_never_yields_val_or_test(tmp_path, monkeypatch):
    task = get_task(f"jsonl:{write_jsonl(tmp_path / 's.jsonl', numbered(300))}")
    held = set(ids(task.split("val"))) | set(ids(task.split("test")))
    monkeypatch.setattr(type(task), "split", lambda *a, **k: pytest.fail("the train stream built a split"))
    stream = task.train_stream(seed=3)
    drawn = [stream.draw(0) for _ in range(3000)]
    assert not {p.id for p in drawn} & held
    assert len({p.id for p in drawn}) == task.problem_space(0) == 300 - len(held)  # all train rows, only them
    again = task.train_stream(seed=3)
    assert [again.draw(0).id for _ in range(50)] == [p.id for p in drawn[:50]]


def test_jsonl_split_cap_and_surplus_trains(tmp_path):
    path = write_jsonl(tmp_path / "cap.jsonl", numbered(400))
    full = get_task(f"jsonl:{path}")
    capped = JsonlTask(JsonlConfig(path=path, split_size=5))
    assert len(capped.split("val")) == 5 and len(capped.split("test")) == 5
    assert set(ids(capped.split("val"))) <= set(ids(full.split("val")))
    surplus = (set(ids(full.split("val"))) | set(ids(full.split("test")))) - \
        (set(ids(capped.split("val"))) | set(ids(capped.split("test"))))
    assert surplus and surplus <= set(ids(capped._rows["train"][0]))
    assert capped.problem_space(0) == 390


def test_jsonl_levels(tmp_path):
    rows = numbered(120, level=0) + numbered(120, level=1, start=1000) + numbered(120, level=2, start=2000)
    spec = f"jsonl:{write_jsonl(tmp_path / 'lv.jsonl', rows)}"
    top = get_task(spec)
    assert top.levels == (0, 1, 2) and top.target_level == 2
    assert all(p.level == 2 for p in top.split("val") + top.split("test"))
    one = get_task(spec, 1)
    assert one.target_level == 1 and all(p.level == 1 for p in one.split("val") + one.split("test"))
    assert one.problem_space(1) == 120 - len(one.split("val")) - len(one.split("test"))
    assert {p.level for p in one.train_stream(0).batch([0, 1, 2, 0])} == {0, 1, 2}
    assert get_task(spec, 0).target_level == 0
    msg = one_line_usage_error(spec, 5, match="level 5")
    assert "0, 1, 2" in msg


def test_jsonl_budget_from_answers(tmp_path):
    rows = numbered(80) + [{"prompt": "long", "answer": "x" * 30}]
    task = get_task(f"jsonl:{write_jsonl(tmp_path / 'b.jsonl', rows)}")
    assert task.max_new_tokens == 30 + 15 == budget_from_answers(["7", "x" * 30])
    assert budget_from_answers(["12"]) == 6  # at least 4 of slack


# --------------------------------------------------------------------------- jsonl errors

def test_jsonl_bad_inputs_are_one_line_usage_errors(tmp_path):
    good = numbered(80)
    missing = tmp_path / "nope.jsonl"
    one_line_usage_error(f"jsonl:{missing}", match=str(missing))
    one_line_usage_error("jsonl:", match="needs a path")

    bad_json = write_jsonl(tmp_path / "badjson.jsonl", good[:2] + ["{not json"] + good[2:])
    one_line_usage_error(f"jsonl:{bad_json}", match=f"{bad_json}:3: not a JSON object")
    array = write_jsonl(tmp_path / "array.jsonl", good[:1] + ["[1, 2]"] + good[1:])
    one_line_usage_error(f"jsonl:{array}", match=f"{array}:2: not a JSON object")

    no_answer = write_jsonl(tmp_path / "noanswer.jsonl", good[:1] + [{"prompt": "p"}] + good[1:])
    one_line_usage_error(f"jsonl:{no_answer}", match=f"{no_answer}:2: row has no 'answer' field; "
                                                     "each row needs 'prompt' and 'answer'")
    no_prompt = write_jsonl(tmp_path / "noprompt.jsonl", [{"answer": "1"}] + good)
    one_line_usage_error(f"jsonl:{no_prompt}", match=f"{no_prompt}:1: row has no 'prompt' field")

    ok = write_jsonl(tmp_path / "ok.jsonl", good)
    msg = one_line_usage_error(f"jsonl:{ok}?verifier=fuzzy", match="unknown verifier 'fuzzy'")
    assert all(v in msg for v in ("exact", "numeric", "math"))
    msg = one_line_usage_error(f"jsonl:{ok}?verfier=math", match="unknown option 'verfier'")
    assert "verifier" in msg.split("valid options:")[1] and "max_new_tokens" in msg

    all_held = write_jsonl(tmp_path / "allheld.jsonl", [dict(r, split="val" if i % 2 else "test")
                                                        for i, r in enumerate(good)])
    one_line_usage_error(f"jsonl:{all_held}", match="no train rows")
    all_train = write_jsonl(tmp_path / "alltrain.jsonl", [dict(r, split="train") for r in good])
    one_line_usage_error(f"jsonl:{all_train}", match="no val rows")
    no_test = write_jsonl(tmp_path / "notest.jsonl", [dict(r, split="train") for r in good[1:]] +
                          [dict(good[0], split="val")])
    one_line_usage_error(f"jsonl:{no_test}", match="no test rows")

    empty = write_jsonl(tmp_path / "empty.jsonl", [""])
    one_line_usage_error(f"jsonl:{empty}", match="no rows")
    word = write_jsonl(tmp_path / "word.jsonl", good + [{"prompt": "q", "answer": "seven"}])
    one_line_usage_error(f"jsonl:{word}?verifier=numeric", match=f"{word}:81: answer 'seven' is not a number")
    get_task(f"jsonl:{word}")  # fine for exact
    bad_split = write_jsonl(tmp_path / "split.jsonl", good + [{"prompt": "q", "answer": "1", "split": "dev"}])
    one_line_usage_error(f"jsonl:{bad_split}", match=f"{bad_split}:81: 'split' must be one of train, val, test")
    bad_level = write_jsonl(tmp_path / "level.jsonl", good + [{"prompt": "q", "answer": "1", "level": "hard"}])
    one_line_usage_error(f"jsonl:{bad_level}", match=f"{bad_level}:81: 'level' must be a non-negative integer")
    dup = write_jsonl(tmp_path / "dup.jsonl", good + [good[3]])
    one_line_usage_error(f"jsonl:{dup}", match=f"{dup}:81: duplicate id")
    not_str = write_jsonl(tmp_path / "notstr.jsonl", good + [{"prompt": ["q"], "answer": "1"}])
    one_line_usage_error(f"jsonl:{not_str}", match="'prompt' must be a string")


# --------------------------------------------------------------------------- canonical specs

def test_jsonl_canonical_spec_round_trips_from_another_cwd(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "qa.jsonl", numbered(100) + numbered(100, level=1, start=500))
    monkeypatch.chdir(tmp_path)
    task = get_task("jsonl:data/qa.jsonl?verifier=numeric&max_new_tokens=40", 0)
    path = tmp_path / "data" / "qa.jsonl"
    assert task.spec == f"jsonl:{path}?max_new_tokens=40&verifier=numeric"
    assert get_task("jsonl:data/qa.jsonl", 0).spec == f"jsonl:{path}?verifier=exact"  # the default, explicit
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    again = get_task(task.spec, task.target_level)
    assert again.spec == task.spec and again.max_new_tokens == 40 and again.target_level == 0
    for which in ("val", "test"):
        assert ids(again.split(which)) == ids(task.split(which))
    # a fresh process (what a worker is) in yet another cwd rebuilds the same splits
    code = ("import json, sys; from evotrainer.catalog import get_task; t = get_task(sys.argv[1], int(sys.argv[2]));"
            "print(json.dumps([t.spec, t.max_new_tokens, [p.id for p in t.split('val')], [p.id for p in t.split('test')],"
            " [t.train_stream(0).draw(0).id]]))")
    out = subprocess.run([sys.executable, "-c", code, task.spec, "0"], cwd="/", capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [task.spec, 40, ids(task.split("val")), ids(task.split("test")),
                                      [task.train_stream(0).draw(0).id]]


def test_jsonl_name_does_not_depend_on_the_directory(tmp_path):
    rows = numbered(150)
    a = get_task(f"jsonl:{write_jsonl(tmp_path / 'qa.jsonl', rows)}")
    (tmp_path / "moved").mkdir()
    b = get_task(f"jsonl:{write_jsonl(tmp_path / 'moved' / 'qa.jsonl', rows)}")
    assert a.name == b.name == "jsonl:qa" and a.spec != b.spec
    assert ids(a.split("val")) == ids(b.split("val")) and ids(a.split("test")) == ids(b.split("test"))


def test_builtin_specs_and_max_new_tokens_override():
    arith = get_task("arith")
    assert arith.spec == "arith" and arith.max_new_tokens == 9
    wide = get_task("arith?max_new_tokens=30", 2)
    assert wide.spec == "arith?max_new_tokens=30" and wide.max_new_tokens == 30 and wide.name == "arith"
    back = get_task(wide.spec, wide.target_level)
    assert back.max_new_tokens == 30 and ids(back.split("val")) == ids(wide.split("val"))
    assert ids(wide.split("val")) == ids(get_task("arith", 2).split("val"))  # the budget leaves splits alone
    rg = get_task("rg:chain_sum?max_new_tokens=512")
    assert rg.spec == "rg:chain_sum?max_new_tokens=512" and rg.max_new_tokens == 512 and rg.name == "rg:chain_sum"
    assert get_task("rg:chain_sum").spec == "rg:chain_sum"


@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "1.5", "+3"])
def test_bad_max_new_tokens(value):
    one_line_usage_error(f"arith?max_new_tokens={value}", match="max_new_tokens must be a positive integer")


def test_bad_queries():
    msg = one_line_usage_error("arith?verifier=math", match="unknown option 'verifier'")
    assert "valid options: max_new_tokens" in msg          # arith takes no verifier
    one_line_usage_error("rg:chain_sum?tokens=5", match="unknown option 'tokens'")
    one_line_usage_error("arith?max_new_tokens", match="malformed query")
    one_line_usage_error("arith?max_new_tokens=5&max_new_tokens=6", match="given twice")


# --------------------------------------------------------------------------- module:Factory, file.py:Factory

TASK_MODULE = '''
import random
from evotrainer.tasks import Task, Problem


class Parity(Task):
    """Is n even? A tiny user task with levels 1..3 (n has `level` digits)."""

    def __init__(self, level=None):
        self.name = "parity"
        self.levels = (1, 2, 3)
        self.target_level = level or 2
        self.max_new_tokens = 5

    def problem_space(self, level):
        return 9 * 10 ** (level - 1)

    def generate(self, rng, level):
        n = rng.randrange(10 ** (level - 1), 10 ** level)
        return Problem(id=str(n), prompt=f"{n} even?", answer="yes" if n % 2 == 0 else "no", level=level)

    def score(self, problem, completion):
        return 1.0 if completion.strip() == problem.answer else 0.0


def no_level():
    return Parity(1)


def with_kwargs(**kw):
    return Parity(kw.get("level"))


def not_a_task(level=None):
    return {"level": level}


def fails(level=None):
    raise ValueError("level must be odd\\nsecond line")


OTHER = 42
'''


@pytest.fixture
def task_module(tmp_path, monkeypatch, clean_imports):
    (tmp_path / "my_user_tasks.py").write_text(TASK_MODULE)
    (tmp_path / "broken_user_tasks.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    # the test has teeth only if the cwd is not importable already (as in the console script)
    sys.path[:] = [p for p in sys.path if p not in ("", ".", str(tmp_path))]
    return tmp_path


def test_module_factory_with_and_without_level(task_module):
    t = get_task("my_user_tasks:Parity", 3)             # a Task subclass is a factory
    assert t.target_level == 3 and t.spec == "my_user_tasks:Parity" and t.name == "parity"
    assert str(task_module) in sys.path                  # the cwd was put on sys.path to import it
    val = t.split("val")
    assert val and all(t.held_out(p) and p.level == 3 for p in val)
    assert get_task("my_user_tasks:Parity").target_level == 2
    assert get_task("my_user_tasks:with_kwargs", 1).target_level == 1
    assert get_task("my_user_tasks:no_level").target_level == 1
    assert get_task("my_user_tasks:no_level", 1).target_level == 1  # its own level: the round trip works
    one_line_usage_error("my_user_tasks:no_level", 3, match="takes no level")
    withb = get_task("my_user_tasks:Parity?max_new_tokens=64", 1)
    assert withb.max_new_tokens == 64 and withb.spec == "my_user_tasks:Parity?max_new_tokens=64"
    assert ids(get_task(withb.spec, 1).split("test")) == ids(withb.split("test"))


def test_module_factory_errors(task_module):
    one_line_usage_error("my_user_tasks:not_a_task", match="returned a dict, not an evotrainer.tasks.Task")
    one_line_usage_error("my_user_tasks:OTHER", match="not a Task class or factory")
    one_line_usage_error("my_user_tasks:missing", match="has no attribute 'missing'")
    one_line_usage_error("my_user_tasks:fails", match="ValueError: level must be odd")
    one_line_usage_error("no_such_module_xyz:make", match="cannot import task module 'no_such_module_xyz': "
                                                          "ModuleNotFoundError")
    one_line_usage_error("broken_user_tasks:make", match="cannot import task module 'broken_user_tasks': "
                                                         "ModuleNotFoundError: No module named 'no_such_dependency_xyz'")
    one_line_usage_error("my-tasks:make", match="neither a module name nor a .py file")


def test_file_factory_and_canonical_spec(task_module, monkeypatch):
    (task_module / "sub").mkdir()
    (task_module / "sub" / "filetask.py").write_text(TASK_MODULE)
    t = get_task("sub/filetask.py:Parity", 1)
    absolute = task_module / "sub" / "filetask.py"
    assert t.spec == f"{absolute}:Parity" and t.target_level == 1
    monkeypatch.chdir("/")
    again = get_task(t.spec, 1)
    assert again.spec == t.spec and ids(again.split("val")) == ids(t.split("val"))
    assert type(again) is type(t)  # the file is loaded once per process
    assert get_task(f"{absolute}:no_level").target_level == 1
    one_line_usage_error(f"{absolute}:not_a_task", match="returned a dict")
    one_line_usage_error(f"{absolute}:missing", match=f"{absolute} has no attribute 'missing'")
    one_line_usage_error(f"{task_module}/nope.py:make", match="task file not found")
    (task_module / "bad.py").write_text("raise RuntimeError('bad file')\n")
    one_line_usage_error(f"{task_module}/bad.py:make", match="RuntimeError: bad file")


# --------------------------------------------------------------------------- entry points

@pytest.fixture
def entry_point_dist(tmp_path, monkeypatch, clean_imports):
    site = tmp_path / "site"
    info = site / "fake_dist-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-dist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[evotrainer.tasks]\nmytask = mymod:make\nbrokentask = mymod:nope\n")
    (site / "mymod.py").write_text(TASK_MODULE + "\n\ndef make(level=None):\n    return Parity(level)\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_entry_point_task(entry_point_dist):
    t = get_task("mytask", 3)
    assert t.spec == "mytask" and t.target_level == 3 and t.name == "parity"
    assert ids(get_task(t.spec, 3).split("val")) == ids(t.split("val"))
    assert get_task("mytask?max_new_tokens=7").spec == "mytask?max_new_tokens=7"
    one_line_usage_error("brokentask", match="task entry point 'brokentask' (mymod:nope) failed to load")
    msg = one_line_usage_error("nope", match="unknown task 'nope'")
    for form in ("arith", "rg:<family>", "jsonl:PATH[?verifier=exact|numeric|math]", "module:Factory",
                 "file.py:Factory", "mytask", "brokentask"):
        assert form in msg, form


def test_unknown_bare_name_without_entry_points():
    msg = one_line_usage_error("nope", match="unknown task 'nope'")
    assert "mytask" not in msg and "jsonl:PATH" in msg


# --------------------------------------------------------------------------- reasoning gym

def test_rg_dataset_built_once_per_level(monkeypatch):
    import reasoning_gym
    calls = []
    real = reasoning_gym.create_dataset
    monkeypatch.setattr(reasoning_gym, "create_dataset", lambda *a, **k: calls.append(k) or real(*a, **k))
    task = get_task("rg:chain_sum")
    rng = random.Random(0)
    drawn = [task.generate(rng, 0) for _ in range(50)]
    stream = task.train_stream(0)
    drawn += [stream.draw(0) for _ in range(50)]
    assert len(calls) == 1 and calls[0]["size"] >= 10 ** 9   # one large dataset, not one per draw
    assert len({p.id for p in drawn}) > 90                   # still fresh problems
    assert all(task.score(p, p.answer) == 1.0 for p in drawn[:20])
    ladder = get_task("rg:chain_sum", 2)
    rng = random.Random(1)
    for _ in range(50):
        ladder.generate(rng, 1), ladder.generate(rng, 2)
    assert len(calls) == 3                                   # + one for each of levels 2 and 1
    # the same task in another instance (another process) draws the same problems
    rng_a, rng_b = random.Random(5), random.Random(5)
    assert [task.generate(rng_a, 0).id for _ in range(10)] == \
        [get_task("rg:chain_sum").generate(rng_b, 0).id for _ in range(10)]


def test_rg_budget_comes_from_the_familys_answers(monkeypatch):
    import reasoning_gym

    class Fake:
        def __init__(self, width):
            self.width = width

        def __getitem__(self, idx):
            return {"question": f"q{idx}", "answer": "7" * self.width}

    width = {"chain_sum": 5, "basic_arithmetic": 40}
    monkeypatch.setattr(reasoning_gym, "create_dataset", lambda family, **k: Fake(width[family]))
    assert get_task("rg:chain_sum").max_new_tokens == 5 + 4
    assert get_task("rg:basic_arithmetic").max_new_tokens == 40 + 20
    assert get_task("rg:basic_arithmetic?max_new_tokens=512").max_new_tokens == 512
    monkeypatch.undo()
    real = get_task("rg:chain_sum")
    longest = max(len(p.answer) for p in real.split("val") + real.split("test"))
    assert longest < real.max_new_tokens <= 2 * longest + 4   # room for every answer and the end token
