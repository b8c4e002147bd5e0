"""A new user's first run: seconds from `evotrainer train --task T --steps 2` to its first RL step and to its end, from an empty cache.

    .venv/bin/python bench/first_step.py [--tasks arith codegen vault swe-mini rg:chain_sum rg:composite] [--out DIR]

Each task runs `evotrainer train --task T --steps 2` as the README shows it, in a cache
directory of its own that starts empty (so the default base is built, warm start included)
and with XDG_CACHE_HOME and XDG_DATA_HOME pointed at empty folders. The clock starts at the
command and stops when the first line of the run's metrics.jsonl (its first GRPO step)
appears, and again when the command exits (its 2 steps trained and its checkpoints
evaluated: a short `train` finished). Printed per task: the announcement said before SFT
started, each SFT stage's steps and seconds (from the cached bases' base_meta.json), the
time to the first RL step and the time to the finished command. Every spec form a user
writes for a built-in task is here: a task's name and a reasoning-gym family (`rg:NAME`)
or mixture (`rg:composite`).

humaneval is an evaluation set (no training stream: `train` needs `--model` and refuses
without one) and jsonl:PATH is the user's own rows, so neither is here.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EVOTRAINER = Path(sys.executable).with_name("evotrainer")
TASKS = ["arith", "codegen", "vault", "swe-mini", "rg:chain_sum", "rg:composite"]
TARGET_S = 300   # the most a short `train` should take a new user from an empty cache


def first_step(task: str, out: Path, limit_s: float) -> dict:
    """Run `train` for `task` from empty caches to its end; what it said, and when its first RL step came."""
    work = out / task.replace(":", "_")
    cache, xdg, run = work / "cache", work / "xdg", work / "run"
    for d in (cache, xdg / "cache", xdg / "data"):
        d.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg / "cache"), "XDG_DATA_HOME": str(xdg / "data"),
           "HF_HUB_OFFLINE": "1"}
    log = open(work / "stderr.log", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(EVOTRAINER), "train", "--task", task, "--steps", "2", "--cache-dir", str(cache),
                             "--out", str(run)], stdout=subprocess.DEVNULL, stderr=log, env=env,
                            start_new_session=True)
    first = finished = None
    metrics = run / "metrics.jsonl"
    while True:
        ended = proc.poll() is not None  # read before the metrics: a run that ended between polls is still seen
        if first is None and metrics.exists() and metrics.read_text().strip():
            first = time.perf_counter() - t0
        if ended or time.perf_counter() - t0 >= limit_s:
            break
        time.sleep(0.5)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    elif proc.returncode == 0:
        finished = time.perf_counter() - t0
    log.close()
    said = [line.strip() for line in (work / "stderr.log").read_text(errors="replace").splitlines()
            if line.startswith("Building the base")]
    stages = []
    for meta in sorted(cache.glob("base-*/base_meta.json"), key=lambda p: p.stat().st_mtime):
        m = json.loads(meta.read_text())
        stages.append({"level": m["target_level"], "warm_start": m["warm_start"], "steps": m["steps"],
                       "probe_acc": m["probe_acc"], "seconds": m["seconds"]})
    return {"task": task, "first_rl_step_s": None if first is None else round(first, 1),
            "finished_s": None if finished is None else round(finished, 1), "announced": said[:1],
            "stages": stages, "exit": proc.returncode}


def table(rows: list[dict]) -> str:
    lines = ["| task | base built (SFT stages: level, steps, probe accuracy, seconds) | to the first RL step "
             f"| to the end of `train --steps 2` (target {TARGET_S} s) |", "|---|---|---|---|"]
    for r in rows:
        stages = "; ".join(f"level {s['level']}{' from ' + str(s['warm_start']) if s['warm_start'] else ''}: "
                           f"{s['steps']} steps, {s['probe_acc']:.0%}, {s['seconds']:.0f} s" for s in r["stages"])
        first = "did not start" if r["first_rl_step_s"] is None else f"{r['first_rl_step_s']:.0f} s"
        end = (f"did not finish (exit {r['exit']})" if r["finished_s"] is None else
               f"{r['finished_s']:.0f} s" + (" (over)" if r["finished_s"] > TARGET_S else ""))
        lines.append(f"| {r['task']} | {stages or '-'} | {first} | {end} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=TASKS)
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a fresh temporary one)")
    ap.add_argument("--limit", type=float, default=1800, help="seconds a task's `train` may take before it is stopped")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="first-step-"))
    rows = []
    for task in args.tasks:
        rows.append(first_step(task, out, args.limit))
        r = rows[-1]
        print(f"{task}: first RL step after {r['first_rl_step_s']} s, finished after {r['finished_s']} s; said before SFT: "
              f"{r['announced'][0] if r['announced'] else '(nothing)'}", flush=True)
    (out / "first_step.json").write_text(json.dumps(rows, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
