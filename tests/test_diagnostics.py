"""Diagnostics: metric values on hand-made evidence, the rule engine, diagnostics a harness
adds or revises (run in a worker), the health report, and diagnostic replay."""
import json
from pathlib import Path

import pytest
from evidence_factory import write_train_dir
from helpers import write_harness

from evotrainer.cli import main
from evotrainer.diagnostics import Evidence, findings, measure
from evotrainer.diagnostics.evidence_view import quantile, spearman
from evotrainer.diagnostics.health import diagnose
from evotrainer.diagnostics.load import harness_diagnostics
from evotrainer.diagnostics.replay import replay, separation_auc
from evotrainer.errors import HarnessFailed, UsageError
from evotrainer.evidence import RolloutRecord

BUILTIN = harness_diagnostics()


def rec(step=1, group=0, score=0.0, reward=None, adv=0.0, completion="12", answer="12", length=3,
        truncated=False, kept=True, logp=-0.5, ent=0.5, **extra):
    return RolloutRecord(step=step, group_id=group, prompt_id="p", prompt="p", answer=answer, level=1,
                         completion=completion, score=score, reward=score if reward is None else reward,
                         advantage=adv, length=length, truncated=truncated, mean_logprob=logp, entropy=ent,
                         kept=kept, **extra)


def value(name, records, steps=()):
    return BUILTIN[name](Evidence.of(records, steps))


def test_length_drift_is_length_bought_without_accuracy_and_sampled_per_kept_is_refill_cost():
    def run(lengths, scores):  # one group of 4 rollouts a step
        return [rec(step=i + 1, group=i, score=sc, length=n, adv=0.0) for i, (n, s) in enumerate(zip(lengths, scores))
                for sc in (s, 0.0, 0.0, 0.0)]
    flat = [0.0] * 8
    assert value("length_drift", run([10] * 4 + [20] * 4, flat)) == pytest.approx(0.6931, abs=1e-4)
    assert value("length_drift", run([20] * 4 + [10] * 4, flat)) == 0.0  # shorter is no drift
    assert value("length_drift", run([10] * 4 + [20] * 4, [0.0] * 4 + [1.0] * 4)) == 0.0  # accuracy rose with it
    assert value("length_drift", run([10, 20], flat[:2])) is None  # too few steps to compare
    # step 1: 2 groups, both trained; step 2: 4 groups sampled to train 1 (a refill)
    groups = [(1, 0, True), (1, 1, True), (2, 0, False), (2, 1, True), (2, 2, False), (2, 3, False)]
    assert value("sampled_per_kept", [rec(step=s, group=g, kept=k) for s, g, k in groups for _ in range(2)]) == 2.0  # 6 / 3
    assert value("sampled_per_kept", [rec(kept=False)]) is None  # nothing trained


def test_signal_metrics_on_hand_made_groups():
    dead = [rec(group=0, score=0.0) for _ in range(4)]
    live = [rec(group=1, score=s, adv=a) for s, a in [(1, 1.5), (0, -0.5), (0, -0.5), (0, -0.5)]]
    assert value("dead_group_ratio", dead + live) == 0.5
    assert value("reward_spread", dead + live) == pytest.approx((0 + 0.4330127) / 2, abs=1e-6)
    assert value("degenerate_advantage", dead + live) == 0.5
    assert value("off_score_signal", dead + live) == 0.0
    shaped = [rec(group=0, score=0.0, reward=r, adv=a) for r, a in [(0.1, -1), (0.3, 1), (0.1, -1), (0.3, 1)]]
    assert value("off_score_signal", shaped + live) == pytest.approx(4 / 7)
    assert value("majority_score_share", dead + live) == 7 / 8


def test_behavior_and_efficiency_metrics():
    rs = [rec(completion="12", answer="12", length=3), rec(completion="", length=1),
          rec(completion="1a", length=3), rec(completion="12121212", length=9, truncated=True)]
    assert value("format_failure_rate", rs) == 0.75  # empty, a letter, cut off
    assert value("truncation_rate", rs) == 0.25
    assert value("repetition_rate", rs) == pytest.approx((4 / 6) / 4)  # "12121212": 6 trigrams, 2 distinct
    assert value("length_p50", rs) == 3 and value("length_p90", rs) == pytest.approx(quantile([1, 3, 3, 9], 0.9))
    assert value("group_diversity", rs) == 1.0
    assert value("mean_logprob", rs) == -0.5


