"""Environments written for other libraries, as evotrainer tasks: each adapter's episodes, its
held-out split, and the task through `evotrainer train`. Past `train` the loop does not know
which adapter made a task, and test_real_use takes a task from outside the package through
a whole `evotrainer run`; each adapter's own short run passed when measured (2026-11-27, a
fresh clone's CI: trl-env 33 s, textarena 64 s, verifiers 109 s with train), more than CI's
time budget affords for repeats of one path. OpenEnv's environments (tests/fixtures/openenv_envs.py)
have only the train test, its run path being the same."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from evotrainer.catalog import get_task
from evotrainer.envs.base import FAIL, SUCCESS, TURN_CAP
from evotrainer.errors import UsageError
from evotrainer.harness.actions import ACTION_PARSERS
from helpers import here, write_harness

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SMALL = "max_turns=2&turn_tokens=24&split_size=8"  # plumbing on a CPU: short episodes, 8 held-out problems a split
JSON = ACTION_PARSERS.get("json")


def call(name: str, **args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def calculator_rows(path: Path, n: int = 400) -> Path:
    rng = random.Random(0)
    pairs = [(rng.randrange(100), rng.randrange(100)) for _ in range(n)]
    path.write_text("".join(json.dumps({"prompt": f"What is {a}+{b}?", "answer": str(a + b)}) + "\n" for a, b in pairs))
    return path


def train_two_steps(capsys, tmp_path: Path, spec: str, model: str) -> tuple[dict, list[dict]]:
    """`evotrainer train` on SPEC for 2 steps (embedded backend, a 4x4 harness): its summary and
    evidence records."""
    out = tmp_path / "train"
    summary = here(capsys, "train", "--task", spec, "--model", model, "--harness", write_harness(tmp_path / "h"),
                   "--steps", 2, "--eval-every", 2, "--out", out).json
    return summary, [json.loads(line) for line in (out / "evidence.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------- TRL's environment_factory

def test_a_trl_environment_factory_class_plays_its_tools_and_its_reward_is_the_score(tmp_path):
    rows = calculator_rows(tmp_path / "rows.jsonl")
    task = get_task(f"trl-env:{FIXTURES / 'trl_envs.py'}:Calculator?data={rows}")
    assert task.spec == f"trl-env:{FIXTURES / 'trl_envs.py'}:Calculator?data={rows}"
    assert get_task(task.spec).spec == task.spec
    p = task.split("val", n=1)[0]
    env = task.environment(p, JSON)
    assert env.tools == {"add": ("a", "b"), "submit": ("value",)}
    assert env.reset(0) == p.prompt + " Use the add tool."
    a, b = map(int, p.prompt[len("What is "):-1].split("+"))
    step = env.step(call("add", a=str(a), b=str(b)))       # arguments arrive as text, the tool gets ints
    assert step.observation.strip() == str(a + b) and not step.terminated
    step = env.step(call("add", a="x", b="1"))              # a tool that raises: its error, a failure
    assert step.observation.startswith("error: ValueError") and env.trace.failures == 1
    env.step(call("submit", value=str(a + b)))
    end = env.step("the answer is above")                    # a turn without a tool call ends the episode
    assert end.terminated and end.reward == 1.0 and end.info["stop"] == SUCCESS
    assert env.trace.tools == ["add", "add", "submit"]

    wrong = task.environment(p, JSON)
    wrong.reset(0)
    wrong.step(call("submit", value="-1"))
    cut = wrong.truncate(TURN_CAP)                           # a cap: the reward of the state as it stands
    assert cut.truncated and cut.reward == 0.0 and cut.info["stop"] == TURN_CAP


def test_a_trl_environment_factorys_rows_split_by_the_held_out_hash_and_workers_get_only_training_rows(tmp_path):
    rows = calculator_rows(tmp_path / "rows.jsonl")
    task = get_task(f"trl-env:{FIXTURES / 'trl_envs.py'}:Calculator?data={rows}")
    val, test = {p.id for p in task.split("val")}, {p.id for p in task.split("test")}
    assert val and test and not val & test
    view = task.train_spec(tmp_path / "view")
    worker = get_task(view)
    seen = [json.loads(line)["id"] for line in Path(view.split("data=")[1].split("&")[0]).read_text().splitlines()]
    assert not set(seen) & (val | test) and len(seen) == 400 - sum(task.held_out(task.row_problem(r)) for r in task.rows)
    assert worker.name == task.name  # the same task to the hashes: streams and pools agree
    assert task.data_files() == (str(rows),)


def test_a_trl_environment_that_owns_its_problems_is_seeded_and_a_bad_spec_is_one_error(tmp_path):
    task = get_task(f"trl-env:{FIXTURES / 'trl_envs.py'}:Counter?actions=plain&max_turns=6&split_size=30")
    assert task.caps.max_turns == 6 and task.action_format == "plain" and len(task.split("val")) == 30
    assert task.spec.endswith("Counter?actions=plain&max_turns=6&split_size=30")
    p = task.split("test", n=1)[0]
    env = task.environment(p, ACTION_PARSERS.get("plain"))
    assert env.reset(0).startswith("Call up until the counter reads")
    for _ in range(p.entry % 5 + 1):
        env.step("up")
    assert env.step("done").reward == 1.0
    with pytest.raises(UsageError, match=r"give \?data=rows.jsonl"):
        get_task(f"trl-env:{FIXTURES / 'trl_envs.py'}:Calculator")
    with pytest.raises(UsageError, match="unknown option 'turns'"):
        get_task(f"trl-env:{FIXTURES / 'trl_envs.py'}:Counter?turns=3")
    with pytest.raises(UsageError, match="actions must be json or plain"):
        get_task(f"trl-env:{FIXTURES / 'trl_envs.py'}:Counter?actions=xml")
    with pytest.raises(UsageError, match="split_size must be a positive integer, got '0'"):
        get_task(f"trl-env:{FIXTURES / 'trl_envs.py'}:Counter?split_size=0")


def test_an_environment_without_demonstrations_asks_for_a_model_in_one_line(tmp_path):
    from evotrainer.trainer.pretrain import stages_to_build
    task = get_task(f"trl-env:{FIXTURES / 'trl_envs.py'}:Counter")
    with pytest.raises(UsageError, match="trl-env:.*Counter has no demonstrations to build the default base from: "
                                         "name a model"):
        stages_to_build(task, cache_dir=tmp_path)
    assert get_task("vault").demonstrates() and not task.demonstrates()


@pytest.mark.slow
def test_a_trl_environment_trains_with_the_embedded_backend(tmp_path, tiny_qwen, capsys):
    rows = calculator_rows(tmp_path / "rows.jsonl")
    spec = f"trl-env:{FIXTURES / 'trl_envs.py'}:Calculator?data={rows}&{SMALL}"
    summary, records = train_two_steps(capsys, tmp_path, spec, tiny_qwen)
    assert records and all(r["turns"] >= 1 and r["stop"] in (SUCCESS, FAIL, TURN_CAP, "token_cap") for r in records)
    assert all(r["score"] in (0.0, 1.0) for r in records)       # the environment's get_reward(), the score
    assert 0 <= summary["val"] <= 1 and 0 <= summary["test"] <= 1  # the evaluator played held-out rows


# --------------------------------------------------------------------------- TextArena

def play_guess_the_number(env) -> tuple[float, str]:
    """Binary search on the game's hints: a perfect player of GuessTheNumber-v0 (1..20)."""
    lo, hi = 1, 20
    obs = env.reset(0)
    assert "Guess The Number" in obs
    while True:
        guess = (lo + hi) // 2
        step = env.step(f"I guess [{guess}]")
        if step.terminated:
            return step.reward, step.info["stop"]
        assert step.observation.startswith("[Player]") and "Guess The Number" not in step.observation  # only what is new
        lo, hi = (guess + 1, hi) if "higher" in step.observation else (lo, guess - 1)


