"""Any reasoning-gym procedural family as a task: `rg:chain_sum`, `rg:basic_arithmetic`, ...

Problems come from the family's own generator (seeded, so splits are reproducible) and
are scored by the family's own `score_answer`. Note: some families give partial credit
when the oracle answer is a substring of the completion; that is the family's scorer and
we keep it, but reward shaping in a harness should not lean on it.
"""
from __future__ import annotations

import random

import reasoning_gym

from evotrainer.errors import unknown
from evotrainer.tasks.base import Problem, Task


def families() -> list[str]:
    from reasoning_gym.factory import DATASETS
    return sorted(DATASETS)


class ReasoningGymTask(Task):
    def __init__(self, family: str, split_size: int = 200, max_new_tokens: int = 16, **config):
        if family not in families():
            raise unknown("reasoning-gym family", family, families())
        self.family, self.config = family, config
        self.name = f"rg:{family}"
        self.levels = (0,)
        self.target_level = 0
        self.split_size = split_size
        self.max_new_tokens = max_new_tokens
        self._scorer = reasoning_gym.create_dataset(family, size=1, seed=0, **config)

    def problem_space(self, level: int) -> int:
        return 10 ** 9  # procedural families are effectively unbounded

    def generate(self, rng: random.Random, level: int) -> Problem:
        # reasoning-gym items are a pure function of (seed, index); one fresh seed per draw.
        ds = reasoning_gym.create_dataset(self.family, size=1, seed=rng.randrange(2**31), **self.config)
        entry = ds[0]
        return Problem(id=entry["question"], prompt=entry["question"] + "\nAnswer: ",
                       answer=str(entry["answer"]), level=0, entry=entry)

    def score(self, problem: Problem, completion: str) -> float:
        return float(self._scorer.score_answer(answer=completion.strip(), entry=problem.entry))
