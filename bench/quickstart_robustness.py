"""The main job on five independently built bases: does its result hold on any machine?

Float results differ between CPUs (instruction sets, thread counts), so a base built on
another machine is another base. This bench builds the quickstart's base with seeds 0-4
(initialisation and data order, as five fresh machines would differ) and runs the whole
main job on each: its own search (with an empty skill library of its own) and its own
final comparison on fresh seeds. It prints, per base, the base's accuracy and SFT steps,
what the search kept, and evolved minus reference on validation and test with 95% CIs.

    .venv/bin/python bench/quickstart_robustness.py                  # bases 0-4, ~1 hour on 2 cores
    .venv/bin/python bench/quickstart_robustness.py --bases 3 4      # some of them

A base seed's run directory that already finished (bench-runs/robustness/base-S) is read
back, not redone; delete it to measure again. Bases are cached in ~/.cache/evotrainer.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")  # nothing here downloads

from evotrainer.config import config_from_dict  # noqa: E402
from evotrainer.evolve.controller import Controller  # noqa: E402
from evotrainer.evolve.status import status  # noqa: E402
from evotrainer.lineage import LineageStore, TrialRecord  # noqa: E402
from evotrainer.lineage.events import FinalStarted, RunStarted  # noqa: E402
from evotrainer.trainer.pretrain import PretrainFailed  # noqa: E402


def run_on_base(config: Path, base_seed: int, out: Path) -> dict:
    raw = yaml.safe_load(config.read_text())
    raw.setdefault("base", {})["seed"] = base_seed
    run = out / f"base-{base_seed}"
    raw.setdefault("search", {})["skills"] = str(run / "skills.sqlite")  # a fresh machine's empty library
    cfg = config_from_dict(raw).validate()
    t = time.time()
    try:
        Controller(cfg, run, on_event=lambda e: isinstance(e, (TrialRecord, FinalStarted)) and print(
            f"  base {base_seed}: " + (f"trial {e.id} {e.intervention} {e.label}" if isinstance(e, TrialRecord)
                                       else f"final comparison, winner {e.winner}"), flush=True)).run()
    except PretrainFailed as e:  # this machine would have no base: a row of its own, not the end of the bench
        print(f"  base {base_seed}: no base: {e}", flush=True)
        return {"base_seed": base_seed, "run": str(run), "failed": str(e), "seconds": round(time.time() - t)}
    store = LineageStore(run / "lineage.sqlite")
    try:
        trials, started = store.trials(), store.events(RunStarted)[0]
    finally:
        store.close()
    meta = json.loads((Path(started.base) / "base_meta.json").read_text())
    final = json.loads((run / "final.json").read_text())
    return {"base_seed": base_seed, "run": str(run), "sft_steps": meta["steps"], "probe": meta["probe_acc"],
            "kept": [t.intervention for t in trials if t.parents and t.label == "kept"],
            "labels": [f"{t.intervention}:{t.label}" for t in trials if t.parents],
            "overhead": status(run)["framework_overhead"], "seconds": round(time.time() - t), **final}


def held(r: dict) -> bool:
    return "failed" not in r and bool(r["kept"]) and r["comparison"]["test"]["difference"]["ci"][0] > 0


def row(r: dict) -> str:
    if "failed" in r:
        return f"{r['base_seed']:>4}  no base: {r['failed'][:150]}"
    c = r["comparison"]
    def diff(split):
        d = c[split]["difference"]
        return f"{d['mean']:+5.1f} [{d['ci'][0]:+5.1f}, {d['ci'][1]:+5.1f}]"
    return (f"{r['base_seed']:>4} {r['sft_steps']:>5} {100 * r['base']['val']:>6.1f} {100 * r['base']['test']:>6.1f}  "
            f"{', '.join(r['kept']) or '-':28} {c['test']['reference']['mean']:>5.1f} {c['test']['evolved']['mean']:>5.1f}  "
            f"{diff('val'):>21} {diff('test'):>21}  {'yes' if held(r) else 'no'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "quickstart.yaml")
    p.add_argument("--bases", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="base seeds")
    p.add_argument("--out", type=Path, default=ROOT / "bench-runs" / "robustness")
    args = p.parse_args()
    import transformers
    transformers.logging.disable_progress_bar()  # the bench prints its own lines
    results = [run_on_base(args.config, s, args.out) for s in args.bases]
    (args.out / "robustness.json").write_text(json.dumps(results, indent=2))
    print(f"\n{args.config.name}: {len(results)} bases; accuracy %, test reference/evolved are means over "
          f"the final seeds; differences are evolved - reference in points with 95% t intervals (n - 1 df over n final seeds)")
    print(f"{'base':>4} {'SFT':>5} {'b.val':>6} {'b.test':>6}  {'kept':28} {'ref':>5} {'evo':>5}  "
          f"{'val diff [CI]':>21} {'test diff [CI]':>21}  holds")
    for r in results:
        print(row(r))
    overheads = ", ".join(f"{100 * r['overhead']:.1f}%" for r in results if "overhead" in r)
    print(f"held (a version kept and the test CI above zero) on {sum(map(held, results))} of {len(results)} bases; "
          f"framework overhead {overheads}; wall {', '.join(str(r['seconds']) + ' s' for r in results)}")


if __name__ == "__main__":
    main()
