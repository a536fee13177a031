"""A MIR graph as Graphviz DOT text: leaves as grey ellipses, outputs with a double border, fused ops (kind
``fused``) filled orange, other nodes that rules built filled yellow; a node's tooltip holds its attributes, its
type and, with provenance, the rules that built it and the input nodes it replaces (``Graph.to_dot``).  The
pictures of e-graphs and their rendering are in :mod:`rlx_egraph.report.dot`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .provenance import Fusion
from .registry import Kind

if TYPE_CHECKING:
    from .graph import Graph

FUSED_COLOR = "#f4a259"  # a node of a fused op
BUILT_COLOR = "#f9e07f"  # another node a rule built (e.g. a Silu recognised from its export form)
LEAF_COLOR = "#e0e0e0"

Provenance = Any  # an OptimizeReport (its ``fusions``), a mapping node id -> Fusion, or an iterable of Fusions


def format_attrs(attrs: dict[str, Any]) -> str:
    if not attrs:
        return ""
    parts = []
    for key, value in attrs.items():
        if isinstance(value, np.ndarray):
            value = f"<{value.dtype}{list(value.shape)}>"
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, str) and len(value) > 40:
            value = value[:37] + "..."
        parts.append(f"{key}={value}")
    return "(" + ", ".join(parts) + ")"


def graph_to_dot(graph: Graph, provenance: Provenance = None) -> str:
    """DOT text of ``graph``; ``provenance`` (e.g. the report of the run that made it) adds rules to tooltips."""
    fusions = fusions_by_node(provenance)
    outputs = set(graph.outputs)
    lines = [f"digraph {quote(graph.name)} {{", "  rankdir=TB;",
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
        lines.append(f"  n{n.id} [{attr_list(attrs)}];")
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


def quote(text: str) -> str:
    """A DOT double-quoted string (backslashes and quotes escaped, newlines as centred line breaks)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def attr_list(attrs: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={quote(value)}" for key, value in attrs.items())
