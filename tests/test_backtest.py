"""Backtests on cached rollouts: the verdict and its reasons, and broken or illegal
candidates labelled without harming the caller."""
import json
from pathlib import Path

import pytest

from evidence_factory import write_train_dir
from evotrainer.backtest import BacktestConfig, backtest, measured
from evotrainer.backtest.measured import Agreement, verdict_note
import dataclasses

from evotrainer.backtest.analysis import analyse, dead_ratio, off_score_signal, ordering_violations, verdict
from evotrainer.evidence.records import RolloutRecord
from evotrainer.cli import main
from helpers import readable, write_harness

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "harnesses"
LENGTH_PAY, PARTIAL_CREDIT = EXAMPLES / "length_pay", EXAMPLES / "partial_credit"
INVERTED = "def inverted(r):\n    return 1 - r.scores\n"
KEEP_DEAD_ONLY = "def only_dead(rewards, scores):\n    return scores.max(dim=1).values == scores.min(dim=1).values\n"


@pytest.fixture(scope="module")
def evidence(tmp_path_factory):
    return write_train_dir(readable(tmp_path_factory.mktemp("ev")) / "ref")


def test_pure_statistics_on_a_hand_made_group():
    scores = [1, 0, 0, 0]
    assert ordering_violations([1.0, 0.0, 0.5, 0.2], scores, 4) == (0, 3)
    assert ordering_violations([0.3, 0.0, 0.5, 0.2], scores, 4) == (1, 3)
    assert dead_ratio([0, 0, 0, 0, 1, 0, 0, 0], 4) == 0.5
    # all of the second group's advantage is in an equal-score group
    assert off_score_signal([1, -1, 0, 0, 0.5, -0.5, 0, 0], [True] * 8, [1, 0, 0, 0, 0, 0, 0, 0], 4) == pytest.approx(1 / 3)


def test_pairs_of_wrong_answers_a_graded_verifier_tells_apart_are_counted_apart():
    # reasoning-gym's fallback: oracle "-1", "-1 -15" contains it (1/3), "-4" does not (0);
    # a per-digit reward pays "-4" more. The correct "-1" must still earn the most.
    scores = [1.0, 1 / 3, 0.0, 0.0]
    rewards = [1.0, 0.2, 0.5, 0.0]
    assert ordering_violations(rewards, scores, 4) == (1, 5)
    assert ordering_violations(rewards, scores, 4, graded=True) == (1, 2)
    assert ordering_violations(rewards, scores, 4, graded=False) == (0, 3)
    assert ordering_violations([0.4, 0.2, 0.5, 0.0], scores, 4, graded=False) == (1, 3)


def test_a_cut_that_loses_only_partial_credit_cuts_no_correct_rollout():
    # oracle "-1": the long "-1 -15" earns 1/3 from the substring fallback, not an answer
    texts, scores = ["-1", "-1 -15", "-4", "7"], [1.0, 1 / 3, 0.0, 0.0]
    recs = [RolloutRecord(0, 0, "p", "1 - 2 =", "-1", 2, t, s, s, 0.0, len(t.split()) + 1, False, -1.0, 1.0, True)
            for t, s in zip(texts, scores)]
    cut = {"group_size": 4, "reward": [1.0, 0.0, 0.0, 0.0], "advantage": [1.5, -0.5, -0.5, -0.5],
           "kept": [True] * 4, "score": [1.0, 0.0, 0.0, 0.0], "cut": [False, True, False, False], "max_new_tokens": 2}
    rep = analyse(recs, cut)
    assert rep.correct_rollouts == 1 and rep.correct_cut_by_truncation == 0 and rep.verdict == "pass"
    rep = analyse(recs, cut | {"cut": [True, True, False, False], "score": [0.0] * 4})
    assert rep.correct_cut_by_truncation == 1 and "would cut 1 of 1 correct rollouts" in rep.reasons[0]


