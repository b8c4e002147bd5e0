"""Landscape tables and the search simulator: a row is found by what its harness trains as,
whichever path made it; a build goes on where it stopped; the real controller searching a
table keeps what the table says gains, scores it on seeds it never trained on, and pairs its
seed draws across strategies."""
import json
import random
import statistics
from dataclasses import asdict
from pathlib import Path

import pytest

from evotrainer.agents import Proposal
from evotrainer.evolve.landscape import (
    BACKTESTS,
    ROWS,
    Config,
    Row,
    build,
    changed_knobs,
    content_key,
    first_look,
    read_backtests,
    read_rows,
    rejudged,
    root_moves,
    write_harness,
)
from evotrainer.evolve.segments.state import SegmentFailed, State
from evotrainer.evolve.simulate import Table, simulate
from evotrainer.harness import REFERENCE

ROOT = Path(REFERENCE)
SEEDS = [0, 1, 2, 3, 4, 5]
GREEDY = {"name": "greedy", "agent": "rules", "search": {"selection": "greedy", "crossover": False, "escalation": False}}
RANDOM = {"name": "random", "agent": "random", "search": {"selection": "greedy", "crossover": False, "escalation": False}}
CONFIG = {"task": "arith", "level": 3, "search": {"mode": "restart"}, "seeds": [0, 1], "agent": "rules",
          "budget": {"trials": 4, "total_steps": 60, "wall_clock_s": 10800, "trial_timeout_s": 600},
          "evaluation": {"last_k": 2}, "promotion": {"alpha": 0.025, "min_gain": 0.01}}
DEAD = {"diagnostic": "dead_group_ratio", "layer": "signal", "severity": "critical", "blocking": False, "value": 0.6,
        "evidence": "dead_group_ratio = 0.6", "suggest": "reward: make the reward more continuous (partial credit)"}


def moves() -> dict[str, Proposal]:
    return {p.intervention: p for p in root_moves(ROOT, 3)}


def test_a_row_is_found_by_what_its_harness_trains_as(tmp_path):
    m = moves()
    a = write_harness(ROOT, tmp_path / "a", [m["lr_x0.8"], m["temperature_x1.25"]])
    b = write_harness(ROOT, tmp_path / "b", [m["temperature_x1.25"], m["lr_x0.8"]])
    c = write_harness(ROOT, tmp_path / "c", [m["lr_x1.25"], m["temperature_x1.25"]])
    assert content_key(a) == content_key(b) != content_key(c)
    # comments and order in knobs.yaml do not count; a slot file does
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "knobs.yaml").write_text("# a note\n" + "\n".join(reversed(
        (a / "knobs.yaml").read_text().splitlines())) + "\n")
    assert content_key(tmp_path / "d") == content_key(a)
    (tmp_path / "d" / "reward.py").write_text("x = 1\n")
    assert content_key(tmp_path / "d") != content_key(a)
    assert changed_knobs(ROOT, a) == {"temperature": m["temperature_x1.25"].knobs["temperature"],
                                      "lr": m["lr_x0.8"].knobs["lr"]}


def test_every_move_from_the_root_changes_it_once(tmp_path):
    keys = {content_key(write_harness(ROOT, tmp_path / p.intervention, [p])) for p in moves().values()}
    assert len(keys) == len(moves()) and content_key(ROOT) not in keys
    assert {"partial_credit", "lower_lr", "mix_score1_partial0p5", "lr_x0.8"} <= set(moves())


