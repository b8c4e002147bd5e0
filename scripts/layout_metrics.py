"""How the house is laid out, from the source alone: the longest files, import circles between
modules, worker job targets written as strings, and string-keyed reads of lineage event payloads.

    python scripts/layout_metrics.py            # prints the four numbers and what they count

Import circles are strongly connected components of the module import graph (imports anywhere
in a module, deferred ones included: a deferred import hides a circle from Python, not from the
reader). A job target written as a string is a "package.module:function" string literal
anywhere, or any string as the target of `Call`, `run_in_worker` or `run_diagnostics`
(`target_args`: the tests resolve the others, the functions). An event payload read is
`x["key"]` or `x.get("key")` where x came from `store.events(...)` in the same function.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "evotrainer"
TARGET = re.compile(rf"^{PACKAGE}(\.\w+)+:\w+$")
TAKERS = ("Call", "run_in_worker", "run_diagnostics")  # each takes a job's target first


def modules(src: Path = SRC) -> dict[str, Path]:
    out = {}
    for p in sorted((src / PACKAGE).rglob("*.py")):
        parts = p.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports (a `from pkg import sub` counts as pkg.sub)."""
    tree, out = ast.parse(path.read_text()), set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for f in found:
            while f and f not in known:  # a name inside a module: the module
                f = f.rpartition(".")[0]
            if f and f != name and f.startswith(PACKAGE):
                out.add(f)
    return out


def graph(src: Path = SRC) -> dict[str, set[str]]:
    mods = modules(src)
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def circles(g: dict[str, set[str]], within=lambda m: True) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), over the modules
    `within` accepts. A package's __init__ re-exporting its modules is not a circle of its own:
    edges from a package to its own submodules are left out."""
    g = {m: {d for d in ds if within(d) and not d.startswith(m + ".")} for m, ds in g.items() if within(m)}
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between the package's top-level parts (evotrainer.tasks, evotrainer.cli)."""
    top = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
    out: dict[str, set[str]] = {}
    for m, ds in g.items():
        out.setdefault(top(m), set()).update(top(d) for d in ds if top(d) != top(m))
    return out


def target_args(call: ast.Call) -> list[ast.expr]:
    """The target argument of a call to a taker (`run_in_worker(f, ...)`, `executors.Call(f)`,
    `target=f`): normally a function's name, which the tests resolve and import."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
    return call.args[:1] + [k.value for k in call.keywords if k.arg == "target"] if name in TAKERS else []


def job_target_args(tree: ast.AST) -> list[ast.expr]:
    return [a for node in ast.walk(tree) if isinstance(node, ast.Call) for a in target_args(node)]


def job_target_strings(src: Path = SRC) -> list[tuple[str, str]]:
    out = []
    for m, p in modules(src).items():
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and TARGET.match(node.value):
                out.append((m, node.value))
        for arg in job_target_args(tree):
            if isinstance(arg, ast.JoinedStr) or (isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                                                  and not TARGET.match(arg.value)):  # (those counted above)
                out.append((m, ast.unparse(arg)))
    return out


def event_payload_reads(src: Path = SRC) -> list[tuple[str, int, str]]:
    out = []
    for m, p in modules(src).items():
        for fn in ast.walk(ast.parse(p.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            from_events = set()
            for node in ast.walk(fn):
                src_expr, targets = None, []
                if isinstance(node, ast.Assign):
                    src_expr, targets = node.value, node.targets
                elif isinstance(node, ast.comprehension):
                    src_expr, targets = node.iter, [node.target]
                elif isinstance(node, ast.For):
                    src_expr, targets = node.iter, [node.target]
                if src_expr is not None and any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                                                and c.func.attr == "events" for c in ast.walk(src_expr)):
                    from_events |= {t.id for tg in targets for t in ast.walk(tg) if isinstance(t, ast.Name)}
            for node in ast.walk(fn):
                key = None
                if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                        and isinstance(node.slice.value, str):
                    base, key = node.value, node.slice.value
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                        and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    base, key = node.func.value, node.args[0].value
                if key is None:
                    continue
                while isinstance(base, ast.Subscript):  # started[0]["base"]
                    base = base.value
                if isinstance(base, ast.Name) and base.id in from_events:
                    out.append((m, node.lineno, key))
    return out


def main() -> None:
    mods = modules()
    lengths = sorted(((len(p.read_text().splitlines()), m) for m, p in mods.items()), reverse=True)
    print("longest files: " + ", ".join(f"{m} {n}" for n, m in lengths[:3]))
    cs = circles(graph())
    print(f"import circles: {len(cs)}" + "".join(f"\n  {' <-> '.join(c)}" for c in cs))
    pcs = circles(package_graph(graph()))
    print(f"circles between top-level packages: {len(pcs)}" + "".join(f"\n  {' <-> '.join(c)}" for c in pcs))
    targets = job_target_strings()
    print(f"job targets written as strings: {len(targets)} ({len({t for _, t in targets})} distinct)")
    reads = event_payload_reads()
    print(f"string-keyed event payload reads: {len(reads)} in "
          + ", ".join(sorted({m.removeprefix(PACKAGE + '.') for m, _, _ in reads})))


if __name__ == "__main__":
    main()
