"""The skill library: outcomes in, effects, domains and rankings out."""
import re
import shutil
import sqlite3

import pytest

from evotrainer.errors import UsageError
from evotrainer.lineage import LineageStore, TrialRecord
from evotrainer.lineage.events import decode
from evotrainer.lineage.plan import TrialPlan
from evotrainer.lineage.state import State
from evotrainer.skills import (PLACE, Conditions, DuplicateOutcome, SkillLibrary, closeness, matching, rank, signature,
                               standing)

DEAD = {"diagnostic": "dead_group_ratio", "severity": "critical"}


ARITH = Conditions("arith", 3, 0.05, "embedded")  # a weak start on 3-digit sums


def record(lib, trial, task, name, label, gain, run="r1", trigger="dead_group_ratio:critical", **conditions):
    lib.record(run=run, trial=trial, task=task, trigger=trigger, intervention=name, family="reward",
               patch={"reward": name}, expected=f"{name} helps", label=label, gain=gain, **conditions)


def test_outcomes_make_a_skill_with_counts_domains_and_evidence(tmp_path):
    lib = SkillLibrary(tmp_path / "s.sqlite")
    record(lib, 1, "arith", "partial_credit", "kept", 0.05)
    record(lib, 2, "arith", "partial_credit", "discarded", -0.01)
    record(lib, 1, "rg:chain_sum", "partial_credit", "invalid", 0.02, run="r2")
    (s,) = lib.skills()
    assert s.name == "dead_group_ratio:critical -> partial_credit" and s.patch == {"reward": "partial_credit"}
    assert (s.tried, s.kept, s.invalid) == (3, 1, 1) and abs(s.mean_gain - 0.02) < 1e-9
    assert s.held_on == ("arith",) and not s.general          # invalid on the second task: not held there
    assert [e["run"] for e in s.evidence] == ["r1", "r1", "r2"]
    record(lib, 2, "rg:chain_sum", "partial_credit", "kept", 0.06, run="r2")
    assert lib.get(s.name).held_on == ("arith", "rg:chain_sum") and lib.get(s.name).general


def test_recording_a_trial_again_changes_nothing_and_the_library_outlives_its_handle(tmp_path):
    path = tmp_path / "deep" / "s.sqlite"
    lib = SkillLibrary(path)
    record(lib, 1, "arith", "partial_credit", "kept", 0.05)
    record(lib, 1, "arith", "partial_credit", "kept", 0.05)   # a resumed run records it again
    lib.close()
    (s,) = SkillLibrary(path).skills()
    assert s.tried == 1


def test_score_shrinks_one_lucky_trial_and_punishes_invalid():
    from evotrainer.skills import _skill
    one = _skill("a", trigger="t", intervention="x", family="f", patch={}, expected="",
                 ev=({"task": "a", "label": "kept", "gain": 0.05},))
    three = _skill("b", trigger="t", intervention="y", family="f", patch={}, expected="",
                   ev=tuple({"task": "a", "label": "kept", "gain": 0.04} for _ in range(3)))
    hack = _skill("c", trigger="t", intervention="z", family="f", patch={}, expected="",
                  ev=({"task": "a", "label": "invalid", "gain": 0.1},))
    assert three.score > one.score > 0 > hack.score


def test_matching_and_rank_follow_the_findings(tmp_path):
    lib = SkillLibrary(tmp_path / "s.sqlite")
    record(lib, 1, "arith", "clip_higher", "kept", 0.04)
    record(lib, 2, "arith", "partial_credit", "discarded", -0.03)
    record(lib, 3, "arith", "entropy_bonus", "kept", 0.08, trigger="entropy_collapse:warning")
    skills = lib.skills()
    assert [s.intervention for s in matching(skills, [DEAD])] == ["clip_higher", "partial_credit"]
    names = ["partial_credit", "drop_dead", "clip_higher", "entropy_bonus"]
    # clip_higher expects +2 points (one +4 outcome, shrunk): first; partial_credit expects
    # -1.5: last; entropy_bonus's skill answers another finding (no say)
    assert rank(names, [DEAD], skills, ARITH) == ["clip_higher", "drop_dead", "entropy_bonus", "partial_credit"]
    few = SkillLibrary(tmp_path / "few.sqlite")
    record(few, 1, "rg:chain_sum", "clip_higher", "kept", 0.04)   # from another family: +0.4 points, a nudge
    assert 0 < standing(few.get("dead_group_ratio:critical -> clip_higher"), ARITH) < PLACE
    assert rank(names, [DEAD], few.skills(), ARITH) == names
    assert rank(names, [], skills, ARITH) == names          # no matching evidence: the rules' order
    assert signature(None) == "none" and signature(DEAD) == "dead_group_ratio:critical"


