"""An interactive e-graph explorer: egglog-python's visualizer, fed the run's e-graph from ``report.data``.

``report.explore()`` gives an :class:`EGraphExplorer`.  In Jupyter it shows as egglog's visualizer widget
(anywidget, which egglog brings): e-classes as boxes you can filter and expand, e-nodes inside them, edges to
child e-classes, laid out by ELK.  Outside Jupyter ``save(path)`` writes the same visualizer as one HTML page
with egglog's JavaScript and CSS inline (about 4 MB; nothing is fetched).

What it shows is built from the report's tables, not from a new saturation: each e-class is named after its op
and its index (``FusedMatMulBiasAct-12``, where egglog would say ``Op-318``) and coloured by whether the
optimized graph computes it; each e-node is labelled with its op and attributes, ★ marking the e-node extraction
chose; an e-class's box lists its value type and the input-graph nodes in it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RlxError

if TYPE_CHECKING:
    from .optimize_report import OptimizeReport

CHOSEN_MARK = "★ "
COMPUTED, NOT_COMPUTED = "computed by the optimized graph", "not computed"
MAX_EXPLORED_ENODES = 5000  # the visualizer lays out every e-node at once


class ExplorerError(RlxError, ValueError):
    """The report has no e-graph to explore (the fallback engine ran, or the run made no summaries)."""


@dataclass(frozen=True)
class EGraphExplorer:
    """The e-graph of one run in egglog's serialized format (``data``), shown by egglog's visualizer."""

    data: dict[str, Any]

    @classmethod
    def from_report(cls, report: OptimizeReport, max_enodes: int = MAX_EXPLORED_ENODES) -> EGraphExplorer:
        enodes, eclasses = report.data.enodes, report.data.eclasses
        if not enodes:
            why = "the fallback engine ran (it builds no e-graph)" if report.engine != "egglog" else \
                "the run kept no e-graph tables (optimize() makes none; optimize_with_report does)"
            raise ExplorerError(f"no e-graph to explore: {why}")
        if len(enodes) > max_enodes:
            raise ExplorerError(f"the e-graph has {len(enodes):,} e-nodes, over the {max_enodes:,} the explorer lays "
                                f"out at once (report.explore(max_enodes=...) raises the limit)")
        outputs = set(report.graphs[0].outputs) if report.graphs is not None else set()
        return cls(serialized(enodes, eclasses, outputs))

    def widget(self) -> Any:
        """egglog's visualizer widget showing this e-graph (needs a Jupyter front end with widgets)."""
        from egglog.visualizer_widget import VisualizerWidget

        return VisualizerWidget(egraphs=[json.dumps(self.data)])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

    def to_html(self, title: str = "rlx-egraph e-graph explorer") -> str:
        """A standalone page: egglog's visualizer, its script and style inline, showing this e-graph."""
        script, style = _visualizer_assets()
        payload = json.dumps([json.dumps(self.data)]).replace("</", "<\\/")
        code = json.dumps(script).replace("</", "<\\/")
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
                f"<style>{style}</style><style>body{{margin:0}}#egraph{{height:100vh}}</style></head><body>"
                '<div id="egraph"></div>\n<script type="module">\n'
                f"const code = {code};\nconst egraphs = {payload};\n"
                'const url = URL.createObjectURL(new Blob([code], {type: "text/javascript"}));\n'
                "const visualizer = await import(url);\n"
                'visualizer.mount(document.getElementById("egraph")).render(egraphs);\n'
                'document.body.setAttribute("data-mounted", "yes");\n'
                "</script></body></html>\n")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_html(), encoding="utf-8")


def serialized(enodes: list[Mapping[str, Any]], eclasses: list[Mapping[str, Any]],
               outputs: set[int] = frozenset()) -> dict[str, Any]:
    """egglog's serialized e-graph (``nodes``, ``class_data``, ``root_eclasses``) made from ``report.data``'s
    ``enodes`` and ``eclasses`` tables, with op names for e-class ids and ★ on chosen e-nodes; the roots are the
    e-classes of the input graph's ``outputs`` (without them, those no e-node reads)."""
    members: dict[int, list[Mapping[str, Any]]] = {}
    for row in enodes:
        members.setdefault(row["eclass"], []).append(row)
    name = {}
    for cls, rows in members.items():
        chosen = next((r for r in rows if r["chosen"]), rows[0])
        name[cls] = f"{chosen['op']}-{cls}"
    first = {cls: f"n{rows[0]['enode']}" for cls, rows in members.items()}
    nodes = {}
    for row in enodes:
        attrs = ", ".join(f"{k}={_short(v)}" for k, v in row["attrs"].items())
        label = (CHOSEN_MARK if row["chosen"] else "") + row["op"] + (f"({attrs})" if attrs else "")
        node = {"op": label, "children": [first[c] for c in row["children"] if c in first],
                "eclass": name[row["eclass"]], "subsumed": False}
        if math.isfinite(row["cost_ns"]):  # JSON has no infinity: an e-node the target cannot run has no cost
            node["cost"] = float(row["cost_ns"])
        nodes[f"n{row['enode']}"] = node
    class_data = {}
    for c in eclasses:
        if c["eclass"] not in name:
            continue
        data = {"type": COMPUTED if c["chosen_enode"] is not None else NOT_COMPUTED, "value": c["type"]}
        if c["originals"]:
            data["input nodes"] = ", ".join(f"%{o}" for o in c["originals"])
        class_data[name[c["eclass"]]] = data
    roots = [name[c["eclass"]] for c in eclasses if c["eclass"] in name and set(c["originals"]) & outputs]
    if not roots:
        used = {child for node in nodes.values() for child in node["children"]}
        roots = sorted({node["eclass"] for nid, node in nodes.items() if nid not in used})
    return {"nodes": nodes, "class_data": class_data, "root_eclasses": roots}


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 24 else text[:23] + "…"


def _visualizer_assets() -> tuple[str, str]:
    """egglog's visualizer script (an ES module) and style, as shipped in the egglog package."""
    package = files("egglog")
    return (package / "visualizer.js").read_text(encoding="utf-8"), \
        (package / "visualizer.css").read_text(encoding="utf-8")
