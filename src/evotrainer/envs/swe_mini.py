"""swe-mini: fix a bug in a tiny generated Python repository with tools, graded by hidden tests.

    prompt        calc.add(2, 3) returns -1, expected 5
    policy        read calc.py                      (a tool call: the `plain` action format)
    environment   def add(a, b):
                      return a - b
    policy        edit calc.py|return a - b|return a + b
    environment   edited calc.py
    policy        test
    environment   OK
    policy        submit

The SWE-bench recipe at a size a ~1M-parameter character model can see whole: a repository
(swe_mini_repo.py: templated functions, one AST mutation), an issue written from a failing
test, the tests the bug breaks (fail-to-pass) hidden, the others (pass-to-pass) shipped in
the workspace. The policy works in a temporary workspace with the buggy code and the visible
tests only: no hidden tests, no original source, no .git.

Tools (`TOOLS`; observations are short, a tiny model's whole episode is 512 positions):
    list                  the workspace's files, one a line
    read PATH             the file's text (clipped at the level's observation size)
    search TEXT           `path:line: text` for each line holding TEXT (at most SEARCH_HITS)
    edit PATH|OLD|NEW     replace the one occurrence of OLD (none, or several: a failure)
    test                  the visible tests, as shipped, on the workspace's code: `OK` or the
                          first failure (`FAIL add(2, 3) returned -1, expected 5`)
    submit                end the episode; the hidden grading decides the reward
Paths are relative to the workspace and never leave it (no absolute path, no `..`, no
symlink). Test files may be edited, but grading never reads them: it runs the repository's
own tests (visible and hidden, from the problem) against the workspace's module files.

Grading (`grade_all`) runs model-edited code, so it runs in the sandbox (sandbox/programs.py,
cases mode): one Program per workspace whose code serves the module files to `import` from
memory and whose entry calls test `i`; the expected values stay outside the sandbox. A whole
batch of workspaces is one sandboxed process (`SweMiniTask.judge`; ~110 ms for one, ~6 ms
each in a batch of 64). A workspace whose modules are exactly as shipped or exactly the
original skips the sandbox: its grade is known from generation. Reward 1 only when every test
passes; `trace.partial` is the fraction that pass. The issue names one failing call; the
hidden tests hold up to two more failing inputs, so hard-coding the issue's case rarely pays.

An episode ends at `submit` (success; fail; abandon when nothing was ever edited), at an
action that repeats the last observation (echo, reward 0), at `invalid_run` (3) unparsable
actions in a row (invalid_action, reward 0: one stray turn is only a failed call), or at a
cap, where the workspace is graded as it stands (`truncate`). Echo and invalid endings are
not graded (`trace.partial` stays None).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from evotrainer.envs.base import (ABANDON, ECHO, FAIL, INVALID, SUCCESS, Caps, EnvTask, Environment, Parser, Step,
                                  ToolCall, Trace)
from evotrainer.envs.swe_mini_repo import (LEVELS, MODULE_NAMES, SHAPES, TEMPLATES, VARIANTS, Case, Repo, fix_edit,
                                            generate)
from evotrainer.tasks.base import Problem
from evotrainer.tasks.registry import Builtin, register

TOOLS = {"list": (), "read": ("path",), "search": ("text",), "edit": ("path", "old", "new"), "test": (), "submit": ()}
# level 1 fits a tiny model's 512 positions; the others give a chat model room to explore
CAPS = {1: Caps(max_turns=6, max_tokens=512, turn_tokens=96), 2: Caps(max_turns=10, max_tokens=2048, turn_tokens=192),
        3: Caps(max_turns=16, max_tokens=4096, turn_tokens=256)}
OBS_CHARS = {1: 256, 2: 1024, 3: 2048}   # the longest observation of a level
SEARCH_HITS = 8
PATH_CHARS = 40                          # of a path repeated back in a failure message
GIT = re.compile(r"\.git|git ", re.I)


@dataclass
class SweMiniConfig:
    target_level: int = 1
    # problems in each of validation and test: each is a repository played for up to 16 turns
    # with sandboxed tests, so fewer than the single-turn tasks' 500 (SWE-bench Verified: 500)
    split_size: int = 100
    timeout_s: float = 1.0     # per workspace's test run (every test of it together)
    memory_mb: int = 256       # per workspace's test run
    invalid_run: int = 3       # unparsable actions in a row that end an episode

    def validate(self) -> None:
        if self.target_level not in LEVELS:
            raise ValueError(f"swe-mini level must be one of {', '.join(map(str, LEVELS))}, got {self.target_level}")
        if self.split_size < 1 or self.timeout_s <= 0 or self.memory_mb < 32 or self.invalid_run < 1:
            raise ValueError("split_size and invalid_run must be positive, timeout_s > 0 and memory_mb >= 32")


# ---------------------------------------------------------------------------------------
# Grading in the sandbox.

@dataclass(frozen=True)
class Grade:
    passed: int
    total: int

    @property
    def reward(self) -> float:
        return 1.0 if self.passed == self.total else 0.0

    @property
    def partial(self) -> float:
        return self.passed / self.total if self.total else 0.0


# The program each workspace becomes: its modules importable from memory (the sandbox cannot
# see the workspace), and `_case(i)` calling test i. Only the calls go in, never the expected values.
_RUNNER = '''\
import importlib.util
import sys

SOURCES = {sources!r}
CALLS = {calls!r}


class _Repo:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, cls) if name in SOURCES else None

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        exec(compile(SOURCES[module.__name__], module.__name__ + ".py", "exec"), module.__dict__)


sys.meta_path.insert(0, _Repo)


def _case(i):
    module, function, args = CALLS[i]
    return getattr(__import__(module), function)(*args)
'''


def _program(sources: dict[str, str], cases: tuple[Case, ...]):
    from evotrainer.sandbox.programs import Program
    modules = {path.removesuffix(".py"): text for path, text in sources.items()}
    code = _RUNNER.format(sources=modules, calls=[(c.module, c.function, c.args) for c in cases])
    return Program(code, "_case", tuple((i,) for i in range(len(cases))), tuple(c.expected for c in cases))


def _known(repo: Repo, sources: dict[str, str]) -> Grade | None:
    """The grade of the shipped code or of the original, known since generation (both are our
    own code, evaluated there): most of a group's unedited or exactly reverted workspaces."""
    total = len(repo.visible) + len(repo.hidden)
    if sources == repo.buggy_sources():
        return Grade(len(repo.visible), total)
    if sources == repo.fixed_sources():
        return Grade(total, total)
    return None


