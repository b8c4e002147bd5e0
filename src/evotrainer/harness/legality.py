"""Static legality of a candidate harness: may it run at all?

A version may change only harness files; it may not touch the evaluator (nor what it
measures or when: the checkpoint schedule is the run's), the data splits, the model size
or the compute budget. These checks never run the candidate's code: files are listed,
`knobs.yaml` is parsed as YAML, slot files are parsed into ASTs.

Static checks cannot prove Python harmless (an object can be aliased, a module reached
through another), so harness code also runs only in a worker process that holds no
validation or test data. What the checks do is turn every plain attempt into a named
reason, so the controller labels the candidate `illegal` before spending any compute.

Each rule is a small function; `FILE_RULES` run over the directory, `NODE_RULES` over
every AST node of every slot file. A reason is one line: `file[:line]: what, and why`.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Callable, Iterable, Iterator

import yaml

from evotrainer.errors import UsageError
from evotrainer.harness.knobs import FIELDS, Knobs, knobs_from_dict, load_knobs, measurement_refusal
from evotrainer.harness.load import SLOTS

SLOT_NAMES = tuple(dict.fromkeys([*SLOTS, "diagnostics"]))
HARNESS_FILES = frozenset({"knobs.yaml", *(f"{s}.py" for s in SLOT_NAMES)})
# fixed by the run: a child may not buy itself more compute (max_new_tokens may only fall)
BUDGET_KNOBS = ("steps", "prompts_per_step", "group_size", "max_new_tokens", "num_iterations")
# unknown knobs that would resize the model get the more specific reason
MODEL_SIZE_KNOBS = frozenset({
    "hidden_size", "d_model", "n_embd", "width", "layers", "n_layers", "num_layers",
    "n_layer", "num_hidden_layers", "depth", "heads", "n_heads", "n_head", "num_heads",
    "num_attention_heads", "intermediate_size", "d_ff", "ffn_dim", "vocab_size",
    "max_position_embeddings", "context_length", "block_size", "model", "model_size",
})

ALLOWED_MODULES = frozenset({
    "torch", "math", "re", "collections", "itertools", "functools", "dataclasses", "typing",
    "statistics", "string", "random", "heapq", "bisect", "__future__",
})
# pure code over plain data; harness diagnostics build on the diagnostics library
ALLOWED_EVOTRAINER = ("evotrainer.harness", "evotrainer.diagnostics")
# dotted prefix -> why it is off limits (checked before the allow-list, so torch.hub is out)
FORBIDDEN = {
    "evotrainer.evaluate": "the evaluator is off limits to harness code",
    "evotrainer.tasks": "task and split modules are off limits (a harness sees data only through rollouts)",
    "evotrainer.catalog": "task and split modules are off limits (a harness sees data only through rollouts)",
    "evotrainer.harness.load": "controller-side module (reads files, runs code)",
    "evotrainer.harness.versions": "controller-side module (runs git)",
    "evotrainer.harness.legality": "controller-side module",
    "evotrainer.diagnostics.health": "controller-side module (reads files, runs workers)",
    "evotrainer.diagnostics.load": "controller-side module (reads files, runs code)",
    "evotrainer.diagnostics.replay": "controller-side module (reads files, runs workers)",
    "evotrainer.harness.load_harness": "controller-side function (reads files, runs code)",
    "evotrainer.harness.inspect_harness": "controller-side function (reads files)",
    "evotrainer.harness.knobs.load_knobs": "controller-side function (reads files)",
    "torch.load": "file access is forbidden", "torch.save": "file access is forbidden",
    "torch.from_file": "file access is forbidden", "torch.package": "file access is forbidden",
    "torch.jit.load": "file access is forbidden", "torch.jit.save": "file access is forbidden",
    "torch.hub": "network access is forbidden", "torch.distributed": "network access is forbidden",
    "torch.multiprocessing": "spawning processes or threads is forbidden",
    "torch.utils.data": "spawning processes or threads is forbidden (DataLoader workers)",
    "torch.compile": "spawning processes or threads is forbidden (compiler workers)",
    "torch.utils.cpp_extension": "foreign code is forbidden",
    "torch.ops.load_library": "foreign code is forbidden",
    "torch.classes.load_library": "foreign code is forbidden",
}
_CATEGORIES = {
    "network access is forbidden": "socket ssl http urllib urllib3 requests httpx aiohttp asyncio "
                                   "ftplib smtplib telnetlib xmlrpc socketserver websocket websockets",
    "spawning processes or threads is forbidden": "subprocess multiprocessing pty signal threading "
                                                  "_thread concurrent",
    "operating-system access (files, processes) is forbidden": "os posix nt",
    "foreign code is forbidden": "ctypes _ctypes cffi",
    "file access is forbidden": "io _io pathlib shutil tempfile glob fileinput pickle shelve mmap "
                                "linecache zipfile tarfile sqlite3 yaml",
    "dynamic code execution is forbidden": "importlib builtins runpy code codeop marshal",
    "interpreter internals are forbidden (sandbox escape)": "sys inspect gc",
}
FORBIDDEN_TOP = {m: why for why, mods in _CATEGORIES.items() for m in mods.split()}
# attribute names refused on any object: the usual ways out, whatever they were reached through
FORBIDDEN_ATTRS = {
    **dict.fromkeys("open read_text read_bytes write_text write_bytes tofile fromfile from_file "
                    "load save loadtxt savetxt load_library load_inline".split(),
                    "file access is forbidden"),
    **dict.fromkeys("system popen Popen fork forkpty posix_spawn posix_spawnp kill killpg "
                    "execl execle execlp execlpe execv execve execvp execvpe "
                    "spawnl spawnle spawnlp spawnlpe spawnv spawnve spawnvp spawnvpe".split(),
                    "spawning processes or threads is forbidden"),
    "load_harness": FORBIDDEN["evotrainer.harness.load_harness"],
    "inspect_harness": FORBIDDEN["evotrainer.harness.inspect_harness"],
    "load_knobs": FORBIDDEN["evotrainer.harness.knobs.load_knobs"],
}
# module names reached as attributes (`torch.os`, `typing.sys`, `collections._sys`)
MODULE_ATTRS = {**{m: FORBIDDEN_TOP[m] for m in
                   "os sys subprocess socket importlib builtins pathlib io shutil ctypes "
                   "multiprocessing threading signal pty posix".split()},
                "Path": "file access is forbidden"}
FORBIDDEN_NAMES = {
    "open": "file access is forbidden",
    **dict.fromkeys(("eval", "exec", "compile", "__import__"), "dynamic code execution is forbidden"),
    **dict.fromkeys(("globals", "locals", "vars"), "namespace introspection is forbidden (sandbox escape)"),
}
ATTR_BUILTINS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
SAFE_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__init__", "__post_init__",
                          "__repr__", "__all__", "__main__", "__future__"})
DUNDER = re.compile(r"__[A-Za-z_]\w*?__")
DUNDER_WHY = "dunder access is forbidden (sandbox escape)"


@dataclass(frozen=True)
class Verdict:
    legal: bool
    reasons: list[str]


def check_harness(candidate_dir: Path | str, parent_dir: Path | str | None = None) -> Verdict:
    """Every rule's reasons for `candidate_dir`; legal when there are none."""
    cand = Path(candidate_dir)
    if not cand.is_dir() or cand.is_symlink():
        return Verdict(False, [f"{cand}: not a harness directory"])
    parent = Path(parent_dir) if parent_dir is not None else None
    reasons = list(dict.fromkeys(r for rule in FILE_RULES for r in rule(cand, parent)))
    return Verdict(legal=not reasons, reasons=reasons)


