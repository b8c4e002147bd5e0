"""Landscape tables: every configuration a search reaches in a move or two, trained from the base
on one fixed pool of seeds, with its validation and test accuracy per seed.

A table is what a careful engineer's screen is (every single change from the root, with
intervals), what the search simulator draws outcomes from (evolve/simulate.py), and what the
backtest's verdicts are checked against. Rows follow the restart protocol: every configuration
trains one segment from the base, exactly as a restart-mode search trains a trial (the same
segment seeds, sampling seeds, thread counts and checkpoint schedule), so a row's segments are
the segment cache's entries a search on those seeds would reuse.

A row is keyed by its harness's *content* (`content_key`: the knob values, parsed, and every
other file's bytes), so a search that reaches a configuration by another path (lr then clip,
or clip then lr) finds the same row.

Building is resumable: each batch of configurations appends its rows to ROWS when scored, and
the segment cache keeps every seed trained before a kill, so a stopped build goes on where it
stopped and trains nothing twice.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from evotrainer.agents.interface import AgentContext, Proposal
from evotrainer.agents.interventions import FAMILY, set_knob
from evotrainer.agents.rules import candidates
from evotrainer.backtest import backtest
from evotrainer.backtest.analysis import SHAPING
from evotrainer.catalog import get_task
from evotrainer.config import RunConfig
from evotrainer.errors import UsageError
from evotrainer.evidence.records import read_metrics
from evotrainer.evolve import setup
from evotrainer.evolve.notices import OnEvent, ignore
from evotrainer.evolve.segments.cache import SegmentCache
from evotrainer.evolve.segments.state import Clock, Segment, SegmentFailed, State
from evotrainer.evolve.segments.training import Training
from evotrainer.evolve.stats.paired import paired_differences, t_interval
from evotrainer.harness import REFERENCE
from evotrainer.harness.knobs import load_knobs, read_yaml
from evotrainer.policy.model import resolve_model

ROWS = "rows.jsonl"            # one JSON row per configuration, appended as batches finish
BACKTESTS = "backtests.jsonl"  # each move's backtest on each seed's root rollouts
KINDS = ("root", "replica", "move", "sweep", "combo", "reached")  # reached: a version a simulated search
                                                                  # reached that was not in the table


@dataclass(frozen=True)
class Config:
    """A configuration of the table: the root with `moves` applied in order (`kind` says why it
    is in the table: the root, a noise replica of it, one move from it, a sweep recipe, or a
    combination of the best moves)."""
    name: str
    kind: str
    moves: tuple[Proposal, ...] = ()
    replica: int = 0          # > 0: the root again, sampled with other seeds (the gate's null)
    harness: Path | None = None  # its files as a search wrote them (kind "reached"), instead of moves

    @property
    def families(self) -> list[str]:
        return [p.family for p in self.moves]


@dataclass
class Row:
    """A configuration's outcome on every seed of the pool (seed -> accuracy, 0-1), with what a
    search reads of it besides: the health-report findings of each seed (worst first), and the
    training curve (mean reward per logged step, seed by seed)."""
    name: str
    kind: str
    key: str                                   # content_key of its harness ("" for a replica: the root's)
    moves: list[str]
    families: list[str]
    knobs: dict                                # the knob values it changes from the root
    val: dict[int, float]
    test: dict[int, float]
    replica: int = 0
    findings: dict[int, list[dict]] = field(default_factory=dict)
    curve: dict[int, list[float]] = field(default_factory=dict)
    failed: str = ""                           # a seed's training failed: why (no scores then)

    @classmethod
    def of(cls, d: dict) -> "Row":
        ints = lambda m: {int(k): v for k, v in m.items()}  # noqa: E731 (JSON keys are strings)
        return cls(**{**d, "val": ints(d["val"]), "test": ints(d["test"]), "findings": ints(d.get("findings", {})),
                      "curve": ints(d.get("curve", {}))})


def root_moves(root: Path, target: int, seed: int = 0) -> list[Proposal]:
    """Every move a trainer agent can propose from the root with no finding to point it: the
    catalog's then the search space's, each once (resamples drawn with `seed`)."""
    k = load_knobs(root / "knobs.yaml")
    return candidates(AgentContext(findings=(), knobs=k, root_knobs=k, target_level=target, harness_dir=root,
                                   seed=seed))


def screen_configs(root: Path, target: int, moves: str = "catalog") -> list[Config]:
    """A screen's configurations: the root, and every move from it (`moves`: "catalog", the
    named, literature-backed ones; "all", the search space's too; or names, comma-separated)."""
    props = root_moves(root, target)
    if moves == "catalog":
        props = [p for p in props if p.intervention in FAMILY]
    elif moves != "all":
        names, have = [m.strip() for m in moves.split(",") if m.strip()], {p.intervention for p in props}
        if unknown := [n for n in names if n not in have]:
            raise UsageError(f"no move {', '.join(unknown)} from this root; the moves are catalog, all, or "
                             f"names among: {', '.join(sorted(have))}")
        props = [p for p in props if p.intervention in names]
    return [Config("root", "root")] + [Config(p.intervention, "move", (p,)) for p in props]


