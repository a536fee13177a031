"""Price what onnxruntime dispatches for a graph: :func:`price_export`, the exported model's nodes, node by node.

A graph's IO profile (:func:`~rlx_egraph.cost.profile`) prices each MIR node by its measured line, which the
calibration fitted to what the exporter writes for that node in a graph with static shapes.  The exported model
differs in three ways, each priced here by the same target:

* **nodes no MIR node's line prices** (``added``): the run-time shape computation of a Reshape or Expand to a
  target with symbolic dims (Shape, Mul, Add, Div and Concat nodes on a few int64 elements, one set per distinct
  dim and target: :meth:`~.exporter.Builder.ints`), what a dims-data leaf (a symbolic Range bound, say) is
  computed by, and a layout op of a graph input (a leaf to the profile).  onnxruntime dispatches each as a node
  on a few elements: each costs the target's ``shape_node_ns``, what the calibration measures a node of such a
  computation at (a chain of Shape, Concat, Slice and Expand nodes on a symbolic dim).
* **nodes past a line's samples** (``beyond``): a node of an op whose calibration samples ran as k nodes
  (``Target.sample_nodes``; 1 for an op no sample measures) written as more, that onnxruntime does not fold: a
  GroupQueryAttention whose sequence lengths are computed at run time (Cast, Slice, Expand nodes that are
  constants in the sample), a MatMulBT of an intermediate (its Transpose; a weight's is folded).  Each costs the
  target's ``shape_node_ns`` too.
* **MIR nodes the export writes no node for** (``unwritten``), or only nodes onnxruntime folds when the session
  loads (every input a constant): a reshape of a reshape written as one Reshape, the 3-D <-> 2-D pair around a
  Gemm cancelled, the head split and merge that an Attention's 3-D inputs absorb, slices written as one Split.
  Their price is taken off.

Every other node is priced as the profile prices it; an Identity node is free (onnxruntime removes it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx

from ...cost import IoProfile, Target, get_target, profile
from ...ir.dtypes import dtype
from ...ir.graph import Graph, Node
from ...ir.registry import Kind
from ...ir.specialize import specialize_graph
from .exporter import export_written


@dataclass(frozen=True)
class ExportPrice:
    """The predicted latency of a graph as exported: ``profile`` (the graph's IO profile on the target), less
    ``unwritten_ns`` (the MIR nodes onnxruntime does not run, per MIR op in ``unwritten``), plus ``added_ns`` (the
    nodes no MIR node's line prices: per ONNX op in ``added``, and per MIR op in ``beyond`` the nodes written for
    its nodes past those its calibration samples ran); ``nodes`` counts the nodes onnxruntime is to dispatch (the
    export's, less those it folds or removes); ``model`` is the export priced."""

    profile: IoProfile
    added: Counter[str]
    beyond: Counter[str]
    added_ns: float
    unwritten: Counter[str]
    unwritten_ns: float
    nodes: int
    model: onnx.ModelProto = field(repr=False, compare=False)

    @property
    def ns(self) -> float:
        return self.profile.ns - self.unwritten_ns + self.added_ns


def price_export(graph: Graph, target: Target | str = "onnxruntime") -> ExportPrice:
    """``graph``'s predicted latency on ``target`` as :func:`~.exporter.export_model` writes it (module docs).
    Symbolic dims are priced at the target's hints, as :func:`~rlx_egraph.cost.profile` prices them.  Parameters
    without a value are exported as zeros (their values do not change the price)."""
    tgt = get_target(target)
    if any(p.name not in graph.weights for p in graph.params):
        graph = graph.copy()
        graph.weights = {**graph.weights, **{p.name: np.zeros(p.shape, dtype(p.dtype).storage)
                                             for p in graph.params if p.name not in graph.weights}}
    model, written_for = export_written(graph)
    folded = {t.name for t in model.graph.initializer} | {""}
    dispatched: Counter[int] = Counter()  # MIR node -> the nodes written for it that onnxruntime runs
    added: Counter[str] = Counter()
    priced = graph.nodes_by_id
    for node in model.graph.node:
        if all(name in folded for name in node.input):  # constant: folded when the session loads
            folded.update(node.output)
            continue
        if node.name not in written_for or (node.op_type == "Identity" and not node.domain):  # removed at load
            continue
        nid = written_for[node.name]
        if nid is None or not _launches(priced[nid], tgt, graph):
            added[node.op_type] += 1
        else:
            dispatched[nid] += 1
    beyond: Counter[str] = Counter()
    for nid, nodes in dispatched.items():
        op = priced[nid].op
        if nodes > tgt.sample_nodes.get(op, 1):
            beyond[op] += nodes - tgt.sample_nodes.get(op, 1)
    if graph.symbols:
        graph = specialize_graph(graph, {s: tgt.hint(s) for s in graph.symbols})
    by_id = graph.nodes_by_id
    unwritten: Counter[str] = Counter()
    unwritten_ns = 0.0
    for node in graph.nodes:
        if node.id in dispatched or not _launches(node, tgt, graph):
            continue
        ins = [by_id[i] for i in node.inputs]
        unwritten[node.op] += 1
        unwritten_ns += tgt.node_ns(node.spec, node.attrs, [i.type for i in ins], node.type,
                                    any(i.kind is not Kind.LEAF for i in ins))
    return ExportPrice(profile(graph, tgt), added, beyond, (added.total() + beyond.total()) * tgt.shape_node_ns,
                       unwritten, unwritten_ns, dispatched.total() + added.total(), model)


def _launches(node: Node, target: Target, graph: Graph) -> bool:
    """Whether the profile prices ``node`` as a kernel: its kind launches one, or it is a layout op the target
    copies reading an intermediate."""
    if node.kind.launches:
        return True
    return target.copies(node.spec, any(graph.node(i).kind is not Kind.LEAF for i in node.inputs))


__all__ = ["ExportPrice", "price_export"]
