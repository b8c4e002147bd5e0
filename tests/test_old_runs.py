"""A run recorded before lineage events were typed (tests/fixtures/run-0b58134, made by
tests/fixtures/make_old_run.py with the code of that commit) is read back by today's code:
every stored event decodes and encodes to the JSON it was written as, `status`, `lineage`
and the report's data say what that code said, and the run view derives the states, plans,
population and winner that code's controller derived. Resuming needs the run's checkpoints
(13 MB each, not committed): resume after a kill is tested on a run made by today's code
(test_controller.py)."""
import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from evotrainer.cli import main
from evotrainer.evolve.search.population import SelectionConfig
from evotrainer.evolve.search.view import RunView
from evotrainer.evolve.stats.final import extend, schedule, winner
from evotrainer.evolve.status import lineage_tree, status
from evotrainer.lineage import SCHEMA_VERSION, LineageStore
from evotrainer.lineage.events import KINDS, decode

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "run-0b58134"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


def plain(x):
    """As JSON holds it (seeds as string keys, tuples as lists)."""
    return json.loads(json.dumps(x))


@pytest.fixture
def run(tmp_path):
    return shutil.copytree(FIXTURE, tmp_path / "run")  # opening a store stamps its schema version


def test_every_stored_event_reads_back_typed_and_writes_the_same_json(run):
    db = sqlite3.connect(run / "lineage.sqlite")
    rows = db.execute("SELECT kind, trial, data FROM events ORDER BY id").fetchall()
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0  # written before schema versions
    db.close()
    assert {k for k, _, _ in rows} == set(EXPECTED["kinds"]) and set(EXPECTED["kinds"]) <= set(KINDS)
    for kind, trial, data in rows:
        ev = decode(kind, json.loads(data), trial)
        assert type(ev) is KINDS[kind] and ev.trial_column == trial
        assert json.dumps(ev.to_json(), sort_keys=True) == data, kind


def test_status_lineage_and_report_read_an_old_run_as_its_own_code_did(run):
    assert status(run) == EXPECTED["status"]
    assert lineage_tree(run) == EXPECTED["lineage_tree"]
    from evotrainer.report.gather import gather
    d = gather(run)
    assert plain({"versions": [(v.trial, v.version, v.label, v.hypothesis[:40]) for v in d.versions],
                  "best_path": d.best_path, "curves": [c.name for c in d.curves],
                  "diagnostics": sorted(x.name for x in d.diagnostics)}) == EXPECTED["report"]
    store = LineageStore(run / "lineage.sqlite")
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # stamped on open
    store.close()
    assert main(["status", str(run)]) == 0


def test_the_run_view_derives_what_the_old_controller_derived(run):
    store = LineageStore(run / "lineage.sqlite")
    view = RunView.read(store)
    store.close()
    assert plain([dataclasses.asdict(s) for s in view.states]) == EXPECTED["states"]
    assert plain([dataclasses.asdict(s) for s in view.open_states(max_depth=3, restart=False)]) == \
        EXPECTED["open_states"]
    assert plain([dataclasses.asdict(e) | {"changes": sorted(e.changes)}
                  for e in view.population(SelectionConfig(capacity=4))]) == EXPECTED["population"]
    assert plain({str(n): p.to_json() for n, p in view.plans.items()}) == EXPECTED["plans"]
    win = winner(view.states)
    assert [f"{win.version}@{win.depth}", extend(schedule(view.trials, win.version, win.depth), 3)] == \
        EXPECTED["winner_schedule"]
    # the revised trial: its latest start is its plan, with the person's words and the rejected idea
    assert view.plans[2].round == 1 and view.plans[2].feedback == "try another knob"
    assert view.next_trial == 3 and view.spent == 2 and view.final.winner == EXPECTED["status"]["final"]["winner"]


def test_an_old_runs_gate_events_read_as_approvals(run):
    """Before "gate" meant only the promotion test, a person's checkpoints were stored as
    `gate_waiting` / `gate_decided`: they read as the approval events, and the run's approval
    logic (which waits are decided) reads them as it reads new ones."""
    from evotrainer.evolve.approval import waiting
    from evotrainer.lineage.events import ApprovalDecided, ApprovalWaiting
    store = LineageStore(run / "lineage.sqlite")
    try:
        asked, decided = store.events(ApprovalWaiting), store.events(ApprovalDecided)
        kinds = {k for (k,) in store.db.execute("SELECT DISTINCT kind FROM events")}
        assert {"gate_waiting", "gate_decided"} <= kinds and not {"approval_waiting", "approval_decided"} & kinds
        assert asked and decided and {e.trial for e in asked} == {e.trial for e in decided}
        assert waiting(store.events()) == []   # every old wait was decided
    finally:
        store.close()
