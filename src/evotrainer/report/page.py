"""`evotrainer report RUN`: one self-contained HTML file that opens offline from disk.

Sections, top to bottom: the run at a glance, the version tree, fitness per version, the
gate (gains against their bars, the noise floor), backtest verdicts beside what training
showed, training curves, diagnostics over time with their thresholds, the final comparison,
and each version's diff. Styles are inline; plotly's script, where used, is inlined once;
nothing is fetched, so the file can be mailed, archived or opened on an air-gapped machine.
"""
from __future__ import annotations

import html
import importlib.util
import json
import math
import time
from typing import Callable

from evotrainer.backtest import measured
from evotrainer.evolve.stats.final import ci_name
from evotrainer.report.charts import Chart, HLine, Series, plotly_div, svg
from evotrainer.report.gather import CURVES, RunData, Version
from evotrainer.report.timeline import overlaps, timeline_svg
from evotrainer.report.tree import color, tree_svg

ENGINES = ("auto", "plotly", "svg")
CURVE_TITLES = {"reward_mean": "reward (harness)", "score_mean": "verifier score", "dead_groups": "dead groups",
                "entropy": "entropy", "length_mean": "completion length (tokens)"}

STYLE = """
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1320px;padding:12px 24px;color:#222}
h1{font-size:22px} h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;margin:6px 0} td,th{border:1px solid #ddd;padding:3px 7px;
text-align:left;vertical-align:top} th{background:#f4f4f4} .muted{color:#888} .grid{display:flex;flex-wrap:wrap;gap:6px}
.grid>div,.grid>svg{flex:0 0 640px} pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:11px}
.add{color:#1a7f37} .del{color:#cf222e} .lab{font-weight:bold} .scroll{overflow-x:auto}
"""


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}"


def esc(x) -> str:
    return html.escape(str(x))


def resolve_engine(engine: str) -> str:
    from evotrainer.errors import UsageError
    if engine not in ENGINES:
        raise UsageError(f"unknown report engine '{engine}'; valid choices: {', '.join(ENGINES)}")
    if engine == "auto":
        return "plotly" if importlib.util.find_spec("plotly") else "svg"
    if engine == "plotly" and not importlib.util.find_spec("plotly"):
        raise UsageError("the plotly engine needs plotly: pip install 'evotrainer[report]' (or --engine svg)")
    return engine


# ------------------------------------------------------------------ charts from the run's data

def fitness_chart(versions: list[Version]) -> Chart:
    trained = [v for v in versions if v.version and v.val]
    names = [f"{v.version} {v.intervention}" for v in trained]
    return Chart("fitness", "validation and test accuracy per version (mean over the search seeds)", "version",
                 "accuracy %", (Series("validation", names, [100 * v.mean_val for v in trained]),
                                Series("test (never used to decide)", names, [100 * v.mean_test for v in trained])),
                 kind="bar")


def gate_chart(versions: list[Version], noise_sd: float | None) -> Chart:
    gated = [v for v in versions if v.gain is not None]
    names = [f"#{v.trial} {v.intervention}" for v in gated]
    lines = (HLine(100 * noise_sd, "noise sd (one pair)", "#d62728"),) if noise_sd else ()
    return Chart("gate", "paired validation gain over the control, and the bar it had to beat (min_gain plus "
                 "the one-sided t margin of the pooled test)", "trial", "points",
                 (Series("gain", names, [100 * v.gain for v in gated]),
                  Series("bar", names, [100 * v.bar if v.bar is not None else None for v in gated])),
                 kind="bar", hlines=lines)


def curve_charts(data: RunData) -> list[Chart]:
    out = []
    for key in CURVES:
        series = tuple(Series(f"{c.name} ({c.seeds} seed{'s' * (c.seeds > 1)})", c.steps, c.metrics[key],
                              dash=c.name.startswith("final"))
                       for c in data.curves if any(v is not None for v in c.metrics[key]))
        if series:
            out.append(Chart(f"curve-{key}", f"{CURVE_TITLES[key]} per training step", "step", key, series))
    return out


def diagnostic_charts(data: RunData) -> list[Chart]:
    out = []
    for d in data.diagnostics:
        lines = tuple(HLine(t, f"{sev} {'>' if d.above else '<'} {t:g}", c)
                      for t, sev, c in ((d.warn, "warning", "#ff7f0e"), (d.critical, "critical", "#d62728"))
                      if t is not None)
        series = tuple(Series(v, [p[0] for p in pts], [p[1] for p in pts]) for v, pts in d.points.items())
        out.append(Chart(f"diag-{d.name}", f"{d.name} ({d.layer})", "step (end of window)", d.name, series,
                         hlines=lines))
    return out


