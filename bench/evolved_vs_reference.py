"""Evolved harness vs the reference recipe, on fresh seeds, with a t interval of the difference.

For each config (default: the quickstart task and 3-digit addition) this runs the whole
product: the evolution loop on the config's search seeds, then the final comparison, which
replays the winner's harness schedule from the base on N fresh seeds (never used by the
search) beside the reference recipe trained the same total steps on the same seeds. Each
seed's accuracy is the mean of its last evaluations; the difference is paired by seed and
its 95% CI is a Student t interval over seeds (n - 1 degrees of freedom).

    .venv/bin/python bench/evolved_vs_reference.py                     # both configs, 5 fresh seeds
    .venv/bin/python bench/evolved_vs_reference.py --configs configs/quickstart.yaml --seeds 8

A run directory that already finished (bench-runs/NAME) is read back, not redone; delete it
to measure again.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evotrainer.config import config_from_dict  # noqa: E402
from evotrainer.evolve.controller import Controller  # noqa: E402
from evotrainer.evolve.status import status  # noqa: E402
from evotrainer.lineage import TrialRecord  # noqa: E402
from evotrainer.lineage.events import FinalStarted  # noqa: E402


def bench(config: Path, seeds: int, out: Path) -> dict:
    raw = yaml.safe_load(config.read_text())
    first = 200  # far from any search seed
    raw["final_seeds"] = list(range(first, first + seeds))
    run = out / config.stem
    # a skill library of its own, empty at the start: the bench measures the search alone,
    # not whatever the user's library learned before
    raw.setdefault("search", {})["skills"] = str(run / "skills.sqlite")
    cfg = config_from_dict(raw).validate()
    Controller(cfg, run, on_event=lambda e: isinstance(e, (TrialRecord, FinalStarted)) and
               print(f"  {config.stem}: " + (f"trial {e.id} {e.label}" if isinstance(e, TrialRecord)
                                             else f"final comparison, winner {e.winner}"), flush=True)).run()
    final = json.loads((run / "final.json").read_text())
    return {"config": config.stem, "task": f"{cfg.task} level {cfg.level}", "run": str(run),
            "overhead": status(run)["framework_overhead"], **final}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", type=Path,
                   default=[ROOT / "configs" / "quickstart.yaml", ROOT / "configs" / "arith3.yaml"])
    p.add_argument("--seeds", type=int, default=5, help="fresh seeds of the final comparison (at least 5)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-runs")
    args = p.parse_args()
    import transformers
    transformers.logging.disable_progress_bar()  # the bench prints its own lines
    results = [bench(c, args.seeds, args.out) for c in args.configs]
    for r in results:
        d = r["comparison"]["val"]["difference"]
        print(f"\n## {r['config']}: {r['task']}, {r['total_steps']} steps, winner {r['winner']} "
              f"(schedule {' -> '.join(r['schedule'])}), framework overhead {100 * r['overhead']:.1f}%")
        print(r["table"])
        lo, hi = d["ci"]
        verdict = "above zero" if lo > 0 else "below zero" if hi < 0 else "contains zero"
        print(f"validation difference per seed: {d['per_seed']} -> CI {verdict}")


if __name__ == "__main__":
    main()
