"""Hostile harness edits, proposed through the real loop by a command agent, that pass the
static check: each reaches a shell through `torch.utils.collect_env.run` (torch itself is
allowed, and this function runs any command), or attacks from Python directly. Each one
must fail inside the sandbox: the trial ends with a label, nothing outside changes, and no
process survives. The slot raises when its attack did not work, so a trial that trains
normally would mean the attack succeeded.

An attack in the reward slot meets the backtest's worker first (a rescore runs the
reward); one in the curriculum slot, which only training runs, meets the training worker
(the one that holds the policy and writes checkpoints). One run covers both. An attack that
works inside the sandbox, a link planted in the job's own checkpoint, fails when the job
ends: its output is refused, and the trial is a bad_output that says why."""
import json
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest
import yaml

from evotrainer.harness.legality import check_harness
from evotrainer.sandbox import Isolation, probe
from helpers import processes_with

pytestmark = [pytest.mark.skipif(probe() is not Isolation.NAMESPACES, reason="needs namespaces"),
              pytest.mark.slow]  # through the loop

IMPORTS = "import torch\nfrom torch.utils.collect_env import run as sh\n\n\n"
SLOTS = {  # slot -> (its file, the function's first line, its last)
    "reward": ("reward.py", "def hostile(x):\n", "    return x.scores.float()\n"),
    "curriculum": ("curriculum.py", "def hostile(s):\n", "    return {s.target_level: 1.0}\n"),
}


def attacks(port: int, outside: str, run: str, marker: str, keys: str) -> dict[str, tuple[str, str]]:
    """name -> (slot, the body of a slot function that attacks and raises if it failed)."""
    def shell(cmd: str, check: str = "rc == 0") -> str:
        return f"    rc, out, err = sh({cmd!r})\n    assert {check}, 'attack failed: ' + err[-200:]\n"
    return {
        "loopback": ("reward", shell(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"")),
        "secret": ("curriculum", shell("printenv EVOTRAINER_HOSTILE_SECRET", "out.strip() == 'hunter2'")),
        "write_outside": ("curriculum", shell(f"echo pwned > {outside}")),
        "write_run_dir": ("reward", shell(f"echo pwned > {run}/pwned && echo x >> {run}/lineage.sqlite")),
        "setsid_daemon": ("curriculum", f"    sh({f'setsid sleep 600 {marker} > /dev/null 2>&1 < /dev/null &'!r})\n"),
        "allocate_30gb": ("reward", "    blob = bytearray(30 * 2 ** 30)\n    assert len(blob) == 0, 'attack failed'\n"),
        "loop_forever": ("curriculum", "    while True:\n        pass\n"),
        # the held-out split is keyed by a secret: without the key file the project's own task
        # code computes a public split that is not the run's (checked after the run)
        "held_out_split": ("curriculum", shell(f"cat {keys}/*.key", "rc == 0 and out.strip()")),
        # a link in its own checkpoint (the only place it can write) to the keys, for whoever
        # reads it next: this works, and the job's output is refused when it ends
        "plant_link": ("curriculum", shell(f"for d in {run}/versions/*/seed-0; do mkdir -p $d/checkpoint && "
                                           f"ln -sf {keys} $d/checkpoint/keys; done 2>/dev/null; true")),
    }


def source(slot: str, body: str) -> str:
    _, first, last = SLOTS[slot]
    return IMPORTS + first + body + last


AGENT = """
import json, pathlib, sys
attacks = json.loads(pathlib.Path({attacks!r}).read_text())
counter = pathlib.Path({counter!r})
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
name, (slot, file, text) = list(attacks.items())[n % len(attacks)]
pathlib.Path(file).write_text(text)
k = pathlib.Path("knobs.yaml")
k.write_text("\\n".join(l for l in k.read_text().splitlines() if not l.startswith(slot + ":")) + f"\\n{{slot}}: hostile\\n")
pathlib.Path(sys.argv[1]).write_text(json.dumps({{"name": name, "hypothesis": "changing the " + slot + " raises accuracy",
    "expected_effect": "more", "success_criterion": "val beats control", "rollback": "revert"}}))
"""


