"""Build a suite task's landscape table (evolve/landscape.py): the root and two noise replicas
of it, every move the trainer agents can propose from the root, the hand sweep's recipes, and
combinations of the best single moves, each trained from the base on one fixed pool of seeds.

    .venv/bin/python bench/landscape.py arith3-weak            # build (or go on building) a table
    .venv/bin/python bench/landscape.py arith3-weak --show     # print what is recorded

The task's config is bench/configs/landscape/TASK.yaml (a suite task sized so a segment takes
about 30 s on one core). Records go to results/landscape/TASK/: rows.jsonl (one row per
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
import hashlib
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")  # nothing here downloads

from evotrainer.agents import Proposal  # noqa: E402
from evotrainer.agents.interventions import FAMILY  # noqa: E402
from evotrainer.backtest import measured  # noqa: E402
from evotrainer.backtest.measured import Agreement  # noqa: E402
from evotrainer.catalog import get_task  # noqa: E402
from evotrainer.config import config_from_dict  # noqa: E402
from evotrainer.diagnostics.evidence_view import spearman  # noqa: E402
from evotrainer.evolve import setup  # noqa: E402
from evotrainer.evolve.landscape import (BACKTESTS, ROWS, Config, Row, backtests, build, first_look, read_backtests,
                                        read_rows, root_moves, table_md)  # noqa: E402
from evotrainer.evolve.segments.cache import SegmentCache, file_digest, start_identity  # noqa: E402
from evotrainer.evolve.segments.retrain import Arm, retrain  # noqa: E402
from evotrainer.evolve.stats.paired import paired_differences, t_interval  # noqa: E402
from evotrainer.evolve.segments.training import Training  # noqa: E402
from evotrainer.executors import LocalPool  # noqa: E402
from evotrainer.harness import REFERENCE  # noqa: E402
from evotrainer.harness.knobs import load_knobs  # noqa: E402
from evotrainer.tasks.keys import key_digest, key_path, split_key  # noqa: E402
from evotrainer.trainer.pretrain import base_path, resolved  # noqa: E402
from search_suite import code_version, sweep_recipes  # noqa: E402

CONFIGS = ROOT / "bench" / "configs" / "landscape"
OUT = ROOT / "results" / "landscape"
SEEDS = [0, 1, 2, 3, 4, 5]  # the pool every row trains on
HEADROOM_SEEDS = SEEDS[:3]  # --headroom's first look
FRESH = 300                 # --fresh: seeds FRESH, FRESH+1, ... (no row trained on them)
SWEPT = ("lower_lr", "larger_groups", "partial_credit")  # the moves that equal a hand-sweep recipe
KEY = "split.key"           # the table's split key (which held-out problems are validation and test)
WEIGHTS = ("config.json", "model.safetensors")  # what identifies a base across machines
REPLICAS = 2                # the root again on the same problems, other sampling seeds
BEST = 4                    # combinations among the best single moves


def singles(root: Path, target: int) -> list[Config]:
    """The root, its replicas, every move from it, the sweep's recipes (those a move does not
    already make)."""
    out = [Config("root", "root")] + [Config(f"replica-{r}", "replica", replica=r) for r in range(1, REPLICAS + 1)]
    moves = root_moves(root, target)
    catalog = [p for p in moves if p.intervention in FAMILY]  # first: what the rules agent tries first
    out += [Config(p.intervention, "move", (p,)) for p in catalog]
    knobs = yaml.safe_load((root / "knobs.yaml").read_text())
    made = [knobs | p.knobs for p in moves if not p.files]
    for name, change in sweep_recipes(load_knobs(root / "knobs.yaml")).items():
        if knobs | change != knobs and knobs | change not in made:  # the root, or a move: trained once
            out.append(Config(f"sweep:{name}", "sweep", (Proposal(name, "sweep", "", "", "", "", knobs=change),)))
    out += [Config(p.intervention, "move", (p,)) for p in moves if p not in catalog]
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


class Verdict(NamedTuple):
    """A backtested move beside its training."""
    name: str
    passed: bool          # on most seeds
    gain: float           # trained validation gain over the root (points, mean over the pool)
    dead_removed: float   # the dead-group ratio its backtest removed
    judged: bool          # it changed what the backtest rescores, on most seeds


def verdicts(rows: dict[str, Row], bts: dict[str, dict[int, dict]]) -> list[Verdict]:
    """Each backtested move that trained, as a Verdict."""
    root, cells = rows["root"], []
    for name, by_seed in sorted(bts.items()):
        r = rows.get(name)
        if r is None or not r.val:
            continue
        g = 100 * statistics.fmean(paired_differences(r.val, root.val))
        passed = sum(b["label"] == "passed" for b in by_seed.values()) > len(by_seed) / 2
        judged = sum(not b.get("unchanged", False) for b in by_seed.values()) > len(by_seed) / 2
        drop = [b["dead_group_ratio_before"] - b["dead_group_ratio_after"] for b in by_seed.values()
                if "dead_group_ratio_after" in b]
        cells.append(Verdict(name, passed, g, statistics.fmean(drop) if drop else 0.0, judged))
    return cells


def counts(cells: list[Verdict]) -> Agreement:
    """The judged moves' verdicts against training (backtest/measured.py)."""
    judged = [c for c in cells if c.judged]
    return Agreement(judged=len(judged), gained=sum(c.gain > 0 for c in judged), passed=sum(c.passed for c in judged),
                     passed_gained=sum(c.passed and c.gain > 0 for c in judged),
                     rejected_lost=sum(not c.passed and c.gain <= 0 for c in judged))


