"""Diagnostic replay: is a new or revised diagnostic worth keeping?

EvoTrainer's rule: when a failure mode has no metric, define one, set thresholds,
implement it, then replay it over earlier versions and keep it only if it separates the
versions that failed from those that held up. Here a diagnostic (built in, or from a
candidate harness's diagnostics.py) is computed over every earlier version's evidence,
and the separation is the AUC: the chance that a failed version looks worse on it than
a version that held up (ties count half). 1.0 separates perfectly; 0.5 is a coin.
"""
from __future__ import annotations

import ast
from dataclasses import asdict, dataclass
from pathlib import Path

from evotrainer import jobfiles
from evotrainer.errors import UsageError
from evotrainer.labels import FELL_SHORT, HELD_UP, REPLAYABLE, in_order


@dataclass
class ReplayResult:
    diagnostic: str
    auc: float | None            # None without at least one version of each kind
    kept: bool                   # auc >= min_auc
    min_auc: float
    values: list[dict]           # per version: dir, label, value, severity
    skipped: list[str]           # versions where the diagnostic does not apply

    def to_dict(self) -> dict:
        return asdict(self)


def separation_auc(failed: list[float], held: list[float], above: bool = True) -> float | None:
    """P(a failed version is worse than one that held up), ties half (Mann-Whitney)."""
    if not failed or not held:
        return None
    sign = 1 if above else -1
    wins = sum((sign * f > sign * h) + 0.5 * (f == h) for f in failed for h in held)
    return wins / (len(failed) * len(held))


def replay_values(harness_dir: str | None, name: str, evidence_dirs: list[str]) -> dict:
    """Worker entry point: the diagnostic's value and severity on each version's evidence."""
    from evotrainer.diagnostics.health import load_evidence
    from evotrainer.diagnostics.load import harness_diagnostics
    diags = harness_diagnostics(harness_dir)
    if name not in diags:
        return {"error": f"unknown diagnostic '{name}'; valid choices: {', '.join(sorted(diags))}"}
    d = diags[name]
    values = [d(load_evidence(e)) for e in evidence_dirs]
    return {"above": d.above, "values": values, "severity": [d.severity(v) for v in values]}


def replay(name: str, labelled: list[tuple[Path, str]], harness_dir: Path | str | None = None,
           min_auc: float = 0.8, timeout_s: float = 600.0) -> ReplayResult:
    """Replay diagnostic `name` over (evidence dir, outcome label) pairs; keep it if AUC >= min_auc."""
    from evotrainer.diagnostics.load import evidence_files, run_diagnostics
    for d, label in labelled:
        if label not in REPLAYABLE:
            raise UsageError(f"unknown outcome label '{label}' for {d}; valid choices: "
                             f"{', '.join(in_order(REPLAYABLE))}")
        if not jobfiles.exists(d, "evidence.jsonl"):
            raise UsageError(f"no rollout evidence at '{d}' (expected evidence.jsonl)")
    args = {"harness_dir": None if harness_dir is None else str(harness_dir), "name": name,
            "evidence_dirs": [str(d) for d, _ in labelled]}
    out = run_diagnostics(replay_values, args, harness_dir, timeout_s,
                          tuple(f for d, _ in labelled for f in evidence_files(d)))
    if isinstance(out, dict) and isinstance(out.get("error"), str):
        raise UsageError(out["error"])
    checked_replay(out, len(labelled))
    rows = [{"dir": str(d), "label": lab, "value": v, "severity": s}
            for (d, lab), v, s in zip(labelled, out["values"], out["severity"])]
    failed = [r["value"] for r in rows if r["label"] in FELL_SHORT and r["value"] is not None]
    held = [r["value"] for r in rows if r["label"] in HELD_UP and r["value"] is not None]
    auc = separation_auc(failed, held, out["above"])
    return ReplayResult(name, None if auc is None else round(auc, 4), auc is not None and auc >= min_auc,
                        min_auc, rows, [r["dir"] for r in rows if r["value"] is None])


def checked_replay(out: object, n: int) -> None:
    """Raise UsageError (the diagnostic does not run: not kept) unless a replay worker, which ran
    the harness's diagnostics, returned `n` values and severities and a direction."""
    ok = isinstance(out, dict) and isinstance(out.get("above"), bool) and all(
        isinstance(out.get(k), list) and len(out[k]) == n for k in ("values", "severity"))
    if not ok or not all(v is None or isinstance(v, (int, float)) and not isinstance(v, bool) for v in out["values"]):
        raise UsageError("the replay's worker returned something other than a value per version")


def revised_diagnostics(parent_dir: Path | str, candidate_dir: Path | str) -> list[str]:
    """Diagnostics the candidate's diagnostics.py adds or changes against its parent's: top-level
    public functions (a `@diagnostic(name=...)` counts under that name) whose source differs, or
    every one it defines when anything else in the file changed (a helper, a constant, an
    import), since any of them may read it. Read with `ast`, never run: this decides what to
    replay before any of it executes."""
    def parse(directory) -> tuple[dict[str, str], str]:
        f = Path(directory) / "diagnostics.py"
        try:
            tree = ast.parse(f.read_text()) if f.is_file() else ast.Module(body=[], type_ignores=[])
        except SyntaxError:
            return {}, "unparsable"
        defs, rest = {}, []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                name = node.name
                for dec in node.decorator_list:
                    for kw in getattr(dec, "keywords", []):
                        if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                            name = kw.value.value
                defs[name] = ast.dump(node)
            else:
                rest.append(ast.dump(node))
        return defs, "|".join(rest)
    (before, rest_before), (after, rest_after) = parse(parent_dir), parse(candidate_dir)
    if rest_after != rest_before:
        return sorted(after)
    return sorted(n for n, src in after.items() if before.get(n) != src)
