"""Task spec strings: `BASE[?key=value&...]`, the one address of a task across processes.

Workers and the evaluator receive only a spec and a level, so a task's canonical spec
(`task.spec`) must rebuild the same task anywhere: absolute paths, query keys sorted.
The query carries options that change what the task *is* (its verifier, its completion
budget); anything a harness may tune does not belong here.

A path is any file name, so the characters the grammar splits at are escaped where a path
holds them: in the base, '%' and '?' are written %25 and %3F (`jsonl:/data/a%3Fb/t.jsonl`
is the file /data/a?b/t.jsonl); in a query value, '%', '&' and '+' are %25, %26 and %2B
(standard query encoding). `canonical` writes them so, and `parse_spec` reads them back:
every path round-trips, '=', ':', ',' and ';' included, which need no escape. A spec that
holds none of these characters reads and writes exactly as before.

`spec_files` reads the paths a spec names by this grammar, never by cutting it at
punctuation: what a job that rebuilds the task from the spec must see (tasks/base.py
`Task.files`), and nothing beside it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from evotrainer.errors import UsageError

GENERIC_KEYS = ("max_new_tokens",)  # every kind of task takes these
# query options whose value is a file (an environment's rows: envs/trl_factory.py, openenv_envs.py)
PATH_KEYS = ("data",)
BASE_ESCAPES = {"%": "%25", "?": "%3F"}
VALUE_ESCAPES = {"%": "%25", "&": "%26", "+": "%2B"}


@dataclass
class Spec:
    raw: str                                   # as the user wrote it, for error messages
    base: str                                  # before the '?'
    query: dict[str, str] = field(default_factory=dict)

    def check_keys(self, valid: tuple[str, ...]) -> None:
        """Refuse query keys this kind of task does not know, naming the ones it does."""
        for key in self.query:
            if key not in valid:
                raise UsageError(f"unknown option '{key}' in task spec '{self.raw}'; "
                                 f"valid options: {', '.join(sorted(valid))}")

    def max_new_tokens(self) -> int | None:
        """The `?max_new_tokens=N` override (a positive integer), or None."""
        value = self.query.get("max_new_tokens")
        if value is None:
            return None
        if not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise UsageError(f"max_new_tokens must be a positive integer, got '{value}' "
                             f"in task spec '{self.raw}'")
        return int(value)


def parse_spec(raw: str) -> Spec:
    """Split `raw` at its first '?' and parse the query strictly (malformed -> UsageError)."""
    if not isinstance(raw, str) or not raw.strip():
        raise UsageError(f"empty task spec {raw!r}")
    base, _, query = raw.strip().partition("?")
    base = unescape_base(base)
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError as e:
        raise UsageError(f"malformed query in task spec '{raw}': {e}") from None
    out: dict[str, str] = {}
    for key, value in pairs:
        if key in out:
            raise UsageError(f"option '{key}' given twice in task spec '{raw}'")
        out[key] = value
    return Spec(raw, base, out)


def canonical(base: str, query: dict[str, object]) -> str:
    """`base` plus the query with keys sorted; no '?' when the query is empty. The base and
    the values escaped where they hold what the grammar splits at (the module docstring)."""
    items = [f"{k}={_escape(str(query[k]), VALUE_ESCAPES)}" for k in sorted(query) if query[k] is not None]
    return _escape(base, BASE_ESCAPES) + ("?" + "&".join(items) if items else "")


def _escape(text: str, escapes: dict[str, str]) -> str:
    return "".join(escapes.get(c, c) for c in text)


def unescape_base(base: str) -> str:
    """A spec's base as written (%25 and %3F, in either case) back to the text it stands for;
    any other '%' is itself."""
    return re.sub(r"%(25|3[fF])", lambda m: "%" if m.group(1) == "25" else "?", base)


def spec_files(raw: str) -> tuple[str, ...]:
    """The files a task spec names as paths, read by the grammar: a JSONL task's file
    (`jsonl:PATH`), the file of a factory (`FILE.py:Factory`, or after a family's prefix,
    `trl-env:FILE.py:Class`: the file is left of the last ':'), and a path option's value
    (`?data=rows.jsonl`). Only absolute paths, as canonical specs hold them; a name that is
    no path (`arith`, `rg:chain_sum`, `module:Factory`) names none."""
    s = parse_spec(raw)
    head, colon, rest = s.base.partition(":")
    out = []
    if head == "jsonl":
        out.append(rest)
    elif colon:
        target = s.base if s.base.startswith("/") else rest  # after a family's prefix, if any
        out.append(target.rpartition(":")[0])
    out += [s.query[k] for k in PATH_KEYS if k in s.query]
    return tuple(os.path.normpath(p) for p in out if p.startswith("/"))
