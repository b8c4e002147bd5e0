"""Slot registries: each algorithmic choice is a small named function.

A harness names a built-in function (`advantage: grpo`) or supplies its own in its slot
file; `Registry.child()` gives a harness its own namespace so its functions never leak
into another harness loaded in the same process.
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from evotrainer.errors import UsageError, unknown

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    def __init__(self, slot: str, parent: "Registry[F] | None" = None):
        self.slot = slot
        self._fns: dict[str, F] = {}
        self._parent = parent

    def register(self, name: str | None = None) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            key = name or fn.__name__
            if key in self._fns:
                raise UsageError(f"{self.slot} '{key}' is defined twice")
            self._fns[key] = fn
            return fn
        return deco

    def get(self, name: str) -> F:
        if name in self._fns:
            return self._fns[name]
        if self._parent is not None and name in self._parent.names():
            return self._parent.get(name)
        raise unknown(self.slot, name, self.names())

    def names(self) -> list[str]:
        inherited = self._parent.names() if self._parent else []
        return sorted(set(inherited) | set(self._fns))

    def child(self) -> "Registry[F]":
        return Registry(self.slot, parent=self)