def test_agentic_and_kl_metrics_only_where_the_evidence_has_them():
    plain = [rec()]
    assert value("turns_mean", plain) is None and value("tool_failure_rate", plain) is None
    assert value("kl", plain, [{"step": 1, "kl": 0.0}]) is None
    agent = [rec(turns=6, tool_calls=10, tool_failures=2), rec(turns=4, tool_calls=10, tool_failures=4)]
    assert value("turns_mean", agent) == 5 and value("tool_calls_mean", agent) == 10
    assert value("tool_failure_rate", agent) == 0.3
    assert value("self_test_rate", agent) is None and value("edit_coverage", agent) is None  # nobody edited
    two_steps = [rec(step=1), rec(step=2)]  # the last window of two steps is step 2
    assert value("kl", two_steps, [{"step": 1, "kl": 0.2}, {"step": 2, "kl": 0.4}]) == pytest.approx(0.4)
    sev = {f.diagnostic: f.severity for f in findings(BUILTIN, measure(BUILTIN, Evidence.of(agent)))}
    assert sev["tool_failure_rate"] == "warning"


def test_code_metrics_only_where_programs_ran():
    from evotrainer.diagnostics.health import to_markdown
    from evotrainer.diagnostics.library import failure_counts
    assert value("syntax_error_rate", [rec()]) is None and value("top_failure_share", [rec()]) is None
    code = [rec(score=1.0, outcome="passed"), rec(score=0.5, outcome="failed", failure="wrong output"),
            rec(outcome="syntax_error", failure="SyntaxError"), rec(outcome="runtime_error", failure="NameError"),
            rec(outcome="runtime_error", failure="NameError"), rec(outcome="timeout", failure="timeout")]
    assert value("syntax_error_rate", code) == pytest.approx(1 / 6)
    assert value("program_timeout_rate", code) == pytest.approx(1 / 6)
    assert value("runtime_error_rate", code) == pytest.approx(2 / 6)
    assert value("test_pass_fraction", code) == pytest.approx(1.5 / 6)
    assert failure_counts(Evidence.of(code))[0] == ("NameError", 2)
    assert value("top_failure_share", code) == pytest.approx(2 / 5)
    sev = {f.diagnostic: f.severity for f in findings(BUILTIN, measure(BUILTIN, Evidence.of(code)))}
    assert sev["program_timeout_rate"] == "warning" and sev["runtime_error_rate"] == "warning"
    rep = {"source": "x", "rollouts": 6, "steps": "step 1", "first_window": "", "last_window": "", "harness": None,
           "findings": [], "failures": failure_counts(Evidence.of(code)), "diagnostics": []}
    assert "NameError 40%, SyntaxError 20%" in to_markdown([rep])


def trend(reward_rise, score_rise, steps=10):
    """Evidence whose mean reward and score move linearly over the steps."""
    out = []
    for s in range(1, steps + 1):
        frac = (s - 1) / (steps - 1)
        for g in range(4):
            sc = 0.2 + score_rise * frac
            out += [rec(step=s, group=g, score=float(i < 8 * sc), reward=float(i < 8 * sc) + reward_rise * frac)
                    for i in range(8)]
    return Evidence.of(out)


def test_reward_rising_while_score_is_flat_is_a_blocking_finding():
    hacked = trend(reward_rise=0.3, score_rise=0.0)
    values = measure(BUILTIN, hacked)
    assert values["reward_score_divergence"] == pytest.approx(0.3 * 0.8, abs=0.05)
    found = {f.diagnostic: f for f in findings(BUILTIN, values)}
    f = found["reward_score_divergence"]
    assert f.severity == "critical" and f.blocking and "reward hacking" in f.suggest
    honest = measure(BUILTIN, trend(reward_rise=0.0, score_rise=0.4))
    assert honest["reward_score_divergence"] < 0.05 and honest["score_trend"] > 0.2
    assert "reward_score_divergence" not in {f.diagnostic for f in findings(BUILTIN, honest)}


