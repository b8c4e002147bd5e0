"""Every job's target is a function a worker can import by its name. The call sites are
collected from the source (`Call(f, ...)`, `run_in_worker(f, ...)`, `run_diagnostics(f, ...)`:
layout_metrics.target_args), each target resolved through the imports in scope where it is
named (deferred ones included), imported, and named by executors.target_of: a rename that
misses a caller fails here, not in a worker at run time."""
import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

from evotrainer.executors import Call, target_of
from evotrainer.executors.targets import resolve
from evotrainer.trainer.backends import BACKENDS

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("layout_metrics", ROOT / "scripts" / "layout_metrics.py")
METRICS = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(METRICS)
FORWARDED = "forwarded"  # a taker's own parameter, handed on (run_in_worker -> Call): its callers are checked


def _imports(nodes) -> dict[str, tuple[str, str | None]]:
    """name -> (module, attribute) for `from m import a`, (module, None) for `import m`."""
    out = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            out |= {a.asname or a.name: (node.module, a.name) for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.asname or a.name.split(".")[0]: (a.name if a.asname else a.name.split(".")[0], None)
                    for a in node.names}
    return out


def _outside_functions(tree: ast.AST):
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield node
            todo += ast.iter_child_nodes(node)


def job_targets(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, "module:attribute" or FORWARDED) of every job target named in a file; a target
    that is no importable name is an AssertionError naming its line."""
    tree = ast.parse(path.read_text())
    top = _imports(_outside_functions(tree))
    top |= {n.name: (module, n.name) for n in tree.body if isinstance(n, ast.FunctionDef)}
    out = []

    def visit(node: ast.AST, scope: dict) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
            scope = scope | {p: (FORWARDED, None) for p in params} | _imports(ast.walk(node))
        for arg in METRICS.target_args(node) if isinstance(node, ast.Call) else ():
            out.append((arg.lineno, _resolve(arg, scope, f"{path}:{arg.lineno}")))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, top)
    return out


def _resolve(arg: ast.expr, scope: dict, where: str) -> str:
    if isinstance(arg, ast.Name) and arg.id in scope:
        module, attr = scope[arg.id]
        if module == FORWARDED:
            return FORWARDED
        assert attr is not None, f"{where}: the target {arg.id} is a module, not a function"
        return f"{module}:{attr}"
    if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id in scope:
        module, attr = scope[arg.value.id]  # module.function
        return f"{module if attr is None else f'{module}.{attr}'}:{arg.attr}"
    raise AssertionError(f"{where}: a job's target must be a function imported by name, not {ast.unparse(arg)}")


def sources() -> list[tuple[Path, str]]:
    files = [(p, m) for m, p in METRICS.modules().items()]
    return files + [(p, p.stem) for p in sorted((ROOT / "bench").glob("*.py"))]


def test_every_job_target_imports_and_is_named_by_target_of():
    seen = {}
    for path, module in sources():
        for line, named in job_targets(path, module):
            if named != FORWARDED:
                seen.setdefault(named, f"{path.relative_to(ROOT)}:{line}")
    assert {"evotrainer.trainer.jobs:train_segment", "evotrainer.trainer.jobs:train_schedule",
            "evotrainer.evaluate.greedy:evaluate_checkpoints"} <= set(seen), sorted(seen)  # the collector works
    for named, where in seen.items():
        module, _, attr = named.partition(":")
        fn = getattr(importlib.import_module(module), attr, None)
        assert callable(fn), f"{where}: {named} is not a function of {module}"
        assert resolve(target_of(fn)) is fn, where  # what a worker imports is this function


def test_the_collector_resolves_deferred_imports_and_the_metric_counts_strings(tmp_path):
    site = tmp_path / "evotrainer" / "site.py"
    site.parent.mkdir()
    site.write_text("from evotrainer.executors import Call, run_in_worker\nimport platform\n\n"
                    "def run(target):\n    from evotrainer.trainer.jobs import train_segment as seg\n"
                    "    run_in_worker(target)\n    return Call(seg), Call(platform.python_version)\n")
    assert [n for _, n in job_targets(site, "site")] == [FORWARDED, "evotrainer.trainer.jobs:train_segment",
                                                        "platform:python_version"]
    assert METRICS.job_target_strings(tmp_path) == []
    site.write_text('from evotrainer.executors import Call, run_in_worker\n'
                    'run_in_worker("evotrainer.x:y")\nCall(target="worker_targets:add")\n')
    with pytest.raises(AssertionError, match="must be a function imported by name"):
        job_targets(site, "site")
    assert METRICS.job_target_strings(tmp_path) == [("evotrainer.site", "evotrainer.x:y"),
                                                    ("evotrainer.site", "'worker_targets:add'")]


def test_target_of_refuses_what_no_worker_could_import():
    def nested():
        pass
    for fn in (nested, lambda: 0, Call.named, "evotrainer.trainer.jobs:train_segment"):
        with pytest.raises(ValueError, match="module-level function"):
            Call(fn)
    assert target_of(resolve) == "evotrainer.executors.targets:resolve"


def test_every_backend_is_a_module_level_function():
    for name, backend in BACKENDS.items():
        assert resolve(target_of(backend.run)) is backend.run, name