def first_look(singles: Sequence[Config], only: str = "all") -> list[Config]:
    """A first look's configurations, from a table's singles: the root, then the hand sweep's
    recipes (they name the tuned recipe, so the task's headroom can be measured, and a task
    without it dropped, before the moves are trained), then the catalog's moves; `only` "root"
    or "sweep" stops there. No replicas: a look measures headroom, not the gate's noise."""
    look = [c for c in singles if c.kind == "root"]
    if only != "root":
        look += [c for c in singles if c.kind == "sweep"]
    if only not in ("root", "sweep"):
        look += [c for c in singles if c.kind == "move" and c.name in FAMILY]
    return look


def write_harness(root: Path, dest: Path, moves: Sequence[Proposal]) -> Path:
    """`root`'s harness with each move applied in order, as the controller applies a proposal:
    its files replaced, then its knobs set in knobs.yaml (comments and order kept)."""
    if dest.exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(root, tmp, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    for p in moves:
        for name, text in p.files.items():
            (tmp / name).write_text(text)
        knobs = tmp / "knobs.yaml"
        text = knobs.read_text()
        for key, value in p.knobs.items():
            text = set_knob(text, key, value)
        knobs.write_text(text)
    tmp.rename(dest)
    return dest


def content_key(harness: Path) -> str:
    """What a harness trains as, comparable across the paths that reach it: the knob values
    (parsed: comments and order do not count) and every other file's bytes."""
    h = hashlib.sha256()
    knobs = read_yaml((harness / "knobs.yaml").read_text()) or {}
    h.update(json.dumps(knobs, sort_keys=True).encode())
    for f in sorted(p for p in harness.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        if f.name != "knobs.yaml":
            h.update(str(f.relative_to(harness)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def changed_knobs(root: Path, harness: Path) -> dict:
    """The knob values `harness` sets differently from `root`."""
    a = read_yaml((root / "knobs.yaml").read_text()) or {}
    b = read_yaml((harness / "knobs.yaml").read_text()) or {}
    return {k: v for k, v in sorted(b.items()) if a.get(k) != v}


def read_rows(path: Path) -> dict[str, Row]:
    """The rows recorded so far, by name (a later row of one name replaces an earlier one)."""
    if not path.exists():
        return {}
    return {r.name: r for r in (Row.of(json.loads(line)) for line in path.read_text().splitlines() if line.strip())}


def curve(train_dir: str, every: int = 10) -> list[float]:
    """The verifier's mean score every `every` steps (the reward a move shapes is not comparable
    across rows; the score is), compact: the table is committed."""
    return [round(float(r["score_mean"]), 4) for r in read_metrics(train_dir)
            if r["step"] % every == 0 and isinstance(r.get("score_mean"), (int, float))]


def table_md(rows: dict[str, Row]) -> str:
    """The rows as a markdown table: mean accuracy, and each row's paired gain over the root
    (points, mean and 95% t interval over the seeds), largest validation gain first."""
    root = rows["root"]

    def gains(r: Row, split: str) -> list[float]:
        return [100 * x for x in paired_differences(getattr(r, split), getattr(root, split))]

    def cell(d: list[float]) -> str:
        lo, hi = t_interval(d) if len(d) > 1 else (float("nan"), float("nan"))
        return f"{statistics.fmean(d):+.1f} [{lo:+.1f}, {hi:+.1f}]"
    lines = ["| configuration | kind | val % | test % | val − root | test − root |", "|---|---|---|---|---|---|"]
    for r in sorted(rows.values(), key=lambda r: (r.kind != "root", -statistics.fmean(gains(r, "val")) if r.val else 1)):
        if not r.val:
            lines.append(f"| {r.name} | {r.kind} | failed: {r.failed} | | | |")
            continue
        lines.append(f"| {r.name} | {r.kind} | {100 * statistics.fmean(r.val.values()):.1f} | "
                     f"{100 * statistics.fmean(r.test.values()):.1f} | "
                     + ("– | – |" if r is root else f"{cell(gains(r, 'val'))} | {cell(gains(r, 'test'))} |"))
    return "\n".join(lines)


def build(training: Training, root: Path, configs: Sequence[Config], *, seeds: Sequence[int], out: Path,
          batch: int = 4, on_row: Callable[[Row], None] | None = None) -> dict[str, Row]:
    """Train every configuration not yet in OUT/ROWS on every seed, `batch` configurations to a
    pool (one evaluator per batch), and append their rows; one whose harness has a recorded
    row's files takes that row's outcome. Returns every row, old and new."""
    rows = read_rows(out / ROWS)
    todo = [c for c in configs if c.name not in rows]
    harnesses = {c.name: write_harness(c.harness or root, out / "harnesses" / c.name, c.moves) for c in configs}
    training.harness_dir = lambda name: harnesses.get(name, root)
    base = State("v0", 0, {}, {}, {})

    def record(row: Row) -> None:
        rows[row.name] = row
        with open(out / ROWS, "a") as fh:
            fh.write(json.dumps(asdict(row)) + "\n")
        if on_row is not None:
            on_row(row)

    # a harness with the files of a recorded row trains exactly as that row did (its sampling
    # seeds come from its content: a space move that a search reached first, say): its row is
    # that row's outcome under the new name, not a second training
    trained = {r.key: r for r in rows.values() if r.key and not r.failed and set(seeds) <= set(r.val)}
    twins = {c.name: trained.get(content_key(harnesses[c.name])) for c in todo if not c.replica}
    for c in todo:
        if twins.get(c.name) is not None:
            record(replace(twins[c.name], name=c.name, kind=c.kind, moves=[p.intervention for p in c.moves],
                           families=c.families, knobs=changed_knobs(root, harnesses[c.name])))
    todo = [c for c in todo if twins.get(c.name) is None]
    for i in range(0, len(todo), batch):
        part = todo[i:i + batch]
        segments = [Segment(c.name, base, 1, out / "versions" / c.name, replica=c.replica, seeds=tuple(seeds))
                    for c in part]
        states = training.train(segments, Clock())
        for c, st in zip(part, states):
            record(_row(training, c, st, root, harnesses[c.name]))
    return rows


def backtests(out: Path, configs: Sequence[Config], *, seeds: Sequence[int], timeout_s: float = 600.0,
              on_done: Callable[[str], None] | None = None, parent: str = "root") -> dict[str, dict[int, dict]]:
    """Every move's backtest on each seed's rollouts of the row `parent` (OUT/versions/PARENT/
    seed-S; the root's by default), as a search backtests a child on its parent's lowest seed;
    appended to OUT/BACKTESTS as each move's seeds finish, so a stopped build goes on. Returns
    every recorded one from that parent, by move and seed."""
    done = read_backtests(out / BACKTESTS, parent)
    for c in configs:
        if c.kind not in ("move", "sweep", "combo", "reached") or all(s in done.get(c.name, {}) for s in seeds):
            continue
        recs = []
        for s in seeds:
            bt = backtest(out / "versions" / parent / f"seed-{s}", out / "harnesses" / c.name, out / "harnesses" / parent,
                          timeout_s=timeout_s)
            rep = bt.report
            recs.append({"name": c.name, "seed": s, "label": bt.label, "reasons": bt.reasons, "signal": bt.signal,
                         **({"parent": parent} if parent != "root" else {}),
                         **({k: getattr(rep, k) for k in BACKTEST_FIELDS} if rep else {})})
        with open(out / BACKTESTS, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in recs)
        done.setdefault(c.name, {}).update({r["seed"]: r for r in recs})
        if on_done is not None:
            on_done(c.name)
    return done


# what a backtest measured, kept beside its verdict (backtest/analysis.BacktestReport)
BACKTEST_FIELDS = ("unchanged", "dead_group_ratio_before", "dead_group_ratio_after", "kept_group_ratio",
                   "ordering_violations", "ordering_violations_before", "reward_score_spearman_after",
                   "correct_cut_by_truncation", "correct_in_dropped_live_groups")


# a rejection's reason from before the backtest read the direction of off-score signal: signal
# towards shorter, finished or well-formed completions is shaping, which passes now
# (backtest/analysis.py SHAPING)
_SHAPING = re.compile(rf"there it tracks ({'|'.join(SHAPING)}) \(r = -")


def rejudged(b: dict) -> dict:
    """A recorded backtest under today's verdict: a rejection whose every reason is shaping
    passes (its reasons become notes). The records keep what each build saw."""
    if b["label"] == "backtest_rejected" and b["reasons"] and all(_SHAPING.search(r) for r in b["reasons"]):
        return b | {"label": "passed", "reasons": [], "notes": b.get("notes", []) + b["reasons"]}
    return b


def read_backtests(path: Path, parent: str = "root") -> dict[str, dict[int, dict]]:
    """The backtests recorded on the rollouts of the row `parent`, by move and seed, each
    under today's verdict (rejudged)."""
    out: dict[str, dict[int, dict]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                b = json.loads(line)
                if b.get("parent", "root") == parent:
                    out.setdefault(b["name"], {})[int(b["seed"])] = rejudged(b)
    return out


def _row(training: Training, c: Config, st: State | SegmentFailed, root: Path, harness: Path) -> Row:
    moves = [p.intervention for p in c.moves]
    common = dict(name=c.name, kind=c.kind, key="" if c.replica else content_key(harness), moves=moves,
                  families=c.families, knobs=changed_knobs(root, harness), replica=c.replica)
    if isinstance(st, SegmentFailed):
        return Row(**common, val={}, test={}, failed=str(st))
    findings = {} if c.replica else {s: training.findings({s: d}, harness) for s, d in st.dirs.items()}
    return Row(**common, val=st.val, test=st.test, findings=findings,
               curve={s: curve(d) for s, d in st.dirs.items()})


def screen(cfg: RunConfig, out: Path, moves: str = "catalog", on_row: Callable[[Row], None] | None = None,
           on_event: OnEvent = ignore) -> tuple[dict[str, Row], str]:
    """`evotrainer screen`: the root and every move from it (screen_configs), each trained from
    the base for the run's whole budget on the config's seeds, in OUT (a rerun goes on where a
    stop left it). Returns the rows and their table, also written to OUT/screen.md. `on_event`
    hears the base's build, where it is not cached (notices.BasePlan, SftProgress)."""
    cfg = replace(cfg, search=replace(cfg.search, mode="restart"))  # every move from the base
    task = get_task(cfg.task, cfg.level)
    root = Path(cfg.harness or REFERENCE)
    configs = screen_configs(root, task.target_level, moves)  # a bad name stops it before any work
    runtime = cfg.runtime().validate(here=cfg.executor == "local")
    model = resolve_model(cfg.model) if cfg.model else None
    started = setup.first_start(cfg, task, runtime, model=model, max_depth=1, on_event=on_event)
    setup.use_key(task, started)
    out.mkdir(parents=True, exist_ok=True)
    cache = cfg.cache_dir(out)
    jobs = cfg.job_executor()
    jobs.start()
    training = Training(cfg=cfg, task=task, runtime=runtime.on_base(started.base), base=started.base, run_dir=out,
                        harness_dir=lambda v: root, executor=jobs, cache=SegmentCache(cache) if cache else None)
    rows = build(training, root, configs, seeds=cfg.seeds, out=out, on_row=on_row)
    table = table_md(rows)
    (out / "screen.md").write_text(f"# Screen: {task.spec}, {cfg.budget.total_steps} steps, seeds {cfg.seeds}\n\n"
                                   "Each change from the root trained from the base; gains are paired by seed "
                                   "(points; mean and 95% t interval).\n\n" + table + "\n")
    return rows, table
