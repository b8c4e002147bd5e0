"""The codegen task: problems, the hidden-test verifier, and completions that attack the
sandbox. Each attack is written so that, had it worked, the program would return the right
answer (score 1); inside the sandbox it fails, scores 0, and the world outside is unchanged."""
import random
import socket
import time

import pytest

from evotrainer.catalog import get_task
from evotrainer.sandbox import Isolation, probe
from evotrainer.tasks.codegen import FUNCTIONS, HEADER
from helpers import processes_with


@pytest.fixture(scope="module")
def task():
    return get_task("codegen")


def problems(task, n=6, level=2, seed=0):
    rng = random.Random(seed)
    return [task.generate(rng, level) for _ in range(n)]


def test_problems_read_off_their_examples_and_splits_are_disjoint(task):
    p = problems(task, 1)[0]
    examples, header = p.prompt.split("\n")
    assert header == HEADER and examples.startswith("f(0)=") and " f(1)=" in examples
    shown = {int(e[2:e.index(")")]) for e in examples.split()}
    assert not shown & {c[0] for c in p.entry["cases"]} and len(p.entry["cases"]) == 4  # the tests are hidden
    assert p.answer in FUNCTIONS[2] and task.max_new_tokens >= len(p.answer) + 1
    val, test = {q.id for q in task.split("val")}, {q.id for q in task.split("test")}
    assert len(val) > 400 and len(test) > 400 and not val & test
    assert [q.id for q in problems(task)] == [q.id for q in problems(task)]  # seeded


def test_hidden_tests_score_the_fraction_and_only_all_of_them_solve(task):
    ps = problems(task, 3)
    right = [p.answer for p in ps]
    equivalent = f"({ps[0].answer.split('+')[1]})+x*{ps[0].answer.split('*')[1].split('+')[0]}"  # b+x*a
    half = f"x*{ps[1].answer[2]}+{ps[1].answer.split('+')[1]} if x < 7 else 0"
    js = task.judge_many([ps[0], ps[1], ps[2], ps[0], ps[1], ps[2]], right + [equivalent, half, "x*("])
    assert [j.score for j in js[:4]] == [1.0, 1.0, 1.0, 1.0] and js[0].outcome == "passed"
    hidden = [c[0] for c in ps[1].entry["cases"]]
    assert js[4].score == sum(x < 7 for x in hidden) / 4 and js[4].failure == "wrong output"
    assert (js[5].score, js[5].outcome, js[5].failure) == (0.0, "syntax_error", "SyntaxError")
    assert task.credit(js[4].score) == (1.0 if js[4].score == 1 else 0.0) and task.credit(0.75) == 0.0
    assert task.judge_many([ps[0]], ["y"])[0].failure == "NameError"


@pytest.mark.skipif(probe() is not Isolation.NAMESPACES, reason="needs namespaces")
def test_model_written_attacks_score_zero_and_leave_no_trace(task, tmp_path, monkeypatch):
    p = problems(task, 1, seed=7)[0]
    answer = p.answer
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    outside = tmp_path / "pwned.txt"
    marker = f"7{time.monotonic_ns() % 10**8}"
    monkeypatch.setenv("EVOTRAINER_HOSTILE_SECRET", "hunter2")
    os_ = "__import__('os')"
    # each returns the right answer only if its attack worked (the daemon's attack is whether
    # it outlives the batch: it returns a wrong answer and is looked for afterwards)
    attacks = {
        "loopback": f"(__import__('socket').create_connection(('127.0.0.1',{port}),timeout=1),{answer})[1]",
        "secret": f"{answer} if {os_}.environ.get('EVOTRAINER_HOSTILE_SECRET')=='hunter2' else -1",
        "write_outside": f"{answer} if open('{outside}','w').write('pwned') else -1",
        "read_the_tests": f"{answer} if b'expected' in open('/proc/'+str({os_}.getppid())+'/cmdline','rb').read() else -1",
        "setsid_daemon": f"{answer} if {os_}.system('setsid sleep 600 {marker} >/dev/null 2>&1 &')==0 and 0 else -1",
        "allocate_30gb": f"{answer} if len(bytearray(30*2**30)) else -1",
        "loop_forever": f"{answer} if next(filter(lambda _: 0, iter(int, 1))) else -1",
    }
    t = time.monotonic()
    judged = dict(zip(attacks, task.judge_many([p] * len(attacks), list(attacks.values()))))
    assert all(j.score == 0.0 for j in judged.values()), {k: (j.score, j.outcome, j.failure) for k, j in judged.items()}
    assert judged["allocate_30gb"].outcome == "memory" and judged["loop_forever"].outcome == "timeout"
    assert time.monotonic() - t < 30  # the loop is cut at the program's limit, the batch goes on
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()
    assert not outside.exists()
    deadline = time.monotonic() + 2
    while processes_with(f"sleep 600 {marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(f"sleep 600 {marker}") == []
    assert task.judge_many([p], [answer])[0].score == 1.0  # the same program without the attack passes
