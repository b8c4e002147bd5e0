"""swe-mini: generated repositories with one bug, an environment with file tools, and hidden
tests graded in the sandbox. Scripted policies only (CPU, offline): an oracle that reverts
the mutation, and policies that give up, cheat on the tests, pry for the hidden files or loop."""
import difflib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter

import pytest

from evotrainer.harness.actions import json_call, plain
from evotrainer.envs.base import ABANDON, ECHO, FAIL, INVALID, SUCCESS, TURN_CAP
from evotrainer.sandbox.programs import run_programs
from evotrainer.envs.swe_mini import SweMiniConfig, SweMiniTask, _program, make
from evotrainer.envs.swe_mini_repo import HIDDEN_PATH, KINDS, SHAPES, fix_edit


def problems(level, n, seed=0):
    task = make(level)
    rng = random.Random(f"swe-test/{seed}")
    return task, [task.generate(rng, level) for _ in range(n)]


def play(env, actions):
    """Drive an environment with scripted actions; (observations, last step)."""
    observations, step = [env.reset(0)], None
    for a in actions:
        step = env.step(a)
        observations.append(step.observation)
        if step.terminated or step.truncated:
            break
    return observations, step


def oracle(problem, fmt="plain"):
    """Revert the mutation with one edit, then submit."""
    path, old, new = problem.answer.removeprefix("edit ").split("|", 2)
    if fmt == "plain":
        return [f"edit {path}|{old}|{new}", "submit"]
    call = {"name": "edit", "arguments": {"path": path, "old": old, "new": new}}
    return [f"<tool_call>{json.dumps(call)}</tool_call>", json.dumps({"name": "submit", "arguments": {}})]


@pytest.mark.parametrize("level", [1, 2, 3])
def test_the_oracle_scores_one_with_either_parser(level):
    task, ps = problems(level, 6)
    for p in ps:
        for fmt, parse in (("plain", plain), ("json", json_call)):
            env = task.environment(p, parse)
            _, step = play(env, oracle(p, fmt))
            assert (step.reward, step.terminated, step.info["stop"]) == (1.0, True, SUCCESS), (p.prompt, fmt)
            assert env.trace.files_edited == env.trace.target_files == [p.entry.mutation.path]
            assert env.trace.partial == 1.0 and env.trace.tools == ["edit", "submit"]
            workspace = env.workspace
            env.close()
            assert not workspace.exists()


@pytest.mark.parametrize("level", [1, 2, 3])
def test_a_fix_written_differently_is_graded_in_the_sandbox(level):
    """Not the original text, so no known grade: the hidden tests run on the edited code."""
    task, (p,) = problems(level, 1, seed=1)
    path, old, new = p.answer.removeprefix("edit ").split("|", 2)
    env = task.environment(p, plain)
    _, step = play(env, [f"edit {path}|{old}|{new}  # fixed", "submit"])
    assert step.reward == 1.0 and step.info["stop"] == SUCCESS
    env.close()


@pytest.mark.parametrize("level", [1, 2, 3])
def test_the_demonstration_plays_back_exactly(level):
    task, ps = problems(level, 5, seed=2)
    for p in ps:
        demo = task.demonstration(p)
        env = task.environment(p, plain)
        observations, step = play(env, [a for a, _ in demo])
        assert observations[1:] == [o for _, o in demo] and step.reward == 1.0 and step.info["stop"] == SUCCESS
        assert env.trace.tests_run == 1 and env.trace.failures == 0 and env.trace.files_read == [p.entry.mutation.path]
        env.close()
        if level == 1:  # a 512-position character model sees the whole episode
            assert len(p.prompt) + sum(len(a) + 1 + len(o) for a, o in demo) <= 512
            assert all(len(a) < task.caps.turn_tokens for a, _ in demo)
            assert all(len(text) <= SHAPES[1].max_chars for path, text in p.entry.files if path in p.entry.modules)


