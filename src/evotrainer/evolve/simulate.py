"""The search simulator: the real controller, agents, population, gate and choice of a winner,
run against a landscape table (evolve/landscape.py) instead of training.

`TableTraining` is the controller's training backend: a segment's validation and test
accuracy per seed are the table row's of its harness (by content, whichever path reached it),
its findings are the row's findings on those seeds, and the backtest of a move from the root
is the verdict recorded for it on the root's rollouts. Nothing trains, so a search of 8
trials takes about a second and a strategy can be run hundreds of times per task.

How a simulated run maps onto the table's pool of seeds:
    the run's seeds          two pool seeds, drawn per replicate (paired across strategies)
    noise replicas           the table's replica rows, on the run's seeds
    extra seed pairs         (a sequential gate's) the pool seeds the run does not use, in order
    the winner's test score  its row's test accuracy on the pool seeds no decision of the search
                             read (neither its seeds nor its extra pairs'): fresh seeds, paired
                             with the root's and the tuned recipe's

A version the table has no row for (a move from a kept child, say) is, with a `fill` trainer
(the table's own: same base, split key and segment cache), trained on the whole pool and added
to the table as a row of kind "reached", so the next replicate that reaches it draws from it.
Without one it is predicted from its moves' single rows where it is a combination of them,
as its best part: each seed's accuracy is that of the move with the largest mean validation
gain (the stack adds nothing). The tables' trained combinations chose this: over 5 of them on
arith3-weak and codegen-weak, the additive prediction (each move's gain added) was 4.9 test
points too high on average and never too low, the best part's 0.5 too low (mean absolute
error 3.0). Otherwise a version is a *miss*: its segment fails (label crash, "not in the
table"). The table counts both. A backtest from any parent but the root passes; from the
root, a row without a recorded one is backtested and recorded where there is a fill trainer
(else it passes).
"""
from __future__ import annotations

import itertools
import json
import math
import random
import shutil
import statistics
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from evotrainer.backtest.run import BacktestOutcome
from evotrainer.config import config_from_dict
from evotrainer.evolve.controller import Controller
from evotrainer.evolve.landscape import (
    BACKTESTS,
    ROWS,
    Config,
    Row,
    backtests,
    build,
    changed_knobs,
    content_key,
    read_backtests,
    read_rows,
)
from evotrainer.evolve.segments.findings import worst_of
from evotrainer.evolve.segments.state import EXTRA_PAIR_DATA, Clock, Segment, SegmentFailed, State
from evotrainer.evolve.stats.final import merit
from evotrainer.evolve.segments.training import Training
from evotrainer.labels import Label
from evotrainer.lineage import LineageStore
from evotrainer.lineage.events import RunStarted

TABLE = "table:"               # a simulated train directory: table:ROW/seed-S


