"""Approval points: a run paused at design, backtest and completion waits for `evotrainer approve /
revise / abort RUN TRIAL`, and each decision does what it says: approve goes on, revise sends
the person's feedback to the agent for a new proposal under the same trial, abort ends the
trial as `aborted` and the run goes on."""
import dataclasses
import threading
import time

import pytest
import yaml

from evotrainer.agents.interventions import INTERVENTIONS
from evotrainer.cli import main
from evotrainer.config import config_from_dict
from evotrainer.evolve.approval import waiting
from evotrainer.evolve.controller import Controller
from evotrainer.evolve.search.view import RunView
from evotrainer.evolve.status import status
from evotrainer.lineage import LineageStore
from evotrainer.lineage.events import ApprovalDecided, ApprovalWaiting


def start(tiny_run, agent, trials: int, on_event=None, **extra):
    cfg_path, run = tiny_run
    raw = yaml.safe_load(cfg_path.read_text()) | {"final_seeds": [], **extra}
    raw["budget"]["trials"] = trials
    raw["search"] |= {"selection": "greedy"}
    errors = []

    def go():  # the controller owns its SQLite connection: built in the thread that uses it
        try:
            Controller(config_from_dict(raw).validate(), run, on_event, agent=agent, approval_poll_s=0.05).run()
        except BaseException as e:  # surfaced by the test, never swallowed
            errors.append(e)
    th = threading.Thread(target=go, daemon=True)
    th.start()
    return run, th, errors


