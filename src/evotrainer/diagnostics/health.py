"""The health report: every diagnostic's value and the findings, as JSON and Markdown.

`health_of` is the computation: evidence directory and harness in, a plain dict out.
It runs the harness's own diagnostics, so `diagnose` calls it in a worker process
whenever the harness has a `diagnostics.py`; the built-in library alone runs in place.
"""
from __future__ import annotations

import json
from pathlib import Path

from evotrainer.diagnostics.evidence_view import Evidence
from evotrainer.diagnostics.library import failure_counts, stop_counts
from evotrainer.diagnostics.spec import LAYERS, findings, measure, windows
from evotrainer.errors import UsageError
from evotrainer import jobfiles
from evotrainer.evidence.records import evidence_of, read_metrics

HEALTH_JSON, HEALTH_MD = "health.json", "health.md"


def load_evidence(train_dir: Path | str) -> Evidence:
    """A train directory's rollouts (evidence.jsonl) and step metrics (metrics.jsonl)."""
    d = Path(train_dir)
    return Evidence.of(evidence_of(d / "evidence.jsonl"), read_metrics(d))


def evidence_dirs(path: Path | str) -> list[Path]:
    """A train directory itself, or the train directories (versions) directly inside a run directory."""
    path = Path(path)
    if jobfiles.exists(path, "evidence.jsonl"):
        return [path]
    found = sorted((p for p in path.iterdir() if jobfiles.exists(p, "evidence.jsonl")), key=lambda p: p.name) \
        if path.is_dir() else []
    if not found:
        raise UsageError(f"no rollout evidence in '{path}': expected evidence.jsonl there or in its "
                         "subdirectories (a train directory, or a run directory of them)")
    return found


def health_of(evidence_dir: str, harness_dir: str | None = None) -> dict:
    """Worker entry point: the health report of one train directory, as plain data."""
    from evotrainer.diagnostics.load import harness_diagnostics
    diags = harness_diagnostics(harness_dir)
    ev = load_evidence(evidence_dir)
    values = measure(diags, ev)
    found = findings(diags, values, windows(ev))
    return {
        "source": str(evidence_dir), "harness": harness_dir, "rollouts": len(ev), "steps": ev.span(),
        "first_window": ev.first.span(), "last_window": ev.last.span(),
        "diagnostics": [{
            "name": n, "layer": d.layer, "scope": d.scope, "value": _r(values[n]),
            "first_window": _r(d.fn(ev.first)) if d.scope == "last" else None,
            "thresholds": d.thresholds(), "severity": d.severity(values[n]), "blocking": d.blocking,
            "summary": d.summary} for n, d in diags.items()],
        "findings": [f.to_dict() for f in found],
        "failures": failure_counts(ev.last),  # a code task's: what fails most, in the last window
        "stops": stop_counts(ev.last),        # a multi-turn task's: how episodes end, in the last window
        "worst": found[0].severity if found else "healthy",
        "blocking": any(f.blocking for f in found),
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def to_markdown(reports: list[dict]) -> str:
    lines = ["# Health report", ""]
    for rep in reports:
        lines += [f"## {rep['source']}", "",
                  f"{rep['rollouts']} rollouts, {rep['steps']}; first window {rep['first_window']}, "
                  f"last window {rep['last_window']}. Harness: {rep['harness'] or 'built-in diagnostics'}.", ""]
        lines += ["### Findings", ""]
        if rep["findings"]:
            lines += ["| severity | diagnostic | value | thresholds | suggested intervention |",
                      "|---|---|---|---|---|"]
            lines += [f"| {f['severity']}{' (blocking)' if f['blocking'] else ''} | `{f['diagnostic']}` ({f['layer']}) "
                      f"| {f['value']:.3f} | {f['thresholds']} | {_cell(f['suggest'])} |" for f in rep["findings"]]
            lines += [""] + [f"- {f['evidence']}" for f in rep["findings"]]
        else:
            lines.append("No diagnostic past its thresholds.")
        if rep.get("failures"):
            total = sum(n for _, n in rep["failures"])
            lines += ["", "### What fails most (programs, last window)", "",
                      ", ".join(f"{kind} {n / total:.0%}" for kind, n in rep["failures"][:6])]
        if rep.get("stops"):
            total = sum(n for _, n in rep["stops"])
            lines += ["", "### How episodes end (last window)", "",
                      ", ".join(f"{stop} {n / total:.0%}" for stop, n in rep["stops"])]
        lines += ["", "### Diagnostics", "",
                  "| layer | diagnostic | first window | value | thresholds | what it measures |",
                  "|---|---|---|---|---|---|"]
        for d in sorted(rep["diagnostics"], key=lambda d: LAYERS.index(d["layer"])):
            flag = f" **{d['severity']}**" if d["severity"] else ""
            value = f"{_fmt(d['value'])}{flag}" + (" (trend)" if d["scope"] == "run" else "")
            lines.append(f"| {d['layer']} | `{d['name']}` | {_fmt(d['first_window'])} | {value} "
                         f"| {d['thresholds']} | {_cell(d['summary'])} |")
        lines.append("")
    return "\n".join(lines)


def write_reports(reports: list[dict], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / HEALTH_JSON).write_text(json.dumps({"reports": reports}, indent=2))
    (out_dir / HEALTH_MD).write_text(to_markdown(reports))
    return out_dir / HEALTH_JSON, out_dir / HEALTH_MD


def _plain_copy(train_dir: Path) -> bool:
    """Whether a train directory's copy of its harness is there, holding regular files only (a
    job wrote it: its files are read only once nothing in it can lead elsewhere)."""
    try:
        return jobfiles.exists(train_dir, "harness/knobs.yaml") and bool(list(jobfiles.walk(train_dir / "harness")))
    except jobfiles.BadOutput:
        return False


def diagnose(path: Path | str, harness_dir: Path | str | None = None, timeout_s: float = 600.0) -> list[dict]:
    """Health reports for a train directory or each version of a run directory.

    The harness is `harness_dir`, else the copy a train directory keeps of the harness
    that ran. Its diagnostics.py, if any, is checked for legality and then run only in
    a worker; a refusal or failure raises HarnessFailed with its label.
    """
    from evotrainer.diagnostics.load import evidence_files, run_diagnostics
    reports = []
    for d in evidence_dirs(path):
        h = Path(harness_dir) if harness_dir is not None else d / "harness"
        if harness_dir is not None and not (h / "knobs.yaml").is_file():
            raise UsageError(f"not a harness directory: '{h}' has no knobs.yaml")
        if harness_dir is None and not _plain_copy(d):
            h = None  # no copy of the harness that ran, or one with a link in it: the built-ins alone
        reports.append(run_diagnostics(health_of, {"evidence_dir": str(d), "harness_dir": None if h is None else str(h)},
                                       h, timeout_s, evidence_files(d)))
    return reports
