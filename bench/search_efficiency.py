"""Search efficiency: population search with skills vs greedy keep-or-revert vs random
single-variable search vs the reference recipe, at equal compute.

Every method runs the task's config unchanged (the same trial budget, segment steps, total
steps, gate and base); only the search differs:

    evolved   population selection, crossover, escalation, a skill library (empty at the start)
    greedy    the autoresearch loop: always extend the best state, rules agent, no skills
    random    a uniformly random applicable single-variable intervention, greedy selection
    evolved+library   (tasks after the first) evolved, starting from the union of the libraries
              the evolved runs on the earlier tasks learned: the transfer measurement

Each method searches `--replicates` times on different search seeds (replicate r uses seeds
[2r, 2r+1]; the same r is the same seeds for every method, so replicates pair). Then one
replay: every search's winner schedule trained again from the base on fresh seeds (never
used by any search), and the reference recipe on the same seeds for the same total steps;
identical schedules are replayed once. The headline is held-out *test* accuracy of the
replays (mean of the last evaluations per seed), and every difference comes with a 95% t
interval over the replicate x seed table with both as random draws (stats.crossed_t_interval):
every replicate's winner is replayed on the same fresh seeds, so the seeds' spread is shared
and an interval over the replicates' means alone would miss it (zero width where every
replicate's winner is the same schedule).

    .venv/bin/python bench/search_efficiency.py                       # quickstart + chain_sum, 3 x 5
    .venv/bin/python bench/search_efficiency.py --configs configs/quickstart.yaml --replicates 5

A search or replay that already finished under --out is read back, not redone.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import shutil
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evotrainer.config import config_from_dict  # noqa: E402
from evotrainer.evolve.controller import Controller  # noqa: E402
from evotrainer.evolve.segments.retrain import Arm, retrain  # noqa: E402
from evotrainer.lineage import TrialRecord  # noqa: E402
from evotrainer.catalog import get_task  # noqa: E402
from evotrainer.tasks.keys import split_key  # noqa: E402
from evotrainer.skills import SkillLibrary  # noqa: E402
from evotrainer.evolve.stats.paired import crossed_t_interval  # noqa: E402

NO_SKILLS = {"crossover": False, "escalation": False, "skills": None}
METHODS = {
    "evolved": {"agent": "rules", "search": {"selection": "population", "crossover": True, "escalation": True}},
    "greedy": {"agent": "rules", "search": {"selection": "greedy", **NO_SKILLS}},
    "random": {"agent": "random", "search": {"selection": "greedy", **NO_SKILLS}},
}
TRANSFER = "evolved+library"
FRESH = 300  # first fresh seed: far from every search seed


def search(raw: dict, method: str, r: int, out: Path, library: Path | None) -> dict:
    """One search (or its record, if it finished before): the winner's schedule and the
    number of trials to its first kept version."""
    run = out / f"{method}-r{r}"
    done = run / "search.json"
    if done.exists():
        return json.loads(done.read_text())
    raw = copy.deepcopy(raw)
    settings = METHODS["evolved" if method == TRANSFER else method]
    raw["agent"] = settings["agent"]
    raw["seeds"] = [2 * r, 2 * r + 1]
    raw["final_seeds"] = []  # the bench replays every winner itself, on shared fresh seeds
    raw["search"] = {**raw.get("search", {}), **settings["search"]}  # the config's search mode stays
    if "skills" not in raw["search"]:  # evolved: a library of its own (a copy of `library` for the transfer row)
        raw["search"]["skills"] = str(run / "skills.sqlite")
        if library is not None and not (run / "lineage.sqlite").exists():
            run.mkdir(parents=True, exist_ok=True)
            shutil.copy(library, run / "skills.sqlite")
    cfg = config_from_dict(raw).validate()
    ctl = Controller(cfg, run, on_event=lambda e: isinstance(e, TrialRecord) and print(
        f"    {method} r{r} trial {e.id}: {e.intervention} {e.label}", flush=True))
    ctl.run()
    label, versions, arm = ctl.winner_schedule()
    trials = ctl.store.trials()
    did = {t.version: t.intervention for t in trials if t.version}
    first_kept = next((t.id for t in trials if t.parents and t.label == "kept"), None)
    rec = {"method": method, "replicate": r, "seeds": raw["seeds"], "winner": label,
           "schedule": [did[v] if v != "v0" else "reference" for v in versions],
           "harnesses": list(arm.harnesses), "steps": arm.steps, "base": ctl.base,
           "trials": [(t.id, t.intervention, t.label) for t in trials],
           "first_kept": first_kept, "trained_trials": sum(1 for t in trials if t.parents and t.budgets)}
    done.write_text(json.dumps(rec, indent=2))
    return rec


def arm_key(harnesses: list[str], steps: int) -> str:
    """Identical schedules (same files at every segment) are one replay, whatever run made them."""
    h = hashlib.sha256(str(steps).encode())
    for d in harnesses:
        for f in sorted(Path(d).iterdir()):
            if f.is_file():
                h.update(f.name.encode() + f.read_bytes())
        h.update(b"|")
    return h.hexdigest()[:12]


def replays(cfg, arms: dict[str, Arm], base: str, seeds: list[int], out: Path, cache=None) -> dict:
    """Scores of every arm, replaying only those not replayed before. `cache` (a SegmentCache):
    segments trained before, by any arm or a replay a kill cut short, are reused."""
    scores = {}
    todo = {}
    for key, arm in arms.items():
        f = out / "replays" / key / "scores.json"
        if f.exists():
            scores[key] = {int(s): v for s, v in json.loads(f.read_text()).items()}
        else:
            todo[key] = arm
    if todo:
        print(f"  replaying {len(todo)} schedules on seeds {seeds}", flush=True)
        task = get_task(cfg.task, cfg.level)
        task.use_key(split_key(Path(base).name))  # the runs' held-out pool: their base's key
        rep = retrain(task, base, todo, seeds, out / "replays", evaluation=cfg.evaluation,
                      timeout_s=cfg.budget.trial_timeout_s, workers=cfg.workers, cache=cache)
        for key, s in rep.scores.items():
            (out / "replays" / key / "scores.json").write_text(json.dumps(s, indent=2))
            scores[key] = s
    return scores


def bench(config: Path, methods: list[str], replicates: int, seeds: list[int], out: Path,
          library: Path | None) -> dict:
    raw = yaml.safe_load(config.read_text())
    out = out / config.stem
    runs = {m: [] for m in methods}
    for r in range(replicates):  # replicate by replicate, so a run cut short leaves paired searches
        for m in methods:
            runs[m].append(search(raw, m, r, out, library if m == TRANSFER else None))
    cfg = config_from_dict(raw).validate()
    # the root harness as every run checked it out: the reference recipe of this config
    reference = Arm((str(out / f"{methods[0]}-r0" / "harnesses" / "v0"),), cfg.budget.total_steps)
    arms = {"reference": reference}
    for rec in (rec for m in methods for rec in runs[m]):
        rec["arm"] = arm_key(rec["harnesses"], rec["steps"])
        arms.setdefault(rec["arm"], Arm(tuple(rec["harnesses"]), rec["steps"]))
    scores = replays(cfg, arms, runs[methods[0]][0]["base"], seeds, out)
    return {"config": config.stem, "task": f"{cfg.task} level {cfg.level}", "trials": cfg.budget.trials,
            "total_steps": cfg.budget.total_steps, "seeds": seeds, "runs": runs, "scores": scores}


def matrix(result: dict, method: str, split: str) -> list[list[float]]:
    """Accuracy of each replicate's winner (rows) on each fresh seed (columns)."""
    return [[result["scores"][rec["arm"]][s][split] for s in result["seeds"]] for rec in result["runs"][method]]


