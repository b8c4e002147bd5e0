"""The evaluator's launcher: `evaluate_checkpoints` in a process of its own, on an executor.

The evaluator is the one job that holds the split key (which problems validation and test
are) and the held-out rows: they are revealed to it, and to no training worker. It loads
checkpoints and the task's verifier, never harness code, so what decides a run's fitness
cannot be reached by what the run evolves.
"""
from __future__ import annotations

from evotrainer.evaluate.greedy import evaluate_checkpoints
from evotrainer.executors import Call, Executor, LocalPool, WorkerResult
from evotrainer.runtime import Runtime
from evotrainer.tasks import Task


class EvaluatorFailed(RuntimeError):
    """The evaluator's process failed (crash, timeout, oom): nothing was scored. `result` is
    the worker's (its label, error and log tail)."""

    def __init__(self, result: WorkerResult):
        super().__init__(f"the evaluator failed: {result.label}: {result.error}")
        self.result = result


def run_evaluator(task: Task, jobs: dict[str, list[str]], timeout_s: float, *, runtime: Runtime | None = None,
                  memory_mb: int | None = 8192, executor: Executor | None = None) -> dict[str, dict[str, float]]:
    """Accuracy per checkpoint and split for `jobs` ({checkpoint: [splits]}); a checkpoint that
    does not load comes back as {"error": why} (greedy.evaluate_checkpoints)."""
    runtime = runtime or Runtime()
    (ev,) = (executor or LocalPool(1)).run([Call(evaluate_checkpoints, dict(
        task=task.spec, level=task.target_level, jobs=jobs, policy=runtime.policy.to_dict(),
        key=task.key.hex() if task.key else None), reveal=task.data_files(),
        reads=(*jobs, *task.files(), *task.data_files(), *runtime.policy.reads()))], timeout_s, memory_mb)
    if not ev.ok:
        raise EvaluatorFailed(ev)
    return ev.value