def grade_all(repos: list[Repo], sources: list[dict[str, str]], timeout_s: float = 1.0,
              memory_mb: int = 256) -> list[Grade]:
    """Every workspace's module files against its repository's tests, visible and hidden;
    what is not known beforehand runs in one sandboxed batch."""
    from evotrainer.sandbox.programs import run_programs
    grades = [_known(r, s) for r, s in zip(repos, sources)]
    todo = [i for i, g in enumerate(grades) if g is None]
    programs = [_program(sources[i], repos[i].visible + repos[i].hidden) for i in todo]
    for i, outcome in zip(todo, run_programs(programs, timeout_s=timeout_s, memory_mb=memory_mb)):
        grades[i] = Grade(outcome.passed, outcome.total)
    return grades


def run_visible(repo: Repo, sources: dict[str, str], timeout_s: float, memory_mb: int) -> str:
    """The `test` tool: the visible tests on the workspace's code, `OK` or the first failure."""
    from evotrainer.sandbox.programs import run_programs
    if not repo.visible:
        return "no tests\n"
    if _known(repo, sources) is not None:  # the visible tests pass on the shipped code and on the original
        return "OK\n"
    outcome = run_programs([_program(sources, repo.visible)], timeout_s=timeout_s, memory_mb=memory_mb)[0]
    if outcome.status == "passed":
        return "OK\n"
    # "_case(3) returned -1, expected 5" -> "FAIL add(2, 3) returned -1, expected 5" (the first
    # one only: the rest of the message may be the program's own words)
    i = re.match(r"_case\((\d+)\)", outcome.error)
    error = repo.visible[int(i.group(1))].call() + outcome.error[i.end():] if i else outcome.error
    return f"FAIL {error}\n"


# ---------------------------------------------------------------------------------------
# The environment.

def _read_text(file: Path) -> str:
    return file.read_text(encoding="utf-8", errors="replace")  # whatever the machine's locale


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 4] + "...\n"


def _listing(paths) -> str:
    return "\n".join(sorted(paths)) + "\n"


