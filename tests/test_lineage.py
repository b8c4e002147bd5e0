"""The lineage store: whole trials or none, append-only typed events, a schema version, and
resume after SIGKILL."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from evotrainer.cli import main
from evotrainer.errors import UsageError
from evotrainer.lineage import SCHEMA_VERSION, Fitness, LineageStore, TrialRecord
from evotrainer.lineage.events import (KINDS, ControlFinished, RunStarted, SessionStarted, Stopped, TrialFinished,
                                       TrialStarted, Unknown)
from evotrainer.lineage.state import State


def record(n, label="kept", **kw):
    return TrialRecord(id=n, version=f"v{n}", parents=[f"v{n - 1}"], agent="rules", intervention="x", depth=1, hypothesis=f"h{n}",
                       success_criterion="val +2", patch="diff", label=label,
                       **{"fitness": {"val": {"0": 0.5, "1": 0.6}}} | kw)


def test_trials_round_trip_and_are_never_recorded_twice(tmp_path):
    store = LineageStore(tmp_path / "lineage.sqlite")
    store.begin_trial(TrialStarted(1, "x", "v1"))
    store.finish_trial(record(1))
    assert store.trials() == [record(1)]
    assert store.next_trial() == 2 and store.pending() == []
    with pytest.raises(ValueError, match="already recorded"):
        store.begin_trial(TrialStarted(1, "x", "v1"))
    with pytest.raises(sqlite3.IntegrityError):
        store.finish_trial(record(1))
    # the failed write left nothing
    assert store.events() == [TrialStarted(1, "x", "v1"), TrialFinished(1, "kept", "v1")]
    with pytest.raises(ValueError, match="unknown trial label 'great'"):
        record(2, label="great")


# a kept child's fitness as the controller wrote it before outcomes were typed: one flat object
OLD_FITNESS = {"val": {"0": 0.3, "1": 0.4}, "test": {"0": 0.2, "1": 0.25},
               "state": {"version": "v2", "depth": 1, "dirs": {"0": "/r/v2/seed-0", "1": "/r/v2/seed-1"},
                         "val": {"0": 0.3, "1": 0.4}, "test": {"0": 0.2, "1": 0.25}},
               "control_val": {"0": 0.2, "1": 0.3}, "gain": 0.1, "se": 0.02, "threshold": 0.05, "rule": "keep",
               "extra_pairs": [[0.45, 0.3]]}


def test_a_trials_fitness_reads_back_typed_from_the_flat_row_older_runs_wrote(tmp_path):
    f = Fitness.of(OLD_FITNESS)
    assert f.val == {0: 0.3, 1: 0.4} and f.mean_val == pytest.approx(0.35) and f.gain == 0.1
    assert f.dirs == {0: "/r/v2/seed-0", 1: "/r/v2/seed-1"} and f.state.key == ("v2", 1)
    assert f.decision.control_val == {0: 0.2, 1: 0.3} and f.decision.extra_pairs == ((0.45, 0.3),)
    assert f.decision.rule == "keep" and f.noise_sd is None and f.replicas == ()
    store = LineageStore(tmp_path / "lineage.sqlite")
    store.finish_trial(record(2, fitness=OLD_FITNESS))
    assert store.trials()[0].fitness == f
    row, = store.db.execute("SELECT fitness FROM trials").fetchall()
    assert json.loads(row[0]) == OLD_FITNESS   # the row is what it was: older code reads it too
    root = {"val": {"0": 0.1}, "test": {"0": 0.1}, "noise_sd": 0.01, "replicas": [{"0": 0.12}, {"0": 0.09}]}
    r = Fitness.of(root)
    assert r.replicas == ({0: 0.12}, {0: 0.09}) and r.noise_sd == 0.01 and r.decision is None
    assert json.loads(json.dumps(r.to_json())) == root
    untrained = Fitness.of({})   # refused or crashed: nothing measured
    assert (untrained.mean_val, untrained.gain, untrained.dirs, untrained.to_json()) == (None, None, {}, {})


def test_events_are_append_only(tmp_path):
    store = LineageStore(tmp_path / "lineage.sqlite")
    store.append(RunStarted(base="b", max_depth=3))
    for sql in ("UPDATE events SET kind = 'x'", "DELETE FROM events"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            store.db.execute(sql)
    assert store.events(RunStarted)[0].base == "b"


def test_pending_lists_trials_started_but_not_finished(tmp_path):
    store = LineageStore(tmp_path / "lineage.sqlite")
    store.begin_trial(TrialStarted(1, "a", "v1"))
    store.finish_trial(record(1))
    store.begin_trial(TrialStarted(2, "b", "v2"))
    store.begin_trial(TrialStarted(2, "b, again", "v2"))  # a resume that was itself killed
    assert store.pending() == [TrialStarted(2, "b, again", "v2")]
    assert store.next_trial() == 3  # never reuse a number that was handed out


WRITER = textwrap.dedent('''
    import sys, time
    from evotrainer.lineage import LineageStore, TrialRecord
    store = LineageStore(sys.argv[1])
    from evotrainer.lineage.events import TrialStarted
    for started in store.pending():               # resume: redo what was cut off, same number
        store.finish_trial(TrialRecord(id=started.trial, version=started.version, parents=[], agent="rules",
                                       intervention=started.intervention, depth=1, hypothesis="",
                                       success_criterion="", patch="", label="kept"))
    n = store.next_trial()
    while n <= int(sys.argv[2]):
        store.begin_trial(TrialStarted(n, f"h{n}", f"v{n}"))
        time.sleep(0.05)                          # "training": most kills land inside a trial
        store.finish_trial(TrialRecord(id=n, version=f"v{n}", parents=[], agent="rules",
                                       intervention="x", depth=1, hypothesis=f"h{n}", success_criterion="", patch="", label="kept"))
        n += 1
''')


def test_sigkill_at_any_moment_then_resume_leaves_no_gap_and_no_duplicate(tmp_path):
    script, db = tmp_path / "writer.py", tmp_path / "lineage.sqlite"
    script.write_text(WRITER)
    cut_mid_trial = 0
    for delay in (0.4, 0.55, 0.7, 0.85, 1.0, 1.15):  # kill an endless writer at different moments
        p = subprocess.Popen([sys.executable, str(script), str(db), str(10**6)])
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        store = LineageStore(db)
        finished = {e.trial for e in store.events(TrialFinished)}
        assert finished == {t.id for t in store.trials()}  # every row has its event, and no event lacks its row
        cut_mid_trial += bool(store.pending())
        store.close()
    assert cut_mid_trial >= 1  # the test has teeth: some kills left a trial half done
    total = LineageStore(db).next_trial() + 3
    subprocess.run([sys.executable, str(script), str(db), str(total)], check=True, timeout=120)
    store = LineageStore(db)
    assert [t.id for t in store.trials()] == list(range(1, total + 1))
    assert store.pending() == [] and len(store.events(TrialFinished)) == total


def test_a_store_from_a_newer_schema_is_refused_in_one_line_and_an_unversioned_one_is_read(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    db = sqlite3.connect(run / "lineage.sqlite")
    db.execute("PRAGMA user_version = %d" % (SCHEMA_VERSION + 1))
    db.close()
    with pytest.raises(UsageError, match=f"lineage schema {SCHEMA_VERSION + 1}; this one reads up to"):
        LineageStore(run / "lineage.sqlite")
    assert main(["status", str(run)]) == 2
    err = capsys.readouterr()[1].strip().splitlines()
    assert len(err) == 1 and "newer evotrainer" in err[0]
    old = tmp_path / "old.sqlite"  # no version written: the rows before typed events, read as they are
    LineageStore(old).close()
    db = sqlite3.connect(old)
    db.execute("PRAGMA user_version = 0")
    db.execute("""INSERT INTO events (t, trial, kind, data) VALUES (1, NULL, 'run_started', '{"base": "b", "max_depth": 3}')""")
    db.commit()
    db.close()
    store = LineageStore(old)
    (started,) = store.events(RunStarted)
    assert started == RunStarted("b", 3)  # what runs of then did not record: the defaults written beside the fields
    assert (started.split_key, started.executor, started.base_s) == (None, "local", 0.0)
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_events_read_back_typed_extra_keys_passed_over_unknown_kinds_kept(tmp_path):
    store = LineageStore(tmp_path / "lineage.sqlite")
    state = State("v1", 2, {0: "d"}, {0: 0.5}, {0: 0.25})
    store.append(ControlFinished(state))
    store.append(Stopped("budget"))
    store.db.execute("""INSERT INTO events (t, trial, kind, data) VALUES (1, NULL, 'stopped', '{"reason": "r", "later": 1}')""")
    store.db.execute("""INSERT INTO events (t, trial, kind, data) VALUES (1, 4, 'from_the_future', '{"x": 1}')""")
    assert store.events(ControlFinished) == [ControlFinished(state)]  # seeds are ints again
    assert store.events(Stopped) == [Stopped("budget"), Stopped("r")]
    assert store.events()[-1] == Unknown("from_the_future", {"x": 1}, 4)
    assert [x.event.KIND for x in store.log(SessionStarted, Stopped)] == ["stopped", "stopped"]
    # scripts written before typed events (bench/) name a kind and get the stored dicts
    assert store.events("stopped")[1]["reason"] == "r" and store.events("stopped")[1]["later"] == 1
    with pytest.raises(UsageError, match="'control_finished' event in the lineage lacks state"):
        KINDS["control_finished"].from_json({})


def test_the_package_reads_events_and_outcomes_typed_only():
    """No event payload or trial outcome read by a string key (scripts/layout_metrics.py counts
    them), and no `events("kind")` call, the dict form kept for scripts outside the package."""
    import ast
    import importlib.util
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("layout_metrics", root / "scripts" / "layout_metrics.py")
    metrics = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(metrics)
    assert metrics.event_payload_reads() == [] and metrics.outcome_reads() == []
    by_name = [f"{m}:{node.lineno}" for m, path in metrics.modules().items() for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "events"
               and node.args and isinstance(node.args[0], ast.Constant)]
    assert by_name == []
