"""The diagnostics a harness runs: the built-in library plus its own `diagnostics.py`.

In `diagnostics.py`, a `@diagnostic(...)` object adds a diagnostic, or replaces the
built-in of the same name (a revised threshold or definition); a plain public function
is a metric without thresholds (layer `custom`). Reading the file runs harness code,
so this runs only in a worker process.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from evotrainer.diagnostics.spec import DIAGNOSTICS, LAYERS, Diagnostic
from evotrainer.errors import HarnessFailed
from evotrainer.executors import run_in_worker
from evotrainer.harness.legality import check_harness
from evotrainer.harness.load import exec_harness_file, public_functions


def harness_diagnostics(harness_dir: Path | str | None = None) -> dict[str, Diagnostic]:
    """name -> Diagnostic, in layer order; the built-ins alone when there is no diagnostics.py."""
    import evotrainer.diagnostics.library  # noqa: F401  (registers the built-ins)
    reg = DIAGNOSTICS.child()
    file = Path(harness_dir) / "diagnostics.py" if harness_dir is not None else None
    if file is not None and file.is_file():
        module = exec_harness_file(file)
        for obj in vars(module).values():
            if isinstance(obj, Diagnostic) and getattr(obj.fn, "__module__", None) == module.__name__:
                reg.register(obj.name)(obj)
        for name, fn in public_functions(module).items():
            doc = (fn.__doc__ or "").strip().splitlines()
            reg.register(name)(Diagnostic(name, "custom", fn, summary=doc[0] if doc else ""))
    diags = {n: reg.get(n) for n in reg.names()}
    return dict(sorted(diags.items(), key=lambda kv: LAYERS.index(kv[1].layer)))


def evidence_files(evidence_dir: Path | str) -> tuple[str, ...]:
    """What a diagnostic reads of a train directory (load_evidence): never its checkpoints."""
    return tuple(str(Path(evidence_dir, f)) for f in ("evidence.jsonl", "metrics.jsonl"))


def run_diagnostics(target: Callable[..., Any], kwargs: dict, harness_dir: Path | str | None, timeout_s: float,
                    reads: tuple[str, ...] = ()):
    """Call `target(**kwargs)` (a module-level function), a computation over a harness's diagnostics.

    With no diagnostics.py in the harness it runs only our own code, in place. Otherwise
    the harness is checked for legality and the call runs in a worker that sees the harness
    and `reads`; a refusal or a failure raises HarnessFailed with its label and the log tail.
    """
    if harness_dir is None or not (Path(harness_dir) / "diagnostics.py").is_file():
        return target(**kwargs)
    verdict = check_harness(harness_dir)
    if not verdict.legal:
        raise HarnessFailed("illegal", "; ".join(verdict.reasons))
    res = run_in_worker(target, kwargs, timeout_s=timeout_s, reads=(str(harness_dir), *reads))
    if not res.ok:
        raise HarnessFailed(res.label, f"diagnostics of {harness_dir}: {res.error}", res.log_tail)
    return res.value