def final_chart(final: dict) -> Chart:
    splits = [("val", "validation"), ("test", "test")]

    def mean_sd(split: str, arm: str) -> tuple[float, float]:
        x = final["comparison"][split][arm]
        return x["mean"], x["sd"] if math.isfinite(x["sd"]) else 0.0   # sd is nan with one seed
    arms = tuple(Series(arm, [n for _, n in splits], [mean_sd(s, arm)[0] for s, _ in splits],
                        err=[(m - sd, m + sd) for m, sd in (mean_sd(s, arm) for s, _ in splits)])
                 for arm in ("reference", "evolved"))
    diff = Series(f"evolved - reference ({ci_name(final['comparison']['test']['difference'])})", [n for _, n in splits],
                  [final["comparison"][s]["difference"]["mean"] for s, _ in splits],
                  err=[tuple(final["comparison"][s]["difference"]["ci"]) for s, _ in splits])
    return Chart("final-chart", "final comparison on fresh seeds (bars: mean; whiskers: sd, or the CI)", "split",
                 "accuracy %", (*arms, diff), kind="bar",
                 hlines=(HLine(100 * final["base"]["val"], "base (validation)"),))


# ------------------------------------------------------------------ tables and text

def glance(data: RunData) -> str:
    st = data.status
    rows = [("state", st["state"]), ("task", st.get("task")), ("base", st.get("base")), ("backend", st.get("backend")),
            ("device", st.get("device")), ("policy", st.get("policy")), ("sandbox", st.get("sandbox")),
            ("trials", f"{st['trials']} finished, {len(data.in_flight)} in flight: "
                       + ", ".join(f"{k} {v}" for k, v in st["labels"].items())),
            ("noise floor", f"sd of a paired re-run of the root (same problems, other sampling seeds), the "
                            f"gate's null: {100 * data.noise_sd:.2f} points"
             if data.noise_sd is not None else "not measured yet"),
            ("time", f"{st['wall_s']:.0f} s controller wall, {st['train_s']:.0f} s training, {st['eval_s']:.0f} s "
                     f"evaluation, framework overhead {st['framework_overhead']}")]
    return "<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows if v is not None) + "</table>"


def trials_table(versions: list[Version], best: list[str]) -> str:
    head = ("trial", "version", "parent", "intervention", "label", "val %", "test %", "gain", "bar", "backtest",
            "reflection")
    rows = []
    for v in versions:
        bt = v.backtest.get("label", "") if v.backtest else ""
        reasons = "; ".join(map(str, v.backtest.get("reasons", []))) if v.backtest else ""
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in (
            v.trial, f"<b>{esc(v.version)}</b>" if v.version in best else esc(v.version or "(refused)"),
            esc(" x ".join(v.parents)), esc(v.intervention),
            f'<span class="lab" style="color:{color(v.label)}">{esc(v.label)}</span>', pct(v.mean_val),
            pct(v.mean_test), "" if v.gain is None else f"{100 * v.gain:+.2f}",
            "" if v.bar is None else f"{100 * v.bar:.2f}", esc(f"{bt} {reasons}".strip()), esc(v.reflection))) + "</tr>")
    return ("<table id=\"trials\"><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows)
            + "</table>")


def backtest_table(versions: list[Version]) -> str:
    """What the backtest said on cached rollouts, beside what training the change later showed."""
    rows, tables = [], measured.read()  # what such verdicts predicted on the landscape tables
    for v in versions:
        if not v.backtest:
            continue
        said = v.backtest.get("label", "")
        if v.backtest.get("judged") is False:  # a pass of a change it cannot see: nothing to agree with
            said = "unjudged (it cannot see this change: the rollouts' rewards, filter and advantages are the parent's)"
            showed, agree = f"{v.label}" + ("" if v.gain is None else f": gain {100 * v.gain:+.2f}"), ""
        elif v.label == "backtest_rejected":
            showed, agree = "not trained (rejected before training)", ""
        elif v.gain is None:
            showed, agree = f"{v.label}", ""
        else:
            showed = f"{v.label}: gain {100 * v.gain:+.2f} against a bar of {100 * (v.bar or 0):.2f}"
            agree = "agreed" if (said == "passed") == (v.label == "kept") else "training disagreed"
        so_far = measured.verdict_note(v.backtest.get("label", ""), v.backtest.get("judged") is not False, tables) \
            if v.backtest.get("label") in ("passed", "backtest_rejected") else ""
        rows.append(f"<tr><td>{v.trial}</td><td>{esc(v.intervention)}</td><td>{esc(said)} "
                    f"{esc('; '.join(map(str, v.backtest.get('reasons', []))))}</td><td>{esc(so_far)}</td>"
                    f"<td>{esc(showed)}</td><td>{agree}</td></tr>")
    if not rows:
        return '<p class="muted">no backtest recorded</p>'
    return ("<table><tr><th>trial</th><th>intervention</th><th>backtest said</th><th>what such a verdict predicted"
            "</th><th>training showed</th><th></th></tr>" + "".join(rows) + "</table>"
            f'<p class="muted">{esc(measured.summary(tables))}</p>')


