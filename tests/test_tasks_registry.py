"""The task registry: every built-in is one entry, resolved through get_task with its
canonical spec round-tripping; unknown names and bad options are one-line usage errors."""
import subprocess
import sys

import pytest

from evotrainer.catalog import get_task
from evotrainer.errors import UsageError
from evotrainer.registry import Registry
from evotrainer.tasks.arith import ArithTask
from evotrainer.tasks.registry import FAMILY_FORMS, TASKS, Builtin, Option, resolve


def usage_error(spec: str, level: int | None = None) -> str:
    with pytest.raises(UsageError) as e:
        get_task(spec, level)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def builtin_specs() -> list[str]:
    """Every built-in name, and every choice of each of its options."""
    out = []
    for name in TASKS.names():
        entry = TASKS.get(name)
        out.append(name)
        out += [f"{name}?{o.key}={c}" for o in entry.options for c in o.choices]
    return out


def test_the_catalog_registers_every_builtin_task_and_environment():
    assert TASKS.names() == ["arith", "codegen", "humaneval", "swe-mini", "vault"]
    assert TASKS.get("vault").form == "vault[?tool=on|off]"


@pytest.mark.parametrize("spec", builtin_specs())
def test_every_builtin_resolves_and_its_canonical_spec_round_trips(spec):
    t = get_task(spec)
    for level in (None, t.target_level):
        again = get_task(t.spec, level)
        assert again.spec == t.spec and type(again) is type(t)
    budget = get_task(f"{spec}{'&' if '?' in spec else '?'}max_new_tokens=7")
    assert budget.max_new_tokens == 7 and get_task(budget.spec).spec == budget.spec
    assert "max_new_tokens=7" in budget.spec  # the budget is part of what the task is, for every built-in


def test_an_option_at_its_default_is_left_out_of_the_canonical_spec():
    assert get_task("vault?tool=on").spec == "vault"
    assert get_task("vault?tool=off&max_new_tokens=7").spec == "vault?max_new_tokens=7&tool=off"
    assert get_task("vault?tool=off").config.tool is False


def test_an_unknown_task_is_one_line_naming_every_form():
    msg = usage_error("arithmetic")
    assert msg.startswith("unknown task 'arithmetic'; valid choices: ")
    for form in [TASKS.get(n).form for n in TASKS.names()] + list(FAMILY_FORMS):
        assert form in msg, form


def test_bad_options_are_one_line_errors():
    assert usage_error("vault?tool=maybe") == "tool must be on or off, got 'maybe' in task spec 'vault?tool=maybe'"
    assert "unknown option 'tool'" in usage_error("arith?tool=off")
    assert "humaneval has one level" in usage_error("humaneval", 2)


def test_the_resolver_knows_by_name_only_what_its_registry_holds():
    mine: Registry[Builtin] = Registry("task")
    mine.add("sums", Builtin("sums", lambda level, digits: ArithTask(), (Option("digits", ("2", "3"), "2"),)))
    assert resolve("sums?digits=3", None, mine).spec == "sums?digits=3"
    with pytest.raises(UsageError, match="unknown task 'arith'; valid choices: .*sums\\[\\?digits=2\\|3\\]"):
        resolve("arith", None, mine)
    with pytest.raises(UsageError, match="task 'sums' is defined twice"):
        mine.add("sums", Builtin("sums", lambda level: ArithTask()))


def test_tasks_load_without_the_environments_above_them():
    code = ("import sys, evotrainer.tasks, evotrainer.tasks.registry, evotrainer.tasks.arith, "
            "evotrainer.tasks.codegen, evotrainer.tasks.humaneval; "
            "print(sorted(m for m in sys.modules if m.startswith('evotrainer.envs')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
