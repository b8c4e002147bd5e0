"""Write a small Python function from input/output examples; hidden tests judge it.

    prompt      f(0)=3 f(1)=5 f(4)=11 f(6)=15
                def f(x):return
    completion  x*2+3

The program is the prompt's last line plus the completion (the examples line is not
Python), run against hidden tests in the sandbox (sandbox/programs.py): the score is the
fraction of the tests passed, and a problem counts as solved only when all of them pass
(`credit`). The completion is real Python, so whatever the policy writes runs, including
`__import__('os')`: every program runs in the sandbox, a whole batch in one sandboxed
process (`judge_many`), with a time and memory limit of its own.

Levels (functions of one integer; the examples always include x=0 and x=1, so a function
can be read off them, and two more points in 2..12 make the problem's identity):
    1  x+c, x*c                         copy a constant
    2  x*a+b                            b = f(0), a = f(1) - f(0): one-digit subtraction
    3  x*x+b, x*a-b                     a second shape, and a negative intercept
A ~1M-parameter character model learns this on a CPU the way it learns reversed sums:
a table of small facts (docs/benchmarks.md has the arith curves for comparison).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from evotrainer.tasks.base import Judgement, Problem, Task
from evotrainer.tasks.registry import Builtin, register

HEADER = "def f(x):return "
SHOWN = 4          # examples in the prompt: x = 0, 1 and two of 2..12
HIDDEN = 4         # hidden tests: four other x of 2..12
POINTS = range(2, 13)


@dataclass
class CodegenConfig:
    target_level: int = 2
    split_size: int = 500      # problems in each of validation and test
    timeout_s: float = 1.0     # per program: these are one-line expressions
    memory_mb: int = 256       # per program

    def validate(self) -> None:
        if self.target_level not in LEVELS:
            raise ValueError(f"codegen level must be one of {', '.join(map(str, LEVELS))}, got {self.target_level}")
        if self.split_size < 1 or self.timeout_s <= 0 or self.memory_mb < 32:
            raise ValueError("split_size must be positive, timeout_s > 0 and memory_mb >= 32")


def _functions(level: int) -> list[str]:
    """Every function of a level, as the canonical expression the reference answer writes."""
    if level == 1:
        return [f"x+{c}" for c in range(1, 10)] + [f"x*{c}" for c in range(2, 10)]
    if level == 2:
        return [f"x*{a}+{b}" for a in range(2, 10) for b in range(1, 10)]
    return [f"x*x+{b}" for b in range(1, 10)] + [f"x*{a}-{b}" for a in range(2, 10) for b in range(1, 10)]


LEVELS = (1, 2, 3)
FUNCTIONS = {level: _functions(level) for level in LEVELS}


# our own canonical expressions only (never a completion): x, digits and + - *
_FN = {expr: eval(f"lambda x: {expr}", {"__builtins__": {}}) for fs in FUNCTIONS.values() for expr in fs}  # noqa: S307


def _value(expr: str, x: int) -> int:
    return _FN[expr](x)


class CodegenTask(Task):
    def __init__(self, config: CodegenConfig | None = None):
        self.config = config or CodegenConfig()
        self.config.validate()
        self.name = self.spec = "codegen"
        self.levels, self.target_level = LEVELS, self.config.target_level
        self.split_size = self.config.split_size
        longest = max(len(f) for fs in FUNCTIONS.values() for f in fs)
        self.max_new_tokens = longest + 6  # the end token, and room to see an over-long program fail
        # the default level's base took 100 SFT steps from an empty cache (bench/first_step.py)
        self.sft_typical_steps = 100 if self.target_level == CodegenConfig().target_level else 0

    def problem_space(self, level: int) -> int:
        n = len(POINTS)
        return len(FUNCTIONS[level]) * n * (n - 1) // 2

    def generate(self, rng: random.Random, level: int) -> Problem:
        expr = rng.choice(FUNCTIONS[level])
        shown = [0, 1, *sorted(rng.sample(POINTS, SHOWN - 2))]
        hidden = sorted(rng.sample([x for x in POINTS if x not in shown], HIDDEN))
        examples = " ".join(f"f({x})={_value(expr, x)}" for x in shown)
        return Problem(id=f"{expr}|{','.join(map(str, shown[2:]))}", prompt=f"{examples}\n{HEADER}", answer=expr,
                       level=level, entry={"cases": [[x] for x in hidden],
                                           "expected": [_value(expr, x) for x in hidden]})

    def score(self, problem: Problem, completion: str) -> float:
        return self.judge_many([problem], [completion])[0].score

    def judge_many(self, problems: list[Problem], completions: list[str]) -> list[Judgement]:
        """Every program of the batch in one sandboxed process; a program written twice for
        the same problem (common within a group) runs once."""
        from evotrainer.sandbox.programs import Program, run_programs
        keys = [(p.id, p.level, c) for p, c in zip(problems, completions)]
        unique = list(dict.fromkeys(keys))
        where = {k: i for i, k in enumerate(unique)}
        first = {k: (p, c) for k, p, c in zip(keys, problems, completions)}
        programs = [Program(HEADER + first[k][1], "f", tuple(map(tuple, first[k][0].entry["cases"])),
                            tuple(first[k][0].entry["expected"])) for k in unique]
        outcomes = run_programs(programs, timeout_s=self.config.timeout_s, memory_mb=self.config.memory_mb)
        return [Judgement(o.fraction, o.status, o.failure) for o in (outcomes[where[k]] for k in keys)]

    def credit(self, score: float) -> float:
        return 1.0 if score >= 1.0 else 0.0  # solved only when every hidden test passes


def make(level: int | None = None) -> CodegenTask:
    return CodegenTask(CodegenConfig() if level is None else CodegenConfig(target_level=level))


register(Builtin("codegen", make))