def findings_table(versions: list[Version]) -> str:
    rows = [f"<tr><td>{v.version or v.trial}</td><td>{esc(f['diagnostic'])}</td><td>{esc(f['severity'])}"
            f"{' (blocking)' if f.get('blocking') else ''}</td><td>{f['value']}</td><td>{esc(f['thresholds'])}</td>"
            f"<td>{esc(f['suggest'])}</td></tr>" for v in versions for f in v.findings]
    if not rows:
        return '<p class="muted">no finding recorded</p>'
    return ("<table><tr><th>version</th><th>diagnostic</th><th>severity</th><th>value</th><th>thresholds</th>"
            "<th>suggests</th></tr>" + "".join(rows) + "</table>")


def blackboard_list(versions: list[Version]) -> str:
    """What each proposal made beside running trials read off the blackboard (search.concurrency
    > 1): the trials in flight, and the outcomes that came in while it was being made."""
    rows = [f"<li>trial {v.trial} [{esc(v.intervention)}, {esc(v.surface)}]: {esc(v.proposed)}</li>"
            for v in versions if v.proposed]
    return f'<ul class="blackboard">{"".join(rows)}</ul>' if rows else ""


def controller_table(st: dict) -> str:
    """The search controller's revisions of its policy (search.controller: evolving), each with
    what changed, why, and the trials whose outcomes it cites."""
    rows = [f"<tr><td>r{r['revision']}</td><td>{r['after']}</td><td>{esc('; '.join(r['changes']))}</td>"
            f"<td>{esc(r['reason'])}</td><td>{esc(', '.join(map(str, r['cites'])))}</td></tr>"
            for r in st.get("controller_revisions") or []]
    if not rows:
        return '<p class="muted">no revision: the search ran on its starting policy (search.controller: fixed, ' \
               'or too few trials yet)</p>'
    return ('<table id="controller"><tr><th>revision</th><th>after trial</th><th>what changed</th><th>why</th>'
            "<th>trials cited</th></tr>" + "".join(rows) + "</table>")


def why_winner(data: RunData) -> str:
    """The rule that picked the winner, beside every kept version's validation score: the
    winner is the best validated state, which need not be the last version kept."""
    kept = [v for v in data.versions if v.label == "kept" and v.mean_val is not None]
    listed = ", ".join(f"{v.version}@{v.depth} {100 * v.mean_val:.1f}%" for v in kept) or "none"
    return ('<p class="muted" id="why-winner">chosen on validation only: the state (a version at a depth) with the '
            "highest mean validation accuracy over its seeds, deeper on ties; not the last version kept. "
            f"Kept versions' validation at their trial: {esc(listed)}.</p>")


def final_section(data: RunData) -> str:
    if not data.final:
        return '<p class="muted" id="final-table">no final comparison yet (the run is in progress or stopped before it)</p>'
    f = data.final
    cells = []
    for arm in ("reference", "evolved", "difference"):
        tds = []
        for split in ("val", "test"):
            x = f["comparison"][split][arm]
            ci = f" {ci_name(x)} [{x['ci'][0]:+.1f}, {x['ci'][1]:+.1f}]" if "ci" in x else ""
            sd = "" if x["sd"] != x["sd"] else f" ± {x['sd']:.1f}"   # nan with one seed
            tds.append(f"<td>{x['mean']:.1f}{sd}{ci}</td><td>{esc(x['per_seed'])}</td>")
        cells.append(f"<tr><th>{'evolved - reference' if arm == 'difference' else arm}</th>{''.join(tds)}</tr>")
    base = f"<tr><th>base</th><td>{100 * f['base']['val']:.1f}</td><td></td><td>{100 * f['base']['test']:.1f}</td><td></td></tr>"
    return (f"<p>winner <b>{esc(f['winner'])}</b>, schedule {esc(' -> '.join(f['schedule']))}, fresh seeds "
            f"{esc(f['seeds'])}, {f['total_steps']} steps each</p>{why_winner(data)}"
            "<table id=\"final-table\"><tr><th></th><th>validation %</th><th>per seed</th><th>test %</th>"
            f"<th>per seed</th></tr>{base}{''.join(cells)}</table><pre>{esc(data.final_table)}</pre>")


