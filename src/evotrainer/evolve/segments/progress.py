"""Step progress of training workers, read from outside: what `evotrainer run` shows live.

A worker writes one metrics.jsonl line per step and flushes it; the pool polls while it
waits, so the controller counts those lines (a retrained schedule writes them under
segment-1, segment-2, ...) and reports the sums. Nothing here touches a worker or a file it
writes; a poll that finds no file yet counts zero.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from evotrainer import jobfiles
from evotrainer.evidence import read_metrics


@dataclass(frozen=True)
class Job:
    name: str        # what the run shows for it: "v1 seed 0", "evolved seed 100"
    out: Path        # its train directory (a schedule's: the parent of its segment-N directories)
    steps: int       # the steps it will take in all


@dataclass(frozen=True)
class Progress:
    title: str                          # what is training: "trial 1: v1 [partial_credit] and control v0"
    done: int                           # steps finished over every job
    total: int
    jobs: tuple[tuple[str, int, int], ...]   # (name, done, steps) per job


def steps_done(out: Path) -> int:
    """Lines in the metrics.jsonl files under `out` (its own and its segments'), read as
    jobfiles reads a job's files: a FIFO or a link there counts zero, never blocks the poll."""
    names = ["metrics.jsonl", *(f"{d}/metrics.jsonl" for d in jobfiles.listdir(out) if d.startswith("segment-"))]
    try:
        return sum(jobfiles.count_lines(out, n, jobfiles.METRICS_CAP) for n in names)
    except jobfiles.BadOutput:  # a link where a segment's directory was: the job's output is refused later
        return 0


def seed_metrics(seed_dir: Path) -> list[dict]:
    """A seed's steps in order; a schedule's segments follow each other (steps renumbered).
    A file that does not read as metrics counts as none (the report, progress: never a decision)."""
    segments = sorted((d for d in jobfiles.listdir(seed_dir) if d.startswith("segment-") and d[8:].isdigit()),
                      key=lambda d: int(d[8:]))
    rows, offset = [], 0
    for d in ["", *segments]:
        try:
            part = read_metrics(Path(seed_dir, d), growing=True)
        except jobfiles.BadOutput:
            part = []
        rows += [{**r, "step": offset + r["step"]} for r in part]
        offset += part[-1]["step"] if part else 0
    return rows


class Watcher:
    """An `on_poll` for the worker pool: reports a Progress whenever a step count moved,
    reading the files at most once per `every_s` (the pool polls every 0.1 s, and counting
    every line ten times a second took ~2 s of a 10-minute run's CPU from the workers).
    `flush()` once the pool has returned: the last counts, however soon after the last read
    (jobs that end within `every_s` of it would otherwise be shown unfinished)."""

    def __init__(self, title: str, jobs: Sequence[Job], report: Callable[[Progress], None], every_s: float = 0.5):
        self.title, self.jobs, self.report, self.every_s = title, jobs, report, every_s
        self.last: tuple[tuple[str, int, int], ...] | None = None
        self.read_at = -math.inf

    def __call__(self) -> None:
        if time.monotonic() - self.read_at < self.every_s:
            return
        self.read_at = time.monotonic()
        counts = tuple((j.name, min(steps_done(j.out), j.steps), j.steps) for j in self.jobs)
        if counts != self.last:
            self.last = counts
            self.report(Progress(self.title, sum(c[1] for c in counts), sum(c[2] for c in counts), counts))

    def flush(self) -> None:
        self.read_at = -math.inf
        self()