def next_wait(run, th, errors, timeout=240):
    """The approval the run waits for now (None once the run has finished)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert not errors, errors
        if (run / "lineage.sqlite").exists():
            store = LineageStore(run / "lineage.sqlite")
            open_ = waiting(store.events())
            store.close()
            if open_ and not (run / "approval" / f"trial-{open_[0].trial}.json").exists():
                return open_[0]
        if not th.is_alive():
            return None
        time.sleep(0.05)
    raise AssertionError("the run neither waited at an approval point nor finished")


def decide(capsys, *args) -> int:
    rc = main([str(a) for a in args])
    capsys.readouterr()
    return rc


@pytest.mark.slow
def test_approve_revise_and_abort_each_do_what_they_say(tiny_run, capsys):
    seen = []

    def agent(ctx):  # the rules agent's catalog, in a fixed order, told what a person said
        seen.append((ctx.trial, ctx.feedback, sorted(ctx.tried)))
        name = next(n for n in ["warmup", "lower_lr", "raise_temperature", "entropy_bonus"] if n not in ctx.tried)
        return dataclasses.replace(INTERVENTIONS.get(name)(ctx.knobs, 1), agent="scripted",
                                   usage={"calls": 1, "prompt_tokens": 100, "completion_tokens": 10})

    run, th, errors = start(tiny_run, agent, trials=3, approval={"at": ["design", "backtest", "completion"]})
    # the plan: trial 1 revised at design then approved throughout; trial 2 aborted at design;
    # trial 3 approved to completion and aborted there
    plan = {(1, "design", 0): ("revise", "--feedback", "not the warmup, try the learning rate"),
            (1, "design", 1): ("approve",), (1, "backtest", 1): ("approve",), (1, "completion", 1): ("approve",),
            (2, "design", 0): ("abort",),
            (3, "design", 0): ("approve",), (3, "backtest", 0): ("approve",), (3, "completion", 0): ("abort",)}
    asked = []
    while (g := next_wait(run, th, errors)) is not None:
        key = g.key
        asked.append(key)
        decision, *rest = plan[key]
        if key == (1, "design", 0):  # a decision for a trial that is not waiting is refused, nothing lost
            assert decide(capsys, "approve", run, 2) == 2
            assert decide(capsys, "revise", run, 1) == 2  # revise needs --feedback
        assert decide(capsys, decision, run, g.trial, *rest) == 0
    th.join(timeout=60)
    assert not errors and asked == list(plan)

    store = LineageStore(run / "lineage.sqlite")
    trials = store.trials()
    t1, t2, t3 = trials[1:]
    # revise: the agent was asked again for trial 1, told the feedback, with warmup counted as tried
    assert seen[1] == (1, "not the warmup, try the learning rate", ["warmup"])
    assert t1.intervention == "lower_lr" and t1.version == "v1r1" and t1.label in ("kept", "discarded")
    assert "warmup" not in t1.patch and (run / "versions" / "v1r1").is_dir()
    # abort at design: recorded with its diff, never backtested or trained
    assert t2.label == "aborted" and "design approval" in t2.reflection and t2.backtest == {}
    assert not (run / "versions" / t2.version).exists()
    # abort at completion: trained and measured, recorded as aborted, never a parent
    assert t3.label == "aborted" and "completion approval" in t3.reflection and t3.fitness.gain is not None
    again = Controller(config_from_dict(yaml.safe_load((run / "config.yaml").read_text())), run)
    assert t3.version not in {s.version for s in RunView.read(again.store).states}  # never a parent, never the winner
    decided = [(e.trial, e.point, e.decision) for e in store.events(ApprovalDecided)]
    assert decided[:2] == [(1, "design", "revise"), (1, "design", "approve")] and len(decided) == len(plan)
    # what proposing cost: trial 1's two rounds add up in its budgets, and status counts each once
    assert t1.budgets["agent"] == {"calls": 2, "prompt_tokens": 200, "completion_tokens": 20}
    assert status(run)["agent_tokens"]["prompt_tokens"] == sum(t.budgets["agent"]["prompt_tokens"]
                                                               for t in trials[1:]) == 400


@pytest.mark.slow
def test_failures_in_a_row_escalate_to_a_design_approval(tiny_run, capsys):
    def agent(ctx):  # twice more training steps than the budget (illegal), then a legal idea
        if ctx.trial < 3:
            return dataclasses.replace(INTERVENTIONS.get("warmup")(ctx.knobs, 1), knobs={"steps": 10_000},
                                       intervention=f"more_steps_{ctx.trial}", agent="scripted")
        return dataclasses.replace(INTERVENTIONS.get("lower_lr")(ctx.knobs, 1), agent="scripted")

    run, th, errors = start(tiny_run, agent, trials=3, approval={"after_failures": 2})
    g = next_wait(run, th, errors)
    assert (g.trial, g.point) == (3, "design")  # trials 1 and 2 failed without asking anyone
    assert decide(capsys, "abort", run, 3) == 0
    assert next_wait(run, th, errors) is None
    th.join(timeout=60)
    store = LineageStore(run / "lineage.sqlite")
    assert [t.label for t in store.trials()[1:]] == ["illegal", "illegal", "aborted"]
    st = status(run)
    assert st["waiting"] == [] and st["labels"] == {"kept": 1, "illegal": 2, "aborted": 1}


def test_gated_points_are_the_configured_ones_plus_design_after_enough_failures():
    from evotrainer.config import ApprovalConfig
    from evotrainer.evolve.approval import points
    assert points(ApprovalConfig(("backtest",), 0), 5) == {"backtest"}                  # 0: never escalate to an approval
    assert points(ApprovalConfig(("backtest",), 2), 1) == {"backtest"}
    assert points(ApprovalConfig(("backtest",), 2), 2) == {"backtest", "design"}
    assert points(ApprovalConfig((), 3), 4) == {"design"}


@pytest.mark.slow
def test_a_run_killed_while_waiting_for_approval_resumes_waiting_and_takes_the_decision(tiny_run):
    """SIGKILL while the run waits; the decision is sent while nothing runs; `resume` shows the
    approval again, reads the decision, records it once and finishes the trial."""
    import os
    import signal
    import subprocess
    import sys
    cfg_path, run = tiny_run
    raw = yaml.safe_load(cfg_path.read_text()) | {"final_seeds": [], "approval": {"at": ["design"]}, "agent": "rules"}
    raw["budget"]["trials"] = 1
    cfg_path.write_text(yaml.safe_dump(raw))
    cli = [sys.executable, "-m", "evotrainer.cli"]
    p = subprocess.Popen([*cli, "run", str(cfg_path), "--out", str(run)], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        if (run / "lineage.sqlite").exists():
            store = LineageStore(run / "lineage.sqlite")
            open_ = waiting(store.events())
            store.close()
            if open_:
                break
        assert p.poll() is None
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert main(["approve", str(run), "1"]) == 0  # the lineage still says trial 1 waits
    r = subprocess.run([*cli, "resume", str(run)], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "trial 1 waits for approval at design" in r.stderr and "design approval: approve" in r.stderr
    store = LineageStore(run / "lineage.sqlite")
    assert [(e.trial, e.decision) for e in store.events(ApprovalDecided)] == [(1, "approve")]
    assert len(store.events(ApprovalWaiting)) == 1 and store.trials()[1].label in ("kept", "discarded")
    assert not (run / "approval" / "trial-1.json").exists()