def low_accuracy(seed, p0, p1, steps=25, groups=16, size=8):
    """Exact match a rare event rising from p0 to p1, under a graded reward that rises anyway."""
    import random
    rng, out = random.Random(seed), []
    for s in range(steps):
        p = p0 + (p1 - p0) * s / (steps - 1)
        for g in range(groups):
            for _ in range(size):
                sc = float(rng.random() < p)
                out.append(rec(step=s + 1, group=g, score=sc, reward=max(sc, 0.2 + 0.3 * s / steps + 0.1 * rng.random())))
    return Evidence.of(out)


def test_a_small_steady_score_rise_backs_a_graded_reward_and_a_flat_one_does_not():
    """The verifier score's trend over every step decides, so a rise of a few points at low
    accuracy is seen through the noise; the same reward over a flat score stays a hack."""
    div = BUILTIN["reward_score_divergence"]
    rising = [div(low_accuracy(k, 0.03, 0.07)) for k in range(20)]
    flat = [div(low_accuracy(k, 0.05, 0.05)) for k in range(20)]
    assert sum(v == 0 for v in rising) >= 15
    assert sum(v > 0.03 for v in flat) >= 19  # critical: the reward rose ~0.24, the score did not


def test_compound_rule_picks_the_intervention_family():
    d = BUILTIN["dead_group_ratio"]
    sparse = d.suggest({"majority_score_share": 0.8})
    assert "more continuous" in sparse and "drop dead groups" in d.suggest({"majority_score_share": 0.4})
    found = findings(BUILTIN, {"dead_group_ratio": 0.6, "majority_score_share": 0.9, "truncation_rate": 0.15})
    assert [(f.diagnostic, f.severity) for f in found] == [("dead_group_ratio", "critical"), ("truncation_rate", "warning")]
    assert found[0].suggest == sparse


def test_health_report_flags_dead_groups_of_a_low_accuracy_run(tmp_path, capsys):
    run = write_train_dir(tmp_path / "ref")
    assert main(["diagnose", str(run)]) == 0
    summary = json.loads(capsys.readouterr()[0].strip().splitlines()[-1])
    assert summary["versions"][0]["findings"][0].startswith("warning: dead_group_ratio")
    report = json.loads((run / "health.json").read_text())["reports"][0]
    dead = [f for f in report["findings"] if f["diagnostic"] == "dead_group_ratio"][0]
    # half the groups are nearly never solved: ~44% dead, past EvoTrainer's 30% warning line
    assert dead["severity"] == "warning" and 0.3 < dead["value"] < 0.5 and "more continuous" in dead["suggest"]
    md = (run / "health.md").read_text()
    assert "| warning | `dead_group_ratio` (signal)" in md and "### Diagnostics" in md
    assert {d["layer"] for d in report["diagnostics"]} >= {"score", "signal", "behavior", "efficiency", "model_state"}


