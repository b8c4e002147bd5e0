"""A job's target: the function a worker runs, named across the process boundary.

Callers hand the executor the function itself (`Call(train_segment, ...)`), imported as any
other name, so an editor, the import graph and the tests follow it, and a rename breaks at
the import, not in a worker at run time. What crosses to the worker (its job.json, a Ray
task's argument) is plain JSON, so the function travels as "module:qualname" and the worker
imports it by that name: `target_of` makes the name, `resolve` is its inverse.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def target_of(fn: Callable[..., Any]) -> str:
    """"module:qualname" of a module-level function, which a fresh process can import by that
    name; a lambda, a method, a nested function or one defined in a script's __main__ cannot
    be, so it is refused here, in the caller, not in the worker."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not callable(fn) or not module or module == "__main__" or not name.isidentifier() \
            or getattr(sys.modules.get(module), name, None) is not fn:
        raise ValueError(f"a job's target must be a module-level function importable by its name, got {fn!r}")
    return f"{module}:{name}"


def resolve(target: str) -> Callable[..., Any]:
    """The worker side: the function `target_of` named."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
