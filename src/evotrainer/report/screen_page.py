"""The report of a screen (`evotrainer screen`): every single change from the root, each
trained from the base on the config's seeds, as a chart of paired gains with 95% intervals and
the table behind it. Read from the screen's rows (evolve/landscape.py): numbers the trusted
side computed from the evaluator's scores, never a job's own files.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from evotrainer.evolve.landscape import ROWS, Row, read_rows
from evotrainer.evolve.stats.paired import paired_differences, t_interval
from evotrainer.report.charts import Chart, HLine, Series
from evotrainer.report.page import drawing, esc, page, resolve_engine


def gain(row: Row, root: Row, split: str) -> tuple[float, float, float]:
    """Mean paired gain over the root in points, and its 95% t interval (nan with one seed)."""
    d = [100 * x for x in paired_differences(getattr(row, split), getattr(root, split))]
    lo, hi = t_interval(d) if len(d) > 1 else (float("nan"), float("nan"))
    return statistics.fmean(d), lo, hi


def gains_chart(rows: list[Row], root: Row, split: str) -> Chart:
    cells = [gain(r, root, split) for r in rows]
    return Chart(f"screen-{split}", f"{split} gain over the root", "change", "points",
                 (Series(split, [r.name for r in rows], [c[0] for c in cells], err=[(c[1], c[2]) for c in cells]),),
                 kind="bar", hlines=(HLine(0.0, "the root"),))


def table(rows: list[Row], root: Row, failed: list[Row]) -> str:
    def cell(r: Row, split: str) -> str:
        m, lo, hi = gain(r, root, split)
        return f"{m:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    body = "".join(f"<tr><td><code>{esc(r.name)}</code></td><td>{esc(', '.join(r.families))}</td>"
                   f"<td>{100 * statistics.fmean(r.val.values()):.1f}</td><td>{cell(r, 'val')}</td>"
                   f"<td>{100 * statistics.fmean(r.test.values()):.1f}</td><td>{cell(r, 'test')}</td></tr>"
                   for r in rows)
    body += "".join(f"<tr><td><code>{esc(r.name)}</code></td><td>{esc(', '.join(r.families))}</td>"
                    f"<td colspan=4>failed: {esc(r.failed)}</td></tr>" for r in failed)
    return ('<table id="screen"><tr><th>change</th><th>family</th><th>val %</th><th>val − root</th><th>test %</th>'
            f"<th>test − root</th></tr>{body}</table>")


def render_screen(d: Path, engine: str = "auto") -> str:
    engine = resolve_engine(engine)
    grid, script = drawing(engine)
    rows = read_rows(d / ROWS)
    root = rows["root"]
    done = sorted((r for r in rows.values() if r.val and r is not root),
                  key=lambda r: -gain(r, root, "val")[0])
    failed = [r for r in rows.values() if not r.val]
    seeds = sorted(root.val)
    sections = [
        ("At a glance", f"<p>The root: {100 * statistics.fmean(root.val.values()):.1f}% validation, "
         f"{100 * statistics.fmean(root.test.values()):.1f}% test on seeds {esc(seeds)}; {len(done)} changes "
         f"trained, {len(failed)} failed. Gains are paired by seed (points; mean and 95% t interval).</p>"),
        ("Gains", grid([gains_chart(done, root, "val"), gains_chart(done, root, "test")])),
        ("Every change", table(done, root, failed)),
    ]
    return page(d.name, f"evotrainer screen <code>{esc(d)}</code>", sections,
                meta={"run": str(d), "engine": engine, "state": "screened"}, script=script, engine=engine)
