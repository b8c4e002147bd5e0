"""Tracker adapters against their real libraries, offline: what an adapter logs (per-step
metrics of two training jobs, a trial's outcome, the final table) is read back with the
library's own reader. A tracker that fails is dropped without costing the run; a config that
names an unknown or missing tracker is refused in one line; the TRL backend passes the same
choice to TRL as `report_to`."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer.config import TrackingConfig
from evotrainer.errors import UsageError
from evotrainer.trackers import TRACKERS, Tracker, TrackerSet, check

ROWS = [{"step": s, "reward_mean": 0.1 * s, "score_mean": 0.05 * s, "note": "text is skipped"} for s in range(1, 6)]
OTHER = [{"step": s, "reward_mean": 1.0 - 0.1 * s} for s in range(1, 4)]
TRIAL = {"trial": 1, "version": "v1", "parent": "v0", "intervention": "partial_credit", "label": "kept", "val": 8.0,
         "test": 7.5, "gain": 3.0, "bar": 1.2, "backtest": "passed"}
SPLIT = {"reference": {"mean": 1.0, "sd": 0.5, "per_seed": [1.0]}, "evolved": {"mean": 6.0, "sd": 1.0, "per_seed": [6.0]},
         "difference": {"mean": 5.0, "sd": 0.5, "per_seed": [5.0], "ci": [4.0, 6.0], "level": 0.95}}
FINAL = {"winner": "v1@2", "base": {"val": 0.03, "test": 0.04}, "comparison": {"val": SPLIT, "test": SPLIT}}


def feed(tracker: Tracker) -> None:
    tracker.log_steps("v1/seed-0", ROWS)
    tracker.log_steps("v2/seed-0", OTHER)
    tracker.log_trial(TRIAL, [TRIAL])
    tracker.log_final(FINAL, "the final table")
    tracker.close()


def test_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    feed(TRACKERS["tensorboard"].open(tmp_path, "run", TrackingConfig()))

    def read(sub, tag):
        acc = EventAccumulator(str(tmp_path / "trackers" / "tensorboard" / sub))
        acc.Reload()
        return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]
    assert read("v1/seed-0", "reward_mean") == [(s, round(0.1 * s, 6)) for s in range(1, 6)]
    assert read("v2/seed-0", "reward_mean") == [(s, round(1.0 - 0.1 * s, 6)) for s in range(1, 4)]  # own axis
    assert read("search", "trial/gain") == [(1, 3.0)] and read("search", "final/evolved/test") == [(0, 6.0)]


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline W&B run: its .wandb file is a LevelDB-style log of
    protobuf Records (32 KiB blocks, 7-byte chunk headers) after a 7-byte file header."""
    from wandb.proto import wandb_internal_pb2 as pb
    data, pos, records, part = run_file.read_bytes(), 7, [], b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk   # full / first, then middle / last
        if kind in (1, 4):
            records.append(part)
    rows = []
    for raw in records:
        r = pb.Record()
        r.ParseFromString(raw)
        if r.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return rows


def test_wandb_offline(tmp_path):
    wandb = pytest.importorskip("wandb")
    feed(TRACKERS["wandb"].open(tmp_path, "run", TrackingConfig(wandb_mode="offline")))
    # run.finish() only tells W&B's service process the run is done: the service flushes the
    # run's .wandb log when it closes the run's stream, after finish() has returned (a
    # `evotrainer run` completes it when the process exits). teardown() waits for the service.
    wandb.teardown()
    run_file, = (tmp_path / "trackers" / "wandb").glob("wandb/offline-run-*/run-*.wandb")
    rows = wandb_history(run_file)
    v1 = [(r["v1/seed-0/step"], round(r["v1/seed-0/reward_mean"], 6)) for r in rows if "v1/seed-0/step" in r]
    assert v1 == [(s, round(0.1 * s, 6)) for s in range(1, 6)], [sorted(r) for r in rows]
    assert [(r["trial"], r["trial/val"]) for r in rows if "trial/val" in r] == [(1, 8.0)]
    tables = {p.name.split("_")[0]: json.loads(p.read_text()) for p in run_file.parent.glob("files/media/table/*.json")}
    assert tables["trials"]["data"][0][tables["trials"]["columns"].index("label")] == "kept"
    assert len(tables["final"]["data"]) == 8   # base, reference, evolved, difference x val, test


def test_mlflow_sqlite_store(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    feed(TRACKERS["mlflow"].open(tmp_path, "run", TrackingConfig()))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'trackers' / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("evotrainer")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"run", "v1/seed-0", "v2/seed-0"}
    hist = sorted((m.step, round(m.value, 6)) for m in client.get_metric_history(runs["v1/seed-0"].info.run_id,
                                                                                 "reward_mean"))
    assert hist == [(s, round(0.1 * s, 6)) for s in range(1, 6)]
    parent = runs["run"]
    assert parent.data.metrics["trial.gain"] == 3.0 and parent.data.metrics["final.evolved.test"] == 6.0
    assert parent.data.tags["winner"] == "v1@2" and parent.info.status == "FINISHED"
    assert runs["v2/seed-0"].data.tags["mlflow.parentRunId"] == parent.info.run_id


