"""SVG made in Python for the HTML report: graph pictures (laid out by :mod:`.layout`) and bar charts.

Nothing here needs Graphviz, a browser library or the network: the SVG text is put inline in the page.
A graph picture is one ``<g class="node ...">`` per node, with the node's id in ``data-node`` and an id
``{prefix}-n{node}``, and one ``<path class="edge">`` per input edge; a tooltip (``<title>``) per node.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..ir.graph import Graph, Node, format_attrs
from .layout import layered_layout

CHAR_WIDTH = 6.7  # px per character of the 11 px monospace font the boxes use
LINE_HEIGHT = 13.0
BOX_PADDING = 8.0
SERIES_COLORS = ("#9aa5b1", "#f4a259", "#5b8def", "#6ab187", "#c76b98")


@dataclass
class NodeStyle:
    """How one node is drawn: CSS classes, extra ``data-*`` attributes, a link and tooltip lines."""

    classes: list[str] = field(default_factory=list)
    data: dict[str, str] = field(default_factory=dict)
    href: str | None = None
    tooltip: list[str] = field(default_factory=list)


def graph_svg(graph: Graph, prefix: str, styles: Mapping[int, NodeStyle]) -> str:
    """An SVG picture of ``graph``: a box per node (``%id Op`` and its type, or its name for a leaf), an arrow per
    input edge, laid out top-down in layers."""
    labels = {n.id: _node_lines(n) for n in graph.nodes}
    sizes = {nid: (max(len(line) for line in lines) * CHAR_WIDTH + 2 * BOX_PADDING,
                   len(lines) * LINE_HEIGHT + BOX_PADDING) for nid, lines in labels.items()}
    layout = layered_layout([n.id for n in graph.nodes], {n.id: n.inputs for n in graph.nodes}, sizes)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" id="{prefix}" width="{layout.width:.0f}" '
           f'height="{layout.height:.0f}" viewBox="0 0 {layout.width:.0f} {layout.height:.0f}" '
           f'data-nodes="{len(graph)}" role="img" aria-label="{html.escape(graph.name)}: {len(graph)} nodes">',
           f'<defs><marker id="{prefix}-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#666"/></marker>'
           '</defs>', '<g class="edges">']
    for (source, target), points in layout.edges.items():
        out.append(f'<path class="edge" data-from="{source}" data-to="{target}" d="{_curve(points)}" '
                   f'marker-end="url(#{prefix}-arrow)"/>')
    out.append('</g><g class="nodes">')
    for n in graph.nodes:
        style = styles.get(n.id, NodeStyle())
        (x, y), (w, h) = layout.positions[n.id], sizes[n.id]
        data = "".join(f' data-{k}="{html.escape(v)}"' for k, v in style.data.items())
        body = [f'<title>{html.escape(chr(10).join([*labels[n.id][:1], *style.tooltip, _signature(n)]))}</title>',
                f'<rect x="{x - w / 2:.1f}" y="{y - h / 2:.1f}" width="{w:.1f}" height="{h:.1f}" rx="5"/>']
        for k, line in enumerate(labels[n.id]):
            ty = y - h / 2 + BOX_PADDING / 2 + LINE_HEIGHT * (k + 0.8)
            body.append(f'<text x="{x:.1f}" y="{ty:.1f}"{" class=\"sub\"" if k else ""}>{html.escape(line)}</text>')
        inner = "".join(body)
        if style.href:
            inner = f'<a href="{html.escape(style.href)}">{inner}</a>'
        out.append(f'<g class="{" ".join(["node", *style.classes])}" id="{prefix}-n{n.id}" '
                   f'data-node="{n.id}"{data}>{inner}</g>')
    out.append("</g></svg>")
    return "".join(out)


def _node_lines(n: Node) -> list[str]:
    first = f"%{n.id} {n.op}"
    return [first, n.name] if n.name else [first, str(n.type)]


def _signature(n: Node) -> str:
    return f"{n.op}{format_attrs(n.attrs)} -> {n.type}"


def _curve(points: Sequence[tuple[float, float]]) -> str:
    """A smooth path through ``points`` (vertical tangents at each point)."""
    (x0, y0), parts = points[0], [f"M {points[0][0]:.1f} {points[0][1]:.1f}"]
    for x1, y1 in points[1:]:
        mid = (y0 + y1) / 2
        parts.append(f"C {x0:.1f} {mid:.1f} {x1:.1f} {mid:.1f} {x1:.1f} {y1:.1f}")
        x0, y0 = x1, y1
    return " ".join(parts)


def bar_chart(title: str, rows: Sequence[tuple[str, Sequence[float]]], series: Sequence[str], unit: str = "",
              label_width: float | None = None) -> str:
    """Horizontal bars: one group per row (label, one value per series), a legend when there are several series,
    each bar's value written after it.  Infinite values are drawn as a full bar marked ``inf``."""
    finite = [v for _, values in rows for v in values if math.isfinite(v)]
    top = max(finite, default=0.0) or 1.0
    label_w = label_width if label_width is not None else \
        min(260.0, max((len(label) for label, _ in rows), default=4) * CHAR_WIDTH + 10)
    bar_h, inner, value_w = 11.0, 420.0, 90.0
    group_h = bar_h * len(series) + 6
    legend_h = 18.0 if len(series) > 1 else 0.0
    height = 24 + legend_h + group_h * len(rows) + 6
    width = label_w + inner + value_w
    out = _chart_start(title, width, height, series if legend_h else (), label_w)
    y = 24 + legend_h
    for label, values in rows:
        out.append(f'<text class="label" x="{label_w - 6:.0f}" y="{y + group_h / 2 + 3:.1f}" text-anchor="end">'
                   f'{html.escape(_clip(label, int(label_w / CHAR_WIDTH) - 1))}<title>{html.escape(label)}</title>'
                   '</text>')
        for k, value in enumerate(values):
            length = inner if not math.isfinite(value) else inner * max(value, 0.0) / top
            by = y + 3 + k * bar_h
            out.append(f'<rect class="bar" x="{label_w:.0f}" y="{by:.1f}" width="{length:.1f}" height="{bar_h - 2:.0f}"'
                       f' fill="{SERIES_COLORS[k % 5]}"><title>{html.escape(f"{label}, {series[k]}: ")}'
                       f'{_number(value)}{html.escape(unit)}</title></rect>'
                       f'<text class="value" x="{label_w + length + 4:.1f}" y="{by + bar_h - 3:.1f}">'
                       f'{_number(value)}{html.escape(unit)}</text>')
        y += group_h
    out.append("</svg>")
    return "".join(out)


