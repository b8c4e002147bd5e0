"""Slot registries: each algorithmic choice is a small named function (the class lives in
evotrainer.registry, below tasks as well as harness; named here as the slot files know it)."""
from evotrainer.registry import Registry

__all__ = ["Registry"]