def test_submitting_at_once_abandons_with_nothing_earned():
    task, (p,) = problems(1, 1, seed=3)
    env = task.environment(p, plain)
    _, step = play(env, ["submit"])
    assert (step.reward, step.terminated, step.info["stop"]) == (0.0, True, ABANDON)
    repo = p.entry
    assert env.trace.partial == len(repo.visible) / (len(repo.visible) + len(repo.hidden)) < 1


def test_editing_the_tests_earns_nothing():
    """The visible test file emptied or replaced by a trivial test: grading runs the
    repository's own tests, visible and hidden, on the module files alone."""
    task, ps = problems(2, 4, seed=4)
    for p in ps:
        for path, text in p.entry.files:
            if not path.startswith("test_"):
                continue
            trivial = "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n"
            env = task.environment(p, plain)
            _, step = play(env, [f"edit {path}|{text}|{trivial}", "test", "submit"])
            # (plain strips the turn's end: the file's last newline with it)
            assert env.trace.files_edited == [path] and (env.workspace / path).read_text() == trivial.strip()
            assert (step.reward, step.info["stop"]) == (0.0, FAIL) and env.trace.partial < 1
            env.close()


def test_the_hidden_tests_and_the_original_source_cannot_be_reached(tmp_path):
    task, ps = problems(1, 3, seed=5)
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    for p in ps:
        repo = p.entry
        env = task.environment(p, plain)
        prompt = env.reset(0)
        os.symlink(secret, env.workspace / "link.py")  # (the policy has no tool that makes one)
        os.symlink(tmp_path, env.workspace / "out")
        tries = ["read ../secret.txt", f"read {secret}", f"read {env.workspace}/{repo.mutation.path}",
                 f"read {HIDDEN_PATH}", "read link.py", "read out/secret.txt", "read ./../../etc/passwd",
                 f"read {repo.mutation.path}.orig", "read .git/config", "search git log", "edit link.py|hunter2|x",
                 f"edit ../{repo.mutation.path}|a|b", f"search {repo.hidden[0].call()}", "search hunter2", "list"]
        observations = [env.step(a).observation for a in tries]
        denied = observations[:12]
        assert all(("denied" in o or "not found" in o or "no matches" in o) for o in denied), denied
        assert "hunter2" not in "".join(observations) and secret.read_text() == "hunter2"
        assert HIDDEN_PATH not in observations[-1] and "link.py" not in observations[-1]
        for case in repo.hidden:  # not one hidden assertion shows (the issue, in the prompt, names one call)
            assert all(case.assertion() not in o for o in observations)
        assert all(dict(repo.original)[repo.mutation.path] not in o for o in observations)
        assert prompt == p.prompt and env.trace.git_access == 2 and env.trace.failures >= 10
        assert env.trace.files_read == [] and env.trace.files_edited == []
        env.close()


def test_an_endless_tool_loop_ends_at_the_turn_cap_graded_as_it_stands():
    task, (p,) = problems(1, 1, seed=6)
    for fixed_first in (False, True):
        env = task.environment(p, plain)
        env.reset(0)
        actions = ([p.answer] if fixed_first else []) + ["list"] * 1000
        turns, step = 0, None
        for a in actions:
            if turns == env.caps.max_turns:
                step = env.truncate(TURN_CAP)
                break
            step = env.step(a)
            turns += 1
            assert not (step.terminated or step.truncated)
        assert (step.truncated, step.terminated, step.info["stop"]) == (True, False, TURN_CAP)
        assert step.reward == (1.0 if fixed_first else 0.0) and len(env.trace.tools) == env.caps.max_turns
        env.close()


