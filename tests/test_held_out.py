"""The held-out pool is public and the split key only orders validation and test inside it,
so what a training worker is handed is the same under every key: nothing to infer from it."""
import hashlib
import json
import sys

import pytest

from helpers import PARITY_TASK
from evotrainer.catalog import get_task
from evotrainer.tasks.base import HELD_OUT_SHARE, pool_digest
from evotrainer.trainer.jobs import handed_draws

KEYS = (None, b"\x01" * 32, b"\x02" * 32)  # no key (library use), and two runs' keys
STEPS = 3  # a short segment: (3 + 2) x 64 + 16 = 336 handed indices per level



@pytest.fixture
def spec(request, tmp_path):
    """The spec of each task kind: built in, reasoning-gym, the user's JSONL rows, a user class."""
    kind = request.param
    if kind == "jsonl":
        rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "level": i % 2} for i in range(600)]
        path = tmp_path / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        yield f"jsonl:{path}"
    elif kind == "user":
        before = set(sys.modules)  # loading the file registers a module: forget it afterwards
        (tmp_path / "parity.py").write_text(PARITY_TASK)
        yield f"{tmp_path / 'parity.py'}:Parity"
        for name in set(sys.modules) - before:
            del sys.modules[name]
    else:
        yield kind


def keyed(spec, key, level=None):
    task = get_task(spec, level)
    if key is not None:
        task.use_key(key)
    return task


def scored(task):
    return {p.id for which in ("val", "test") for p in task.split(which)}


@pytest.mark.parametrize("spec", ["arith", "rg:chain_sum", "jsonl", "user"], indirect=True)
def test_the_handed_training_data_is_the_same_under_any_key(spec, tmp_path):
    level = 2 if spec == "arith" else None  # arith 2: val and test are half of its pool
    tasks = [keyed(spec, key, level) for key in KEYS]
    draws = [handed_draws(t, None, 7, STEPS) for t in tasks]
    assert draws[0] == draws[1] == draws[2] and all(len(ix) == 336 for ix in draws[0].values())
    # the view a worker gets (a JSONL task's file of train rows) is byte for byte the same
    views = [t.train_spec(tmp_path / f"view{n}") for n, t in enumerate(tasks)]
    files = [sorted(p.read_bytes() for p in (tmp_path / f"view{n}").glob("*")) for n in range(len(tasks))]
    assert files[0] == files[1] == files[2]
    # ... and so are the problems the worker rebuilds from the indices, which it never checks
    rebuilt = []
    for view, d in zip(views, draws):
        worker = get_task(view, tasks[0].target_level)
        worker.use_draws(d)
        stream = worker.train_stream(7)
        rebuilt.append([(p.id, p.prompt, p.answer) for p in (stream.draw(int(lv)) for lv in d for _ in range(336))])
    assert rebuilt[0] == rebuilt[1] == rebuilt[2]
    # the key still matters: it picks other validation and test problems ...
    _, a, b = tasks
    assert [p.id for p in a.split("val")] != [p.id for p in b.split("val")]
    assert [p.id for p in a.split("test")] != [p.id for p in b.split("test")]
    # ... and neither key's (nor the public one's) ever meets a handed training problem
    handed = {pid for pid, _, _ in rebuilt[0]}
    assert all(scored(t) and not scored(t) & handed for t in tasks)


def test_a_jsonl_key_moves_rows_between_val_and_test_only(tmp_path):
    path = tmp_path / "few.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(400)))
    public, a, b = (keyed(f"jsonl:{path}", key) for key in KEYS)
    # about 100 rows are in the public pool, fewer than validation and test have room for:
    # all of them are scored under every key, and the key decides which are validation
    assert scored(public) == scored(a) == scored(b) and 70 <= len(scored(a)) <= 130
    val = {t: {p.id for p in t.split("val")} for t in (a, b)}
    assert val[a] != val[b] and abs(len(val[a]) - len(scored(a)) / 2) <= 1


def test_the_gaps_in_arith_level_2_handed_indices_are_the_public_pool_under_any_key():
    """The attack this design closes: a worker that lists the indices it was not handed and
    rebuilds them. Before, those gaps were the run's keyed pool (about half of a 100-step
    segment's distinct gap problems were validation or test problems); now they are the
    public pool, the same for every key, which the rule below computes without any list."""
    public = get_task("arith", 2)
    # the whole level: 8100 problems, the public rule puts about a quarter in the pool
    pool = {f"{x}+{y}" for x in range(10, 100) for y in range(10, 100)
            if pool_digest("arith", public.generate(_Fixed(x, y), 2))[0] % HELD_OUT_SHARE == 0}
    assert 1900 < len(pool) < 2200
    gaps = {}
    for key in KEYS:
        task = keyed("arith", key, 2)
        ix = handed_draws(task, None, 1, 100)["2"]
        gaps[key] = set(range(ix[-1])) - set(ix)
    assert gaps[KEYS[0]] == gaps[KEYS[1]] == gaps[KEYS[2]]
    gap_ids = {public.train_problem(1, 2, i).id for i in gaps[KEYS[1]]}
    assert gap_ids <= pool and len(gap_ids) > 1000   # the gaps are pool problems, nothing else
    # every key's validation and test are in the pool, and the gaps favour none of them: the
    # share of a key's scored problems among the gaps is its share of the pool (1000 / ~2060)
    for key in KEYS[1:]:
        s = scored(keyed("arith", key, 2))
        assert len(s) == 1000 and s <= pool
        assert abs(len(gap_ids & s) / len(gap_ids) - len(s) / len(pool)) < 0.05


class _Fixed:
    """Hands the generator the given operands, to build a chosen problem."""

    def __init__(self, *values):
        self.values = list(values)

    def randrange(self, lo, hi):
        return self.values.pop(0)


def test_the_public_rule_is_a_plain_hash_anyone_can_compute():
    task = get_task("arith", 2)
    task.use_key(b"\x03" * 32)
    for p in task.split("val")[:50] + [task.train_problem(0, 2, i) for i in range(50)]:
        digest = hashlib.sha256(f"arith/2/{p.id}".encode()).digest()
        assert task.held_out(p) == (digest[0] % HELD_OUT_SHARE == 0)
    assert all(task.held_out(p) for p in task.split("val"))