def test_run_directory_reports_every_version_and_bad_paths_are_usage_errors(tmp_path, capsys):
    write_train_dir(tmp_path / "run" / "v0", steps=4)
    write_train_dir(tmp_path / "run" / "v1", steps=4, seed=1)
    assert [r["source"].rsplit("/", 1)[1] for r in diagnose(tmp_path / "run")] == ["v0", "v1"]
    assert main(["diagnose", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr()[1].strip().splitlines()
    assert len(err) == 1 and "no rollout evidence" in err[0]


REVISED = '''\
from evotrainer.diagnostics import Evidence, diagnostic
from evotrainer.diagnostics.library import dead_group_ratio as _builtin


@diagnostic("signal", warn=0.9, critical=0.95, suggest="revised: this task lives with dead groups")
def dead_group_ratio(ev: Evidence):
    """The built-in, with thresholds this harness chose."""
    return _builtin.fn(ev)


@diagnostic("behavior", warn=0.5, suggest="reward: stop long answers")
def long_answers(ev: Evidence):
    """Share of completions longer than their reference answer."""
    return sum(len(r.completion) > len(r.answer) for r in ev.records) / len(ev.records)


def answer_count(ev):
    """Rollouts in the window (a plain function: reported, never a finding)."""
    return len(ev.records)
'''


def test_harness_adds_and_revises_diagnostics(tmp_path):
    run = write_train_dir(tmp_path / "ref", length_drift=0.9)
    h = write_harness(tmp_path / "h", {"diagnostics.py": REVISED})
    report = diagnose(run, h)[0]  # has a diagnostics.py: computed in a worker
    diags = {d["name"]: d for d in report["diagnostics"]}
    assert diags["dead_group_ratio"]["thresholds"] == "warning > 0.9, critical > 0.95"
    assert diags["long_answers"]["layer"] == "behavior" and diags["long_answers"]["value"] > 0.5
    assert diags["answer_count"]["layer"] == "custom" and diags["answer_count"]["value"] == 16 * 8 * 3
    found = {f["diagnostic"] for f in report["findings"]}
    assert "long_answers" in found and "dead_group_ratio" not in found


@pytest.mark.parametrize("src, label, expect", [
    ("from evotrainer.diagnostics import diagnostic\n\n@diagnostic('signal')\ndef boom(ev):\n    return 1 / 0\n",
     "crash", "ZeroDivisionError"),
    ("from evotrainer.diagnostics import diagnostic\n\n@diagnostic('signal')\ndef spin(ev):\n    while True:\n        pass\n",
     "timeout", "killed after"),
    ("def broken(ev:\n    return 0\n", "illegal", "syntax error"),
    ("import socket\n\ndef peek(ev):\n    return 0.0\n", "illegal", "network access"),
    ("from evotrainer.diagnostics.health import load_evidence\n\ndef peek(ev):\n    return 0.0\n",
     "illegal", "controller-side"),
])
def test_broken_or_illegal_diagnostics_are_labelled(tmp_path, src, label, expect):
    run = write_train_dir(tmp_path / "ref", steps=3)
    with pytest.raises(HarnessFailed) as e:
        diagnose(run, write_harness(tmp_path / "h", {"diagnostics.py": src}),
                 timeout_s=6 if label == "timeout" else 120)
    assert e.value.label == label and expect in str(e.value) + e.value.log_tail
    if label == "crash":
        assert "Traceback" in e.value.log_tail


def test_separation_auc():
    assert separation_auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert separation_auc([0.1], [0.9]) == 0.0 and separation_auc([0.1], [0.9], above=False) == 1.0
    assert separation_auc([0.5], [0.5]) == 0.5 and separation_auc([], [1.0]) is None
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)


def length_pay(rows, step):
    return [r["score"] + 0.5 * r["length"] / 9 for r in rows]


def test_replay_keeps_a_diagnostic_that_separates_failed_versions(tmp_path, capsys):
    held = [write_train_dir(tmp_path / f"ok{s}", seed=s, p_mixed=lambda t: 0.2 + 0.03 * t) for s in range(2)]
    bad = [write_train_dir(tmp_path / f"hack{s}", seed=10 + s, reward_fn=length_pay, length_drift=0.8,
                           p_mixed=lambda t: 0.35 - 0.02 * t) for s in range(2)]
    labelled = [(d, "kept") for d in held] + [(d, "invalid") for d in bad]
    r = replay("reward_score_divergence", labelled)
    assert r.auc == 1.0 and r.kept
    const = write_harness(tmp_path / "h", {"diagnostics.py": "def constant(ev):\n    return 1.0\n"})
    r = replay("constant", labelled, const)  # a harness's own diagnostic: replayed in a worker
    assert r.auc == 0.5 and not r.kept
    args = ["replay", "--diagnostic", "reward_length_coupling"] + [f"{d}={lab}" for d, lab in labelled]
    assert main(args) == 0
    out = json.loads(capsys.readouterr()[0].strip().splitlines()[-1])
    assert out["auc"] == 1.0 and out["kept"] is True
    with pytest.raises(UsageError, match="valid choices: kept"):
        replay("kl", [(held[0], "great")])
    with pytest.raises(UsageError, match="unknown diagnostic 'nope'"):
        replay("nope", labelled)


def test_diagnostics_read_the_evidence_store_as_they_read_a_train_directory(tmp_path):
    from evotrainer.diagnostics.health import load_evidence
    from evotrainer.evidence import EvidenceStore
    run = write_train_dir(tmp_path / "v0", steps=5)
    store = EvidenceStore(tmp_path / "evidence.sqlite")
    store.ingest("v0", run)
    from_store = measure(BUILTIN, Evidence.of(store.query("v0")))
    from_dir = measure(BUILTIN, Evidence.of(load_evidence(run).records))
    assert from_store == from_dir and from_store["dead_group_ratio"] > 0.3


def test_behaviour_metrics_of_repository_episodes():
    def ep(tools, edited="", target="m.py", stop="fail", git=0, **kw):
        t = tools.split()
        return rec(turns=len(t), tool_calls=len(t), tool_failures=0, tool_sequence=tools, stop=stop,
                   files_edited=edited, target_files=target, git_access=git, **kw)
    eps = [ep("read edit test submit", "m.py", stop="success"),   # read first, tested after the edit
           ep("edit submit", "n.py"),                              # edited the wrong file, never tested
           ep("list list list list list", stop="turn_cap"),         # a loop of one tool
           ep("submit", stop="abandon", git=1)]
    assert value("self_test_rate", eps) == 0.5
    assert value("edit_coverage", eps) == 0.5
    assert value("search_before_edit", eps) == 0.5
    assert value("longest_tool_run", eps) == pytest.approx((1 + 1 + 5 + 1) / 4)
    assert value("abandonment_rate", eps) == 0.25 and value("cap_rate", eps) == 0.25
    assert value("git_history_access", eps) == 0.25 and value("echo_trap_rate", eps) == 0.0
    assert value("solution_diversity", eps) == 1.0            # m.py and n.py: nothing shared
    assert value("tool_entropy", [ep("list list")]) == 0.0 and value("tool_entropy", [ep("read edit")]) == 1.0
    assert value("format_failure_rate", eps) is None           # transcripts are not answers


def test_a_reward_that_pays_for_fewer_turns_is_a_blocking_finding():
    # groups where every episode failed (score 0) yet the reward still moves: with turns, it pays the behaviour
    def group(g, pay):
        return [rec(group=g, turns=t, tool_calls=t, tool_failures=0, score=0.0,
                    reward=(1 - t / 4) if pay else 0.0) for t in (1, 2, 3, 4)]
    hacked = [r for g in range(4) for r in group(g, True)]
    honest = [r for g in range(4) for r in group(g, False)]
    assert value("reward_turn_coupling", hacked) == pytest.approx(1.0)
    assert value("reward_turn_coupling", honest) == 0.0
    assert value("reward_turn_coupling", [rec()]) is None    # single-turn evidence
    found = {f.diagnostic: f for f in findings(BUILTIN, measure(BUILTIN, Evidence.of(hacked)))}
    assert found["reward_turn_coupling"].severity == "critical" and found["reward_turn_coupling"].blocking


def test_transcript_measures_are_left_to_the_agentic_layer():
    loop = [rec(turns=3, tool_calls=3, tool_failures=0, tool_sequence="list list list", completion="list\na\nlist\na\nlist")]
    assert value("repetition_rate", loop) is None and value("longest_tool_run", loop) == 3


def test_findings_a_harness_worker_returns_are_checked_never_trusted(monkeypatch):
    """A harness's diagnostics run in a worker, which runs its code: what comes back is data to
    check. An unknown severity or a malformed report is one blocking finding, never an error
    of the run (it used to raise in the controller and end the run)."""
    from evotrainer.evolve.segments import findings as diagnosis
    good = {"diagnostic": "dead_group_ratio", "layer": "signal", "severity": "warning", "blocking": False,
            "value": 0.4, "evidence": "e", "suggest": "s", "thresholds": "warning > 0.3"}
    for returned in ([{"findings": [good | {"severity": "apocalyptic"}]}], [{"findings": "none"}], [], [{}],
                     [{"findings": [good | {"value": "high"}]}]):
        monkeypatch.setattr(diagnosis, "diagnose", lambda d, h, returned=returned: returned)
        (f,) = diagnosis.worst_findings(["somewhere"], Path("h"))
        assert f["diagnostic"] == "diagnostics_failed" and f["blocking"] and f["severity"] == "critical"
        assert "its findings do not read" in f["evidence"]
    monkeypatch.setattr(diagnosis, "diagnose", lambda d, h: [{"findings": [good]}])
    assert diagnosis.worst_findings(["somewhere"], Path("h")) == [good]
