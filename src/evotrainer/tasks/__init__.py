"""Task registry: every task is addressed by one spec string (see `get_task`)."""
from __future__ import annotations

import importlib

from evotrainer.errors import UsageError, unknown
from evotrainer.tasks.base import Judgement, Problem, Task, TrainStream
from evotrainer.tasks.spec import GENERIC_KEYS, canonical, parse_spec

BUILTIN = ("arith", "codegen", "humaneval", "vault", "swe-mini")
SPEC_FORMS = ("arith", "codegen", "humaneval", "vault[?tool=on|off]", "swe-mini", "rg:<family>", "jsonl:PATH[?verifier=exact|numeric|math]", "module:Factory",
              "file.py:Factory")


def get_task(spec: str, level: int | None = None) -> Task:
    """The task a spec names, at `level` (None: the task's default target level).

    Spec forms (any may end in `?max_new_tokens=N`, the completion budget):
      arith                          the built-in reversed-sum task
      codegen                        write a small Python function from examples (hidden tests, sandboxed)
      humaneval                      OpenAI's HumanEval, 164 problems, for real models (tests sandboxed)
      vault[?tool=off]               multi-turn: look values up with a tool, then answer (off: the tool locked)
      swe-mini                       multi-turn: fix a bug in a generated mini-repository (tests sandboxed)
      rg:<family>                    any reasoning-gym family
      jsonl:PATH[?verifier=NAME]     the user's rows; NAME is exact (default), numeric or math
      package.module:Factory         a Task subclass or factory importable as a module
      path/to/file.py:Factory        the same, loaded from a file
      NAME                           a factory registered in the `evotrainer.tasks` entry points
    The returned task's `spec` is canonical: `get_task(task.spec, level)` rebuilds it in any
    process and any cwd (absolute paths, query keys sorted).
    """
    s = parse_spec(spec)
    base, query, keys = s.base, dict(s.query), GENERIC_KEYS
    budget = s.max_new_tokens()   # checked before building: a bad value should not wait on a slow task
    if base in ("arith", "codegen", "humaneval"):
        make = importlib.import_module(f"evotrainer.tasks.{base}").make
        s.check_keys(keys)
        try:
            task = make(level)
        except ValueError as e:
            raise UsageError(str(e)) from None
    elif base in ("vault", "swe-mini"):
        s.check_keys(keys + (("tool",) if base == "vault" else ()))
        tool = query.get("tool", "on")
        if tool not in ("on", "off"):
            raise UsageError(f"tool must be on or off, got '{tool}' in task spec '{spec}'")
        module = importlib.import_module(f"evotrainer.tasks.{base.replace('-', '_')}")
        try:
            task = module.make(level, tool=tool == "on") if base == "vault" else module.make(level)
        except ValueError as e:
            raise UsageError(str(e)) from None
        query = {"tool": "off"} if tool == "off" else {}
    elif base.startswith("rg:"):
        from evotrainer.tasks.reasoning_gym import ReasoningGymTask
        s.check_keys(keys)
        task = ReasoningGymTask(base[3:], level)
    elif base.startswith("jsonl:"):
        from evotrainer.tasks import jsonl
        s.check_keys(keys + jsonl.QUERY_KEYS)
        task = jsonl.make(base, query, level)
        base, query["verifier"] = f"jsonl:{task.config.path}", task.config.verifier  # absolute, explicit
        query["rows"] = None if task.config.rows == "all" else task.config.rows
    elif ":" in base:
        from evotrainer.tasks import user
        s.check_keys(keys)
        factory, base = user.file_target(base) if user.is_file_spec(base) else user.module_target(base)
        task = user.build(factory, level, base)
    else:
        from evotrainer.tasks import user
        s.check_keys(keys)
        factory = None if base in BUILTIN else user.entry_point_target(base)
        if factory is None:
            raise unknown("task", base, list(SPEC_FORMS) + user.entry_point_names())
        task = user.build(factory, level, base)
    if budget is not None:
        task.max_new_tokens = budget
    task.spec = canonical(base, query)
    return task


__all__ = ["Judgement", "Problem", "Task", "TrainStream", "get_task"]
