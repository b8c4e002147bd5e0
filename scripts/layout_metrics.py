"""How the house is laid out, from the source alone: the longest files and classes, import
circles between modules, worker job targets written as strings, string-keyed reads of lineage
event payloads and of trial outcomes, functions taking many positional arguments, and the
files of each room.

    python scripts/layout_metrics.py              # prints the numbers and what they count
    python scripts/layout_metrics.py --positional # and lists every function counted as taking
                                                  # more than 5 positional arguments, file:line

Import circles are strongly connected components of the module import graph (imports anywhere
in a module, deferred ones included: a deferred import hides a circle from Python, not from the
reader). A job target written as a string is a "package.module:function" string literal
anywhere, or any string as the target of `Call`, `run_in_worker` or `run_diagnostics`
(`target_args`: the tests resolve the others, the functions). An event payload read is
`x["key"]` or `x.get("key")` where x came from `store.events(...)` in the same function. An
outcome read is `t.fitness["key"]`, `t.fitness.get("key")` or `"key" in t.fitness`: a trial's
fitness is a typed record (lineage/fitness.py). A function's positional arguments are the
parameters a caller may pass by position (self and cls not counted).
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


def outcome_reads(src: Path = SRC) -> list[tuple[str, int]]:
    def is_fitness(e: ast.expr) -> bool:
        return isinstance(e, ast.Attribute) and e.attr == "fitness"
    out = []
    for m, p in modules(src).items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Subscript) and is_fitness(node.value) \
                    or isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "get" and is_fitness(node.func.value) \
                    or isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) \
                    and any(is_fitness(c) for c in node.comparators):
                out.append((m, node.lineno))
    return out


def positional_heavy_sites(src: Path = SRC, over: int = 5) -> list[tuple[int, str, str]]:
    """(positional parameters, module.function, file:line) for each function taking more than
    `over`, most first."""
    out = []
    for m, p in modules(src).items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
                if len(names) > over:
                    where = f"{p.relative_to(src.parent).as_posix()}:{node.lineno}"
                    out.append((len(names), f"{m}.{node.name}", where))
    return sorted(out, key=lambda t: (t[0], t[1]), reverse=True)


def positional_heavy(src: Path = SRC, over: int = 5) -> list[tuple[int, str]]:
    """(positional parameters, module.function) for each function taking more than `over`."""
    return [(n, f) for n, f, _ in positional_heavy_sites(src, over)]


def classes(src: Path = SRC) -> list[tuple[int, int, str]]:
    """(lines, methods, module.Class) per class, longest first."""
    out = []
    for m, p in modules(src).items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                out.append((node.end_lineno - node.lineno + 1, methods, f"{m}.{node.name}"))
    return sorted(out, reverse=True)


def rooms(src: Path = SRC) -> dict[str, int]:
    """Files (modules) per package directory of the package, as `evotrainer.evolve`."""
    out: dict[str, int] = {}
    for p in (src / PACKAGE).rglob("*.py"):
        room = ".".join(p.parent.relative_to(src).parts)
        out[room] = out.get(room, 0) + 1
    return out


def main() -> None:
    mods = modules()
    lengths = sorted(((len(p.read_text().splitlines()), m) for m, p in mods.items()), reverse=True)
    print("longest files: " + ", ".join(f"{m} {n}" for n, m in lengths[:3]))
    print("longest classes: " + ", ".join(f"{c} {n} lines, {k} methods" for n, k, c in classes()[:3]))
    cs = circles(graph())
    print(f"import circles: {len(cs)}" + "".join(f"\n  {' <-> '.join(c)}" for c in cs))
    pcs = circles(package_graph(graph()))
    print(f"circles between top-level packages: {len(pcs)}" + "".join(f"\n  {' <-> '.join(c)}" for c in pcs))
    targets = job_target_strings()
    print(f"job targets written as strings: {len(targets)} ({len({t for _, t in targets})} distinct)")
    reads = event_payload_reads()
    print(f"string-keyed event payload reads: {len(reads)} in "
          + ", ".join(sorted({m.removeprefix(PACKAGE + '.') for m, _, _ in reads})))
    outcomes = outcome_reads()
    print(f"string-keyed outcome reads: {len(outcomes)} in "
          + ", ".join(sorted({m.removeprefix(PACKAGE + '.') for m, _ in outcomes})))
    heavy = positional_heavy()
    print(f"functions with more than 5 positional arguments: {len(heavy)}; most: "
          + ", ".join(f"{f.removeprefix(PACKAGE + '.')} {n}" for n, f in heavy[:3]))
    if "--positional" in sys.argv[1:]:
        for n, f, where in positional_heavy_sites():
            print(f"  {n:2d}  {f.removeprefix(PACKAGE + '.')}  {where}")
    biggest = sorted(rooms().items(), key=lambda kv: -kv[1])[:4]
    print("files per room: " + ", ".join(f"{r.removeprefix(PACKAGE + '.')} {n}" for r, n in biggest))


if __name__ == "__main__":
    main()
