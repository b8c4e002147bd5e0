"""Action parsers: how a policy turn's text becomes a tool call (the `action_parser` slot).

`plain` reads the format a ~1M-parameter character model can learn: the tool's name, a
space, then its arguments separated by `|` (`look k3`, `edit m.py|a-b|a+b`, `submit`).
`json` reads what chat models are trained to write: `{"name": ..., "arguments": {...}}`,
alone or inside `<tool_call>` tags (Qwen's and Hermes's templates). A turn that parses as
no tool the environment has returns None: the environment calls it an invalid action.
"""
from __future__ import annotations

import json
import re
from typing import Callable

from evotrainer.envs.base import ToolCall, Tools
from evotrainer.harness.registry import Registry

ACTION_PARSERS: Registry[Callable[[str, Tools], ToolCall | None]] = Registry("action_parser")


@ACTION_PARSERS.register()
def plain(text: str, tools: Tools) -> ToolCall | None:
    """`name arg1|arg2|...`; the last parameter takes the rest (it may hold a `|`)."""
    name, _, rest = text.strip().partition(" ")
    if name not in tools:
        return None
    params = tools[name]
    if not params:
        return ToolCall(name) if not rest.strip() else None
    values = rest.split("|", len(params) - 1)
    if len(values) != len(params):
        return None
    return ToolCall(name, dict(zip(params, values)))


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@ACTION_PARSERS.register("json")
def json_call(text: str, tools: Tools) -> ToolCall | None:
    """`{"name": ..., "arguments": {...}}`, bare or in <tool_call> tags; the first call only."""
    m = _TAGGED.search(text)
    try:
        obj = json.loads(m.group(1) if m else text.strip())
    except (json.JSONDecodeError, ValueError):
        return None
    if not isinstance(obj, dict) or obj.get("name") not in tools:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some templates write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict) or set(args) != set(tools[obj["name"]]):
        return None
    return ToolCall(obj["name"], {k: str(v) for k, v in args.items()})
