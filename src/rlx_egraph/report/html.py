"""The optimize report as one self-contained HTML page (``report.to_html()``), or a block of a notebook.

Everything is inline (CSS, SVG made in Python, a short script): the page needs no network, no Graphviz and no
JavaScript library; without scripts it still shows everything, and links between the tables and the pictures
work (``:target`` highlights what a link points at).  Sections:

* the summary: nodes, predicted time, kernel launches, fused ops, missed fusions, whether values were checked;
* the input graph and the optimized graph side by side (:mod:`.svg`, at most :data:`MAX_DRAWN_NODES` nodes each):
  fused nodes orange, other nodes rules built yellow; a node's link leads to its row in the fusions table; the
  script highlights, on hover or click, the input-graph nodes a fused node computes and back;
* the fused nodes: the rules that built each one, the input-graph nodes whose value it holds and those it computes
  on the way (no longer computed on their own);
* the missed fusions, with why;
* the cost profile as charts: predicted time per op kind, the cost model's terms, launches and bytes moved;
* the e-graph (egglog engine): size, growth per iteration, e-nodes per op, the largest e-classes, rule matches;
* the rules that fired, whether and how values were checked, and the time per phase.
"""

from __future__ import annotations

import html
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..ir.graph import Graph
from ..ir.registry import Kind
from .dot import BUILT_COLOR, FUSED_COLOR, LEAF_COLOR
from .svg import NodeStyle, bar_chart, column_chart, graph_svg

if TYPE_CHECKING:
    from .optimize_report import OptimizeReport

MAX_DRAWN_NODES = 1500  # per graph; a larger graph is listed in the tables but not drawn
MAX_TABLE_ROWS = 2000
LARGEST_ECLASSES = 12
_BLOCKS = itertools.count(1)  # notebook blocks get distinct ids

CSS = """
.rlx-report{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;font-size:14px;
  color:#1d2530;line-height:1.4}
.rlx-report h1{font-size:22px;margin:0 0 4px}.rlx-report h2{font-size:18px;margin:26px 0 8px;
  border-bottom:1px solid #d8dde3;padding-bottom:3px}.rlx-report h3{font-size:15px;margin:14px 0 6px}
.rlx-report .sub{color:#5b6573}.rlx-report code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.rlx-report .cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.rlx-report .card{border:1px solid #d8dde3;border-radius:6px;padding:8px 12px;min-width:150px;background:#fafbfc}
.rlx-report .card b{display:block;font-size:18px}.rlx-report .card span{color:#5b6573;font-size:12px}
.rlx-report .ok{color:#2e7d32}.rlx-report .bad{color:#c62828}.rlx-report .warn{color:#a66300}
.rlx-report table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
.rlx-report th,.rlx-report td{border:1px solid #d8dde3;padding:3px 7px;text-align:left;vertical-align:top}
.rlx-report th{background:#f1f3f5}.rlx-report td.num{text-align:right;font-variant-numeric:tabular-nums}
.rlx-report tr:target,.rlx-report tr.hl{background:#fff3c4}
.rlx-report .side{display:flex;gap:12px;align-items:flex-start}
.rlx-report figure{flex:1 1 0;margin:0;min-width:0;border:1px solid #d8dde3;border-radius:6px}
.rlx-report figcaption{padding:5px 9px;background:#f1f3f5;border-bottom:1px solid #d8dde3;font-weight:600}
.rlx-report .scroll{overflow:auto;max-height:78vh;background:#fff}
.rlx-report .scroll svg.graph{max-width:100%;height:auto}
.rlx-report svg.graph text{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px;text-anchor:middle;
  fill:#1d2530}
.rlx-report svg.graph text.sub{fill:#5b6573}
.rlx-report svg.graph .node rect{fill:#fff;stroke:#555;stroke-width:1}
.rlx-report svg.graph .node.leaf rect{fill:LEAF}.rlx-report svg.graph .node.built rect{fill:BUILT}
.rlx-report svg.graph .node.fused rect{fill:FUSED;stroke:#8a4b12}
.rlx-report svg.graph .node.replaced rect{fill:#fde7d3;stroke-dasharray:4 2}
.rlx-report svg.graph .node.output rect{stroke-width:2.5}
.rlx-report svg.graph .node:target rect,.rlx-report svg.graph .node.hl rect{stroke:#d81b60;stroke-width:3}
.rlx-report svg.graph .edge{fill:none;stroke:#8a939e;stroke-width:1}
.rlx-report svg.graph a{cursor:pointer}
.rlx-report svg.chart text{font-size:11px;fill:#1d2530}.rlx-report svg.chart text.title{font-weight:600;font-size:12px}
.rlx-report .charts{display:flex;flex-wrap:wrap;gap:18px}
.rlx-report .legend span{display:inline-block;padding:1px 8px;margin-right:6px;border:1px solid #555;
  border-radius:4px;font-size:12px}
.rlx-report .zoom button{font-size:12px;margin-left:4px}
""".replace("LEAF", LEAF_COLOR).replace("BUILT", BUILT_COLOR).replace("FUSED", FUSED_COLOR)