def bottleneck(rows: dict[str, Row]) -> str:
    """What limits the default recipe on this task: the health report's critical findings on
    the root, each with how many of the pool's seeds raised it and its median value. A
    suite task is chosen for a bottleneck of its own, so that its best changes differ."""
    root = rows["root"]
    raised: dict[str, list[float]] = {}
    for findings in root.findings.values():
        for f in findings:
            if f["severity"] == "critical":
                raised.setdefault(f["diagnostic"], []).append(f["value"])
    if not raised:
        return "The root's bottleneck: no critical finding on any seed."
    parts = [f"`{d}` on {len(v)} of {len(root.findings)} seeds (median {statistics.median(v):.2f})"
             for d, v in sorted(raised.items(), key=lambda kv: -len(kv[1]))]
    return "The root's bottleneck (critical findings): " + ", ".join(parts) + "."


def agreement(rows: dict[str, Row], bts: dict[str, dict[int, dict]]) -> str:
    """The backtest against training: each move's verdict on each seed's root rollouts beside
    its trained gain over the root (validation points, mean over the pool). A move "gains" where
    its mean gain is above zero; the backtest "passes" it where it passes on most seeds. A move
    whose rewards, advantages and groups equal the root's on its rollouts (an optimiser or
    sampling knob) is one the backtest cannot see: it passes unjudged, so agreement and
    precision are counted over the moves it judged, and over all for comparison. Its one graded
    output, the dead-group ratio it predicts, is ranked against the gains of the judged."""
    cells = verdicts(rows, bts)
    if not cells:
        return "no backtests recorded"

    def summary(cs: list[Verdict], what: str) -> str:
        passed, gains = [c for c in cs if c.passed], [c for c in cs if c.gain > 0]
        agree = sum(c.passed == (c.gain > 0) for c in cs)
        prec = sum(c.gain > 0 for c in passed) / len(passed) if passed else float("nan")
        return (f"{what}: {len(cs)} moves, agreement {agree} of {len(cs)} ({100 * agree / max(len(cs), 1):.0f}%); "
                f"passed {len(passed)}, of which {prec:.0%} gain (base rate: {len(gains)} of {len(cs)} gain)")
    judged = [c for c in cells if c.judged]
    rho = spearman([c.dead_removed for c in judged], [c.gain for c in judged]) if len(judged) > 2 else None
    lines = ["Backtest vs training. " + summary(judged, "Judged (the move changes what it rescores)") + "; "
             + summary(cells, "all, unjudged passes included") + f". Rank correlation over the judged of the dead "
             f"groups it removes with the trained gain: {rho if rho is not None else float('nan'):+.2f}.", "",
             "| move | backtest | dead groups removed | trained gain, val points |", "|---|---|---|---|"]
    lines += [f"| {n} | {('passed' if p else 'rejected') if j else 'unjudged'} | {d:+.2f} | {g:+.1f} |"
              for n, p, g, d, j in sorted(cells, key=lambda c: -c.gain)]
    return "\n".join(lines)


