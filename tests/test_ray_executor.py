"""`executor: ray`: every training and evaluation job a Ray task on one local Ray cluster (2
CPUs, started once for this module). A run finishes with the same lineage as with the local
pool; a job past its deadline is cancelled with force, labelled `timeout`, and leaves no
process behind; a Ray worker killed mid-job gives a retry, or a labelled crash once the
retries are spent, never a lost job."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml

from helpers import descends_from, processes_with, readable, tiny_run_config
from evotrainer.cli import main
from evotrainer.config import config_from_dict
from evotrainer.errors import UsageError
from evotrainer.evolve.controller import Controller
from evotrainer.executors import Call
from evotrainer.sandbox import Isolation, probe
import worker_targets

ray = pytest.importorskip("ray")
from evotrainer.executors.ray_tasks import RayExecutor  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module", autouse=True)
def cluster():
    # the tests' own job targets (worker_targets) reach Ray's workers, and the sandboxed jobs
    # they start, as a user's modules would: on PYTHONPATH (a job sees no working directory)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="evotrainer-tests",
             runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}})
    yield
    ray.shutdown()


def ray_workers_running_a_job() -> list[int]:
    """Pids of Ray worker processes executing one of our jobs (Ray titles them by the task)."""
    return processes_with("ray::evotrainer_job")


def eventually(ok, wait_s: float = 10.0) -> bool:
    """ok() within moments (the kernel's kills of a dying worker and namespace are not instant)."""
    deadline = time.monotonic() + wait_s
    while not ok() and time.monotonic() < deadline:
        time.sleep(0.1)
    return ok()


def gone(marker: str) -> bool:
    return eventually(lambda: processes_with(marker) == [])


def test_jobs_come_back_labelled_in_order():
    results = RayExecutor(cwd=HERE).run([Call(worker_targets.add, {"a": 2, "b": 3}), Call(worker_targets.boom),
                                         Call(worker_targets.not_json)], timeout_s=60)
    assert [r.label for r in results] == ["ok", "crash", "crash"]
    assert results[0].value == 5 and "the harness broke" in results[1].error and "not plain JSON" in results[2].error


def test_trials_in_flight_share_one_ray_executor_from_their_threads():
    """search.concurrency on Ray: each trial's thread submits its jobs to the one executor, and
    the cluster runs them beside each other (2 CPUs here: one job of each at once)."""
    ex, spans, errors = RayExecutor(cwd=HERE), [], []

    def trial():
        try:
            (r,) = ex.run([Call(worker_targets.interval, {"seconds": 1.5})], timeout_s=60)
            spans.append(r.value)
        except BaseException as e:  # noqa: BLE001 (reported below, in the test's thread)
            errors.append(e)
    threads = [threading.Thread(target=trial) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(spans) == 2
    (s1, e1), (s2, e2) = spans
    assert s1 < e2 and s2 < e1  # side by side


def test_a_job_past_its_deadline_is_a_timeout_and_leaves_no_process():
    marker = f"evotrainer-ray-spin-{time.monotonic_ns()}"
    t0 = time.monotonic()
    (r,) = RayExecutor(cwd=HERE).run([Call(worker_targets.spin_with_child, {"marker": marker})], timeout_s=3)
    assert r.label == "timeout" and "cancelled with force" in r.error
    assert time.monotonic() - t0 < 40
    assert gone(marker + "-child") and eventually(lambda: ray_workers_running_a_job() == [])


@pytest.mark.parametrize("retries", [1, 0])
def test_a_ray_worker_killed_mid_job_is_retried_or_a_labelled_crash(tmp_path, retries):
    out, marker = tmp_path / "out", f"evotrainer-ray-kill-{retries}-{time.monotonic_ns()}"
    results = []
    call = Call(worker_targets.note_then_sleep, {"out": str(out), "seconds": 3, "marker": marker}, writes=(str(out),))
    th = threading.Thread(target=lambda: results.extend(RayExecutor(retries=retries, cwd=HERE).run([call], 60)))
    th.start()
    deadline = time.monotonic() + 60
    while not (out / "starts").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert eventually(lambda: processes_with(marker))  # the job's child, started next
    # the Ray worker running this job: an ancestor of its child (through the worker's fork server)
    (worker,) = [w for w in ray_workers_running_a_job() if descends_from(processes_with(marker)[0], w)]
    os.kill(worker, signal.SIGKILL)
    th.join(120)
    assert not th.is_alive()
    (r,) = results
    starts = (out / "starts").read_text().split()
    if retries:  # the job ran again, whole, on a new worker
        assert r.label == "ok" and r.value == 2 and len(starts) == 2
    else:
        assert r.label == "crash" and "lost with its Ray worker" in r.error and len(starts) == 1
    assert gone(marker)  # the killed attempt's sandboxed job died with its worker


@pytest.mark.skipif(probe() is not Isolation.NAMESPACES, reason="this machine allows no namespaces")
def test_a_ray_job_is_sandboxed_on_its_node_with_the_controllers_hidden_paths(tmp_path):
    from evotrainer.sandbox import launch
    data = tmp_path / "data"
    (data / "keys").mkdir(parents=True)
    (data / "keys" / "run.key").write_text("s3cret")
    (data / "train.jsonl").write_text("train rows")
    os.chmod(data / "keys", 0o755)
    saved = set(launch._concealed)
    try:
        launch.conceal(data / "keys")  # in this process only: the Ray worker is another one
        who, tree = RayExecutor(cwd=HERE).run([Call(worker_targets.whoami),
                                               Call(worker_targets.read_tree, {"root": str(data)})], 60)
    finally:
        launch._concealed.clear()
        launch._concealed.update(saved)
    assert tree.ok and tree.value == {"train.jsonl": "train rows"}, tree.value
    assert who.ok and who.value["pid"] == 1  # PID 1 of its own namespace, on the Ray node
    assert who.value["uid"] not in (0, 65534) or os.geteuid() != 0  # as root, the job runs as a user of its own
    assert not any("KEY" in k or "TOKEN" in k or k.startswith("RAY_") for k in who.value["env"])


def test_an_interrupted_caller_takes_its_jobs_down():
    marker = f"evotrainer-ray-interrupted-{time.monotonic_ns()}"

    def poll():  # Ctrl-C once the job runs
        if processes_with(marker + "-child"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        RayExecutor(cwd=HERE).run([Call(worker_targets.spin_with_child, {"marker": marker})], 60, on_poll=poll)
    assert gone(marker + "-child") and eventually(lambda: ray_workers_running_a_job() == [])


def test_a_job_no_node_can_hold_is_refused_before_it_is_submitted():
    with pytest.raises(UsageError, match="no node can hold a job of 1 CPU, 4 GPU"):
        RayExecutor(num_gpus=4, cwd=HERE).run([Call(worker_targets.add, {"a": 1, "b": 1})], 60)


def lineage(run: Path) -> dict:
    """What a run recorded, without timings or scores: the trials and their outcomes, the
    events in order, the files it wrote."""
    from evotrainer.lineage import LineageStore
    store = LineageStore(run / "lineage.sqlite")
    try:
        trials = [(t.id, t.version, tuple(t.parents), t.label) for t in store.trials()]
        kinds = [e.KIND for e in store.events()]
    finally:
        store.close()
    files = {str(p.relative_to(run)) for p in run.rglob("*") if ".git" not in p.parts and "-wal" not in p.name
             and "-shm" not in p.name and not p.name.endswith(".lock")}
    # the segment cache's entries are named by keys that hold the runtime as the executor
    # knows it (a Ray job's device is resolved where it runs, not here): count them instead
    cache = {f for f in files if f.split("/")[0] == "cache"}
    entries = {kind: sum(1 for f in cache if f.count("/") == 3 and f.startswith(f"cache/{kind}/"))
               for kind in ("segments", "scores")}
    return {"trials": trials, "events": kinds, "files": files - cache, "cache": entries}


@pytest.mark.slow
def test_a_run_on_ray_records_the_same_lineage_as_on_the_local_pool(tmp_path, ckpt, capsys, monkeypatch):
    cfg_path, _ = tiny_run_config(readable(tmp_path), ckpt)
    raw = yaml.safe_load(cfg_path.read_text())
    raw["budget"]["trials"] = 1
    raw |= {"workers": 2, "search": raw["search"] | {"selection": "greedy"}}
    # the pool gives a job cores // workers threads, a Ray job num_cpus (1): the same on any machine,
    # so that both compute the same numbers and so take the same decisions
    import evotrainer.executors.pool as pool
    monkeypatch.setattr(pool, "usable_cores", lambda: 2)
    errors = []

    def local():  # beside the Ray run: neither keeps both cores busy all the time
        try:
            Controller(config_from_dict(raw | {"executor": "local"}).validate(), tmp_path / "local").run()
        except BaseException as e:
            errors.append(e)
    th = threading.Thread(target=local)
    th.start()
    cfg = tmp_path / "ray.yaml"
    cfg.write_text(yaml.safe_dump(raw | {"executor": "ray"}))
    assert main(["run", str(cfg), "--out", str(tmp_path / "ray"), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)  # stdout is our one JSON line, whatever Ray says
    assert status["state"] == "finished" and status["final"]["seeds"] == [100] and status["executor"] == "ray"
    th.join()
    assert not errors, errors
    on_ray, on_pool = lineage(tmp_path / "ray"), lineage(tmp_path / "local")
    assert on_ray == on_pool
    assert [t[1] for t in on_ray["trials"]] == ["v0", "v1"] and "final_finished" in on_ray["events"]
