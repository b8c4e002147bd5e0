"""trackio: Hugging Face's local-first tracker; one trackio run per training job, grouped.

trackio keeps its projects in a SQLite store of its own (TRACKIO_DIR, by default under
HF_HOME), where `trackio show` finds them; each training job is a run named after its series
in the group of the evotrainer run, and the search (trials, final table) is one more run.
trackio prints to stdout as it goes; here that goes to stderr, as everything a person reads
does (evotrainer's stdout carries one JSON line).
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from evotrainer.trackers.base import Tracker, final_rows, numeric


class TrackioTracker(Tracker):
    name = "trackio"

    def __init__(self, run_dir: Path, run_name: str, project: str = "evotrainer"):
        import trackio
        self.trackio, self.project, self.group = trackio, project, run_name

    @contextlib.contextmanager
    def _run(self, name: str) -> Iterator:
        with contextlib.redirect_stdout(sys.stderr):
            run = self.trackio.init(project=self.project, name=f"{self.group}/{name}", group=self.group,
                                    resume="allow", auto_log_gpu=False, auto_log_cpu=False)
            try:
                yield run
            finally:
                self.trackio.finish()  # also forgets the current run (else finished again at exit)

    def log_steps(self, series: str, rows: Sequence[Mapping[str, float]]) -> None:
        with self._run(series) as run:
            for r in rows:
                run.log(numeric(r), step=int(r["step"]))

    def log_trial(self, row: Mapping, rows: Sequence[Mapping]) -> None:
        with self._run("search") as run:
            run.log({f"trial/{k}": row[k] for k in ("val", "test", "gain", "bar") if row.get(k) is not None},
                    step=row["trial"])

    def log_final(self, result: Mapping, text: str) -> None:
        with self._run("search") as run:
            run.log({f"final/{r['arm']}/{r['split']}": r["mean"] for r in final_rows(result)})
