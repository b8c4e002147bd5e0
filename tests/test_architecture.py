"""The import rules of docs/architecture.md hold on the source: layers only reach down, no
import circles, every top-level module placed in a layer; and every import of ours names
something that exists, deferred ones included."""
import ast
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _metrics():
    spec = importlib.util.spec_from_file_location("layout_metrics", ROOT / "scripts" / "layout_metrics.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


METRICS = _metrics()


def layers() -> dict[str, int]:
    """The ```layers block of docs/architecture.md: `N  name name ...` per line."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S).group(1)
    out = {}
    for line in block.strip().splitlines():
        n, *names = line.split()
        for name in names:
            out["evotrainer" if name == "__init__" else f"evotrainer.{name}"] = int(n)
    return out


def top(module: str) -> str:
    return ".".join(module.split(".")[:2])


ROOMS = sorted(layers(), key=len, reverse=True)


def room(module: str) -> str:
    """The layer table's entry a module belongs to: the longest one it is or lies inside (a room
    such as evotrainer.evolve.stats, else its top-level package or module)."""
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), top(module))


def test_every_top_level_module_has_a_layer():
    placed = layers()
    missing = sorted({top(m) for m in METRICS.modules()} - set(placed))
    assert not missing, f"place these in docs/architecture.md's layer table: {missing}"
    stale = sorted(set(placed) - {room(m) for m in METRICS.modules()})
    assert not stale, f"the layer table names modules that do not exist: {stale}"


def test_imports_only_reach_down():
    """Between top-level packages, and between the rooms of one (evolve.stats below evolve.segments)."""
    rank = layers()
    upward = [f"{m} -> {d} (layer {rank[room(m)]} -> {rank[room(d)]})"
              for m, deps in METRICS.graph().items() for d in deps
              if room(m) != room(d) and rank[room(d)] >= rank[room(m)]]
    assert not upward, "imports that reach up or sideways:\n" + "\n".join(sorted(upward))


def test_no_import_circles():
    g = METRICS.graph()
    assert METRICS.circles(g) == []
    assert METRICS.circles(METRICS.package_graph(g)) == []


def test_the_rules_would_catch_a_circle_and_an_upward_import(tmp_path):
    """The checker itself: a made-up package with a circle and an upward import."""
    pkg = tmp_path / "evotrainer"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("from evotrainer.low import b\n")
    (pkg / "low" / "b.py").write_text("def f():\n    from evotrainer.low.a import x\n    from evotrainer import high\n")
    (pkg / "high.py").write_text("from evotrainer.low.a import x\n")
    g = METRICS.graph(tmp_path)
    assert METRICS.circles(g) == [["evotrainer.high", "evotrainer.low.a", "evotrainer.low.b"]]
    assert "evotrainer.high" in g["evotrainer.low.b"]


def _top_level_names(tree: ast.Module) -> set[str]:
    """What a module binds at its top (inside top-level if/try too): what `from it import x` may name."""
    out, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
            todo += [c for h in getattr(node, "handlers", ()) for c in h.body]
    return out


def test_every_import_of_ours_names_something_that_exists():
    """A deferred import (inside a function) fails only when that function runs: a module or a
    name moved without its importers is caught here, from the source, instead."""
    mods = METRICS.modules()
    names = {m: _top_level_names(ast.parse(p.read_text())) for m, p in mods.items()}
    missing = []
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "evotrainer":
                if node.module not in mods:
                    missing.append(f"{m}:{node.lineno} imports {node.module}, which does not exist")
                    continue
                missing += [f"{m}:{node.lineno} imports {a.name} from {node.module}, which has none"
                            for a in node.names if a.name not in names[node.module] and f"{node.module}.{a.name}" not in mods]
            elif isinstance(node, ast.Import):
                missing += [f"{m}:{node.lineno} imports {a.name}, which does not exist"
                            for a in node.names if a.name.split(".")[0] == "evotrainer" and a.name not in mods]
    assert not missing, "\n".join(missing)
