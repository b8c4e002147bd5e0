"""The evolution loop end to end on a tiny budget: a run killed with SIGKILL mid-trial resumes
with no lost and no duplicated trial; bad configs are refused before any work."""
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from helpers import readable, start_cli, write_harness

from evotrainer.cli import main
from evotrainer.evolve.search.view import RunView
from evotrainer.harness.versions import HarnessRepo
from evotrainer.lineage import LineageStore
from evotrainer.lineage.events import TrialResumed


@pytest.mark.slow
def test_sigkill_mid_trial_then_resume_completes_every_trial_once(tiny_run):
    cfg, run = tiny_run
    p = start_cli("run", cfg, "--out", run, "--json")
    deadline = time.time() + 240
    while time.time() < deadline:  # wait until trial 1 trains, then kill everything
        db = run / "lineage.sqlite"
        if db.exists() and (run / "versions" / "v1").exists():
            store = LineageStore(db)
            started = [s.trial for s in store.pending()]
            store.close()
            if 1 in started:
                break
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    store = LineageStore(run / "lineage.sqlite")
    assert [t.id for t in store.trials()] == [0] and [s.trial for s in store.pending()] == [1]
    store.close()

    r = start_cli("resume", run, "--json")
    out, err = r.communicate(timeout=400)
    assert r.returncode == 0, err.decode()[-2000:]
    store = LineageStore(run / "lineage.sqlite")
    trials = store.trials()
    assert [t.id for t in trials] == [0, 1, 2] and store.pending() == []
    assert [t.version for t in trials] == ["v0", "v1", "v2"]
    assert HarnessRepo(run / "harness-repo").versions() == ["v0", "v1", "v2"]  # the resumed child is not made twice
    assert [e.trial for e in store.events(TrialResumed)] == [1]
    assert all(t.label in ("kept", "discarded") for t in trials)
    st = json.loads(out.decode().strip().splitlines()[-1])
    assert st["trials"] == 3 and st["state"] == "finished" and 0 <= st["framework_overhead"] < 1
    # the final comparison: the winner's schedule and the reference, replayed on the fresh seed
    final = json.loads((run / "final.json").read_text())
    assert st["final"]["seeds"] == [100] and len(final["schedule"]) == 3  # total 6 steps / 2 per segment
    assert (run / "final" / "evolved" / "seed-100" / "segment-3" / "checkpoint").is_dir()
    assert len((run / "final" / "reference" / "seed-100" / "segment-1" / "metrics.jsonl").read_text().splitlines()) == 6
    assert "evolved - reference, test" in final["table"]


@pytest.mark.slow
def test_restart_mode_trains_every_version_from_the_base_against_its_parent(tiny_run, monkeypatch):
    import yaml

    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller
    from evotrainer.evolve.segments.pipeline import Segments
    cfg_path, run = tiny_run
    raw = yaml.safe_load(cfg_path.read_text()) | {"final_seeds": []}
    raw["search"] |= {"mode": "restart"}
    raw["budget"] |= {"trials": 2}
    ctl = Controller(config_from_dict(raw).validate(), run)
    scored, reading, score = [], [], Segments.score

    def read():
        return ctl.proposer.reading()

    def spy(self, jobs, last, clock, also=()):  # what is scored, and whose findings are being read by then
        scored.append({str(job.out) for job in jobs if "/noise/" not in str(job.out)})
        reading.append(read())
        return score(self, jobs, last, clock, also)
    monkeypatch.setattr(Segments, "score", spy)
    ctl.run()
    trials = ctl.store.trials()
    # a trained state's findings are read beside its scoring; a noise replica's never are
    assert read() == set().union(*scored) and all(s <= r for s, r in zip(scored, reading))
    assert [t.id for t in trials] == [0, 1, 2] and not (run / "controls").exists()
    for t in trials:
        if t.version and t.label not in ("illegal", "backtest_rejected"):  # trained: the whole budget, from the base
            metrics = (run / "versions" / t.version / "seed-0" / "metrics.jsonl").read_text().splitlines()
            assert len(metrics) == 6
            assert json.loads((run / "versions" / t.version / "seed-0" / "run.json").read_text())["seed"] == 1
    for t in trials[1:]:
        if t.fitness.decision:  # the control is the parent itself, trained with the same seed
            parent = next(p for p in trials if p.version == t.parents[0])
            assert t.fitness.decision.control_val == parent.fitness.val
    # every trained state's evidence is in the run's store once the run returns (it fills in a thread)
    from evotrainer.evidence import EvidenceStore
    trained = {f"{t.version}/seed-0" for t in trials if t.fitness.state}
    store = EvidenceStore(run / "evidence.sqlite")
    assert trained and trained <= set(store.versions())
    with store.db:  # a kill before a trial's evidence was stored: the next session stores it
        store.db.execute("DELETE FROM rollouts WHERE version = 'v0/seed-0'")
    store.close()
    Controller(config_from_dict(raw).validate(), run).run()
    store = EvidenceStore(run / "evidence.sqlite")
    assert "v0/seed-0" in store.versions()
    store.close()


