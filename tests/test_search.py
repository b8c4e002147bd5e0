"""The controller's search decisions on a hand-made lineage: crossover (merge, conflicts),
escalation (three failures in a row), parent selection and the skills it records.
Nothing trains here: trials are written to the lineage as a finished run would have."""
import dataclasses
import time

import pytest
import yaml

from evotrainer.agents import INTERVENTIONS
from evotrainer.config import config_from_dict
from evotrainer.evolve.controller import Controller, State
from evotrainer.evolve.proposer import Proposer
from evotrainer.evolve.search.plans import of_agent
from evotrainer.harness import REFERENCE
from evotrainer.harness.knobs import load_knobs
from evotrainer.lineage import TrialRecord
from evotrainer.lineage.events import ControlFinished, CrossoverConflict, Escalated, TrialStarted
from evotrainer.skills import SkillLibrary

REF = load_knobs(REFERENCE / "knobs.yaml")


@pytest.fixture
def ctl(tmp_path, ckpt):
    cfg = config_from_dict({"task": "arith", "level": 2, "seeds": [0], "final_seeds": [],
                            "model": str(ckpt),
                            "search": {"skills": str(tmp_path / "skills.sqlite")},
                            "budget": {"trials": 9, "steps_per_segment": 10, "total_steps": 50}}).validate()
    c = Controller(cfg, tmp_path / "run")
    c.setup()
    c.proposer.findings = lambda state: []  # no evidence on disk: every state is diagnosed as healthy
    root = State("v0", 1, {0: "x"}, {0: 0.10}, {0: 0.10})
    c.store.begin_trial(TrialStarted(0, "root", "v0"))
    c.store.finish_trial(TrialRecord(0, "v0", [], "-", "root", 1, "", "-", "", "kept",
                                     fitness={"val": root.val, "state": dataclasses.asdict(root)}))
    return c


def add(c, n, parent: State, intervention, label, val=None, gain=None, trigger="none"):
    """Trial n from `parent`: the catalog's proposal, committed as a version, recorded with `label`."""
    p = INTERVENTIONS.get(intervention)(load_knobs(c.harnesses.dir(parent.version) / "knobs.yaml"), 2)
    plan = of_agent(parent, f"v{n}", 0, dataclasses.replace(p, trigger=trigger))
    c.store.begin_trial(TrialStarted.of(n, plan))
    c.harnesses.candidate(parent.version, f"v{n}", p.knobs, p.files, p.hypothesis)
    state = State(f"v{n}", parent.depth + 1, {0: "x"}, {0: val if val is not None else 0.0}, {0: 0.0})
    fitness = {"val": state.val, "gain": gain, "state": dataclasses.asdict(state)}
    c.recorder.finish(TrialRecord(n, f"v{n}", [parent.version], "rules", intervention, parent.depth + 1, p.hypothesis,
                          p.success_criterion, "", label, fitness=fitness), plan)
    return state


def look(c):
    """The controller reads the lineage once per trial: here, after each change a test makes."""
    return c.look()


def test_crossover_merges_two_elites_changes_and_skips_a_conflicting_pair(ctl):
    root = ctl.store.trials()[0].fitness.state
    v1 = add(ctl, 1, root, "partial_credit", "kept", val=0.20, gain=0.05)
    v2 = add(ctl, 2, root, "raise_temperature", "kept", val=0.15, gain=0.03)
    add(ctl, 3, root, "overlong_shaping", "kept", val=0.18, gain=0.02)   # reward, like v1's: conflicts
    add(ctl, 4, v1, "drop_dead", "discarded", val=0.10, gain=-0.01)
    look(ctl)
    assert ctl.proposer.crossover(5, v2) is not None          # four mutations, no crossover yet: one is due
    p = ctl.proposer.crossover(5, v1)
    # v3 is further from v1 than v2 but changes the same knob: recorded as a conflict and skipped
    (conflict,) = ctl.store.events(CrossoverConflict)
    assert conflict.parents == ["v1", "v3"] and conflict.conflicts == ["knob reward: 'partial_credit' vs "
                                                                       "'overlong_penalty'"]
    assert p.intervention == "crossover" and p.mate.version == "v2"
    assert p.knobs == {"reward": "partial_credit", "temperature": 1.2}
    ctl.store.begin_trial(TrialStarted.of(5, p))
    ctl.harnesses.candidate("v1", "v5", p.knobs, p.files, p.hypothesis)
    merged = load_knobs(ctl.harnesses.dir("v5") / "knobs.yaml")
    assert (merged.reward, merged.temperature, merged.lr) == ("partial_credit", 1.2, REF.lr)
    # the next operation is a mutation: never two crossovers in a row
    ctl.recorder.finish(TrialRecord(5, "v5", ["v1", "v2"], "crossover", "crossover", 3, p.hypothesis, "-", "",
                            "discarded", fitness={"gain": 0.0}), p)
    assert look(ctl) and ctl.proposer.crossover(6, v1) is None
    assert ctl.view.elites([State("v5", 3, {}, {0: 0.0}, {})])[0].changes == {"partial_credit", "raise_temperature"}