def best_by_val(rows: dict[str, Row], kinds: tuple[str, ...]) -> str:
    cands = [r for r in rows.values() if r.val and (r.kind in kinds or r.name == "root")]
    return max(cands, key=lambda r: statistics.fmean(r.val.values())).name


def tuned_recipe(rows: dict[str, Row]) -> str:
    """What a careful engineer's full sweep picks: of its recipes (the root is one of them, the
    learning rate as it is with the binary reward and the groups as they are; a recipe a move
    makes is that move's row), the best mean validation accuracy over the pool."""
    names = [n for n, r in rows.items() if r.val and (r.kind in ("root", "sweep") or n in SWEPT)]
    return max(names, key=lambda n: statistics.fmean(rows[n].val.values()))


def headroom(name: str, training: Training, src: Path, seeds: list[int], timeout_s: float | None = None) -> str:
    """The task's headroom on fresh seeds: the default recipe (the root), the tuned one
    (`tuned_recipe`) and the table's best entry by validation, each retrained from the base on
    fresh `seeds` no row saw; test gains paired by seed, with 95% t intervals. More seeds reuse
    the fewer's segments (the cache), and so does a run again after a stop. `timeout_s` per
    segment (default: the config's trial timeout, sized for a core alone). The rows and harnesses
    are `src`'s: the table's, or a first look's (--headroom) before the table is built."""
    out, rows = OUT / name, read_rows(src / ROWS)
    tuned = tuned_recipe(rows)
    best = best_by_val(rows, ("move", "sweep", "combo", "reached"))
    arms = {n: Arm((str(src / "harnesses" / n),), training.cfg.budget.total_steps) for n in {"root", tuned, best}}
    rep = retrain(training.task, training.base, arms, seeds, out / "fresh", evaluation=training.cfg.evaluation,
                  timeout_s=timeout_s or training.cfg.budget.trial_timeout_s, workers=2, runtime=training.runtime,
                  cache=training.cache)
    test = {n: {s: 100 * v["test"] for s, v in by_seed.items()} for n, by_seed in rep.scores.items()}
    lines = [f"Headroom on fresh seeds {seeds} (test %, paired by seed; 95% t):", "",
             "| recipe | chosen as | test % | − default |", "|---|---|---|---|",
             f"| root | default | {statistics.fmean(test['root'].values()):.1f} | – |"]
    for n, why in ((tuned, "tuned: the sweep's best by validation"), (best, "the table's best by validation")):
        d = paired_differences(test[n], test["root"])
        lo, hi = t_interval(d)
        lines.append(f"| {n} | {why} | {statistics.fmean(test[n].values()):.1f} | "
                     f"{statistics.fmean(d):+.1f} [{lo:+.1f}, {hi:+.1f}] |")
    (out / "fresh.json").write_text(json.dumps({"seeds": seeds, "tuned": tuned, "best": best, "test": test,
                                                "chosen_on": "table" if src == out else src.name}) + "\n")
    return "\n".join(lines)


def machine() -> str:
    """What a base's weights depend on besides the code: the CPU's model and the kernels torch
    picks for it (a base rebuilds to the same weights on one machine, not across machines)."""
    import platform

    import torch
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    return f"{model}; torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()}; {os.cpu_count()} cores"


def config_name(table: str) -> str:
    """A table's config: TASK.yaml for the table TASK and for TASK@WHERE, the same task's table
    built on another machine (a table belongs to the machine its base was built on)."""
    return table.split("@", 1)[0]


def weights_digest(base: Path) -> str:
    """The base's weights and architecture, as one digest (its metadata left out)."""
    return hashlib.sha256("".join(file_digest(base / f) for f in WEIGHTS).encode()).hexdigest()[:16]


