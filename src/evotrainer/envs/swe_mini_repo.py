"""swe-mini's repositories: generate a tiny Python package with unit tests, then break it.

    calc.py         def add(a, b):              test_calc.py    self.assertEqual(add(1, 4), 5)
                        return a - b            (visible: the tests the bug does not break)
                                                test_issue.py   self.assertEqual(add(2, 3), 5)
                                                (hidden: the tests the bug breaks)

Functions come from templates with random names and constants (arithmetic, a branch or a
loop, a few lines each). The bug is one AST mutation of one function (`KINDS`), kept only
when at least one test goes from pass to fail. Every mutation changes exactly one line,
so the fix is a one-line edit (`fix_edit`).

Expected values come from evaluating the original functions in this process: that is our
own template code (never a policy's), and its loops run over `range` or a short list, so a
mutant cannot loop forever either. Everything model-edited is judged in the sandbox
(swe_mini.py), never here.
"""
from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass
from typing import Any, Callable

KINDS = ("operator", "swap", "constant", "off_by_one", "condition", "return")
HIDDEN_PATH = "test_issue.py"   # the fail-to-pass tests: graded, never in the workspace
MODULE_NAMES = ("calc", "mathx", "nums", "ops", "util", "core", "tools", "geom", "logic", "numx")
PARAMS = (("a", "b"), ("x", "y"), ("m", "n"), ("p", "q"))
SINGLE = ("x", "n", "v", "k")
PROBES = 30          # extra inputs tried on the mutated function for more fail-to-pass tests
EXTRA_HIDDEN = 2     # at most this many of them join the hidden tests (the issue shows one)


@dataclass(frozen=True)
class Shape:
    """How big a level's repository is."""
    functions: tuple[int, int]   # how many functions (inclusive range)
    modules: tuple[int, int]     # how many module files (never more than functions)
    cases: int                   # tests per function
    max_chars: int               # the longest module file (a tiny model reads it whole)


SHAPES = {1: Shape((1, 2), (1, 1), 4, 150), 2: Shape((2, 3), (1, 2), 4, 400), 3: Shape((4, 6), (2, 3), 4, 900)}
LEVELS = tuple(SHAPES)


# ---------------------------------------------------------------------------------------
# Templates: each draws (names it may take, parameters, body, argument kinds).

@dataclass(frozen=True)
class Draft:
    names: tuple[str, ...]
    params: tuple[str, ...]
    body: str                    # indented lines, each ending in a newline
    args: tuple[str, ...]        # per parameter: a kind of `_arg`

    def source(self, name: str) -> str:
        return ast.unparse(ast.parse(f"def {name}({', '.join(self.params)}):\n{self.body}"))


def _binop(rng):
    op, names = rng.choice([("+", ("add", "plus", "sum2")), ("-", ("sub", "minus", "diff")),
                            ("*", ("mul", "times", "prod"))])
    a, b = rng.choice(PARAMS)
    return Draft(names, (a, b), f"    return {a} {op} {b}\n", ("int", "int"))


def _affine(rng):
    x, c, d = rng.choice(SINGLE), rng.randint(2, 5), rng.randint(1, 9)
    return Draft(("scale", "grow", "lift"), (x,), f"    return {x} * {c} + {d}\n", ("int",))


def _clip(rng):
    x, c = rng.choice(SINGLE), rng.randint(5, 9)
    return Draft(("clip", "cap", "upto"), (x,), f"    if {x} > {c}:\n        return {c}\n    return {x}\n", ("int",))


def _floor(rng):
    x, c = rng.choice(SINGLE), rng.randint(2, 6)
    return Draft(("least", "atleast", "lower"), (x,), f"    if {x} < {c}:\n        return {c}\n    return {x}\n",
                 ("int",))


def _bigger(rng):
    a, b = rng.choice(PARAMS)
    return Draft(("big", "most", "top"), (a, b), f"    if {a} > {b}:\n        return {a}\n    return {b}\n",
                 ("int", "int"))


