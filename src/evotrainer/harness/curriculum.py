"""Curriculum slot: which difficulty levels the next batch samples.

Signature: (CurriculumState) -> {level: weight}. The trainer normalises the weights and
draws each prompt's level from them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from evotrainer.harness.registry import Registry


@dataclass
class CurriculumState:
    step: int
    target_level: int                       # the level the task is evaluated on
    train_levels: list[int]                 # the knob; empty means [target_level]
    recent_score: dict[int, float] = field(default_factory=dict)  # mean score per level, last steps


CurriculumFn = Callable[[CurriculumState], dict[int, float]]
CURRICULA: Registry[CurriculumFn] = Registry("curriculum")


@CURRICULA.register()
def fixed(s: CurriculumState) -> dict[int, float]:
    """Uniform over `train_levels` (the target level when unset), the same at every step."""
    levels = s.train_levels or [s.target_level]
    return {lv: 1.0 for lv in levels}


@CURRICULA.register()
def frontier(s: CurriculumState) -> dict[int, float]:
    """Weight each level by p(1-p) of its recent score: most signal where outcomes are mixed."""
    levels = s.train_levels or [s.target_level]
    return {lv: 0.05 + (p := s.recent_score.get(lv, 0.5)) * (1 - p) for lv in levels}
