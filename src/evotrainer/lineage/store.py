"""The lineage store: append-only events and a trials table, in one SQLite file.

The controller is the one writer. A trial is written whole or not at all: its row and
its `trial_finished` event go in one transaction, so a controller killed at any moment
leaves either a finished trial or a `trial_started` event with no row, which `pending()`
returns for the resumed controller to run again under the same number. A trial number
is the table's primary key, so a trial can never be recorded twice.

Events are typed (lineage/events.py): `append(ev)` writes one, `events(RunStarted)` reads
those of a kind back as RunStarted records. The file carries its schema version (SQLite's
`user_version`): a file with none is from before the version was written (the same tables and
rows: it is read as it is and stamped on open); a file from a newer schema than this code
knows is refused with a one-line UsageError rather than misread.

The store knows no policy: it records what the controller decided, and answers queries.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TypeVar, overload

from evotrainer.errors import UsageError
from evotrainer.labels import Label
from evotrainer.lineage.events import Event, TrialFinished, TrialStarted, decode
from evotrainer.lineage.fitness import Fitness

SCHEMA_VERSION = 1  # 1: typed events (their JSON as before); 0 (none written): the same, older code
E = TypeVar("E", bound=Event)

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    t REAL NOT NULL,
    trial INTEGER,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY,
    version TEXT UNIQUE,
    parents TEXT NOT NULL,
    agent TEXT NOT NULL,
    intervention TEXT NOT NULL,
    depth INTEGER NOT NULL,
    hypothesis TEXT NOT NULL,
    success_criterion TEXT NOT NULL,
    patch TEXT NOT NULL,
    backtest TEXT NOT NULL,
    budgets TEXT NOT NULL,
    fitness TEXT NOT NULL,
    findings TEXT NOT NULL,
    label TEXT NOT NULL,
    reflection TEXT NOT NULL,
    started REAL NOT NULL,
    finished REAL NOT NULL
);
CREATE TRIGGER IF NOT EXISTS events_append_only_u BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_append_only_d BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
"""
_LABELS = frozenset(Label)  # a plain string is found in it as its member is
_JSON = ("parents", "backtest", "budgets", "fitness", "findings")


@dataclass
class TrialRecord:
    id: int
    version: str | None            # the harness version it created (None if refused before committing)
    parents: list[str]             # one parent, or two for a crossover
    agent: str                     # which trainer agent proposed it
    intervention: str              # catalog name (or "root")
    depth: int                     # segments of training behind its checkpoints
    hypothesis: str                # "changing X improves Y because Z"
    success_criterion: str
    patch: str                     # the exact diff to the parent's harness
    label: str                     # a Label (a plain string when read back)
    backtest: dict = field(default_factory=dict)
    budgets: dict = field(default_factory=dict)    # steps, seconds spent
    fitness: Fitness = field(default_factory=Fitness)   # what it measured (a stored dict is read as one)
    findings: list = field(default_factory=list)   # health-report findings of its evidence
    reflection: str = ""
    started: float = 0.0
    finished: float = 0.0

    def __post_init__(self):
        self.fitness = Fitness.of(self.fitness)
        if self.label not in _LABELS:
            raise ValueError(f"unknown trial label '{self.label}'; valid choices: {', '.join(Label)}")


COLUMNS = [f.name for f in fields(TrialRecord)]


@dataclass(frozen=True)
class Logged:
    """An event as the log holds it: its row id and when it was recorded."""
    id: int
    t: float
    event: Event


class _Locked:
    """A sqlite3 connection whose statements run one at a time across threads; `lock` (reentrant)
    holds a transaction's statements together. Reads are fetched whole under the lock."""

    def __init__(self, db: sqlite3.Connection):
        self.conn, self.lock = db, threading.RLock()

    def execute(self, sql: str, params=()) -> "_Rows":
        with self.lock:
            return _Rows(self.conn.execute(sql, params).fetchall())

    def executescript(self, sql: str) -> None:
        with self.lock:
            self.conn.executescript(sql)

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class _Rows(list):
    """A statement's rows, fetched: iterated, or read as a cursor's fetchone/fetchall."""

    def fetchone(self):
        return self[0] if self else None

    def fetchall(self):
        return list(self)