class FakeTraining:
    """Training's interface for `build`: each segment's accuracy from `acc(name, seed)`; counts
    what it trains; raises on the batch `fail_at`."""
    def __init__(self, acc, fail_at: int | None = None):
        self.acc, self.fail_at, self.trained, self.batches = acc, fail_at, [], 0
        self.harness_dir = None

    def train(self, segments, clock, read=None):
        self.batches += 1
        if self.batches == self.fail_at:
            raise KeyboardInterrupt  # a stop mid-build
        out = []
        for sg in segments:
            assert self.harness_dir(sg.version).is_dir()
            self.trained.append(sg.version)
            if sg.version == "broken":
                out.append(SegmentFailed("crash", "seed 0: boom"))
                continue
            seeds = sg.seeds
            out.append(State(sg.version, 1, {s: str(sg.out_root / f"seed-{s}") for s in seeds},
                             {s: self.acc(sg.version, s) for s in seeds}, {s: self.acc(sg.version, s) for s in seeds}))
        return out

    def findings(self, dirs, harness_dir):
        return [DEAD]


def test_a_stopped_build_goes_on_where_it_stopped(tmp_path):
    m = moves()
    configs = [Config("root", "root"), Config("replica-1", "replica", replica=1)] + [
        Config(n, "move", (m[n],)) for n in ("lower_lr", "partial_credit", "drop_dead", "entropy_bonus")] + [
        Config("broken", "move", (m["warmup"],))]
    acc = lambda name, s: 0.1 + 0.01 * s + (0.2 if name == "partial_credit" else 0.0)  # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        build(FakeTraining(acc, fail_at=2), ROOT, configs, seeds=SEEDS, out=tmp_path, batch=3)
    assert list(read_rows(tmp_path / ROWS)) == ["root", "replica-1", "lower_lr"]
    again = FakeTraining(acc)
    rows = build(again, ROOT, configs, seeds=SEEDS, out=tmp_path, batch=3)
    assert again.trained == ["partial_credit", "drop_dead", "entropy_bonus", "broken"]
    assert rows["partial_credit"].val[3] == pytest.approx(0.33) and rows["partial_credit"].findings[0] == [DEAD]
    assert rows["broken"].failed and not rows["broken"].val
    assert rows["replica-1"].key == "" and rows["lower_lr"].key == content_key(tmp_path / "harnesses" / "lower_lr")
    done = FakeTraining(acc)
    build(done, ROOT, configs, seeds=SEEDS, out=tmp_path)
    assert done.trained == []


def test_a_first_look_trains_the_root_and_the_sweep_before_the_catalogs_moves(tmp_path):
    m = moves()
    recipe = Proposal("lr2-binary-g1", "sweep", "", "", "", "", knobs={"lr": 6.0e-4})
    sweep = Config("sweep:lr2-binary-g1", "sweep", (recipe,))
    singles = [Config("root", "root"), Config("replica-1", "replica", replica=1),
               Config("partial_credit", "move", (m["partial_credit"],)), sweep,
               Config("lr_x0.8", "move", (m["lr_x0.8"],)), Config("drop_dead", "move", (m["drop_dead"],))]
    assert [c.name for c in first_look(singles)] == ["root", sweep.name, "partial_credit", "drop_dead"]  # no space move
    assert [c.name for c in first_look(singles, "sweep")] == ["root", sweep.name]
    assert [c.name for c in first_look(singles, "root")] == ["root"]
    training = FakeTraining(lambda name, s: 0.1)
    build(training, ROOT, first_look(singles), seeds=SEEDS, out=tmp_path, batch=2)
    assert training.trained == ["root", sweep.name, "partial_credit", "drop_dead"]


def test_a_configuration_with_a_recorded_rows_files_takes_its_outcome_untrained(tmp_path):
    """Two rows with the same harness files train identically (the sampling seeds come from the
    content), so the second is the first's outcome under its own name: a search's reached row
    that a space move names again costs nothing."""
    m = moves()
    acc = lambda name, s: 0.2 + 0.01 * s  # noqa: E731
    first = FakeTraining(acc)
    build(first, ROOT, [Config("reached-x", "reached", (m["mix_score1_partial0p5"],))], seeds=SEEDS, out=tmp_path)
    again = FakeTraining(acc)
    rows = build(again, ROOT, [Config("mix_score1_partial0p5", "move", (m["mix_score1_partial0p5"],)),
                               Config("replica-1", "replica", replica=1), Config("lower_lr", "move", (m["lower_lr"],))],
                 seeds=SEEDS, out=tmp_path)
    assert again.trained == ["replica-1", "lower_lr"]      # a replica has the root's files but samples anew
    twin, reached = rows["mix_score1_partial0p5"], rows["reached-x"]
    assert (twin.kind, twin.moves, twin.key) == ("move", ["mix_score1_partial0p5"], reached.key)
    assert twin.val == reached.val and twin.test == reached.test and twin.findings == reached.findings
    assert list(read_rows(tmp_path / ROWS)) == ["reached-x", "mix_score1_partial0p5", "replica-1", "lower_lr"]