def column_chart(title: str, values: Sequence[float], groups: Sequence[str], ylabel: str) -> str:
    """Vertical columns, one per value, coloured by their group (e.g. the saturation stage of an iteration), with a
    legend of the groups in order of appearance."""
    names = list(dict.fromkeys(groups))
    top = max(values, default=0.0) or 1.0
    col, gap, plot_h, left = 14.0, 3.0, 140.0, 56.0
    width = max(left + len(values) * (col + gap) + 10, 320.0)
    height = 24 + 18 + plot_h + 22
    out = _chart_start(title, width, height, names, left)
    base = 42 + plot_h
    out.append(f'<text class="label" x="{left - 6:.0f}" y="{42 + 8:.0f}" text-anchor="end">{_number(top)}</text>'
               f'<text class="label" x="{left - 6:.0f}" y="{base:.0f}" text-anchor="end">0</text>'
               f'<line x1="{left:.0f}" y1="{base:.0f}" x2="{width - 5:.0f}" y2="{base:.0f}" stroke="#999"/>')
    for k, (value, group) in enumerate(zip(values, groups, strict=True)):
        h = plot_h * value / top
        out.append(f'<rect class="bar" x="{left + k * (col + gap):.1f}" y="{base - h:.1f}" width="{col:.0f}" '
                   f'height="{h:.1f}" fill="{SERIES_COLORS[names.index(group) % 5]}"><title>{k + 1}: '
                   f'{html.escape(group)}, {_number(value)} {html.escape(ylabel)}</title></rect>')
    out.append(f'<text class="label" x="{left:.0f}" y="{base + 16:.0f}">{html.escape(ylabel)} after each iteration, '
               'in order</text></svg>')
    return "".join(out)


def _chart_start(title: str, width: float, height: float, legend: Sequence[str], legend_x: float) -> list[str]:
    """A chart's ``<svg>`` opening, its title, and a legend of ``legend`` (coloured as the series) from ``legend_x``."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{html.escape(title)}">',
           f'<text class="title" x="0" y="14">{html.escape(title)}</text>']
    x = legend_x
    for k, name in enumerate(legend):
        out.append(f'<rect x="{x:.0f}" y="22" width="10" height="10" fill="{SERIES_COLORS[k % 5]}"/>'
                   f'<text x="{x + 14:.0f}" y="31">{html.escape(name)}</text>')
        x += 24 + len(name) * CHAR_WIDTH
    return out


def _number(value: float) -> str:
    if not math.isfinite(value):
        return "inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _clip(text: str, length: int) -> str:
    return text if len(text) <= length else text[:max(length - 1, 1)] + "…"
