"""Named registries: each choice (a slot's function, a built-in task) is found by its name.

A harness names a built-in function (`advantage: grpo`) or supplies its own in its slot
file; `Registry.child()` gives a harness its own namespace so its functions never leak
into another harness loaded in the same process. Tasks register one entry per file
(tasks/registry.py). This module sits at the bottom of the package (it imports only
errors) so that any layer, tasks as well as harness, can keep a registry.
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from evotrainer.errors import UsageError, unknown

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, slot: str, parent: "Registry[T] | None" = None):
        self.slot = slot
        self._entries: dict[str, T] = {}
        self._parent = parent

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise UsageError(f"{self.slot} '{name}' is defined twice")
        self._entries[name] = entry
        return entry

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """A decorator: the function under its own name, or under `name`."""
        return lambda fn: self.add(name or fn.__name__, fn)

    def get(self, name: str) -> T:
        if name in self._entries:
            return self._entries[name]
        if self._parent is not None and name in self._parent.names():
            return self._parent.get(name)
        raise unknown(self.slot, name, self.names())

    def names(self) -> list[str]:
        inherited = self._parent.names() if self._parent else []
        return sorted(set(inherited) | set(self._entries))

    def child(self) -> "Registry[T]":
        return Registry(self.slot, parent=self)