# Highlighting between the pictures and the tables; zoom buttons.  Scoped to one report block.
SCRIPT = """
(function (root) {
  if (!root) return;
  root.classList.add("scripted");
  const byId = (id) => root.querySelector("#" + CSS.escape(id));
  const clear = () => root.querySelectorAll(".hl").forEach((e) => e.classList.remove("hl"));
  function mark(node) {
    clear();
    const own = node.closest("svg").id, other = own.endsWith("-after") ? own.replace(/-after$/, "-before")
      : own.replace(/-before$/, "-after");
    node.classList.add("hl");
    const ids = (node.dataset.computes || "").split(" ").filter((s) => s);
    for (const id of ids) { const e = byId(other + "-n" + id); if (e) e.classList.add("hl"); }
    const row = byId(root.id + "-fusion-" + (node.dataset.fusion || ""));
    if (row) row.classList.add("hl");
  }
  root.querySelectorAll("svg.graph .node").forEach((node) => {
    node.addEventListener("mouseenter", () => mark(node));
  });
  root.querySelectorAll(".zoom button").forEach((button) => {
    button.addEventListener("click", () => {
      const svg = byId(button.dataset.target);
      svg.style.maxWidth = "none";
      const w = Number(svg.getAttribute("data-width") || svg.getAttribute("width"));
      svg.setAttribute("data-width", String(w));
      const now = svg.getBoundingClientRect().width;
      const f = button.dataset.zoom === "fit" ? svg.parentElement.clientWidth / w
        : now / w * (button.dataset.zoom === "in" ? 1.25 : 0.8);
      svg.setAttribute("width", String(w * f));
      svg.setAttribute("height", String(Number(svg.viewBox.baseVal.height) * f));
    });
  });
  const drawn = [...root.querySelectorAll("svg.graph")].map((svg) =>
    svg.id.replace(root.id + "-", "") + ":" + svg.querySelectorAll("g.node").length + ":" +
    Math.round(svg.getBBox().width));
  root.setAttribute("data-drawn", drawn.join(" "));
})(document.getElementById("ROOT"));
"""


def report_html(report: OptimizeReport, title: str | None = None) -> str:
    """The whole page (see the module doc)."""
    name = report.graphs[0].name if report.graphs else "graph"
    heading = title or f"rlx-egraph optimize report: {name}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{_e(heading)}</title>"
            f"<style>body{{margin:18px}}{CSS}</style></head><body>\n{report_block(report, 'rlx', heading)}\n"
            "</body></html>\n")


def notebook_html(report: OptimizeReport) -> str:
    """The report as a block of a notebook's output: the page's body, with ids of its own."""
    return f"<style>{CSS}</style>" + report_block(report, f"rlx{next(_BLOCKS)}", "rlx-egraph optimize report")


