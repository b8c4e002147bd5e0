"""The humaneval task scores by running each problem's own tests in the sandbox, and pass@k
is the Codex paper's unbiased estimator."""
import math
import re
import time

import pytest

from evotrainer.errors import UsageError
from evotrainer.evaluate.passk import mean_pass_at_k, pass_at_k, solved
from evotrainer.evaluate.sampled import correct_counts, pass_at
from evotrainer.policy import build_model, build_tokenizer
from evotrainer.sandbox import Isolation, probe
from evotrainer.tasks.arith import ArithConfig, ArithTask
from evotrainer.tasks.humaneval import make, truncate


@pytest.fixture(scope="module")
def task():
    return make()


def test_every_canonical_solution_passes_in_one_batch(task):
    problems = task.problems()
    assert len(problems) == 164 and len({p.id for p in problems}) == 164
    t = time.monotonic()
    scores = task.score_many(problems, [p.answer for p in problems])
    seconds = time.monotonic() - t
    assert [p.id for p, s in zip(problems, scores) if s != 1.0] == []
    print(f"164 canonical solutions in one sandboxed batch: {seconds:.1f} s")


def test_a_broken_solution_set_fails_everywhere(task):
    """Each canonical body with every return value replaced by None: no problem's tests pass."""
    problems = task.problems()
    broken = [re.sub(r"\breturn\b.*", "return None", p.answer) for p in problems]
    judged = task.judge_many(problems, broken)
    assert [p.id for p, j in zip(problems, judged) if j.score != 0.0] == []
    # HumanEval/39's body loops until its helper finds a prime: with the helper's returns broken it never ends
    assert {p.id for p, j in zip(problems, judged) if j.outcome == "timeout"} == {"HumanEval/39"}
    assert all(j.outcome in ("failed", "runtime_error", "timeout") for j in judged)
    assert sum(j.failure == "wrong output" for j in judged) > 100  # mostly a test's assert, not a crash


def test_score_cuts_the_completion_at_the_stop_sequences(task):
    p = next(q for q in task.problems() if q.id == "HumanEval/0")
    assert task.score(p, p.answer) == 1.0
    assert task.score(p, p.answer + "\n\ndef unrelated(:\n\nprint('chatter')") == 1.0  # cut at "\ndef"
    assert task.score(p, "    return True\n") == 0.0
    assert task.score(p, "    return (\n") == 0.0  # a syntax error scores 0
    assert truncate("    return x\n\nif __name__ == '__main__':\n    main()") == "    return x\n"


@pytest.mark.skipif(probe() is not Isolation.NAMESPACES, reason="only namespaces hide files")
def test_a_completion_cannot_copy_the_canonical_solution(task):
    """The data file lies in site-packages, which the sandbox reads: it is hidden from the programs."""
    p = next(q for q in task.problems() if q.id == "HumanEval/0")
    thief = ("    import gzip, json\n"
             f"    rows = [json.loads(l) for l in gzip.open({task.data_files()[0]!r}, 'rt') if l.strip()]\n"
             "    row = next(r for r in rows if r['task_id'] == 'HumanEval/0')\n"
             "    space = {}\n    exec(row['prompt'] + row['canonical_solution'], space)\n"
             "    return space['has_close_elements'](numbers, threshold)\n")
    assert task.score(p, thief) == 0.0


def test_splits_are_fixed_disjoint_halves_and_training_refuses(task):
    val, test = task.split("val"), task.split("test")
    assert len(val) == len(test) == 82
    assert not {p.id for p in val} & {p.id for p in test}
    assert {p.id for p in val} | {p.id for p in test} == {p.id for p in task.problems()}
    assert [p.id for p in make().split("val")] == [p.id for p in val]  # the same in every process
    task.use_key(b"k" * 32)
    assert [p.id for p in task.split("val", n=5)] == [p.id for p in val[:5]]  # a run's key changes nothing
    assert all(task.held_out(p) for p in val + test)
    with pytest.raises(UsageError, match="evaluation set"):
        task.train_stream(0).draw(0)
    with pytest.raises(UsageError):
        make(level=1)
    assert task.name == task.spec == "humaneval" and task.max_new_tokens == 512


def test_pass_at_k_hand_computed_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)    # 1 - C(7,2)/C(10,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)       # 1 - C(3,3)/C(5,3)
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 0, 5) == 0.0   # nothing correct
    assert pass_at_k(5, 4, 2) == 1.0 and pass_at_k(5, 1, 5) == 1.0   # n - c < k: any k samples hold one
    for n, c, k in [(200, 7, 1), (200, 7, 10), (200, 7, 100), (30, 29, 1), (13, 6, 7)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-9)
    assert mean_pass_at_k([(10, 3), (5, 0), (4, 4)], 1) == pytest.approx((0.3 + 0 + 1) / 3)
    for bad in [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)


def test_a_sample_solves_a_problem_only_at_full_credit():
    assert solved([0.5, 0.5, 0.5, 0.5]) == 0          # summed and rounded, this was two solves
    assert solved([1.0, 0.5, 0.0, 1.0, 0.5]) == 2
    assert solved([sum([0.1] * 10)]) == 1              # 0.9999999999999999: float rounding, full credit
    assert solved([0.999999]) == 0


class Graded(ArithTask):
    """Sums whose verifier gives partial credit, as some reasoning-gym families do: full credit
    to a completion of even length, half to any other (`full_credit=False`: half to all)."""

    def __init__(self, full_credit=True):
        super().__init__(ArithConfig(target_level=1))
        self.full_credit, self.given = full_credit, []

    def score(self, problem, completion):
        self.given.append(1.0 if self.full_credit and len(completion) % 2 == 0 else 0.5)
        return self.given[-1]


def test_sampled_pass_at_k_counts_only_the_full_credit_samples():
    tok = build_tokenizer()
    model = build_model(len(tok), seed=0)
    task = Graded()
    counts = correct_counts(model, tok, task, task.split("val", n=4), n=4, batch_size=4)
    full = [sum(s == 1.0 for s in task.given[4 * j:4 * j + 4]) for j in range(4)]
    assert counts == full and 0 < sum(full) < 16     # both kinds were sampled; only the 1.0s count
    half = Graded(full_credit=False)
    assert pass_at(model, tok, half, half.split("val", n=4), n=4, ks=[1, 4]) == {"pass@1": 0.0, "pass@4": 0.0}
