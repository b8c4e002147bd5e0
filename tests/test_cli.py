"""Bad input: one clear line naming the problem and the valid choices, exit code 2, no traceback."""
import json
from pathlib import Path

import pytest

from conftest import TEST_HOME
from helpers import cli, run_cli, write_harness
from evotrainer.tasks.keys import key_path


@pytest.mark.parametrize("case, expect", [
    ("unknown_task", ["unknown task 'arithmetic'", "arith", "rg:"]),
    ("unknown_slot", ["unknown reward 'shiny'", "binary", "partial_credit"]),
    ("unknown_knob", ["unknown knob 'learning_rate'", "lr", "group_size"]),
    ("bad_type", ["knob 'lr' must be float", "'fast'"]),
    ("negative", ["steps must be >= 0"]),
    ("bad_yaml", ["malformed YAML"]),
    ("missing_ckpt", ["no model at", "config.json"]),
    ("no_harness", ["not a harness directory"]),
    ("unknown_family", ["unknown reasoning-gym family 'no_such_family'", "chain_sum"]),
    ("bad_level", ["arith level must be in 1..6"]),
])
def test_bad_input_gives_one_line_and_exit_code_2(tmp_path, capsys, ckpt, case, expect):
    args = ["train", "--out", str(tmp_path / "out"), "--model", str(ckpt), "--steps", "1"]
    knobs = {
        "unknown_slot": "reward: shiny\n", "unknown_knob": "learning_rate: 0.1\n",
        "bad_type": "lr: fast\n", "negative": "steps: -3\n", "bad_yaml": "lr: [1, 2\nsteps: 3\n",
    }
    if case in knobs:
        args += ["--harness", str(write_harness(tmp_path / "h", {"knobs.yaml": knobs[case]}))]
    extra = {
        "unknown_task": ["--task", "arithmetic"], "missing_ckpt": ["--model", str(tmp_path / "nope")],
        "no_harness": ["--harness", str(tmp_path)], "unknown_family": ["--task", "rg:no_such_family"],
        "bad_level": ["--level", "9"],
    }
    code, out, err = run_cli(capsys, *(args + extra.get(case, [])))
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evotrainer: error: "), err
    for word in expect:
        assert word in lines[0]
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize("case, expect", [
    ("not_causal", ["t5 model, which is not a causal LM"]),
    ("task_import", ["no_such_module_xyz", "ModuleNotFoundError"]),
    ("jsonl_row", ["rows.jsonl:2", "'answer'"]),
    ("trl_refused", ["backend trl cannot train", "loss_agg 'seq_mean_token_sum'", "token_mean (dapo)"]),
    ("bad_device", ["device must be auto, cpu, cuda, cuda:N or mps"]),
])
def test_a_users_model_task_or_backend_gone_wrong_is_one_line_and_exit_code_2(tmp_path, capsys, ckpt, case, expect):
    from transformers import T5Config
    args = ["train", "--out", str(tmp_path / "out"), "--model", str(ckpt), "--steps", "1"]
    if case == "not_causal":
        T5Config(vocab_size=10, d_model=8, num_layers=1, num_heads=1, d_ff=8).save_pretrained(tmp_path / "t5")
        args[args.index("--model") + 1] = str(tmp_path / "t5")
    elif case == "task_import":
        args += ["--task", "no_such_module_xyz:Make"]
    elif case == "jsonl_row":
        (tmp_path / "rows.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
        args += ["--task", f"jsonl:{tmp_path / 'rows.jsonl'}"]
    elif case == "trl_refused":
        h = write_harness(tmp_path / "h", {"knobs.yaml": "loss_agg: seq_mean_token_sum\n"})
        args += ["--backend", "trl", "--harness", str(h)]
    elif case == "bad_device":
        args += ["--device", "gpu"]
    code, out, err = run_cli(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("evotrainer: error: "), err
    for word in expect:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_argparse_errors_are_one_line_too(capsys):
    code, out, err = run_cli(capsys, "train", "--steps", "x", "--out", "o")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "invalid int value" in err


@pytest.mark.slow
def test_help_of_the_cli_and_of_every_command_prints_and_exits_0(capsys):
    """`evotrainer --help` is a new user's first command: argparse formats each help text with
    %, so a stray one ("95% intervals") fails the whole listing with a traceback."""
    import argparse
    from evotrainer.cli import build_parser, main

    def commands(parser, path=()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield (*path, name)
                    yield from commands(sub, (*path, name))

    every = list(commands(build_parser()))
    assert {("run",), ("screen",), ("skills", "list")} <= set(every)
    for argv in [(), *every]:
        with pytest.raises(SystemExit) as exit:
            main([*argv, "--help"])
        out, err = capsys.readouterr()
        assert exit.value.code == 0 and out.startswith("usage: evotrainer") and "Traceback" not in err, argv


def test_train_command_end_to_end_prints_summary_json_last(tmp_path, ckpt):
    out_dir = tmp_path / "run"
    summary = cli("train", "--task", "arith", "--steps", 3, "--seed", 1, "--out", out_dir, "--model", ckpt,
                  timeout=120).json
    for key in ("base_val", "val", "test", "steps", "seconds"):
        assert key in summary
    assert summary["steps"] == 3
    assert (out_dir / "checkpoint" / "config.json").exists()
    assert len((out_dir / "metrics.jsonl").read_text().splitlines()) == 3
    assert len((out_dir / "evidence.jsonl").read_text().splitlines()) == 3 * 64 * 8  # reference: 64 prompts x 8
    assert (out_dir / "harness" / "knobs.yaml").exists()
    # the model's split key was made in the tests' cache (conftest.py), not the user's
    key = key_path(f"model:{ckpt}|arith/3")
    assert key.is_relative_to(TEST_HOME) and key.exists()
    assert not (Path.home() / ".cache" / "evotrainer" / "keys" / key.name).exists()


def test_missing_checkpoint_via_subprocess_has_no_traceback(tmp_path):
    err = cli("train", "--out", tmp_path / "o", "--model", tmp_path / "missing", code=2, timeout=120).err
    assert "Traceback" not in err
    assert err.strip().splitlines() == [err.strip()]


def test_skills_list_and_show(tmp_path, capsys):
    from evotrainer.skills import SkillLibrary
    lib = SkillLibrary(tmp_path / "s.sqlite")
    for run, task in (("a", "arith"), ("b", "rg:chain_sum")):
        lib.record(run=run, trial=1, task=task, trigger="dead_group_ratio:critical", intervention="partial_credit",
                   family="reward", patch={"reward": "partial_credit"}, expected="x", label="kept", gain=0.04)
    lib.close()
    code, out, err = run_cli(capsys, "skills", "list", "--library", str(tmp_path / "s.sqlite"))
    assert code == 0 and "dead_group_ratio:critical -> partial_credit" in err and "(general)" in err
    code, out, err = run_cli(capsys, "skills", "show", "dead_group_ratio:critical -> partial_credit",
                             "--library", str(tmp_path / "s.sqlite"))
    shown = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and shown["tried"] == 2 and shown["general"] and len(shown["evidence"]) == 2
    code, out, err = run_cli(capsys, "skills", "show", "nope", "--library", str(tmp_path / "s.sqlite"))
    assert code == 2 and "unknown skill 'nope'; valid choices: dead_group_ratio:critical -> partial_credit" in err
    code, out, err = run_cli(capsys, "skills", "list", "--library", str(tmp_path / "none.sqlite"))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_lineage_and_status_write_for_a_person_and_print_json_only_when_asked(tmp_path, capsys):
    from evotrainer.lineage import LineageStore, TrialRecord
    from evotrainer.lineage.events import TrialStarted
    run = tmp_path / "run"
    run.mkdir()
    store = LineageStore(run / "lineage.sqlite")
    store.begin_trial(TrialStarted(0, "root", "v0"))
    store.finish_trial(TrialRecord(id=0, version="v0", parents=[], agent="-", intervention="root", depth=1,
                                   hypothesis="-", success_criterion="-", patch="", label="kept",
                                   fitness={"val": {"0": 0.1}, "test": {"0": 0.1}}))
    store.close()
    code, out, err = run_cli(capsys, "lineage", str(run))
    assert code == 0 and out == "" and "v0 #0 [root] kept: val 0.100" in err  # no stray JSON after the tree
    code, out, err = run_cli(capsys, "status", str(run))
    assert code == 0 and out == "" and "trials: 1" in err
    code, out, err = run_cli(capsys, "status", str(run), "--json")
    assert code == 0 and json.loads(out)["trials"] == 1
