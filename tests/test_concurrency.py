"""Trials in flight (search.concurrency): specialists hold surfaces, the pool's workers are one
limit for all, the lineage records every trial once in any order, and a SIGKILL with two
trials in flight resumes to the same trials, each once."""
import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import worker_targets
import yaml
from helpers import agent_context, cli, here, start_cli

from evotrainer.agents.rules import candidates
from evotrainer.evolve.search import specialists
from evotrainer.lineage import LineageStore
from evotrainer.lineage.events import ControlFinished, TrialResumed, TrialStarted

HERE = Path(__file__).resolve().parent


def test_each_family_belongs_to_one_specialists_surface():
    assert specialists.surface("reward") == specialists.surface("reward_hacking") == "reward"
    assert specialists.surface("group_filter") == "signal"
    assert specialists.surface("optimisation") == "optimisation" and specialists.surface("exploration") == "exploration"
    assert specialists.surface("crossover") == "crossover"  # no specialist's: its own
    assert {"reward", "reward_hacking", "efficiency"} <= specialists.closed_families({"reward"})


def test_a_proposal_leaves_the_surfaces_in_flight_from_its_parent_alone():
    every = candidates(agent_context())
    assert any(p.family == "reward" for p in every)
    closed = specialists.closed_families({"reward"})
    left = candidates(agent_context(closed=closed))
    assert left and not any(p.family in closed for p in left)
    assert [p.intervention for p in left] == [p.intervention for p in every if p.family not in closed]


