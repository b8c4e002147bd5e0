"""`openenv:package.module:Class` (or `openenv:path/file.py:Class`): an OpenEnv environment (a
subclass of `openenv.core.env_server.interfaces.Environment`, `pip install
'evotrainer[openenv]'`) played in-process as an evotrainer task: no server, no container.

OpenEnv's interface is gym's, typed: `reset(seed=..., episode_id=..., **kwargs)` returns an
Observation, `step(action)` takes an Action and returns the next Observation, and the reward
and the end of the episode ride on the observation (`reward`, `done`), both pydantic models
that forbid unknown fields. Here:

- the Action class is the environment's own, read from its declaration
  (`Environment[MyAction, MyObservation, MyState]`, or `step`'s annotation). An action with one
  text field (besides `metadata`) takes the policy's turn as written; any other is read from
  the first JSON object in the turn (`{"dx": 1, "dy": 0}`). A turn that does not validate as
  the Action ends the episode `invalid_action` (a second chance would teach nothing the
  validation error does not);
- the observation the policy reads is its `?text=FIELD`, else, where it has one field besides
  `done`, `reward` and `metadata` and that is text, that field, else those fields as JSON;
- the score is the episode's return (the sum of the observations' rewards, None counting 0)
  clipped to [0, 1], the verifier held fixed; the harness shapes its own reward from it. A cap
  (`?max_turns=N`, default 8; `?turn_tokens=N`) scores the return so far.

Problems: without data the environment owns them: a problem is a seed, `reset(seed=...,
episode_id=...)`. With `?data=rows.jsonl`, `reset` is called with a row's columns (all but
`id`), the held-out pool is the public hash of the row's id and training workers see only the
other rows (envs/foreign.py). `?split_size=N` held-out problems each for validation and test
(default 100). The environment's code runs only where episodes are played (training and
evaluation jobs, in the sandbox); the controller imports the class and reads its Action's
fields, and never opens an environment.
"""
from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

from evotrainer.envs.base import FAIL, INVALID, SUCCESS, Caps, EnvTask, Environment, Parser, Step
from evotrainer.envs.foreign import EPISODE_KEYS, RowsMixin, episode_options, read_rows
from evotrainer.errors import UsageError
from evotrainer.tasks import user
from evotrainer.tasks.base import Problem
from evotrainer.tasks.registry import Family, Resolved, register_family
from evotrainer.tasks.spec import GENERIC_KEYS, Spec

PREFIX = "openenv"
KEYS = ("data", "text") + EPISODE_KEYS
OWN = ("done", "reward", "metadata")  # the fields every Observation has (and Action's metadata)


def _interfaces():
    try:
        from openenv.core.env_server import interfaces
    except ImportError:
        raise UsageError("openenv tasks need OpenEnv: pip install 'evotrainer[openenv]'") from None
    return interfaces


def declared(cls: type, kind: type, position: int, hint: str) -> type | None:
    """The subclass of `kind` an Environment subclass declares: its generic parameters'
    argument at `position` (Environment[Action, Observation, State]), else the annotation
    `hint` of `step` ("action", or "return")."""
    args = [typing.get_args(b) for k in cls.__mro__ for b in getattr(k, "__orig_bases__", ())]
    hints = typing.get_type_hints(cls.step) if hasattr(cls, "step") else {}
    for found in [*(a[position] for a in args if len(a) > position), hints.get(hint)]:
        if isinstance(found, type) and issubclass(found, kind) and found is not kind:
            return found
    return None


def action_class(cls: type) -> type:
    """The Action subclass an Environment subclass steps with."""
    from openenv.core.env_server.types import Action
    found = declared(cls, Action, 0, "action")
    if found is None:
        raise UsageError(f"{cls.__name__}: cannot tell its Action class; declare it as Environment[MyAction, "
                         "MyObservation, MyState] or annotate step(self, action: MyAction)")
    return found


def check_text_field(cls: type, field: str) -> None:
    """`?text=FIELD` names a field of the Observation class the environment declares (where it declares one)."""
    from openenv.core.env_server.types import Observation
    obs = declared(cls, Observation, 1, "return")
    names = [k for k in obs.model_fields if k not in OWN] if obs is not None else []
    if obs is not None and field not in names:
        raise UsageError(f"text must name a field of {obs.__name__}, got '{field}'; valid choices: {', '.join(names)}")