def _total(rng):
    n = rng.choice(SINGLE)
    return Draft(("total", "tri", "upsum"), (n,),
                 f"    s = 0\n    for i in range({n}):\n        s = s + i\n    return s\n", ("count",))


def _multiples(rng):
    n, k = rng.choice(SINGLE), rng.randint(2, 4)
    return Draft(("count", "multiples", "hits"), (n,),
                 f"    c = 0\n    for i in range({n}):\n        if i % {k} == 0:\n            c = c + 1\n"
                 "    return c\n", ("count",))


def _sign(rng):
    x = rng.choice(SINGLE)
    return Draft(("sign", "signum", "sgn"), (x,),
                 f"    if {x} > 0:\n        return 1\n    if {x} < 0:\n        return -1\n    return 0\n", ("int",))


def _power(rng):
    x, n = rng.choice(PARAMS)
    return Draft(("power", "expo", "raised"), (x, n),
                 f"    r = 1\n    for i in range({n}):\n        r = r * {x}\n    return r\n", ("int", "small"))


def _gap(rng):
    a, b = rng.choice(PARAMS)
    return Draft(("dist", "gap", "absdiff"), (a, b),
                 f"    if {a} > {b}:\n        return {a} - {b}\n    return {b} - {a}\n", ("int", "int"))


def _list_sum(rng):
    return Draft(("lsum", "tally", "sumall"), ("xs",),
                 "    s = 0\n    for v in xs:\n        s = s + v\n    return s\n", ("list",))


def _list_max(rng):
    return Draft(("lmax", "largest", "peak"), ("xs",),
                 "    m = xs[0]\n    for v in xs:\n        if v > m:\n            m = v\n    return m\n", ("list",))


def _count_over(rng):
    t = rng.randint(0, 4)
    return Draft(("above", "over", "countbig"), ("xs",),
                 f"    c = 0\n    for v in xs:\n        if v > {t}:\n            c = c + 1\n    return c\n", ("list",))


def _between(rng):
    x, lo, hi = rng.choice(SINGLE), rng.randint(1, 4), rng.randint(6, 9)
    return Draft(("between", "inside", "within"), (x,), f"    return {lo} <= {x} and {x} <= {hi}\n", ("int",))


_BY_LEVEL: dict[int, tuple[Callable[[random.Random], Draft], ...]] = {
    1: (_binop, _affine, _clip, _floor, _bigger, _total),
    2: (_multiples, _sign, _power, _gap),
    3: (_list_sum, _list_max, _count_over, _between),
}
TEMPLATES = {level: sum((_BY_LEVEL[lv] for lv in LEVELS if lv <= level), ()) for level in LEVELS}
VARIANTS = 3 * 3 * 4 * 10  # an upper bound on the drafts of one template: names, params, constants


def _arg(rng: random.Random, kind: str, level: int):
    """One argument of a test, JSON data (a list for "list")."""
    if kind == "int":
        return rng.randint(0, 12) if level == 1 else rng.randint(-9, 15)
    if kind == "count":
        return rng.randint(0, 10)
    if kind == "small":
        return rng.randint(0, 4)
    return [rng.randint(-5, 9) for _ in range(rng.randint(1, 4))]


# ---------------------------------------------------------------------------------------
# The repository's data: what the environment and the grader need (Problem.entry).

@dataclass(frozen=True)
class Case:
    """One test: `module.function(*args) == expected`. Args are JSON text, so the frozen
    case holds no list."""
    module: str
    function: str
    args_json: str
    expected: Any

    @property
    def args(self) -> list:
        return json.loads(self.args_json)

    def call(self) -> str:
        return f"{self.function}({', '.join(map(repr, self.args))})"

    def assertion(self) -> str:
        return f"self.assertEqual({self.call()}, {self.expected!r})"


