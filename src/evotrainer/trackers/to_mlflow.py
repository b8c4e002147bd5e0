"""MLflow: a parent run per evotrainer run, a nested run per training job, in a SQLite store.

The store is RUN/trackers/mlflow/mlflow.db unless `tracking.uri` names another (a server,
another database); recent MLflow refuses the old file store, so the default is SQLite.
`mlflow ui --backend-store-uri sqlite:///RUN/trackers/mlflow/mlflow.db` shows it. Uses the
client API, so nothing here touches MLflow's global active run.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Mapping, Sequence

from evotrainer.trackers.base import Tracker, final_rows, numeric, tracker_dir


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, run_dir: Path, run_name: str, project: str = "evotrainer", uri: str | None = None):
        from mlflow.tracking import MlflowClient
        d = tracker_dir(run_dir, self.name)
        self.client = MlflowClient(tracking_uri=uri or f"sqlite:///{(d / 'mlflow.db').resolve()}")
        exp = self.client.get_experiment_by_name(project)
        self.exp = exp.experiment_id if exp else self.client.create_experiment(
            project, artifact_location=(d / "artifacts").resolve().as_uri())
        self.parent = self.client.create_run(self.exp, run_name=run_name).info.run_id
        self.children: dict[str, str] = {}

    def log_steps(self, series: str, rows: Sequence[Mapping[str, float]]) -> None:
        from mlflow.entities import Metric
        run = self.client.create_run(self.exp, run_name=series, tags={"mlflow.parentRunId": self.parent})
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(r["step"])) for r in rows for k, v in numeric(r).items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(run.info.run_id, metrics=metrics[i:i + 1000])
        self.client.set_terminated(run.info.run_id)

    def log_trial(self, row: Mapping, rows: Sequence[Mapping]) -> None:
        for k in ("val", "test", "gain", "bar"):
            if row.get(k) is not None:
                self.client.log_metric(self.parent, f"trial.{k}", row[k], step=row["trial"])
        self.client.log_text(self.parent, json.dumps(list(rows), indent=1), "trials.json")

    def log_final(self, result: Mapping, text: str) -> None:
        for r in final_rows(result):
            self.client.log_metric(self.parent, f"final.{r['arm']}.{r['split']}", r["mean"])
        self.client.log_text(self.parent, text, "final.txt")
        self.client.set_tag(self.parent, "winner", result["winner"])

    def close(self) -> None:
        self.client.set_terminated(self.parent)
