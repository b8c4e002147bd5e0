"""Runs evotrainer did not start: a plain TRL GRPOTrainer with the evidence callback, and a
directory of rollouts in the documented JSONL form, read by diagnose, backtest and report."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from evotrainer.diagnostics.health import diagnose
from evotrainer.errors import UsageError
from evotrainer.harness import REFERENCE

pytest.importorskip("trl")
slow = pytest.mark.slow  # each TRL run: ~10 s of a CPU

APPLIES = ("signal", "score", "model_state", "behavior", "efficiency")  # single-turn text: no agentic or code layer


def plain_trl_run(model_path, out, reward: str, steps: int = 6):
    """A user's own TRL script, as TRL's docs write one, plus the callback's two lines. The
    second reward function is the planted hack (pays per token) or an honest constant term."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from evotrainer.integrations.trl import EvidenceCallback

    rng = random.Random(0)
    pairs = [(rng.randrange(10), rng.randrange(10)) for _ in range(64)]
    ds = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs])

    def correct(prompts, completions, answer, **kw):
        return [1.0 if c.strip().startswith(a) else 0.0 for c, a in zip(completions, answer)]

    def length_bonus(prompts, completions, completion_ids, **kw):
        return [0.05 * len(ids) for ids in completion_ids]

    def constant(prompts, completions, completion_ids, **kw):
        return [0.1 for _ in completion_ids]

    args = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=16, num_generations=8,
                      max_completion_length=48, max_steps=steps, logging_steps=1, learning_rate=1e-3,
                      report_to="none", use_cpu=True, save_strategy="no", beta=0.04, seed=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_path),
                          reward_funcs=[correct, length_bonus if reward == "hack" else constant], args=args,
                          train_dataset=ds, processing_class=AutoTokenizer.from_pretrained(model_path))
    trainer.add_callback(EvidenceCallback(trainer, out / "run", score="correct"))
    trainer.train()
    return out / "run"


@pytest.fixture(scope="module")
def trl_runs(tiny_qwen, tmp_path_factory):
    return {kind: plain_trl_run(tiny_qwen, tmp_path_factory.mktemp(kind), kind) for kind in ("hack", "honest")}


@slow
def test_a_plain_trl_run_with_the_callback_gets_a_health_report_with_real_values_in_every_layer_that_applies(trl_runs):
    run = trl_runs["honest"]
    records = [json.loads(line) for line in (run / "evidence.jsonl").read_text().splitlines()]
    assert len(records) == 6 * 16 and {r["step"] for r in records} == set(range(1, 7))
    assert {r["group_id"] for r in records} == {0, 1}  # 16 rows of groups of 8
    assert all(r["reward"] == pytest.approx(r["score"] + 0.1, abs=1e-6) for r in records)  # the weighted sum
    assert all(r["answer"] == str(sum(map(int, r["prompt"][:-1].split("+")))) for r in records)
    assert all(r["mean_logprob"] < 0 and r["entropy"] > 0 and 1 <= r["length"] <= 48 for r in records)
    meta = json.loads((run / "run.json").read_text())
    assert meta["group_size"] == 8 and meta["reward_funcs"] == ["correct", "constant"] and meta["score"] == "correct"
    assert any("kl" in json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())

    [report] = diagnose(run)
    assert report["rollouts"] == 96
    for d in report["diagnostics"]:
        if d["layer"] in APPLIES:
            assert d["value"] is not None, d["name"]      # a real value in every layer that applies
        else:
            assert d["value"] is None, d["name"]          # and none invented where it does not
    assert not report["blocking"]
    by = {d["name"]: d["value"] for d in report["diagnostics"]}
    assert by["reward_length_coupling"] == 0.0 and by["mean_logprob"] < -1


@slow
def test_a_reward_hack_planted_in_a_plain_trl_run_is_flagged_by_the_same_blocking_diagnostic(trl_runs):
    [report] = diagnose(trl_runs["hack"])
    hit = [f for f in report["findings"] if f["diagnostic"] == "reward_length_coupling"]
    assert hit and hit[0]["blocking"] and hit[0]["severity"] == "critical" and report["blocking"]
    from evotrainer.diagnostics.load import harness_diagnostics
    assert harness_diagnostics(None)["reward_length_coupling"].blocking  # the one evotrainer's own runs are gated by