def test_a_textarena_game_is_played_from_its_seed_and_scored_by_the_games_reward():
    pytest.importorskip("textarena")
    task = get_task("textarena:GuessTheNumber-v0")
    assert task.spec == "textarena:GuessTheNumber-v0" and task.caps.max_turns == 12 and task.split_size == 100
    val, test = task.split("val", n=20), task.split("test", n=20)
    assert not {p.id for p in val} & {p.id for p in test}
    assert all(p.id.startswith("seed-") and task.held_out(p) for p in val + test)
    for p in val[:5]:
        assert play_guess_the_number(task.environment(p, None)) == (1.0, SUCCESS)
    env = task.environment(val[0], None)
    env.reset(0)
    env.step("no brackets")                              # TextArena lets one invalid move pass with a warning,
    end = env.step("none again")                         # the second ends the game
    assert end.terminated and end.info["stop"] == "invalid_action" and env.trace.failures == 1
    assert 0.0 <= end.reward < 1.0
    again = task.environment(val[0], None)               # the same seed deals the same game
    assert again.reset(0) == task.environment(val[0], None).reset(0)


def test_a_textarena_game_for_two_players_or_an_unknown_game_is_one_error():
    pytest.importorskip("textarena")
    with pytest.raises(UsageError, match="Chess-v0 is not a single-player game"):
        get_task("textarena:Chess-v0")
    with pytest.raises(UsageError, match="unknown TextArena game 'Nope-v0'; valid choices: .*GuessTheNumber-v0"):
        get_task("textarena:Nope-v0")


