"""`verifiers:ENV_ID` (an installed verifiers environment, as `vf.load_environment` finds it) or
`verifiers:module:load` / `verifiers:file.py:load` (a function returning one): a verifiers
environment (`SingleTurnEnv`, `MultiTurnEnv`, `ToolEnv`, ..., scored by its `Rubric`) as an
evotrainer task. verifiers' classic API: `pip install 'evotrainer[verifiers]'` (0.2.x; 0.3 moved
it to `verifiers.legacy`, 0.4 replaced it with `verifiers.v1`).

The environment plays itself, as its authors wrote it: its own `rollout` (stop conditions,
`env_response`, tool calls) runs in an event loop of the episode's own, and the model it talks
to is a `vf.Client` whose responses are the policy's turns, handed in by evotrainer's trainer
one at a time (`PolicyTurns`). When the rollout ends, the environment's rubric scores it:
that reward is the score (clipped to [0, 1]), held fixed; the harness shapes its own reward
from it. A turn's tool calls are read from `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` in its text, as chat templates write them (the harness's action_parser does
not apply: the environment reads its own tools). A cap (`?max_turns=N`, default 8;
`?turn_tokens=N`) ends a rollout still going: its state is scored as it stands.

Problems are the rows of the environment's dataset (`get_dataset()`), each with the row's id
(its `example_id` and prompt); validation and test come from the held-out pool, the public
hash of that id (`?split_size=N` each, default 100). The environment's loader builds its
whole dataset wherever the task is built, a training worker included: the worker trains only
on rows outside the pool, but those rows are in its memory (unlike a JSONL task's). The
loader runs wherever the task is built; the rollout, tools and rubric run only where
episodes are played (training and evaluation jobs, in the sandbox).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from typing import Any

from evotrainer.envs.base import FAIL, SUCCESS, Caps, EnvTask, Environment, Parser, Step
from evotrainer.envs.foreign import EPISODE_KEYS, episode_options, text_of
from evotrainer.errors import UsageError
from evotrainer.tasks import user
from evotrainer.tasks.base import Problem
from evotrainer.tasks.registry import Family, Resolved, register_family
from evotrainer.tasks.spec import GENERIC_KEYS, Spec

PREFIX = "verifiers"
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _vf():
    try:
        import verifiers
    except ImportError:
        raise UsageError("verifiers tasks need verifiers: pip install 'evotrainer[verifiers]'") from None
    if not hasattr(verifiers, "SingleTurnEnv"):
        raise UsageError(f"verifiers {verifiers.__version__} has no SingleTurnEnv/Rubric API (0.3 moved it to "
                         "verifiers.legacy, 0.4 replaced it); install 'verifiers>=0.2,<0.3'")
    return verifiers


def _message_text(m: Any) -> str:
    role = getattr(m, "role", None) or (m.get("role") if isinstance(m, dict) else "")
    content = getattr(m, "content", None) if not isinstance(m, dict) else m.get("content")
    return f"{role}: {text_of(content) if not isinstance(content, str) else content}"


def messages_text(messages: list) -> str:
    return "\n".join(_message_text(m) for m in messages)


def _tool_def(tool: Any) -> dict:
    """A tool as a chat template shows it: name, description, parameters."""
    get = (lambda k: tool.get(k)) if isinstance(tool, dict) else (lambda k: getattr(tool, k, None))
    return {"name": get("name"), "description": get("description"), "parameters": get("parameters")}


def policy_turns_client(vf):
    """The vf.Client class whose model is evotrainer's policy (built once verifiers is imported)."""
    from verifiers.types import Response, ResponseMessage, ToolCall

    class PolicyTurns(vf.Client):
        """Each response is the policy's next turn: the rollout waits on `waiting` until the
        trainer hands it in (`answer`); `prompt` is what the rollout asked with."""

        def __init__(self):
            super().__init__(None)
            self.waiting: asyncio.Future | None = None
            self.prompt: list = []
            self.state: dict | None = None
            self.tools: list[str] = []

        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            self.state = kwargs.get("state", self.state)  # the rollout's state: a cap scores it as it stands
            return await super().get_response(prompt, model, sampling_args, tools, **kwargs)

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            self.prompt = list(prompt)
            self.waiting = asyncio.get_running_loop().create_future()
            return await self.waiting

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, text: str):
            calls = []
            for m in TOOL_CALL.finditer(text):
                try:
                    obj = json.loads(m.group(1))
                    calls.append(ToolCall(id=uuid.uuid4().hex[:12], name=str(obj["name"]),
                                          arguments=json.dumps(obj.get("arguments", {}))))
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # not a call: the environment sees the text alone
            self.tools += [c.name for c in calls]
            return Response(id=uuid.uuid4().hex, created=int(time.time()), model="policy",
                            message=ResponseMessage(content=text, finish_reason="tool_calls" if calls else "stop",
                                                    is_truncated=False, tool_calls=calls or None))

        async def close(self):
            return None

    return PolicyTurns


