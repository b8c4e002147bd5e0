"""The skill library: outcomes in, effects, domains and rankings out."""
from evotrainer.skills import SkillLibrary, matching, rank, signature, standing

DEAD = {"diagnostic": "dead_group_ratio", "severity": "critical"}


def record(lib, trial, task, name, label, gain, run="r1", trigger="dead_group_ratio:critical"):
    lib.record(run=run, trial=trial, task=task, trigger=trigger, intervention=name, family="reward",
               patch={"reward": name}, expected=f"{name} helps", label=label, gain=gain)


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
    one = _skill("a", "t", "x", "f", {}, "", ({"task": "a", "label": "kept", "gain": 0.05},))
    three = _skill("b", "t", "y", "f", {}, "", tuple({"task": "a", "label": "kept", "gain": 0.04} for _ in range(3)))
    hack = _skill("c", "t", "z", "f", {}, "", ({"task": "a", "label": "invalid", "gain": 0.1},))
    assert three.score > one.score > 0 > hack.score


def test_matching_and_rank_follow_the_findings(tmp_path):
    lib = SkillLibrary(tmp_path / "s.sqlite")
    record(lib, 1, "arith", "clip_higher", "kept", 0.04)
    record(lib, 2, "arith", "partial_credit", "discarded", -0.03)
    record(lib, 3, "arith", "entropy_bonus", "kept", 0.08, trigger="entropy_collapse:warning")
    skills = lib.skills()
    assert [s.intervention for s in matching(skills, [DEAD])] == ["clip_higher", "partial_credit"]
    names = ["partial_credit", "drop_dead", "clip_higher", "entropy_bonus"]
    assert rank(names, [DEAD], skills, "arith") == ["clip_higher", "drop_dead", "entropy_bonus", "partial_credit"]
    assert rank(names, [], skills, "arith") == names          # no matching evidence: the rules' order
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


def test_other_tasks_count_only_what_generalises(tmp_path):
    lib = SkillLibrary(tmp_path / "s.sqlite")
    record(lib, 1, "arith", "clip_higher", "kept", 0.04)
    record(lib, 2, "arith", "partial_credit", "discarded", -0.03)
    record(lib, 3, "arith", "drop_dead", "invalid", 0.01)
    sk = {s.intervention: s for s in lib.skills()}
    names = ["drop_dead", "partial_credit", "clip_higher"]
    # on the task itself every outcome counts: the held one first, the losers last, the hack last of all
    assert rank(names, [DEAD], lib.skills(), "arith") == ["clip_higher", "partial_credit", "drop_dead"]
    # elsewhere the held one still leads, and one task's failures have no say (the rules' order)
    assert rank(names, [DEAD], lib.skills(), "rg:chain_sum") == ["clip_higher", "drop_dead", "partial_credit"]
    assert standing(sk["partial_credit"], "rg:chain_sum") is None and standing(sk["clip_higher"], "x") > 0
    record(lib, 4, "rg:leg_counting", "drop_dead", "discarded", 0.0)   # a second task where it did not hold
    assert rank(names, [DEAD], lib.skills(), "rg:chain_sum") == ["clip_higher", "partial_credit", "drop_dead"]
    assert standing({s.intervention: s for s in lib.skills()}["drop_dead"], "rg:chain_sum") < 0
    # measured here, the task's own evidence wins over what held elsewhere
    record(lib, 6, "rg:chain_sum", "clip_higher", "discarded", -0.02, run="r2")
    assert rank(names, [DEAD], lib.skills(), "rg:chain_sum") == ["partial_credit", "clip_higher", "drop_dead"]
