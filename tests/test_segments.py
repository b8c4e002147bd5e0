"""The segment pipeline (evolve/segments/pipeline.py): the search's segments and a retrained schedule go
through one pipeline, and what it hands the segment cache is what the two pipelines it replaced
(Training.train with its _key, and retrain with chain_keys) handed it, field for field: entries
and scores stored by the old code, under the same package source, are found again.

The expected values below were computed by the old code on these same inputs. Nothing trains:
the executor answers ok without running anything, the vetting and the cache's store are stubbed
and every score is made up; what is checked is what the jobs are and what they are keyed and
scored by."""
import dataclasses

import pytest

from evotrainer.catalog import get_task
from evotrainer.config import EvalConfig, config_from_dict
from evotrainer.evolve.segments import pipeline
from evotrainer.evolve.segments.cache import SegmentCache, numbers, segment_key
from evotrainer.evolve.segments.retrain import Arm, retrain
from evotrainer.evolve.segments.state import EXTRA_PAIR_DATA, Clock, Segment, State
from evotrainer.evolve.segments.training import Training
from evotrainer.executors import Executor, WorkerResult
from evotrainer.runtime import Runtime

BASE = "files:ffa1946bc2a2ca27a452be25278993f7e66b2d237231e76fee6fa12d0b09b275"
H1 = "d8d31f7b7ba00234e7f669057ad07b5ef5f35f7f3081f01d7e55c9b846579ebd"
H2 = "be6865cb5c00d11a27fe63841e7898ba29ccdc3729a4c54ba868843b7ef59bc5"
SAME = {"task": '["arith", []]', "level": 1, "eval_every": 1}
# (start, harness, segment seed, replica, steps, draws digest) per segment, as the old code keyed them
SEARCH = [
    (BASE, H1, 1, 1, 2, "0ba8661b41293e028a4ad48612c4e8e175b5079ef9ea7b59780ddbe6ea64bf54"),
    (BASE, H1, 1001, 1, 2, "948e2b7f1e0f47583b1839be21907c1a1fd69195b434613144bad008d6d1a01c"),
    ("segment:parentkey0", H2, 703, 0, 2, "4b3914b112c2bcc9056bfd9a035bff523d3ec1cd6bd0d0a06616616b17a64634"),
    ("files:e04de7b1e186a799150a7c8da6e13e36ddd70b119922fb84d3078800a362d912", H2, 1703, 0, 2,
     "c3a415d84b6c43c704e8d4cf0a874b12865d19a3643cee28750a3fe821d1d6fb"),
]
CHAINED = "the key of the segment before"
RETRAIN = [
    (BASE, H1, 100001, 0, 2, "aa81397d388ba72ee8432584a91220176029e5552a09fb27d09c6784eba2ec91"),
    (CHAINED, H2, 100002, 0, 2, "bbba12c8d9f864410b591c00bee22aebe5385cd5a84b050e6c9408f910cb90ea"),
    (BASE, H1, 100001, 0, 4, "2c3d566edbe302c69ae787477e14657a77d7d9517cf6b0415536591662612c0a"),
]