def synthetic(tmp_path: Path, gains: dict[str, float], backtests: dict[str, str] | None = None,
              noise: float = 0.01) -> Path:
    """A table with every root move: `gains` (validation and test points, 0-1) where given,
    a small loss elsewhere; the root at 0.1 plus a seed effect; per-seed noise."""
    rng, m = random.Random(0), moves()
    seed_effect = {s: rng.gauss(0, 0.03) for s in SEEDS}
    rows = []

    def row(name, kind, mv, shift, replica=0):
        h = write_harness(ROOT, tmp_path / "harnesses" / name, mv)
        val = {s: 0.1 + seed_effect[s] + shift + rng.gauss(0, noise) for s in SEEDS}
        test = {s: v + rng.gauss(0, noise) for s, v in val.items()}
        rows.append(Row(name, kind, "" if replica else content_key(h), [p.intervention for p in mv],
                        [p.family for p in mv], changed_knobs(ROOT, h), val, test, replica,
                        {} if replica else {s: [DEAD] for s in SEEDS}))
    row("root", "root", [], 0.0)
    for r in (1, 2):
        row(f"replica-{r}", "replica", [], 0.0, r)
    for name, p in m.items():
        row(name, "move", [p], gains.get(name, -0.02))
    (tmp_path / ROWS).write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    (tmp_path / BACKTESTS).write_text("".join(
        json.dumps({"name": n, "seed": s, "label": label, "reasons": ["planted"], "signal": ""}) + "\n"
        for n, label in (backtests or {}).items() for s in SEEDS))
    (tmp_path / "meta.json").write_text(json.dumps({"seeds": SEEDS, "config": CONFIG}))
    return tmp_path


def test_the_simulated_search_keeps_what_the_table_says_gains(tmp_path):
    table = Table.load(synthetic(tmp_path, {"partial_credit": 0.25}))
    reps = simulate(table, GREEDY, replicates=3, trials=4)
    for r in reps:
        assert r.winner == "partial_credit" and r.holds == ("partial_credit",)
        assert r.fresh and not set(r.fresh) & set(r.seeds)  # scored on seeds no decision read
        rows = table.rows
        assert r.gain == pytest.approx(sum(100 * (rows["partial_credit"].test[s] - rows["root"].test[s])
                                           for s in r.fresh) / len(r.fresh))
        assert r.first_kept is not None and r.labels[r.first_kept - 1] == "kept"
    # replicate r draws the same seeds whatever the strategy: gains pair
    assert [r.seeds for r in reps] == [r.seeds for r in simulate(table, RANDOM, replicates=3, trials=2)]
    assert len({r.seeds for r in reps}) > 1


def test_a_first_look_loads_as_a_table_with_its_tasks_meta(tmp_path):
    """Before a table is built, its first look (TASK/headroom) is what --real reads: the rows,
    harnesses and backtests there, the config and pool from the task's meta.json one folder up."""
    look = synthetic(tmp_path / "headroom", {"partial_credit": 0.25})
    (look / "meta.json").rename(tmp_path / "meta.json")
    table = Table.load(look)
    assert table.root_dir == look / "harnesses" / "root" and table.config == CONFIG and table.seeds == SEEDS
    assert table.rows["partial_credit"].val[SEEDS[0]] > table.root.val[SEEDS[0]] + 0.2  # the look's own rows


