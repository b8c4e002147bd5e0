"""A state as the lineage records it: a harness version at a lineage depth, with one checkpoint
per seed and its validation and test accuracy per seed.

States are what the search moves between (evolve/segments/state.py trains them); the lineage stores
them as JSON, in a trial's fitness (lineage/fitness.py) and in `control_finished` events, and `State.of`
reads one back (JSON object keys are strings, seeds are ints).
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

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