class Answering(Executor):
    """Every call answered ok, nothing run; a batch of n has 10 + n threads a job."""

    def __init__(self):
        self.calls = []

    def run(self, calls, timeout_s, memory_mb=8192, on_poll=None):
        self.calls += [(c, timeout_s) for c in calls]
        return [WorkerResult("ok", value={}) for _ in calls]

    def threads(self, batch):
        return 10 + batch


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A base, two harnesses and two parents (one holding a cache entry), and the spies: the
    inputs each segment is keyed by, the checkpoints asked of the evaluator, and their score inputs."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "model.safetensors").write_bytes(b"base weights")
    (tmp_path / "base" / "config.json").write_text('{"model_type": "tiny"}\n')
    for h, t in (("h1", 0.7), ("h2", 0.9)):
        (tmp_path / h).mkdir()
        (tmp_path / h / "knobs.yaml").write_text(f"prompts_per_step: 2\ngroup_size: 2\ntemperature: {t}\n")
    for seed, weights in ((0, b"parent weights"), (1, b"parent weights, seed 1")):
        (tmp_path / "run" / "versions" / "v1" / f"seed-{seed}" / "checkpoint").mkdir(parents=True)
        (tmp_path / "run" / "versions" / "v1" / f"seed-{seed}" / "checkpoint" / "model.safetensors").write_bytes(weights)
    (tmp_path / "run" / "versions" / "v1" / "seed-0" / "segment.key").write_text("parentkey0\n")
    seen = {"inputs": [], "asked": None, "score": None}

    def keyed(inputs):
        seen["inputs"].append(inputs)
        return segment_key(inputs)

    def scored(cache, jobs, identity, inputs, evaluate):
        seen["asked"], seen["score"] = jobs, inputs("segment:KEY/checkpoint", "val")
        return {c: {s: 0.5 for s in splits} for c, splits in jobs.items()}
    monkeypatch.setattr(pipeline, "segment_key", keyed)
    monkeypatch.setattr(pipeline, "cached_scores", scored)
    monkeypatch.setattr(pipeline, "refused", lambda *a, **k: None)
    monkeypatch.setattr(SegmentCache, "store", lambda self, key, out: None)
    monkeypatch.setattr(SegmentCache, "materialise", lambda self, key, out: False)
    monkeypatch.setattr("evotrainer.evolve.segments.training.checkpoint_size", lambda path: {})
    monkeypatch.setattr("evotrainer.evolve.segments.training.read_run_meta", lambda path: {})
    return tmp_path, seen


def _check_inputs(seen, expected, threads: int, runtime: Runtime):
    got = seen["inputs"]
    assert len(got) == len(expected)
    for i, (inputs, (start, harness, seed, replica, steps, draws)) in enumerate(zip(got, expected)):
        start = f"segment:{segment_key(got[i - 1])}" if start == CHAINED else start
        assert {k: v for k, v in dataclasses.asdict(inputs).items() if k != "code"} == dict(
            start=start, harness=harness, seed=seed, replica=replica, steps=steps, draws=draws,
            runtime=numbers(runtime, False, threads), **SAME)
    assert {k: v for k, v in dataclasses.asdict(seen["score"]).items() if k != "code"} == dict(
        checkpoint="segment:KEY/checkpoint", split="val", task=SAME["task"], level=1, split_key="public",
        runtime=numbers(runtime, False, 11))