@pytest.mark.slow
def test_a_textarena_game_trains_with_the_embedded_backend(tmp_path, tiny_qwen, capsys):
    pytest.importorskip("textarena")
    spec = f"textarena:GuessTheNumber-v0?{SMALL}"
    summary, records = train_two_steps(capsys, tmp_path, spec, tiny_qwen)
    assert records and all(r["prompt"].startswith("[GAME] You are Player 0") for r in records)  # reset's, not the seed
    assert all(0.0 <= r["score"] <= 1.0 and r["turns"] >= 1 for r in records)
    assert 0 <= summary["val"] <= 1 and 0 <= summary["test"] <= 1


# --------------------------------------------------------------------------- verifiers

def verifiers_spec(load: str, query: str = "") -> str:
    return f"verifiers:{FIXTURES / 'verifiers_envs.py'}:{load}" + (f"?{query}" if query else "")


def test_a_verifiers_single_turn_env_is_scored_by_its_rubric_and_split_by_the_held_out_hash():
    pytest.importorskip("verifiers")
    task = get_task(verifiers_spec("load_single"))
    assert task.spec == verifiers_spec("load_single") and task.problem_space(0) == 200
    val, test = task.split("val"), task.split("test")
    assert val and test and not {p.id for p in val} & {p.id for p in test}
    p = val[0]
    env = task.environment(p, None)
    assert env.reset(0) == "system: Answer with the number.\nuser: " + p.prompt.split("user: ")[1]
    end = env.step(f"It is {p.answer}")               # verifiers' own rollout ends after one turn
    assert end.terminated and end.reward == 1.0 and end.info["stop"] == SUCCESS
    env.close()
    wrong = task.environment(p, None)
    wrong.reset(0)
    assert wrong.step("no idea").reward == 0.0
    wrong.close()


def test_a_verifiers_tool_env_runs_its_tools_through_the_policys_tool_calls_and_a_cap_scores_the_state():
    pytest.importorskip("verifiers")
    task = get_task(verifiers_spec("load_tools", "max_turns=4"))
    p = task.split("test", n=1)[0]
    a, b = p.prompt.split("What is ")[1].rstrip("?").split("+")
    env = task.environment(p, None)
    first = env.reset(0)
    assert first.startswith("user: What is") and '"name": "add"' in first   # the tools are shown
    step = env.step(call("add", a=int(a), b=int(b)))
    assert step.observation == f"tool: {int(a) + int(b)}\n" and not step.terminated
    end = env.step(f"The sum is {p.answer}")
    assert end.terminated and end.reward == 1.0 and env.trace.tools == ["add"]
    env.close()
    cut = task.environment(p, None)
    cut.reset(0)
    cut.step(call("add", a=1, b=1))
    stopped = cut.truncate(TURN_CAP)                   # the rubric scores the state as it stands
    assert stopped.truncated and stopped.reward == 0.0 and stopped.info["stop"] == TURN_CAP
    cut.close()


def test_a_verifiers_spec_that_is_not_an_environment_is_one_error():
    pytest.importorskip("verifiers")
    with pytest.raises(UsageError, match="did not return a verifiers Environment"):
        get_task(verifiers_spec("rows"))
    with pytest.raises(UsageError, match="verifiers environment 'no-such-env' could not be loaded"):
        get_task("verifiers:no-such-env")


@pytest.mark.slow
def test_a_verifiers_env_trains_with_the_embedded_backend(tmp_path, tiny_qwen, capsys):
    pytest.importorskip("verifiers")
    spec = verifiers_spec("load_tools", SMALL)
    summary, records = train_two_steps(capsys, tmp_path, spec, tiny_qwen)
    assert records and all(r["prompt"].startswith("user: What is") and r["turns"] >= 1 for r in records)
    assert all(r["score"] in (0.0, 1.0) for r in records)   # the rubric's reward
    assert 0 <= summary["val"] <= 1 and 0 <= summary["test"] <= 1


# --------------------------------------------------------------------------- OpenEnv

def openenv_spec(cls: str, query: str = "") -> str:
    return f"openenv:{FIXTURES / 'openenv_envs.py'}:{cls}" + (f"?{query}" if query else "")