def test_bad_config_is_refused_before_any_work(tmp_path, capsys, tiny_run):
    cfg, run = tiny_run
    bad = tmp_path / "bad.yaml"
    bad.write_text(cfg.read_text().replace("trials: 2", "trials: -2"))
    assert main(["run", str(bad), "--out", str(run)]) == 2
    err = capsys.readouterr()[1].strip().splitlines()
    assert len(err) == 1 and "'budget.trials' must be > 0" in err[0]
    assert not run.exists()
    assert main(["status", str(tmp_path / "nothing")]) == 2


@pytest.fixture(scope="module")
def sft_base(tmp_path_factory):
    """A real (if small) base: SFT on 1-digit sums to 30%, so it ends its answers, as a base does.
    On a random-init model every answer runs to the budget and a length reward is constant."""
    from evotrainer.catalog import get_task
    from evotrainer.trainer.pretrain import PretrainConfig, pretrain
    cfg = PretrainConfig(max_steps=400, check_every=10, probe_size=20, batch_size=64, target_acc=0.3)
    with fixed_keys():
        path, _ = pretrain(get_task("arith", 1), cfg, readable(tmp_path_factory.mktemp("sft")))
    return path


@contextlib.contextmanager
def fixed_keys():
    """Split keys made while this is on are one fixed value, not a fresh secret: the learning
    tests below then draw the same problems in every session. (With a fresh key per session
    the unplanted hack's 30 steps were a new draw each time, and 1 session in about 9 did not
    show it.)"""
    import types

    from evotrainer.tasks import keys
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(keys, "secrets", types.SimpleNamespace(token_hex=lambda n: "5e" * n))
        yield


@pytest.mark.slow
def test_planted_length_reward_is_stopped_by_the_backtest_and_without_it_by_the_gate(tiny_run, sft_base):
    import yaml

    from evotrainer.agents import Proposal
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller

    source = (Path(__file__).resolve().parents[1] / "examples" / "harnesses" / "length_pay" / "reward.py").read_text()

    def planted(ctx):
        if "planted_length_pay" in ctx.tried:
            return None
        return Proposal("planted_length_pay", "reward", "changing reward from binary to length_pay raises accuracy "
                        "because longer answers carry more digits", "every other knob", "val beats the control",
                        "revert reward to binary", knobs={"reward": "length_pay"}, files={"reward.py": source},
                        agent="planted")

    cfg_path, run = tiny_run
    raw = yaml.safe_load(cfg_path.read_text())
    raw["budget"] |= {"trials": 1, "steps_per_segment": 10, "total_steps": 20}
    raw["model"] = str(sft_base)
    raw["final_seeds"] = []
    raw["cache"] = str(run / "segment-cache")  # the gate-only run's root is the guarded run's: trained once
    root = Path(raw["harness"])
    (root / "knobs.yaml").write_text((root / "knobs.yaml").read_text().replace("prompts_per_step: 4",
                                                                              "prompts_per_step: 16"))
    cfg = config_from_dict(raw).validate()

    guarded = Controller(cfg, run / "with-backtest", agent=planted)
    guarded.run()
    t1 = guarded.store.trials()[1]
    # on a random-init model most answers run to the budget: the signal tracks length or truncation
    assert t1.label == "backtest_rejected" and t1.agent == "planted"
    assert "verifier scores are all equal" in t1.reflection and "not correctness" in t1.reflection

    bare = Controller(cfg, run / "gate-only", agent=planted, run_backtests=False)
    bare.run()
    t1 = bare.store.trials()[1]
    assert t1.intervention == "planted_length_pay" and t1.backtest["label"] == "skipped"
    assert t1.label == "invalid" and "blocking finding: reward_length_coupling" in t1.reflection
    assert "v1" not in {s.version for s in RunView.read(bare.store).states}  # never promoted: no trial can branch from it
    assert "+def length_pay(r):" in t1.patch  # the exact proposal stays in the lineage


