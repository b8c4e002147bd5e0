"""Task registry: `arith` is built in; `rg:<family>` is any reasoning-gym family."""
from __future__ import annotations

from evotrainer.errors import UsageError, unknown
from evotrainer.tasks.base import Problem, Task, TrainStream

BUILTIN = ("arith",)


def get_task(name: str, level: int | None = None) -> Task:
    if name == "arith":
        from evotrainer.tasks.arith import make
        try:
            return make(level)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if name.startswith("rg:"):
        from evotrainer.tasks.reasoning_gym import ReasoningGymTask
        return ReasoningGymTask(name[3:], level)
    raise unknown("task", name, list(BUILTIN) + ["rg:<family> (any reasoning-gym family)"])


__all__ = ["Problem", "Task", "TrainStream", "get_task"]
