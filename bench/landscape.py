"""Build a suite task's landscape table (evolve/landscape.py): the root and two noise replicas
of it, every move the trainer agents can propose from the root, the hand sweep's recipes, and
combinations of the best single moves, each trained from the base on one fixed pool of seeds.

    .venv/bin/python bench/landscape.py arith3-weak            # build (or go on building) a table
    .venv/bin/python bench/landscape.py arith3-weak --show     # print what is recorded

The task's config is bench/configs/landscape/TASK.yaml (a suite task sized so a segment takes
about 30 s on one core). Records go to bench/results/landscape/TASK/: rows.jsonl (one row per
configuration: val and test accuracy per seed, findings per seed, the score curve), meta.json
(the config, the base, the split key's digest, the code, the cost) and harnesses/ (each row's
harness files). Checkpoints, rollouts and the segment cache stay out of git; a stopped build
goes on from rows.jsonl and the segment cache.

Combinations come once every single move has a row: the moves whose paired validation gain
over the root is largest (positive only, at most one per knob), in pairs among the best four,
and stacked three and four deep, each applied in the order of their gains.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")  # nothing here downloads

from evotrainer.agents.catalog import Proposal  # noqa: E402
from evotrainer.catalog import get_task  # noqa: E402
from evotrainer.config import config_from_dict  # noqa: E402
from evotrainer.evolve import setup  # noqa: E402
from evotrainer.evolve.landscape import ROWS, Config, Row, backtests, build, read_rows, root_moves, table_md  # noqa: E402
from evotrainer.evolve.segment_cache import SegmentCache  # noqa: E402
from evotrainer.evolve.stats import paired_differences  # noqa: E402
from evotrainer.evolve.training import Training  # noqa: E402
from evotrainer.executors import LocalPool  # noqa: E402
from evotrainer.harness import REFERENCE  # noqa: E402
from evotrainer.harness.knobs import load_knobs  # noqa: E402
from evotrainer.tasks.keys import key_digest, split_key  # noqa: E402
from search_suite import code_version, sweep_recipes  # noqa: E402

CONFIGS = ROOT / "bench" / "configs" / "landscape"
OUT = ROOT / "bench" / "results" / "landscape"
SEEDS = [0, 1, 2, 3, 4, 5]  # the pool every row trains on
HEADROOM_SEEDS = SEEDS[:3]  # --headroom's first look
REPLICAS = 2                # the root again on the same problems, other sampling seeds
BEST = 4                    # combinations among the best single moves


def singles(root: Path, target: int) -> list[Config]:
    """The root, its replicas, every move from it, the sweep's recipes (those a move does not
    already make)."""
    out = [Config("root", "root")] + [Config(f"replica-{r}", "replica", replica=r) for r in range(1, REPLICAS + 1)]
    moves = root_moves(root, target)
    out += [Config(p.intervention, "move", (p,)) for p in moves]
    knobs = yaml.safe_load((root / "knobs.yaml").read_text())
    made = [knobs | p.knobs for p in moves if not p.files]
    for name, change in sweep_recipes(load_knobs(root / "knobs.yaml")).items():
        if knobs | change != knobs and knobs | change not in made:  # the root, or a move: trained once
            out.append(Config(f"sweep:{name}", "sweep", (Proposal(name, "sweep", "", "", "", "", knobs=change),)))
    return out


def gain(row: Row, root: Row, split: str = "val") -> float:
    return statistics.fmean(paired_differences(getattr(row, split), getattr(root, split)))


def combos(rows: dict[str, Row], by_name: dict[str, Proposal]) -> list[Config]:
    """Pairs among the best BEST single moves, and the best three and four stacked."""
    root = rows["root"]
    ranked = sorted((r for r in rows.values() if r.kind == "move" and r.val and gain(r, root) > 0),
                    key=lambda r: -gain(r, root))
    best, knobs = [], set()
    for r in ranked:  # one move per knob: a second would overwrite the first
        p = by_name[r.name]
        if not (set(p.knobs) & knobs) and not (p.files and any(by_name[b].files for b in best)):
            best.append(r.name)
            knobs |= set(p.knobs)
        if len(best) == BEST:
            break
    sets = [list(c) for c in itertools.combinations(best, 2)] + [best[:k] for k in range(3, len(best) + 1)]
    return [Config("+".join(s), "combo", tuple(by_name[n] for n in s)) for s in sets]


def trainer(name: str, workers: int = 2) -> tuple[dict, Training, Path]:
    """The task's config (with the pool as its seeds), a Training on its table's directory (the
    base built or read from the base cache, the split key this machine's), and the root harness.
    Refuses a table recorded on another base or under another split key."""
    out = OUT / name
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    raw["seeds"] = SEEDS
    cfg = config_from_dict(raw).validate()
    task = get_task(cfg.task, cfg.level)
    base = setup.base_checkpoint(cfg, task, None, lambda kind, d: None)
    task.use_key(split_key(Path(base).name))
    meta_path = out / "meta.json"
    key = key_digest(task.key)
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if (meta["base"], meta["split_key_digest"]) != (Path(base).name, key):
            raise SystemExit(f"error: {out} was built on base {meta['base']} under split key "
                             f"{meta['split_key_digest']}; this machine has {Path(base).name} / {key}: "
                             f"build under another name")
    out.mkdir(parents=True, exist_ok=True)
    root = Path(cfg.harness or REFERENCE)
    runtime = cfg.runtime().validate(here=True).on_base(base)
    training = Training(cfg, task, runtime, base, out, lambda v: root, executor=LocalPool(workers),
                        cache=SegmentCache((out / "segment-cache").resolve()))
    return raw, training, root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", help="a config under bench/configs/landscape (its stem)")
    ap.add_argument("--show", action="store_true", help="print the recorded table and stop")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4, help="configurations per pool and evaluator")
    ap.add_argument("--only", choices=("singles", "all"), default="all")
    args = ap.parse_args()
    out = OUT / args.task
    if args.show:
        print(table_md(read_rows(out / ROWS)))
        return
    t0 = time.time()
    raw, training, root = trainer(args.task, args.workers)
    meta_path = out / "meta.json"
    spent = json.loads(meta_path.read_text())["seconds"] if meta_path.exists() else 0
    meta = {"task": args.task, "config": raw, "seeds": SEEDS, "steps": training.cfg.budget.total_steps,
            "base": Path(training.base).name, "split_key_digest": key_digest(training.task.key),
            "code": code_version(), "seconds": spent}

    def note(what: str) -> None:
        meta["seconds"] = spent + round(time.time() - t0)
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
        print(f"  {what}  ({meta['seconds']} s so far)", flush=True)

    def on_row(r: Row) -> None:
        note(f"{r.name}: val {100 * statistics.fmean(r.val.values()):.1f}%" if r.val else f"{r.name}: {r.failed}")

    first = singles(root, training.task.target_level)
    by_name = {c.name: c.moves[0] for c in first if c.kind == "move"}
    rows = build(training, root, first, SEEDS, out, args.batch, on_row)
    configs = first + (combos(rows, by_name) if args.only == "all" else [])
    rows = build(training, root, configs, SEEDS, out, args.batch, on_row)
    backtests(out, configs, SEEDS, training.cfg.budget.trial_timeout_s, lambda name: note(f"backtested {name}"))
    (out / "table.md").write_text(table_md(rows) + "\n")
    print(table_md(rows))


if __name__ == "__main__":
    main()