@pytest.mark.slow
def test_unplanted_partial_credit_on_a_longer_target_is_invalid(tmp_path, sft_base):
    """Measured on the prototype: per-digit partial credit on a target longer than anything the base
    saw raises its shaped reward while exact match stays 0. Nobody plants it here: the rules
    agent proposes it for the dead groups, the backtest passes it (its extra signal tracks
    closeness to the answer), and only the gate, on the trained evidence, can stop it."""
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller
    root = write_harness(tmp_path / "root", small=False, prompts_per_step=16)
    cfg = config_from_dict({"task": "arith", "level": 3, "harness": str(root), "seeds": [0], "final_seeds": [],
                            "search": {"skills": None},
                            "model": str(sft_base),  # trained on 1-digit sums only
                            "budget": {"trials": 1, "steps_per_segment": 30, "total_steps": 60,
                                       "trial_timeout_s": 300}, "evaluation": {"every": 15},
                            "promotion": {"replicas": 1}}).validate()  # a blocking finding decides, not the noise
    ctl = Controller(cfg, tmp_path / "run")
    with fixed_keys():
        ctl.run()
    t1 = ctl.store.trials()[1]
    assert t1.intervention == "partial_credit" and t1.agent == "rules" and t1.backtest["label"] == "passed"
    assert t1.label == "invalid" and "blocking finding: reward_score_divergence" in t1.reflection, \
        (t1.label, t1.reflection, [(f["diagnostic"], f["value"]) for f in t1.findings])
    metrics = [json.loads(line) for line in
               (tmp_path / "run" / "versions" / "v1" / "seed-0" / "metrics.jsonl").read_text().splitlines()]
    first, last = metrics[:6], metrics[-6:]
    def rise(key):
        return sum(m[key] for m in last) / 6 - sum(m[key] for m in first) / 6
    # Shaped reward up, exact match flat near 0. Not "exactly 0": another CPU's floats may
    # sample one right 3-digit sum in 30 steps (CI did), which is not the score rising.
    assert rise("reward_mean") > 0.03
    assert max(m["score_mean"] for m in metrics) < 0.05 and rise("score_mean") < rise("reward_mean") / 4
    assert "v1" not in {s.version for s in RunView.read(ctl.store).states}  # never a parent, never the winner


@pytest.mark.slow
def test_a_sibling_that_would_train_the_same_is_recorded_equivalent_and_costs_no_budget(tiny_run):
    """drop_dead and score_spread filter the same groups under a binary reward (the score is
    the reward): the second is recognised from its backtest on the parent's rollouts and never
    trained, and the budget still buys the trial after it."""
    import dataclasses

    import yaml

    from evotrainer.agents.interventions import INTERVENTIONS
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller

    order = ["drop_dead", "score_spread", "lower_lr"]

    def scripted(ctx):
        name = next((n for n in order if n not in ctx.tried), None)
        return name and dataclasses.replace(INTERVENTIONS.get(name)(ctx.knobs, 1), agent="scripted")

    cfg_path, run = tiny_run
    raw = yaml.safe_load(cfg_path.read_text())
    raw["final_seeds"] = []
    raw["search"] |= {"selection": "greedy"}
    ctl = Controller(config_from_dict(raw).validate(), run, agent=scripted)
    ctl.run()
    trials = ctl.store.trials()
    assert [t.intervention for t in trials[1:]] == order
    twin = trials[2]
    assert twin.label == "equivalent" and "trains like v1 (drop_dead)" in twin.reflection \
        and "the twin's own recorded training" in twin.reflection
    assert twin.backtest["rest"] == trials[1].backtest["rest"]
    assert not (run / "versions" / "v2").exists() and twin.budgets == {}  # never trained
    assert trials[3].label in ("kept", "discarded") and trials[3].backtest["rest"] != twin.backtest["rest"]