def test_invalid_actions_and_echoes():
    task, (p,) = problems(1, 1, seed=7)
    env = task.environment(p, plain)
    env.reset(0)
    first = env.step("hello")
    assert not first.terminated and first.observation.startswith("invalid action")
    assert env.step("read").observation == ": denied\n"  # a call (a failed one) resets the run
    steps = [env.step("nope") for _ in range(SweMiniConfig().invalid_run)]
    assert [s.terminated for s in steps] == [False, False, True] and steps[-1].info["stop"] == INVALID
    assert steps[-1].reward == 0.0 and env.trace.tools == ["invalid", "read"] + ["invalid"] * 3
    assert env.trace.failures == 5 and env.trace.partial is None  # (not graded: it never submitted)
    with pytest.raises(RuntimeError):
        env.step("list")
    env.close()
    env = task.environment(p, plain)
    env.reset(0)
    shown = env.step(f"read {p.entry.mutation.path}").observation
    echo = env.step(shown)
    assert (echo.reward, echo.terminated, echo.info["stop"]) == (0.0, True, ECHO)
    env.reset(0)  # a prompt repeated back is an echo too
    assert env.step(p.prompt).info["stop"] == ECHO
    env.close()


def test_the_test_tool_reports_the_first_visible_failure_briefly():
    task, ps = problems(2, 10, seed=8)
    p = next(q for q in ps if q.entry.visible)
    case = p.entry.visible[0]
    source = p.entry.file(f"{case.module}.py")
    header = next(line for line in source.splitlines() if line.startswith(f"def {case.function}("))
    env = task.environment(p, plain)
    obs, _ = play(env, [f"edit {case.module}.py|{header}|{header}\n    return 12345", "test", "search 12345"])
    assert obs[2] == f"FAIL {case.call()} returned 12345, expected {case.expected!r}\n"
    assert obs[3] == f"{case.module}.py:{source.splitlines().index(header) + 2}: return 12345\n"
    assert env.trace.tests_run == 1
    env.close()


def test_hostile_code_is_graded_in_the_sandbox():
    task, (p,) = problems(1, 1, seed=9)
    path = p.entry.mutation.path
    env = task.environment(p, plain)
    env.reset(0)
    line = p.entry.file(path).splitlines()[0]
    env.step(f"edit {path}|{line}|while True:\n    pass\n{line}")
    t = time.monotonic()
    step = env.truncate(TURN_CAP)
    assert step.reward == 0.0 and env.trace.partial == 0.0 and time.monotonic() - t < 10
    env.close()


@pytest.mark.parametrize("level", [1, 2, 3])
def test_every_mutation_breaks_a_test_that_the_original_passes(level):
    """30 problems: in the sandbox, the original passes every test, the shipped code passes
    the visible ones and fails every hidden one; the mutation is one line; the issue is the
    first hidden test's failure."""
    task, ps = problems(level, 30, seed=10)
    programs = []
    for p in ps:
        r = p.entry
        programs += [_program(r.fixed_sources(), r.visible + r.hidden), _program(r.buggy_sources(), r.hidden)]
        # (a lone function whose every test the bug breaks ships no visible test)
        programs += [_program(r.buggy_sources(), r.visible)] if r.visible else []
    outcomes = iter(run_programs(programs, timeout_s=1.0, memory_mb=256))
    for p in ps:
        r = p.entry
        fixed, hidden = next(outcomes), next(outcomes)
        assert fixed.status == "passed" and hidden.passed == 0 and len(r.hidden) >= 1, (p.prompt, fixed, hidden)
        assert next(outcomes).status == "passed" if r.visible else True
        diff = [d for d in difflib.ndiff(r.file(r.mutation.path).splitlines(),
                                         dict(r.original)[r.mutation.path].splitlines()) if d[0] in "+-"]
        assert len(diff) == 2 and diff[0][2:].strip() == r.mutation.buggy and diff[1][2:].strip() == r.mutation.fixed
        assert r.issue.startswith(f"{r.hidden[0].module}.{r.hidden[0].call()} ") and r.issue in p.prompt
        old, new = fix_edit(r)
        assert r.file(r.mutation.path).count(old) == 1 and "|" not in old + new
    assert len({p.id for p in ps}) == len(ps)
    assert [p.id for p in problems(level, 30, seed=10)[1]] == [p.id for p in ps]  # seeded


