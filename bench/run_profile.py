"""Where a finished run's time went: the base, each trial and the final comparison, and inside
their segments the steps' sampling against their update, from the run's own records.

    .venv/bin/python bench/run_profile.py RUN [--install-s S]

Per phase: its wall seconds (the lineage's timestamps), the segments it trained, the training
pool's and the evaluator's seconds (the trial's budgets), and over its segments the sum of
the steps' seconds, of which sampling (`generate_seconds`: the rest is the forward and
backward pass, rewards and the optimizer). A segment is put in the phase during which its
metrics were last written. What a phase's wall holds beyond its pool and evaluator is the
controller's own work (backtest, checkouts, evidence ingest, the gate); what the pool holds
beyond its steps, spread over the cores, is each job's start, checkpoints and evidence
writing. `--install-s`: the seconds `scripts/main.sh` took in all, to show the install as the
rest (the run's wall starts after it).
"""
from __future__ import annotations

import argparse
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from evotrainer.evidence import read_metrics

SEGMENT_ROOTS = ("versions", "noise", "pairs", "final")  # cache/ holds copies of the same segments


@dataclass
class Phase:
    name: str
    start: float
    end: float
    train_s: float = 0.0
    eval_s: float = 0.0
    segments: list[tuple[float, float]] = field(default_factory=list)  # (step seconds, sampling seconds)

    def row(self) -> str:
        steps = sum(s for s, _ in self.segments)
        gen = sum(g for _, g in self.segments)
        share = f"{gen / steps:.0%}" if steps else "-"
        return (f"| {self.name} | {self.end - self.start:.0f} | {len(self.segments)} | {self.train_s:.0f} | "
                f"{self.eval_s:.0f} | {steps:.0f} | {gen:.0f} ({share}) |")


def phases(run: Path) -> tuple[list[Phase], float]:
    db = sqlite3.connect(f"file:{run / 'lineage.sqlite'}?mode=ro", uri=True)
    events = db.execute("SELECT t, kind, data FROM events ORDER BY id").fetchall()
    t0 = events[0][0]
    at = {kind: (t, json.loads(data)) for t, kind, data in events if kind in ("run_started", "final_started",
                                                                           "final_finished")}
    out = [Phase("base build", t0, at["run_started"][0])]
    for tid, version, intervention, budgets, started, finished in db.execute(
            "SELECT id, version, intervention, budgets, started, finished FROM trials ORDER BY id"):
        b = json.loads(budgets)
        out.append(Phase(f"trial {tid} {version} [{intervention}]", started, finished, b.get("train_s", 0.0),
                         b.get("eval_s", 0.0)))
    if "final_finished" in at:
        b = at["final_finished"][1].get("budgets", {})
        out.append(Phase("final comparison", at["final_started"][0], at["final_finished"][0], b.get("train_s", 0.0),
                         b.get("eval_s", 0.0)))
    for root in SEGMENT_ROOTS:
        for metrics in sorted((run / root).rglob("metrics.jsonl")) if (run / root).is_dir() else []:
            if metrics.is_symlink() or not metrics.is_file():
                continue
            rows = read_metrics(metrics.parent)
            written = metrics.lstat().st_mtime
            phase = next((p for p in out if p.start <= written <= p.end + 1), None)
            if phase is not None and rows:
                phase.segments.append((sum(r["seconds"] for r in rows), sum(r.get("generate_seconds", 0.0) for r in rows)))
    return out, events[-1][0] - t0


def table(run: Path, install_s: float | None) -> str:
    ps, wall = phases(run)
    lines = [f"run {run.name}: {wall:.0f} s from its start to its last event",
             "| phase | wall s | segments | training pool s | evaluator s | steps s (over segments) | of which sampling |",
             "|---|---|---|---|---|---|---|"]
    if install_s is not None:
        lines.append(f"| install, lineage and report (the rest of `scripts/main.sh`) | {install_s - wall:.0f} | | | | | |")
    lines += [p.row() for p in ps]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--install-s", type=float, default=None, help="scripts/main.sh's whole wall seconds")
    args = ap.parse_args()
    print(table(args.run, args.install_s))


if __name__ == "__main__":
    main()