def test_a_pair_whose_gains_come_from_the_same_ancestor_change_is_not_crossed():
    from evotrainer.evolve.search.history import gains_beyond, repeats_ancestor

    def rec(n, parents, label="kept", gain=0.03, intervention="x"):
        return TrialRecord(n, f"v{n}", parents, "rules", "crossover" if len(parents) > 1 else intervention, 2, "",
                           "-", "", label, fitness={"gain": gain})
    trials = [TrialRecord(0, "v0", [], "-", "root", 1, "", "-", "", "kept"),
              rec(1, ["v0"], gain=0.05), rec(2, ["v1"]), rec(3, ["v1"]), rec(4, ["v0"]), rec(5, ["v2", "v4"]),
              rec(6, ["v1"], gain=0.0), rec(7, ["v1"], label="discarded", gain=0.04)]
    assert [t.id for t in gains_beyond(trials, "v5", "v0")] == [1, 2, 4, 5]
    assert repeats_ancestor(trials, "v1", "v2")          # v1 is the ancestor: it owns nothing beyond itself
    assert not repeats_ancestor(trials, "v2", "v3")      # each kept a gain of its own beyond v1
    assert not repeats_ancestor(trials, "v2", "v4")      # ... beyond v0
    assert repeats_ancestor(trials, "v5", "v4")          # v5 already merged v4's line
    assert repeats_ancestor(trials, "v6", "v2")          # kept with no measured gain: nothing of its own
    assert repeats_ancestor(trials, "v7", "v2")          # never kept


def test_crossover_refuses_a_state_of_the_ancestor_with_its_own_descendant(ctl):
    root = ctl.store.trials()[0].fitness.state
    v1 = add(ctl, 1, root, "partial_credit", "kept", val=0.20, gain=0.05)
    v2 = add(ctl, 2, v1, "raise_temperature", "kept", val=0.30, gain=0.04)
    add(ctl, 3, v1, "drop_dead", "discarded", val=0.10, gain=-0.01)
    add(ctl, 4, v2, "entropy_bonus", "discarded", val=0.20, gain=-0.01)
    later = State("v1", 3, {0: "x"}, {0: 0.25}, {0: 0.0})   # v1 trained on: v1's harness, deeper
    ctl.store.append(ControlFinished(later))
    look(ctl)
    assert {e.key for e in ctl.view.population(ctl.proposer.selection)} >= {("v1", 3), ("v2", 3)}
    # v2 carries what v1 lacks, but its gains beyond their common ancestor v1 are v2's own: merging
    # them gives back v2's harness, a crossover in name only
    assert ctl.proposer.crossover(5, later) is None
    v5 = add(ctl, 5, root, "dr_grpo", "kept", val=0.22, gain=0.02)   # a line of its own from the root
    look(ctl)
    assert ctl.proposer.crossover(6, later).mate.version == v5.version


def test_three_failures_in_a_row_escalate_once_roll_back_and_subtract(ctl):
    root = ctl.store.trials()[0].fitness.state
    v1 = add(ctl, 1, root, "partial_credit", "kept", val=0.20, gain=0.05)
    v2 = add(ctl, 2, v1, "raise_temperature", "kept", val=0.30, gain=0.04)
    assert look(ctl) and ctl.proposer.escalation() is None
    for n, name in ((3, "drop_dead"), (4, "dr_grpo"), (5, "entropy_bonus")):
        add(ctl, n, v2, name, "discarded", val=0.25, gain=-0.02)
    look(ctl)
    esc = ctl.proposer.escalation()
    assert esc.avoid == {"group_filter", "signal", "exploration"} and esc.subtract
    ctl.proposer.escalation()
    look(ctl)
    assert ctl.proposer.escalation() == esc
    assert len(ctl.store.events(Escalated)) == 1                 # decided once per streak, in any view
    assert ctl.proposer.select_parent(6).version == "v2"                    # the last kept version
    prop = ctl.proposer.propose(6, v2)
    assert prop.family == "subtract" and prop.intervention in ("revert_reward", "revert_temperature")
    # a kept trial ends the streak
    add(ctl, 6, v2, "seq_mean", "kept", val=0.35, gain=0.05)
    assert look(ctl) and ctl.proposer.escalation() is None