def through_the_loop(cfg: Path, run: Path, tmp_path: Path, corpus: dict[str, tuple[str, str]], **settings):
    """Each edit of `corpus` (name -> (slot, body)) checked to pass the static check, then
    proposed in turn by a command agent in a run of one trial each: (the config, the trials by name)."""
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller
    for name, (slot, body) in corpus.items():  # every edit passes the static check: the sandbox must hold
        h = tmp_path / "check" / name
        h.mkdir(parents=True)
        (h / SLOTS[slot][0]).write_text(source(slot, body))
        (h / "knobs.yaml").write_text(f"{slot}: hostile\n")
        assert check_harness(h).legal, (name, check_harness(h).reasons)
    (tmp_path / "attacks.json").write_text(json.dumps(
        {name: (slot, SLOTS[slot][0], source(slot, body)) for name, (slot, body) in corpus.items()}))
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT.format(attacks=str(tmp_path / "attacks.json"), counter=str(tmp_path / "n")))
    raw = yaml.safe_load(cfg.read_text())
    raw |= {"agent": "command", "command": {"run": f"{sys.executable} {agent} {{proposal}}", "timeout_s": 60},
            "final_seeds": [], "sandbox": "namespaces"} | settings
    raw["budget"] |= {"trials": len(corpus), "trial_timeout_s": 25}  # what the loop costs; room for a slow CI
    config = config_from_dict(raw).validate()
    ctl = Controller(config, run)
    try:
        ctl.run()
        trials = {t.intervention: t for t in ctl.store.trials() if t.id > 0}
    finally:
        ctl.store.close()
    assert set(trials) == set(corpus)
    return config, trials


def test_hostile_edits_through_the_loop_fail_inside_the_sandbox(tiny_run, tmp_path, monkeypatch):
    from evotrainer.catalog import get_task
    from evotrainer.evolve.status import status
    from evotrainer.lineage import LineageStore
    from evotrainer.tasks.keys import key_dir, split_key
    cfg, run = tiny_run
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    outside = tmp_path / "outside" / "pwned.txt"
    outside.parent.mkdir()
    marker = f"9{time.monotonic_ns() % 10**8}"  # `sleep 600 MARKER`: a daemon the test can find
    corpus = attacks(server.getsockname()[1], str(outside), str(run.resolve()), marker, str(key_dir()))
    monkeypatch.setenv("EVOTRAINER_HOSTILE_SECRET", "hunter2")
    _, trials = through_the_loop(cfg, run, tmp_path, corpus, worker_memory_mb=2000)
    for name, t in trials.items():
        slot = corpus[name][0]
        if name != "setsid_daemon":  # the daemon "works" until its job ends; the others must fail
            assert t.label in ({"bad_output"} if name == "plant_link" else {"crash", "timeout", "oom"}), \
                (name, t.label, t.reflection)
            # a reward attack failed in the backtest's worker, a curriculum attack in training's
            assert t.backtest["label"] == (t.label if slot == "reward" else "passed"), (name, t.backtest)
        if t.label in ("crash", "bad_output"):  # it failed because the attack did (or its output was refused)
            why = "its output was refused: " if name == "plant_link" else "attack failed"
            assert why in t.reflection, (name, t.reflection)
    assert trials["loop_forever"].label == "timeout" and trials["allocate_30gb"].label in ("oom", "crash")
    with pytest.raises(socket.timeout):
        server.accept()  # nothing ever connected
    server.close()
    assert not outside.exists() and not (run / "pwned").exists()
    assert processes_with(f"sleep 600 {marker}") == []
    # the run's own records are whole: every trial recorded once, nothing pending
    store = LineageStore(run / "lineage.sqlite")
    assert store.pending() == [] and len(store.trials()) == len(corpus) + 1
    store.close()
    assert status(run)["sandbox"].startswith("namespaces")  # the level in force, as status shows it
    # the split computed with the project's code and no key is not the run's
    from evotrainer.lineage.events import RunStarted
    started = LineageStore(run / "lineage.sqlite").events(RunStarted)[0]
    public, keyed = get_task("arith", 3), get_task("arith", 3)
    keyed.use_key(split_key(started.split_key))
    val = {p.id for p in keyed.split("val")}
    assert len(val & {p.id for p in public.split("val")}) < len(val) / 2


# ------------------------------------------------------------------ what a job leaves behind
# The sandbox holds; what a job writes in its own directory does not stay there: the controller
# (root here) writes its log, reads the records, lists the checkpoints and hands them to the
# evaluator. Each attack below works inside the job (it only touches its own output) and the
# slot then returns normally, so the job "succeeds": what it left must be refused with a
# label (bad_output), or ignored, and never written through, followed or scored.