@dataclass(frozen=True)
class Mutation:
    kind: str        # one of KINDS
    path: str        # the mutated file
    line: int        # 1-based line of the change
    buggy: str       # that line as shipped (stripped)
    fixed: str       # that line before the mutation (stripped)


@dataclass(frozen=True)
class Repo:
    files: tuple[tuple[str, str], ...]     # the buggy repository as the policy gets it (path, text)
    modules: tuple[str, ...]               # paths of the code under test (what grading loads)
    original: tuple[tuple[str, str], ...]  # the fixed text of the mutated file
    visible: tuple[Case, ...]              # pass-to-pass: shipped in the test files
    hidden: tuple[Case, ...]               # fail-to-pass: HIDDEN_PATH, never in the workspace
    hidden_source: str
    mutation: Mutation
    issue: str

    def file(self, path: str) -> str:
        return dict(self.files)[path]

    @property
    def target(self) -> tuple[str, ...]:
        return (self.mutation.path,)

    def buggy_sources(self) -> dict[str, str]:
        return {p: self.file(p) for p in self.modules}

    def fixed_sources(self) -> dict[str, str]:
        return self.buggy_sources() | dict(self.original)


# ---------------------------------------------------------------------------------------
# Evaluating our own code in this process (templates and their mutants only).

def _namespace(source: str) -> dict:
    space: dict = {}
    exec(compile(source, "<template>", "exec"), space)  # noqa: S102 (our generated template code)
    return space


def _outcome(space: dict, function: str, args: list) -> tuple[bool, Any]:
    """(returned, value): the value, or the exception's type name."""
    try:
        return True, space[function](*json.loads(json.dumps(args)))
    except Exception as e:  # a mutant may raise (ZeroDivisionError, IndexError, TypeError)
        return False, type(e).__name__


def _passes(space: dict, case: Case) -> bool:
    returned, value = _outcome(space, case.function, case.args)
    return returned and type(value) is type(case.expected) and value == case.expected


# ---------------------------------------------------------------------------------------
# Mutations: sites in one function's AST, each a one-node change (so a one-line diff).

@dataclass(frozen=True)
class Site:
    kind: str
    node: int        # index of the node in ast.walk order of the function's module tree
    change: Any      # the new operator's class name, a new constant, or None


_FLIP = {"Add": "Sub", "Sub": "Add", "Mult": "Add", "Mod": "FloorDiv", "And": "Or", "Or": "And"}
_INVERT = {"Lt": "GtE", "GtE": "Lt", "Gt": "LtE", "LtE": "Gt", "Eq": "NotEq", "NotEq": "Eq"}
_STRICT = {"Lt": "LtE", "LtE": "Lt", "Gt": "GtE", "GtE": "Gt"}


def _sites(tree: ast.AST, rng: random.Random) -> list[Site]:
    out = []
    for i, node in enumerate(ast.walk(tree)):
        op = type(getattr(node, "op", None)).__name__
        if isinstance(node, (ast.BinOp, ast.BoolOp)) and op in _FLIP:
            out.append(Site("operator", i, _FLIP[op]))
        if isinstance(node, ast.BinOp) and op in ("Sub", "Mod"):
            out.append(Site("swap", i, None))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            cmp = type(node.ops[0]).__name__
            out.append(Site("condition", i, _INVERT[cmp]))
            out.append(Site("swap", i, None))
            if cmp in _STRICT:
                out.append(Site("off_by_one", i, _STRICT[cmp]))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            out.append(Site("constant", i, node.value + rng.choice((-3, -2, 2, 3))))
            out.append(Site("off_by_one", i, node.value + rng.choice((-1, 1))))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "range":
            out.append(Site("off_by_one", i, None))
        if isinstance(node, ast.Return):
            out.append(Site("return", i, None))
    return out