def test_an_openenv_environment_plays_in_process_on_text_actions_and_its_rewards_are_the_score():
    pytest.importorskip("openenv")
    task = get_task(openenv_spec("GuessNumber"))
    assert task.spec == openenv_spec("GuessNumber") and task.caps.max_turns == 8 and task.split_size == 100
    val, test = task.split("val", n=20), task.split("test", n=20)
    assert not {p.id for p in val} & {p.id for p in test} and all(task.held_out(p) for p in val + test)
    for p in val[:5]:  # a perfect player: binary search on the hints
        env, lo, hi = task.environment(p, None), 1, 20
        assert env.reset(0).startswith("I picked an integer from 1 to 20")
        while True:
            guess = (lo + hi) // 2
            step = env.step(f"{guess}")
            if step.terminated:
                break
            lo, hi = (guess + 1, hi) if "too low" in step.observation else (lo, guess - 1)
        assert (step.reward, step.info["stop"]) == (1.0, SUCCESS)
        env.close()
    env = task.environment(val[0], None)
    env.reset(0)
    assert env.step("0").reward == 0.0                     # mid-episode: nothing yet
    cut = env.truncate(TURN_CAP)                           # a cap: the return so far
    assert cut.truncated and cut.reward == 0.0 and cut.info["stop"] == TURN_CAP


def test_an_openenv_dataset_splits_its_rows_and_json_actions_are_validated_as_the_environments_action(tmp_path):
    pytest.importorskip("openenv")
    rng = random.Random(0)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"a": rng.randrange(50), "b": rng.randrange(50)}) + "\n" for _ in range(300)))
    task = get_task(openenv_spec("AddRows", f"data={rows}"))
    p = task.split("val", n=1)[0]
    env = task.environment(p, None)
    a, b = p.entry["a"], p.entry["b"]
    assert json.loads(env.reset(0)) == {"question": f"What is {a}+{b}?", "level": 1}  # two fields: as JSON
    end = env.step(f" {a + b} ")                            # the Action's one text field takes the turn
    assert end.terminated and end.reward == 1.0
    named = get_task(openenv_spec("AddRows", f"data={rows}&text=question")).environment(p, None)
    assert named.reset(0) == f"What is {a}+{b}?"            # ?text=FIELD: that field only
    view = get_task(task.train_spec(tmp_path / "view"))     # a training worker: the training rows only
    assert not {str(r["id"]) for r in view.rows} & {q.id for q in task.split("val") + task.split("test")}

    walk = get_task(openenv_spec("Walk")).environment(get_task(openenv_spec("Walk")).split("val", n=1)[0], None)
    assert json.loads(walk.reset(0)) == {"x": 0, "y": 0}
    assert json.loads(walk.step('I go right: {"dx": 1, "dy": 0}').observation) == {"x": 1, "y": 0}
    bad = walk.step('{"dx": "left"}')                       # not a Move: the episode ends, the return so far
    assert bad.terminated and bad.info["stop"] == "invalid_action" and bad.reward == 0.25
    assert walk.trace.failures == 1 and "invalid action" in bad.observation
    won = get_task(openenv_spec("Walk")).environment(get_task(openenv_spec("Walk")).split("val", n=1)[0], None)
    won.reset(0)
    steps = [won.step(m) for m in ('{"dx": 1, "dy": 0}', '{"dx": 1, "dy": 0}', '{"dx": 0, "dy": 1}')]
    assert [s.terminated for s in steps] == [False, False, True] and steps[-1].reward == 1.0


def test_an_openenv_spec_that_is_not_an_environment_or_has_no_action_class_is_one_error():
    pytest.importorskip("openenv")
    with pytest.raises(UsageError, match="NotAnEnvironment: not an OpenEnv Environment"):
        get_task(openenv_spec("NotAnEnvironment"))
    with pytest.raises(UsageError, match=r"Untyped: cannot tell its Action class; declare it as Environment\["):
        get_task(openenv_spec("Untyped"))
    with pytest.raises(UsageError, match="unknown option 'turns'"):
        get_task(openenv_spec("GuessNumber", "turns=3"))
    with pytest.raises(UsageError, match="text must name a field of Hint, got 'question'; valid choices: prompt"):
        get_task(openenv_spec("GuessNumber", "text=question"))
    with pytest.raises(UsageError, match="text must name a field of Question, got 'q'; valid choices: question, level"):
        get_task(openenv_spec("AddRows", "text=q"))   # declared by step's return annotation


@pytest.mark.slow
def test_an_openenv_environment_trains_with_the_embedded_backend(tmp_path, tiny_qwen, capsys):
    pytest.importorskip("openenv")
    summary, records = train_two_steps(capsys, tmp_path, openenv_spec("GuessNumber", SMALL), tiny_qwen)
    assert records and all(r["prompt"].startswith("I picked an integer") for r in records)  # reset's, not the seed
    assert all(r["score"] in (0.0, 1.0) and r["turns"] >= 1 for r in records)
    assert 0 <= summary["val"] <= 1 and 0 <= summary["test"] <= 1
