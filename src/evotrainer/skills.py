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
tasks. An outcome is keyed by (run, trial), so a resumed run that records it again changes
nothing.

`rank` is pure: it orders the rules agent's applicable proposals by what the matching
skills measured, so a library learned on one task steers the first choices on another.
Evidence from the task at hand counts both ways; from other tasks only what generalises
does (`standing`): a skill that held elsewhere is tried early, and one is put last only
after it failed on two or more other tasks.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from evotrainer.labels import HELD_UP, Label
from evotrainer.paths import DATA

DEFAULT_LIBRARY = DATA / "skills.sqlite"  # $XDG_DATA_HOME/evotrainer
GENERAL_AFTER = 2   # tasks where a skill must have held before it counts as general

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
    run TEXT NOT NULL,
    trial INTEGER NOT NULL,
    skill TEXT NOT NULL REFERENCES skills(name),
    task TEXT NOT NULL,
    label TEXT NOT NULL,
    gain REAL,                      -- validation gain over the control (null: never trained)
    t REAL NOT NULL,
    PRIMARY KEY (run, trial)
);
"""


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
    gains = [(-0.05 if o["label"] == Label.INVALID else (o["gain"] or 0.0)) for o in evidence]
    return sum(gains) / (len(gains) + 1)


def standing(skill: Skill, task: str) -> float | None:
    """What a skill says about trying its intervention on `task`: a positive score (try it
    early), a negative one (try it late) or None (nothing; the rules' order stands).

    Outcomes measured on `task` itself count both ways. From other tasks only what
    generalises counts: having held on another task earns an early try (at the score it
    held with), but a failure puts the intervention last only once it failed on
    GENERAL_AFTER or more tasks. One task's failure can be that task's own (partial credit
    was gamed through rg:chain_sum's substring-fallback scorer and held on arith), and
    demoting the rules' first pick on its word can push the one working change past a
    small trial budget, while promoting a skill that held costs at most one trial."""
    here = [o for o in skill.evidence if o["task"] == task]
    if here:
        return _score(here) or None
    if skill.held_on:
        return max(_score([o for o in skill.evidence if o["task"] == t]) for t in skill.held_on) or None
    if len({o["task"] for o in skill.evidence}) >= GENERAL_AFTER:
        return _score(skill.evidence) or None
    return None


def signature(finding: Mapping | None) -> str:
    return f"{finding['diagnostic']}:{finding['severity']}" if finding else "none"


class SkillLibrary:
    def __init__(self, path: Path | str):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.executescript(SCHEMA)

    def record(self, *, run: str, trial: int, task: str, trigger: str, intervention: str, family: str,
               patch: dict, expected: str, label: str, gain: float | None) -> None:
        """One trial's outcome (idempotent per run and trial), creating the skill on first use."""
        name = f"{trigger} -> {intervention}"
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("INSERT OR IGNORE INTO skills VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (name, trigger, intervention, family, json.dumps(patch, sort_keys=True), expected,
                             time.time()))
            self.db.execute("INSERT OR IGNORE INTO outcomes VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (run, trial, name, task, label, gain, time.time()))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def skills(self) -> list[Skill]:
        rows = self.db.execute("SELECT name, trigger, intervention, family, patch, expected FROM skills "
                               "ORDER BY name").fetchall()
        out = []
        for name, trigger, intervention, family, patch, expected in rows:
            ev = tuple({"run": r, "trial": t, "task": task, "label": lab, "gain": g}
                       for r, t, task, lab, g in self.db.execute(
                           "SELECT run, trial, task, label, gain FROM outcomes WHERE skill = ? ORDER BY t", (name,)))
            out.append(_skill(name, trigger, intervention, family, json.loads(patch), expected, ev))
        return out

    def absorb(self, other: Path | str) -> None:
        """Add every skill and outcome of another library file (outcomes stay keyed by run and
        trial, so absorbing one twice, or two that share outcomes, counts each once)."""
        self.db.execute("ATTACH DATABASE ? AS other", (str(Path(other).expanduser()),))
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute("INSERT OR IGNORE INTO skills SELECT * FROM other.skills")
                self.db.execute("INSERT OR IGNORE INTO outcomes SELECT * FROM other.outcomes")
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


def _skill(name, trigger, intervention, family, patch, expected, ev: tuple[dict, ...]) -> Skill:
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


def rank(candidates: Sequence[str], findings: Iterable[Mapping], skills: Iterable[Skill], task: str) -> list[str]:
    """Intervention names reordered by evidence for `task`: those whose best matching skill
    stands positive first (highest first), then those without a say in their given order,
    then those measured to hurt (least harmful first). A stable sort: no evidence, no change."""
    best: dict[str, float] = {}
    for s in matching(skills, findings):
        sc = standing(s, task)
        if sc is not None and sc > best.get(s.intervention, -float("inf")):
            best[s.intervention] = sc
    def key(name: str) -> tuple[int, float]:
        sc = best.get(name)
        if sc is None:
            return (1, 0.0)
        return (0, -sc) if sc > 0 else (2, -sc)
    return sorted(candidates, key=key)
