"""The command agent: a small script plays the external coding agent. It reads the brief on
stdin, edits its worktree, writes its proposal; a run records the diff as the patch. A
command that fails, hangs or changes nothing gets its label."""
import json
import sys
import time

import pytest
import yaml

from helpers import agent_context
from evotrainer.agents import AgentFailed, Proposal
from evotrainer.agents.command import CommandAgent
from evotrainer.config import CommandConfig
from evotrainer.lineage import LineageStore

AGENT = """
import json, pathlib, sys
brief = sys.stdin.read()
assert "Health report" in brief and "knobs.yaml" in brief, brief[:200]
k = pathlib.Path("knobs.yaml")
k.write_text(k.read_text().replace("temperature: 1.0", "temperature: 1.3"))
pathlib.Path(".agent-notes").write_text("a coding CLI's own state")   # byproducts, not the patch
pathlib.Path("__pycache__").mkdir()
pathlib.Path("__pycache__", "reward.cpython-311.pyc").write_text("bytecode")
pathlib.Path(sys.argv[1]).write_text(json.dumps({
    "name": "warmer_sampling", "hypothesis": "changing temperature to 1.3 raises accuracy because more groups split",
    "expected_effect": "fewer dead groups", "success_criterion": "val beats control", "rollback": "temperature 1.0"}))
print("edited knobs.yaml")
"""


@pytest.fixture
def ctx(tmp_path):
    return agent_context(tmp_path=tmp_path, parent="v0", trial=1)


def script(tmp_path, body: str) -> str:
    f = tmp_path / "agent.py"
    f.write_text(body)
    return f"{sys.executable} {f} {{proposal}}"


def test_the_command_edits_its_worktree_and_its_proposal_and_output_are_kept(tmp_path, ctx):
    p = CommandAgent(CommandConfig(run=script(tmp_path, AGENT), timeout_s=60), "arith level 3")(ctx)
    assert isinstance(p, Proposal) and p.agent == "command" and p.intervention == "warmer_sampling"
    assert list(p.files) == ["knobs.yaml"] and "temperature: 1.3" in p.files["knobs.yaml"]
    assert p.hypothesis.startswith("changing temperature") and p.expected == "fewer dead groups"
    assert p.usage["exit"] == 0 and "edited knobs.yaml" in open(p.usage["output"]).read()
    assert (ctx.harness_dir / "knobs.yaml").read_text().count("temperature: 1.0") == 1  # the parent untouched


@pytest.mark.parametrize("body, timeout_s, label, why", [
    ("import sys; print('giving up'); sys.exit(3)", 60, "agent_error", "exit 3; output: giving up"),
    ("print('nothing to do')", 60, "patch_failed", "changed no harness file"),
    ("import pathlib; pathlib.Path('reward.py').write_text('def r(x:\\n')", 60, "syntax_error", "reward.py:1"),
    ("import subprocess, sys, time\n"
     "subprocess.Popen([sys.executable, '-c', 'import time, pathlib; time.sleep(3); pathlib.Path(\"late\").write_text(\"x\")'])\n"
     "time.sleep(60)", 1, "agent_timeout", "killed after 1 s"),
])
def test_a_command_that_fails_hangs_or_changes_nothing_gets_its_label(tmp_path, ctx, body, timeout_s, label, why):
    out = CommandAgent(CommandConfig(run=script(tmp_path, body), timeout_s=timeout_s), "arith")(ctx)
    assert isinstance(out, AgentFailed) and out.label == label and why in out.reason
    if label == "agent_timeout":  # the whole process group died: the grandchild never wrote its file
        time.sleep(3.5)
        assert not list((ctx.workdir).rglob("late"))


@pytest.mark.slow
def test_a_run_with_the_command_agent_records_its_diff_and_hypothesis(tiny_run, tmp_path):
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller
    cfg, run = tiny_run
    raw = yaml.safe_load(cfg.read_text())
    raw |= {"agent": "command", "command": {"run": script(tmp_path, AGENT), "timeout_s": 60}, "final_seeds": []}
    raw["budget"]["trials"] = 1
    ctl = Controller(config_from_dict(raw).validate(), run)
    ctl.run()
    t = ctl.store.trials()[1]
    assert t.agent == "command" and t.intervention == "warmer_sampling" and t.label in ("kept", "discarded")
    assert "-temperature: 1.0" in t.patch and "+temperature: 1.3" in t.patch
    assert t.hypothesis.startswith("changing temperature") and t.budgets["agent"]["exit"] == 0
    assert json.loads((run / "agents" / "trial-1-command" / "proposal.json").read_text())["name"] == "warmer_sampling"
    assert LineageStore(run / "lineage.sqlite").pending() == []
