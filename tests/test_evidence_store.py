from evotrainer.evidence import EvidenceStore, EvidenceWriter, RolloutRecord
from evotrainer.evidence.store import steps_to_keep


def write_run(path, steps, groups=2, group_size=2, tag="x"):
    w = EvidenceWriter(path / "evidence.jsonl")
    for s in range(1, steps + 1):
        w.write([RolloutRecord(step=s, group_id=g, prompt_id=f"{tag}{s}-{g}", prompt="1+2=", answer="3", level=1,
                               completion="3" if i == 0 else "4", score=float(i == 0), reward=float(i == 0),
                               advantage=0.7 if i == 0 else -0.7, length=2, truncated=False,
                               mean_logprob=-0.5, entropy=0.4, kept=True)
                 for g in range(groups) for i in range(group_size)])
    w.close()
    return path


def test_ingest_and_query_by_version_step_and_group(tmp_path):
    a = write_run(tmp_path / "a", 5, tag="a")
    b = write_run(tmp_path / "b", 3, tag="b")
    store = EvidenceStore(tmp_path / "evidence.sqlite")
    assert store.ingest("v0", a) == 5 * 4
    assert store.ingest("v1", b) == 3 * 4
    assert store.versions() == ["v0", "v1"]
    rows = store.query("v0", steps=(2, 3), group_id=1)
    assert [(r.step, r.group_id) for r in rows] == [(2, 1), (2, 1), (3, 1), (3, 1)]
    assert rows[0] == RolloutRecord(step=2, group_id=1, prompt_id="a2-1", prompt="1+2=", answer="3", level=1,
                                    completion="3", score=1.0, reward=1.0, advantage=0.7, length=2,
                                    truncated=False, mean_logprob=-0.5, entropy=0.4, kept=True)
    assert len(store.query("v1")) == 12 and len(store.query()) == 32
    # re-ingesting a version replaces it rather than duplicating it
    store.ingest("v1", b)
    assert len(store.query("v1")) == 12
    store.close()
    assert len(EvidenceStore(tmp_path / "evidence.sqlite").query("v0")) == 20  # persisted


def test_store_is_bounded_by_whole_steps_first_and_last_kept(tmp_path):
    run = write_run(tmp_path / "a", 100)
    store = EvidenceStore(tmp_path / "e.sqlite", max_rows_per_version=40)
    assert store.ingest("v0", run) == 40
    steps = sorted({r.step for r in store.query("v0")})
    assert steps[0] == 1 and steps[-1] == 100 and len(steps) == 10
    assert steps_to_keep([1, 2, 3], 4, 1000) == [1, 2, 3]
    assert steps_to_keep(list(range(1, 11)), 10, 30) == [1, 5, 10]


def test_a_store_from_before_a_field_existed_takes_new_evidence(tmp_path):
    import sqlite3
    db = tmp_path / "evidence.sqlite"
    old = sqlite3.connect(db)  # the table as an evotrainer without outcome/failure made it
    old.execute("CREATE TABLE rollouts (version TEXT NOT NULL, step INTEGER, group_id INTEGER, prompt_id TEXT, "
                "prompt TEXT, answer TEXT, level INTEGER, completion TEXT, score REAL, reward REAL, advantage REAL, "
                "length INTEGER, truncated INTEGER, mean_logprob REAL, entropy REAL, kept INTEGER, turns INTEGER, "
                "tool_calls INTEGER, tool_failures INTEGER)")
    old.execute("INSERT INTO rollouts VALUES ('v0', 1, 0, 'p', '1+2=', '3', 1, '3', 1, 1, 0, 2, 0, -0.5, 0.4, 1, "
                "NULL, NULL, NULL)")
    old.commit()
    old.close()
    store = EvidenceStore(db)
    assert store.ingest("v1", write_run(tmp_path / "b", 2)) == 8
    assert len(store.query("v0")) == 1 and store.query("v0")[0].outcome is None and len(store.query("v1")) == 8
    store.close()