def test_each_agent_trial_is_recorded_in_the_skill_library_once(ctl, tmp_path):
    root = ctl.store.trials()[0].fitness.state
    add(ctl, 1, root, "partial_credit", "kept", val=0.2, gain=0.05, trigger="dead_group_ratio:critical")
    add(ctl, 2, root, "raise_temperature", "discarded", val=0.1, gain=-0.01)
    ctl.recorder.learn(look(ctl).planned)  # as a resumed run would: nothing doubles
    lib = SkillLibrary(tmp_path / "skills.sqlite")
    by = {s.intervention: s for s in lib.skills()}
    assert set(by) == {"partial_credit", "raise_temperature"}
    assert by["partial_credit"].trigger == "dead_group_ratio:critical" and by["partial_credit"].tried == 1
    assert by["partial_credit"].held_on == ("arith",) and by["raise_temperature"].kept == 0
    assert by["partial_credit"].patch == {"reward": "partial_credit"}


def test_greedy_selection_takes_the_best_open_state_and_population_the_best_parent_score(ctl):
    root = ctl.store.trials()[0].fitness.state
    v1 = add(ctl, 1, root, "partial_credit", "kept", val=0.30, gain=0.05)
    add(ctl, 2, v1, "raise_temperature", "discarded", val=0.20, gain=-0.04)
    add(ctl, 3, v1, "drop_dead", "discarded", val=0.20, gain=-0.04)
    add(ctl, 4, root, "entropy_bonus", "kept", val=0.28, gain=0.03)
    greedy = dataclasses.replace(ctl.cfg, search=dataclasses.replace(ctl.cfg.search, selection="greedy"))
    other = Proposer(greedy, ctl.task, ctl.agent, recorder=ctl.recorder, harnesses=ctl.harnesses,
                     training=ctl.training, max_depth=ctl.max_depth)
    assert look(ctl) and other.select_parent(5).version == "v1"   # the fittest
    # v1's children lost 4 points each; v4 is unexpanded and a different surface
    assert look(ctl) and ctl.proposer.select_parent(5).version == "v4"
    assert {e.version for e in ctl.view.population(ctl.proposer.selection)} == {"v0", "v1", "v4"}
    assert yaml.safe_load((ctl.run_dir / "config.yaml").read_text())["search"]["selection"] == "population"


def test_the_leaderboard_an_agent_reads_ranks_kept_versions_and_shows_the_best_path_and_children():
    from evotrainer.evolve.search.history import leaderboard

    def rec(n, parents, intervention, label, val=None, gain=None):
        fitness = {"val": {0: val}} if val is not None else {}
        return TrialRecord(n, f"v{n}", parents, "rules", intervention, 1, f"hypothesis {n}", "-", "", label,
                           fitness=fitness | ({"gain": gain} if gain is not None else {}))
    trials = [rec(0, [], "root", "kept", 0.10), rec(1, ["v0"], "partial_credit", "kept", 0.30, 0.2),
              rec(2, ["v0"], "raise_lr", "kept", 0.20, 0.1), rec(3, ["v1"], "drop_dead", "discarded", 0.25, -0.05),
              rec(4, ["v1"], "raise_temperature", "kept", 0.35, 0.05), rec(5, ["v4"], "kl_anchor", "invalid", 0.5, 0.15)]
    text = leaderboard(trials, top=3)
    board = text.split("\n\n")[0].splitlines()[1:]
    assert board == ["- v4 val 0.350: raise_temperature", "- v1 val 0.300: partial_credit", "- v2 val 0.200: raise_lr"]
    assert "Path from the root to the best: v0 [root] -> v1 [partial_credit] -> v4 [raise_temperature]" in text
    assert text.endswith("Children of v4:\n- trial 5 kl_anchor: invalid, gain +0.150; hypothesis 5")
    assert leaderboard(trials[:0]) == ""


