"""The diagnostics a harness runs: the built-in library plus its own `diagnostics.py`.

In `diagnostics.py`, a `@diagnostic(...)` object adds a diagnostic, or replaces the
built-in of the same name (a revised threshold or definition); a plain public function
is a metric without thresholds (layer `custom`). Reading the file runs harness code,
so this runs only in a worker process.
"""
from __future__ import annotations

from pathlib import Path

from evotrainer.diagnostics.spec import DIAGNOSTICS, LAYERS, Diagnostic
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
