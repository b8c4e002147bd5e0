"""What the search moves between: states, the segments that train them, and what a trial spent.

A *state* is a harness version at a lineage depth with one checkpoint per seed, and its
validation and test accuracy per seed. A *segment* trains one version on from a state's
checkpoints (or the base) to the next depth. These are plain records: evolve/training.py
trains them, and the lineage stores states as JSON (`State.of` reads one back: JSON object
keys are strings, seeds are ints).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass
class State:
    version: str
    depth: int
    dirs: dict[int, str]        # seed -> train directory of its last segment
    val: dict[int, float]       # seed -> validation accuracy (average of the last evaluations)
    test: dict[int, float]      # seed -> test accuracy (recorded, never read by a decision)

    def checkpoint(self, seed: int) -> str:
        return str(Path(self.dirs[seed]) / "checkpoint")

    @property
    def mean_val(self) -> float:
        return sum(self.val.values()) / len(self.val)

    @property
    def key(self) -> tuple[str, int]:
        return (self.version, self.depth)

    @classmethod
    def of(cls, d: dict) -> "State":
        ints = lambda m: {int(k): v for k, v in m.items()}  # noqa: E731 (JSON keys are strings)
        return cls(d["version"], d["depth"], ints(d["dirs"]), ints(d["val"]), ints(d["test"]))

    def fitness(self) -> dict:
        """What a trial's record stores of the state it kept or measured (its `fitness`)."""
        return {"val": self.val, "test": self.test, "state": dataclasses.asdict(self)}


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
    for it) and seconds training and evaluating; the rest of its time is the framework's."""
    train_s: float = 0.0
    eval_s: float = 0.0
    steps: int = 0

    def budgets(self) -> dict:
        return {"steps": self.steps, "train_s": round(self.train_s, 2), "eval_s": round(self.eval_s, 2)}


class ControlFailed(RuntimeError):
    """The control (the parent's own harness) or the evaluator failed: nothing can be judged."""