@dataclass
class Table:
    """A landscape table as the simulator reads it."""
    rows: dict[str, Row]
    seeds: list[int]
    config: dict                                   # the task's run config the table was built with
    root_dir: Path                                 # the root's harness files
    backtests: dict[tuple[str, str], dict[int, dict]] = field(default_factory=dict)  # (parent, move) -> pool seed -> outcome
    out: Path | None = None                        # where it is recorded (rows a fill adds go there)
    fill: Training | None = None                   # trains a version not in the table (None: predict or miss)
    misses: int = 0                                # versions neither in the table nor combinations of its moves
    predicted: int = 0                             # versions predicted as their best part
    filled: int = 0                                # versions trained and added
    predictions: dict[str, Row] = field(default_factory=dict)  # the predicted rows, by name

    @classmethod
    def load(cls, out: Path, fill: Training | None = None) -> "Table":
        """The table recorded in `out`; a first look (TASK/headroom, before its table is built)
        reads its task's meta.json, one folder up."""
        meta = json.loads((out / "meta.json" if (out / "meta.json").exists() else out.parent / "meta.json").read_text())
        from_root = {("root", name): by_seed for name, by_seed in read_backtests(out / BACKTESTS).items()}
        return cls(read_rows(out / ROWS), meta["seeds"], meta["config"], out / "harnesses" / "root", from_root, out, fill)

    def __post_init__(self) -> None:
        self.by_key = {r.key: r for r in self.rows.values() if r.key and r.val}
        self.root = self.rows["root"]
        self.replicas = {r.replica: r for r in self.rows.values() if r.kind == "replica"}
        self._changes = {r.name: _change(self.root_dir, self.root_dir.parent / r.name)
                         for r in self.rows.values() if r.kind == "move" and r.val}

    def row_for(self, harness: Path, replica: int = 0) -> Row | None:
        """The row a harness trains as (a replica row for the root's noise replicas), or its
        prediction as its best part, or None."""
        key = content_key(harness)
        if replica:
            return self.replicas.get(replica) if key == self.root.key else None
        if key in self.by_key:
            return self.by_key[key]
        if self.fill is not None:
            return self._train(harness, key)
        parts = self._decompose(_change(self.root_dir, harness))
        if parts is None:
            self.misses += 1
            return None
        self.predicted += 1
        return self._best_part(key, [self.rows[n] for n in parts])

    def _train(self, harness: Path, key: str) -> Row:
        """`harness` trained on the whole pool by the fill trainer, recorded as a row of its own."""
        name = f"reached-{key}"
        rows = build(self.fill, self.root_dir, [Config(name, "reached", harness=harness)], seeds=self.seeds,
                     out=self.out)
        row = rows[name]
        self.rows[name] = row
        if row.val:
            self.by_key[key] = row
        self.filled += 1
        return row if row.val else None

    def backtest_of(self, row: Row, seed: int, parent: str = "root") -> dict | None:
        """The backtest recorded for `row` as a child of the row `parent` on that seed's
        rollouts. With a fill trainer, a missing one is run and recorded where both rows were
        trained here (their harness files and the parent's rollouts on disk): from the root on
        every pool seed, from another parent on that seed, as a real search would backtest it."""
        if (parent, row.name) not in self.backtests and parent != "root" and self.out is not None:
            self.backtests[parent, row.name] = read_backtests(self.out / BACKTESTS, parent).get(row.name, {})
        known = self.backtests.get((parent, row.name), {})
        if seed not in known and self.fill is not None and row.kind not in ("root", "replica") \
                and (self.out / "harnesses" / row.name).is_dir() \
                and (self.out / "versions" / parent / f"seed-{seed}" / "evidence.jsonl").is_file():
            seeds = self.seeds if parent == "root" else [seed]
            done = backtests(self.out, [Config(row.name, "reached")], seeds=seeds,
                             timeout_s=self.fill.cfg.budget.trial_timeout_s, parent=parent)
            known = self.backtests[parent, row.name] = done.get(row.name, {})
        return known.get(seed)

    def _decompose(self, change: dict) -> list[str] | None:
        """Single moves whose changes, disjoint, make up `change` exactly (largest first). A
        resample (`lr_resample`) is one draw per run, seeded by the run's seeds, and the table
        holds the draw from seed 0: a knob left at another value stands for its resample row."""
        left, parts = dict(change), []
        for name, c in sorted(self._changes.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            if c and all(left.get(k) == v for k, v in c.items()):
                parts.append(name)
                for k in c:
                    del left[k]
        for name, c in sorted(self._changes.items()):
            if name.endswith("_resample") and c.keys() <= left.keys():
                parts.append(name)
                for k in c:
                    del left[k]
        return parts if not left and parts else None

    def _best_part(self, key: str, parts: list[Row]) -> Row:
        best = max(parts, key=lambda p: (statistics.fmean(p.val.values()), p.name))  # validation only: test is the judge's
        row = Row("+".join(p.name for p in parts), "predicted", key, [m for p in parts for m in p.moves],
                  [f for p in parts for f in p.families], {}, dict(best.val), dict(best.test), findings=best.findings)
        self.predictions[row.name] = row
        return row

    def named(self, name: str) -> Row:
        """A row by name: the table's, or a prediction made for a search."""
        return self.rows.get(name) or self.predictions[name]


def _change(root: Path, harness: Path) -> dict:
    """A harness's change from the root: knob values, and files whose bytes differ."""
    out = {("knob", k): json.dumps(v, sort_keys=True) for k, v in changed_knobs(root, harness).items()}
    for f in sorted(p for p in harness.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = f.relative_to(harness)
        if rel.name != "knobs.yaml" and (not (root / rel).is_file() or (root / rel).read_bytes() != f.read_bytes()):
            out[("file", str(rel))] = f.read_text()
    return out


@dataclass
class TableTraining(Training):
    """Training drawn from a table: no worker, no evaluator, no evidence read."""
    table: Table | None = None

    def train(self, segments: list[Segment], clock: Clock, read=None) -> list[State | SegmentFailed]:
        out = []
        for sg in segments:
            row = self.table.row_for(self.harness_dir(sg.version), sg.replica)
            if row is None:
                out.append(SegmentFailed(Label.CRASH, "not in the table (a simulator's miss)"))
                continue
            seeds = sg.seeds or self.cfg.seeds
            pool = {s: self._pool_seed(s, sg.data_offset) for s in seeds}
            self.used.update(pool.values())
            self.segments += len(seeds)
            dirs = {s: f"{TABLE}{row.name}/seed-{pool[s]}" for s in seeds}
            clock.reused += len(seeds)
            state = State(sg.version, sg.depth, dirs, {s: row.val[pool[s]] for s in seeds},
                          {s: row.test[pool[s]] for s in seeds})
            self._rows[row.name] = row
            if not sg.replica:
                self.row_of[sg.version] = row.name
            if read is not None:
                read(sg, dirs)
            out.append(state)
        return out

    def _pool_seed(self, seed: int, data_offset: int) -> int:
        """The pool seed a run seed trains on: itself, or for the k-th extra pair of a sequential
        gate the k-th pool seed the run does not use (cycling)."""
        if not data_offset:
            return seed
        unused = [s for s in self.table.seeds if s not in self.cfg.seeds]
        return unused[(data_offset - EXTRA_PAIR_DATA - 1) % len(unused)]

    def findings(self, dirs: dict[int, str], harness_dir: Path) -> list[dict]:
        reports = []
        for d in dirs.values():
            name, seed = _parse(d)
            reports.append(self._rows[name].findings.get(seed, []))
        return worst_of(reports)

    def backtest(self, parent: State, candidate: Path, parent_dir: Path) -> BacktestOutcome:
        """The candidate's backtest recorded on its parent's lowest seed (Table.backtest_of); a
        version a fill trains is trained first, so its backtest can be run. Where none is
        recorded or can be run (a predicted version, a parent the table did not train), it
        passes."""
        name, seed = _parse(parent.dirs[min(parent.dirs)])
        row = self.table.by_key.get(content_key(candidate))
        if row is None and self.table.fill is not None:
            row = self.table.row_for(candidate)  # trained now: its backtest is recorded beside it
        rec = self.table.backtest_of(row, seed, name) if row else None
        if rec is None:
            return BacktestOutcome("passed", [])
        return BacktestOutcome(rec["label"], rec["reasons"], signal=rec.get("signal", ""))

    def ingest(self, name: str, state: State) -> None:  # no evidence: the table has none
        pass

    def ingest_later(self, name: str, state: State) -> None:
        pass

    def ingest_missing(self, trials) -> None:
        pass

    _rows: dict[str, Row] = field(default_factory=dict, init=False, repr=False)
    used: set[int] = field(default_factory=set, init=False)  # pool seeds a decision of the run read
    segments: int = field(default=0, init=False)             # segments drawn, one per seed (replicas too)
    row_of: dict[str, str] = field(default_factory=dict, init=False)  # version -> the row it drew from


def _parse(d: str) -> tuple[str, int]:
    name, seed = d[len(TABLE):].rsplit("/seed-", 1)
    return name, int(seed)


@dataclass(frozen=True)
class Replicate:
    """One simulated search: its seeds, its winner and what the winner scores on fresh seeds."""
    strategy: str
    replicate: int
    seeds: tuple[int, ...]
    winner: str                   # the winner's row ("root" where nothing was kept)
    holds: tuple[str, ...]        # its moves
    gain: float                   # test gain over the root on the fresh seeds (points, 0-100)
    first_kept: int | None        # the trial that first kept a version
    labels: tuple[str, ...]       # each trial's label
    interventions: tuple[str, ...] = ()  # each trial's intervention
    fresh: tuple[int, ...] = ()   # the pool seeds the gain is measured on
    ranked: tuple[str, ...] = ()  # every trained version's row, by mean validation on the run's seeds, best first
    segments: int = 0             # what the search trained, in segments (one per seed)


def draw(pool: list[int], r: int, k: int = 2) -> tuple[int, ...]:
    """Replicate r's run seeds: the r-th of every ordered k-draw from the pool (the agents draw
    by the first seed, so order matters), in a fixed shuffled order, cycling."""
    draws = list(itertools.permutations(pool, k))
    random.Random(0).shuffle(draws)
    return draws[r % len(draws)]


def simulate(table: Table, strategy: dict, *, replicates: int, trials: int, seeds_per_run: int = 2,
             workdir: Path | None = None, first: int = 0) -> list[Replicate]:
    """`replicates` searches of `strategy` (config keys: agent, search, promotion) at `trials` trials each,
    numbered from `first`.
    Replicate r's run seeds are `draw(pool, r)`: every strategy sees the same draws, so their
    gains pair by replicate. A pool of 6 has 30 ordered draws, each taken once by the first 30
    replicates with the search's own draws seeded as a real run's (by its first seed); each
    later cycle through the draws gives the search another seed (`search.seed`), so a
    strategy that draws (random, population) explores anew where a deterministic one (greedy
    on the rules agent) repeats its first cycle. A search on fewer seeds (`seeds_per_run` 1)
    runs on the first of its replicate's draw, so it pairs with the two-seed searches."""
    out = []
    n = math.perm(len(table.seeds), 2)  # the distinct ordered draws
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for r in range(first, first + replicates):
            seeds = draw(table.seeds, r)[:seeds_per_run]
            search_seed = None if r < n else r
            out.append(_one(table, strategy, r=r, seeds=seeds, trials=trials, run_dir=Path(tmp) / f"r{r}",
                            search_seed=search_seed))
            shutil.rmtree(Path(tmp) / f"r{r}", ignore_errors=True)
    return out


def _one(table: Table, strategy: dict, *, r: int, seeds: tuple[int, ...], trials: int, run_dir: Path,
         search_seed: int | None = None) -> Replicate:
    raw = {**table.config, "agent": strategy.get("agent", "rules"), "seeds": list(seeds), "final_seeds": [],
           "cache": "off"}
    raw["search"] = {**raw.get("search", {}), **strategy.get("search", {}), "skills": strategy.get("skills"),
                     "seed": search_seed}
    raw["budget"] = {**raw["budget"], "trials": trials}
    raw["promotion"] = {**raw.get("promotion", {}), **strategy.get("promotion", {})}
    raw["harness"] = str(table.root_dir)
    cfg = config_from_dict(raw).validate()
    run_dir.mkdir(parents=True)
    store = LineageStore(run_dir / "lineage.sqlite")
    try:  # a started run: the controller builds no base and keys no split
        run_id = f"sim-{table.out.name if table.out else ''}-{r}"  # a skill library's key: one per table and replicate
        store.append(RunStarted(base=str(run_dir / "no-base"), max_depth=1, run_id=run_id))
    finally:
        store.close()
    ctl = Controller(cfg, run_dir, backend=partial(TableTraining, table=table))
    try:
        ctl.run()
        label, versions, _ = ctl.winner_schedule()
        trials_done = ctl.store.trials()
        ranked = [ctl.training.row_of[s.version] for s in sorted(ctl.look().trained_states, key=merit, reverse=True)]
    finally:
        ctl.store.close()
    winner = versions[-1]
    row = table.row_for(ctl.harnesses.dir(winner)) or table.root
    fresh = [s for s in table.seeds if s not in ctl.training.used]  # no decision of the run read them
    gain = statistics.fmean(100 * (row.test[s] - table.root.test[s]) for s in fresh)
    kept = next((t.id for t in trials_done if t.parents and t.label == Label.KEPT), None)
    judged = [t for t in trials_done if t.parents]
    return Replicate(strategy.get("name", ""), r, seeds, row.name, tuple(row.moves), gain, kept,
                     tuple(t.label for t in judged), tuple(t.intervention for t in judged), tuple(fresh),
                     tuple(dict.fromkeys(ranked)), ctl.training.segments)


