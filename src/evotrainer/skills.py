"""The skill library: validated interventions written down, outliving any run.

A skill is a (trigger, intervention) pair: the diagnostic signature that prompted an
intervention ("dead_group_ratio:critical", or "none" where the agent acted without a
finding) and the catalog entry it applied, with its knob patch as the template and its
hypothesis as the expected outcome. Every trial that used it adds one outcome row (run,
trial, task, label, gain): those rows are the validation evidence, and the effects, kept
rate and the domains where it held are computed from them, never stored twice. A skill
is *general* once it held (was kept with a positive mean gain) on two or more tasks.

The library is one SQLite file (default ~/.local/share/evotrainer/skills.sqlite, under
$XDG_DATA_HOME where that is set; `search.skills` in the run config), shared by runs and
tasks. An outcome is keyed by (run, trial), the run by its id (`run_started`'s run_id), so a
run made again in a deleted run's directory keeps its outcomes beside the first one's; its
directory is kept beside it (`run_dir`), to be shown. A resumed run that records an outcome
again changes nothing; another outcome under the same key is an error (DuplicateOutcome), never
silently dropped. Outcomes of a library from before run ids keep their directory as their run
(run_dir the same): runs from before ids are known by their directory (controller.run_key).

Each outcome also records the conditions it was measured under: the task and its level, the
accuracy band of the run's reference recipe (the root's validation accuracy: a weak start is
where reward shaping matters, a strong one where the update's size does), and the backend.
`rank` is pure: it reorders the rules agent's applicable proposals by what the matching
skills measured (an intervention's outcomes under every matching trigger pooled), each
outcome weighted by how close its conditions are to the run at hand (`closeness`): the same
task and band count fully, another task of the same family half, another family a tenth. A
proposal expecting a point of gain or more goes first, a point of loss or more last; less
than that moves it a place per point. Evidence from far away is shrunk below a point, so it
nudges the rules' order and never buries its first pick; a skill that misleads on a new task
is demoted by its own outcome there, which counts fully, under whichever finding it was tried.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from evotrainer.errors import UsageError
from evotrainer.labels import HELD_UP, Label
from evotrainer.paths import DATA

DEFAULT_LIBRARY = DATA / "skills.sqlite"  # $XDG_DATA_HOME/evotrainer
GENERAL_AFTER = 2   # tasks where a skill must have held before it counts as general
BANDS = (0.1, 0.3, 0.6)   # reference accuracy bands: weak < 10% <= low < 30% <= mid < 60% <= high
PLACE = 0.01        # expected gain worth one place in the rules' order (a validation point)

SCHEMA = """
CREATE TABLE IF NOT EXISTS skills (
    name TEXT PRIMARY KEY,          -- trigger -> intervention
    trigger TEXT NOT NULL,
    intervention TEXT NOT NULL,
    family TEXT NOT NULL,
    patch TEXT NOT NULL,            -- JSON: the knob values it sets (the template)
    expected TEXT NOT NULL,         -- the hypothesis it was first proposed with
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS outcomes (
    run TEXT NOT NULL,              -- the run's id (a run from before ids: its directory)
    trial INTEGER NOT NULL,
    skill TEXT NOT NULL REFERENCES skills(name),
    task TEXT NOT NULL,
    label TEXT NOT NULL,
    gain REAL,                      -- validation gain over the control (null: never trained)
    t REAL NOT NULL,
    level INTEGER,                  -- the conditions it was measured under (null: before they were kept)
    ref_acc REAL,                   -- the run's reference recipe's validation accuracy (its root)
    backend TEXT,
    run_dir TEXT,                   -- where the run was (null: not said)
    PRIMARY KEY (run, trial)
);
"""
OUTCOME_COLUMNS = ("run", "trial", "skill", "task", "label", "gain", "t", "level", "ref_acc", "backend", "run_dir")
EVIDENCE = ("run", "trial", "task", "label", "gain", "level", "ref_acc", "backend", "run_dir")  # as a skill shows it
CONDITIONS = {"level": "INTEGER", "ref_acc": "REAL", "backend": "TEXT"}  # added to libraries from before
SAME = ("skill", "task", "label", "gain", "level", "ref_acc", "backend")  # an outcome recorded again must match


class DuplicateOutcome(UsageError):
    """A run's trial recorded with another outcome than the library holds for it."""


@dataclass(frozen=True)
class Conditions:
    """What a run is, as skills weigh their evidence for it."""
    task: str                        # the task spec: arith, rg:chain_sum, codegen, jsonl:...
    level: int | None = None
    ref_acc: float | None = None     # the reference recipe's validation accuracy (None: not known yet)
    backend: str | None = None


def task_family(task: str) -> str:
    """'rg:chain_sum' -> 'rg', 'jsonl:/x.jsonl?verifier=math' -> 'jsonl', 'arith' -> 'arith'."""
    return task.split(":", 1)[0]


def band(acc: float | None) -> int | None:
    return None if acc is None else sum(acc >= b for b in BANDS)


def closeness(o: Mapping, here: Conditions) -> float:
    """How much an outcome measured under its conditions says about a run under `here`: 1 for
    the same task, level, band and backend; half for another task of the family (another
    reasoning-gym family, another level), a tenth across families (ten outcomes there weigh
    as one here); halved per band apart, 0.8 for another backend. Conditions an old outcome
    did not record cost nothing."""
    w = 1.0 if o["task"] == here.task else 0.5 if task_family(o["task"]) == task_family(here.task) else 0.1
    if o["task"] == here.task and None not in (o.get("level"), here.level) and o["level"] != here.level:
        w *= 0.5
    b, hb = band(o.get("ref_acc")), band(here.ref_acc)
    if None not in (b, hb):
        w *= 0.5 ** abs(b - hb)
    if None not in (o.get("backend"), here.backend) and o["backend"] != here.backend:
        w *= 0.8
    return w


@dataclass(frozen=True)
class Skill:
    name: str
    trigger: str
    intervention: str
    family: str
    patch: dict
    expected: str
    tried: int
    kept: int
    invalid: int
    mean_gain: float | None          # over the outcomes that were trained
    held_on: tuple[str, ...]         # tasks where it was kept with a positive mean gain
    evidence: tuple[dict, ...]       # the outcome rows

    @property
    def general(self) -> bool:
        return len(self.held_on) >= GENERAL_AFTER

    @property
    def score(self) -> float:
        return _score(self.evidence)


def _score(evidence: Sequence[Mapping]) -> float:
    """Expected gain, shrunk towards 0 by one imaginary neutral outcome: one lucky trial is
    worth less than three steady ones. An `invalid` outcome counts as a loss of 0.05."""
    gains = [_gain(o) for o in evidence]
    return sum(gains) / (len(gains) + 1)


def _gain(o: Mapping) -> float:
    return -0.05 if o["label"] == Label.INVALID else (o["gain"] or 0.0)


def standing(skill: Skill, here: Conditions) -> float | None:
    """The gain a skill expects of its intervention under `here`: its outcomes' gains (an
    invalid one counts as -0.05), each weighted by `closeness`, shrunk towards 0 by one
    imaginary neutral outcome as close as can be (so far-away evidence says little, and one
    lucky trial less than three steady ones). None: no outcome."""
    return _expect(skill.evidence, here)


def _expect(evidence: Sequence[Mapping], here: Conditions) -> float | None:
    if not evidence:
        return None
    w = [closeness(o, here) for o in evidence]
    return sum(wi * _gain(o) for wi, o in zip(w, evidence)) / (sum(w) + 1)


def signature(finding: Mapping | None) -> str:
    return f"{finding['diagnostic']}:{finding['severity']}" if finding else "none"


class SkillLibrary:
    def __init__(self, path: Path | str):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.executescript(SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """A library from before conditions were kept gets their columns (its rows: null); one
        from before run ids keeps each row's directory as its run, and says so in run_dir."""
        have = {row[1] for row in self.db.execute("PRAGMA table_info(outcomes)")}
        for col, kind in CONDITIONS.items():
            if col not in have:
                self.db.execute(f"ALTER TABLE outcomes ADD COLUMN {col} {kind}")
        if "run_dir" not in have:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                if "run_dir" not in {row[1] for row in self.db.execute("PRAGMA table_info(outcomes)")}:
                    self.db.execute("ALTER TABLE outcomes ADD COLUMN run_dir TEXT")  # (another process may have)
                    self.db.execute("UPDATE outcomes SET run_dir = run")
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def record(self, *, run: str, trial: int, task: str, trigger: str, intervention: str, family: str,
               patch: dict, expected: str, label: str, gain: float | None, level: int | None = None,
               ref_acc: float | None = None, backend: str | None = None, run_dir: str | None = None) -> None:
        """One trial's outcome under its conditions, keyed by its run's id and its number,
        creating the skill on first use. The same outcome again (a resumed run learning its
        trials once more) changes nothing; another one raises DuplicateOutcome."""
        name = f"{trigger} -> {intervention}"
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("INSERT OR IGNORE INTO skills VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (name, trigger, intervention, family, json.dumps(patch, sort_keys=True), expected,
                             time.time()))
            self._add(dict(run=run, trial=trial, skill=name, task=task, label=label, gain=gain, t=time.time(),
                           level=level, ref_acc=ref_acc, backend=backend, run_dir=run_dir))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _add(self, row: Mapping) -> None:
        """One outcome row (inside the caller's transaction), unless the library holds it already.
        When it was recorded and where its run was (a resumed run may have moved) may differ; a
        condition the held row did not record (a library from before conditions) is no conflict."""
        held = self.db.execute(f"SELECT {', '.join(SAME)} FROM outcomes WHERE run = ? AND trial = ?",
                               (row["run"], row["trial"])).fetchone()
        if held is None:
            self.db.execute(f"INSERT INTO outcomes ({', '.join(OUTCOME_COLUMNS)}) VALUES "
                            f"({', '.join('?' * len(OUTCOME_COLUMNS))})", tuple(row[c] for c in OUTCOME_COLUMNS))
            return
        differ = [f"{c}: {json.dumps(v)} there, {json.dumps(row[c])} now" for c, v in zip(SAME, held)
                  if v != row[c] and not (c in CONDITIONS and v is None)]
        if differ:
            raise DuplicateOutcome(
                f"the skill library {self.path} holds another outcome for trial {row['trial']} of run {row['run']} "
                f"({', '.join(differ)}); outcomes are never replaced: record this run in another library")

    def skills(self) -> list[Skill]:
        rows = self.db.execute("SELECT name, trigger, intervention, family, patch, expected FROM skills "
                               "ORDER BY name").fetchall()
        out = []
        for name, trigger, intervention, family, patch, expected in rows:
            ev = tuple(dict(zip(EVIDENCE, row)) for row in self.db.execute(
                f"SELECT {', '.join(EVIDENCE)} FROM outcomes WHERE skill = ? ORDER BY t", (name,)))
            out.append(_skill(name, trigger=trigger, intervention=intervention, family=family, patch=json.loads(patch),
                              expected=expected, ev=ev))
        return out

    def absorb(self, other: Path | str) -> None:
        """Add every skill and outcome of another library file (outcomes stay keyed by run and
        trial, so absorbing one twice, or two that share outcomes, counts each once; two that
        hold different outcomes under one key raise DuplicateOutcome, and nothing is added)."""
        SkillLibrary(other).close()  # opened once here: a library from before gets its columns
        self.db.execute("ATTACH DATABASE ? AS other", (str(Path(other).expanduser()),))
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute("INSERT OR IGNORE INTO skills SELECT * FROM other.skills")
                rows = self.db.execute(f"SELECT {', '.join(OUTCOME_COLUMNS)} FROM other.outcomes").fetchall()
                for row in rows:
                    self._add(dict(zip(OUTCOME_COLUMNS, row)))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        finally:
            self.db.execute("DETACH DATABASE other")

    def get(self, name: str) -> Skill | None:
        return next((s for s in self.skills() if s.name == name), None)

    def close(self) -> None:
        self.db.close()


def _skill(name, *, trigger, intervention, family, patch, expected, ev: tuple[dict, ...]) -> Skill:
    trained = [o["gain"] for o in ev if o["gain"] is not None]
    held = sorted({o["task"] for o in ev if o["label"] in HELD_UP
                   and _mean([x["gain"] for x in ev if x["task"] == o["task"] and x["gain"] is not None]) > 0})
    return Skill(name, trigger, intervention, family, patch, expected, tried=len(ev),
                 kept=sum(o["label"] in HELD_UP for o in ev), invalid=sum(o["label"] == Label.INVALID for o in ev),
                 mean_gain=_mean(trained) if trained else None, held_on=tuple(held), evidence=ev)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def matching(skills: Iterable[Skill], findings: Iterable[Mapping]) -> list[Skill]:
    """Skills whose trigger is one of the current findings' signatures (or 'none'), best first."""
    sigs = {signature(f) for f in findings} | {"none"}
    return sorted((s for s in skills if s.trigger in sigs), key=lambda s: -s.score)


def rank(candidates: Sequence[str], findings: Iterable[Mapping], skills: Iterable[Skill],
         here: Conditions) -> list[str]:
    """Intervention names reordered by evidence for the run under `here` (the expected gain of
    every outcome of its skills that match the findings, pooled: a loss under one trigger is
    not hidden by a gain under another): expecting a point (PLACE) or more of gain, first (the
    most first); a point or more of loss, last (the least harmful first); less either way,
    moved by its expectation, a place per point. Far evidence is shrunk below a point by
    `closeness`, so it only nudges the rules' order; without evidence the order stands (a
    stable sort)."""
    pooled: dict[str, list[Mapping]] = {}
    for s in matching(skills, findings):
        pooled.setdefault(s.intervention, []).extend(s.evidence)
    best = {name: sc for name, ev in pooled.items() if (sc := _expect(ev, here)) is not None}

    def key(item: tuple[int, str]) -> tuple[int, float]:
        i, name = item
        sc = best.get(name, 0.0)
        if sc >= PLACE:
            return (0, -sc)
        if sc <= -PLACE:
            return (2, -sc)
        return (1, i - sc / PLACE)
    return [name for _, name in sorted(enumerate(candidates), key=key)]
