"""The tracker adapter interface, and the fan-out the controller calls.

A tracker receives three kinds of record, all plain data, from the controller process (never
from a sandboxed worker: the trackers write files and may want a network, the workers may
do neither):

- `log_steps(series, rows)`: one training job's per-step metrics when its trial ends,
  series "v1/seed-0" (the final comparison's: "final/evolved/seed-100");
- `log_trial(row, rows)`: one trial's outcome, and every trial's so far (for trackers whose
  tables are written whole);
- `log_final(result, text)`: the final comparison, as data and as the printed table.

A tracker that raises is closed and dropped with one `tracker_failed` line: a broken
dashboard never costs a run.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, Mapping, Sequence


class Tracker(ABC):
    name = "tracker"

    @abstractmethod
    def log_steps(self, series: str, rows: Sequence[Mapping[str, float]]) -> None: ...

    @abstractmethod
    def log_trial(self, row: Mapping, rows: Sequence[Mapping]) -> None: ...

    @abstractmethod
    def log_final(self, result: Mapping, text: str) -> None: ...

    def close(self) -> None:
        return None


def numeric(row: Mapping) -> dict[str, float]:
    """A metrics line's finite numbers, without its step."""
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def trial_row(rec) -> dict:
    """What a tracker records of a finished trial (a lineage TrialRecord)."""
    f = rec.fitness
    points = (lambda x: None if x is None else round(100 * x, 3))
    test = sum(f.test.values()) / len(f.test) if f.test else None
    return {"trial": rec.id, "version": rec.version or "", "parent": " x ".join(rec.parents),
            "intervention": rec.intervention, "label": str(rec.label), "val": points(f.mean_val),
            "test": points(test), "gain": points(f.gain), "bar": points(f.decision and f.decision.threshold),
            "backtest": (rec.backtest or {}).get("label", "")}


def final_rows(result: Mapping) -> list[dict]:
    """The final table as rows: arm x split, mean and sd (difference: with its CI), in points."""
    rows = [{"arm": "base", "split": s, "mean": 100 * result["base"][s], "sd": None, "ci_low": None,
             "ci_high": None} for s in ("val", "test")]
    for arm in ("reference", "evolved", "difference"):
        for s in ("val", "test"):
            x = result["comparison"][s][arm]
            sd = x["sd"] if isinstance(x["sd"], float) and math.isfinite(x["sd"]) else None
            ci = x.get("ci") or [None, None]
            rows.append({"arm": arm, "split": s, "mean": x["mean"], "sd": sd, "ci_low": ci[0], "ci_high": ci[1]})
    return rows


class TrackerSet:
    """Every tracker the run asked for; one that fails is reported once and dropped."""

    def __init__(self, trackers: Sequence[Tracker], on_failure: Callable[[str, str], None]):
        self.trackers = list(trackers)
        self.on_failure = on_failure

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for t in list(self.trackers):
            try:
                call(t)
            except Exception as e:  # noqa: BLE001  a dashboard's failure is not the run's
                self.trackers.remove(t)
                self.on_failure(t.name, f"{type(e).__name__}: {e}")
                try:
                    t.close()
                except Exception:  # noqa: BLE001
                    pass

    def steps(self, series: str, rows: Sequence[Mapping]) -> None:
        if rows:
            self._each(lambda t: t.log_steps(series, rows))

    def trial(self, row: Mapping, rows: Sequence[Mapping]) -> None:
        self._each(lambda t: t.log_trial(row, rows))

    def final(self, result: Mapping, text: str) -> None:
        self._each(lambda t: t.log_final(result, text))

    def close(self) -> None:
        self._each(lambda t: t.close())
        self.trackers = []


def tracker_dir(run_dir: Path, name: str) -> Path:
    d = Path(run_dir) / "trackers" / name
    d.mkdir(parents=True, exist_ok=True)
    return d
