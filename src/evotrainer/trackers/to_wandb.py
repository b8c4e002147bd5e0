"""Weights & Biases: one W&B run per evotrainer run, offline unless the user says otherwise.

Each training job's metrics get their own step axis (`define_metric`), so v1/seed-0 and
v2/seed-0 both start at step 1 in one run; trials and the final table are W&B Tables.
Offline (the default: `mode: offline` under `tracking`), the run lands in
RUN/trackers/wandb and `wandb sync` uploads it later; W&B's own settings (WANDB_API_KEY,
entity) apply as W&B documents them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from evotrainer.trackers.base import Tracker, final_rows, numeric, tracker_dir


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, run_dir: Path, run_name: str, project: str = "evotrainer", mode: str = "offline"):
        import wandb
        self.wandb = wandb
        self.run = wandb.init(project=project, name=run_name, dir=str(tracker_dir(run_dir, self.name)), mode=mode,
                              settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))
        self.run.define_metric("trial")
        self.run.define_metric("trial/*", step_metric="trial")
        self._axes: set[str] = set()

    def log_steps(self, series: str, rows: Sequence[Mapping[str, float]]) -> None:
        if series not in self._axes:
            self.run.define_metric(f"{series}/step")
            self.run.define_metric(f"{series}/*", step_metric=f"{series}/step")
            self._axes.add(series)
        for r in rows:
            self.run.log({f"{series}/step": int(r["step"]), **{f"{series}/{k}": v for k, v in numeric(r).items()}})

    def log_trial(self, row: Mapping, rows: Sequence[Mapping]) -> None:
        self.run.log({"trial": row["trial"], **{f"trial/{k}": row[k] for k in ("val", "test", "gain", "bar")
                                                if row.get(k) is not None}})
        cols = list(rows[0])
        self.run.log({"trials": self.wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])})

    def log_final(self, result: Mapping, text: str) -> None:
        rows = final_rows(result)
        cols = list(rows[0])
        self.run.log({"final": self.wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])})
        d = result["comparison"]["test"]["difference"]
        self.run.summary.update({"final/test_difference": d["mean"], "final/test_ci_low": d["ci"][0],
                                 "final/test_ci_high": d["ci"][1], "final/winner": result["winner"]})

    def close(self) -> None:
        self.run.finish()