def test_verdict_tolerates_some_regrading_of_wrong_answers_but_no_wrong_answer_above_a_correct_one(evidence):
    rep = backtest(evidence, PARTIAL_CREDIT).report
    cfg = BacktestConfig()
    regraded = dataclasses.replace(rep, pairs_compared=rep.pairs_compared + 100, graded_pairs=100,
                                   ordering_violations=rep.ordering_violations + 10, graded_violations=10)
    reasons, notes = verdict(regraded, cfg)
    assert reasons == [] and any("10 of 100 pairs of wrong answers" in n for n in notes)
    # a shaped reward grades wrong answers its own way: re-ordering them rejects only under a set tolerance
    inverted = dataclasses.replace(regraded, ordering_violations=rep.ordering_violations + 60, graded_violations=60)
    assert verdict(inverted, cfg)[0] == [] and any("60 of 100 pairs of wrong answers" in n for n in verdict(inverted, cfg)[1])
    strict = dataclasses.replace(cfg, max_graded_violation_rate=0.25)
    assert "60 of 100 pairs of wrong answers" in verdict(inverted, strict)[0][0] and verdict(regraded, strict)[0] == []
    assert verdict(regraded, dataclasses.replace(cfg, max_graded_violation_rate=0.05))[0]
    against_correct = dataclasses.replace(rep, ordering_violations=1)
    assert "1 ordering violations" in verdict(against_correct, cfg)[0][0]


def test_partial_credit_removes_dead_groups_without_ordering_violations(tmp_path, evidence):
    out = backtest(evidence, PARTIAL_CREDIT)
    rep = out.report
    assert out.label == "passed", out.reasons
    assert rep.ordering_violations == 0 and rep.pairs_compared > 100
    assert rep.dead_group_ratio_before > 0.4 and rep.dead_group_ratio_after < rep.dead_group_ratio_before / 2
    assert rep.off_score_signal_after > 0.02  # it does put signal in all-wrong groups ...
    top = max(rep.off_score_tracks, key=lambda k: abs(rep.off_score_tracks[k] or 0))
    assert top == "answer_similarity"         # ... and there it tracks closeness to the answer
    assert any("closeness to the reference answer" in n for n in rep.notes)


def test_length_reward_is_rejected_though_it_orders_correct_above_wrong(tmp_path, evidence):
    out = backtest(evidence, LENGTH_PAY)
    rep = out.report
    assert out.label == "backtest_rejected"
    assert rep.ordering_violations == 0  # every correct answer still outranks every wrong one
    assert len(out.reasons) == 1
    assert "verifier scores are all equal" in out.reasons[0] and "tracks length" in out.reasons[0]
    assert rep.off_score_tracks["length"] > 0.8 and abs(rep.off_score_tracks["answer_similarity"]) < 0.5


LENGTH_PENALTY = ("def length_penalty(r):\n"
                  "    return r.scores - 0.5 * r.lengths.float() / r.max_new_tokens\n")


def test_a_length_penalty_passes_where_paying_for_length_is_rejected(tmp_path, evidence):
    # the mirror of length_pay: the same signal in all-wrong groups, pointing the other way
    out = backtest(evidence, write_harness(tmp_path / "pen", {"reward.py": LENGTH_PENALTY}, small=False,
                                         reward="length_penalty"))
    rep = out.report
    assert out.label == "passed", out.reasons
    assert rep.off_score_signal_after > 0.02 and rep.off_score_tracks["length"] < -0.8
    assert any("shaping towards shorter completions" in n for n in rep.notes)
    # the verdict reads the sign: the same report with the correlation flipped is the hack
    flipped = dataclasses.replace(rep, off_score_tracks=rep.off_score_tracks | {"length": -rep.off_score_tracks["length"]})
    assert "tracks length (r = +" in verdict(flipped, BacktestConfig())[0][0]
    # paying for finished or well-formed completions is shaping too; other features are not
    for feature, rejected in (("truncated", False), ("format_failure", False), ("repetition", True),
                              ("policy_confidence", True)):
        other = dataclasses.replace(rep, off_score_tracks={feature: -0.9, "answer_similarity": 0.1})
        assert bool(verdict(other, BacktestConfig())[0]) == rejected, feature


