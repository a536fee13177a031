"""The per-node cost both engines minimise, and the margin a change of cost must beat.

:func:`enode_ns` prices a node (an e-node in the egglog engine's extraction, a node in the fallback engine's
rewrites) on a target: ``Target.node_ns`` plus a tie-breaker that prefers reshaping inputs to reshaping results.
A choice pays when it lowers the cost by more than :data:`EPS` (relative: float sums differ in the last digits).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ir.registry import Kind, OpSpec, TensorType
from .targets import Target

EPS = 1e-9  # a move pays when it lowers the cost by more than this (float sums differ in the last digits)

# A view of an intermediate (not a leaf) costs this much: never a real cost,
# only a tie-breaker that prefers reshaping inputs to reshaping results.
VIEW_TIE_NS = 1e-3



class NodePrices:
    """``Target.node_ns`` remembered per (op, attributes, input types, output type): a pure function of them.
    Pass it where a target is expected (:func:`enode_ns`)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.known: dict[tuple, float] = {}

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


def enode_ns(target: Target | NodePrices, spec: OpSpec, attrs: Mapping[str, Any], in_types: list[TensorType],
             out_type: TensorType, reads_intermediate: bool) -> float:
    """The per-node cost both engines minimise: ``Target.node_ns`` (a copy kernel for a layout op the target
    copies, when it reads an intermediate), plus the view tie-breaker when a layout op reads an intermediate
    (not a leaf)."""
    cost = target.node_ns(spec, attrs, in_types, out_type, reads_intermediate)
    if spec.kind is Kind.LAYOUT and reads_intermediate:
        cost += VIEW_TIE_NS
    return cost