def report_block(report: OptimizeReport, root: str, heading: str) -> str:
    """The report inside ``<div class="rlx-report" id=root>`` and its script."""
    sections = [_summary(report, heading), _graphs(report, root), _fusions(report, root), _missed(report, root),
                _cost(report), _egraph(report), _rules(report, root), _verification(report), _timing(report)]
    script = SCRIPT.replace("ROOT", root)
    return f'<div class="rlx-report" id="{root}">{"".join(sections)}</div><script>{script}</script>'


# --- sections ------------------------------------------------------------------------------------------------------


def _summary(report: OptimizeReport, heading: str) -> str:
    before, after = report.profile_before, report.profile_after
    cards = [_card(f"{report.nodes_before:,} → {report.nodes_after:,}", "nodes")]
    if before is not None and after is not None:
        gain = 100 * (1 - after.ns / before.ns) if before.ns else 0.0
        cards += [_card(f"{before.ns / 1000:,.1f} → {after.ns / 1000:,.1f} µs", f"predicted time ({gain:.0f}% lower)"),
                  _card(f"{before.launches:,} → {after.launches:,}", "kernel launches"),
                  _card(f"{_bytes(before.traffic_bytes)} → {_bytes(after.traffic_bytes)}", "bytes moved")]
    fused = sum(report.fused_op_counts.values())
    cards.append(_card(f"{fused:,}", "fused-op nodes built"))
    missed = len(report.fusion.missed)
    unchecked = report.engine == "egglog" and not report.fusion.near_misses_checked
    cards.append(_card(f"{missed:,}", "missed fusions" + (" (near misses not checked)" if unchecked else ""),
                       "warn" if missed else ""))
    checked = report.parity
    cards.append(_card("ok" if checked is not None and checked.ok else "FAILED" if checked is not None
                       else "not checked", "values (parity)",
                       "ok" if checked is not None and checked.ok else "bad" if checked is not None else "warn"))
    facts = [f"<b>{_e(report.engine)}</b> engine ({_e(report.engine_reason)})", f"target <b>{_e(report.target)}</b>",
             f"stopped: {_e(report.stop_reason)}"]
    return (f'<header><h1>{_e(heading)}</h1><p class="sub">{"; ".join(facts)}</p></header>'
            f'<section class="summary"><div class="cards">{"".join(cards)}</div>'
            f'<p>{"<br>".join(_e(line) for line in report.verification_lines())}</p></section>')


def _graphs(report: OptimizeReport, root: str) -> str:
    head = "<h2>The graphs</h2>"
    if report.graphs is None:
        return head + "<p>This report has no graphs (made by <code>optimize()</code>, which keeps no summaries).</p>"
    before, after = report.graphs
    computes = computed_originals(report)
    fusion_of = {f.node: f for f in report.fusions}
    replaced_by: dict[int, list[int]] = {}
    for node, originals in computes.items():
        for o in originals:
            replaced_by.setdefault(o, []).append(node)
    after_styles: dict[int, NodeStyle] = {}
    for n in after.nodes:
        style = NodeStyle(_kind_classes(n.id, n.kind, fusion_of, after.outputs))
        fusion = fusion_of.get(n.id)
        if fusion is not None:
            style.data = {"computes": " ".join(map(str, computes.get(n.id, ()))), "fusion": str(n.id)}
            style.href = f"#{root}-fusion-{n.id}"
            style.tooltip = [f"built by: {', '.join(fusion.rules) or '?'}",
                             "computes input node(s): " + (", ".join(f"%{o}" for o in computes.get(n.id, ())) or
                                                           "none")]
        after_styles[n.id] = style
    before_styles: dict[int, NodeStyle] = {}
    for n in before.nodes:
        classes = ["leaf"] if n.kind is Kind.LEAF else []
        if n.id in before.outputs:
            classes.append("output")
        style = NodeStyle(classes)
        users = replaced_by.get(n.id)
        if users:
            style.classes.append("replaced")
            style.data = {"computes": " ".join(map(str, users)), "fusion": str(users[0])}
            style.href = f"#{root}-fusion-{users[0]}"
            style.tooltip = ["computed by optimized node(s): " + ", ".join(f"%{u} {fusion_of[u].op}" for u in users)]
        before_styles[n.id] = style
    legend = (f'<p class="legend"><span style="background:{LEAF_COLOR}">input, parameter</span>'
              f'<span style="background:{FUSED_COLOR}">fused op</span>'
              f'<span style="background:{BUILT_COLOR}">other node a rule built</span>'
              '<span style="background:#fde7d3;border-style:dashed">input node a fused node computes</span>'
              '<span style="border-width:2.5px">graph output</span> '
              'Hover a node to see what it became (or what it computes); click it for its row below.</p>')
    figures = [_figure(f"input graph: {before.name}, {len(before):,} nodes", before, f"{root}-before", before_styles),
               _figure(f"optimized graph: {len(after):,} nodes", after, f"{root}-after", after_styles)]
    return head + legend + f'<div class="side">{"".join(figures)}</div>'