def test_absorbing_libraries_is_their_union_counting_each_outcome_once(tmp_path):
    a, b = SkillLibrary(tmp_path / "a.sqlite"), SkillLibrary(tmp_path / "b.sqlite")
    record(a, 1, "arith", "partial_credit", "kept", 0.05, run="ra")
    record(b, 1, "arith", "partial_credit", "kept", 0.03, run="rb")
    record(b, 2, "arith", "lower_lr", "discarded", -0.01, run="rb")
    a.close(), b.close()
    merged = SkillLibrary(tmp_path / "m.sqlite")
    for p in ("a.sqlite", "b.sqlite", "a.sqlite"):
        merged.absorb(tmp_path / p)
    pc = merged.get("dead_group_ratio:critical -> partial_credit")
    assert [s.intervention for s in merged.skills()] == ["lower_lr", "partial_credit"]
    assert pc.tried == 2 and abs(pc.mean_gain - 0.04) < 1e-9


def test_evidence_counts_by_how_close_its_conditions_are():
    o = {"task": "arith", "level": 3, "ref_acc": 0.04, "backend": "embedded", "label": "kept", "gain": 0.05}
    assert closeness(o, ARITH) == 1.0
    assert closeness(o | {"task": "rg:chain_sum"}, Conditions("rg:leg_counting", 2, 0.05)) == 0.5  # same family
    assert closeness(o, Conditions("rg:chain_sum", 2, 0.05)) == 0.1                             # another family
    assert closeness(o | {"ref_acc": 0.5}, ARITH) == 0.25                                      # two bands apart
    assert closeness(o | {"level": 2}, ARITH) == 0.5 and closeness(o | {"backend": "trl"}, ARITH) == 0.8
    assert closeness({"task": "arith", "label": "kept", "gain": 0.0}, ARITH) == 1.0  # an old row: nothing known


def test_far_evidence_moves_the_rules_order_a_little_and_a_misleading_skill_is_demoted_by_its_outcome(tmp_path):
    lib = SkillLibrary(tmp_path / "s.sqlite")
    weak = {"level": 2, "ref_acc": 0.1, "backend": "embedded"}
    # learned on another family: partial credit was gamed there, larger groups held
    record(lib, 1, "rg:chain_sum", "partial_credit", "invalid", 0.02, **weak)
    record(lib, 2, "rg:chain_sum", "larger_groups", "kept", 0.06, **weak)
    names = ["partial_credit", "drop_dead", "larger_groups"]
    # on arith the far failure moves the findings' first pick back less than a place; the far
    # success moves larger_groups up a little, not past it
    sk = {s.intervention: s for s in lib.skills()}
    assert -PLACE < standing(sk["partial_credit"], ARITH) < 0 < standing(sk["larger_groups"], ARITH) < 2 * PLACE
    assert rank(names, [DEAD], lib.skills(), ARITH)[0] == "partial_credit"
    # on a task of the family the same evidence counts more: larger_groups is tried first
    assert rank(names, [DEAD], lib.skills(), Conditions("rg:leg_counting", 2, 0.1))[0] == "larger_groups"
    # tried first on leg_counting and it misleads there: its own outcome there demotes it
    record(lib, 1, "rg:leg_counting", "larger_groups", "discarded", -0.04, run="r2", **weak)
    assert rank(names, [DEAD], lib.skills(), Conditions("rg:leg_counting", 2, 0.1))[0] != "larger_groups"
    assert standing(lib.get("dead_group_ratio:critical -> larger_groups"), Conditions("rg:leg_counting", 2, 0.1)) < 0


