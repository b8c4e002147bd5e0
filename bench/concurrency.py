"""Trials in flight: throughput and search quality at search.concurrency N = 1, 2, 4.

The same search (a config's task, base, trial budget and seeds; the rules agent, population
selection) runs once per N on the local pool, every job with one torch thread (the pool's
`workers` = this machine's cores, shared by the trials in flight), and once at N = 2 on a
local Ray cluster of the same cores. Each run reports:

    trials/hour    trials finished per hour of the search's wall clock (the root's training
                   included, the base's build not: it is built or read from the cache first)
    utilisation    the machine's busy CPU seconds over (wall clock x cores) while the search
                   ran: how busy trials in flight keep it (one trial at a time leaves cores idle
                   while it proposes, backtests, scores and waits on its slowest seed). Counted
                   machine-wide (psutil), because the workers are no children this process
                   waits for (the fork server starts them; Ray's are the cluster's): run the
                   bench alone, as anything else running counts too
    overlap        pairs of trials that ran beside each other (from the lineage's start/end)

Then search quality: every winner replayed from the base on fresh seeds beside the reference
recipe (bench/search_efficiency.py's replay; identical winners once), with the gain's 95% t
interval over those seeds. Parallelism must not cost search quality beyond that noise.

    .venv/bin/python bench/concurrency.py                          # the quickstart, 4 trials, N = 1 2 4 + ray
    .venv/bin/python bench/concurrency.py --config configs/quickstart.yaml --trials 6 --no-ray

A finished run under --out is read back, not redone (delete its directory to measure again).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")  # nothing here downloads

from evotrainer.catalog import get_task  # noqa: E402
from evotrainer.config import config_from_dict  # noqa: E402
from evotrainer.evolve import setup  # noqa: E402
from evotrainer.evolve.controller import Controller  # noqa: E402
from evotrainer.evolve.segments.retrain import Arm  # noqa: E402
from evotrainer.lineage import TrialRecord  # noqa: E402
from evotrainer.report.gather import gather  # noqa: E402
from evotrainer.report.timeline import overlaps  # noqa: E402
from search_efficiency import _ci, arm_key, replays  # noqa: E402

FRESH = 300


def busy_cpu_seconds() -> float:
    """The machine's CPU seconds spent running anything, summed over its cores (idle, I/O wait
    and a hypervisor's steal are not; Linux counts guest time inside user and nice already)."""
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))


def search(raw: dict, n: int, executor: str, out: Path) -> dict:
    """One search at concurrency `n` (or its record, if it finished before)."""
    name = f"n{n}-{executor}"
    run, done = out / name, out / name / "bench.json"
    if done.exists():
        return json.loads(done.read_text())
    raw = copy.deepcopy(raw)
    raw["search"] = {**raw.get("search", {}), "concurrency": n, "skills": None}
    raw["final_seeds"] = []  # replayed below, every winner on the same fresh seeds
    raw["cache"] = "off"      # every arm trains what it runs: throughput is the point
    raw["executor"] = executor
    if executor == "ray":
        raw["ray"] = {"address": "local", "num_cpus": 1}
    cfg = config_from_dict(raw).validate()
    setup.base_checkpoint(cfg, get_task(cfg.task, cfg.level), None, lambda event: None)  # built (or cached) untimed
    cores = os.cpu_count() or 1
    cpu0, t0 = busy_cpu_seconds(), time.time()
    ctl = Controller(cfg, run, on_event=lambda e: isinstance(e, TrialRecord) and print(
        f"    {name} trial {e.id}: {e.intervention} {e.label}", flush=True))
    ctl.run()
    wall, cpu = time.time() - t0, busy_cpu_seconds() - cpu0
    label, _, arm = ctl.winner_schedule()
    data = gather(run)
    trials = [v for v in data.versions if v.trial > 0]
    rec = {"n": n, "executor": executor, "wall_s": round(wall, 1), "trials": len(trials),
           "trials_per_hour": round(3600 * len(trials) / wall, 2),
           "utilisation": round(cpu / (wall * cores), 3),
           "overlaps": overlaps(data.versions), "winner": label, "harnesses": list(arm.harnesses),
           "steps": arm.steps, "base": ctl.base,
           "trials_run": [(v.trial, v.intervention, v.label, v.surface) for v in trials]}
    done.write_text(json.dumps(rec, indent=2))
    return rec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "quickstart.yaml")
    p.add_argument("--trials", type=int, default=4, help="the search's trial budget at every N")
    p.add_argument("--n", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--no-ray", action="store_true", help="skip the local Ray cluster's run")
    p.add_argument("--seeds", type=int, default=5, help="fresh seeds every winner is replayed on")
    p.add_argument("--out", type=Path, default=ROOT / "bench-runs" / "concurrency")
    args = p.parse_args()
    import transformers
    transformers.logging.disable_progress_bar()
    raw = yaml.safe_load(args.config.read_text())
    raw["budget"] = {**raw.get("budget", {}), "trials": args.trials}
    raw["workers"] = 0  # one per core, shared by the trials in flight: one torch thread per job
    runs = [search(raw, n, "local", args.out) for n in args.n]
    if not args.no_ray:
        runs.append(search(raw, 2, "ray", args.out))
    cfg = config_from_dict({**raw, "final_seeds": []}).validate()
    seeds = list(range(FRESH, FRESH + args.seeds))
    root = args.out / f"n{runs[0]['n']}-{runs[0]['executor']}" / "harnesses" / "v0"  # the config's own recipe
    reference = Arm((str(root),), cfg.budget.total_steps)
    arms = {"reference": reference}
    for r in runs:
        r["arm"] = arm_key(r["harnesses"], r["steps"])
        arms.setdefault(r["arm"], Arm(tuple(r["harnesses"]), r["steps"]))
    scores = replays(cfg, arms, runs[0]["base"], seeds, args.out)
    ref = [scores["reference"][s]["test"] for s in seeds]
    lines = ["# Trials in flight", "", f"`{args.config.name}`, {args.trials} trials, {os.cpu_count()} cores; "
             f"winners replayed on seeds {seeds[0]}-{seeds[-1]} (test %, gain over the reference, 95% t interval)", "",
             "| N | executor | wall s | trials/hour | utilisation | overlapping pairs | winner | gain |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        test = [scores[r["arm"]][s]["test"] for s in seeds]
        util = "n/a" if r["utilisation"] is None else f"{100 * r['utilisation']:.0f}%"
        lines.append(f"| {r['n']} | {r['executor']} | {r['wall_s']:.0f} | {r['trials_per_hour']:.1f} | {util} "
                     f"| {len(r['overlaps'])} | {r['winner']} ({100 * statistics.fmean(test):.1f}%) "
                     f"| {_ci([[a - b for a, b in zip(test, ref)]])} |")
    report = "\n".join(lines) + "\n"
    (args.out / "report.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
