"""Built-in tasks by name, and the resolver of every task spec form.

Each built-in task or environment registers one `Builtin` at the end of its own file
(reasoning-gym style). The registry lives here, in tasks, so that environments (envs/,
above tasks) register into it without tasks ever importing envs; the module that imports
every built-in so that all are registered sits above both (evotrainer.catalog, where
`get_task` lives). `resolve` takes the registry as an argument: what it knows by name is
exactly what its caller loaded, never whatever some earlier import happened to register.
"""
from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from typing import Callable

from evotrainer.errors import UsageError, unknown
from evotrainer.registry import Registry
from evotrainer.tasks.base import Task
from evotrainer.tasks import user
from evotrainer.tasks.spec import GENERIC_KEYS, Spec, canonical, parse_spec


@dataclass(frozen=True)
class Option:
    """A query key a built-in takes: one of `choices`; absent means `default`, which the
    canonical spec leaves out (`vault` and `vault?tool=on` are one task)."""
    key: str
    choices: tuple[str, ...]
    default: str

    def pick(self, s: Spec) -> str:
        value = s.query.get(self.key, self.default)
        if value not in self.choices:
            raise UsageError(f"{self.key} must be {' or '.join(self.choices)}, got '{value}' in task spec '{s.raw}'")
        return value


@dataclass(frozen=True)
class Builtin:
    name: str                        # the whole spec base: `vault`
    build: Callable[..., Task]       # build(level, **{option.key: value}); a ValueError is the user's
    options: tuple[Option, ...] = ()

    @property
    def form(self) -> str:
        """As help and the unknown-task error show it: `vault[?tool=on|off]`."""
        return self.name + "".join(f"[?{o.key}={'|'.join(o.choices)}]" for o in self.options)


TASKS: Registry[Builtin] = Registry("task")


def register(entry: Builtin) -> Builtin:
    return TASKS.add(entry.name, entry)


Resolved = tuple[Task, str, dict[str, object]]  # the task, its canonical base and query


@dataclass(frozen=True)
class Family:
    """`PREFIX:rest`, an open set of names that an adapter outside tasks/ resolves (an
    environment library's: `textarena:GuessTheNumber-v0`). `resolve(rest, spec, level)`
    returns the task with its canonical base and query; it imports its library only then."""
    prefix: str
    form: str                                            # as help and errors show it
    resolve: Callable[[str, Spec, int | None], Resolved]


FAMILIES: Registry[Family] = Registry("task family")


def register_family(entry: Family) -> Family:
    return FAMILIES.add(entry.prefix, entry)


# Families: a prefix or a shape over an open set of names (any reasoning-gym family, any
# file, any importable factory, any installed entry point), so they cannot be registry
# entries; each is a small resolver below, and these are their forms in help and errors.
FAMILY_FORMS = ("rg:<family>", "rg:composite[?families=a,b:2]", "jsonl:PATH[?verifier=exact|numeric|math]",
                "module:Factory", "file.py:Factory")


def resolve(spec: str, level: int | None, builtins: Registry[Builtin],
            families: Registry[Family] | None = None) -> Task:
    """The task `spec` names at `level`: a name in `builtins`, a `PREFIX:` of `families`,
    else one of the families below. Its `spec` is set canonical (see evotrainer.catalog.get_task)."""
    s = parse_spec(spec)
    budget = s.max_new_tokens()   # checked before building: a bad value should not wait on a slow task
    head, colon, rest = s.base.partition(":")
    if s.base in builtins.names():
        task, base, query = _builtin(builtins.get(s.base), s, level)
    elif colon and families is not None and head in families.names():
        task, base, query = families.get(head).resolve(rest, s, level)
    else:
        task, base, query = _family(s, level, builtins, families)
    if budget is not None:
        task.max_new_tokens = budget
    task.spec = canonical(base, query)
    return task


def _builtin(entry: Builtin, s: Spec, level: int | None) -> Resolved:
    s.check_keys(GENERIC_KEYS + tuple(o.key for o in entry.options))
    picked = {o.key: o.pick(s) for o in entry.options}
    try:
        task = entry.build(level, **picked)
    except ValueError as e:
        raise UsageError(str(e)) from None
    query: dict[str, object] = {k: s.query[k] for k in GENERIC_KEYS if k in s.query}
    query |= {o.key: picked[o.key] for o in entry.options if picked[o.key] != o.default}
    return task, s.base, query


def _family(s: Spec, level: int | None, builtins: Registry[Builtin], families: Registry[Family] | None) -> Resolved:
    base = s.base
    query: dict[str, object] = dict(s.query)
    if base.startswith("rg:"):
        from evotrainer.tasks import reasoning_gym as rg  # imports reasoning-gym: only when asked
        family = base[3:]
        s.check_keys(GENERIC_KEYS + (rg.QUERY_KEYS if family == "composite" else ()))
        mix = rg.parse_mix(s.query.get("families")) if family == "composite" else None
        if mix is not None:
            query["families"] = rg.mix_text(mix)  # explicit: the spec means one mix forever
        return rg.ReasoningGymTask(family, level, mix=mix), base, query
    if base.startswith("jsonl:"):
        from evotrainer.tasks import jsonl
        s.check_keys(GENERIC_KEYS + jsonl.QUERY_KEYS)
        task = jsonl.make(base, s.query, level)
        query["verifier"] = task.config.verifier  # explicit, and the path absolute
        query["rows"] = None if task.config.rows == "all" else task.config.rows
        return task, f"jsonl:{task.config.path}", query
    s.check_keys(GENERIC_KEYS)
    if ":" in base:
        factory, base = user.file_target(base) if user.is_file_spec(base) else user.module_target(base)
    else:
        factory = user.entry_point_target(base)
        if factory is None:
            forms = [builtins.get(n).form for n in builtins.names()] + list(FAMILY_FORMS)
            forms += [families.get(n).form for n in families.names()] if families is not None else []
            raise unknown("task", base, forms + user.entry_point_names())
    return user.build(factory, level, base), base, query


def user_code_files(spec: str) -> tuple[str, ...]:
    """The files whose bytes make the task a canonical spec names where its code is the user's:
    a `file.py:Factory`'s file, a `module:Factory`'s or an entry point's module (a package: all
    its .py files); an environment family's (`trl-env:module:Class`) likewise. Nothing for a
    built-in task or a data file's (this package's code: a cache key holds its digest). A key
    that holds these changes when the user edits their task under the same spec."""
    base = parse_spec(spec).base
    head, colon, rest = base.partition(":")
    if colon and head in ("rg", "jsonl"):
        return ()
    if colon and head in FAMILIES.names():
        base = rest  # a family names a factory the way a user task does, or a name of its own
    if ":" not in base:
        found = importlib.metadata.entry_points(group=user.ENTRY_POINT_GROUP).select(name=base)
        return user.module_files(next(iter(found)).module) if found else ()
    left, _, attr = base.rpartition(":")
    if not left or not attr:
        return ()
    if user.is_file_spec(base):
        return (left,) if os.path.isfile(left) else ()
    return user.module_files(left)
