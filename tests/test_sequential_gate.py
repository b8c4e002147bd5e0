"""The sequential gate in the loop: a child the gate calls promising trains an extra seed pair
(child and control on new problems) before it is decided, and the record says so."""
import json

import pytest
import yaml

from evotrainer.config import load_config
from evotrainer.evolve import trial as trial_module
from evotrainer.evolve.controller import Controller
from evotrainer.evolve.stats.gate import GateDecision, gate
from evotrainer.lineage import LineageStore
from evotrainer.lineage.events import PairControlFinished

pytestmark = pytest.mark.slow  # a Controller loop


def test_a_promising_child_trains_an_extra_pair_and_is_decided_on_it(tiny_run, monkeypatch):
    cfg_path, run = tiny_run
    raw = yaml.safe_load(cfg_path.read_text())
    raw["promotion"] = {"replicas": 1, "extra_pairs": 1}
    raw["budget"]["trials"] = 1
    raw["final_seeds"] = []
    cfg_path.write_text(yaml.safe_dump(raw))
    looks = []

    def first_look_is_promising(child, control, blocking=(), unbacked=(), cfg=None, null=(), extra=()):
        looks.append(list(extra))
        if not extra:  # whatever the tiny run scored: the plumbing of `more` is what is tested
            return GateDecision(None, 0.1, 0.05, 0.2, "more", ("promising: one more seed pair",))
        return gate(child, control, blocking, unbacked=unbacked, cfg=cfg, null=null, extra=extra)
    monkeypatch.setattr(trial_module, "gate", first_look_is_promising)
    Controller(load_config(cfg_path), run).run()

    store = LineageStore(run / "lineage.sqlite")
    try:
        (t,) = [t for t in store.trials() if t.parents]
        pair_events = store.events(PairControlFinished)
    finally:
        store.close()
    assert len(looks) == 2 and looks[0] == [] and len(looks[1]) == 1
    assert t.label in ("kept", "discarded") and t.fitness.decision.rule in ("keep", "discard")
    (child_val, control_val), = t.fitness.decision.extra_pairs
    assert looks[1] == [(child_val, control_val)]
    # the pair trained both arms from the run's seed 0 on problems of their own (data offset)
    assert [(e.version, e.pair, e.val) for e in pair_events] == [("v0", 1, control_val)]
    child_run = json.loads((run / "pairs" / f"{t.version}-p1" / "seed-0" / "run.json").read_text())
    control_run = json.loads((run / "pairs" / f"v0-d{t.depth}-p1" / "seed-0" / "run.json").read_text())
    main_run = json.loads((run / "versions" / t.version / "seed-0" / "run.json").read_text())
    assert child_run["seed"] == control_run["seed"] != main_run["seed"]
    assert "2 paired seeds" in t.reflection and "look 2 of 2" in t.reflection