def output_attacks(run: str, target: str) -> dict[str, str]:
    """name -> the curriculum body: a shell line over the job's own seed directories (the
    writable ones among those its root shows), then a return (or a raise, where the attack
    needs a failed job)."""
    def each(cmd: str) -> str:
        line = f"for d in {run}/versions/*/seed-*; do [ -w $d ] || continue; {cmd}; done; true"
        return f"    sh({line!r})\n"
    return {
        # a failed job's log is written by the controller: once into OUT/worker.log, through this link
        "log_link": each(f"ln -sfn {target} $d/worker.log") + "    print('PLANTED-IN-LOG')\n"
                                                               "    raise RuntimeError('the job fails, its log is kept')\n",
        # a FIFO where the progress poll and the vetting read: neither may block
        "fifo_metrics": each("[ -p $d/metrics.jsonl ] || { rm -f $d/metrics.jsonl; mkfifo $d/metrics.jsonl; }"),
        # a chat template that raises beside the weights: the evaluator must not render it
        "chat_template": each("for c in $d/checkpoint $d/checkpoints/step-1; do mkdir -p $c; "
                              "printf '{{ raise_exception(\"planted\") }}' > $c/chat_template.jinja; done"),
        "deleted_checkpoints": each("rm -rf $d/checkpoints"),
        "extra_checkpoint": each("mkdir -p $d/checkpoints/step-x"),
        "malformed_evidence": each("echo '{' >> $d/evidence.jsonl"),
    }


def test_what_a_job_leaves_is_refused_or_ignored_and_the_run_goes_on(tiny_run, tmp_path):
    from evotrainer.evaluate.greedy import evaluate_checkpoints
    from evotrainer.evolve.controller import Controller
    from evotrainer.lineage import LineageStore
    from evotrainer.lineage.events import RunStarted
    from evotrainer.tasks.keys import split_key
    cfg, run = tiny_run
    target = tmp_path / "outside" / "lineage-of-another-run.sqlite"
    target.parent.mkdir()
    target.write_text("original\n")
    corpus = {name: ("curriculum", body) for name, body in output_attacks(str(run.resolve()), str(target)).items()}
    config, trials = through_the_loop(cfg, run, tmp_path, corpus)
    assert target.read_text() == "original\n"  # the log link: nothing written through it
    log_link = trials["log_link"]
    assert log_link.label == "crash" and "the job fails" in log_link.reflection
    kept_logs = list(run.glob("versions/*/seed-0.log"))
    assert any("PLANTED-IN-LOG" in p.read_text() for p in kept_logs)  # kept beside the job's directory
    refused = {"fifo_metrics": "not a regular file", "deleted_checkpoints": "where the run's schedule",
               "extra_checkpoint": "step-x", "malformed_evidence": "evidence.jsonl"}
    for name, why in refused.items():
        assert trials[name].label == "bad_output" and why in trials[name].reflection, (name, trials[name])
    # the template was ignored: the trial was judged, and its test score is what its weights score
    # with the base's tokenizer (a clean copy: the checkpoint without the planted file)
    t = trials["chat_template"]
    assert t.label in ("kept", "discarded"), (t.label, t.reflection)
    ckpt = Path(next(iter(t.fitness.dirs.values()))) / "checkpoint"
    assert (ckpt / "chat_template.jinja").is_file()
    clean = tmp_path / "clean"
    shutil.copytree(ckpt, clean, ignore=shutil.ignore_patterns("chat_template.jinja"))
    store = LineageStore(run / "lineage.sqlite")
    started = store.events(RunStarted)[0]
    store.close()
    policy = config.runtime().on_base(config.model).policy.to_dict()
    key = split_key(started.split_key).hex()
    again = evaluate_checkpoints("arith", 1, {str(clean): ["test"], str(ckpt): ["test"]}, policy=policy, key=key)
    assert again[str(clean)]["test"] == again[str(ckpt)]["test"] == next(iter(t.fitness.test.values()))
    # the run is whole and resumes: nothing left to do, nothing fails
    ctl = Controller(config, run)
    try:
        ctl.run()
        assert len(ctl.store.trials()) == len(corpus) + 1 and ctl.store.pending() == []
    finally:
        ctl.store.close()