def _figure(caption: str, graph: Graph, svg_id: str, styles: Mapping[int, NodeStyle]) -> str:
    if len(graph) > MAX_DRAWN_NODES:
        body = (f'<p class="warn" style="padding:8px">Not drawn: {len(graph):,} nodes is over the '
                f"{MAX_DRAWN_NODES:,} this page draws; the tables below list every fused node.</p>")
        zoom = ""
    else:
        body = f'<div class="scroll">{graph_svg(graph, svg_id, styles)}</div>'
        zoom = "".join(f'<button type="button" data-target="{svg_id}" data-zoom="{z}">{label}</button>'
                       for z, label in (("out", "&minus;"), ("in", "+"), ("fit", "fit")))
    return (f'<figure><figcaption>{_e(caption)}<span class="zoom" style="float:right">{zoom}</span></figcaption>'
            f"{body}</figure>")


def _fusions(report: OptimizeReport, root: str) -> str:
    computes = computed_originals(report)
    rows = []
    for f in report.fusions[:MAX_TABLE_ROWS]:
        replaced = set(f.replaces)
        cells = [_link(f"{root}-after-n{f.node}", f"%{f.node}"), f"<code>{_e(f.op)}</code>",
                 ", ".join(_link(f"{root}-rule-{r}", r) for r in f.rules) or "—",
                 ", ".join(_link(f"{root}-before-n{o}", f"<b>%{o}</b>" if o in replaced else f"%{o}", escape=False)
                           for o in computes.get(f.node, ())) or "—"]
        rows.append(f'<tr id="{root}-fusion-{f.node}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    more = _more(len(report.fusions))
    note = ("<p>Each node the input graph did not have, with the rules that built it and the input-graph nodes it "
            "computes: in bold those whose value it holds, the others it computes on the way (the optimized graph "
            "no longer computes them on their own).</p>")
    if not rows:
        return "<h2>Fused nodes</h2><p>No node was built by a rule: the optimized graph is made of input nodes.</p>"
    return (f"<h2>Fused nodes ({len(report.fusions):,})</h2>{note}" + _table(
        ["optimized node", "op", "built by", "input-graph nodes it computes"], rows) + more)


def _missed(report: OptimizeReport, root: str) -> str:
    fusion = report.fusion
    head = f"<h2>Missed fusions ({len(fusion.missed):,})</h2>"
    if report.engine != "egglog":
        return head + "<p>Missed fusions are found on the e-graph; the fallback engine builds none.</p>"
    checked = "" if fusion.near_misses_checked else \
        " Near misses were not looked for (the graph is over the size they are checked at)."
    if not fusion.missed:
        return head + f"<p>None: every fused op the rules could build was taken.{checked}</p>"
    rows = []
    for m in fusion.missed[:MAX_TABLE_ROWS]:
        nodes = ", ".join(_link(f"{root}-before-n{n}", f"%{n}") for n in m.nodes) or "—"
        costs = "" if m.fused_ns is None or m.chosen_ns is None else \
            f"{m.chosen_ns:,.0f} ns chosen, {m.fused_ns:,.0f} ns with it"
        cells = [_e(m.kind), f"<code>{_e(m.op)}</code>", nodes, f"<b>{_e(m.reason)}</b>: {_e(m.detail)}",
                 f"{_link(f'{root}-rule-{m.rule}', m.rule)}<br><code>{_e(m.location)}</code>", costs]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return head + f"<p>{_e(fusion.summary_line())}.{checked}</p>" + _table(
        ["kind", "fused op", "at input nodes", "why", "rule", "predicted cost"], rows) + _more(len(fusion.missed))


def _cost(report: OptimizeReport) -> str:
    before, after = report.profile_before, report.profile_after
    head = "<h2>Cost profile</h2>"
    if before is None or after is None:
        return head + "<p>No profile (made by <code>optimize()</code>).</p>"
    kinds = list(dict.fromkeys([*before.by_kind, *after.by_kind]))
    per_kind = [(k, [before.kind_ns(k) if k in before.by_kind else 0.0,
                     after.kind_ns(k) if k in after.by_kind else 0.0]) for k in kinds]
    per_kind.sort(key=lambda row: -max(row[1]))
    terms_b, terms_a = before.breakdown(), after.breakdown()
    terms = [(t, [terms_b[t], terms_a[t]]) for t in terms_b if terms_b[t] or terms_a[t]]
    counts = [("kernel launches", [before.launches, after.launches]),
              ("host syncs", [before.sync_points, after.sync_points]),
              ("MB moved", [before.traffic_bytes / 1e6, after.traffic_bytes / 1e6]),
              ("MFLOP", [before.flops / 1e6, after.flops / 1e6])]
    series = ["before", "after"]
    charts = [bar_chart(f"predicted time per op kind ({report.target}, ns)", per_kind, series, " ns"),
              bar_chart("predicted time by term of the cost model (ns)", terms, series, " ns"),
              bar_chart("counts", counts, series)]
    nodes = [(k, [before.by_kind[k].nodes if k in before.by_kind else 0,
                  after.by_kind[k].nodes if k in after.by_kind else 0]) for k in kinds]
    charts.append(bar_chart("nodes per op kind", nodes, series))
    return (head + f"<p>Predicted under the <code>{_e(report.target)}</code> cost model: before "
            f"<code>{_e(str(before))}</code>, after <code>{_e(str(after))}</code>.</p>"
            f'<div class="charts">{"".join(charts)}</div>')


def _egraph(report: OptimizeReport) -> str:
    head = "<h2>E-graph</h2>"
    if report.engine != "egglog":
        fb = report.fallback
        text = "" if fb is None else (f" {sum(fb.commits.values()):,} rewrites committed in "
                                      f"{sum(fb.passes.values()):,} passes; stopped: {_e(fb.stop_reason)}.")
        return head + f"<p>The fallback engine matched the rules on the graph itself: no e-graph.{text}</p>"
    iterations = report.iterations
    stages = list(dict.fromkeys(it.stage for it in iterations))
    cards = [_card(f"{report.eclasses:,}", "e-classes"), _card(f"{report.enodes:,}", "e-nodes"),
             _card(f"{len(iterations):,}", f"iterations over {len(stages)} stages"),
             _card(_e(report.extraction or "—"), f"extraction ({report.extraction_moves:,} local-search moves)")]
    if report.exact_ns is not None:
        cards.append(_card(f"{report.extracted_ns - report.exact_ns:,.0f} ns", "gap to the exact extraction"))
    parts = [head, f'<div class="cards">{"".join(cards)}</div>', f"<p>stopped: {_e(report.stop_reason)}</p>"]
    charts = []
    if iterations:
        charts.append(column_chart("e-graph growth", [it.enodes for it in iterations], [it.stage for it in iterations],
                                   "e-nodes"))
    fired = sorted(((r, n) for r, n in report.matches_per_rule.items() if n), key=lambda kv: (-kv[1], kv[0]))
    if fired:
        charts.append(bar_chart("rule matches (summed over iterations)", [(r, [n]) for r, n in fired], ["matches"]))
    enodes = report.data.enodes
    if enodes:
        per_op = Counter(row["op"] for row in enodes)
        chosen = Counter(row["op"] for row in enodes if row["chosen"])
        ops = sorted(per_op, key=lambda op: (-per_op[op], op))
        charts.append(bar_chart("e-nodes per op", [(op, [per_op[op], chosen[op]]) for op in ops],
                                ["e-nodes", "chosen by extraction"]))
    parts.append(f'<div class="charts">{"".join(charts)}</div>')
    if enodes:
        parts.append(_largest_eclasses(report))
    return "".join(parts)


def _largest_eclasses(report: OptimizeReport) -> str:
    by_class: dict[int, list[dict[str, Any]]] = {}
    for row in report.data.enodes:
        by_class.setdefault(row["eclass"], []).append(row)
    largest = sorted(report.data.eclasses, key=lambda c: (-c["enodes"], c["eclass"]))[:LARGEST_ECLASSES]
    rows = []
    for c in largest:
        members = sorted(by_class.get(c["eclass"], ()), key=lambda r: (not r["chosen"], r["cost_ns"], r["enode"]))
        listed = "<br>".join(f'{"★ " if r["chosen"] else ""}<code>{_e(r["op"])}</code> {r["cost_ns"]:,.0f} ns'
                             + (f' <span class="sub">({_e(", ".join(r["built_by"]))})</span>' if r["built_by"] else "")
                             for r in members)
        originals = ", ".join(f"%{o}" for o in c["originals"]) or "—"
        rows.append(f'<tr><td class="num">{c["eclass"]}</td><td><code>{_e(c["type"])}</code></td>'
                    f'<td class="num">{c["enodes"]}</td><td>{listed}</td><td>{originals}</td></tr>')
    return ("<h3>The largest e-classes</h3><p>★ marks the e-node extraction chose; each e-node's own predicted cost "
            "and the rules that built it.</p>" + _table(["e-class", "type", "e-nodes", "e-nodes (op, cost, rules)",
                                                        "input nodes in it"], rows))


def _rules(report: OptimizeReport, root: str) -> str:
    applications = report.applications_per_rule
    built = Counter(r for f in report.fusions for r in f.rules)
    known = {r["name"]: r for r in report.rules}
    names = sorted({*(r for r, n in report.matches_per_rule.items() if n), *built, *(r for r, n in applications.items()
                                                                                     if n)})
    if not names:
        return f"<h2>Rules</h2><p>No rule matched ({len(report.rules):,} loaded).</p>"
    rows = []
    for name in names:
        rule = known.get(name, {})
        cells = [f"<code>{_e(name)}</code>", _e(rule.get("stage", "")), f"<code>{_e(rule.get('location', ''))}</code>",
                 f"{report.matches_per_rule.get(name, 0):,}", f"{applications.get(name, 0):,}", f"{built[name]:,}"]
        rows.append(f'<tr id="{root}-rule-{_e(name)}">' + "".join(
            f'<td{" class=num" if k >= 3 else ""}>{c}</td>' for k, c in enumerate(cells)) + "</tr>")
    return (f"<h2>Rules ({len(names)} of {len(report.rules):,} fired)</h2>" +
            _table(["rule", "stage", "where", "matches", "applications", "nodes of the result it built"], rows))


def _verification(report: OptimizeReport) -> str:
    head = "<h2>Values checked</h2>" + "".join(f"<p>{_e(line)}</p>" for line in report.verification_lines())
    parity = report.parity
    if parity is None or not parity.nodes:
        return head
    worst = sorted(parity.nodes, key=lambda n: -n.tolerance_ratio)[:10]
    rows = []
    for n in worst:
        compared = f"%{n.original}" + (f", output {n.output}" if n.output is not None else "") + \
            (" (end to end)" if n.end_to_end else "")
        cells = [f"%{n.node} <code>{_e(n.op)}</code>", compared, n.seed, f"{n.max_abs:.3g}", f"{n.tolerance_ratio:.3g}"]
        rows.append("<tr>" + "".join(f"<td{' class=num' if k >= 2 else ''}>{c}</td>" for k, c in enumerate(cells))
                    + "</tr>")
    return head + "<h3>The closest calls</h3>" + _table(
        ["optimized node", "compared with", "seed", "max |difference|", "of its tolerance"], rows)


def _timing(report: OptimizeReport) -> str:
    if not report.phases:
        return ""
    return "<h2>Time per phase</h2>" + bar_chart("seconds", [(k, [v]) for k, v in report.phases.items()], ["seconds"],
                                                 " s")


# --- helpers -------------------------------------------------------------------------------------------------------


def computed_originals(report: OptimizeReport) -> dict[int, list[int]]:
    """For each node a rule built (``report.fusions``): the input-graph nodes it computes, in input-graph order.

    It computes the input-graph values it holds (its ``replaces``), or for a node that holds none (a matmul of
    concatenated weights) the input-graph nodes that read the weights it reads; and those values' ancestors that
    the optimized graph holds no value of, up to a value it holds or one that a node before it computes.  A node
    computed from weights alone (concatenated weights) computes none.
    """
    if report.graphs is None:
        return {f.node: sorted(f.replaces) for f in report.fusions}
    before, after = report.graphs
    by_id, position = before.nodes_by_id, before.positions()
    originals = {row["node"]: row["replaces"] for row in report.data.provenance}
    held = {o for values in originals.values() for o in values}
    from_weights: dict[int, set[int]] = {}  # optimized node computed from leaves alone -> the Params behind it
    for node in after.nodes:
        if node.op == "Input":
            continue
        if node.kind is Kind.LEAF:
            from_weights[node.id] = set(originals.get(node.id, ())) if node.op == "Param" else set()
        elif all(i in from_weights for i in node.inputs):
            from_weights[node.id] = {p for i in node.inputs for p in from_weights[i]}
    covered: set[int] = set()
    out: dict[int, list[int]] = {}
    for fusion in sorted(report.fusions, key=lambda f: after.positions()[f.node]):
        node = after.node(fusion.node)
        if node.id in from_weights:
            out[node.id] = []
            continue
        weights = {p for i in node.inputs if i in from_weights for p in from_weights[i]}
        ends = set(fusion.replaces) or {r for p in weights for r in before.users(p)}
        seen = set(ends)
        stack = [i for o in ends for i in by_id[o].inputs]
        while stack:
            original = stack.pop()
            if original in seen or original in held or original in covered:
                continue
            seen.add(original)
            stack.extend(by_id[original].inputs)
        covered |= seen
        out[node.id] = sorted(seen, key=position.__getitem__)
    return out


def _kind_classes(node: int, kind: Kind, fusion_of: Mapping[int, Any], outputs: Iterable[int]) -> list[str]:
    classes = []
    if kind is Kind.LEAF:
        classes.append("leaf")
    elif kind is Kind.FUSED:
        classes.append("fused")
    elif node in fusion_of:
        classes.append("built")
    if node in outputs:
        classes.append("output")
    return classes


def _card(value: str, label: str, tone: str = "") -> str:
    tone = f' class="{tone}"' if tone else ""
    return f'<div class="card"><b{tone}>{_e(value)}</b><span>{_e(label)}</span></div>'


def _table(header: Sequence[str], rows: Sequence[str]) -> str:
    return "<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr></thead><tbody>" + \
        "".join(rows) + "</tbody></table>"


def _more(total: int) -> str:
    return f"<p>The first {MAX_TABLE_ROWS:,} of {total:,} are listed.</p>" if total > MAX_TABLE_ROWS else ""


def _link(target: str, text: str, escape: bool = True) -> str:
    return f'<a href="#{_e(target)}">{_e(text) if escape else text}</a>'


def _bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:,.1f} {unit}"
    return f"{count:,.0f} B"


def _e(text: object) -> str:
    return html.escape(str(text))


__all__ = ["MAX_DRAWN_NODES", "computed_originals", "notebook_html", "report_html"]
