"""Pictures of graphs and e-graphs as Graphviz DOT text, and SVG where Graphviz is installed.

``graph_to_dot(graph, provenance)`` draws a MIR graph: leaves as grey ellipses, outputs with a double
border, fused ops (kind ``fused``) filled orange, other nodes that rules built filled yellow; a node's
tooltip holds its attributes, its type and, with provenance, the rules that built it and the input
nodes it replaces.  ``egraph_to_dot(graph)`` saturates a (small) graph and draws its e-graph from
egglog's own serializer: one dashed box per e-class, one box per e-node, fact tables left out.
``Picture(dot)`` shows as SVG in Jupyter.  ``to_svg(dot)`` renders DOT with the ``graphviz`` Python
package, which needs Graphviz's ``dot`` program (``apt-get install graphviz``, ``brew install graphviz``
or ``conda install graphviz``).
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..egraph.decode import Fusion
from ..egraph.encode import NODE_TABLE
from ..egraph.schema import LIST_CONS, LIST_NIL, NO_INPUT
from ..errors import RlxError
from ..ir.graph import Graph, format_attrs
from ..ir.registry import REGISTRY, Kind

FUSED_COLOR = "#f4a259"  # a node of a fused op
BUILT_COLOR = "#f9e07f"  # another node a rule built (e.g. a Silu recognised from its export form)
LEAF_COLOR = "#e0e0e0"
TERM_OPS = frozenset(REGISTRY) | {NO_INPUT, LIST_CONS, LIST_NIL}  # e-nodes drawn as boxes; other data is inlined

MISSING_GRAPHVIZ = ("this picture needs Graphviz's 'dot' program, which is not on the PATH (apt-get install graphviz, "
                    "brew install graphviz or conda install graphviz); report.to_html() draws graphs without it")
CHOSEN_MARK = "★ "  # before the op of an e-node extraction chose

if TYPE_CHECKING:
    from .optimize_report import OptimizeReport

Provenance = Any  # an OptimizeReport (its ``fusions``), a mapping node id -> Fusion, or an iterable of Fusions


class RenderError(RlxError, RuntimeError):
    """DOT text could not be rendered (Graphviz is missing or refused it)."""


@dataclass(frozen=True)
class Picture:
    """DOT text that Jupyter shows as SVG where Graphviz can render it, else as the text itself."""

    dot: str

    def _repr_svg_(self) -> str | None:
        return to_svg(self.dot) if can_render() else None

    def _repr_html_(self) -> str | None:
        """Without Graphviz: what to install, and the DOT text (with it, Jupyter shows the SVG)."""
        if can_render():
            return None
        return (f'<div class="rlx-picture"><p><b>{html.escape(MISSING_GRAPHVIZ)}</b></p><details><summary>DOT text'
                f"</summary><pre>{html.escape(self.dot)}</pre></details></div>")

    def __repr__(self) -> str:
        return self.dot


def graph_to_dot(graph: Graph, provenance: Provenance = None) -> str:
    """DOT text of ``graph``; ``provenance`` (e.g. the report of the run that made it) adds rules to tooltips."""
    fusions = fusions_by_node(provenance)
    outputs = set(graph.outputs)
    lines = [f"digraph {_quote(graph.name)} {{", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor=white, fontname=helvetica, fontsize=10];',
             "  edge [arrowsize=0.6];"]
    for n in graph.nodes:
        label = f"%{n.id} {n.op}" + (f"\n{n.name}" if n.name else "") + f"\n{n.type}"
        tip = [f"%{n.id} {n.op}{format_attrs(n.attrs)}", str(n.type)]
        style = {"fillcolor": LEAF_COLOR, "shape": "ellipse"} if n.kind is Kind.LEAF else {}
        if n.kind is Kind.FUSED:
            style["fillcolor"] = FUSED_COLOR
        fusion = fusions.get(n.id)
        if fusion is not None:
            style.setdefault("fillcolor", BUILT_COLOR)
            tip.append(f"built by: {', '.join(fusion.rules) or '?'}")
            tip.append("replaces input node(s): " + (", ".join(f"%{i}" for i in fusion.replaces) or "none"))
        if n.id in outputs:
            style["peripheries"] = "2"
        attrs = {"label": label, "tooltip": "\n".join(tip), **style}
        lines.append(f"  n{n.id} [{_attr_list(attrs)}];")
        lines.extend(f"  n{i} -> n{n.id};" for i in dict.fromkeys(n.inputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


def fusions_by_node(provenance: Provenance) -> dict[int, Fusion]:
    """``provenance`` as a mapping node id -> Fusion (see :data:`Provenance`)."""
    if provenance is None:
        return {}
    if hasattr(provenance, "fusions"):
        provenance = provenance.fusions
    if isinstance(provenance, Mapping):
        items = list(provenance.values())
    elif isinstance(provenance, Iterable):
        items = list(provenance)
    else:
        raise TypeError(f"provenance must be an OptimizeReport, a mapping node id -> Fusion or Fusions, "
                        f"not {type(provenance).__name__}")
    bad = next((f for f in items if not isinstance(f, Fusion)), None)
    if bad is not None:
        raise TypeError(f"provenance holds {type(bad).__name__} {bad!r}, not a Fusion")
    return {f.node: f for f in items}


def egraph_to_dot(graph: Graph, rules: Any = None, attention_block_max_tokens: int = 64, **limits: Any) -> str:
    """DOT text of ``graph``'s e-graph after saturation with ``rules`` (None: the shipped ones).

    Meant for small graphs: every e-class reachable from the outputs is drawn.  E-nodes of fused ops are
    orange; an e-node's tooltip names the rules that built it.  ``limits``: SaturationLimits fields.
    """
    return serialized_to_dot(serialized_egraph(graph, rules, attention_block_max_tokens, **limits), graph.name)


def report_egraph_to_dot(report: OptimizeReport, max_enodes: int = 2000) -> str:
    """DOT text of the e-graph of a run, from ``report.data`` (nothing is saturated again): one dashed box per
    e-class, named after its chosen op and its index (``MatMul-12``) with its type and the input nodes in it; one
    box per e-node with its op and attributes; ``★`` and a thick border mark the e-nodes extraction chose, fused
    ops are orange and other e-nodes rules built yellow (the tooltip names the rules)."""
    enodes, eclasses = report.data.enodes, report.data.eclasses
    if not enodes:
        raise ValueError("the report has no e-graph tables (the fallback engine ran, or optimize() made the run)")
    if len(enodes) > max_enodes:
        raise ValueError(f"the e-graph has {len(enodes):,} e-nodes, over max_enodes={max_enodes:,}")
    members: dict[int, list[dict[str, Any]]] = {}
    for row in enodes:
        members.setdefault(row["eclass"], []).append(row)
    lines = ['digraph "egraph" {', "  compound=true; rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor=white, fontname=helvetica, fontsize=10];',
             "  edge [arrowsize=0.6];"]
    edges = []
    for c in eclasses:
        rows = members.get(c["eclass"], [])
        if not rows:
            continue
        chosen = next((r for r in rows if r["chosen"]), rows[0])
        inputs = f"\ninput nodes {', '.join(f'%{o}' for o in c['originals'])}" if c["originals"] else ""
        label = f"{chosen['op']}-{c['eclass']} {c['type']}{inputs}"
        lines.append(f"  subgraph cluster_{c['eclass']} {{ style=dashed; color=grey50; label={_quote(label)};")
        for r in rows:
            attrs = format_attrs({k: tuple(v) if isinstance(v, list) else v for k, v in r["attrs"].items()})
            node = {"label": (CHOSEN_MARK if r["chosen"] else "") + r["op"] + attrs + f"\n{r['cost_ns']:,.0f} ns"}
            if r["kind"] == Kind.FUSED.value:
                node["fillcolor"] = FUSED_COLOR
            elif r["built_by"]:
                node["fillcolor"] = BUILT_COLOR
            if r["chosen"]:
                node["penwidth"] = "2.5"
            node["tooltip"] = f"built by: {', '.join(r['built_by'])}" if r["built_by"] else "from the input graph"
            lines.append(f"    e{r['enode']} [{_attr_list(node)}];")
            edges.extend(f"  e{r['enode']} -> e{members[child][0]['enode']} [lhead=cluster_{child}];"
                         for child in dict.fromkeys(r["children"]) if child in members)
        lines.append("  }")
    return "\n".join([*lines, *edges, "}"]) + "\n"


def serialized_egraph(graph: Graph, rules: Any = None, attention_block_max_tokens: int = 64,
                      **limits: Any) -> dict[str, Any]:
    """egglog's serialization (``SerializedEGraph.to_json``, parsed) of ``graph``'s saturated e-graph:
    ``nodes`` (id -> op, children, eclass), ``class_data`` and ``root_eclasses`` (the outputs')."""
    from ..egraph.budget import Deadline
    from ..egraph.rules import load_rules
    from ..egraph.saturate import SaturationLimits, saturate
    from ..optimize import build_egraph

    ruleset, sat_limits = load_rules(rules), SaturationLimits(**limits)
    egraph, _ = build_egraph(graph, ruleset, attention_block_max_tokens)
    saturate(egraph, ruleset, sat_limits, Deadline(sat_limits.max_seconds))
    roots = [cmd.action.expr for o in graph.outputs for cmd in egraph.parse_program(f"({NODE_TABLE} {o})")]
    return json.loads(egraph.serialize(roots).to_json())


def serialized_to_dot(data: dict[str, Any], name: str = "egraph") -> str:
    """DOT text of egglog's serialized e-graph ``data`` (``SerializedEGraph.to_json``): term e-classes as
    clusters, term e-nodes as boxes with their data arguments inlined, provenance rows as tooltips."""
    nodes: dict[str, dict[str, Any]] = data["nodes"]
    built = _built_by(nodes)
    classes = term_classes(data)
    anchor = {cls: members[0] for cls, members in classes.items()}
    cluster = {cls: k for k, cls in enumerate(classes)}
    lines = [f"digraph {_quote(name)} {{", "  compound=true; rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor=white, fontname=helvetica, fontsize=10];',
             "  edge [arrowsize=0.6];"]
    edges = []
    for cls, members in classes.items():
        lines.append(f"  subgraph cluster_{cluster[cls]} {{ style=dashed; color=grey50; label={_quote(cls)};")
        for nid in members:
            node = nodes[nid]
            args = [_value_text(nodes, c) for c in node["children"] if nodes[c]["eclass"] not in classes]
            attrs = {"label": node["op"] + (f"\n{', '.join(args)}" if args else "")}
            rules = built.get(_enode_key(nodes, nid))
            if node["op"] in REGISTRY and REGISTRY[node["op"]].kind is Kind.FUSED:
                attrs["fillcolor"] = FUSED_COLOR
            elif rules:
                attrs["fillcolor"] = BUILT_COLOR
            attrs["tooltip"] = f"built by: {', '.join(rules)}" if rules else "from the input graph"
            lines.append(f"    {_quote(nid)} [{_attr_list(attrs)}];")
            edges.extend(f"  {_quote(nid)} -> {_quote(anchor[c_cls])} [lhead=cluster_{cluster[c_cls]}];"
                         for c_cls in dict.fromkeys(nodes[c]["eclass"] for c in node["children"])
                         if c_cls in classes)
        lines.append("  }")
    return "\n".join([*lines, *edges, "}"]) + "\n"


def term_classes(data: dict[str, Any]) -> dict[str, list[str]]:
    """The term e-classes (ops and tensor lists; data and fact tables left out) of a serialized e-graph:
    e-class id -> the ids of its e-nodes, in serialization order."""
    classes: dict[str, list[str]] = {}
    for nid, node in data["nodes"].items():
        if node["op"] in TERM_OPS:
            classes.setdefault(node["eclass"], []).append(nid)
    return classes


def can_render() -> bool:
    """Whether :func:`to_svg` can work here: the ``graphviz`` package and the ``dot`` program are installed."""
    try:
        import graphviz  # noqa: F401
    except ImportError:
        return False
    return shutil.which("dot") is not None


def to_svg(dot: str) -> str:
    """SVG text of ``dot`` rendered by Graphviz; RenderError saying what to install when it cannot."""
    try:
        import graphviz
    except ImportError as exc:  # egglog depends on it: only a broken install lacks it
        raise RenderError("rendering SVG needs the graphviz Python package (pip install graphviz) and the "
                          "Graphviz 'dot' program (apt-get install graphviz)") from exc
    try:
        return graphviz.Source(dot).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound as exc:
        raise RenderError("rendering SVG needs the Graphviz 'dot' program on the PATH "
                          "(apt-get install graphviz, brew install graphviz or conda install graphviz)") from exc
    except graphviz.CalledProcessError as exc:
        raise RenderError(f"Graphviz 'dot' refused the DOT text: {exc.stderr}") from exc


def _built_by(nodes: Mapping[str, dict[str, Any]]) -> dict[tuple[Any, ...], list[str]]:
    """E-node key -> the rules that built it, from the ``built-<Op>`` provenance rows."""
    built: dict[tuple[Any, ...], list[str]] = {}
    for node in nodes.values():
        if node["op"].startswith("built-"):
            *args, rule = node["children"]
            key = (node["op"].removeprefix("built-"), *(nodes[a]["eclass"] for a in args))
            built.setdefault(key, []).append(json.loads(nodes[rule]["op"]))
    return {k: sorted(set(v)) for k, v in built.items()}


def _enode_key(nodes: Mapping[str, dict[str, Any]], nid: str) -> tuple[Any, ...]:
    return (nodes[nid]["op"], *(nodes[c]["eclass"] for c in nodes[nid]["children"]))


def _value_text(nodes: Mapping[str, dict[str, Any]], nid: str) -> str:
    """A data argument as text: a literal, or a vector ``[4, 64]``."""
    node = nodes[nid]
    if not node["children"]:
        return node["op"]
    inner = ", ".join(_value_text(nodes, c) for c in node["children"])
    return f"[{inner}]" if node["op"] == "vec-of" else f"({node['op']} {inner})"


def _quote(text: str) -> str:
    """A DOT double-quoted string (backslashes and quotes escaped, newlines as centred line breaks)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attr_list(attrs: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={_quote(value)}" for key, value in attrs.items())