def test_a_free_text_intervention_counts_under_the_surface_its_proposal_recorded():
    from evotrainer.evolve.search import history
    trials = [TrialRecord(0, "v0", [], "-", "root", 1, "", "-", "", "kept"),
              TrialRecord(1, "v1", ["v0"], "llm", "soften_the_format_gate", 2, "", "", "", "kept"),
              TrialRecord(2, "v2", ["v0"], "rules", "raise_temperature", 2, "", "", "", "kept")]
    starts = {1: "reward", 2: "reward"}  # the families their plans recorded
    assert history.surfaces(trials) == {"v0": "root", "v1": "other", "v2": history.FAMILY["raise_temperature"]}
    # the catalog's own family wins over a recorded one; a free-text name takes the recorded one
    assert history.surfaces(trials, starts) == {"v0": "root", "v1": "reward", "v2": history.FAMILY["raise_temperature"]}


def test_two_rounds_of_proposing_cost_add_up_and_a_round_that_cost_nothing_adds_nothing():
    from evotrainer.lineage.plan import add_usage
    first = {"model": "a", "calls": 1, "prompt_tokens": 100, "seconds": 0.5, "transcript": "t1"}
    assert add_usage(first, {"model": "b", "calls": 2, "prompt_tokens": 50, "seconds": 0.25, "transcript": "t2"}) == \
        {"model": "b", "calls": 3, "prompt_tokens": 150, "seconds": 0.75, "transcript": "t2"}
    assert add_usage(first, {}) == first and add_usage(None, None) == {}


def test_the_wall_clock_budget_is_the_runs_over_its_sessions_so_a_resume_gets_what_is_left(ctl, monkeypatch):
    from evotrainer.evolve.proposer import STOP
    from evotrainer.lineage import store as store_module
    from evotrainer.lineage.events import SessionStarted, Stopped
    budget, now = ctl.cfg.budget.wall_clock_s, time.time()
    assert ctl.wall_clock_end() - now > budget - 5   # the fixture's session took no time

    def session(start, seconds):  # a later session (a resume) that ran `seconds` before it was killed
        monkeypatch.setattr(store_module.time, "time", lambda: start)
        ctl.store.append(SessionStarted(None))
        monkeypatch.setattr(store_module.time, "time", lambda: start + seconds)
        ctl.store.append(ControlFinished(State("v0", 2, {0: "x"}, {0: 0.1}, {0: 0.1})))
        monkeypatch.undo()
    session(now + 1000, budget - 20)  # a day's gap between sessions is not the run's time
    assert 15 < ctl.wall_clock_end() - time.time() <= 20
    session(now + 9000, 30)
    assert ctl.proposer.next(look(ctl), ctl.wall_clock_end()) == STOP
    assert ctl.store.events(Stopped)[-1].reason == "wall-clock budget spent"


def test_a_trial_redone_on_resume_reads_the_trials_finished_when_it_started_not_its_siblings_since(ctl):
    root = ctl.store.trials()[0].fitness.state
    p = INTERVENTIONS.get("partial_credit")(REF, 2)
    ctl.store.begin_trial(TrialStarted.of(1, of_agent(root, "v1", 0, p)))  # in flight when the kill came
    add(ctl, 2, root, "raise_temperature", "discarded", val=0.12, gain=0.01)      # its sibling, finished beside it
    ctl.store.append(ControlFinished(State("v0", 2, {0: "x"}, {0: 0.1}, {0: 0.1})))
    now = look(ctl)
    assert [t.id for t in now.trials] == [0, 2]
    then = now.as_started(1)
    assert [t.id for t in then.trials] == [0] and then.events == now.events  # the control is still found
    assert then.control("v0", 2) is not None
    assert [t.id for t in now.as_started(3).trials] == [0, 2]  # a trial not started: everything finished


@pytest.mark.parametrize("label", ["discarded", "invalid"])
def test_a_move_that_hacked_the_reward_above_a_parent_is_not_proposed_again_below_it(ctl, label):
    """partial_credit hacked the reward from the root (`invalid`); from a kept child of the root
    it would set the same reward again. A move merely discarded above is proposed again (its
    gain may differ from another parent); one labelled invalid is counted as tried."""
    from evotrainer.evolve.search import history
    root = ctl.store.trials()[0].fitness.state
    add(ctl, 1, root, "partial_credit", label, val=0.30, gain=0.1)
    v2 = add(ctl, 2, root, "drop_dead", "kept", val=0.20, gain=0.05)
    look(ctl)
    first = ctl.proposer.propose(3, v2).intervention
    assert history.hacked_above(ctl.view.trials, "v2") == ({"partial_credit"} if label == "invalid" else set())
    assert (first == "partial_credit") == (label == "discarded"), first