def test_a_move_back_to_a_trained_harness_is_passed_over_off_the_budget(tmp_path):
    """Restart mode: after three failures from the kept child, escalation undoes its change
    first; that harness has the root's files, which trained from the base on these seeds
    already. Equivalent, not trained, not counted."""
    table = Table.load(synthetic(tmp_path, {"partial_credit": 0.25}))
    (r,) = simulate(table, {"name": "out-of-the-box", "agent": "rules", "search": {}}, replicates=1, trials=7)
    labels = dict(zip(r.interventions, r.labels))
    assert r.labels[0] == "kept" and labels["revert_reward"] == labels["binary_reward"] == "equivalent"
    assert len([x for x in r.labels if x != "equivalent"]) == 7  # the budget's 7 trials, all spent elsewhere


def test_the_winner_is_the_best_trained_version_or_with_search_winner_kept_the_best_kept(tmp_path):
    """A gain under the gate's noise floor is discarded: by default the winner is still the best
    validated of every version trained, as a sweep picks; `search.winner: kept` keeps the root."""
    path = synthetic(tmp_path, {"partial_credit": 0.01})
    (best,) = simulate(Table.load(path), GREEDY, replicates=1, trials=3)
    table = Table.load(path)
    table.config = {**table.config, "search": {**table.config["search"], "winner": "kept"}}
    (kept,) = simulate(table, GREEDY, replicates=1, trials=3)
    assert kept.labels == best.labels and "kept" not in kept.labels  # the same search, nothing kept
    assert kept.winner == "root" and best.winner == "partial_credit"  # the others lose 0.02 on every seed


def test_a_skill_library_learned_on_one_table_reorders_a_search_on_another(tmp_path):
    """Transfer on the simulator: searches on table a record into a library; a search on table
    b reads it (and records into it too: each table's replicates are runs of their own)."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    a = Table.load(synthetic(tmp_path / "a", {}))  # every move loses 0.02
    b = Table.load(synthetic(tmp_path / "b", {"partial_credit": 0.25}))
    oob, lib = {"agent": "rules", "search": {}}, tmp_path / "skills.sqlite"
    (without,) = simulate(b, oob, replicates=1, trials=2)
    (on_a,) = simulate(a, {**oob, "skills": str(lib)}, replicates=1, trials=3)
    (with_lib,) = simulate(b, {**oob, "skills": str(lib)}, replicates=1, trials=2)
    assert without.interventions[0] == on_a.interventions[0] == "partial_credit"  # the dead-group finding's answer
    assert on_a.labels[0] == "discarded" and with_lib.seeds == without.seeds
    assert with_lib.interventions[0] != "partial_credit"  # what lost on a comes later on b


def test_a_repeated_seed_draw_searches_with_a_seed_of_its_own(tmp_path):
    """Beyond the pool's 30 ordered draws a replicate gives the search its own seed: the random
    agent proposes anew on the same training seeds, the rules agent's greedy search repeats."""
    table = Table.load(synthetic(tmp_path, {"partial_credit": 0.25, "lower_lr": 0.1}))
    (first,), (again,) = simulate(table, RANDOM, replicates=1, trials=3), simulate(table, RANDOM, replicates=1,
                                                                                   trials=3, first=30)
    assert first.seeds == again.seeds and first.interventions != again.interventions
    (g0,), (g30,) = simulate(table, GREEDY, replicates=1, trials=2), simulate(table, GREEDY, replicates=1, trials=2,
                                                                              first=30)
    assert g0.seeds == g30.seeds and g0.interventions == g30.interventions


def test_search_seed_is_an_integer_or_null():
    from evotrainer.config import config_from_dict
    from evotrainer.errors import UsageError
    assert config_from_dict({**CONFIG, "search": {"seed": 7}}).validate().search.seed == 7
    assert config_from_dict(CONFIG).validate().search.seed is None
    with pytest.raises(UsageError, match="search.seed"):
        config_from_dict({**CONFIG, "search": {"seed": "x"}}).validate()


