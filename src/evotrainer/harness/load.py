"""A harness is a directory: `knobs.yaml` plus optional slot files.

Slot files (`reward.py`, `group_filter.py`, `advantage.py`, `loss_agg.py`,
`policy_loss.py`, `curriculum.py`, `action_parser.py`) define plain functions; each public function becomes
a name the knobs can pick, next to the built-in ones. `diagnostics.py` adds or revises
diagnostics (evotrainer.diagnostics.load reads it). The reference harness ships in
the package (`evotrainer/recipes/reference`) and is the root of every run.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from evotrainer.harness.actions import ACTION_PARSERS
from evotrainer.errors import UsageError, unknown
from evotrainer.harness.advantages import ADVANTAGES
from evotrainer.harness.curriculum import CURRICULA
from evotrainer.harness.filters import GROUP_FILTERS
from evotrainer.harness.knobs import Knobs, load_knobs
from evotrainer.harness.losses import KL_ESTIMATORS, LOSS_AGGS, POLICY_LOSSES
from evotrainer.harness.registry import Registry
from evotrainer.harness.rewards import REWARDS

REFERENCE = Path(__file__).resolve().parent.parent / "recipes" / "reference"
# knob naming the slot -> built-in registry
SLOTS: dict[str, Registry] = {
    "reward": REWARDS, "group_filter": GROUP_FILTERS, "advantage": ADVANTAGES,
    "policy_loss": POLICY_LOSSES, "loss_agg": LOSS_AGGS, "kl_estimator": KL_ESTIMATORS,
    "curriculum": CURRICULA, "action_parser": ACTION_PARSERS,
}


@dataclass(frozen=True)
class Harness:
    path: Path
    knobs: Knobs
    fns: dict          # slot -> the resolved function
    content_hash: str  # sha256 over the harness files, names and bytes

    def __getattr__(self, slot):  # harness.reward, harness.advantage, ...
        fns = object.__getattribute__(self, "fns")
        if slot in fns:
            return fns[slot]
        raise AttributeError(slot)


def content_hash(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(f.relative_to(path)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def exec_harness_file(file: Path) -> ModuleType:
    """Import one harness file as a module of its own (this runs its code: workers only)."""
    spec = importlib.util.spec_from_file_location(f"evotrainer_harness_{file.stem}_{abs(hash(file))}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise UsageError(f"{file}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # the harness's own code failed while importing
        raise UsageError(f"{file}: {type(e).__name__} while importing: {e}") from None
    return module


def public_functions(module: ModuleType) -> dict:
    """The functions a harness file defines itself (not imported, not _private)."""
    return {n: f for n, f in vars(module).items()
            if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == module.__name__}


def _slot_functions(file: Path) -> dict:
    return public_functions(exec_harness_file(file))


def load_harness(path: Path | str | None = None) -> Harness:
    path = Path(path) if path is not None else REFERENCE
    if not (path / "knobs.yaml").is_file():
        raise UsageError(f"not a harness directory: '{path}' has no knobs.yaml")
    knobs = load_knobs(path / "knobs.yaml")
    fns = {}
    for slot, builtin in SLOTS.items():
        reg = builtin.child()
        file = path / f"{slot}.py"
        if file.is_file():
            for name, fn in _slot_functions(file).items():
                reg.register(name)(fn)
        fn = reg.get(getattr(knobs, slot))
        # a slot that keeps state across steps (an EMA threshold) is an object with fresh():
        # every load gets its own, so no state leaks between segments or harnesses in a process
        fns[slot] = fn.fresh() if hasattr(fn, "fresh") else fn
    return Harness(path=path, knobs=knobs, fns=fns, content_hash=content_hash(path))


def inspect_harness(path: Path | str | None = None) -> Knobs:
    """Validate a harness without running any of its code (the controller's check).

    Knobs are parsed, slot files are parsed (not imported) to learn which functions they
    define, and every slot the knobs name must be built in or defined there. Loading, and
    so running, the harness's code happens only in a worker (`load_harness`).
    """
    path = Path(path) if path is not None else REFERENCE
    if not (path / "knobs.yaml").is_file():
        raise UsageError(f"not a harness directory: '{path}' has no knobs.yaml")
    knobs = load_knobs(path / "knobs.yaml")
    for slot, builtin in SLOTS.items():
        file, defined = path / f"{slot}.py", set()
        if file.is_file():
            try:
                tree = ast.parse(file.read_text(), filename=str(file))
            except SyntaxError as e:
                raise UsageError(f"{file}:{e.lineno}: syntax error: {e.msg}") from None
            defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
        name = getattr(knobs, slot)
        if name not in defined and name not in builtin.names():
            raise unknown(slot, name, set(builtin.names()) | defined)
    return knobs