def test_reward_against_the_verifier_has_ordering_violations(tmp_path, evidence):
    out = backtest(evidence, write_harness(tmp_path / "inv", {"reward.py": INVERTED}, small=False, reward="inverted"))
    assert out.label == "backtest_rejected"
    assert out.report.ordering_violations == out.report.pairs_compared > 0
    assert "ordering violations" in out.reasons[0]


def test_truncation_that_cuts_correct_answers_is_rejected(tmp_path, evidence):
    out = backtest(evidence, write_harness(tmp_path / "cut", small=False, max_new_tokens=3))
    assert out.label == "backtest_rejected"
    assert out.report.correct_cut_by_truncation == out.report.correct_rollouts > 0  # answers are 4 tokens with the end
    assert "max_new_tokens=3 would cut" in out.reasons[0]
    ok = backtest(evidence, write_harness(tmp_path / "cut8", small=False, max_new_tokens=8))
    assert ok.label == "passed" and ok.report.correct_cut_by_truncation == 0


def test_filter_that_drops_live_groups_is_rejected(tmp_path, evidence):
    out = backtest(evidence, write_harness(tmp_path / "f", {"group_filter.py": KEEP_DEAD_ONLY}, small=False,
                                         group_filter="only_dead"))
    assert out.label == "backtest_rejected" and "scores disagree" in " ".join(out.reasons)


def test_a_knob_a_backtest_cannot_see_passes_with_a_note(tmp_path, evidence):
    out = backtest(evidence, write_harness(tmp_path / "lr", small=False, lr=1e-4))
    assert out.label == "passed" and out.report.unchanged and not out.judged
    assert any("cannot see" in n for n in out.report.notes)
    assert backtest(evidence, write_harness(tmp_path / "pc", small=False, reward="partial_credit")).judged


@pytest.mark.parametrize("src, label, expect", [
    ("def r(x):\n    return 1 / 0\n", "crash", "ZeroDivisionError"),
    ("import torch\ndef r(x):\n    return torch.full((len(x.completions),), float('nan'))\n", "crash", "non-finite"),
    ("import torch\ndef r(x):\n    return torch.zeros(3, 3)\n", "crash", "shape"),
    ("def r(x):\n    while True:\n        pass\n", "timeout", "killed after"),
])
def test_broken_candidate_is_a_labelled_failure_with_its_log(tmp_path, evidence, src, label, expect):
    # a short deadline only where the code never ends: a crash needs time to import torch first
    out = backtest(evidence, write_harness(tmp_path / "b", {"reward.py": src}, small=False, reward="r"),
                   timeout_s=6 if label == "timeout" else 120)
    assert out.label == label and out.report is None
    assert expect in " ".join(out.reasons) + out.log_tail
    if label == "crash":
        assert "Traceback" in out.log_tail


@pytest.mark.parametrize("src, words", [
    ("def r(x:\n    return x.scores\n", ["syntax error"]),
    ("import socket\ndef r(x):\n    return x.scores\n", ["socket", "network"]),
])
def test_illegal_candidate_never_runs(tmp_path, evidence, src, words):
    out = backtest(evidence, write_harness(tmp_path / "i", {"reward.py": src}, small=False, reward="r"))
    assert out.label == "illegal"
    assert all(w in " ".join(out.reasons) for w in words)


def test_budget_is_checked_against_the_evidences_own_harness(tmp_path, evidence):
    out = backtest(evidence, write_harness(tmp_path / "big", small=False, group_size=16))
    assert out.label == "illegal" and "compute budget" in out.reasons[0]


def test_cli_exit_codes_and_files(tmp_path, evidence, capsys):
    assert main(["backtest", "--evidence", str(evidence), "--harness", str(LENGTH_PAY), "--out", str(tmp_path / "o")]) == 1
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["label"] == "backtest_rejected" and result["ordering_violations"] == 0
    assert err.strip().splitlines()[-1].startswith("evotrainer: rejected: backtest_rejected")
    md = (tmp_path / "o" / "backtest.md").read_text()
    assert "tracks length" in md and "rejections did not gain when trained" in md  # the verdict, with its record
    assert json.loads((tmp_path / "o" / "backtest.json").read_text())["label"] == "backtest_rejected"

    pc = PARTIAL_CREDIT
    assert main(["backtest", "--evidence", str(evidence), "--harness", str(pc)]) == 0
    assert json.loads(capsys.readouterr()[0].strip().splitlines()[-1])["label"] == "passed"

    assert main(["backtest", "--evidence", str(tmp_path / "none"), "--harness", str(pc)]) == 2
    err = capsys.readouterr()[1].strip().splitlines()
    assert len(err) == 1 and "no rollout evidence" in err[0]


