"""TensorBoard: one event directory per training job, so the same tag overlays across jobs.

    RUN/trackers/tensorboard/v1/seed-0      reward_mean, score_mean, ... per step
    RUN/trackers/tensorboard/search         trial/val, trial/gain, ... per trial; the tables as text

`tensorboard --logdir RUN/trackers/tensorboard` shows them. Written with torch's
SummaryWriter (needs the `tensorboard` package: the `tensorboard` extra).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from evotrainer.trackers.base import Tracker, final_rows, numeric, tracker_dir


def markdown(rows: Sequence[Mapping]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, run_dir: Path, run_name: str):
        from torch.utils.tensorboard import SummaryWriter
        self._writer = SummaryWriter
        self.root = tracker_dir(run_dir, self.name)
        self.search = SummaryWriter(str(self.root / "search"))

    def log_steps(self, series: str, rows: Sequence[Mapping[str, float]]) -> None:
        w = self._writer(str(self.root / series))
        try:
            for r in rows:
                for k, v in numeric(r).items():
                    w.add_scalar(k, v, int(r["step"]))
        finally:
            w.close()

    def log_trial(self, row: Mapping, rows: Sequence[Mapping]) -> None:
        for k in ("val", "test", "gain", "bar"):
            if row.get(k) is not None:
                self.search.add_scalar(f"trial/{k}", row[k], row["trial"])
        self.search.add_text("trials", markdown(rows), row["trial"])
        self.search.flush()

    def log_final(self, result: Mapping, text: str) -> None:
        for r in final_rows(result):
            self.search.add_scalar(f"final/{r['arm']}/{r['split']}", r["mean"], 0)
        self.search.add_text("final", "```\n" + text + "\n```\n\n" + markdown(final_rows(result)), 0)
        self.search.flush()

    def close(self) -> None:
        self.search.close()
