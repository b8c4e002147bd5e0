"""Diagnostic revision by the agent: a new diagnostic in a proposal is replayed over the run's
earlier versions and kept only if it separates the failed ones from those that held up; a kept
diagnostics-only change trains nothing, and its version's health report carries the new findings."""
import dataclasses

import pytest
import yaml

from evotrainer.agents import Proposal
from evotrainer.agents.interventions import INTERVENTIONS
from evotrainer.config import config_from_dict
from evotrainer.diagnostics.replay import revised_diagnostics
from evotrainer.evolve.controller import Controller, State
from evotrainer.evolve.search.view import RunView

HEADER = "from evotrainer.diagnostics.spec import diagnostic\n\n\n"
# the same on every version: cannot tell a failed version from one that held up (AUC 0.5)
CONSTANT = HEADER + '@diagnostic("custom", warn=0.5)\ndef always_one(ev):\n    """One, whatever happened."""\n    return 1.0\n'
# rollouts per group: 4 under the root, 8 under larger_groups, which the gate discards below
GROUP = HEADER + ('@diagnostic("signal", warn=3, suggest="signal: fewer rollouts per group")\n'
                  'def group_width(ev):\n    """Rollouts per prompt group."""\n    return float(len(ev.groups[0]))\n')


def diag(name: str, source: str) -> Proposal:
    return Proposal(name, "diagnostics", f"a diagnostic {name} tells failed versions from kept ones",
                    "training", "it separates them on replay", "remove it", files={"diagnostics.py": source},
                    agent="scripted")


@pytest.mark.slow
def test_a_revised_diagnostic_is_kept_only_if_its_replay_separates_failed_from_held_up(tiny_run):
    def agent(ctx):
        if ctx.trial == 1:
            return dataclasses.replace(INTERVENTIONS.get("larger_groups")(ctx.knobs, 1), agent="scripted")
        return diag("always_one", CONSTANT) if ctx.trial == 2 else diag("group_width", GROUP)

    cfg_path, run = tiny_run
    raw = yaml.safe_load(cfg_path.read_text()) | {"final_seeds": []}
    raw["budget"]["trials"] = 3
    raw["search"] |= {"selection": "greedy", "escalation": False}
    raw["promotion"] = {"min_gain": 1.0}  # nothing beats its control: larger_groups is a failed version
    ctl = Controller(config_from_dict(raw).validate(), run, agent=agent)
    ctl.run()
    t = ctl.store.trials()
    assert [x.label for x in t] == ["kept", "discarded", "diagnostic_rejected", "kept"]
    const, width = t[2].backtest["diagnostics"], t[3].backtest["diagnostics"]
    assert const == [{"diagnostic": "always_one", "auc": 0.5, "kept": False, "versions": 2}]  # v0 held up, v1 failed
    assert width[0]["diagnostic"] == "group_width" and width[0]["auc"] == 1.0 and width[0]["kept"]
    assert "AUC 0.5" in t[2].reflection and not (run / "versions" / "v2").exists()
    # kept without training: its parent's checkpoints under the new harness, at the parent's depth
    parent, kept = RunView.read(ctl.store).plans[3].parent, t[3].fitness.state
    assert t[3].budgets == {} and t[3].depth == parent.depth and not (run / "versions" / "v3").exists()
    assert kept.dirs == parent.dirs and kept.val == parent.val
    # what an agent is shown of v3 carries the new diagnostic's finding; of the root, not
    findings = {v: [f["diagnostic"] for f in ctl.proposer.findings(x.fitness.state)] for v, x in
                (("v0", t[0]), ("v3", t[3]))}
    assert "group_width" in findings["v3"] and "group_width" not in findings["v0"]


def test_revised_diagnostics_are_found_statically(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "diagnostics.py").write_text(CONSTANT)
    (b / "diagnostics.py").write_text(CONSTANT.replace("return 1.0", "return 2.0") + "\n\n" + GROUP.split("\n\n\n")[1]
                                      + '\n\ndef _helper(ev):\n    return 0\n')
    assert revised_diagnostics(a, b) == ["always_one", "group_width"]
    assert revised_diagnostics(a, a) == [] and revised_diagnostics(tmp_path / "none", a) == ["always_one"]
    # a change outside any diagnostic (a constant, a helper) may change them all: all are replayed
    (b / "diagnostics.py").write_text(CONSTANT + "\nLIMIT = 3\n")
    assert revised_diagnostics(a, b) == ["always_one"]


def test_diagnostics_that_fail_to_run_are_a_blocking_finding_not_a_crash(tmp_path, ckpt):
    """A kept harness whose diagnostics.py raises on some evidence: the state is reported with a
    blocking `diagnostics_failed` finding (so nothing under it is promoted), and the run goes on."""
    from evotrainer.trainer.jobs import train_segment
    cfg = config_from_dict({"task": "arith", "level": 1, "seeds": [0], "final_seeds": [],
                            "model": str(ckpt), "search": {"skills": None}}).validate()
    ctl = Controller(cfg, tmp_path / "run")
    ctl.setup()
    ctl.harnesses.candidate("v0", "v1", knobs={}, hypothesis="a broken diagnostic", files={"diagnostics.py": HEADER + (
        '@diagnostic("custom", warn=1)\ndef broken(ev):\n    """Divides by zero."""\n    return 1 / 0\n')})
    knobs = (ctl.harnesses.dir("v0") / "knobs.yaml").read_text()
    for a, b in [("prompts_per_step: 64", "prompts_per_step: 2"), ("group_size: 8", "group_size: 2")]:
        knobs = knobs.replace(a, b)
    small = tmp_path / "small"
    small.mkdir()
    (small / "knobs.yaml").write_text(knobs)
    train_segment(task="arith", level=1, harness=str(small), base=str(ckpt), out=str(tmp_path / "seg"), seed=0,
                  steps=1)
    found = ctl.proposer.findings(State("v1", 1, {0: str(tmp_path / "seg")}, {0: 0.0}, {0: 0.0}))
    assert found[0]["diagnostic"] == "diagnostics_failed" and found[0]["blocking"]
    assert "ZeroDivisionError" in found[0]["evidence"]
