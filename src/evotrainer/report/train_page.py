"""The report of one train directory: a `train`, or a run another trainer made and exported.

No lineage, so no versions, gate or final comparison: what the rollouts show. At a glance
(where it came from, rollouts and steps), the health report's findings and every diagnostic
with its value, the per-step curves read off the rollouts (reward, score, dead groups,
entropy, length), and the built-in diagnostics over windows of the steps. Built-in
diagnostics only (trusted code): a directory from elsewhere holds no harness to run.
"""
from __future__ import annotations

from pathlib import Path

from evotrainer import jobfiles
from evotrainer.diagnostics.evidence_view import Evidence, mean, std
from evotrainer.diagnostics.health import health_of, load_evidence
from evotrainer.harness.filters import DEAD_STD
from evotrainer.report.gather import CURVES, Curve, RunData, diagnostics_over_time
from evotrainer.report.page import curve_charts, diagnostic_charts, drawing, esc, page, resolve_engine


def step_curve(name: str, ev: Evidence) -> Curve:
    """Per step, read off the rollouts: what the trainer's own metrics hold for our runs."""
    steps = ev.step_numbers
    entropy_steps = {s["step"]: s.get("entropy") for s in ev.steps}
    metrics: dict[str, list[float | None]] = {k: [] for k in CURVES}
    for s in steps:
        part = ev.between(s, s)
        ent = [r.entropy for r in part.records if r.entropy is not None]
        metrics["reward_mean"].append(mean(part.column("reward")))
        metrics["score_mean"].append(mean(part.column("score")))
        metrics["dead_groups"].append(mean(float(std(r.reward for r in g) <= DEAD_STD) for g in part.groups))
        metrics["entropy"].append(mean(ent) if ent else entropy_steps.get(s))
        metrics["length_mean"].append(mean(part.column("length")))
    return Curve(name, 1, steps, metrics)


def glance(d: Path, health: dict) -> str:
    meta = jobfiles.read_json(d, "run.json") if jobfiles.exists(d, "run.json") else {}
    rows = [("directory", str(d)), ("written by", meta.get("source", "evotrainer train")),
            ("model", meta.get("model") or meta.get("base")), ("reward functions", meta.get("reward_funcs")),
            ("verifier score", meta.get("score")), ("group size", meta.get("group_size")),
            ("rollouts", f"{health['rollouts']}, {health['steps']}"),
            ("health", f"{health['worst']}{' (blocking)' if health['blocking'] else ''}")]
    return "<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows if v) + "</table>"


def findings(health: dict) -> str:
    if not health["findings"]:
        return '<p id="findings">No diagnostic past its thresholds.</p>'
    rows = "".join(f"<tr><td>{esc(f['severity'])}{' (blocking)' if f['blocking'] else ''}</td>"
                   f"<td><code>{esc(f['diagnostic'])}</code> ({esc(f['layer'])})</td><td>{f['value']:.3f}</td>"
                   f"<td>{esc(f['suggest'])}</td><td>{esc(f['evidence'])}</td></tr>" for f in health["findings"])
    return ('<table id="findings"><tr><th>severity</th><th>diagnostic</th><th>value</th><th>suggested '
            f"intervention</th><th>evidence</th></tr>{rows}</table>")


def diagnostics_table(health: dict) -> str:
    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"
    rows = "".join(f"<tr><td>{esc(x['layer'])}</td><td><code>{esc(x['name'])}</code></td><td>{fmt(x['first_window'])}"
                   f"</td><td>{fmt(x['value'])}{' <b>' + esc(x['severity']) + '</b>' if x['severity'] else ''}</td>"
                   f"<td>{esc(x['thresholds'])}</td><td>{esc(x['summary'])}</td></tr>" for x in health["diagnostics"])
    return ("<table><tr><th>layer</th><th>diagnostic</th><th>first window</th><th>value</th><th>thresholds</th>"
            f"<th>what it measures</th></tr>{rows}</table>")


def render_train(d: Path, engine: str = "auto") -> str:
    engine = resolve_engine(engine)
    grid, script = drawing(engine)
    health = health_of(str(d))
    data = RunData(d, {}, [], [], [], [step_curve(d.name, load_evidence(d))], diagnostics_over_time({d.name: d}),
                   None, None, None)
    sections = [
        ("At a glance", glance(d, health)),
        ("Findings", findings(health)),
        ("Training curves", '<p class="muted">per step, from the rollouts (entropy from the trainer\'s '
         'metrics where the rollouts lack it)</p>' + grid(curve_charts(data))),
        ("Diagnostics over time", '<p class="muted">the built-in diagnostics on consecutive windows of the '
         'steps, with their warning and critical thresholds</p>' + grid(diagnostic_charts(data))),
        ("Diagnostics", diagnostics_table(health)),
    ]
    return page(d.name, f"evotrainer training report <code>{esc(d)}</code>", sections,
                meta={"run": str(d), "engine": engine, "state": "trained"}, script=script, engine=engine)