# --------------------------------------------------------------------------- (a) files

def _only_harness_files(cand: Path, parent: Path | None) -> Iterator[str]:
    allowed = ", ".join(sorted(HARNESS_FILES))
    for entry in sorted(cand.iterdir()):
        if entry.is_symlink():
            yield f"{entry.name}: is a symlink; harness files must be plain files"
        elif entry.is_dir():
            for rel in _tree(entry, cand) or [entry.name]:
                yield f"{rel}: files in subdirectories are not harness files"
        elif entry.name not in HARNESS_FILES or not entry.is_file():
            yield f"{entry.name}: not a harness file; a harness may hold only {allowed}"


def _tree(directory: Path, root: Path) -> list[str]:
    """Every non-directory under `directory` (symlinks not followed), relative to root."""
    return sorted(Path(d, name).relative_to(root).as_posix()
                  for d, dirs, files in os.walk(directory)
                  for name in files + [x for x in dirs if Path(d, x).is_symlink()])


# --------------------------------------------------------------------------- (b) code

def _code_is_clean(cand: Path, parent: Path | None) -> Iterator[str]:
    for file in sorted(cand.glob("*.py")):
        if file.is_file() and not file.is_symlink():
            yield from check_source(file.read_bytes(), file.name)


def check_source(source: bytes | str, filename: str) -> list[str]:
    """The code rules over one slot file's source (never imported, only parsed)."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        return [f"{filename}:{e.lineno}: syntax error: {e.msg}"]
    except ValueError as e:  # null bytes, undecodable source
        return [f"{filename}: unreadable source: {e}"]
    aliases = _aliases(tree)
    found = sorted((getattr(node, "lineno", 0), i, msg) for i, node in enumerate(ast.walk(tree))
                   for rule in NODE_RULES for msg in rule(node, aliases))
    return list(dict.fromkeys(f"{filename}:{line}: {msg}" for line, _, msg in found))


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted module path it was imported as (`F` -> torch.nn.functional)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _why_forbidden(dotted: str) -> str | None:
    """Why a dotted module path (or a name in it) is off limits; None if not explicitly."""
    for prefix, why in FORBIDDEN.items():
        if dotted == prefix or dotted.startswith(prefix + "."):
            return why
    top = dotted.split(".")[0]
    if top == "evotrainer" and not any(dotted == p or dotted.startswith(p + ".") or p.startswith(dotted + ".")
                                       for p in ALLOWED_EVOTRAINER):
        return "only evotrainer.harness.* and evotrainer.diagnostics.* may be imported from evotrainer"
    return FORBIDDEN_TOP.get(top)


def _why_not_importable(dotted: str) -> str | None:
    why = _why_forbidden(dotted)
    if why or dotted.split(".")[0] in ALLOWED_MODULES | {"evotrainer"}:
        return why
    return f"not an allowed module (allowed: {', '.join(sorted(ALLOWED_MODULES - {'__future__'}))}, evotrainer.harness)"


def _import_rule(node: ast.AST, aliases: dict) -> Iterator[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            yield "relative import: harness files are loaded one by one, not as a package"
            return
        if any(a.name == "*" for a in node.names):
            yield f"'from {node.module} import *' hides names from these checks"
        names = [f"{node.module}.{a.name}" for a in node.names if a.name != "*"] or [node.module]
    else:
        return
    for dotted in names:
        why = _why_not_importable(dotted)
        if why:
            yield f"imports '{dotted}': {why}"


def _name_rule(node: ast.AST, aliases: dict) -> Iterator[str]:
    if isinstance(node, ast.Name):
        if node.id in FORBIDDEN_NAMES:
            yield f"uses {node.id}(): {FORBIDDEN_NAMES[node.id]}"
        elif DUNDER.fullmatch(node.id) and node.id not in SAFE_DUNDERS:
            yield f"uses '{node.id}': {DUNDER_WHY}"


def _attribute_rule(node: ast.AST, aliases: dict) -> Iterator[str]:
    if isinstance(node, ast.Attribute):
        yield from _attribute_reasons(node.value, node.attr, aliases)


def _getattr_rule(node: ast.AST, aliases: dict) -> Iterator[str]:
    """getattr(x, "name") is x.name; getattr(x, computed) could be anything."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ATTR_BUILTINS and len(node.args) >= 2):
        name = node.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            yield from _attribute_reasons(node.args[0], name.value, aliases)
        else:
            yield f"uses {node.func.id}() with a computed attribute name: dynamic attribute access is forbidden"