class SweMiniEnv(Environment):
    tools = TOOLS

    def __init__(self, problem: Problem, parse: Parser, config: SweMiniConfig):
        super().__init__()
        self.problem, self.parse, self.config = problem, parse, config
        self.repo: Repo = problem.entry
        self.caps = CAPS[problem.level]
        self.chars = OBS_CHARS[problem.level]
        self.workspace: Path | None = None
        self._remove = None
        self._restart()

    def _restart(self) -> None:
        self.trace = Trace(target_files=list(self.repo.target))
        self.last, self.invalid_run, self.edited, self.done = "", 0, False, False

    # -- the episode --------------------------------------------------------------------

    def reset(self, seed: int) -> str:
        """A fresh workspace: the buggy modules and the visible tests, nothing else."""
        self.close()
        self.workspace = Path(tempfile.mkdtemp(prefix="swe-mini-")).resolve()
        self._remove = weakref.finalize(self, shutil.rmtree, str(self.workspace), True)  # even if never closed
        for path, text in self.repo.files:
            (self.workspace / path).write_text(text, encoding="utf-8")
        self._restart()
        self.last = self.problem.prompt
        return self.problem.prompt

    def step(self, action: str) -> Step:
        if self.done or self.workspace is None:
            raise RuntimeError("swe-mini: step() after the episode ended (or before reset())")
        if self.last and action.strip() == self.last.strip():
            return self._end(0.0, ECHO)
        call = self.parse(action, self.tools)
        if call is None:
            return self._invalid()
        self.invalid_run = 0
        self.trace.tools.append(call.name)
        if any(GIT.search(v) for v in call.args.values()):
            self.trace.git_access += 1
        if call.name == "submit":
            grade = self._grade()
            stop = SUCCESS if grade.reward == 1 else FAIL if self.edited else ABANDON
            return self._end(grade.reward, stop, "submit")
        self.last = _clip(self._use(call), self.chars)
        return Step(self.last, 0.0, False, False, {"tool": call.name})

    def truncate(self, stop: str) -> Step:
        """A cap ended the episode: the workspace is graded as it stands."""
        grade = self._grade()
        self.done = True
        return Step("", grade.reward, False, True, {"stop": stop})

    def close(self) -> None:
        if self._remove is not None:
            self._remove()
        self.workspace, self._remove = None, None

    def _end(self, reward: float, stop: str, tool: str | None = None) -> Step:
        self.done = True
        info = {"stop": stop} | ({"tool": tool} if tool else {})
        return Step("", reward, True, False, info)

    def _invalid(self) -> Step:
        self.trace.tools.append("invalid")
        self.trace.failures += 1
        self.invalid_run += 1
        if self.invalid_run >= self.config.invalid_run:
            return self._end(0.0, INVALID)
        self.last = f"invalid action (tools: {' '.join(self.tools)})\n"
        return Step(self.last, 0.0, False, False, {"tool": "invalid"})

    def _grade(self) -> Grade:
        grade = grade_all([self.repo], [self.sources()], self.config.timeout_s, self.config.memory_mb)[0]
        self.trace.partial = grade.partial
        return grade

    def sources(self) -> dict[str, str]:
        """The workspace's module files, as grading reads them (never its test files)."""
        out = {}
        for path in self.repo.modules:
            file = self.workspace / path
            out[path] = _read_text(file) if file.is_file() and not file.is_symlink() else ""
        return out

    # -- the tools ----------------------------------------------------------------------

    def _use(self, call: ToolCall) -> str:
        handlers = {"list": self._list, "read": self._read, "search": self._search, "edit": self._edit,
                    "test": self._test}
        return handlers[call.name](**call.args)

    def _fail(self, message: str) -> str:
        self.trace.failures += 1
        return message + "\n"

    def _files(self) -> list[str]:
        """Every regular file of the workspace (symlinks skipped), relative, sorted."""
        out = []
        for root, dirs, files in os.walk(self.workspace):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
            here = Path(root).relative_to(self.workspace)
            out += [(here / f).as_posix() for f in files if not os.path.islink(os.path.join(root, f))]
        return sorted(out)

    def _resolve(self, path: str) -> tuple[Path | None, str]:
        """(the file, its name) or (None, why not): a relative path inside the workspace that
        passes through no symlink, to a regular file. Nothing outside is ever opened, so a
        denial says nothing of what exists there."""
        text = path.strip()
        rel = PurePosixPath(text)
        shown = text[:PATH_CHARS]
        if not text or "\x00" in text or rel.is_absolute() or ".." in rel.parts:
            return None, f"{shown}: denied"
        here = self.workspace
        try:
            for part in rel.parts:
                here = here / part
                if here.is_symlink():
                    return None, f"{shown}: denied"
            if here.resolve().is_relative_to(self.workspace) and here.is_file():
                return here, rel.as_posix()
        except (OSError, ValueError):  # a name too long, say
            pass
        return None, f"{shown}: not found"

    def _list(self) -> str:
        return _listing(self._files())

    def _read(self, path: str) -> str:
        file, name = self._resolve(path)
        if file is None:
            return self._fail(name)
        self.trace.files_read.append(name)
        return _read_text(file) or "(empty file)\n"

    def _search(self, text: str) -> str:
        if not text.strip():
            return self._fail("search: empty text")
        hits = [f"{name}:{n}: {line.strip()}" for name in self._files()
                for n, line in enumerate(_read_text(self.workspace / name).splitlines(), 1) if text in line]
        return "\n".join(hits[:SEARCH_HITS]) + "\n" if hits else "no matches\n"

    def _edit(self, path: str, old: str, new: str) -> str:
        file, name = self._resolve(path)
        if file is None:
            return self._fail(name)
        if not old:
            return self._fail("edit: empty old text")
        content = _read_text(file)
        n = content.count(old)
        if n != 1:
            return self._fail(f"{name}: no match" if n == 0 else f"{name}: {n} matches, give more context")
        file.write_text(content.replace(old, new, 1), encoding="utf-8", errors="replace")
        self.edited = True
        self.trace.files_edited.append(name)
        return f"edited {name}\n"

    def _test(self) -> str:
        self.trace.tests_run += 1
        return run_visible(self.repo, self.sources(), self.config.timeout_s, self.config.memory_mb)


