"""Search strategies judged on landscape tables (evolve/simulate.py): hundreds of replicates per
task and strategy, in minutes instead of days.

    .venv/bin/python bench/simulate.py arith3-weak --trials 8 16
    .venv/bin/python bench/simulate.py arith3-weak --fill      # train what the table lacks (this
                                                             # machine must hold the table's base)
    .venv/bin/python bench/simulate.py chain_sum-weak --real 3 --trials 8   # out of the box for real
    .venv/bin/python bench/simulate.py codegen-weak --confirm --replicates 200   # confirm before naming a winner

Each replicate runs the real controller, agents, population and gate against the table
results/landscape/TASK/ (bench/landscape.py builds it), on two seeds of the table's pool
drawn by the replicate's number (the same draws for every strategy: gains pair). A winner is
scored by its row's test accuracy on the pool seeds the search did not train on, against the
root's (the default recipe) and the tuned recipe's (the sweep recipe with the best mean
validation accuracy over the whole pool: what a careful engineer's full sweep would pick).

Intervals: 95% t over the distinct seed draws (a pool of 6 seeds gives 30 ordered pairs), the
replicates of one draw averaged first: beyond the first 30 a replicate gives the search its own
seed (`search.seed`), so strategies that draw (random, population) explore anew on a repeated
draw, while the rules agent's greedy search repeats itself.

The sweep at equal cost: `trials` recipes of the hand sweep (bench/search_suite.SWEEP: lr x
reward x group size), in an order drawn per replicate, each on the run's two seeds; the best
mean validation accuracy, the root's included, wins.

Records: results/simulate/TASK.json (every replicate, by strategy and budget, written as
each finishes: a stopped simulation goes on from them) and TASK.md (the table); a fill's
in TASK-fill.json/md, the real runs' in TASK-real.json/md and TASK-real/ (each search, with
its winner's harness files). --real needs no table: before one is built it reads the first look
(bench/landscape.py TASK --headroom) for the root and the tuned recipe, chosen on its 3 seeds.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from evotrainer.evolve.landscape import ROWS  # noqa: E402
from evotrainer.evolve.simulate import Replicate, Table, draw, simulate  # noqa: E402
from evotrainer.evolve.segments.retrain import Arm, retrain  # noqa: E402
from evotrainer.evolve.stats.paired import crossed_t_interval, paired_differences, t_interval  # noqa: E402
from landscape import FRESH, OUT as TABLES, SWEPT, trainer, tuned_recipe  # noqa: E402
from search_suite import STRATEGIES  # noqa: E402

OUT = ROOT / "results" / "simulate"
# a simulated run's lineage and harness repository are thrown away after it: in memory, their
# commits skip the disk's syncs (a sixth of a replicate's time on this machine)
SCRATCH = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
RUN = {k: STRATEGIES[k] for k in ("random", "greedy", "population", "evolving")} | {
    "out-of-the-box": {"agent": "rules", "search": {}},  # `evotrainer run` with no search: keys
}


def sweep(table: Table, replicates: int, trials: int) -> list[Replicate]:
    """The hand sweep at equal cost (see the module's docstring)."""
    recipes = sorted(n for n, r in table.rows.items() if r.kind == "sweep" and r.val)
    moves = {n: r for n, r in table.rows.items() if r.kind == "move" and r.val}
    # the sweep's recipes that a move makes too are trained as that move: in the sweep by the move's row
    pool = recipes + [n for n in SWEPT if n in moves]
    out = []
    for r in range(replicates):
        seeds = draw(table.seeds, r)
        tried = random.Random(1000 + r).sample(pool, min(trials, len(pool)))
        best = max(["root", *tried], key=lambda n: statistics.fmean(table.rows[n].val[s] for s in seeds))
        out.append(_scored(table, "sweep", r, seeds, table.rows[best].name, tuple(table.rows[best].moves), None, ()))
    return out


def with_settings(table: Table, settings: dict[str, object]) -> Table:
    """The table with every search run under `settings` ("promotion.alpha" -> 0.1) over its config."""
    for dotted, value in settings.items():
        section, key = dotted.split(".", 1)
        table.config = {**table.config, section: {**table.config.get(section, {}), key: value}}
    return table


def strategy_cell(task: str, replicates: int, cell: tuple[str, int], table: Table | None = None,
                  settings: dict | None = None) -> tuple[list[Replicate], float, tuple[int, int]]:
    """One strategy at one budget, all its replicates, their seconds, and the versions the
    table lacked (predicted, missed). In a process of its own (--jobs > 1) it loads the table."""
    name, trials = cell
    if table is None:
        table = with_settings(Table.load(TABLES / task), settings or {})
    t, before = time.time(), (table.predicted, table.misses)
    reps = sweep(table, replicates, trials) if name == "sweep" else \
        simulate(table, {**RUN[name], "name": name}, replicates=replicates, trials=trials, workdir=SCRATCH)
    return reps, time.time() - t, (table.predicted - before[0], table.misses - before[1])


def _scored(table: Table, strategy: str, r: int, seeds, winner: str, holds, first, labels) -> Replicate:
    fresh = tuple(s for s in table.seeds if s not in seeds)
    gain = statistics.fmean(100 * (table.rows[winner].test[s] - table.root.test[s]) for s in fresh)
    return Replicate(strategy, r, seeds, winner, holds, gain, first, labels, fresh=fresh)


def by_draw(reps: list[Replicate], value) -> list[float]:
    """One value per distinct seed draw: the mean over the replicates that drew it."""
    groups: dict[tuple, list[float]] = {}
    for r in reps:
        groups.setdefault(r.seeds, []).append(value(r))
    return [statistics.fmean(v) for v in groups.values()]


def ci(xs: list[float]) -> str:
    m = statistics.fmean(xs)
    if len(set(xs)) == 1:
        return f"{m:+.1f} [{m:+.1f}, {m:+.1f}]"
    lo, hi = t_interval(xs)
    return f"{m:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def report(task: str, table: Table, results: dict[tuple[str, int], list[Replicate]], lacked: list[int]) -> str:
    best_tuned = tuned_recipe(table.rows)

    def gain_on(row: str, r: Replicate) -> float:
        """The row's test gain over the root on the seeds replicate r is scored on."""
        return statistics.fmean(100 * (table.rows[row].test[s] - table.root.test[s]) for s in r.fresh)

    def vs_tuned(r: Replicate) -> float:
        return r.gain - gain_on(best_tuned, r)
    top = max((r for r in table.rows.values() if r.val and r.kind != "replica"),
              key=lambda r: statistics.fmean(r.test.values()))
    top_gain = 100 * (statistics.fmean(top.test.values()) - statistics.fmean(table.root.test.values()))
    lines = [f"## {task}: {len(table.rows)} rows, seeds {table.seeds}", "",
             f"Tuned recipe: `{best_tuned}`; the table's best test entry: `{top.name}` "
             f"({top_gain:+.1f} test points over the root on the whole pool).", "",
             "| strategy | trials | replicates (draws) | test − default | − tuned | winners (most common) | "
             "first kept (median) |", "|---|---|---|---|---|---|---|"]
    for (name, trials), reps in results.items():
        winners: dict[str, int] = {}
        for r in reps:
            winners[r.winner] = winners.get(r.winner, 0) + 1
        common = ", ".join(f"{w} ({n})" for w, n in sorted(winners.items(), key=lambda kv: -kv[1])[:3])
        firsts = [r.first_kept for r in reps if r.first_kept is not None]
        first = f"{statistics.median(firsts):g} ({len(firsts)} of {len(reps)})" if firsts else "none"
        lines.append(f"| {name} | {trials} | {len(reps)} ({len({r.seeds for r in reps})}) | "
                     f"{ci(by_draw(reps, lambda r: r.gain))} | {ci(by_draw(reps, vs_tuned))} | {common} | {first} |")
    lines += ["", f"Versions the table lacked: {table.filled} trained and added, {lacked[0]} predicted "
              f"as their best move, {lacked[1]} misses."]
    return "\n".join(lines + versus(results, top_gain, lambda r: gain_on(top.name, r)))


def versus(results: dict[tuple[str, int], list[Replicate]], top_gain: float, top_on: Callable[[Replicate], float],
           ours: str = "out-of-the-box") -> list[str]:
    """The out-of-the-box strategy against every other at each budget: test gain paired by
    replicate (the same seed draws), averaged per draw, 95% t over draws; and the share of the
    gap between the default and the table's best entry it recovers, the gap measured on the
    seeds each replicate is scored on (top_on), as its gain is: a pool's seeds differ, and
    which of them a search leaves for scoring depends on its gate."""
    budgets = sorted({t for n, t in results if n == ours})
    others = list(dict.fromkeys(n for n, _ in results if n != ours))  # in the record's order, once each
    if not budgets or not others:
        return []
    lines = ["", f"{ours} against each strategy, test points paired by replicate (95% t over seed draws); "
             f"the share of the gap to the table's best entry ({top_gain:+.1f} on the whole pool) it recovers "
             f"(mean gain over mean gap, both on the seeds each replicate is scored on):",
             "", "| trials | " + " | ".join(f"− {n}" for n in others) + " | gap recovered |",
             "|---|" + "---|" * (len(others) + 1)]
    for t in budgets:
        mine = {r.replicate: r for r in results[(ours, t)]}
        cells = []
        for n in others:
            theirs = {r.replicate: r for r in results.get((n, t), [])}
            pairs = [replace(mine[k], gain=mine[k].gain - theirs[k].gain) for k in mine if k in theirs]
            cells.append(ci(by_draw(pairs, lambda r: r.gain)) if pairs else "–")
        gap = statistics.fmean(top_on(r) for r in mine.values())
        share = statistics.fmean(r.gain for r in mine.values()) / gap if gap > 0 else float("nan")
        lines.append(f"| {t} | " + " | ".join(cells) + f" | {100 * share:.0f}% |")
    return lines


def real(task: str, table: Table, name: str, seeds: tuple[int, ...], trials: int) -> dict:
    """The same search for real: the controller trains (reusing the table's segment cache, so
    what the table holds is not trained again) and the evaluator scores; its record is kept in
    OUT/TASK-real/NAME-TRIALS-SEEDS.json, with the winner's harness files beside it, and read
    back, not redone. The winner is named by its table row, or `reached-KEY` where the table
    lacks it (the name a fill gives it)."""
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller
    from evotrainer.evolve.landscape import content_key
    stem = f"{name}-{trials}-{'-'.join(map(str, seeds))}"
    done = OUT / f"{task}-real" / f"{stem}.json"
    if done.exists():
        return json.loads(done.read_text())
    strategy = RUN[name]
    raw = {**table.config, "agent": strategy["agent"], "seeds": list(seeds), "final_seeds": [],
           "cache": str((TABLES / task / "segment-cache").resolve()), "harness": str(table.root_dir)}
    raw["search"] = {**raw.get("search", {}), **strategy["search"], "skills": None}
    raw["budget"] = {**raw["budget"], "trials": trials}
    run_dir = OUT / "runs" / f"{task}-{stem}"  # not kept by git
    t = time.time()
    ctl = Controller(config_from_dict(raw).validate(), run_dir)
    ctl.run()
    label, versions, _ = ctl.winner_schedule()
    harness = ctl.harnesses.dir(versions[-1])
    key = content_key(harness)
    row = table.by_key.get(key)
    trials_done = [t for t in ctl.store.trials() if t.parents]
    made = {t.version: t for t in trials_done if t.version}
    moves, v = [], versions[-1]
    while v in made:  # the winner's path from the root, first move first
        moves.insert(0, made[v].intervention)
        v = made[v].parents[0]
    kept = done.parent / stem
    done.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(harness, kept, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    rec = {"strategy": name, "seeds": list(seeds), "trials": trials, "winner": row.name if row else f"reached-{key}",
           "version": label, "moves": moves, "harness": kept.name, "seconds": round(time.time() - t),
           "labels": [t.label for t in trials_done], "interventions": [t.intervention for t in trials_done],
           "first_kept": next((t.id for t in trials_done if t.label == "kept"), None)}
    done.write_text(json.dumps(rec, indent=2) + "\n")
    return rec


def validate(task: str, table: Table, names: list[str], draws: int, trials: int) -> str:
    """Real searches beside simulated ones on the same seed draws: trial by trial, and winners."""
    lines = [f"## {task}: real vs simulated searches ({trials} trials)", "",
             "| strategy | seeds | winner, real | winner, simulated | first kept (real, sim) | "
             "trials alike (intervention and label) |", "|---|---|---|---|---|---|"]
    for name in names:
        sims = simulate(table, {**RUN[name], "name": name}, replicates=draws, trials=trials)
        for sim in sims:
            rec = real(task, table, name, sim.seeds, trials)
            sim_moves = list(sim.interventions)
            alike = sum(1 for a, b, la, lb in zip(rec["interventions"], sim_moves, rec["labels"], sim.labels)
                        if a == b and la == lb)
            lines.append(f"| {name} | {list(sim.seeds)} | {rec['winner']} | {sim.winner} | "
                         f"{rec['first_kept']}, {sim.first_kept} | {alike} of {len(rec['labels'])} |")
    return "\n".join(lines)


def real_runs(task: str, table: Table, replicates: int, trials: int, fresh: list[int]) -> tuple[str, dict]:
    """The out-of-the-box strategy for real, as a user runs it: `replicates` searches of
    `trials` trials on disjoint seed pairs of the pool ((0, 1), (2, 3), ...), then each winner,
    the default recipe (the root) and the tuned one (the sweep's best by validation on the
    pool) retrained from the base on `fresh` seeds no search saw (the segment cache reuses what
    --fresh trained). Test gains are paired by fresh seed; the interval over replicates and
    seeds is crossed (both random: every winner is replayed on the same seeds)."""
    recs = [real(task, table, "out-of-the-box", (2 * r, 2 * r + 1), trials) for r in range(replicates)]
    _, training, _ = trainer(task)
    steps, best_tuned = training.cfg.budget.total_steps, tuned_recipe(table.rows)
    arms = {"root": Arm((str(table.root_dir),), steps),
            best_tuned: Arm((str(table.root_dir.parent / best_tuned),), steps)}
    for rec in recs:  # one arm per distinct winner: a winner two searches share trains once
        arms.setdefault(rec["winner"], Arm((str(OUT / f"{task}-real" / rec["harness"]),), steps))
    rep = retrain(training.task, training.base, arms, fresh, TABLES / task / "fresh", evaluation=training.cfg.evaluation,
                  timeout_s=training.cfg.budget.trial_timeout_s, workers=2, runtime=training.runtime,
                  cache=training.cache)
    test = {n: {s: 100 * rep.scores[n][s]["test"] for s in fresh} for n in arms}
    lines = [f"## {task}: the out-of-the-box strategy for real ({replicates} searches of {trials} trials; "
             f"winners retrained on fresh seeds {fresh[0]}-{fresh[-1]}; test %)", "",
             "| search seeds | winner | its changes | trials kept | first kept | seconds | test % | − default | "
             "− tuned |", "|---|---|---|---|---|---|---|---|---|"]
    for rec in recs:
        w = test[rec["winner"]]
        kept = [i for i, lab in zip(rec["interventions"], rec["labels"]) if lab == "kept"]
        lines.append(f"| {rec['seeds']} | {rec['winner']} | {', '.join(rec['moves']) or '(the root)'} | "
                     f"{', '.join(kept) or 'none'} | {rec['first_kept'] or '–'} | {rec['seconds']} | "
                     f"{statistics.fmean(w.values()):.1f} | {ci(paired_differences(w, test['root']))} | "
                     f"{ci(paired_differences(w, test[best_tuned]))} |")
    summary = {}
    for ref in ("root", best_tuned):
        diffs = [paired_differences(test[rec["winner"]], test[ref]) for rec in recs]
        lo, hi = crossed_t_interval(diffs)
        summary[ref] = (statistics.fmean(map(statistics.fmean, diffs)), lo, hi)
    lines += ["", f"Default (root) {statistics.fmean(test['root'].values()):.1f}%, tuned ({best_tuned}) "
              f"{statistics.fmean(test[best_tuned].values()):.1f}%. Out of the box − default: "
              "{0:+.1f} [{1:+.1f}, {2:+.1f}]; − tuned: {3:+.1f} [{4:+.1f}, {5:+.1f}] "
              "(crossed over searches and seeds).".format(*summary["root"], *summary[best_tuned])]
    return "\n".join(lines), {"fresh": fresh, "tuned": best_tuned, "searches": recs, "test": test,
                              "minus_default": summary["root"], "minus_tuned": summary[best_tuned]}


def transfer(task: str, table: Table, sources: list[str], replicates: int, budgets: list[int],
             source_trials: int = 8) -> tuple[str, dict]:
    """The skill library's transfer to a held-out task: out-of-the-box searches on every source
    table (`replicates` each, `source_trials` trials, recording into one library), then the
    held-out task's searches at each small budget with that library and without it, on the same
    seed draws (paired). Each held-out replicate reads a copy of the library as the sources left
    it, so no held-out search learns from another."""
    oob = RUN["out-of-the-box"]
    with tempfile.TemporaryDirectory(dir=SCRATCH) as tmp:
        lib = Path(tmp) / "skills.sqlite"
        for src in sources:
            simulate(Table.load(TABLES / src), {**oob, "skills": str(lib)}, replicates=replicates, trials=source_trials,
                     workdir=SCRATCH)
        arms: dict[tuple[str, int], list[Replicate]] = {}
        for trials in budgets:
            for r in range(replicates):
                copy = Path(tmp) / "copy.sqlite"
                shutil.copyfile(lib, copy)
                arms.setdefault(("library", trials), []).extend(
                    simulate(table, {**oob, "skills": str(copy)}, replicates=1, trials=trials, workdir=SCRATCH,
                             first=r))
                arms.setdefault(("none", trials), []).extend(simulate(table, oob, replicates=1, trials=trials,
                                                                      workdir=SCRATCH, first=r))
    lines = [f"## {task}: the skill library from {', '.join(sources)} ({replicates} out-of-the-box searches of "
             f"{source_trials} trials each), held out", "",
             "| trials | with the library − default | without − default | library − none (paired by draw) | "
             "first intervention with / without (most common) |", "|---|---|---|---|---|"]
    for trials in budgets:
        lib_reps, none_reps = arms["library", trials], arms["none", trials]
        diff = by_draw([replace(a, gain=a.gain - b.gain) for a, b in zip(lib_reps, none_reps)], lambda r: r.gain)
        firsts = [max(set(xs), key=xs.count) for xs in ([r.interventions[0] for r in reps if r.interventions]
                                                         for reps in (lib_reps, none_reps))]
        lines.append(f"| {trials} | {ci(by_draw(lib_reps, lambda r: r.gain))} | {ci(by_draw(none_reps, lambda r: r.gain))} "
                     f"| {ci(diff)} | {firsts[0]} / {firsts[1]} |")
    return "\n".join(lines), {f"{arm}@{t}": [asdict(r) for r in reps] for (arm, t), reps in arms.items()}


@dataclass(frozen=True)
class Choice:
    """A way to name the winner, against today's (the run's best validated version on its two seeds)."""
    name: str
    seeds: int        # run seeds a trial trains on
    trials_x: int     # trials, as a multiple of the budget's
    top: int          # the best validated versions confirmed
    more: int         # on this many more pool seeds each


CONFIRM = (Choice("today: best on 2 seeds", 2, 1, 1, 0),
           Choice("top 2 confirmed on 2 more seeds", 2, 1, 2, 2),
           Choice("1 seed a trial, twice the trials", 1, 2, 1, 0),
           Choice("1 seed a trial, twice the trials, top 3 confirmed on 3 more", 1, 2, 3, 3))


def confirmed(task: str, table: Table, replicates: int, budgets: list[int]) -> tuple[str, dict]:
    """Deliverable 4's "screen at low fidelity, confirm with more seeds", judged on the table:
    the out-of-the-box search, then its best validated versions (Replicate.ranked) scored on
    more pool seeds before the winner is named, by mean validation over every seed read; and a
    search on one seed a trial with twice the trials (the same segments), confirmed the same way.
    Every variant is scored on the same seeds: of the pool seeds outside the replicate's two-seed
    draw, the two last (a two-seed search's gate extends on the first two, a one-seed search's
    on the two first pool seeds besides its own, of the draw's second seed and those two; its
    confirmation reads those three). Costs are segments trained, confirmation at most (a
    version the gate extended needs fewer)."""
    oob = {**RUN["out-of-the-box"], "name": "out-of-the-box"}
    root = table.root
    cells, lines = {}, [f"## {task}: confirming the best versions before naming the winner ({replicates} "
                        "replicates, out of the box; test points over the default on the same two seeds a "
                        "replicate, paired by replicate, 95% t over seed draws)", "",
                        "| trials | variant | segments | test − default | − today | winners (most common) |",
                        "|---|---|---|---|---|---|"]
    for trials in budgets:
        runs = {(k, x): simulate(table, oob, replicates=replicates, trials=trials * x, seeds_per_run=k, workdir=SCRATCH)
                for k, x in dict.fromkeys((c.seeds, c.trials_x) for c in CONFIRM)}  # each search once
        today: list[Replicate] = []
        for c in CONFIRM:
            reps, picks = [], []
            for r in runs[c.seeds, c.trials_x]:
                pair = draw(table.seeds, r.replicate)  # a one-seed search runs on the draw's first
                rest = [s for s in table.seeds if s not in pair]
                scored, extra = rest[2:], ([*pair[1:], rest[0]] if c.seeds == 1 else rest[:2])[:c.more]
                read = [*pair[:c.seeds], *extra]
                best = max(r.ranked[:c.top], key=lambda n: (statistics.fmean(table.named(n).val[s] for s in read),
                                                            n == r.ranked[0]))
                gain = statistics.fmean(100 * (table.named(best).test[s] - root.test[s]) for s in scored)
                reps.append(replace(r, seeds=pair, winner=best, gain=gain, fresh=tuple(scored),
                                    segments=r.segments + c.more * min(c.top, len(r.ranked))))
                picks.append(best)
            if not today:
                today = reps
            common = ", ".join(f"{w} ({n})" for w, n in Counter(picks).most_common(2))
            diff = by_draw([replace(a, gain=a.gain - b.gain) for a, b in zip(reps, today)], lambda r: r.gain)
            lines.append(f"| {trials} | {c.name} | {statistics.fmean(r.segments for r in reps):.1f} | "
                         f"{ci(by_draw(reps, lambda r: r.gain))} | {ci(diff) if reps is not today else '–'} | {common} |")
            cells[f"{c.name}@{trials}"] = [{"replicate": r.replicate, "seeds": r.seeds, "winner": r.winner,
                                          "gain": round(r.gain, 3), "segments": r.segments} for r in reps]
    return "\n".join(lines), cells


def against(results: dict[tuple[str, int], list[Replicate]], record: Path) -> str:
    """Each cell against the same cell of another record (the code before a change, say),
    test gain paired by replicate: both ran the same seed draws in the same order."""
    theirs = json.loads(record.read_text())["cells"]
    lines = ["", "", f"Against `{record.stem}`, test points paired by replicate (95% t over seed draws):", "",
             "| strategy | trials | this | that | this − that |", "|---|---|---|---|---|"]
    for (name, trials), reps in results.items():
        other = {r["replicate"]: r for r in theirs.get(f"{name}@{trials}", {}).get("replicates", [])}
        pairs = [(r, other[r.replicate]) for r in reps if r.replicate in other]
        if not pairs:
            continue
        lines.append(f"| {name} | {trials} | {statistics.fmean(r.gain for r, _ in pairs):+.1f} | "
                     f"{statistics.fmean(o['gain'] for _, o in pairs):+.1f} | "
                     f"{ci(by_draw([replace(r, gain=r.gain - o['gain']) for r, o in pairs], lambda r: r.gain))} |")
    return "\n".join(lines)


def setting(text: str) -> tuple[str, object]:
    """"promotion.alpha=0.1" -> ("promotion.alpha", 0.1): the value read as YAML, as a config's."""
    key, sep, value = text.partition("=")
    if not sep or "." not in key:
        raise SystemExit(f"error: --set takes SECTION.KEY=VALUE (e.g. promotion.alpha=0.1), got '{text}'")
    return key, yaml.safe_load(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task")
    ap.add_argument("--replicates", type=int, default=30, help="30: every ordered seed draw of a pool of 6 once")
    ap.add_argument("--trials", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--strategies", nargs="+", default=[*RUN, "sweep"], choices=[*RUN, "sweep"])
    ap.add_argument("--fill", action="store_true", help="train and add versions the table lacks")
    ap.add_argument("--jobs", type=int, default=1, help="strategies simulated at once, each in a process")
    ap.add_argument("--set", nargs="+", default=[], metavar="SECTION.KEY=VALUE", dest="settings",
                    help="every search under these config settings over the table's, e.g. promotion.alpha=0.1 "
                         "search.winner=trained (records: TASK-SECTION.KEY=VALUE.json/md)")
    ap.add_argument("--tag", default="", help="records under TASK-TAG.json/md: a change to the code judged "
                                               "beside the records of the code before it (see --against)")
    ap.add_argument("--against", type=Path, default=None, metavar="RECORD",
                    help="pair every cell with the same cell of another record (a TASK*.json), replicate by replicate")
    ap.add_argument("--validate", type=int, default=0, metavar="DRAWS",
                    help="run the first DRAWS seed draws of each strategy for real too, and compare (implies --fill)")
    ap.add_argument("--transfer-from", nargs="+", default=[], metavar="TABLE",
                    help="the skill library's transfer: a library from out-of-the-box searches on these tables, "
                         "the task's searches at --trials with it and without (records: TASK-transfer.json/md)")
    ap.add_argument("--confirm", action="store_true",
                    help="the out-of-the-box search's best versions confirmed on more seeds before the winner is "
                         "named, and a one-seed screen, against today's choice (records: TASK-confirm.json/md)")
    ap.add_argument("--real", type=int, default=0, metavar="SEARCHES",
                    help="the out-of-the-box strategy for real at the first --trials, its winners retrained on "
                         "--fresh-seeds seeds (records: TASK-real.json/md)")
    ap.add_argument("--fresh-seeds", type=int, default=5, help=f"--real's fresh seeds: {FRESH}, {FRESH + 1}, ...")
    args = ap.parse_args()
    if args.real:
        table = TABLES / args.task
        table = table if (table / ROWS).exists() else table / "headroom"  # before a table: the first look's rows
        text, rec = real_runs(args.task, Table.load(table), args.real, args.trials[0],
                              list(range(FRESH, FRESH + args.fresh_seeds)))
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{args.task}-real.json").write_text(json.dumps(rec) + "\n")
        (OUT / f"{args.task}-real.md").write_text(text + "\n")
        print(text)
        return
    if args.transfer_from:
        text, reps = transfer(args.task, Table.load(TABLES / args.task), args.transfer_from, args.replicates, args.trials)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{args.task}-transfer.json").write_text(json.dumps({"sources": args.transfer_from, "arms": reps}) + "\n")
        (OUT / f"{args.task}-transfer.md").write_text(text + "\n")
        print(text)
        return
    if args.confirm:
        text, cells = confirmed(args.task, Table.load(TABLES / args.task), args.replicates, args.trials)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{args.task}-confirm.json").write_text(json.dumps({"cells": cells}) + "\n")
        (OUT / f"{args.task}-confirm.md").write_text(text + "\n")
        print(text)
        return
    fill = trainer(args.task)[1] if args.fill or args.validate else None
    table = Table.load(TABLES / args.task, fill)
    if args.validate:
        text = validate(args.task, table, [s for s in args.strategies if s != "sweep"], args.validate, args.trials[0])
        (OUT / f"{args.task}-validation.md").write_text(text + "\n")
        print(text)
        return
    settings = dict(setting(s) for s in args.settings)
    table = with_settings(table, settings)
    # a fill's searches see a table that grows as they run: their record is one of its own
    # (TASK-fill), so the finished cells of the table's own record neither stop it nor mix with it
    stem = args.task + "".join(f"-{s}" for s in sorted(args.settings)) + ("-fill" if fill else "") + \
        (f"-{args.tag}" if args.tag else "")
    cells = [(name, trials) for trials in args.trials for name in args.strategies]
    record = OUT / f"{stem}.json"
    done = {k: v for k, v in (json.loads(record.read_text()).get("cells", {}) if record.exists() else {}).items()
            if len(v["replicates"]) == args.replicates}  # a stopped simulation goes on from its finished cells
    todo = [c for c in cells if f"{c[0]}@{c[1]}" not in done]
    jobs = 1 if fill else args.jobs  # a fill trains and appends to the table: one process
    OUT.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(jobs) if jobs > 1 else nullcontext() as pool:
        run = partial(strategy_cell, args.task, args.replicates, settings=settings)
        for (name, trials), (reps, secs, (predicted, missed)) in zip(
                todo, pool.map(run, todo) if pool else (strategy_cell(args.task, args.replicates, c, table)
                                                        for c in todo)):
            done[f"{name}@{trials}"] = {"replicates": [asdict(r) for r in reps], "predicted": predicted,
                                        "missed": missed, "seconds": round(secs)}
            record.write_text(json.dumps({"cells": done}) + "\n")
            print(f"  {name} x {trials} trials: {len(reps)} replicates in {secs:.0f} s, "
                  f"mean gain {statistics.fmean(r.gain for r in reps):+.1f}", flush=True)
    results = {(n, t): [Replicate(**{**r, "seeds": tuple(r["seeds"]), "holds": tuple(r["holds"]),
                                     "labels": tuple(r["labels"]), "interventions": tuple(r["interventions"]),
                                     "fresh": tuple(r["fresh"])}) for r in done[f"{n}@{t}"]["replicates"]]
               for n, t in cells}
    lacked = [sum(done[f"{n}@{t}"][k] for n, t in cells) for k in ("predicted", "missed")]
    text = report(args.task, table, results, lacked) + (against(results, args.against) if args.against else "")
    (OUT / f"{stem}.md").write_text(text + "\n")
    print(text)

if __name__ == "__main__":
    main()
