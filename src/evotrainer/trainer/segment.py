"""What one training segment writes, whichever backend trains it.

OUT/metrics.jsonl (one line per step), OUT/evidence.jsonl (one record per rollout) and
OUT/checkpoints/step-N every `eval_every` steps: the files diagnostics, backtests and the
evaluator read, so the embedded trainer and the TRL backend are interchangeable to them.
"""
from __future__ import annotations

import json
from pathlib import Path

from evotrainer.evidence import EvidenceWriter, RolloutRecord
from evotrainer.policy import save_policy


class SegmentLog:
    def __init__(self, out_dir: Path, steps: int, eval_every: int):
        self.out_dir, self.steps, self.every = Path(out_dir), steps, eval_every
        self.evidence = EvidenceWriter(self.out_dir / "evidence.jsonl")
        self.metrics = open(self.out_dir / "metrics.jsonl", "w")

    def record(self, metrics: dict, records: list[RolloutRecord], model, tok) -> None:
        """One finished step: its metrics and rollouts, and a checkpoint when one is due (the
        last step's is the segment's checkpoint/, saved by the caller with the optimizer)."""
        self.evidence.write(records)
        self.metrics.write(json.dumps(metrics) + "\n")
        self.metrics.flush()
        step = metrics["step"]
        if self.every and step % self.every == 0 and step < self.steps:
            save_policy(model, tok, self.out_dir / "checkpoints" / f"step-{step}")

    def close(self) -> None:
        self.evidence.close()
        self.metrics.close()
