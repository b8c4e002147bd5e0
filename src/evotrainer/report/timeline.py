"""Trials on a time axis: one bar per trial from its start to its end, so a run with
search.concurrency > 1 shows which trials ran beside which (and a sequential run shows where
its time went). Plain SVG, no script: it reads the same in any engine."""
from __future__ import annotations

import html
import time
from typing import Sequence

from evotrainer.report.gather import Version
from evotrainer.report.tree import color

ROW, LEFT, WIDTH = 18, 260, 760


def timeline_svg(versions: Sequence[Version], now: float | None = None) -> str:
    """A bar per trial with a start (in flight: up to `now`), coloured by its label; the label
    on the left names the trial, its change and its specialist's surface."""
    timed = sorted((v for v in versions if v.started is not None), key=lambda v: (v.started, v.trial))
    if not timed:
        return '<p class="muted">no trial has a recorded start</p>'
    now = now or time.time()
    t0 = min(v.started for v in timed)
    t1 = max((v.finished or now) for v in timed)
    scale = WIDTH / max(t1 - t0, 1e-9)
    rows = []
    for i, v in enumerate(timed):
        y, end = i * ROW + 4, v.finished or now
        x, w = LEFT + (v.started - t0) * scale, max((end - v.started) * scale, 2)
        name = f"{v.trial} {v.version or '-'} {v.intervention}"[:38] + (f" [{v.surface}]" if v.surface else "")
        tip = f"trial {v.trial}: {v.intervention} ({v.label}), {v.started - t0:.0f}-{end - t0:.0f} s"
        rows.append(f'<text x="4" y="{y + 12}" font-size="11">{html.escape(name)}</text>'
                    f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW - 6}" fill="{color(v.label)}">'
                    f'<title>{html.escape(tip)}</title></rect>')
    h = len(timed) * ROW + 24
    axis = (f'<line x1="{LEFT}" y1="{h - 16}" x2="{LEFT + WIDTH}" y2="{h - 16}" stroke="#999"/>'
            f'<text x="{LEFT}" y="{h - 3}" font-size="10">0 s</text>'
            f'<text x="{LEFT + WIDTH - 60}" y="{h - 3}" font-size="10">{t1 - t0:.0f} s</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 10}" height="{h}" '
            f'class="timeline">{"".join(rows)}{axis}</svg>')


def overlaps(versions: Sequence[Version]) -> list[tuple[int, int]]:
    """Pairs of trials (by number) whose spans overlap: which ran beside which."""
    timed = [v for v in versions if v.started is not None and v.finished is not None]
    return [(a.trial, b.trial) for i, a in enumerate(timed) for b in timed[i + 1:]
            if a.started < b.finished and b.started < a.finished]