def _apply(source: str, site: Site) -> str:
    """The source with `site` mutated (ast.unparse: the same layout as the original's)."""
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    node = nodes[site.node]
    if site.kind == "return":
        parent = next(n for n in nodes if node in getattr(n, "body", ()) or node in getattr(n, "orelse", ()))
        body = parent.body if node in parent.body else parent.orelse
        body[body.index(node)] = ast.Pass()
    elif isinstance(node, ast.Constant):
        node.value = site.change
    elif isinstance(node, ast.Call):  # range(n) -> range(n + 1); range(a, n, s) -> range(a, n + 1, s)
        stop = 0 if len(node.args) == 1 else 1
        node.args[stop] = ast.BinOp(node.args[stop], ast.Add(), ast.Constant(1))
    elif site.kind == "swap" and isinstance(node, ast.BinOp):
        node.left, node.right = node.right, node.left
    elif site.kind == "swap":
        node.left, node.comparators = node.comparators[0], [node.left]
    elif isinstance(node, ast.Compare):
        node.ops = [getattr(ast, site.change)()]
    else:
        node.op = getattr(ast, site.change)()
    return ast.unparse(tree)


# ---------------------------------------------------------------------------------------
# Generation.

@dataclass
class _Function:
    module: str
    name: str
    draft: Draft
    source: str
    cases: list[Case]


def _functions(rng: random.Random, level: int) -> list[_Function]:
    """The repository's functions, spread over its modules, every module file short enough."""
    shape = SHAPES[level]
    while True:
        n = rng.randint(*shape.functions)
        modules = rng.sample(MODULE_NAMES, min(rng.randint(*shape.modules), n))
        templates = rng.sample(TEMPLATES[level], len(TEMPLATES[level]))  # no template twice, while there are others
        used: set[str] = set()
        out = []
        for i in range(n):
            draft = templates[i % len(templates)](rng)
            name = next((m for m in rng.sample(draft.names, len(draft.names)) if m not in used), None)
            name = name or f"{draft.names[0]}{i}"  # every name taken: a numbered one
            used.add(name)
            out.append(_Function(modules[i % len(modules)], name, draft, draft.source(name), []))
        if all(len(_module_source(out, m)) <= shape.max_chars for m in modules):
            return out


def _module_source(functions: list[_Function], module: str, replace: dict[str, str] | None = None) -> str:
    replace = replace or {}
    return "\n\n".join(replace.get(f.name, f.source) for f in functions if f.module == module) + "\n"


def _cases(rng: random.Random, f: _Function, level: int, *, n: int, space: dict, avoid=()) -> list[Case]:
    """Up to `n` tests of `f` on distinct inputs (not in `avoid`), expected from the original."""
    seen, out = set(avoid), []
    for _ in range(20 * n):
        args = json.dumps([_arg(rng, kind, level) for kind in f.draft.args])
        if args in seen:
            continue
        seen.add(args)
        returned, value = _outcome(space, f.name, json.loads(args))
        if returned:  # (the originals never raise on our inputs; the guard costs nothing)
            out.append(Case(f.module, f.name, args, value))
        if len(out) == n:
            break
    return out


def _mutate(rng: random.Random, functions: list[_Function], level: int) -> tuple | None:
    """A mutation that breaks at least one test: (function, site, mutated source, failing
    tests, a few new probes among them). Kinds in random order, so each kind comes up; within
    a kind, one that leaves a test passing if there is one (the workspace then ships a test)."""
    kinds = list(KINDS)
    rng.shuffle(kinds)
    candidates = [(f, s) for f in functions for s in _sites(ast.parse(f.source), rng)]
    rng.shuffle(candidates)
    total = sum(len(f.cases) for f in functions)
    for kind in kinds:
        fallback = None
        for f, site in (c for c in candidates if c[1].kind == kind):
            mutant = _apply(f.source, site)
            space = _namespace(mutant)
            failing = [c for c in f.cases if not _passes(space, c)]
            if failing and len(failing) < total:
                return _probed(rng, f, site, mutant=mutant, failing=failing, level=level)
            if failing and fallback is None:
                fallback = (f, site, mutant, failing)
        if fallback is not None:
            f, site, mutant, failing = fallback
            return _probed(rng, f, site, mutant=mutant, failing=failing, level=level)
    return None


