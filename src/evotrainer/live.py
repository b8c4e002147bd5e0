"""What `evotrainer run` shows while it works: the stage, and a step bar per training worker.

    trial 2 v2 [raise_temperature]: trains v2 beside its control, then the evaluator scores both
      v2 s0        ━━━━━━━━━━━━━━╸━━━━━━━━━  61/150 0:00:41
      v2 s1        ━━━━━━━━━━━━━╸━━━━━━━━━━  58/150 0:00:41
      v1-d3 s0     ━━━━━━━━━━━━━━━╸━━━━━━━━  66/150 0:00:41

The controller reports stages (`stage`) and step counts (`training_progress`, read from
the workers' metrics files); lines that are kept (trial outcomes, the final table) are
printed above the live area. Off a terminal (a log file, a pipe) the live area is not drawn;
training prints a line at each quarter of its steps instead, with the time taken and an
estimate of the time left, and the base's SFT a line every 100 steps:

      training v2: 150 steps x 2 seeds: step 150 of 300 (50%), 0:00:55, about 0:00:55 left
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text


class LiveDisplay:
    def __init__(self, console: Console | None = None, clock: Callable[[], float] = time.monotonic):
        self.console = console or Console(stderr=True)
        self.clock = clock
        self.stage = Text("starting", style="bold")
        self.bars = Progress(TextColumn("  {task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=self.console)
        self.live = Live(Group(self.stage, self.bars), console=self.console, transient=True,
                         refresh_per_second=4)
        self.title: str | None = None
        self.jobs: dict[str, int] = {}     # job name -> its bar
        self.started = 0.0                 # when the current title's first count came
        self.quarters = 0                  # quarters of its steps already printed (off a terminal)

    def __enter__(self) -> "LiveDisplay":
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def say(self, text: str) -> None:
        """A line that stays (printed above the live area)."""
        self.console.print(escape(text))

    def set_stage(self, text: str) -> None:
        self.stage.plain = text

    def training(self, title: str, jobs: list, *, lines: bool = True) -> None:
        """Step counts of the jobs under `title`: one bar each; a new title replaces the bars.
        Off a terminal, a line at each quarter of the title's steps (`lines=False`: none, for
        counts whose total is only a cap, such as the base's SFT, which stops at its target)."""
        if title != self.title:
            for task in self.jobs.values():
                self.bars.remove_task(task)
            self.jobs, self.title = {}, title
            self.started, self.quarters = self.clock(), 0
        if lines and not self.console.is_terminal:
            self._quarter_line(title, sum(j[1] for j in jobs), sum(j[2] for j in jobs))
        for name, done, total, *info in jobs:
            if name not in self.jobs:
                self.jobs[name] = self.bars.add_task(escape(str(name)), total=total or None, info="")
            self.bars.update(self.jobs[name], completed=done, total=total or None,
                             info=escape(" ".join(map(str, info))))

    def _quarter_line(self, title: str, done: int, total: int) -> None:
        quarter = 4 * done // total if total else 0
        if quarter <= self.quarters:
            return
        self.quarters = quarter
        spent = self.clock() - self.started
        left = f", about {_hms(spent * (total - done) / done)} left" if done < total else ""
        self.say(f"  {title}: step {done} of {total} ({100 * done // total}%), {_hms(spent)}{left}")

    def rows(self) -> list[tuple[str, float, float | None]]:
        """(name, done, total) of the bars shown: what a test reads."""
        return [(t.description, t.completed, t.total) for t in self.bars.tasks]


def _hms(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))
