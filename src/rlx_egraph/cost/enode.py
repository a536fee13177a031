"""The per-node cost both engines minimise, and the margin a change of cost must beat.

:func:`enode_ns` prices a node (an e-node in the egglog engine's extraction, a node in the fallback engine's
rewrites) on a target: ``Target.node_ns`` plus a tie-breaker that prefers reshaping inputs to reshaping results.
A choice pays when it lowers the cost by more than :data:`EPS` (relative: float sums differ in the last digits).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ir.graph import Node
from ..ir.registry import Kind, OpSpec, TensorType, ops_of_kind
from .targets import Target

EPS = 1e-9  # a move pays when it lowers the cost by more than this (float sums differ in the last digits)

# A view of an intermediate (not a leaf) costs this much: never a real cost,
# only a tie-breaker that prefers reshaping inputs to reshaping results.
VIEW_TIE_NS = 1e-3
LEAF_OPS = ops_of_kind(Kind.LEAF)



class NodePrices:
    """``Target.node_ns`` remembered per (op, attributes, input types, output type): a pure function of them.
    Pass it where a target is expected (:func:`enode_ns`); :meth:`graph_node_ns` prices a graph's node."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.known: dict[tuple, float] = {}
        self.graph_known: dict[tuple, float] = {}  # see graph_node_ns

    def node_ns(self, spec: OpSpec, attrs: Mapping[str, Any], in_types: list[TensorType],
                out_type: TensorType, reads_intermediate: bool = False) -> float:
        try:
            key = (spec.name, tuple(attrs.items()), tuple(in_types), out_type, reads_intermediate)
            hit = self.known.get(key)
        except TypeError:  # unhashable attribute values (arrays): not remembered
            return self.target.node_ns(spec, attrs, in_types, out_type, reads_intermediate)
        if hit is None:
            hit = self.known[key] = self.target.node_ns(spec, attrs, in_types, out_type, reads_intermediate)
        return hit

    def graph_node_ns(self, node: Node, ins: list[Node]) -> float:
        """:func:`enode_ns` of a graph node reading ``ins``, remembered per (op, attributes, input and output shapes
        and dtypes, whether it reads an intermediate); a leaf launches nothing, so its type alone decides."""
        reads_intermediate = not LEAF_OPS.issuperset([i.op for i in ins])
        if ins:
            key: tuple | None = (node.op, tuple(node.attrs.items()) if node.attrs else (),
                                 tuple([(i.shape, i.dtype) for i in ins]), node.shape, node.dtype, reads_intermediate)
        else:
            key = (node.op, node.shape, node.dtype)
        try:
            hit = self.graph_known.get(key)
        except TypeError:  # unhashable attribute values (arrays): not remembered
            key, hit = None, None
        if hit is None:
            hit = enode_ns(self.target, node.spec, node.attrs, [i.type for i in ins], node.type, reads_intermediate)
            if key is not None:
                self.graph_known[key] = hit
        return hit


def enode_ns(target: Target | NodePrices, spec: OpSpec, attrs: Mapping[str, Any], in_types: list[TensorType],
             out_type: TensorType, reads_intermediate: bool) -> float:
    """The per-node cost both engines minimise: ``Target.node_ns`` (a copy kernel for a layout op the target
    copies, when it reads an intermediate), plus the view tie-breaker when a layout op reads an intermediate
    (not a leaf)."""
    cost = target.node_ns(spec, attrs, in_types, out_type, reads_intermediate)
    if spec.kind is Kind.LAYOUT and reads_intermediate:
        cost += VIEW_TIE_NS
    return cost