TRACKIO = """
import json, sys
from pathlib import Path
from evotrainer.config import TrackingConfig
from evotrainer.trackers import TRACKERS
sys.path.insert(0, {tests!r})
from test_trackers import feed
feed(TRACKERS["trackio"].open(Path({out!r}), "run", TrackingConfig()))
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps({{"runs": SQLiteStorage.get_runs("evotrainer"),
                  "v1": [(r["step"], r["reward_mean"]) for r in SQLiteStorage.get_logs("evotrainer", "run/v1/seed-0")],
                  "search": SQLiteStorage.get_logs("evotrainer", "run/search")}}))
"""


def test_trackio_local_store(tmp_path):
    pytest.importorskip("trackio")
    # trackio reads where its store lives (TRACKIO_DIR) when imported: a process of its own
    p = subprocess.run([sys.executable, "-c", TRACKIO.format(tests=str(Path(__file__).parent), out=str(tmp_path))],
                       capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "TRACKIO_DIR": str(tmp_path / "store")})
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])   # trackio's chatter went to stderr
    assert len(p.stdout.strip().splitlines()) == 1
    assert sorted(got["runs"]) == ["run/search", "run/v1/seed-0", "run/v2/seed-0"]
    assert [(s, round(v, 6)) for s, v in got["v1"]] == [(s, round(0.1 * s, 6)) for s in range(1, 6)]
    assert got["search"][0]["trial/val"] == 8.0 and got["search"][1]["final/evolved/test"] == 6.0


class Broken(Tracker):
    name = "broken"
    closed = False

    def log_steps(self, series, rows):
        raise ConnectionError("the dashboard is down")

    def log_trial(self, row, rows):
        raise AssertionError("never called once dropped")

    def log_final(self, result, text):
        raise AssertionError("never called once dropped")

    def close(self):
        Broken.closed = True


class Recorder(Tracker):
    name = "recorder"

    def __init__(self):
        self.calls = []

    def log_steps(self, series, rows):
        self.calls.append(("steps", series, len(rows)))

    def log_trial(self, row, rows):
        self.calls.append(("trial", row["trial"]))

    def log_final(self, result, text):
        self.calls.append(("final", result["winner"]))


def test_a_failing_tracker_is_dropped_once_and_the_others_go_on():
    failures, rec = [], Recorder()
    trackers = TrackerSet([Broken(), rec], lambda name, why: failures.append((name, why)))
    trackers.steps("v1/seed-0", ROWS)
    trackers.trial(TRIAL, [TRIAL])
    trackers.final(FINAL, "")
    trackers.close()
    assert failures == [("broken", "ConnectionError: the dashboard is down")] and Broken.closed
    assert rec.calls == [("steps", "v1/seed-0", 5), ("trial", 1), ("final", "v1@2")]


def test_unknown_or_missing_trackers_are_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from evotrainer.cli import main
    cfg = tmp_path / "run.yaml"
    cfg.write_text("task: arith\ntracking: {report_to: [tensorbored]}\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("evotrainer: error: config: 'tracking.report_to': unknown tracker 'tensorbored'; valid choices: "
                   "tensorboard, wandb, mlflow, trackio") and not (tmp_path / "run").exists()
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UsageError, match=r"tracker 'wandb' needs the wandb package: pip install 'evotrainer\[wandb\]'"):
        check(["wandb"])


def test_the_trl_backend_reports_to_the_runs_trackers(tmp_path, tiny_qwen):
    """TRL gets `report_to`: its TensorBoard callback writes TRL's own metrics and ours, per step."""
    pytest.importorskip("trl")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from helpers import write_harness
    from evotrainer.catalog import get_task
    from evotrainer.harness import load_harness
    from evotrainer.trainer.backends import get_backend
    from evotrainer.trainer.segment import SegmentLog
    from evotrainer.policy import load_policy
    from evotrainer.runtime import Runtime
    h = load_harness(write_harness(tmp_path / "h"))
    model, tok = load_policy(tiny_qwen)
    log = SegmentLog(tmp_path, 3, 0)
    get_backend("trl").run(model, tok, get_task("arith", 1), h, seed=0, steps=3, log=log, optimizer_state=None,
                           runtime=Runtime("trl", report_to=("tensorboard",)))
    log.close()
    events, = {p.parent for p in (tmp_path / "trl").rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    ours = [json.loads(x)["reward_mean"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    got = [e.value for e in acc.Scalars("train/evotrainer/reward_mean")]
    assert got == pytest.approx(ours) and len(got) == 3
    assert any(t.startswith("train/") and "evotrainer" not in t for t in tags), tags   # TRL's own metrics too
