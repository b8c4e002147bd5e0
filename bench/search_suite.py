"""The search suite: which search finds what a recipe misses, on several tasks, at equal trials.

Every strategy runs a task's config unchanged (its base, gate, trial budget and steps); only
the search differs:

    random       a uniformly random move of the search space, greedy selection
    greedy       keep-or-revert on one path (the autoresearch loop), rules agent
    population   GEAR's population of elites, parent score, crossover; a fixed controller
    evolving     the same population, its controller revised from the lineage every few trials

and two references, trained from the same base for the same steps:

    default      the config's root harness (the recipe a user starts from)
    tuned        the best of a hand sweep a careful engineer would run (SWEEP): learning rate
                 x0.5 / x1 / x2, reward binary / partial credit, group size G / 2G at equal
                 rollouts per step (prompts halve): 12 recipes, each trained from the base on two
                 sweep seeds; the best mean validation accuracy wins

Each strategy searches `--replicates` times (replicate r uses search seeds [2r, 2r+1], the
same for every strategy, so replicates pair). Every winner, and both references, is then
replayed from the base on `--seeds` fresh seeds no search saw (identical schedules once).
The table gives each strategy's held-out test gain over each reference with a 95% t
interval over replicates and fresh seeds, both random (stats.crossed_t_interval: the seeds
are shared by every replicate), trials to the first kept version, and the changes each winner
holds; then the evolving controller minus greedy, paired by replicate and seed. The
landscape lists every trained trial's gain over its control by move, across all searches:
where nothing was found it shows what was tried and how close it came.

Every search and the sweep of a task share one segment cache (`cache.dir`), so a harness
that two arms train on the same seeds (the root, a first move both searches pick) trains
once; each search's record counts segments trained and reused.

    .venv/bin/python bench/search_suite.py --tasks arith3-weak        # one task (3-5 h on 2 cores: more than a session)
    .venv/bin/python bench/search_suite.py --headroom --tasks vault3   # base, sweep, references only
    .venv/bin/python bench/search_suite.py --transfer --tasks codegen   # leave-one-task-out (after the others)
    .venv/bin/python bench/search_suite.py --merge                    # the report of every finished task

Transfer (`--transfer`, leave one task out): every strategy above runs without a skill
library, so they compare alike; afterwards each task's population searches give a library
(their lineages' outcomes, recorded under their conditions), and a held-out task's
population search runs again from the union of the other tasks' libraries: trials to the
first kept version and the test gain against the same search with an empty library, paired
by replicate. Both run again, beside each other, in OUT/TASK/transfer/ (with the default and
tuned references replayed there): a fresh machine scores other validation and test problems
(the split key is made once per cache) and rebuilds the base in its own floats, so arms
compared must share a machine, and the suite's own population searches may have run on
another. Written to OUT/TASK/transfer/transfer.json.

A finished search, sweep or replay under --out is read back, not redone. The default --out,
results/search-suite, is kept by git (its .gitignore keeps the small records and none of
the checkpoints): commit what finished, and `--merge` reads it on any machine. A task's part
goes on only where the split key its searches were scored under is (the cache's keys/: a fresh
machine makes another, which picks other validation and test problems); elsewhere the bench
refuses to add to it (same_base).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")  # nothing here downloads

import evotrainer  # noqa: E402
from evotrainer.agents import set_knob  # noqa: E402
from evotrainer.catalog import get_task  # noqa: E402
from evotrainer.config import config_from_dict, load_config  # noqa: E402
from evotrainer.evolve.controller import Controller
from evotrainer.evolve.recorder import learn  # noqa: E402
from evotrainer.evolve.search.view import RunView  # noqa: E402
from evotrainer.lineage import LineageStore, TrialRecord  # noqa: E402
from evotrainer.lineage.events import RunStarted  # noqa: E402
from evotrainer.tasks.keys import key_digest, split_key  # noqa: E402
from evotrainer.skills import SkillLibrary  # noqa: E402
from evotrainer.evolve import setup  # noqa: E402
from evotrainer.evolve.segments.retrain import Arm  # noqa: E402
from evotrainer.evolve.segments.cache import SegmentCache  # noqa: E402
from evotrainer.evolve.stats.paired import crossed_t_interval, null_differences, t_interval  # noqa: E402
from evotrainer.harness import REFERENCE  # noqa: E402
from evotrainer.harness.knobs import load_knobs  # noqa: E402
from search_efficiency import _ci, _ms, arm_key, replays  # noqa: E402

SUITE = ROOT / "bench" / "configs" / "suite"
NO_SKILLS = {"skills": None}  # skills are the transfer issue's: every strategy starts without a library
STRATEGIES = {
    "random": {"agent": "random", "search": {"selection": "greedy", "crossover": False, "escalation": False}},
    "greedy": {"agent": "rules", "search": {"selection": "greedy", "crossover": False, "escalation": False}},
    "population": {"agent": "rules", "search": {"selection": "population", "controller": "fixed"}},
    "evolving": {"agent": "rules", "search": {"selection": "population", "controller": "evolving"}},
    # population (fixed controller) starting from the library the other tasks' population
    # searches learned: the leave-one-task-out transfer row (--transfer)
    "transfer": {"agent": "rules", "search": {"selection": "population", "controller": "fixed"}},
}
TRANSFER_FROM = "population"  # whose searches' lineages make a task's library
TRANSFER_DIR = "transfer"       # under a held-out task's folder: both transfer arms, on one machine
SWEEP_SEEDS = [50, 51]  # the tuned reference's sweep: seeds no search and no replay uses
FRESH = 300             # first fresh replay seed


def sweep_recipes(knobs) -> dict[str, dict]:
    """The hand sweep: learning rate x reward x group size, one dict of knob changes each."""
    out = {}
    for lr_name, factor in (("lr0.5", 0.5), ("lr1", 1.0), ("lr2", 2.0)):
        for reward in ("binary", "partial_credit"):
            for g_name, g in (("g1", 1), ("g2", 2)):
                if g == 2 and knobs.prompts_per_step < 2:
                    continue
                change = {"lr": round(knobs.lr * factor, 10), "reward": reward}
                if g == 2:  # equal rollouts per step, as the catalog's larger_groups does
                    change |= {"group_size": knobs.group_size * 2, "prompts_per_step": knobs.prompts_per_step // 2}
                out[f"{lr_name}-{reward}-{g_name}"] = change
    return out


def config(raw: dict, strategy: str, r: int, out: Path) -> dict:
    raw = copy.deepcopy(raw)
    s = STRATEGIES[strategy]
    raw["agent"] = s["agent"]
    raw["seeds"] = [2 * r, 2 * r + 1]
    raw["final_seeds"] = []  # the bench replays every winner itself, on shared fresh seeds
    raw["search"] = {**raw.get("search", {}), **s["search"], **NO_SKILLS}
    raw["cache"] = str(cache_dir(out))  # shared by every search, the sweep and the replays of the task
    return raw


def code_version() -> str:
    """The commit of the evotrainer checkout this bench imports (`+changes` where its src/ differs
    from it), so a record says which code made it; the package version outside a git checkout."""
    src = Path(evotrainer.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", src, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", src, "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return evotrainer.__version__
    return head + ("+changes" if dirty else "")


def cache_dir(out: Path) -> Path:
    return (out / "segment-cache").resolve()


def search(raw: dict, strategy: str, r: int, out: Path) -> dict:
    """One search (or its record, if it finished before)."""
    run = out / f"{strategy}-r{r}"
    done = run / "search.json"
    if done.exists():
        return json.loads(done.read_text())
    if (run / "lineage.sqlite").exists() and not (run / "versions").exists():
        shutil.rmtree(run)  # a search another machine began and did not finish: its checkpoints are not here
    raw = config(raw, strategy, r, out)
    if strategy == "transfer":  # its own copy of the others' library: it learns into it as any run does
        if not (run / "lineage.sqlite").exists():
            run.mkdir(parents=True, exist_ok=True)
            shutil.copy(out / "transfer-library.sqlite", run / "skills.sqlite")
        raw["search"]["skills"] = str((run / "skills.sqlite").resolve())
    cfg = config_from_dict(raw).validate()
    t = time.time()
    ctl = Controller(cfg, run, on_event=lambda e: isinstance(e, TrialRecord) and print(
        f"    {strategy} r{r} trial {e.id}: {e.intervention} {e.label}", flush=True))
    ctl.run()
    label, versions, arm = ctl.winner_schedule()
    trials = ctl.store.trials()
    by_version = {t.version: t for t in trials if t.version}
    # harness paths relative to the task's folder: the records are committed (results/) and
    # read back on another machine, under another checkout path
    rec = {"strategy": strategy, "replicate": r, "code": code_version(), "seeds": cfg.seeds, "winner": label,
           "holds": holds(by_version, versions[-1]), "harnesses": [os.path.relpath(h, out) for h in arm.harnesses],
           "steps": arm.steps,
           "base": ctl.base, "seconds": round(time.time() - t),
           "first_kept": next((t.id for t in trials if t.parents and t.label == "kept"), None),
           "trials": [{"id": t.id, "intervention": t.intervention, "label": t.label, "parents": t.parents,
                       "gain": t.fitness.gain} for t in trials],
           "segments": segment_counts(trials)}
    done.write_text(json.dumps(rec, indent=2))
    return rec


def library(task_out: Path) -> Path | None:
    """The skill library a task's TRANSFER_FROM searches would have learned (they ran without
    one, so the strategies compare alike): every agent trial's outcome, recorded from their
    lineages under their runs' conditions (controller.learn). None: no such search finished."""
    runs = sorted(d.parent for d in task_out.glob(f"{TRANSFER_FROM}-r*/search.json"))
    if not runs:
        return None
    path = task_out / f"library-{TRANSFER_FROM}.sqlite"
    lib = SkillLibrary(path)
    try:
        for run in runs:
            cfg = load_config(run / "config.yaml")
            store = LineageStore(run / "lineage.sqlite")
            try:
                view = RunView.read(store)
            finally:
                store.close()
            learn(lib, run, cfg, level=get_task(cfg.task, cfg.level).target_level,
                  reference_acc=view.reference_acc, done=view.planned)
    finally:
        lib.close()
    return path


