"""Which difficulty levels a step's prompts come from: the harness's curriculum slot, fed with
the recent verifier scores per level. Shared by both backends."""
from __future__ import annotations

import random
from collections import defaultdict, deque

from evotrainer.harness.curriculum import CurriculumState
from evotrainer.harness.rollouts import SlotError


class LevelPicker:
    def __init__(self, harness, task, seed: int, window: int = 8):
        self.harness, self.task = harness, task
        self.rng = random.Random(seed)
        self.recent = defaultdict(lambda: deque(maxlen=window))  # level -> recent mean group scores

    def levels(self, step: int, n: int) -> list[int]:
        """The levels of the `n` prompts of step `step` (the curriculum's weights, then a draw)."""
        state = CurriculumState(step=step, target_level=self.task.target_level,
                                train_levels=list(self.harness.knobs.train_levels),
                                recent_score={lv: sum(q) / len(q) for lv, q in self.recent.items()})
        weights = self.harness.curriculum(state)
        if not weights or any(lv not in self.task.levels for lv in weights) or min(weights.values()) < 0:
            raise SlotError(f"curriculum returned {weights!r}; levels must be in {list(self.task.levels)} "
                            "with non-negative weights")
        return self.rng.choices(list(weights), weights=list(weights.values()), k=n)

    def observe(self, levels: list[int], group_scores: list[float]) -> None:
        """A step's groups: each group's level and mean verifier score."""
        for lv, s in zip(levels, group_scores):
            self.recent[lv].append(s)