# ---------------------------------------------------------------------------------------
# The task.

class SweMiniTask(EnvTask):
    # The default base is a short SFT on expert episodes: the tiny model learns the tool format,
    # rarely the fix, so its probe stays short of the target and the base is kept anyway (a run
    # that shows the loop; a real model, `--model`, is for scores). Probing is what cost most:
    # an episode plays ~6 turns with sandboxed tests (a 10-episode probe took 177 s beside two
    # other jobs): 250 steps of 32 with a 200-episode probe every 50 steps had not reached RL
    # after 400 s (1500 of 128, before that, were still in SFT after 25 minutes). One small
    # probe at the end says how far it got.
    sft_max_steps = 150
    sft_batch_size = 16
    sft_check_every = 150
    sft_probe_size = 20
    sft_typical_steps = 150  # it runs to the cap: 150 steps, 68 s from an empty cache
    sft_require_target = False

    def __init__(self, config: SweMiniConfig | None = None):
        self.config = config or SweMiniConfig()
        self.config.validate()
        self.name = self.spec = "swe-mini"
        self.levels, self.target_level = LEVELS, self.config.target_level
        self.split_size = self.config.split_size
        self.caps = CAPS[self.target_level]

    def problem_space(self, level: int) -> int:
        """An upper bound: template drafts per function slot, and module names (test inputs,
        which multiply it further, left out)."""
        shape = SHAPES[level]
        return (len(TEMPLATES[level]) * VARIANTS) ** shape.functions[1] * len(MODULE_NAMES) ** shape.modules[1]

    def generate(self, rng: random.Random, level: int) -> Problem:
        repo = generate(rng, level)
        old, new = fix_edit(repo)
        tests = [(c.module, c.function, c.args_json, c.expected) for c in repo.visible + repo.hidden]
        pid = hashlib.sha256(json.dumps([level, repo.files, tests, repo.mutation.kind]).encode()).hexdigest()[:16]
        prompt = f"{repo.issue}\n" if level == 1 else f"Issue: {repo.issue}\n"
        return Problem(id=pid, prompt=prompt, answer=f"edit {repo.mutation.path}|{old}|{new}", level=level,
                       entry=repo)

    def environment(self, problem: Problem, parse: Parser) -> SweMiniEnv:
        return SweMiniEnv(problem, parse, self.config)

    def demonstration(self, problem: Problem) -> list[tuple[str, str]]:
        """Read the file the issue's function lives in, revert the mutated line, test, submit
        (from level 2, list the files first)."""
        repo: Repo = problem.entry
        path, chars = repo.mutation.path, OBS_CHARS[problem.level]
        turns = [("list", _listing(p for p, _ in repo.files))] if problem.level >= 2 else []
        return turns + [(f"read {path}", _clip(repo.file(path), chars)), (problem.answer, f"edited {path}\n"),
                        ("test", "OK\n" if repo.visible else "no tests\n"), ("submit", "")]

    def judge(self, envs: list[SweMiniEnv]) -> list[Grade]:
        """Grade many workspaces as they stand in one sandboxed batch (what a player that
        defers the final rewards of a batch calls)."""
        return grade_all([e.repo for e in envs], [e.sources() for e in envs], self.config.timeout_s,
                         self.config.memory_mb)


def make(level: int | None = None) -> SweMiniTask:
    return SweMiniTask(SweMiniConfig() if level is None else SweMiniConfig(target_level=level))


register(Builtin("swe-mini", make))
