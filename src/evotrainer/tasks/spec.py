"""Task spec strings: `BASE[?key=value&...]`, the one address of a task across processes.

Workers and the evaluator receive only a spec and a level, so a task's canonical spec
(`task.spec`) must rebuild the same task anywhere: absolute paths, query keys sorted.
The query carries options that change what the task *is* (its verifier, its completion
budget); anything a harness may tune does not belong here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from evotrainer.errors import UsageError

GENERIC_KEYS = ("max_new_tokens",)  # every kind of task takes these


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
    """`base` plus the query with keys sorted; no '?' when the query is empty."""
    items = [f"{k}={query[k]}" for k in sorted(query) if query[k] is not None]
    return base + ("?" + "&".join(items) if items else "")
