"""Charts as plain data, and the two ways to draw them.

A `Chart` says what to show (series, threshold lines, axis titles). `plotly_div` draws it
with plotly when the `report` extra is installed (interactive: zoom, hover, toggle a series);
`svg` draws the same chart as a static inline SVG with no script, the fallback when plotly is
not installed. Either way the page needs nothing from the network: plotly's script is
inlined once in the page (report/page.py), and the SVG is plain markup.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Sequence

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Series:
    name: str
    x: Sequence                     # numbers (lines) or category names (bars)
    y: Sequence[float | None]       # None: a gap
    err: Sequence[tuple[float, float]] | None = None   # (low, high) per point: error bars of a bar chart
    dash: bool = False


@dataclass(frozen=True)
class HLine:
    y: float
    name: str
    color: str = "#999999"


@dataclass(frozen=True)
class Chart:
    id: str                          # the element id (the test finds charts by it)
    title: str
    x_title: str
    y_title: str
    series: tuple[Series, ...]
    kind: str = "line"               # line | bar
    hlines: tuple[HLine, ...] = field(default=())


def plotly_div(chart: Chart) -> str:
    """The chart as a plotly <div> and its inline call; plotly.js itself is inlined once per page."""
    import plotly.graph_objects as go
    import plotly.io as pio
    fig = go.Figure()
    for i, s in enumerate(chart.series):
        color = PALETTE[i % len(PALETTE)]
        if chart.kind == "bar":
            err = None if s.err is None else dict(
                type="data", symmetric=False, array=[hi - y if y is not None else 0 for y, (_, hi) in zip(s.y, s.err)],
                arrayminus=[y - lo if y is not None else 0 for y, (lo, _) in zip(s.y, s.err)])
            fig.add_bar(name=s.name, x=list(s.x), y=list(s.y), error_y=err, marker_color=color)
        else:
            fig.add_scatter(name=s.name, x=list(s.x), y=list(s.y), mode="lines", connectgaps=False,
                            line=dict(color=color, dash="dash" if s.dash else "solid", width=1.6))
    for h in chart.hlines:
        fig.add_hline(y=h.y, line=dict(color=h.color, dash="dot", width=1.2), annotation_text=h.name,
                      annotation_position="top left", annotation_font_size=10)
    fig.update_layout(title=dict(text=chart.title, font_size=14), xaxis_title=chart.x_title,
                      yaxis_title=chart.y_title, width=630, height=320, margin=dict(l=55, r=15, t=40, b=45),
                      legend=dict(font_size=10), template="plotly_white", barmode="group")
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=chart.id,
                       config={"displaylogo": False})


# ------------------------------------------------------------------ the SVG fallback

W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 300, 58, 150, 30, 42


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"


def svg(chart: Chart) -> str:
    """The chart as inline SVG: axes with ticks, one polyline (or bar group) per series, legend."""
    ys = [y for s in chart.series for y in s.y if y is not None and math.isfinite(y)]
    ys += [v for s in chart.series if s.err for e in s.err for v in e if math.isfinite(v)]
    ys += [h.y for h in chart.hlines]
    if chart.kind == "bar":
        ys.append(0.0)
    if not ys:
        return f'<div class="chart" id="{chart.id}"><p class="muted">{html.escape(chart.title)}: no data yet</p></div>'
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def Y(v: float) -> float:
        return TOP + ph * (1 - (v - lo) / (hi - lo))

    out = [f'<svg class="chart" id="{chart.id}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           f'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="10">',
           f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{html.escape(chart.title)}</text>']
    for t in _ticks(lo, hi):
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{Y(t):.1f}" y2="{Y(t):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 4}" y="{Y(t) + 3:.1f}" text-anchor="end">{_fmt(t)}</text>')
    if chart.kind == "bar":
        cats = list(dict.fromkeys(c for s in chart.series for c in s.x))
        slot = pw / max(len(cats), 1)
        bw = slot * 0.8 / max(len(chart.series), 1)
        for si, s in enumerate(chart.series):
            color = PALETTE[si % len(PALETTE)]
            for j, (c, y) in enumerate(zip(s.x, s.y)):
                if y is None:
                    continue
                x0 = LEFT + cats.index(c) * slot + slot * 0.1 + si * bw
                top, base = min(Y(y), Y(0)), max(Y(y), Y(0))
                out.append(f'<rect x="{x0:.1f}" y="{top:.1f}" width="{bw:.1f}" height="{base - top:.1f}" '
                           f'fill="{color}"><title>{html.escape(f"{s.name} {c}: {y:.3g}")}</title></rect>')
                if s.err and all(math.isfinite(v) for v in s.err[j]):
                    elo, ehi = s.err[j]
                    xm = x0 + bw / 2
                    out.append(f'<line x1="{xm:.1f}" x2="{xm:.1f}" y1="{Y(elo):.1f}" y2="{Y(ehi):.1f}" stroke="#333"/>')
        for i, c in enumerate(cats):
            out.append(f'<text x="{LEFT + (i + 0.5) * slot:.1f}" y="{TOP + ph + 14}" text-anchor="middle">'
                       f'{html.escape(str(c))}</text>')
    else:
        xs = [x for s in chart.series for x in s.x]
        x0, x1 = (min(xs), max(xs)) if xs else (0, 1)
        x1 = x1 if x1 > x0 else x0 + 1

        def X(v: float) -> float:
            return LEFT + pw * (v - x0) / (x1 - x0)

        for t in _ticks(x0, x1):
            out.append(f'<text x="{X(t):.1f}" y="{TOP + ph + 14}" text-anchor="middle">{_fmt(t)}</text>')
        for si, s in enumerate(chart.series):
            color = PALETTE[si % len(PALETTE)]
            dash = ' stroke-dasharray="4 3"' if s.dash else ""
            run: list[str] = []
            for x, y in [*zip(s.x, s.y), (None, None)]:   # a None ends a stretch of line
                if y is None or not math.isfinite(y):
                    if run:
                        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"'
                                   f'{dash} points="{" ".join(run)}"/>')
                    run = []
                else:
                    run.append(f"{X(x):.1f},{Y(y):.1f}")
    for h in chart.hlines:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{Y(h.y):.1f}" y2="{Y(h.y):.1f}" stroke="{h.color}" '
                   f'stroke-dasharray="2 3"/><text x="{LEFT + 3}" y="{Y(h.y) - 3:.1f}" fill="{h.color}">'
                   f'{html.escape(h.name)}</text>')
    out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + ph}" stroke="#333"/>'
               f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{TOP + ph}" y2="{TOP + ph}" stroke="#333"/>'
               f'<text x="{LEFT + pw / 2}" y="{H - 6}" text-anchor="middle">{html.escape(chart.x_title)}</text>'
               f'<text transform="translate(12 {TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{html.escape(chart.y_title)}</text>')
    for si, s in enumerate(chart.series):
        y = TOP + 8 + 14 * si
        out.append(f'<rect x="{W - RIGHT + 10}" y="{y - 7}" width="10" height="8" fill="{PALETTE[si % len(PALETTE)]}"/>'
                   f'<text x="{W - RIGHT + 24}" y="{y}">{html.escape(s.name[:24])}</text>')
    out.append("</svg>")
    return "".join(out)
