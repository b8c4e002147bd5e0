"""Where a run's training and evaluation jobs run: the executor interface.

The controller hands every training segment and every evaluator call to an `Executor`, as
a list of `Call`s (a target, JSON arguments, the directories it writes), and gets their
`WorkerResult`s back in the calls' order, labelled ok / crash / timeout / oom. `LocalPool`
(the default) runs them in sandboxed worker processes on this machine; `RayExecutor`
(ray_tasks.py, `executor: ray`) runs each as a Ray task, still sandboxed, on a cluster's node.
Backtests and diagnostics stay in local workers: they are short and read the run's evidence.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from evotrainer.executors.worker import Call, WorkerResult, run_all
from evotrainer.sandbox.processes import usable_cores


class Executor(ABC):
    def start(self) -> None:
        """Reach what runs the jobs and check it can run them, before any work (bad input
        stops here, in one line); nothing to do for a pool on this machine."""

    @abstractmethod
    def run(self, calls: list[Call], timeout_s: float, memory_mb: int | None = 8192,
            on_poll: Callable[[], None] | None = None) -> list[WorkerResult]:
        """Every call, each past `timeout_s` from its own start killed and labelled `timeout`;
        `on_poll` runs in the caller while it waits (the live progress)."""

    def threads(self, batch: int) -> int | None:
        """The intra-op threads each job of a batch of `batch` calls runs with (None: not
        known here). They change a job's numbers in the last digits, so a cached segment's key holds them."""
        return None

    def part_of(self, batch: int) -> "Executor":
        """This executor for some of a batch of `batch` calls (the rest reused from a cache):
        each job runs with the threads it would have had in the whole batch, so reusing
        some segments never changes the numbers of the ones that train."""
        return self


@dataclass(frozen=True)
class LocalPool(Executor):
    """`workers` sandboxed processes at once on this machine (0: one per core, at most one per
    call), each capped to its share of the cores' threads so they do not oversubscribe them;
    `cwd`: where the workers start (None: here). `shared`: several threads call `run` at once
    (trials in flight): `workers` (0: one per core) is then one limit on all their jobs together,
    and every job runs with the threads of one such slot."""
    workers: int = 0
    cwd: Path | None = None
    shared: bool = False
    slots: threading.Semaphore | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.shared and self.slots is None:
            object.__setattr__(self, "slots", threading.Semaphore(self._capacity))

    def run(self, calls: list[Call], timeout_s: float, memory_mb: int | None = 8192,
            on_poll: Callable[[], None] | None = None) -> list[WorkerResult]:
        if not calls:
            return []
        workers = self._workers(len(calls))
        return run_all(calls, workers, timeout_s=timeout_s, memory_mb=memory_mb, cwd=self.cwd, on_poll=on_poll,
                       threads=self.threads(len(calls)), slots=self.slots)

    def threads(self, batch: int) -> int:
        return max(1, usable_cores() // (self._capacity if self.shared else self._workers(batch)))

    def part_of(self, batch: int) -> "LocalPool":
        if self.shared:  # the same slots, and a slot's threads whatever the batch
            return self
        return LocalPool(self._workers(batch), self.cwd)

    @property
    def _capacity(self) -> int:
        return self.workers or usable_cores()

    def _workers(self, batch: int) -> int:
        return self.workers or min(usable_cores(), max(batch, 1))