def transfer_library(out: Path, held_out: str) -> list[str]:
    """OUT/HELD_OUT/transfer/transfer-library.sqlite: the union of every other task's library
    (the leave-one-task-out library); the tasks it learned from."""
    target = out / held_out / TRANSFER_DIR / "transfer-library.sqlite"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    union, sources = SkillLibrary(target), []
    try:
        for d in sorted(x for x in out.iterdir() if x.is_dir() and x.name != held_out):
            lib = library(d)
            if lib is not None:
                union.absorb(lib)
                sources.append(d.name)
    finally:
        union.close()
    return sources


def holds(by_version: dict, version: str) -> list[str]:
    """The changes a version holds: its own move and its ancestors' (both sides of a crossover)."""
    t = by_version.get(version)
    if t is None or not t.parents:
        return []
    own = [] if t.intervention == "crossover" else [t.intervention]
    return sorted(set(own).union(*(holds(by_version, p) for p in t.parents)))


def segment_counts(trials) -> dict[str, int]:
    """Segments trained and reused from the cache over a search's trials."""
    out = {"trained": 0, "reused": 0}
    for t in trials:
        for k in out:
            out[k] += int(t.budgets.get(f"segments_{k}", 0))
    return out


def tuned(raw: dict, root: Path, base: str, out: Path) -> tuple[str, Arm, dict]:
    """The tuned reference: every sweep recipe from the base on the sweep seeds; the best by
    mean validation accuracy."""
    cfg = config_from_dict(config(raw, "greedy", 0, out)).validate()
    knobs_text = (root / "knobs.yaml").read_text()
    recipes = sweep_recipes(load_knobs(root / "knobs.yaml"))
    arms = {}
    for name, change in recipes.items():
        d = out / "sweep" / "harnesses" / name
        if not d.exists():
            d.mkdir(parents=True)
            for f in root.iterdir():
                if f.is_file():
                    (d / f.name).write_bytes(f.read_bytes())
            text = knobs_text
            for k, v in change.items():
                text = set_knob(text, k, v)
            (d / "knobs.yaml").write_text(text)
        arms[name] = Arm((str(d),), cfg.budget.total_steps)
    scores = replays(cfg, arms, base, SWEEP_SEEDS, out / "sweep", SegmentCache(cache_dir(out)))
    val = {name: statistics.fmean(scores[name][s]["val"] for s in SWEEP_SEEDS) for name in arms}
    best = max(val, key=lambda n: (val[n], n))
    return best, arms[best], val