class LineageStore:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        # one connection, used by every thread of the run (trials in flight record beside each
        # other): each statement or transaction holds the lock
        self.db = _Locked(sqlite3.connect(self.path, isolation_level=None, check_same_thread=False))
        found = self.db.execute("PRAGMA user_version").fetchone()[0]
        if found > SCHEMA_VERSION:
            self.db.close()
            raise UsageError(f"{self.path} was written by a newer evotrainer (lineage schema {found}; this one "
                             f"reads up to {SCHEMA_VERSION}): upgrade evotrainer to open it")
        self.db.execute("PRAGMA synchronous = FULL")
        self.db.executescript(SCHEMA)
        if found < SCHEMA_VERSION:  # a new file, or one from before versions: the same rows, stamped
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # ------------------------------------------------------------------ writing

    def append(self, ev: Event) -> None:
        self.db.execute("INSERT INTO events (t, trial, kind, data) VALUES (?, ?, ?, ?)",
                        (time.time(), ev.trial_column, ev.KIND, json.dumps(ev.to_json(), sort_keys=True)))

    def begin_trial(self, start: TrialStarted) -> None:
        """Record that a trial started (what it will try, so a resume can redo it)."""
        if self.finished(start.trial):
            raise ValueError(f"trial {start.trial} is already recorded")
        self.append(start)

    def finish_trial(self, rec: TrialRecord) -> None:
        """The trial's row and its `trial_finished` event, in one transaction."""
        row = asdict(rec) | {"fitness": rec.fitness.to_json()}
        values = [json.dumps(row[c], sort_keys=True) if c in _JSON else row[c] for c in COLUMNS]
        with self.db.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute(f"INSERT INTO trials ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                                values)
                self.append(TrialFinished(rec.id, rec.label, rec.version))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    # ------------------------------------------------------------------ reading

    def trials(self) -> list[TrialRecord]:
        rows = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM trials ORDER BY id").fetchall()
        return [TrialRecord(**{c: json.loads(v) if c in _JSON else v for c, v in zip(COLUMNS, row)}) for row in rows]

    def finished(self, trial: int) -> bool:
        return self.db.execute("SELECT 1 FROM trials WHERE id = ?", (trial,)).fetchone() is not None

    def pending(self) -> list[TrialStarted]:
        """Trials started and never finished, as they (last) started, oldest first."""
        rows = self.db.execute(
            "SELECT trial, data FROM events WHERE kind = 'trial_started' AND trial NOT IN "
            "(SELECT id FROM trials) ORDER BY id").fetchall()
        latest = {t: TrialStarted.from_json(json.loads(d), t) for t, d in rows}  # restarted twice: its last start
        return [latest[t] for t in sorted(latest)]

    def next_trial(self) -> int:
        row = self.db.execute("SELECT MAX(x) FROM (SELECT MAX(id) AS x FROM trials UNION ALL "
                              "SELECT MAX(trial) FROM events WHERE kind = 'trial_started')").fetchone()
        return (row[0] or 0) + 1

    def log(self, *kinds: type[Event]) -> list[Logged]:
        """Events of these kinds (every kind: none named) in the order they were recorded, with when."""
        names = [n for k in kinds for n in k.STORED]
        sql = ("SELECT id, t, trial, kind, data FROM events"
               + (f" WHERE kind IN ({', '.join('?' * len(names))})" if names else "") + " ORDER BY id")
        return [Logged(i, t, decode(k, json.loads(d), tr)) for i, t, tr, k, d in self.db.execute(sql, names)]

    @overload
    def events(self, *kinds: type[E]) -> list[E]: ...
    @overload
    def events(self, kind: str) -> list[dict]: ...

    def events(self, *kinds):
        """Events of these kinds (every kind: none named), oldest first: `events(RunStarted)`.

        A kind's name instead of its class gives the rows as dicts (id, t, trial, kind and the
        data's keys), as before events were typed: for scripts outside the package (bench/)."""
        if kinds and isinstance(kinds[0], str):
            return self._rows(kinds[0])
        return [x.event for x in self.log(*kinds)]

    def _rows(self, kind: str) -> list[dict]:
        sql = "SELECT id, t, trial, kind, data FROM events WHERE kind = ? ORDER BY id"
        return [{"id": i, "t": t, "trial": tr, "kind": k, **json.loads(d)}
                for i, t, tr, k, d in self.db.execute(sql, (kind,))]

    def close(self) -> None:
        self.db.close()