def trainer(name: str, workers: int = 2) -> tuple[dict, Training, Path]:
    """The task's config (with the pool as its seeds), a Training on its table's directory (the
    base built or read from the base cache, under the table's split key), and the root harness.
    `name` is the table's; its config is the one its meta.json names, or the config of that name.

    A table keeps its split key beside its rows (KEY: a benchmark's key, never a user run's), and
    a machine without a key for that base takes it before the base is built, so a table outlives
    its machine wherever the base builds to the same weights (WEIGHTS: the files that hold them;
    the base's metadata records its build time). Refuses a table recorded on other weights or
    another key."""
    out = OUT / name
    stem = json.loads((out / "meta.json").read_text()).get("config_name", name) if (out / "meta.json").exists() else \
        config_name(name)
    raw = yaml.safe_load((CONFIGS / f"{stem}.yaml").read_text())
    raw["seeds"] = SEEDS
    # a root harness shipped beside the configs (harness: harnesses/NAME), found from anywhere
    shipped = {"harness": str((CONFIGS / raw["harness"]).resolve())} if raw.get("harness") else {}
    cfg = config_from_dict({**raw, **shipped}).validate()
    task = get_task(cfg.task, cfg.level)
    here = key_path(base_path(task, resolved(task, cfg.base.pretrain_config())).name)
    if (out / KEY).exists() and not here.exists():  # the table's problems, on a machine that has none yet
        here.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(here.parent, 0o700)
        with os.fdopen(os.open(here, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
            fh.write((out / KEY).read_text().strip())
    base = setup.base_checkpoint(cfg, task, None, lambda event: None)
    task.use_key(split_key(Path(base).name))
    meta_path = out / "meta.json"
    key, weights = key_digest(task.key), weights_digest(Path(base))
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        here_base = weights if "weights_digest" in meta else start_identity(Path(base))  # older tables: every file
        there = meta.get("weights_digest", meta.get("base_digest"))
        if (there, meta["split_key_digest"]) != (here_base, key):
            raise SystemExit(f"error: {out} was built on base {there} under split key {meta['split_key_digest']}; "
                             f"this machine has {here_base} / {key}: build it here as {config_name(name)}@WHERE")
    out.mkdir(parents=True, exist_ok=True)
    if not (out / KEY).exists():
        (out / KEY).write_text(task.key.hex() + "\n")
    root = Path(cfg.harness or REFERENCE)
    runtime = cfg.runtime().validate(here=True).on_base(base)
    training = Training(cfg=cfg, task=task, runtime=runtime, base=base, run_dir=out, harness_dir=lambda v: root,
                        executor=LocalPool(workers), cache=SegmentCache((out / "segment-cache").resolve()))
    return raw, training, root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", help="a config under bench/configs/landscape (its stem), or STEM@WHERE: that "
                    "config's table under another name (another machine's)")
    ap.add_argument("--show", action="store_true", help="print the recorded table and stop")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4, help="configurations per pool and evaluator")
    ap.add_argument("--only", choices=("root", "sweep", "singles", "catalog", "all"), default="all",
                    help="root: the root and its noise replicas, the least a simulator's --fill (and "
                         "--validate) can start from; sweep: those and the hand sweep's recipes, the least "
                         "that names a tuned recipe; singles: no combinations; catalog: the catalog's moves "
                         "and the sweep, then combinations, without the space's moves")
    ap.add_argument("--fresh", action="store_true", help="the default, the tuned recipe and the table's best "
                    f"retrained on fresh seeds {FRESH}, {FRESH + 1}, ... (the task's headroom), after the table or, "
                    "before it, after --headroom's first look")
    ap.add_argument("--fresh-seeds", type=int, default=5, help="how many fresh seeds --fresh trains on")
    ap.add_argument("--fresh-timeout", type=float, default=None,
                    help="seconds per segment for --fresh (default: the config's trial timeout); more where "
                         "the machine is shared")
    ap.add_argument("--headroom", action="store_true", help="first look, before a whole table: the root and the "
                    f"sweep, then the catalog's moves (not with --only root or sweep), on seeds {HEADROOM_SEEDS}, in "
                    "TASK/headroom/ (the table reuses them)")
    ap.add_argument("--backtests", action="store_true", help="backtest every recorded row on the root's rollouts "
                    "(a stopped build's rows), without training")
    ap.add_argument("--calibrate", action="store_true", help="count every table's backtest verdicts against "
                    "training into the package's backtest/measured.json (printed beside every verdict); TASK: all")
    args = ap.parse_args()
    if args.calibrate:
        tables = {d.name: counts(verdicts(read_rows(d / ROWS), read_backtests(d / BACKTESTS)))
                  for d in sorted(OUT.iterdir()) if (d / BACKTESTS).is_file() and (d / ROWS).is_file()}
        measured.write({n: a for n, a in tables.items() if a.judged})
        for n, a in tables.items():
            print(f"{n}: {a}")
        print(measured.verdict_note("passed") + "\n" + measured.verdict_note("backtest_rejected"))
        return
    out = OUT / args.task
    if args.backtests:
        recorded = [Config(r.name, r.kind) for r in read_rows(out / ROWS).values() if r.val]
        timeout = config_from_dict(json.loads((out / "meta.json").read_text())["config"]).budget.trial_timeout_s
        backtests(out, recorded, seeds=SEEDS, timeout_s=timeout,
                  on_done=lambda name: print(f"  backtested {name}", flush=True))
        args.show = True
    if args.show:
        rows = read_rows(out / ROWS)
        print(table_md(rows) + "\n\n" + bottleneck(rows) + "\n\n" + agreement(rows, read_backtests(out / BACKTESTS)))
        return
    t0 = time.time()
    raw, training, root = trainer(args.task, args.workers)
    meta_path = out / "meta.json"
    spent = json.loads(meta_path.read_text())["seconds"] if meta_path.exists() else 0
    meta = {"task": args.task, "config_name": config_name(args.task), "config": raw, "seeds": SEEDS, "steps": training.cfg.budget.total_steps,
            "base": Path(training.base).name, "base_digest": start_identity(Path(training.base)),
            "weights_digest": weights_digest(Path(training.base)),
            "split_key_digest": key_digest(training.task.key),
            "code": code_version(), "seconds": spent, "machine": machine()}

    def note(what: str) -> None:
        meta["seconds"] = spent + round(time.time() - t0)
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
        print(f"  {what}  ({meta['seconds']} s so far)", flush=True)

    def on_row(r: Row) -> None:
        note(f"{r.name}: val {100 * statistics.fmean(r.val.values()):.1f}%" if r.val else f"{r.name}: {r.failed}")

    first = singles(root, training.task.target_level)
    if args.fresh:
        src = out if (out / ROWS).exists() else out / "headroom"  # before a table: the first look's rows
        text = headroom(args.task, training, src, list(range(FRESH, FRESH + args.fresh_seeds)), args.fresh_timeout)
        (out / "fresh.md").write_text(text + "\n")
        print(text)
        return
    if args.headroom:
        rows = build(training, root, first_look(first, args.only), seeds=HEADROOM_SEEDS, out=out / "headroom",
                     batch=args.batch, on_row=on_row)
        (out / "headroom" / "table.md").write_text(table_md(rows) + "\n")
        print(table_md(rows))
        return
    by_name = {c.name: c.moves[0] for c in first if c.kind == "move"}
    # the catalog and the sweep, combinations of the best single moves so far, then the space's
    # moves (which only the random agent and long searches reach); combinations again once the
    # singles are all in (a better single makes new ones)
    lead = [c for c in first if c.kind != "move" or c.name in FAMILY]
    rows = build(training, root, lead[:1], seeds=SEEDS, out=out, batch=args.batch, on_row=on_row)
    if args.only in ("root", "sweep"):
        swept = args.only == "sweep"
        build(training, root, [c for c in first if c.kind in ("root", "replica")
                               or swept and (c.kind == "sweep" or c.name in SWEPT)],
              seeds=SEEDS, out=out, batch=args.batch, on_row=on_row)
        return
    configs = []
    for part in (lead,) if args.only == "catalog" else (lead, first):
        if args.only == "all":
            configs += [c for c in combos(rows, by_name) if c not in configs]
        configs += [c for c in part if c not in configs]
        rows = build(training, root, configs, seeds=SEEDS, out=out, batch=args.batch, on_row=on_row)
    if args.only in ("all", "catalog"):
        configs += [c for c in combos(rows, by_name) if c not in configs]
        rows = build(training, root, configs, seeds=SEEDS, out=out, batch=args.batch, on_row=on_row)
    bts = backtests(out, configs, seeds=SEEDS, timeout_s=training.cfg.budget.trial_timeout_s,
                    on_done=lambda name: note(f"backtested {name}"))
    text = table_md(rows) + "\n\n" + agreement(rows, bts)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