def landscape(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Every trained trial's gain over its control, by move, over all searches of a task."""
    by_move: dict[str, list[tuple[float, str]]] = {}
    for recs in runs.values():
        for rec in recs:
            for t in rec["trials"]:
                if t["parents"] and t["gain"] is not None:
                    by_move.setdefault(t["intervention"], []).append((t["gain"], t["label"]))
    return {m: {"n": len(v), "mean_gain": statistics.fmean(g for g, _ in v), "best_gain": max(g for g, _ in v),
                "kept": sum(1 for _, lab in v if lab == "kept")} for m, v in sorted(by_move.items())}


def noise(runs: dict[str, list[dict]], out: Path) -> list[float]:
    """The null differences of the task's searches (each root's noise replicas minus the root,
    seed by seed: what a trial's gain per seed is when nothing changed), once per replicate:
    every strategy's root of a replicate is the same segments, trained once."""
    diffs = []
    for r in range(max((len(recs) for recs in runs.values()), default=0)):
        db = next((d for s in runs if (d := out / f"{s}-r{r}" / "lineage.sqlite").exists()), None)
        if db is None:
            continue
        store = LineageStore(db)
        try:
            root = store.trials()[0].fitness
        finally:
            store.close()
        diffs += null_differences(root.val, root.replicas)
    return [round(d, 6) for d in diffs]


def bench_task(config_path: Path, strategies: list[str], replicates: int, seeds: list[int], out: Path,
               transfer_from: list[str] | None = None) -> dict:
    raw = yaml.safe_load(config_path.read_text())
    task = out / config_path.stem
    out = task if transfer_from is None else task / TRANSFER_DIR
    runs = {s: [] for s in strategies}
    cfg = config_from_dict(config(raw, "greedy", 0, out)).validate()
    base = same_base(cfg, out)  # before anything runs here: records made elsewhere must match
    for r in range(replicates):  # replicate by replicate, so a bench cut short leaves paired searches
        for s in strategies:
            runs[s].append(search(raw, s, r, out))
    root = out / f"{strategies[0]}-r0" / "harnesses" / "v0"
    if transfer_from is None:
        tuned_name, tuned_arm, sweep_val = tuned(raw, root, base, out)
    else:  # the suite's sweep chose it; replayed here, on this machine's base, beside both arms
        chosen = json.loads((task / "result.json").read_text())["tuned"]
        tuned_name, sweep_val = chosen["recipe"], chosen["sweep_val"]
        tuned_arm = Arm((str(task / "sweep" / "harnesses" / tuned_name),), cfg.budget.total_steps)
    arms = {"default": Arm((str(root),), cfg.budget.total_steps), "tuned": tuned_arm}
    for rec in (rec for s in strategies for rec in runs[s]):
        harnesses = [str(out / h) for h in rec["harnesses"]]  # an absolute path stays itself
        rec["arm"] = arm_key(harnesses, rec["steps"])
        arms.setdefault(rec["arm"], Arm(tuple(harnesses), rec["steps"]))
    scores = replays(cfg, arms, base, seeds, out, SegmentCache(cache_dir(out)))
    result = {"config": config_path.stem, "task": f"{cfg.task} level {cfg.level}", "trials": cfg.budget.trials,
              "total_steps": cfg.budget.total_steps, "seeds": seeds, "runs": runs, "scores": scores,
              "tuned": {"recipe": tuned_name, "sweep_val": sweep_val}, "landscape": landscape(runs),
              "noise": noise(runs, out)}
    if transfer_from is not None:  # the transfer rows: a result of their own beside the suite's
        result["transfer_from"] = transfer_from
    (out / ("result.json" if transfer_from is None else "transfer.json")).write_text(json.dumps(result, indent=2))
    return result


def same_base(cfg, out: Path) -> str:
    """The base the task's searches start from, built or read from the base cache. Every search
    already recorded under `out` must have started from it (its cache key) and been scored under
    this machine's split key: which held-out problems are validation and test follows a random
    key made once per cache (tasks/keys.py), so another machine's records were scored on other
    problems, and searches or replays added here would not compare with them."""
    base = setup.base_checkpoint(cfg, get_task(cfg.task, cfg.level), None, lambda event: None)
    here = key_digest(split_key(Path(base).name))
    for done in sorted(out.glob("*-r*/search.json")):
        recorded = json.loads(done.read_text())["base"]
        if Path(recorded).name != Path(base).name:
            raise SystemExit(f"error: {done.parent} recorded base {Path(recorded).name}, this config builds "
                             f"{Path(base).name}; run the task's searches again under a new --out")
        store = LineageStore(done.parent / "lineage.sqlite")
        try:
            key = store.events(RunStarted)[0].split_key_digest
        finally:
            store.close()
        if key != here:
            raise SystemExit(f"error: {done.parent} was scored under split key {key}, this machine's is {here} "
                             f"(another machine's cache): read finished tasks with --merge, or run this one again "
                             f"under a new --out")
    return base


def headroom(config_path: Path, seeds: list[int], out: Path) -> str:
    """Before a task's searches: its base, the sweep, and the default and tuned recipes on the
    fresh seeds. Whether the task has room (tuned vs default, and the sweep's spread) at a
    fraction of the searches' cost; everything it trains the full bench reads back."""
    raw = yaml.safe_load(config_path.read_text())
    out = out / config_path.stem
    cfg = config_from_dict(config(raw, "greedy", 0, out)).validate()
    task = get_task(cfg.task, cfg.level)
    base = setup.base_checkpoint(cfg, task, None, lambda event: None)
    root = Path(cfg.harness or REFERENCE)
    name, arm, val = tuned(raw, root, base, out)
    scores = replays(cfg, {"default": Arm((str(root),), cfg.budget.total_steps), "tuned": arm}, base, seeds, out,
                     SegmentCache(cache_dir(out)))
    test = {k: [scores[k][s]["test"] for s in seeds] for k in ("default", "tuned")}
    lines = [f"## {config_path.stem}: headroom ({cfg.task} level {cfg.level}, {cfg.budget.total_steps} steps)", "",
             "Sweep, mean validation accuracy % on seeds " + ", ".join(map(str, SWEEP_SEEDS)) + ":", "",
             "| recipe | val % |", "|---|---|"]
    lines += [f"| {n}{' (tuned)' if n == name else ''} | {100 * v:.1f} |" for n, v in sorted(val.items(), key=lambda x: -x[1])]
    lines += ["", f"On {len(seeds)} fresh seeds, test %: default {_ms([100 * x for x in test['default']])}, "
                  f"tuned {_ms([100 * x for x in test['tuned']])}; tuned − default "
                  f"{_ci([[a - b for a, b in zip(test['tuned'], test['default'])]])}"]
    return "\n".join(lines)


def _test(result: dict, arm: str) -> list[float]:
    return [result["scores"][arm][str(s) if str(s) in result["scores"][arm] else s]["test"] for s in result["seeds"]]


def gains(result: dict, strategy: str, against: list[float]) -> list[list[float]]:
    """Winner minus a reference on each fresh seed, one row per replicate."""
    return [[a - b for a, b in zip(_test(result, rec["arm"]), against)] for rec in result["runs"][strategy]]


def paired(result: dict, a: str, b: str) -> list[list[float]]:
    """Strategy a's winner minus b's on each fresh seed, paired by replicate (none where either
    did not run)."""
    if a not in result["runs"] or b not in result["runs"]:
        return []
    return [[x - y for x, y in zip(_test(result, ra["arm"]), _test(result, rb["arm"]))]
            for ra, rb in zip(result["runs"][a], result["runs"][b])]


def first_kept(result: dict, strategy: str) -> list[int]:
    """Each replicate's trials to its first kept version; one that kept nothing counts as the
    budget plus one (censored: it would have taken more)."""
    return [rec["first_kept"] if rec["first_kept"] is not None else result["trials"] + 1
            for rec in result["runs"][strategy]]


def first_kept_gap(result: dict) -> tuple[list[int], list[int], str]:
    """Trials to the first kept version with the library and without it, by replicate, and
    with − without: its mean and 95% t interval over replicates."""
    with_, without = first_kept(result, "transfer"), first_kept(result, TRANSFER_FROM)
    lo, hi = t_interval([a - b for a, b in zip(with_, without)])
    return with_, without, f"{statistics.fmean(with_) - statistics.fmean(without):+.1f} [{lo:+.1f}, {hi:+.1f}]"


def table(result: dict) -> str:
    default, tuned_ = _test(result, "default"), _test(result, "tuned")
    strategies = list(result["runs"])
    reps = len(result["runs"][strategies[0]])
    held_out = " held out (transfer)" if "transfer_from" in result else ""  # the task's second section
    lines = [f"## {result['config']}{held_out}: {result['task']}, {result['trials']} trials, {result['total_steps']} steps; "
             f"{reps} search replicates x {len(result['seeds'])} fresh seeds", "",
             f"Test accuracy % of each winner replayed from the base (mean ± sd over replicates; references over "
             f"seeds). Tuned reference: `{result['tuned']['recipe']}`, the best of {len(result['tuned']['sweep_val'])} "
             f"swept recipes on 2 sweep seeds. Gains: mean and 95% t interval over replicates and seeds (both "
             "random; the seeds shared).", "",
             "| strategy | test % | − default | − tuned | trials to first kept | winners hold | segments trained / reused |",
             "|---|---|---|---|---|---|---|",
             f"| default | {_ms([100 * x for x in default])} | – | {_ci([[a - b for a, b in zip(default, tuned_)]])} "
             "| – | – | – |",
             f"| tuned | {_ms([100 * x for x in tuned_])} | {_ci([[a - b for a, b in zip(tuned_, default)]])} | – "
             "| – | – | – |"]
    for s in strategies:
        recs = result["runs"][s]
        test = [100 * statistics.fmean(_test(result, rec["arm"])) for rec in recs]
        kept = ", ".join(str(rec["first_kept"]) if rec["first_kept"] is not None else "none" for rec in recs)
        hold = "; ".join(" + ".join(rec["holds"]) or "root" for rec in recs)
        seg = (sum(rec["segments"]["trained"] for rec in recs), sum(rec["segments"]["reused"] for rec in recs))
        lines.append(f"| {s} | {_ms(test)} | {_ci(gains(result, s, default))} | {_ci(gains(result, s, tuned_))} "
                     f"| {kept} | {hold} | {seg[0]} / {seg[1]} |")
    if rows := paired(result, "transfer", TRANSFER_FROM):
        lines += ["", f"Transfer (the library of {', '.join(result.get('transfer_from', [])) or '?'}) − an empty "
                      f"library ({TRANSFER_FROM}), paired by replicate and seed: {_ci(rows)} test points."]
        with_, without, gap = first_kept_gap(result)
        lines += [f"Trials to the first kept version, with the library {with_} and without {without} (by replicate; "
                  f"none kept counts as {result['trials'] + 1}): with − without {gap} "
                  f"(95% t interval over {len(with_)} replicates)."]
    if rows := paired(result, "evolving", "greedy"):
        lines += ["", f"Evolving controller − greedy, paired by replicate and seed: {_ci(rows)} test points."]
    lines += ["", "Landscape (every trained trial's gain over its control, validation points):", ""]
    if len(result.get("noise", [])) > 1:
        sd = 100 * statistics.fmean(d * d for d in result["noise"]) ** 0.5  # a null difference has mean 0
        pairs = len(next(iter(result["runs"].values()))[0]["seeds"])  # a trial's first look: the search seeds
        lines += [f"Noise: a change that does nothing gains 0 ± {sd:.1f} per seed (root mean square of "
                  f"{len(result['noise'])} null differences: the roots' noise replicas minus the roots). A trial's "
                  f"first look, over {pairs} seeds, then falls within ±{2 * sd / pairs ** 0.5:.1f} of zero roughly "
                  "19 times in 20; trials judged against one control share its draw, so their gains move together.",
                  ""]
    lines += ["| move | tried | mean gain | best gain | kept |", "|---|---|---|---|---|"]
    for move, v in result["landscape"].items():
        lines.append(f"| {move} | {v['n']} | {100 * v['mean_gain']:+.1f} | {100 * v['best_gain']:+.1f} | {v['kept']} |")
    return "\n".join(lines)


def summary(results: list[dict]) -> str:
    """Across tasks: each task's best strategy against both references, and what the winners
    of every search hold (the kept changes per task: do the harnesses differ by domain?)."""
    lines = ["## Across tasks", "",
             "| task | best strategy | − default | − tuned | beats default | evolving − greedy | winners hold (searches) |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        default, tuned_ = _test(r, "default"), _test(r, "tuned")
        searched = [s for s in r["runs"] if s != "transfer"]
        mean = {s: round(statistics.fmean(x for row in gains(r, s, default) for x in row), 9) for s in searched}
        best = max(searched, key=mean.get)
        name = "all tie" if len(set(mean.values())) == 1 else best
        lo, _ = crossed_t_interval(gains(r, best, default))
        holds: dict[str, int] = {}
        for s in searched:
            for rec in r["runs"][s]:
                for change in rec["holds"] or ["root"]:
                    holds[change] = holds.get(change, 0) + 1
        n = sum(len(r["runs"][s]) for s in searched)
        held = ", ".join(f"{c} ({k} of {n})" for c, k in sorted(holds.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"| {r['config']} | {name} | {_ci(gains(r, best, default))} | {_ci(gains(r, best, tuned_))} "
                     f"| {'yes' if lo > 0 else 'no'} | {_ci(eg) if (eg := paired(r, 'evolving', 'greedy')) else '–'} | {held} |")
    return "\n".join(lines)


def transfer_summary(results: list[dict], task_of: dict[str, str]) -> str:
    """Leave one task out, per held-out task: the library of the others against an empty one
    (the same population search, paired by replicate), in test points and trials to the first
    kept version. A source config of the same task (another base: arith3-weak and -strong)
    is named, starred: its outcomes count fully there, but for the accuracy band."""
    lines = ["## Transfer: leave one task out", "",
             "| held-out task | library from (* the same task) | test: with − without | first kept with | without "
             "| with − without |", "|---|---|---|---|---|---|"]
    for r in results:
        with_, without, gap = first_kept_gap(r)
        sources = ", ".join(c + ("*" if task_of.get(c) == r["task"] else "") for c in r["transfer_from"])
        lines.append(f"| {r['config']} | {sources} | {_ci(paired(r, 'transfer', TRANSFER_FROM))} "
                     f"| {with_} | {without} | {gap} |")
    return "\n".join(lines + ["", "Trials to the first kept version by replicate; none kept counts as the budget "
                                  "plus one. Intervals: 95% t over replicates (and fresh seeds for test)."])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=sorted(c.stem for c in SUITE.glob("*.yaml")),
                   help="suite configs (names under bench/configs/suite, or paths)")
    p.add_argument("--strategies", nargs="+", default=[s for s in STRATEGIES if s != "transfer"],
                   choices=[s for s in STRATEGIES if s != "transfer"])
    p.add_argument("--replicates", type=int, default=3, help="searches per strategy, on different search seeds")
    p.add_argument("--seeds", type=int, default=5, help="fresh seeds every winner and reference is replayed on")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "search-suite",
                   help="where records go; the default is committed (its .gitignore keeps the small records: "
                        "searches, harnesses, scores), so a finished task outlives its machine")
    p.add_argument("--merge", action="store_true", help="only print the report of the tasks finished under --out")
    p.add_argument("--transfer", action="store_true",
                   help=f"leave-one-task-out: each task's {TRANSFER_FROM} search from the library the other tasks' "
                        f"{TRANSFER_FROM} searches learned, beside the same search with an empty library, both run "
                        f"here (in TASK/{TRANSFER_DIR}/; after the suite's part of the task ran)")
    p.add_argument("--headroom", action="store_true",
                   help="only each task's base, sweep and references on the fresh seeds (read back by the full bench)")
    args = p.parse_args()
    import transformers
    transformers.logging.disable_progress_bar()  # the bench prints its own lines
    seeds = list(range(FRESH, FRESH + args.seeds))
    if args.headroom:
        for name in args.tasks:
            path = Path(name) if name.endswith(".yaml") else SUITE / f"{name}.yaml"
            print(headroom(path, seeds, args.out) + "\n", flush=True)
        return
    if args.transfer:
        for name in args.tasks:
            path = Path(name) if name.endswith(".yaml") else SUITE / f"{name}.yaml"
            sources = transfer_library(args.out, path.stem)
            print(f"# {path.stem}: transfer from {', '.join(sources) or 'nothing'}", flush=True)
            result = bench_task(path, [TRANSFER_FROM, "transfer"], args.replicates, seeds, args.out, sources)
            print("\n" + table(result) + "\n", flush=True)
        return
    if not args.merge:
        for name in args.tasks:
            path = Path(name) if name.endswith(".yaml") else SUITE / f"{name}.yaml"
            print(f"# {path.stem}: {', '.join(args.strategies)}", flush=True)
            print("\n" + table(bench_task(path, args.strategies, args.replicates, seeds, args.out)) + "\n", flush=True)
    results = [json.loads(f.read_text()) for f in sorted([*args.out.glob("*/result.json"), *args.out.glob(f"*/{TRANSFER_DIR}/transfer.json")])]
    suite = [r for r in results if "transfer_from" not in r]
    transfers = [r for r in results if "transfer_from" in r]
    report = ("# Search suite\n\n" + (summary(suite) + "\n\n" if suite else "")
              + (transfer_summary(transfers, {r["config"]: r["task"] for r in suite}) + "\n\n" if transfers else "")
              + "\n\n".join(table(r) for r in results) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
