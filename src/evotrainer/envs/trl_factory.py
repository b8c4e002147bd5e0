"""`trl-env:package.module:Class` (or `trl-env:path/file.py:Class`): an environment written to
TRL's `environment_factory` convention, trained and evaluated by evotrainer.

The convention (TRL's GRPOTrainer): the class's instance is one rollout's environment.
`reset(**row)` starts it with a dataset row's columns and returns None or text that is
appended to the row's prompt; every other public method is a tool the model may call, its
parameters the tool's arguments; `get_reward()` scores the finished rollout. A turn that calls
no tool ends the episode (TRL's tool loop ends there too), and so does a cap; either way
`get_reward()` is the episode's score, the verifier, held fixed: the harness shapes its own
reward from it. TRL itself is not needed: the convention is plain Python.

Problems: `?data=rows.jsonl`, one row per line: `prompt` (text, or chat messages whose
contents are joined), an optional `id`, and the columns `reset` takes (a row is passed whole,
as TRL passes dataset rows). Validation and test come from the held-out pool (the public
hash of a row's id; envs/foreign.py), and training workers see only the other rows. Without
`data`, `reset` must take a `seed`: the environment owns its problems, and a problem is a seed.

Actions: a turn is read as a tool call by the harness's `action_parser` in training and by
`?actions=json|plain` in evaluation (default json: what chat models write inside <tool_call>
tags, as TRL's templates do; set the harness knob `action_parser: json` to match, or plain for
the built-in character model). Arguments arrive as text and are converted to the parameter's
annotation (int, float, bool). A tool that raises answers `error: ...` and counts as a tool
failure. Caps and evaluation size: `?max_turns=N` (default 8), `?turn_tokens=N` (256),
`?split_size=N` (100 held-out problems each for validation and test).
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

from evotrainer.envs.base import FAIL, SUCCESS, Caps, EnvTask, Environment, Parser, Step
from evotrainer.envs.foreign import (EPISODE_KEYS, RowsMixin, call_tool, episode_options, method_tools, read_rows,
                                    text_of, tool_params)
from evotrainer.errors import UsageError
from evotrainer.tasks import user
from evotrainer.tasks.base import Problem
from evotrainer.tasks.registry import Family, Resolved, register_family
from evotrainer.tasks.spec import GENERIC_KEYS, Spec

PREFIX = "trl-env"
KEYS = ("data", "actions") + EPISODE_KEYS
ACTIONS = ("json", "plain")
NOT_TOOLS = ("reset", "get_reward")


class FactoryEnv(Environment):
    """One episode of a user's environment class."""

    def __init__(self, factory: Callable[[], Any], problem: Problem, parse: Parser, caps: Caps):
        super().__init__()
        self.env, self.problem, self.parse, self.caps = factory(), problem, parse, caps
        self.methods = method_tools(self.env, NOT_TOOLS)
        self.tools = tool_params(self.methods)

    def reset(self, seed: int) -> str:
        row = self.problem.entry
        if isinstance(row, dict):  # a row: reset gets its columns, the prompt is the row's plus what reset adds
            extra = self.env.reset(**{k: v for k, v in row.items() if k != "id"})
            return text_of(row.get("prompt")) + (text_of(extra) if extra is not None else "")
        return text_of(self.env.reset(seed=row))  # a seed: the environment owns the prompt

    def step(self, action: str) -> Step:
        call = self.parse(action, self.tools)
        if call is None:  # no tool call: the final answer
            return self._end(terminated=True)
        self.trace.tools.append(call.name)
        observation, failed = call_tool(self.methods[call.name], call)
        self.trace.failures += failed
        return Step(observation + "\n", 0.0, False, False, {"tool": call.name})

    def truncate(self, stop: str) -> Step:
        end = self._end(terminated=False)
        return Step("", end.reward, False, True, {"stop": stop})

    def _end(self, terminated: bool) -> Step:
        reward = float(self.env.get_reward())
        return Step("", reward, terminated, not terminated, {"stop": SUCCESS if reward >= 1 else FAIL})


class FactoryTask(RowsMixin, EnvTask):
    def __init__(self, factory: Callable[[], Any], base: str, *, data: Path | None, caps: Caps, split_size: int,
                 actions: str):
        if not callable(factory):
            raise UsageError(f"{base}: not a class or a factory of environments")
        self.factory, self.base, self.data_path, self.action_format = factory, base, data, actions
        self.name = f"{PREFIX}:{base}"
        self.levels, self.target_level = (0,), 0
        self.caps, self.split_size = caps, split_size
        self.rows = read_rows(data) if data is not None else []
        if data is None and "seed" not in _reset_params(factory):
            raise UsageError(f"{self.name}: give ?data=rows.jsonl (reset takes a dataset row's columns, as in TRL), "
                             "or a reset that takes `seed` (the environment owns its problems)")

    def environment(self, problem: Problem, parse: Parser) -> FactoryEnv:
        return FactoryEnv(self.factory, problem, parse, self.caps)


def _reset_params(factory: Any) -> set[str]:
    reset = getattr(factory, "reset", None)
    return set(inspect.signature(reset).parameters) if reset is not None else set()


def resolve(rest: str, s: Spec, level: int | None) -> Resolved:
    s.check_keys(GENERIC_KEYS + KEYS)
    factory, base = user.file_target(rest) if user.is_file_spec(rest) else user.module_target(rest)
    data = Path(s.query["data"]).expanduser().resolve() if "data" in s.query else None
    caps, split_size, episode_query = episode_options(s, max_turns=8)
    actions = s.query.get("actions", "json")
    if actions not in ACTIONS:
        raise UsageError(f"actions must be {' or '.join(ACTIONS)}, got '{actions}' in task spec '{s.raw}'")
    task = FactoryTask(factory, base, data=data, caps=caps, split_size=split_size, actions=actions)
    query: dict[str, object] = {k: s.query[k] for k in GENERIC_KEYS if k in s.query}
    query |= {"data": str(data) if data else None, "actions": actions if actions != "json" else None, **episode_query}
    return task, f"{PREFIX}:{base}", query


register_family(Family(PREFIX, "trl-env:module:Class[?data=rows.jsonl&actions=json|plain&max_turns=N&turn_tokens=N"
                              "&split_size=N]", resolve))