def test_a_library_from_before_conditions_opens_with_its_rows_and_absorbs(tmp_path):
    old = tmp_path / "old.sqlite"
    db = sqlite3.connect(old)
    db.executescript("""CREATE TABLE skills (name TEXT PRIMARY KEY, trigger TEXT NOT NULL, intervention TEXT NOT NULL,
        family TEXT NOT NULL, patch TEXT NOT NULL, expected TEXT NOT NULL, created REAL NOT NULL);
        CREATE TABLE outcomes (run TEXT NOT NULL, trial INTEGER NOT NULL, skill TEXT NOT NULL, task TEXT NOT NULL,
        label TEXT NOT NULL, gain REAL, t REAL NOT NULL, PRIMARY KEY (run, trial));
        INSERT INTO skills VALUES ('none -> lower_lr', 'none', 'lower_lr', 'optimisation', '{}', 'x', 1);
        INSERT INTO outcomes VALUES ('r', 1, 'none -> lower_lr', 'arith', 'kept', 0.03, 1);""")
    db.commit()
    db.close()
    new = SkillLibrary(tmp_path / "new.sqlite")
    new.absorb(old)
    (s,) = new.skills()
    assert s.tried == 1 and s.evidence[0]["ref_acc"] is None and standing(s, ARITH) == 0.03 / 2


def test_a_code_writing_agent_is_shown_the_skills_weighed_for_its_run_as_the_rules_agent_weighs_them(tmp_path):
    from evotrainer.agents.brief import skills_shown
    from helpers import agent_context
    lib = SkillLibrary(tmp_path / "s.sqlite")
    far = {"level": 2, "ref_acc": 0.5, "backend": "embedded"}
    for i in range(4):  # large gains, on another family and two bands away
        record(lib, i, "rg:chain_sum", "larger_groups", "kept", 0.10, **far)
    record(lib, 9, "arith", "partial_credit", "kept", 0.03, level=3, ref_acc=0.05, backend="embedded")
    skills = lib.skills()
    assert max(skills, key=lambda s: s.score).intervention == "larger_groups"  # unweighted, the far one leads
    text = skills_shown(agent_context([DEAD], task="arith", reference_acc=0.05, backend="embedded", skills=skills))
    first, second = text.splitlines()
    assert first.startswith("- dead_group_ratio:critical -> partial_credit: expects +0.015 here (1 of its 1 outcomes "
                            "on this task)") and "larger_groups" in second and "(0 of its 4 outcomes" in second


def test_an_interventions_loss_under_one_finding_is_not_hidden_by_its_gain_under_another(tmp_path):
    lib = SkillLibrary(tmp_path / "s.sqlite")
    here = {"level": 3, "ref_acc": 0.05, "backend": "embedded"}
    record(lib, 1, "arith", "lower_lr", "kept", 0.03, trigger="none", **here)        # tried with no finding: +3
    for i in (2, 3):  # tried twice since, while the dead-group finding stood: -4 each
        record(lib, i, "arith", "lower_lr", "discarded", -0.04, **here)
    names = ["lower_lr", "drop_dead"]
    assert rank(names, [DEAD], lib.skills(), ARITH) == ["drop_dead", "lower_lr"]  # pooled: -5 / 4 points
    assert rank(names, [], lib.skills(), ARITH) == ["lower_lr", "drop_dead"]        # without the finding: +3 / 2


# ---------------------------------------------------------------------------- outcomes keyed by the run's id


def _agent_trial(n: int, label: str = "kept", gain: float = 0.05) -> tuple[TrialRecord, TrialPlan]:
    """Trial n of a run, as the lineage holds it: its record and the plan it ran."""
    plan = TrialPlan(parent=State("v0", 1, {0: "x"}, {0: 0.1}, {0: 0.1}), version=f"v{n}", round=0,
                     intervention="partial_credit", family="reward", hypothesis="partial credit helps", frozen=None,
                     success_criterion="-", rollback=None, knobs={"reward": "partial_credit"}, files=None,
                     agent="rules", trigger="none", expected=None, usage=None)
    rec = TrialRecord(n, f"v{n}", ["v0"], "rules", "partial_credit", 2, "partial credit helps", "-", "", label,
                      fitness={"gain": gain})
    return rec, plan


def _controller(tmp_path, ckpt):
    """A run at tmp_path/run set up as `evotrainer run` sets it up (a new one, or resumed)."""
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller
    cfg = config_from_dict({"task": "arith", "level": 2, "seeds": [0], "final_seeds": [], "model": str(ckpt),
                            "search": {"skills": str(tmp_path / "skills.sqlite")},
                            "budget": {"trials": 3, "steps_per_segment": 10, "total_steps": 20}}).validate()
    c = Controller(cfg, tmp_path / "run")
    c.setup()
    return c


