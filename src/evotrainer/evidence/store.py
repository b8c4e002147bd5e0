"""The run-wide evidence store: rollout records of every version in one SQLite file.

A train directory's evidence.jsonl is what the worker writes; the controller ingests it
here under the version's name, so diagnostics and backtests can ask for "version v3,
steps 1-20, group 4" without loading a model or reading every file. The store is
bounded: past `max_rows_per_version` a version keeps whole steps only, the first and
last ones and an even spread between (early and late behaviour are what diagnostics
compare).
"""
from __future__ import annotations

import operator
import sqlite3
import typing
from pathlib import Path

from evotrainer.evidence.records import FIELDS, RolloutRecord, evidence_of
_TYPES = {int: "INTEGER", float: "REAL", str: "TEXT", bool: "INTEGER"}


def _plain(hint) -> type:
    """`int | None` -> int: optional fields are stored as NULL."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def steps_to_keep(steps: list[int], rows_per_step: int, max_rows: int) -> list[int]:
    """Whole steps within the row budget: first and last, evenly spread between."""
    budget = max(max_rows // max(rows_per_step, 1), 2)
    if len(steps) <= budget:
        return steps
    idx = sorted({round(i * (len(steps) - 1) / (budget - 1)) for i in range(budget)})
    return [steps[i] for i in idx]


class EvidenceStore:
    def __init__(self, path: Path, max_rows_per_version: int = 200_000):
        self.path, self.max_rows = Path(path), max_rows_per_version
        self.db = sqlite3.connect(self.path)
        hints = typing.get_type_hints(RolloutRecord)
        cols = ", ".join(f"{f} {_TYPES[_plain(hints[f])]}" for f in FIELDS)
        self.db.execute(f"CREATE TABLE IF NOT EXISTS rollouts (version TEXT NOT NULL, {cols})")
        # a store written before a field existed (a run resumed by a newer evotrainer): add it
        have = {row[1] for row in self.db.execute("PRAGMA table_info(rollouts)")}
        for f in FIELDS:
            if f not in have:
                self.db.execute(f"ALTER TABLE rollouts ADD COLUMN {f} {_TYPES[_plain(hints[f])]}")
        self.db.execute("CREATE INDEX IF NOT EXISTS by_version_step ON rollouts (version, step, group_id)")
        self.db.commit()

    def ingest(self, version: str, run_dir: Path) -> int:
        """Store a train directory's evidence under `version` (replacing it); rows stored."""
        records = evidence_of(Path(run_dir) / "evidence.jsonl")
        steps = sorted({r.step for r in records})
        per_step = len(records) // max(len(steps), 1)
        keep = set(steps_to_keep(steps, per_step, self.max_rows))
        fields = operator.attrgetter(*FIELDS)
        rows = [(version, *fields(r)) for r in records if r.step in keep]
        with self.db:  # one transaction: a version is in the store whole or not at all
            self.db.execute("DELETE FROM rollouts WHERE version = ?", (version,))
            self.db.executemany(f"INSERT INTO rollouts (version, {', '.join(FIELDS)}) "
                                f"VALUES ({', '.join('?' * (len(FIELDS) + 1))})", rows)
        return len(rows)

    def query(self, version: str | None = None, steps: tuple[int, int] | None = None,
              group_id: int | None = None) -> list[RolloutRecord]:
        where, args = [], []
        for cond, val in (("version = ?", version), ("group_id = ?", group_id)):
            if val is not None:
                where.append(cond)
                args.append(val)
        if steps is not None:
            where.append("step BETWEEN ? AND ?")
            args += list(steps)
        sql = f"SELECT {', '.join(FIELDS)} FROM rollouts"
        sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY version, step, rowid"
        return [RolloutRecord(**{f: (bool(v) if f in ("truncated", "kept") else v) for f, v in zip(FIELDS, row)})
                for row in self.db.execute(sql, args)]

    def versions(self) -> list[str]:
        return [v for (v,) in self.db.execute("SELECT DISTINCT version FROM rollouts ORDER BY version")]

    def close(self) -> None:
        self.db.close()