def table(result: dict) -> str:
    ref = {split: [result["scores"]["reference"][s][split] for s in result["seeds"]] for split in ("val", "test")}
    methods = list(result["runs"])
    lines = [f"## {result['config']}: {result['task']}, {result['trials']} trials, {result['total_steps']} steps; "
             f"{len(result['runs'][methods[0]])} search replicates x {len(result['seeds'])} fresh seeds",
             "", "Accuracy % of each search's winner replayed from the base on the fresh seeds "
             "(mean ± sd over replicates; the reference: over seeds). Differences: mean and 95% t interval "
             "over replicates and seeds, both random (the seeds are shared).", "",
             "| method | winners' schedules | trials to first kept | val % | test % | test − reference | "
             "evolved − method, test |", "|---|---|---|---|---|---|---|",
             f"| reference | v0 × {result['total_steps']} steps | – | {_ms([100 * x for x in ref['val']])} | "
             f"{_ms([100 * x for x in ref['test']])} | – | – |"]
    for m in methods:
        runs = result["runs"][m]
        val, test = matrix(result, m, "val"), matrix(result, m, "test")
        vs_ref = [[x - y for x, y in zip(row, ref["test"])] for row in test]
        vs_evolved = "–"
        if m != "evolved" and "evolved" in result["runs"]:
            ev = matrix(result, "evolved", "test")
            vs_evolved = _ci([[a - b for a, b in zip(er, mr)] for er, mr in zip(ev, test)])
        scheds = "; ".join(" → ".join(_short(x) for x in rec["schedule"]) for rec in runs)
        kept = ", ".join(str(rec["first_kept"]) if rec["first_kept"] else "none" for rec in runs)
        lines.append(f"| {m} | {scheds} | {kept} | {_ms([100 * statistics.fmean(r) for r in val])} | "
                     f"{_ms([100 * statistics.fmean(r) for r in test])} | {_ci(vs_ref)} | {vs_evolved} |")
    return "\n".join(lines)