def test_every_mutation_kind_occurs():
    kinds = Counter(p.entry.mutation.kind for level in (1, 2, 3) for p in problems(level, 30, seed=10)[1])
    assert set(kinds) == set(KINDS), kinds


def test_the_rendered_test_files_are_real_unittest_files(tmp_path):
    """Our own generated code (trusted): the original passes every test with plain unittest,
    the shipped code fails the hidden file and passes the visible ones."""
    for level in (1, 3):
        _, (p,) = problems(level, 1, seed=11)
        r = p.entry
        for name, sources in (("fixed", r.fixed_sources()), ("buggy", r.buggy_sources())):
            d = tmp_path / f"{level}{name}"
            d.mkdir()
            for path, text in [*r.files, *sources.items(), (HIDDEN_PATH, r.hidden_source)]:
                (d / path).write_text(text)
            run = subprocess.run([sys.executable, "-m", "unittest", "-q"], cwd=d, capture_output=True, text=True)
            assert (run.returncode == 0) == (name == "fixed"), run.stderr
            tests = [f for f in os.listdir(d) if f.startswith("test_") and f != HIDDEN_PATH]
            visible = subprocess.run([sys.executable, "-m", "unittest", "-q", *[t[:-3] for t in tests]], cwd=d,
                                     capture_output=True, text=True)
            assert visible.returncode == 0, visible.stderr


def test_a_batch_of_workspaces_is_judged_in_one_sandbox_call():
    task, ps = problems(1, 16, seed=12)
    envs = [task.environment(p, plain) for p in ps]
    for i, (env, p) in enumerate(zip(envs, ps)):
        env.reset(0)
        path, old, new = p.answer.removeprefix("edit ").split("|", 2)
        if i % 2 == 0:  # half fixed (written differently, so every one runs), half broken some other way
            env.step(f"edit {path}|{old}|{new}  # fix")
        else:
            env.step(f"edit {path}|{old}|{old}  # not a fix")
    t = time.monotonic()
    grades = task.judge(envs)
    assert [g.reward for g in grades] == [1.0, 0.0] * 8 and time.monotonic() - t < 10
    for env in envs:
        env.close()


def test_the_task_draws_splits_and_checks_its_config():
    task = SweMiniTask(SweMiniConfig(split_size=8))
    assert task.name == task.spec == "swe-mini" and task.levels == (1, 2, 3) and task.target_level == 1
    val, test = task.split("val"), task.split("test")
    assert len(val) == len(test) == 8 and not {p.id for p in val} & {p.id for p in test}
    assert task.caps.max_tokens == 512 and make(3).caps.max_turns > make(1).caps.max_turns
    assert task.problem_space(1) > 10 ** 6
    for bad in (SweMiniConfig(target_level=4), SweMiniConfig(timeout_s=0), SweMiniConfig(invalid_run=0)):
        with pytest.raises(ValueError):
            SweMiniTask(bad)
    with pytest.raises(TypeError):
        task.score(val[0], "x")


def test_odd_arguments_fail_the_call_not_the_environment():
    task, (p,) = problems(1, 1, seed=13)
    path = p.entry.mutation.path
    env = task.environment(p, plain)
    env.reset(0)
    odd = ["read " + "a" * 300, "read a/" * 40, "read \x00", "read .", "search  ", f"edit {path}||x",
           f"edit {path}|no such text|x", f"edit {path}|{p.entry.mutation.buggy}|{p.entry.mutation.buggy} + 'é\udc80'"]
    observations = [env.step(a).observation for a in odd]
    assert all(o.endswith("\n") and len(o) <= 256 for o in observations), observations
    assert observations[-1] == f"edited {path}\n" and "é" in env.step(f"read {path}").observation
    assert env.trace.failures == 7 and env.trace.files_edited == [path]
    env.close()