def test_two_runs_made_at_one_path_keep_both_their_outcomes(tmp_path, ckpt):
    first = _controller(tmp_path, ckpt)
    first.recorder.learn([_agent_trial(1, "kept", 0.05)])
    first.store.close()
    shutil.rmtree(tmp_path / "run")                      # deleted, and a new run made where it was
    second = _controller(tmp_path, ckpt)
    second.recorder.learn([_agent_trial(1, "discarded", -0.02)])
    (s,) = SkillLibrary(tmp_path / "skills.sqlite").skills()
    assert s.tried == 2 and sorted(o["gain"] for o in s.evidence) == [-0.02, 0.05]
    runs = {o["run"] for o in s.evidence}
    assert len(runs) == 2 and str(tmp_path / "run") not in runs  # each its run's id, not the path they shared
    assert {o["run_dir"] for o in s.evidence} == {str((tmp_path / "run").resolve())}


def test_a_resumed_run_learning_its_trials_again_changes_nothing(tmp_path, ckpt):
    run = _controller(tmp_path, ckpt)
    run.recorder.learn([_agent_trial(1), _agent_trial(2, "discarded", -0.01)])
    run.store.close()
    resumed = _controller(tmp_path, ckpt)                # its run_started read back: the same run
    resumed.recorder.learn([_agent_trial(1), _agent_trial(2, "discarded", -0.01), _agent_trial(3, "kept", 0.02)])
    (s,) = SkillLibrary(tmp_path / "skills.sqlite").skills()
    assert s.tried == 3 and [o["trial"] for o in s.evidence] == [1, 2, 3]
    assert len({o["run"] for o in s.evidence}) == 1


def test_another_outcome_for_a_runs_trial_is_an_error_and_changes_nothing(tmp_path):
    lib = SkillLibrary(tmp_path / "s.sqlite")
    record(lib, 1, "arith", "partial_credit", "kept", 0.05)
    said = 'trial 1 of run r1 (label: "kept" there, "discarded" now, gain: 0.05 there, -0.01 now)'
    with pytest.raises(DuplicateOutcome, match=re.escape(said)) as e:
        record(lib, 1, "arith", "partial_credit", "discarded", -0.01)
    assert isinstance(e.value, UsageError)  # the CLI shows it as one line
    (s,) = lib.skills()
    assert s.tried == 1 and s.evidence[0]["gain"] == 0.05
    other = SkillLibrary(tmp_path / "other.sqlite")
    record(other, 1, "arith", "partial_credit", "kept", 0.07)  # the same key, another outcome: refused whole
    record(other, 2, "arith", "partial_credit", "kept", 0.01)
    other.close()
    with pytest.raises(DuplicateOutcome):
        lib.absorb(tmp_path / "other.sqlite")
    assert lib.get(s.name).tried == 1


def test_a_run_and_a_library_from_before_run_ids_go_on_under_the_runs_directory(tmp_path):
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.recorder import learn
    run = tmp_path / "run"
    run.mkdir()
    store = LineageStore(run / "lineage.sqlite")
    store.append(decode("run_started", {"base": "b", "max_depth": 3}))  # a run_started from before run ids
    store.close()
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)  # a library from before run ids: its outcomes keyed by their run's directory
    db.executescript(f"""CREATE TABLE skills (name TEXT PRIMARY KEY, trigger TEXT NOT NULL,
        intervention TEXT NOT NULL, family TEXT NOT NULL, patch TEXT NOT NULL, expected TEXT NOT NULL,
        created REAL NOT NULL);
        CREATE TABLE outcomes (run TEXT NOT NULL, trial INTEGER NOT NULL, skill TEXT NOT NULL, task TEXT NOT NULL,
        label TEXT NOT NULL, gain REAL, t REAL NOT NULL, level INTEGER, ref_acc REAL, backend TEXT,
        PRIMARY KEY (run, trial));
        INSERT INTO skills VALUES ('none -> partial_credit', 'none', 'partial_credit', 'reward', '{{}}', 'x', 1);
        INSERT INTO outcomes VALUES ('{run.resolve()}', 1, 'none -> partial_credit', 'arith', 'kept', 0.05, 1,
                                     2, 0.1, 'embedded');""")
    db.commit()
    db.close()
    lib = SkillLibrary(path)
    (o,) = lib.get("none -> partial_credit").evidence
    assert o["run"] == o["run_dir"] == str(run.resolve())
    cfg = config_from_dict({"task": "arith"}).validate()  # that run resumed: trial 1 learned again, once
    learn(lib, run, cfg, level=2, reference_acc=0.1, done=[_agent_trial(1), _agent_trial(2, "discarded", -0.01)])
    assert [o["trial"] for o in lib.get("none -> partial_credit").evidence] == [1, 2]
