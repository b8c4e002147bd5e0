"""Tasks from outside the package: `package.module:Factory`, `path/to/file.py:Factory`, and
bare names registered under the `evotrainer.tasks` entry-point group.

A Factory is a `Task` subclass or any callable returning a `Task`. It is called as
`Factory(level=level)` when it takes a `level` parameter (or **kwargs), else `Factory()`.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evotrainer.errors import UsageError
from evotrainer.tasks.base import Task

ENTRY_POINT_GROUP = "evotrainer.tasks"


def is_file_spec(target: str) -> bool:
    """`x.py:F` or anything with a path separator left of the colon names a file."""
    return target.endswith(".py") or "/" in target or os.sep in target


def split_target(base: str) -> tuple[str, str]:
    """'left:Factory' at the LAST colon (a Windows path may hold one), both parts non-empty."""
    left, _, attr = base.rpartition(":")
    if not left or not attr:
        raise UsageError(f"task spec '{base}' must be module:Factory or file.py:Factory")
    return left, attr


def module_target(base: str) -> tuple[Callable[..., Any], str]:
    """Import `package.module` and fetch `Factory`; the canonical base is unchanged."""
    module, attr = split_target(base)
    if not all(part.isidentifier() for part in module.split(".")):
        raise UsageError(f"'{module}' in task spec '{base}' is neither a module name nor a .py file")
    # the CLI runs as a console script, whose sys.path holds its bin dir, not the cwd; a user's
    # `mytasks:make` next to them should import as it would under `python -m` (uvicorn does this)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # a user's module may fail in any way while importing
        raise UsageError(f"cannot import task module '{module}': {one_line(e)}") from e
    return _attr(mod, attr, base, f"module '{module}'"), base


def file_target(base: str) -> tuple[Callable[..., Any], str]:
    """Load `path/to/file.py` as a module and fetch `Factory`; the canonical base is absolute."""
    path, attr = split_target(base)
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise UsageError(f"task file not found: {path}")
    # one module per absolute path, registered so its classes pickle and a second get_task of
    # the same spec returns instances of the same classes
    name = "evotrainer_user_task_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"cannot load task file {path} as a Python module")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            del sys.modules[name]
            raise UsageError(f"cannot import task file {path}: {one_line(e)}") from e
    return _attr(mod, attr, base, path), f"{path}:{attr}"


def module_files(module: str) -> tuple[str, ...]:
    """A module's source file, or every .py file under a package's directory, found without
    importing it (`find_spec` gives an imported module's own); () where there is none."""
    if not all(part.isidentifier() for part in module.split(".")):
        return ()
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that fails to import, or no spec
        return ()
    if found is None:
        return ()
    if found.submodule_search_locations:
        return tuple(sorted(str(f) for d in found.submodule_search_locations for f in Path(d).rglob("*.py")
                            if "__pycache__" not in f.parts))
    return (found.origin,) if found.origin and os.path.isfile(found.origin) else ()


def entry_point_names() -> list[str]:
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def entry_point_target(name: str) -> Callable[..., Any] | None:
    """The factory registered as `name` in the entry-point group, or None if there is none."""
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP).select(name=name)
    ep = next(iter(found), None)
    if ep is None:
        return None
    try:
        return ep.load()
    except Exception as e:
        raise UsageError(f"task entry point '{name}' ({ep.value}) failed to load: {one_line(e)}") from e


def build(factory: Callable[..., Any], level: int | None, label: str) -> Task:
    """Call the factory (with `level` where it takes one) and check it made a Task."""
    if not callable(factory):
        raise UsageError(f"'{label}' is a {type(factory).__name__}, not a Task class or factory")
    takes_level = accepts_level(factory)
    try:
        task = factory(level=level) if takes_level else factory()
    except UsageError:
        raise
    except Exception as e:  # shown as one line; the chain keeps the traceback
        call = "(level=...)" if takes_level else "()"
        raise UsageError(f"task factory '{label}'{call} failed: {one_line(e)}") from e
    if not isinstance(task, Task):
        raise UsageError(f"task factory '{label}' returned a {type(task).__name__}, not an "
                         f"evotrainer.tasks.Task")
    # a factory without levels still rebuilds from (spec, its own target level): a worker
    # handed `task.target_level` back must not be refused
    if not takes_level and level is not None and level != getattr(task, "target_level", None):
        raise UsageError(f"task '{label}' takes no level (its factory has no 'level' parameter); "
                         f"got level {level}")
    return task


def accepts_level(factory: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == "level" and p.kind is not p.POSITIONAL_ONLY)
               for p in params)


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _attr(mod, attr: str, base: str, where: str) -> Any:
    """`attr` (dotted: `Outer.make` works) from the loaded module."""
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{where} has no attribute '{attr}' (task spec '{base}')")
        obj = getattr(obj, part)
    return obj