def text_field(action: type) -> str | None:
    """The Action's one text field, where it has exactly one field besides metadata and that is a str."""
    fields = {k: f for k, f in action.model_fields.items() if k not in OWN}
    return next(iter(fields)) if len(fields) == 1 and next(iter(fields.values())).annotation is str else None


def to_action(action: type, turn: str) -> Any:
    """The policy's turn as the environment's Action; a ValueError where it does not fit (no
    JSON object in it, or one that does not validate: pydantic's ValidationError is one)."""
    field = text_field(action)
    if field is not None:
        return action(**{field: turn.strip()})
    start = turn.find("{")
    if start < 0:
        raise ValueError("no JSON object in the turn")
    obj, _ = json.JSONDecoder().raw_decode(turn[start:])
    return action.model_validate(obj)


def observed(obs: Any, field: str | None) -> str:
    """What the policy reads of an observation (see the module docstring)."""
    data = obs.model_dump(exclude=set(OWN))
    if field is not None:
        return str(data.get(field, ""))
    texts = [k for k, v in data.items() if isinstance(v, str)]
    return data[texts[0]] if len(data) == 1 and texts else json.dumps(data, default=str)


class OpenEnvEpisode(Environment):
    """One episode of a user's OpenEnv environment."""

    def __init__(self, cls: type, problem: Problem, caps: Caps, field: str | None):
        super().__init__()
        self.env, self.problem, self.caps, self.field = cls(), problem, caps, field
        self.action, self.ret = action_class(cls), 0.0

    def reset(self, seed: int) -> str:
        entry = self.problem.entry
        if isinstance(entry, dict):  # a row: its columns, as reset's keyword arguments
            obs = self.env.reset(**{k: v for k, v in entry.items() if k != "id"})
        else:
            obs = self.env.reset(seed=entry, episode_id=self.problem.id)
        self.ret += float(obs.reward or 0.0)
        return observed(obs, self.field)

    def step(self, action: str) -> Step:
        try:
            act = to_action(self.action, action)
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            self.trace.tools.append("invalid")
            self.trace.failures += 1
            return Step(f"invalid action: {e}", self.score, True, False, {"stop": INVALID})
        obs = self.env.step(act)
        self.ret += float(obs.reward or 0.0)
        if obs.done:
            return Step("", self.score, True, False, {"stop": SUCCESS if self.score >= 1 else FAIL})
        return Step(observed(obs, self.field) + "\n", 0.0, False, False, {})

    def truncate(self, stop: str) -> Step:
        return Step("", self.score, False, True, {"stop": stop})

    @property
    def score(self) -> float:
        return min(max(self.ret, 0.0), 1.0)

    def close(self) -> None:
        self.env.close()


class OpenEnvTask(RowsMixin, EnvTask):
    def __init__(self, cls: type, base: str, data: Path | None, caps: Caps, split_size: int, field: str | None):
        self.cls, self.base, self.data_path, self.field = cls, base, data, field
        self.name = f"{PREFIX}:{base}"
        self.levels, self.target_level = (0,), 0
        self.caps, self.split_size = caps, split_size
        self.rows = read_rows(data) if data is not None else []

    def environment(self, problem: Problem, parse: Parser) -> OpenEnvEpisode:
        return OpenEnvEpisode(self.cls, problem, self.caps, self.field)


def resolve(rest: str, s: Spec, level: int | None) -> Resolved:
    s.check_keys(GENERIC_KEYS + KEYS)
    base_env = _interfaces().Environment
    cls, base = user.file_target(rest) if user.is_file_spec(rest) else user.module_target(rest)
    if not (isinstance(cls, type) and issubclass(cls, base_env)):
        raise UsageError(f"{base}: not an OpenEnv Environment (a subclass of "
                         "openenv.core.env_server.interfaces.Environment)")
    action_class(cls)  # refused here, in one line, rather than in every episode
    data = Path(s.query["data"]).expanduser().resolve() if "data" in s.query else None
    caps, split_size, episode_query = episode_options(s, max_turns=8)
    field = s.query.get("text")
    if field is not None:
        check_text_field(cls, field)
    task = OpenEnvTask(cls, base, data, caps, split_size, field)
    query: dict[str, object] = {k: s.query[k] for k in GENERIC_KEYS if k in s.query}
    query |= {"data": str(data) if data else None, "text": field, **episode_query}
    return task, f"{PREFIX}:{base}", query


register_family(Family(PREFIX, "openenv:module:Class[?data=rows.jsonl&text=FIELD&max_turns=N&turn_tokens=N"
                              "&split_size=N]", resolve))
