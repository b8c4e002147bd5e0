"""What the search moves between: states, the segments that train them, and what a trial spent.

A *state* is a harness version at a lineage depth with one checkpoint per seed, and its
validation and test accuracy per seed (lineage/state.py: the lineage records states, so the
record lives there). A *segment* trains one version on from a state's checkpoints (or the
base) to the next depth. These are plain records: evolve/segments/training.py trains them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evotrainer.lineage.state import State

__all__ = ["State", "Segment", "SegmentFailed", "Clock", "ControlFailed", "EXTRA_PAIR_DATA"]

EXTRA_PAIR_DATA = 700  # an extra pair's data offset from its seed's (replicas share the run's data)


@dataclass(frozen=True)
class Segment:
    """`version` trained on from `start`'s checkpoints (the base where it has none) to lineage `depth`."""
    version: str
    start: State
    depth: int
    out_root: Path
    replica: int = 0         # > 0: the same problems sampled with other seeds (the gate's null)
    data_offset: int = 0     # > 0: other problems (an extra seed pair of the sequential gate)
    seeds: tuple[int, ...] = ()  # the run seeds it trains on (empty: the run's `seeds`)


class SegmentFailed(RuntimeError):
    """A segment's worker failed on some seed: `label` is the worker's word (crash, timeout, oom)."""

    def __init__(self, label: str, detail: str):
        self.label, self.detail = label, detail
        super().__init__(f"{label}: {detail}")


@dataclass
class Clock:
    """What one trial spent: training steps over all seeds (its control's too, where it paid
    for it) and seconds training and evaluating; the rest of its time is the framework's.
    Segments count one per seed: trained, or reused from the segment cache (no steps, no seconds)."""
    train_s: float = 0.0
    eval_s: float = 0.0
    steps: int = 0
    trained: int = 0
    reused: int = 0
    # what a checkpoint of its segments holds (policy/adapters.checkpoint_size, with the trainable
    # parameters): a LoRA run's adapters are a fraction of its base; empty until a segment trained
    checkpoint: dict = field(default_factory=dict)

    def budgets(self) -> dict:
        return {"steps": self.steps, "train_s": round(self.train_s, 2), "eval_s": round(self.eval_s, 2),
                "segments_trained": self.trained, "segments_reused": self.reused,
                **({"checkpoint": self.checkpoint} if self.checkpoint else {})}


class ControlFailed(RuntimeError):
    """The control (the parent's own harness) or the evaluator failed: nothing can be judged."""