def _short(name: str) -> str:
    return {"reference": "ref", "crossover": "×"}.get(name, name)


def _ms(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else math.nan
    return f"{statistics.fmean(xs):.1f} ± {sd:.1f}"


def _ci(rows: list[list[float]]) -> str:
    lo, hi = crossed_t_interval(rows)
    mean = statistics.fmean(x for row in rows for x in row)
    return f"{100 * mean:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def merged_library(paths: list[Path], out: Path) -> Path | None:
    paths = [p for p in paths if p.exists()]
    if not paths:
        return None
    out.unlink(missing_ok=True)
    lib = SkillLibrary(out)
    for p in paths:
        lib.absorb(p)
    lib.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", type=Path,
                   default=[ROOT / "configs" / "quickstart.yaml", ROOT / "configs" / "chain_sum.yaml"])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--replicates", type=int, default=3, help="searches per method, on different search seeds")
    p.add_argument("--seeds", type=int, default=5, help="fresh seeds each winner is replayed on")
    p.add_argument("--out", type=Path, default=ROOT / "bench-runs" / "search-efficiency")
    args = p.parse_args()
    import transformers
    transformers.logging.disable_progress_bar()  # the bench prints its own lines
    seeds = list(range(FRESH, FRESH + args.seeds))
    results, learned = [], []
    for config in args.configs:
        library = merged_library(learned, args.out / f"library-before-{config.stem}.sqlite")
        methods = args.methods + ([TRANSFER] if library and "evolved" in args.methods else [])
        print(f"# {config.stem}: {', '.join(methods)}", flush=True)
        results.append(bench(config, methods, args.replicates, seeds, args.out, library))
        learned += [args.out / config.stem / f"evolved-r{r}" / "skills.sqlite" for r in range(args.replicates)]
        print("\n" + table(results[-1]) + "\n", flush=True)
    report = "# Search efficiency\n\n" + "\n\n".join(table(r) for r in results) + "\n"
    (args.out / "report.md").write_text(report)
    (args.out / "report.json").write_text(json.dumps(results, indent=2))
    print(report)


if __name__ == "__main__":
    main()
