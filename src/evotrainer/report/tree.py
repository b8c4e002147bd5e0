"""The version tree as inline SVG: each trial a box under its parent, the best path drawn bold.

Layout is a plain left-to-right tree: a node's column is its generation, its row comes from
a depth-first walk, so siblings stack and a subtree stays together. A crossover's second
parent gets a dashed edge. Trials refused before committing a version hang under their
parent as boxes with no version name.
"""
from __future__ import annotations

import html
from typing import Sequence

from evotrainer.report.gather import Version

COLORS = {"in flight": "#1f77b4", "kept": "#2ca02c", "discarded": "#7f7f7f", "invalid": "#d62728", "crash": "#ff7f0e",
          "timeout": "#ff7f0e", "oom": "#ff7f0e", "bad_output": "#ff7f0e", "backtest_rejected": "#9467bd", "illegal": "#8c564b"}
BOX_W, BOX_H, COL, ROW = 200, 38, 240, 50


def color(label: str) -> str:
    return COLORS.get(label, "#bcbd22")


def layout(versions: Sequence[Version]) -> dict[int, tuple[int, int]]:
    """trial -> (column, row)."""
    by_version = {v.version: v for v in versions if v.version}
    children: dict[str | None, list[Version]] = {}
    for v in versions:
        parent = v.parents[0] if v.parents and v.parents[0] in by_version else None
        children.setdefault(parent, []).append(v)
    pos: dict[int, tuple[int, int]] = {}
    row = [0]

    def walk(parent: str | None, col: int) -> None:
        for v in children.get(parent, []):
            if v.trial in pos:
                continue
            pos[v.trial] = (col, row[0])
            row[0] += 1
            if v.version and v.version != parent:
                walk(v.version, col + 1)
    walk(None, 0)
    return pos


def tree_svg(versions: Sequence[Version], best: Sequence[str]) -> str:
    if not versions:
        return '<p class="muted">no trial has finished yet</p>'
    pos = layout(versions)
    at = {v.version: pos[v.trial] for v in versions if v.version}
    on_path = set(best)
    width = (max(c for c, _ in pos.values()) + 1) * COL
    height = (max(r for _, r in pos.values()) + 1) * ROW + 10
    out = [f'<svg id="tree" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="11">']
    for v in versions:                       # edges first, under the boxes
        c, r = pos[v.trial]
        for i, p in enumerate(v.parents):
            if p not in at:
                continue
            pc, pr = at[p]
            dash = ' stroke-dasharray="4 3"' if i else ""
            bold = i == 0 and v.version in on_path and p in on_path
            x1, y1, x2, y2 = pc * COL + BOX_W, pr * ROW + 5 + BOX_H / 2, c * COL, r * ROW + 5 + BOX_H / 2
            out.append(f'<path d="M{x1},{y1} C{x1 + 20},{y1} {x2 - 20},{y2} {x2},{y2}" fill="none" '
                       f'stroke="{"#111" if bold else "#aaa"}" stroke-width="{3 if bold else 1.2}"'
                       f'{dash}/>')
    for v in versions:
        c, r = pos[v.trial]
        x, y = c * COL, r * ROW + 5
        mean = f"val {100 * v.mean_val:.1f}%" if v.mean_val is not None else "not trained"
        gain = f", gain {100 * v.gain:+.1f}" if v.gain is not None else ""
        bold = v.version in on_path
        tip = f"trial {v.trial} {v.version or '(refused)'} [{v.intervention}] {v.label}: {v.hypothesis}"
        kind = " best" if bold else " pending" if v.label == "in flight" else ""
        out.append(f'<g class="node{kind}" data-trial="{v.trial}"><title>{html.escape(tip)}</title>'
                   f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="5" fill="#fff" '
                   f'stroke="{color(v.label)}" stroke-width="{3 if bold else 1.5}"/>'
                   f'<text x="{x + 6}" y="{y + 15}" font-weight="bold">{html.escape(v.version or "(refused)")} '
                   f'#{v.trial} {html.escape(v.intervention[:22])}</text>'
                   f'<text x="{x + 6}" y="{y + 30}" fill="{color(v.label)}">{html.escape(v.label)}'
                   f'<tspan fill="#333">: {mean}{gain}</tspan></text></g>')
    out.append("</svg>")
    return "".join(out)