def _string_rule(node: ast.AST, aliases: dict) -> Iterator[str]:
    """Dunders named in strings: format-string and attrgetter escapes ("{0.__globals__}")."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        for d in dict.fromkeys(DUNDER.findall(node.value)):
            if d not in SAFE_DUNDERS:
                yield f"names '{d}' in a string: {DUNDER_WHY}"


def _attribute_reasons(base: ast.AST, attr: str, aliases: dict) -> list[str]:
    """The first reason `base.attr` is forbidden, if any (one per access, not one per rule)."""
    dotted = _dotted(base, aliases)
    if DUNDER.fullmatch(attr) and attr not in SAFE_DUNDERS:
        return [f"uses '.{attr}': {DUNDER_WHY}"]
    if dotted and _why_forbidden(f"{dotted}.{attr}") and not (
            isinstance(base, ast.Attribute) and _why_forbidden(dotted)):  # reported at `base`
        return [f"uses '{dotted}.{attr}': {_why_forbidden(f'{dotted}.{attr}')}"]
    if attr in FORBIDDEN_ATTRS:
        return [f"uses '.{attr}': {FORBIDDEN_ATTRS[attr]}"]
    if attr.lstrip("_") in MODULE_ATTRS:
        return [f"reaches module '{attr}' through an attribute: {MODULE_ATTRS[attr.lstrip('_')]}"]
    return []


def _dotted(node: ast.AST, aliases: dict) -> str | None:
    """`F.softmax` -> 'torch.nn.functional.softmax' when F is an imported name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(parts)])
    return None


NODE_RULES: tuple[Callable[[ast.AST, dict], Iterable[str]], ...] = (
    _import_rule, _name_rule, _attribute_rule, _getattr_rule, _string_rule,
)


# --------------------------------------------------------------------------- (c) knobs