def _probed(rng: random.Random, f: _Function, site: Site, *, mutant: str, failing: list[Case], level: int):
    """The mutation's failing tests, and up to EXTRA_HIDDEN more on new inputs that it fails
    (so that the issue's one example is not the whole of the hidden tests)."""
    space = _namespace(mutant)
    probes = _cases(rng, f, level, n=PROBES, space=_namespace(f.source), avoid={c.args_json for c in f.cases})
    return f, site, mutant, failing + [c for c in probes if not _passes(space, c)][:EXTRA_HIDDEN]


def generate(rng: random.Random, level: int) -> Repo:
    """A repository of `level` with one bug (deterministic from rng)."""
    while True:
        functions = _functions(rng, level)
        for f in functions:
            f.cases = _cases(rng, f, level, n=SHAPES[level].cases, space=_namespace(f.source))
        found = _mutate(rng, functions, level)
        if found is not None:
            return _repo(functions, *found)


def _repo(functions: list[_Function], bad: _Function, site: Site, mutant: str, failing: list[Case]) -> Repo:
    modules = list(dict.fromkeys(f.module for f in functions))
    path = f"{bad.module}.py"
    fixed = _module_source(functions, bad.module)
    buggy = _module_source(functions, bad.module, {bad.name: mutant})
    line = next(i for i, (a, b) in enumerate(zip(buggy.splitlines(), fixed.splitlines())) if a != b)
    mutation = Mutation(site.kind, path, line + 1, buggy.splitlines()[line].strip(), fixed.splitlines()[line].strip())
    hidden = tuple(failing)
    visible = tuple(c for f in functions for c in f.cases if c not in hidden)
    files = [(f"{m}.py", buggy if m == bad.module else _module_source(functions, m)) for m in modules]
    files += [(f"test_{m}.py", render_tests([c for c in visible if c.module == m], [m], m)) for m in modules]
    return Repo(files=tuple(sorted(files)), modules=tuple(sorted(f"{m}.py" for m in modules)),
                original=((path, fixed),), visible=visible, hidden=hidden,
                hidden_source=render_tests(list(hidden), [bad.module], "Issue"), mutation=mutation,
                issue=_issue(hidden[0], _namespace(mutant)))


def _issue(case: Case, mutant: dict) -> str:
    """The bug report: what the first failing test sees."""
    returned, value = _outcome(mutant, case.function, case.args)
    got = f"returns {value!r}" if returned else f"raises {value}"
    return f"{case.module}.{case.call()} {got}, expected {case.expected!r}"


def render_tests(cases: list[Case], modules: list[str], title: str) -> str:
    """A unittest file for `cases` (one test method per case)."""
    imports = [f"from {m} import {', '.join(sorted({c.function for c in cases if c.module == m}))}"
               for m in modules if any(c.module == m for c in cases)]
    methods = [f"    def test_{c.function}_{i}(self):\n        {c.assertion()}\n" for i, c in enumerate(cases, 1)]
    body = "\n".join(methods) if methods else "    pass\n"
    return "\n".join(["import unittest", *imports, "", "", f"class Test{title.title()}(unittest.TestCase):", body])


def fix_edit(repo: Repo) -> tuple[str, str]:
    """(old, new) of the one-line edit that reverts the mutation: the whole buggy line, with
    the lines above it as context while it is not unique in the file."""
    buggy, fixed = repo.file(repo.mutation.path).splitlines(), dict(repo.original)[repo.mutation.path].splitlines()
    i = repo.mutation.line - 1
    for start in range(i, -1, -1):
        old = "\n".join(buggy[start:i + 1]).lstrip()
        if repo.file(repo.mutation.path).count(old) == 1:
            return old, "\n".join(fixed[start:i + 1]).lstrip()
    raise AssertionError("a whole file is unique in itself")