def test_a_search_batch_is_keyed_called_and_scored_as_before(world):
    root, seen = world
    cfg = config_from_dict({"task": "arith", "level": 1, "seeds": [0, 1], "final_seeds": [],
                            "budget": {"steps_per_segment": 2, "total_steps": 6, "trial_timeout_s": 120},
                            "evaluation": {"every": 1, "last_k": 2}}).validate()
    jobs = Answering()
    training = Training(cfg=cfg, task=get_task("arith", 1), runtime=Runtime(), base=str(root / "base"),
                        run_dir=root / "run", harness_dir=lambda v: root / ("h1" if v == "v0" else "h2"),
                        executor=jobs, cache=SegmentCache(root / "cache"))
    parent = State("v1", 1, {s: str(root / "run" / "versions" / "v1" / f"seed-{s}") for s in (0, 1)}, {}, {})
    clock = Clock()
    states = training.train([Segment("v0", State("v0", 0, {}, {}, {}), 1, root / "run" / "replicas" / "replica-1",
                                     replica=1),
                             Segment("v2", parent, 2, root / "run" / "versions" / "v2", data_offset=EXTRA_PAIR_DATA + 1)],
                            clock)
    _check_inputs(seen, SEARCH, 14, Runtime())
    # one segment per job, in its seed's directory itself: the old train_segment calls, argument for argument
    outs = [root / "run" / "replicas" / "replica-1" / f"seed-{s}" for s in (0, 1)] + \
        [root / "run" / "versions" / "v2" / f"seed-{s}" for s in (0, 1)]
    starts = [str(root / "base")] * 2 + [str(root / "run" / "versions" / "v1" / f"seed-{s}" / "checkpoint") for s in (0, 1)]
    for (call, timeout), out, start, (_, _, seed, replica, *_), h in zip(jobs.calls, outs, starts, SEARCH,
                                                                       ["h1", "h1", "h2", "h2"]):
        assert call.target.__name__ == "train_segment" and timeout == 120 and call.clean
        assert call.writes == (str(out),) and set(call.reads) == {str(root / h), start}
        assert {k: v for k, v in call.kwargs.items() if k not in ("draws", "runtime")} == dict(
            task="arith", level=1, harness=str(root / h), base=start, out=str(out), seed=seed, steps=2, eval_every=1,
            replica=replica)
        assert call.kwargs["runtime"] == Runtime().to_dict()
    # validation over the last 2 checkpoints, test the final one's
    assert seen["asked"] == {str(c): s for out in outs for c, s in (
        (out / "checkpoints" / "step-1", ["val"]), (out / "checkpoint", ["val", "test"]))}
    assert [(s.val, s.test) for s in states] == [({0: 0.5, 1: 0.5}, {0: 0.5, 1: 0.5})] * 2
    assert (clock.trained, clock.reused, clock.steps) == (4, 0, 8)


def test_a_retrained_schedule_is_keyed_called_and_scored_as_before(world):
    root, seen = world
    jobs = Answering()
    arms = {"evolved": Arm((str(root / "h1"), str(root / "h2")), 2), "reference": Arm((str(root / "h1"),), 4)}
    rep = retrain(get_task("arith", 1), str(root / "base"), arms, [100], root / "final",
                  evaluation=EvalConfig(every=1, last_k=2), timeout_s=120, executor=jobs,
                  cache=SegmentCache(root / "cache"))
    runtime = Runtime().on_base(str(root / "base"))
    _check_inputs(seen, RETRAIN, 12, runtime)
    # a schedule per job, its segments in OUT/segment-D, each segment's seed the one the old worker derived
    (evolved, t1), (reference, t2) = jobs.calls
    assert (t1, t2) == (240, 240)  # each segment's timeout, times the longest schedule's segments
    for call, arm, seeds in ((evolved, "evolved", [100001, 100002]), (reference, "reference", [100001])):
        out = root / "final" / arm / "seed-100"
        assert call.target.__name__ == "train_schedule" and call.writes == (str(out),) and call.clean
        assert set(call.reads) == {str(root / "base"), *arms[arm].harnesses}
        assert {k: v for k, v in call.kwargs.items() if k not in ("draws", "runtime")} == dict(
            task="arith", level=1, harnesses=list(arms[arm].harnesses), base=str(root / "base"), out=str(out),
            seeds=seeds, steps=arms[arm].steps, eval_every=1, replica=0)
        assert call.kwargs["runtime"] == runtime.to_dict()
    # the base, and the last 2 checkpoints of each schedule's last segment, on both splits
    last = [root / "final" / "evolved" / "seed-100" / "segment-2", root / "final" / "reference" / "seed-100" / "segment-1"]
    assert seen["asked"] == {str(root / "base"): ["val", "test"]} | {
        str(c): ["val", "test"] for d, step in zip(last, (1, 3)) for c in (d / "checkpoints" / f"step-{step}",
                                                                          d / "checkpoint")}
    assert rep.scores == {"evolved": {100: {"val": 0.5, "test": 0.5}}, "reference": {100: {"val": 0.5, "test": 0.5}}}
    assert (rep.trained, rep.reused, rep.base) == (3, 0, {"val": 0.5, "test": 0.5})
