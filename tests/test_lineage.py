"""The lineage store: whole trials or none, append-only events, and resume after SIGKILL."""
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from evotrainer.lineage import LineageStore, TrialRecord


def record(n, label="kept", **kw):
    return TrialRecord(id=n, version=f"v{n}", parents=[f"v{n - 1}"], agent="rules", intervention="x", depth=1, hypothesis=f"h{n}",
                       success_criterion="val +2", patch="diff", label=label,
                       fitness={"val": {"0": 0.5, "1": 0.6}}, **kw)


def test_trials_round_trip_and_are_never_recorded_twice(tmp_path):
    store = LineageStore(tmp_path / "lineage.sqlite")
    store.begin_trial(1, hypothesis="h1")
    store.finish_trial(record(1))
    assert store.trials() == [record(1)]
    assert store.next_trial() == 2 and store.pending() == []
    with pytest.raises(ValueError, match="already recorded"):
        store.begin_trial(1)
    with pytest.raises(sqlite3.IntegrityError):
        store.finish_trial(record(1))
    assert [e["kind"] for e in store.events()] == ["trial_started", "trial_finished"]  # the failed write left nothing
    with pytest.raises(ValueError, match="unknown trial label 'great'"):
        record(2, label="great")


def test_events_are_append_only(tmp_path):
    store = LineageStore(tmp_path / "lineage.sqlite")
    store.event("run_started", budget=3)
    for sql in ("UPDATE events SET kind = 'x'", "DELETE FROM events"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            store.db.execute(sql)
    assert store.events("run_started")[0]["budget"] == 3


def test_pending_lists_trials_started_but_not_finished(tmp_path):
    store = LineageStore(tmp_path / "lineage.sqlite")
    store.begin_trial(1, hypothesis="a")
    store.finish_trial(record(1))
    store.begin_trial(2, hypothesis="b")
    store.begin_trial(2, hypothesis="b, again")  # a resume that was itself killed
    assert store.pending() == [(2, {"hypothesis": "b, again"})]
    assert store.next_trial() == 3  # never reuse a number that was handed out


WRITER = textwrap.dedent('''
    import sys, time
    from evotrainer.lineage import LineageStore, TrialRecord
    store = LineageStore(sys.argv[1])
    for n, proposal in store.pending():          # resume: redo what was cut off, same number
        store.finish_trial(TrialRecord(id=n, version=f"v{n}", parents=[], agent="rules",
                                       intervention="x", depth=1, hypothesis=proposal["hypothesis"], success_criterion="",
                                       patch="", label="kept"))
    n = store.next_trial()
    while n <= int(sys.argv[2]):
        store.begin_trial(n, hypothesis=f"h{n}")
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
        finished = {e["trial"] for e in store.events("trial_finished")}
        assert finished == {t.id for t in store.trials()}  # every row has its event, and no event lacks its row
        cut_mid_trial += bool(store.pending())
        store.close()
    assert cut_mid_trial >= 1  # the test has teeth: some kills left a trial half done
    total = LineageStore(db).next_trial() + 3
    subprocess.run([sys.executable, str(script), str(db), str(total)], check=True, timeout=120)
    store = LineageStore(db)
    assert [t.id for t in store.trials()] == list(range(1, total + 1))
    assert store.pending() == [] and len(store.events("trial_finished")) == total