def diffs(versions: list[Version]) -> str:
    out = []
    for v in versions:
        if not v.patch.strip():
            continue
        lines = []
        for line in v.patch.splitlines():
            cls = "add" if line.startswith("+") and not line.startswith("+++") else \
                "del" if line.startswith("-") and not line.startswith("---") else ""
            lines.append(f'<span class="{cls}">{esc(line)}</span>' if cls else esc(line))
        out.append(f"<details><summary>{esc(v.version or '(refused)')} #{v.trial} [{esc(v.intervention)}] "
                   f"{esc(v.label)}: {esc(v.hypothesis[:160])}</summary><pre>{chr(10).join(lines)}</pre></details>")
    return "".join(out) or '<p class="muted">no diff (the root only)</p>'


# ------------------------------------------------------------------ the page

def drawing(engine: str) -> tuple[Callable[[list[Chart]], str], str]:
    """A grid of charts drawn by `engine`, and the page's script (plotly's, inlined once)."""
    draw: Callable[[Chart], str] = plotly_div if engine == "plotly" else svg
    script = ""
    if engine == "plotly":
        from plotly.offline import get_plotlyjs
        script = f'<script type="text/javascript">{get_plotlyjs()}</script>'

    def grid(charts: list[Chart]) -> str:
        return '<div class="grid">' + "".join(f"<div>{draw(c)}</div>" for c in charts) + "</div>" if charts else \
            '<p class="muted">no data yet</p>'
    return grid, script


def page(title: str, heading: str, sections: list[tuple[str, str]], *, meta: dict, script: str, engine: str) -> str:
    body = "".join(f'<h2 id="sec-{esc(t.lower().split(":")[0].replace(" ", "-"))}">{esc(t)}</h2>{s}' for t, s in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>evotrainer: {esc(title)}'
            f'</title><style>{STYLE}</style>{script}<script type="application/json" id="report-meta">'
            f'{json.dumps(meta)}</script></head><body><h1>{heading}</h1><p class="muted">written '
            f'{time.strftime("%Y-%m-%d %H:%M:%S")} by <code>evotrainer report</code> ({engine} charts)</p>'
            f"{body}</body></html>")


def render(data: RunData, engine: str = "auto") -> str:
    engine = resolve_engine(engine)
    grid, script = drawing(engine)

    trained = [v for v in data.versions if v.val]
    gated = [v for v in data.versions if v.gain is not None]
    sections = [
        ("At a glance", glance(data)),
        ("Version tree", '<p class="muted">bold: the path to the winner; box colour: the label; hover a box for '
         'its hypothesis</p><div class="scroll">' + tree_svg(data.versions + data.in_flight, data.best_path)
         + "</div>"),
        ("Trials", trials_table(data.versions + data.in_flight, data.best_path)),
        ("Trials over time", '<p class="muted">each trial from its start to its end, coloured by its label; '
         'in brackets, the specialist\'s surface. Ran beside each other (search.concurrency): '
         + esc(", ".join(f"{a} and {b}" for a, b in overlaps(data.versions)) or "none, one trial at a time")
         + '</p><div class="scroll">' + timeline_svg(data.versions + data.in_flight) + "</div>"
         + blackboard_list(data.versions)),
        ("Fitness per version", grid([fitness_chart(data.versions)] if trained else [])),
        ("Gate: gains, bars and the noise floor", grid([gate_chart(data.versions, data.noise_sd)] if gated else [])),
        ("Backtest verdicts beside training", backtest_table(data.versions)),
        ("Search controller", '<p class="muted">the search\'s own policy (frontier, selection temperature, '
         'crossover rate, when to roll back, family weights), revised from the lineage; RUN/controller/ keeps '
         'each revision</p>' + controller_table(data.status)),
        ("Training curves", '<p class="muted">mean over seeds per step; dashed: the final comparison, retrained from the base</p>'
         + grid(curve_charts(data))),
        ("Diagnostics over time", '<p class="muted">the built-in diagnostics on consecutive windows of the first '
         'seed\'s rollouts, with their warning and critical thresholds; a harness\'s own diagnostics appear in '
         'the findings below</p>' + grid(diagnostic_charts(data)) + "<h3>Findings recorded per version</h3>"
         + findings_table(data.versions)),
        ("Final comparison", final_section(data) + (grid([final_chart(data.final)]) if data.final else "")),
        ("Diffs", diffs(data.versions)),
        ("Config", f"<pre>{esc(data.config)}</pre>" if data.config else '<p class="muted">no config.yaml</p>'),
    ]
    return page(data.run.name, f"evotrainer run <code>{esc(data.run)}</code>", sections,
                meta={"run": str(data.run), "engine": engine, "state": data.status["state"]}, script=script,
                engine=engine)