def test_a_verdict_is_printed_with_what_such_verdicts_predicted_on_the_tables(tmp_path):
    tables = {"a": Agreement(judged=4, gained=3, passed=3, passed_gained=2, rejected_lost=0),
              "b": Agreement(judged=2, gained=1, passed=1, passed_gained=1, rejected_lost=1)}
    assert sum(tables.values(), Agreement()).agreed == 4
    assert verdict_note("passed", tables=tables).startswith("on the landscape tables 3 of 4 passes gained")
    assert "1 of 2 rejections did not gain when trained (4 of 6 judged moves gained)" in \
        verdict_note("backtest_rejected", tables=tables)
    assert "predicts nothing" in verdict_note("passed", judged=False, tables=tables)
    measured.write(tables, tmp_path / "m.json")
    assert measured.read(tmp_path / "m.json") == tables
    assert "not measured" in verdict_note("passed", tables=measured.read(tmp_path / "none.json"))
    shipped = measured.read()  # the package's own, from the committed tables
    assert shipped and all(a.passed <= a.judged and a.passed_gained <= a.passed for a in shipped.values())


def test_config_is_validated():
    with pytest.raises(ValueError, match="max_violation_rate"):
        BacktestConfig(max_violation_rate=2).validate()


def test_two_harnesses_alike_on_one_policy_s_rollouts_can_differ_on_another_s(tmp_path, evidence):
    """Partial credit equals the binary reward on rollouts whose every wrong answer shares no
    position with the answer, and differs on near misses: the twin check asks every
    directory a training sampled, not only the parent's."""
    from evotrainer.backtest.run import same_signal
    all_or_nothing = write_train_dir(readable(tmp_path) / "all-or-nothing")
    lines = []
    for line in (all_or_nothing / "evidence.jsonl").read_text().splitlines():
        r = json.loads(line)
        if not r["score"]:
            r["completion"] = "x" * len(r["completion"])  # no digit in place: no partial credit
        lines.append(json.dumps(r))
    (all_or_nothing / "evidence.jsonl").write_text("\n".join(lines) + "\n")
    binary = write_harness(tmp_path / "binary", small=False, group_filter="drop_dead")
    partial = write_harness(tmp_path / "partial", small=False, group_filter="drop_dead", reward="partial_credit")
    parent = all_or_nothing / "harness"
    assert same_signal([all_or_nothing], partial, binary, parent)
    assert not same_signal([all_or_nothing, evidence], partial, binary, parent)
    assert same_signal([all_or_nothing, evidence], binary, binary, parent)
    assert same_signal([], partial, binary, parent)  # nothing to ask: the caller's other evidence decides
    assert not same_signal([tmp_path / "pruned"], binary, binary, parent)  # what cannot be checked is not alike


def test_what_a_rescore_worker_returns_is_checked_before_it_is_read():
    """The rescore ran the candidate's code: its result must be a number or flag per rollout."""
    from evotrainer.backtest.run import checked_rescore
    good = {"reward": [1.0, 0.0], "advantage": [0.5, -0.5], "score": [1.0, 0.0], "kept": [True, True],
            "cut": [False, False], "group_size": 2, "max_new_tokens": 8, "evidence_max_new_tokens": 8}
    checked_rescore(good, 2)
    for bad in ([], good | {"reward": [1.0]}, good | {"kept": ["yes", "no"]}, good | {"group_size": 0},
                good | {"advantage": None}, {k: v for k, v in good.items() if k != "cut"}):
        with pytest.raises(ValueError):
            checked_rescore(bad, 2)