@slow
def test_backtest_and_report_read_a_trl_run(trl_runs, tmp_path):
    from evotrainer.backtest import backtest
    from evotrainer.report import write_report
    outcome = backtest(trl_runs["hack"], REFERENCE)  # the reference recipe's reward on the hacked run's rollouts
    r = outcome.report
    assert outcome.passed and r.rollouts == 96 and r.groups == 12
    assert r.ordering_violations_before > 0 and r.ordering_violations == 0  # the hack paid wrong answers more
    res = write_report(trl_runs["hack"], tmp_path / "r.html", engine="svg")
    html = (tmp_path / "r.html").read_text()
    assert res["state"] == "trained" and res["charts"] >= 5
    assert "reward_length_coupling" in html and "(blocking)" in html and "length_bonus" in html


@slow
def test_the_callback_refuses_an_unknown_score_function_in_one_line(tiny_qwen, tmp_path):
    from trl import GRPOConfig, GRPOTrainer
    from datasets import Dataset
    from evotrainer.integrations.trl import EvidenceCallback
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_steps=1,
                      report_to="none", use_cpu=True)
    trainer = GRPOTrainer(model=str(tiny_qwen), reward_funcs=[lambda completions, **kw: [0.0] * len(completions)] * 2,
                          args=args, train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 4))
    with pytest.raises(UsageError, match="score: name the reward function that is the verifier, one of"):
        EvidenceCallback(trainer, tmp_path / "run")
    with pytest.raises(UsageError, match="score 'nope' is not one of the trainer's reward functions"):
        EvidenceCallback(trainer, tmp_path / "run", score="nope")


# --------------------------------------------------------------------------- the JSONL form

def write_rows(d, rows):
    d.mkdir(parents=True, exist_ok=True)
    (d / "evidence.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_rollouts_in_the_documented_jsonl_form_are_diagnosed_with_the_defaults_filled_in(tmp_path):
    from evotrainer.evidence.records import load_records
    rng = random.Random(1)
    rows = []
    for step in range(1, 11):
        for prompt in ("2+2=", "3+5=", "1+3=", "6+2="):
            for _ in range(4):
                right = rng.random() < 0.15
                text = str(sum(map(int, prompt[:-1].split("+")))) if right else "x" * rng.randrange(1, 9)
                # a planted hack: the reward pays for length where the score does not move
                rows.append({"step": step, "prompt": prompt, "completion": text, "score": float(right),
                             "reward": float(right) + 0.1 * len(text)})
    d = write_rows(tmp_path / "export", rows)
    recs = load_records(d)
    assert [r.group_id for r in recs[:8]] == [0] * 4 + [1] * 4            # by prompt within a step
    g = recs[:4]
    assert sum(r.advantage for r in g) == pytest.approx(0.0)             # reward minus the group's mean
    assert recs[0].length == len(recs[0].completion) and recs[0].mean_logprob is None and recs[0].kept
    [report] = diagnose(d)
    flagged = {f["diagnostic"] for f in report["findings"] if f["blocking"]}
    assert "reward_length_coupling" in flagged
    by = {x["name"]: x["value"] for x in report["diagnostics"]}
    assert by["mean_logprob"] is None and by["entropy_mean"] is None    # not measured: n/a, not invented
    assert by["dead_group_ratio"] is not None and by["score_mean"] is not None


@pytest.mark.parametrize("row, message", [
    ({"step": 1, "prompt": "p", "completion": "c", "score": 1.0}, "line 1: missing reward; every rollout needs step, prompt"),
    ({"step": 1, "prompt": "p", "completion": "c", "score": 1.0, "reward": 1.0, "rewrd": 2},
     "line 1: unknown field 'rewrd'; valid fields: step, group_id"),
    ({"step": "1", "prompt": "p", "completion": "c", "score": 1.0, "reward": 1.0}, "step must be an integer"),
    ({"step": 1, "prompt": "p", "completion": "c", "score": "yes", "reward": 1.0}, "score must be a number"),
])
def test_a_malformed_export_is_one_error_naming_the_field(tmp_path, row, message):
    with pytest.raises(UsageError, match=message):
        diagnose(write_rows(tmp_path / "bad", [row]))


def test_diagnose_of_a_malformed_export_is_one_line_and_exit_2(tmp_path):
    d = write_rows(tmp_path / "bad", [{"step": 1, "prompt": "p", "completion": "c", "score": 1.0}])
    cli = subprocess.run([sys.executable, "-m", "evotrainer.cli", "diagnose", str(d)], capture_output=True, text=True)
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert cli.stderr.strip().splitlines()[-1].endswith("line 1: missing reward; every rollout needs step, prompt, "
                                                         "completion, score, reward (the rest has defaults)")