def test_a_flat_table_keeps_nothing_and_a_recorded_backtest_vetoes(tmp_path):
    table = Table.load(synthetic(tmp_path, {"partial_credit": 0.25}, {"partial_credit": "backtest_rejected"}))
    (r,) = simulate(table, GREEDY, replicates=1, trials=3)
    assert r.winner == "root" and r.gain == 0 and r.first_kept is None
    assert r.labels[0] == "backtest_rejected"  # the dead-group finding points at the reward first


def test_a_backtest_recorded_on_a_kept_childs_rollouts_vetoes_its_child(tmp_path):
    """A search backtests a child of a non-root parent on that parent's rollouts: a table that
    recorded it (parent named) decides with it; without one the simulator passes it."""
    out = synthetic(tmp_path, {"partial_credit": 0.25})
    both = "partial_credit+reward_overlong_penalty"
    child = out / "harnesses" / "partial_credit"
    second = next(p for p in root_moves(child, 3) if p.intervention == "reward_overlong_penalty")  # a move from the child
    h = write_harness(child, out / "harnesses" / both, [second])
    pc = read_rows(out / ROWS)["partial_credit"]
    row = Row(both, "combo", content_key(h), ["partial_credit", "reward_overlong_penalty"], ["reward", "reward"],
              changed_knobs(ROOT, h), dict(pc.val), dict(pc.test))
    with open(out / ROWS, "a") as fh:
        fh.write(json.dumps(asdict(row)) + "\n")
    (passed,) = simulate(Table.load(out), GREEDY, replicates=1, trials=2)
    assert passed.interventions == ("partial_credit", "reward_overlong_penalty") and passed.labels[1] == "discarded"
    with open(out / BACKTESTS, "a") as fh:  # rejected on the kept child's lowest seed only
        fh.write(json.dumps({"name": both, "parent": "partial_credit", "seed": min(passed.seeds),
                             "label": "backtest_rejected", "reasons": ["planted"], "signal": ""}) + "\n")
    table = Table.load(out)
    assert both not in read_backtests(out / BACKTESTS) and both in read_backtests(out / BACKTESTS, "partial_credit")
    (vetoed,) = simulate(table, GREEDY, replicates=1, trials=2)
    assert vetoed.seeds == passed.seeds and vetoed.labels == ("kept", "backtest_rejected")


def test_a_version_off_the_table_is_predicted_as_its_best_move_or_missed(tmp_path):
    table = Table.load(synthetic(tmp_path, {"lower_lr": 0.05, "entropy_bonus": 0.03}))
    m = moves()
    both = table.row_for(write_harness(ROOT, tmp_path / "both", [m["entropy_bonus"], m["lower_lr"]]))
    a = table.rows["lower_lr"]
    assert both.kind == "predicted" and set(both.moves) == {"lower_lr", "entropy_bonus"}
    assert both.val == a.val and both.test == a.test  # as its best part: lower_lr gains more
    assert (table.predicted, table.misses) == (1, 0)
    # a learning rate no row sets: a resample drawn by another run's seed, which stands for the table's draw
    odd = Proposal("lr_resample", "optimisation", "", "", "", "", knobs={"lr": 1.234e-4})
    assert table.row_for(write_harness(ROOT, tmp_path / "odd", [odd, m["lower_lr"]])) is a  # lower_lr's own
    drawn = table.row_for(write_harness(ROOT, tmp_path / "drawn", [m["entropy_bonus"], odd]))
    assert set(drawn.moves) == {"entropy_bonus", "lr_resample"}
    # a slot file no row writes: a miss
    own = Proposal("own_reward", "reward", "", "", "", "", knobs={"reward": "mine"},
                   files={"reward.py": "def mine(r):\n    return r.scores\n"})
    assert table.row_for(write_harness(ROOT, tmp_path / "own", [own])) is None
    assert (table.predicted, table.misses) == (2, 1)


