"""Experiment trackers: TensorBoard, W&B, MLflow and trackio, each an optional extra.

    tracking:
      report_to: [tensorboard, mlflow]   # any of TRACKERS; the TRL backend gets the same list
      project: evotrainer
      wandb_mode: offline                # offline (sync later with `wandb sync`) | online
      mlflow_uri: null                   # null: a SQLite store in RUN/trackers/mlflow

A tracker's library is imported only when a run asks for it, and a run that asks for one
that is not installed is refused before any work, naming the extra to install.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from evotrainer.errors import UsageError
from evotrainer.trackers.base import Tracker, TrackerSet, final_rows, trial_row


@dataclass(frozen=True)
class Entry:
    module: str                  # the library it needs
    extra: str                   # pip install 'evotrainer[EXTRA]'
    open: Callable[..., Tracker]


def _tensorboard(run_dir, run_name, cfg):
    from evotrainer.trackers.to_tensorboard import TensorBoardTracker
    return TensorBoardTracker(run_dir, run_name)


def _wandb(run_dir, run_name, cfg):
    from evotrainer.trackers.to_wandb import WandbTracker
    return WandbTracker(run_dir, run_name, cfg.project, cfg.wandb_mode)


def _mlflow(run_dir, run_name, cfg):
    from evotrainer.trackers.to_mlflow import MlflowTracker
    return MlflowTracker(run_dir, run_name, cfg.project, cfg.mlflow_uri)


def _trackio(run_dir, run_name, cfg):
    from evotrainer.trackers.to_trackio import TrackioTracker
    return TrackioTracker(run_dir, run_name, cfg.project)


TRACKERS = {"tensorboard": Entry("tensorboard", "tensorboard", _tensorboard),
            "wandb": Entry("wandb", "wandb", _wandb),
            "mlflow": Entry("mlflow", "mlflow", _mlflow),
            "trackio": Entry("trackio", "trackio", _trackio)}
WANDB_MODES = ("offline", "online")


def check(names: Sequence[str]) -> None:
    """Refuse unknown trackers and trackers whose library is missing: one line each."""
    for n in names:
        if n not in TRACKERS:
            raise UsageError(f"unknown tracker '{n}'; valid choices: {', '.join(TRACKERS)}")
        if importlib.util.find_spec(TRACKERS[n].module) is None:
            raise UsageError(f"tracker '{n}' needs the {TRACKERS[n].module} package: "
                             f"pip install 'evotrainer[{TRACKERS[n].extra}]'")


def open_trackers(cfg, run_dir: Path, run_name: str, on_failure: Callable[[str, str], None]) -> TrackerSet:
    """The run's trackers (cfg: a TrackingConfig); one that fails to start is reported and left out."""
    check(cfg.report_to)
    opened = []
    for n in cfg.report_to:
        try:
            opened.append(TRACKERS[n].open(Path(run_dir), run_name, cfg))
        except Exception as e:  # noqa: BLE001  a dashboard's failure is not the run's
            on_failure(n, f"{type(e).__name__}: {e}")
    return TrackerSet(opened, on_failure)


__all__ = ["TRACKERS", "Tracker", "TrackerSet", "check", "final_rows", "open_trackers", "trial_row"]
