"""Each run-config key is written once, on its field: docs/config.md is generated from the
fields, and the flags of `train`, `pretrain` and `evaluate` that set a key take its default."""
from pathlib import Path

import pytest

from helpers import run_cli
from evotrainer.cli import _run_config, build_parser
from evotrainer.config import RunConfig, config_keys, key_field, reference

ROOT = Path(__file__).resolve().parents[1]


def test_the_reference_page_is_what_the_fields_say_now():
    assert (ROOT / "docs" / "config.md").read_text() == reference(), \
        "docs/config.md is stale: run python scripts/config_reference.py"


def test_every_key_says_what_it_does():
    assert [key for key, f, _ in config_keys() if not f.metadata.get("help")] == []


@pytest.mark.parametrize("argv", [["train", "--out", "o"], ["pretrain"], ["evaluate", "--model", "m"]])
def test_every_flag_that_sets_a_key_takes_the_keys_default(argv):
    args = build_parser().parse_args(argv)
    assert args.config_flags, "no flag of this command is derived from the run config"
    for dest, (key, flag) in args.config_flags.items():
        assert getattr(args, dest) == key_field(key)[0].default, flag
    assert _run_config(args) == RunConfig(task="arith")  # nothing given: the config's defaults, all of them


def test_the_flags_keep_their_spellings():
    args = build_parser().parse_args(["train", "--out", "o", "--no-chat-template", "--lora-rank", "4", "--memory-mb",
                                      "100", "--eval-every", "3", "--base-seed", "5", "--backend", "trl",
                                      "--gradient-checkpointing", "--data-parallel", "2", "--micro-batch-size", "8",
                                      "--dtype", "fp32", "--weights", "bf16", "--device", "cpu", "--target-acc", "0.1",
                                      "--warm-start", "2", "--level", "3"])
    cfg = _run_config(args)
    assert (cfg.chat_template, cfg.lora, cfg.worker_memory_mb, cfg.evaluation.every, cfg.base.seed) == \
        (False, {"rank": 4, "alpha": 8.0}, 100, 3, 5)
    assert (cfg.backend, cfg.gradient_checkpointing, cfg.data_parallel, cfg.micro_batch_size) == ("trl", True, 2, 8)
    assert (cfg.dtype, cfg.weights, cfg.device, cfg.base.target_acc, cfg.base.warm_start, cfg.level) == \
        ("fp32", "bf16", "cpu", 0.1, 2, 3)
    assert build_parser().parse_args(["train", "--out", "o", "--lora-rank", "0"]).lora_rank == 0  # full fine-tuning
    assert _run_config(build_parser().parse_args(["train", "--out", "o", "--lora-rank", "0"])).lora is None


@pytest.mark.parametrize("flags, words", [
    (["--dtype", "fp8"], ["--dtype", "invalid choice: 'fp8'", "bf16"]),
    (["--backend", "jax"], ["--backend", "invalid choice: 'jax'", "embedded", "trl"]),
    (["--eval-every", "-1"], ["--eval-every must be >= 0 (0: only at the end), got -1"]),
    (["--memory-mb", "-1"], ["--memory-mb must be >= 0"]),
])
def test_a_bad_flag_is_one_line_naming_it_and_exit_code_2(capsys, tmp_path, flags, words):
    code, out, err = run_cli(capsys, "train", "--out", str(tmp_path / "out"), *flags)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("evotrainer: error: "), err
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "out").exists()