def _knobs_keep_the_run_fixed(cand: Path, parent: Path | None) -> Iterator[str]:
    file = cand / "knobs.yaml"
    if not file.is_file() or file.is_symlink():
        yield "knobs.yaml: missing; a harness is knobs.yaml plus optional slot files"
        return
    try:
        raw = yaml.safe_load(file.read_bytes()) or {}
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        yield f"knobs.yaml{f':{line + 1}' if line is not None else ''}: malformed YAML"
        return
    if not isinstance(raw, dict):
        yield f"knobs.yaml: expected a mapping of knob names to values, got {type(raw).__name__}"
        return
    for key in raw:
        if key in MODEL_SIZE_KNOBS:
            yield f"knobs.yaml: knob '{key}' changes the model size, which the run fixes"
        elif measurement_refusal(key):
            yield measurement_refusal(key)
        elif key not in FIELDS:
            yield f"knobs.yaml: unknown knob '{key}' (a harness may set only the known knobs)"
    try:
        knobs = knobs_from_dict({k: v for k, v in raw.items() if k in FIELDS}, source="knobs.yaml")
    except UsageError as e:
        yield str(e) if str(e).startswith("knobs.yaml") else f"knobs.yaml: {e}"
        return
    if parent is not None:
        yield from _same_budget(knobs, parent)


def _same_budget(knobs: Knobs, parent: Path) -> Iterator[str]:
    try:
        before = load_knobs(parent / "knobs.yaml")
    except (UsageError, OSError) as e:
        yield f"knobs.yaml: cannot compare with the parent's knobs: {e}"
        return
    # rollouts per step are the budget: prompts x group size may be reshaped at an equal product
    reshaped = before.prompts_per_step * before.group_size == knobs.prompts_per_step * knobs.group_size
    for key in BUDGET_KNOBS:
        old, new = getattr(before, key), getattr(knobs, key)
        if key == "max_new_tokens" and _truncates(old, new):
            continue  # a truncation rule spends less, never more
        if key in ("prompts_per_step", "group_size") and reshaped:
            continue
        if old != new:
            yield f"knobs.yaml: knob '{key}' changes the compute budget ({old} -> {new}), which the run fixes"


def _truncates(old: int, new: int) -> bool:
    """0 is the task's own budget, the most there is (the trainer clamps to it)."""
    return new != 0 and (old == 0 or new <= old)


FILE_RULES: tuple[Callable[[Path, Path | None], Iterable[str]], ...] = (
    _only_harness_files, _code_is_clean, _knobs_keep_the_run_fixed,
)


# --------------------------------------------------------------------------- patches

def check_patch_paths(paths: list[str]) -> list[str]:
    """Reasons for patch paths outside the harness (absolute, `..`, or not a harness file)."""
    return [f"{p}: {why}" for p in paths if (why := _path_problem(p))]


def _path_problem(path: str) -> str | None:
    if not path:
        return "empty path"
    if path.startswith("/") or PureWindowsPath(path).is_absolute() or PureWindowsPath(path).drive:
        return "absolute path; a patch may touch only harness files"
    parts = PurePosixPath(path).parts
    if ".." in parts or ".." in PureWindowsPath(path).parts:
        return "path leaves the harness directory ('..')"
    if len(parts) != 1 or parts[0] not in HARNESS_FILES:
        return f"not a harness file; a patch may touch only {', '.join(sorted(HARNESS_FILES))}"
    return None


def patch_paths(patch: str) -> list[str]:
    """Every path a unified (git) diff names, `a/`/`b/` prefixes removed, /dev/null skipped."""
    out = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            out += _git_header_paths(line[len("diff --git "):])
        elif line.startswith(("--- ", "+++ ")):
            path = line[4:].split("\t")[0].strip()
            if path != "/dev/null":
                out.append(path[2:] if path.startswith(("a/", "b/")) else path)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            out.append(line.split(" ", 2)[2])
    return list(dict.fromkeys(out))


def _git_header_paths(rest: str) -> list[str]:
    n = (len(rest) - 5) // 2  # "a/P b/P" when both sides name the same path
    if rest == f"a/{rest[2:2 + n]} b/{rest[2:2 + n]}":
        return [rest[2:2 + n]]
    a, _, b = rest.partition(" b/")
    return [a[2:] if a.startswith("a/") else a, b]


def check_patch(patch: str) -> list[str]:
    """check_patch_paths over the patch's paths, plus file kinds a harness may not hold."""
    reasons = check_patch_paths(patch_paths(patch))
    for line in patch.splitlines():
        if re.match(r"(new file mode|new mode) 120000", line):
            reasons.append("patch creates a symlink; harness files must be plain files")
        elif re.match(r"(new file mode|new mode) 160000", line):
            reasons.append("patch adds a submodule; harness files must be plain files")
        elif line.startswith("GIT binary patch"):
            reasons.append("patch carries binary data; harness files are text")
    return list(dict.fromkeys(reasons))
