"""Any reasoning-gym procedural family as a task: `rg:chain_sum`, `rg:basic_arithmetic`, ...

Problems come from the family's own generator (seeded, so splits are reproducible) and
are scored by the family's own `score_answer`. Note: some families give partial credit
when the oracle answer is a substring of the completion; that is the family's scorer and
we keep it, but reward shaping in a harness should not lean on it.

Levels: without one (or 0) a family is its default config, one level 0. Level L >= 1 is
step L-1 of the family's own curriculum (reasoning-gym's `create_curriculum`, every
attribute at that step), so `rg:chain_sum` level 1 is 2 terms of 1 digit and level 2 is
2-3 terms of 1-2 digits; the levels below the target are what a curriculum harness mixes in.
"""
from __future__ import annotations

import random

import reasoning_gym
from reasoning_gym.factory import create_curriculum, has_curriculum

from evotrainer.errors import UsageError, unknown
from evotrainer.tasks.base import Problem, Task


def families() -> list[str]:
    from reasoning_gym.factory import DATASETS
    return sorted(DATASETS)


def level_configs(family: str) -> list[dict]:
    """Config overrides per level: [{}] (level 0, the defaults), then one per curriculum step."""
    out: list[dict] = [{}]
    if not has_curriculum(family):
        return out
    cur = create_curriculum(family)
    for level in range(max(len(a.levels) for a in cur.attributes.values())):
        for name, attr in cur.attributes.items():
            cur.set_attr_level(name, min(level, len(attr.levels) - 1))
        cfg = cur.generate_configuration()
        out.append({k: getattr(cfg, k) for k in vars(cfg) if k not in ("seed", "size")})
    return out


class ReasoningGymTask(Task):
    def __init__(self, family: str, level: int | None = None, split_size: int = 200, max_new_tokens: int = 16):
        if family not in families():
            raise unknown("reasoning-gym family", family, families())
        self.family, self.configs = family, level_configs(family)
        self.name = f"rg:{family}"
        self.target_level = level or 0
        if not 0 <= self.target_level < len(self.configs):
            steps = f"1..{len(self.configs) - 1} (its reasoning-gym curriculum)" if len(self.configs) > 1 else "none"
            raise UsageError(f"level {self.target_level} is not a level of {self.name}; valid levels: "
                             f"0 (the family's defaults) or {steps}")
        # the defaults stand alone; curriculum levels are a ladder a curriculum can mix
        self.levels = (0,) if self.target_level == 0 else tuple(range(1, len(self.configs)))
        self.split_size = split_size
        self.max_new_tokens = max_new_tokens
        self._scorer = reasoning_gym.create_dataset(family, size=1, seed=0, **self.configs[self.target_level])

    def problem_space(self, level: int) -> int:
        return 10 ** 9  # procedural families are effectively unbounded (at the levels we train)

    def generate(self, rng: random.Random, level: int) -> Problem:
        # reasoning-gym items are a pure function of (seed, index); one fresh seed per draw.
        ds = reasoning_gym.create_dataset(self.family, size=1, seed=rng.randrange(2**31), **self.configs[level])
        entry = ds[0]
        return Problem(id=entry["question"], prompt=entry["question"] + "\nAnswer: ",
                       answer=str(entry["answer"]), level=level, entry=entry)

    def score(self, problem: Problem, completion: str) -> float:
        return float(self._scorer.score_answer(answer=completion.strip(), entry=problem.entry))
