"""Addition with difficulty levels, the answer written least-significant digit first.

Writing the sum in reverse lets a ~1M-parameter model compute each digit from the
digits it has already written (carry propagation goes left to right), which is what
makes the task learnable by RL on a CPU in minutes. 123+459 -> "285" (582 reversed).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from evotrainer.tasks.base import Problem, Task
from evotrainer.tasks.registry import Builtin, register


# SFT steps a level's base took from an empty cache, by its stop target (Task.sft_measured_steps;
# that stage alone): 2 digits from scratch to 25%, 320 steps (probe 34%); 3 digits from it to
# 25%, 930 steps (probe 31%); and to 5%, the main job's weak base, 70-330 steps on nine bases
# (five on an AMD machine, four on an Intel one), median 170
SFT_MEASURED_STEPS = {(2, 0.25): 320, (3, 0.25): 930, (3, 0.05): 170}


@dataclass
class ArithConfig:
    target_level: int = 3      # digits per operand of the problems we evaluate on
    max_level: int = 6
    split_size: int = 500      # problems in each of validation and test

    def validate(self) -> None:
        if not 1 <= self.target_level <= self.max_level:
            raise ValueError(f"arith level must be in 1..{self.max_level}, got {self.target_level}")
        if self.split_size < 1:
            raise ValueError(f"split_size must be positive, got {self.split_size}")


class ArithTask(Task):
    def __init__(self, config: ArithConfig | None = None):
        self.config = config or ArithConfig()
        self.config.validate()
        self.name = self.spec = "arith"
        self.levels = tuple(range(1, self.config.max_level + 1))
        self.target_level = self.config.target_level
        self.split_size = self.config.split_size
        # sum has at most level+1 digits, then the end token, plus slack to see over-long answers
        self.max_new_tokens = self.config.max_level + 3
        # The default base (pretrain.py): SFT from scratch up to 2 digits, above that continued
        # from the level below. 3-digit SFT from scratch sat on a loss plateau for 700-1500 steps
        # on 2 of 3 initialisations (9+ minutes to a first RL step); continued from the 2-digit
        # base it climbs from its first steps. Measured steps: SFT_MEASURED_STEPS.
        if self.target_level >= 3:
            self.sft_warm_start = self.target_level - 1

    def sft_measured_steps(self, target_acc: float) -> int:
        return SFT_MEASURED_STEPS.get((self.target_level, target_acc), 0)

    def problem_space(self, level: int) -> int:
        lo = 0 if level == 1 else 10 ** (level - 1)
        return (10 ** level - lo) ** 2

    def generate(self, rng: random.Random, level: int) -> Problem:
        lo = 0 if level == 1 else 10 ** (level - 1)
        a, b = rng.randrange(lo, 10 ** level), rng.randrange(lo, 10 ** level)
        return Problem(id=f"{a}+{b}", prompt=f"{a}+{b}=", answer=str(a + b)[::-1], level=level)

    def score(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion.strip() == problem.answer else 0.0


def make(level: int | None = None) -> ArithTask:
    cfg = ArithConfig() if level is None else ArithConfig(target_level=level)
    return ArithTask(cfg)


register(Builtin("arith", make))
