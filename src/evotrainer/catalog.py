"""Every task the package ships, and `get_task`, the one way a spec string becomes a task.

This module sits above tasks/ and envs/: it imports each built-in, single-turn (tasks/) and
multi-turn (envs/), so that each file's registration (its last line) is in `TASKS` before
a spec is resolved. The lookup cannot live in tasks/: envs build on tasks.base, so tasks/
importing envs/ would make the two a circle.
"""
from __future__ import annotations

from evotrainer.envs import (openenv_envs, swe_mini, textarena_games, trl_factory, vault,  # noqa: F401
                             verifiers_envs)  # (each registers itself)
from evotrainer.tasks import arith, codegen, humaneval  # noqa: F401
from evotrainer.tasks.base import Task
from evotrainer.tasks.registry import FAMILIES, TASKS, resolve


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
      trl-env:module:Class[?data=F]  multi-turn: an environment written to TRL's environment_factory convention
      textarena:GAME                 multi-turn: a single-player TextArena game (the `textarena` extra)
      verifiers:ENV_ID|module:load   a verifiers environment scored by its rubric (the `verifiers` extra)
      openenv:module:Class[?data=F]  multi-turn: an OpenEnv environment, in-process (the `openenv` extra)
    The returned task's `spec` is canonical: `get_task(task.spec, level)` rebuilds it in any
    process and any cwd (absolute paths, query keys sorted).
    """
    return resolve(spec, level, TASKS, FAMILIES)