class VerifiersEpisode(Environment):
    """One rollout of a verifiers environment, a policy turn at a time."""

    def __init__(self, env: Any, problem: Problem, caps: Caps):
        super().__init__()
        self.env, self.row, self.caps = env, problem.entry, caps
        self.loop = asyncio.new_event_loop()
        self.client = policy_turns_client(_vf())()
        self.rollout: asyncio.Task | None = None
        self.seen = 0

    def reset(self, seed: int) -> str:
        self.rollout = self.loop.create_task(self.env.rollout(dict(self.row), self.client, "policy", {}))
        self._advance()
        if self.rollout.done():
            raise RuntimeError(f"the verifiers rollout ended before the model's first turn: {self.rollout.result()}")
        self.seen = len(self.client.prompt)
        defs = (self.client.state or {}).get("tool_defs") or []
        tools = "".join(f"\n{json.dumps(_tool_def(t))}" for t in defs)
        return messages_text(self.client.prompt) + (f"\ntools:{tools}" if tools else "")

    def step(self, action: str) -> Step:
        self.client.waiting.set_result(action)
        self._advance()
        self.trace.tools = list(self.client.tools)
        if self.rollout.done():
            return self._scored(self.rollout.result(), terminated=True, stop=None)
        new = self.client.prompt[self.seen + 1:]  # after the policy's own message: the environment's answer
        self.seen = len(self.client.prompt)
        return Step(messages_text(new) + "\n", 0.0, False, False, {})

    def truncate(self, stop: str) -> Step:
        self.rollout.cancel()
        self.loop.run_until_complete(asyncio.gather(self.rollout, return_exceptions=True))
        state = self.client.state
        if state is None:
            return Step("", 0.0, False, True, {"stop": stop})
        self.loop.run_until_complete(self.env.render_completion(state))
        return self._scored(state, terminated=False, stop=stop)

    def close(self) -> None:
        if self.rollout is not None and not self.rollout.done():
            self.rollout.cancel()
            self.loop.run_until_complete(asyncio.gather(self.rollout, return_exceptions=True))
        self.loop.close()

    def _advance(self) -> None:
        """Run the rollout until it waits for the policy's next turn, or ends."""
        async def until_turn():
            while not self.rollout.done() and (self.client.waiting is None or self.client.waiting.done()):
                await asyncio.sleep(0)
        self.loop.run_until_complete(until_turn())

    def _scored(self, state, terminated: bool, stop: str | None) -> Step:
        self.loop.run_until_complete(self.env.rubric.score_rollout(state))
        score = min(max(float(state["reward"] or 0.0), 0.0), 1.0)
        self.trace.failures += state.get("error") is not None
        return Step("", score, terminated, not terminated, {"stop": stop or (SUCCESS if score >= 1 else FAIL)})


class VerifiersTask(EnvTask):
    def __init__(self, env: Any, base: str, caps: Caps, split_size: int):
        self.env, self.name = env, f"{PREFIX}:{base}"
        self.levels, self.target_level = (0,), 0
        self.caps, self.split_size = caps, split_size
        self.rows = [dict(r) for r in env.get_dataset()]
        if not self.rows:
            raise UsageError(f"{self.name}: the environment's dataset is empty")

    def _problem(self, row: dict) -> Problem:
        prompt = row.get("prompt")
        text = messages_text(prompt) if isinstance(prompt, list) else text_of(prompt)
        key = hashlib.sha256(f"{row.get('example_id')}/{text}".encode()).hexdigest()[:16]
        return Problem(id=key, prompt=text, answer=str(row.get("answer", "")), level=0, entry=row)

    def generate(self, rng, level: int) -> Problem:
        return self._problem(self.rows[rng.randrange(len(self.rows))])

    def problem_space(self, level: int) -> int:
        return len(self.rows)

    def environment(self, problem: Problem, parse: Parser) -> VerifiersEpisode:
        return VerifiersEpisode(self.env, problem, self.caps)


def resolve(rest: str, s: Spec, level: int | None) -> Resolved:
    s.check_keys(GENERIC_KEYS + EPISODE_KEYS)
    vf = _vf()
    if ":" in rest:
        factory, base = user.file_target(rest) if user.is_file_spec(rest) else user.module_target(rest)
        env = factory()
    else:
        base = rest
        try:
            env = vf.load_environment(rest)
        except (ImportError, AttributeError, ValueError) as e:
            raise UsageError(f"verifiers environment '{rest}' could not be loaded: {user.one_line(e)}") from None
    if not isinstance(env, vf.Environment):
        raise UsageError(f"{rest} did not return a verifiers Environment (got {type(env).__name__})")
    caps, split_size, episode_query = episode_options(s, max_turns=8)
    query: dict[str, object] = {k: s.query[k] for k in GENERIC_KEYS if k in s.query} | episode_query
    return VerifiersTask(env, base, caps, split_size), f"{PREFIX}:{base}", query


register_family(Family(PREFIX, "verifiers:ENV_ID|module:load[?max_turns=N&turn_tokens=N&split_size=N]", resolve))