def test_the_shared_pool_holds_its_workers_across_callers_in_threads():
    """Two threads each run two sleeps on one shared pool of 2 workers: never more than 2 at
    once (without sharing, each call would start 2: 4 on 2 cores)."""
    from evotrainer.executors import Call, LocalPool
    from evotrainer.sandbox.processes import usable_cores
    pool = LocalPool(2, HERE, shared=True)
    assert pool.threads(1) == pool.threads(4) == max(1, usable_cores() // 2)
    spans = []

    def work():
        spans.extend(r.value for r in pool.run([Call(worker_targets.interval, {"seconds": 0.6})] * 2, timeout_s=60))
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(spans) == 4
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most == 2


def _config(cfg: Path, trials: int) -> Path:
    raw = yaml.safe_load(cfg.read_text())
    raw["search"] |= {"concurrency": 2, "crossover": False}
    raw["budget"] |= {"trials": trials}
    raw["final_seeds"] = []
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


@pytest.mark.slow
def test_two_trials_in_flight_from_different_specialists_each_recorded_once(tiny_run, capsys):
    cfg, run = tiny_run
    here(capsys, "run", _config(cfg, 4), "--out", run, "--json")
    store = LineageStore(run / "lineage.sqlite")
    trials, starts = store.trials(), store.events(TrialStarted)
    controls = store.events(ControlFinished)
    store.close()
    assert [t.id for t in trials] == [0, 1, 2, 3, 4] and len({s.trial for s in starts}) == 5
    plans = {s.trial: s.plan for s in starts if s.plan}
    # trial 2 was proposed while trial 1 ran: it says so, from another surface if from the same parent
    assert plans[2].beside == (1,) and plans[1].beside == ()
    if plans[2].parent.version == plans[1].parent.version:
        assert specialists.surface(plans[2].family) != specialists.surface(plans[1].family)
    spans = {t.id: (t.started, t.finished) for t in trials}
    assert spans[2][0] < spans[1][1]  # they overlapped in time
    # every proposal read every trial finished when it was made; a later one read more
    for n, p in plans.items():
        assert set(p.saw) <= {t.id for t in trials if t.finished <= spans[n][0] + 1e-6} | {0}
    assert any(len(plans[n].saw) > 1 for n in plans)
    # a control two children of one parent need was trained and recorded once
    keys = [(c.state.version, c.state.depth) for c in controls]
    assert len(keys) == len(set(keys))
    # the report puts the trials on a time axis and names those that ran beside each other
    from evotrainer.report import write_report
    html = (run / "report.html").read_text() if write_report(run, engine="svg") else ""
    assert "Trials over time" in html and 'class="timeline"' in html and "1 and 2" in html
    # what each proposal read off the blackboard, in the report and in `lineage`
    assert "proposed while #1 ran" in html
    assert "proposed while #1 ran" in here(capsys, "lineage", run).err  # (the tree is for people: stderr)


def test_every_catalog_and_space_move_reaches_only_its_own_familys_surface():
    from evotrainer.agents import INTERVENTIONS
    from evotrainer.agents.space import Parent, reach, space
    from evotrainer.harness import REFERENCE
    from evotrainer.harness.knobs import load_knobs
    k = load_knobs(REFERENCE / "knobs.yaml")
    moves = [p for name in INTERVENTIONS.names() for p in [INTERVENTIONS.get(name)(k, 3)] if p] + \
        space(Parent(k, 3, {"knobs.yaml": (REFERENCE / "knobs.yaml").read_text()}))
    assert len(moves) > 40
    for p in moves:  # so the rules and random agents leave exactly the families of a claimed surface
        assert {specialists.surface(f) for f in reach(p.family, p.knobs, p.files, k)} == \
            {specialists.surface(p.family)}, p.intervention


def test_an_agents_edit_claims_every_surface_it_reaches_not_only_the_role_it_was_briefed_as():
    from evotrainer.agents import set_knob
    from evotrainer.harness import REFERENCE
    from evotrainer.harness.knobs import load_knobs
    k = load_knobs(REFERENCE / "knobs.yaml")
    text = (REFERENCE / "knobs.yaml").read_text()
    # briefed as the reward specialist, it wrote reward.py and also halved the learning rate
    edit = dataclasses.replace(_plan(), family="reward", knobs=None, files={
        "reward.py": "def mine(completion, answer):\n    return 1.0\n",
        "knobs.yaml": set_knob(set_knob(text, "lr", k.lr / 2), "reward", "mine")})
    assert specialists.reached(edit, k) == {"reward", "optimisation"}
    assert specialists.claimed({1: edit}, "v0", k) == {"reward", "optimisation"}
    assert specialists.claimed({1: edit}, "v3", k) == frozenset()  # another parent's claims are its own
    closed = specialists.closed_families(specialists.claimed({1: edit}, "v0", k))
    left = candidates(agent_context(closed=closed))
    assert left and not any(p.family in ("optimisation", "reward") for p in left)
    assert any(p.family == "exploration" for p in left)  # its own surface: an lr change leaves it open
    # a knobs file that says nothing new reaches only the role's surface
    same = dataclasses.replace(edit, files={"knobs.yaml": text})
    assert specialists.reached(same, k) == {"reward"}


def test_an_agent_reads_the_surfaces_claimed_in_flight_and_the_outcomes_that_came_in_meanwhile():
    from evotrainer.evolve.proposer import beside
    from evotrainer.evolve.search import history
    from evotrainer.lineage import TrialRecord
    claim = {3: _plan()}
    text = beside(claim, lambda p: frozenset({"reward", "optimisation"}))  # what the claim's change reached
    assert "- trial 3: partial_credit (optimisation, reward) from v0" in text and beside({}, None) == ""

    def rec(n, parent, label, gain, finished):
        return TrialRecord(n, f"v{n}", [parent], "rules", f"move{n}", 2, "", "", "", label,
                           fitness={"gain": gain}, finished=finished)
    trials = [TrialRecord(0, "v0", [], "-", "root", 1, "", "", "", "kept", finished=1.0),
              rec(1, "v0", "kept", 0.05, 30.0), rec(2, "v1", "discarded", -0.01, 50.0),
              rec(4, "v0", "discarded", 0.02, 40.0)]
    assert history.latest(trials, k=2).splitlines()[-2:] == [  # by finish, newest first; any parent's
        "- trial 2 move2 from v1: discarded, gain -0.010", "- trial 4 move4 from v0: discarded, gain +0.020"]
    assert history.latest(trials[:1]) == ""


def _plan():
    """A plan of the catalog's partial_credit from a root state."""
    from evotrainer.agents import INTERVENTIONS
    from evotrainer.evolve.search.plans import of_agent
    from evotrainer.harness import REFERENCE
    from evotrainer.harness.knobs import load_knobs
    from evotrainer.lineage.state import State
    p = INTERVENTIONS.get("partial_credit")(load_knobs(REFERENCE / "knobs.yaml"), 2)
    return of_agent(State("v0", 1, {0: "x"}, {0: 0.1}, {0: 0.1}), "v1", 0, p)


def test_the_blackboard_says_what_ran_beside_each_proposal_and_what_came_in_since_the_last():
    from evotrainer.lineage.plan import TrialPlan
    p = lambda beside, saw: dataclasses.replace(_plan(), beside=beside, saw=saw)  # noqa: E731
    read = specialists.blackboard({1: p((), (0,)), 2: p((1,), (0,)), 3: p((2,), (0, 1)), 4: p((), (0, 1, 2, 3)),
                                   5: dataclasses.replace(_plan(), beside=None, saw=None)})
    assert read == {1: "proposed after #0 finished", 2: "proposed while #1 ran", 3: "proposed while #2 ran, after #1 "
                    "finished", 4: "proposed after #2, #3 finished"}
    assert TrialPlan.from_json(p((1,), (0,)).to_json()).saw == (0,)


def test_the_time_axis_finds_the_trials_that_overlapped():
    from evotrainer.report.gather import Version
    from evotrainer.report.timeline import overlaps, timeline_svg

    def v(n, a, b):
        return Version(n, f"v{n}", ["v0"], "x", "kept", 1, "", {}, {}, None, None, {}, "", [], "", a, b, "reward")
    vs = [v(1, 0, 10), v(2, 5, 12), v(3, 12, 20), v(4, 21, None)]
    assert overlaps(vs) == [(1, 2)]
    svg = timeline_svg(vs, now=30)
    assert svg.count("<rect") == 4 and "[reward]" in svg


@pytest.mark.slow
def test_sigkill_with_two_trials_in_flight_then_resume_runs_each_trial_once(tiny_run):
    cfg, run = tiny_run
    p = start_cli("run", _config(cfg, 3), "--out", run, "--json")
    deadline = time.time() + 300
    while time.time() < deadline:  # until two trials are in flight, then kill everything
        db = run / "lineage.sqlite"
        if db.exists():
            store = LineageStore(db)
            pending = [s.trial for s in store.pending()]
            store.close()
            if len(pending) == 2:
                break
        assert p.poll() is None, p.communicate()
        time.sleep(0.1)
    time.sleep(1.0)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    store = LineageStore(run / "lineage.sqlite")
    cut = sorted(s.trial for s in store.pending())
    store.close()
    assert len(cut) == 2

    cli("resume", run, "--json")
    store = LineageStore(run / "lineage.sqlite")
    trials = store.trials()
    resumed = sorted(e.trial for e in store.events(TrialResumed))
    finished = store.events("trial_finished")
    store.close()
    assert [t.id for t in trials] == [0, 1, 2, 3]
    assert resumed == cut  # both cut off, both redone under their numbers
    assert sorted(e["trial"] for e in finished) == [0, 1, 2, 3]  # each ended exactly once
    versions = [t.version for t in trials if t.version]
    assert len(versions) == len(set(versions))