def test_screen_trains_each_change_from_the_base_and_goes_on_after_a_stop(tmp_path, ckpt, capsys):
    from helpers import run_cli
    from helpers import write_harness as small_harness
    root = small_harness(tmp_path / "root")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"task: arith\nlevel: 1\nharness: {root}\nseeds: [0, 1]\nmodel: {ckpt}\n"
                   "budget: {total_steps: 2, steps_per_segment: 2, trial_timeout_s: 120}\nevaluation: {every: 1}\n")
    out = tmp_path / "screen"
    code, _, err = run_cli(capsys, "screen", cfg, "--out", out, "--moves", "lower_lr,nonsense")
    assert code == 2 and err.count("\n") == 1 and "no move nonsense" in err and "partial_credit" in err
    code, stdout, err = run_cli(capsys, "screen", cfg, "--out", out, "--moves", "lower_lr,partial_credit", "--json")
    assert code == 0, err
    rows = json.loads(stdout)
    assert set(rows) == {"root", "lower_lr", "partial_credit"}
    assert all(set(r["val"]) == {"0", "1"} and not r["failed"] for r in rows.values())
    table = (out / "screen.md").read_text()
    assert "| lower_lr | move |" in table and "| root | root |" in table
    # its report: the gains chart and a row per change, and `evotrainer report` rewrites it
    page = (out / "report.html").read_text()
    assert 'id="screen-val"' in page and "<code>partial_credit</code>" in page and "<code>lower_lr</code>" in page
    (out / "report.html").unlink()
    code, _, err = run_cli(capsys, "report", out, "--engine", "svg")
    assert code == 0, err
    assert 'id="screen-test"' in (out / "report.html").read_text()
    # the segments are cached and the rows recorded: the same screen again trains nothing
    assert (out / ROWS).read_text().count("\n") == 3
    code, stdout2, _ = run_cli(capsys, "screen", cfg, "--out", out, "--moves", "lower_lr,partial_credit", "--json")
    assert code == 0 and json.loads(stdout2) == rows and (out / ROWS).read_text().count("\n") == 3


def test_an_extra_seed_pair_draws_a_pool_seed_the_run_does_not_use(tmp_path):
    from evotrainer.catalog import get_task
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.segments.state import EXTRA_PAIR_DATA, Clock, Segment
    from evotrainer.evolve.simulate import TableTraining
    from evotrainer.runtime import Runtime
    table = Table.load(synthetic(tmp_path, {}))
    cfg = config_from_dict({**CONFIG, "seeds": [1, 3]}).validate()
    tr = TableTraining(cfg=cfg, task=get_task("arith", 3), runtime=Runtime(), base="", run_dir=tmp_path,
                       harness_dir=lambda v: tmp_path / "harnesses" / "root", table=table)
    start = State("v0", 0, {}, {}, {})
    (first,) = tr.train([Segment("v0", start, 1, tmp_path / "p1", data_offset=EXTRA_PAIR_DATA + 1, seeds=(1,))], Clock())
    (second,) = tr.train([Segment("v0", start, 1, tmp_path / "p2", data_offset=EXTRA_PAIR_DATA + 2, seeds=(3,))], Clock())
    assert first.val == {1: table.root.val[0]} and second.val == {3: table.root.val[2]}
    assert tr.used == {0, 2}  # what the winner's fresh seeds then leave out


def test_a_version_off_the_table_is_trained_once_and_added_with_a_fill_trainer(tmp_path):
    out = synthetic(tmp_path / "table", {})
    fill = FakeTraining(lambda name, s: 0.5)
    table = Table.load(out, fill)
    own = Proposal("own_reward", "reward", "", "", "", "", knobs={"reward": "mine"},
                   files={"reward.py": "def mine(r):\n    return r.scores\n"})
    reached = write_harness(ROOT, tmp_path / "reached", [own])
    row = table.row_for(reached)
    assert row.kind == "reached" and row.val == {s: 0.5 for s in SEEDS} and row.knobs == {"reward": "mine"}
    assert table.row_for(reached) is row and len(fill.trained) == 1 and table.filled == 1
    # recorded with the table: the next load finds it, and a simulated search reads it like any row
    assert Table.load(out).row_for(reached).val == row.val
    assert (out / "harnesses" / row.name / "reward.py").is_file()


def test_a_screen_whose_base_is_not_built_yet_says_so_and_shows_the_build(tmp_path, capsys, monkeypatch):
    """Where the config names no model and its base is not cached, the screen builds it first:
    the plan and a line per 100 SFT steps on stderr (a log has no live bar)."""
    from helpers import run_cli

    from evotrainer.errors import UsageError
    from evotrainer.trainer import pretrain as pt

    def build(task, cfg, progress=None, require_target=None):  # the first probe check, then a stop
        progress(pt.SftProgress(stage="arith level 1", step=100, expected=0, cap=300, loss=0.5, probe_acc=0.1,
                                target=0.2))
        raise UsageError("stopped here by the test")
    monkeypatch.setattr(pt, "stages_to_build", lambda task, cfg: ["a stage"])
    monkeypatch.setattr(pt, "announce", lambda stages: f"Building the base model once: {stages}")
    monkeypatch.setattr(pt, "pretrain", build)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("task: arith\nlevel: 1\nseeds: [0, 1]\n")
    code, _, err = run_cli(capsys, "screen", cfg, "--out", tmp_path / "screen", "--moves", "lower_lr")
    assert code == 2 and "stopped here by the test" in err
    assert "Building the base model once: ['a stage']" in err
    assert "building the base, arith level 1: SFT step 100, loss 0.500, probe accuracy 0.10 of 0.20" in err


def test_a_recorded_rejection_of_shaping_passes_under_todays_verdict():
    reason = ("12% of the advantage signal falls in groups whose verifier scores are all equal, and there it "
              "tracks {} (r = {}), not correctness (closeness to the answer r = +0.05): the policy would be "
              "pushed towards {} where no answer is better than another")
    penalty = {"name": "overlong_shaping", "seed": 0, "label": "backtest_rejected",
               "reasons": [reason.format("truncated", "-0.89", "truncated")]}
    now = rejudged(penalty)
    assert now["label"] == "passed" and now["reasons"] == [] and "truncated (r = -0.89)" in now["notes"][0]
    hack = penalty | {"reasons": [reason.format("length", "+0.91", "length")]}
    mixed = penalty | {"reasons": penalty["reasons"] + ["max_new_tokens=8 would cut 3 of 40 correct rollouts"]}
    other = penalty | {"reasons": [reason.format("repetition", "-0.70", "repetition")]}
    assert rejudged(penalty | {"reasons": [reason.format("format_failure", "-0.99", "format_failure")]})["label"] == "passed"
    for b in (hack, mixed, other, penalty | {"label": "passed", "reasons": []}):
        assert rejudged(b) == b


def test_a_replicate_ranks_every_version_it_trained_and_counts_its_segments(tmp_path):
    """What a choice of winner after the search reads (bench/simulate.py --confirm): every
    trained version's row, best validated on the run's seeds first, and the segments spent."""
    table = Table.load(synthetic(tmp_path, {"partial_credit": 0.25, "lower_lr": 0.1}))
    (r,) = simulate(table, GREEDY, replicates=1, trials=3)
    trained = [i for i, label in zip(r.interventions, r.labels) if label in ("kept", "discarded")]
    assert r.ranked[0] == r.winner == "partial_credit" and "root" in r.ranked
    assert len(r.ranked) == 1 + len(trained)  # a row is named by the table, a trial by its move's name
    val = [statistics.fmean(table.named(n).val[s] for s in r.seeds) for n in r.ranked]
    assert val == sorted(val, reverse=True)
    assert r.segments == 2 * (1 + 2 + len(trained))  # the root, its 2 noise replicas, each child, on 2 seeds
    (one,) = simulate(table, GREEDY, replicates=1, trials=3, seeds_per_run=1)
    assert one.seeds == r.seeds[:1]  # a one-seed search pairs with the two-seed ones
