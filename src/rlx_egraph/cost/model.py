"""The IO cost model: what a graph costs in launches, syncs, bytes and FLOPs.

Counting is target-free; a :class:`~rlx_egraph.cost.targets.Target` prices
the counts.  One function, :func:`node_cost`, counts a node: a node whose kind
launches nothing (leaves, layout views, load-time weight prep) costs nothing;
any other node is one kernel launch that moves the bytes of each input slot
plus its output, adds a host sync point if its kind is HOST_SYNC, and does
``spec.flops`` FLOPs.  A graph's profile (:mod:`rlx_egraph.cost.profile`) is the
sum of its node costs.

Host-sync ops (``Item``, ``NonZero``, ``Cond``: :mod:`rlx_egraph.ir.ops.host`) are
the ops whose value the host reads before the run goes on: each is a sync point.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..ir.registry import Kind, OpSpec, TensorType

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class NodeCost:
    """The target-free cost of one node."""

    launches: int
    syncs: int
    traffic_bytes: int
    flops: int

    def __add__(self, other: NodeCost) -> NodeCost:
        return NodeCost(self.launches + other.launches, self.syncs + other.syncs,
                        self.traffic_bytes + other.traffic_bytes, self.flops + other.flops)


FREE = NodeCost(0, 0, 0, 0)


def line_key(spec: OpSpec, attrs: Mapping[str, Any]) -> str:
    """The measured line that prices a node on a target with per-op lines: its op's name, or ``Op.value`` for an op
    whose attribute ``spec.cost_attr`` selects the kernels it is exported as (``FusedMatMulBiasAct.gelu``: MatMul
    + BiasGelu, ``FusedMatMulBiasAct.none``: Gemm)."""
    return f"{spec.name}.{attrs[spec.cost_attr]}" if spec.cost_attr else spec.name


def line_op(key: str) -> str:
    """The op a line key (:func:`line_key`) prices."""
    return key.partition(".")[0]


def node_launches(spec: OpSpec, copies: bool = False) -> int:
    """Kernel launches of one node: its kind's, or one for a layout op the target runs as a copy kernel."""
    return 1 if copies else spec.kind.launches


def node_cost(spec: OpSpec, attrs: Mapping[str, Any], in_types: list[TensorType], out_type: TensorType,
              copies: bool = False) -> NodeCost:
    """Count one node: launches, host syncs, device bytes moved and FLOPs.  ``copies``: a layout op that the
    target runs as a copy kernel (:attr:`~rlx_egraph.cost.targets.Target.copied_layouts`), not as a view."""
    launches = node_launches(spec, copies)
    if launches == 0:  # nothing launched, nothing priced: the attributes and types are not read
        return FREE
    return NodeCost(
        launches=launches,
        syncs=int(spec.kind is Kind.HOST_SYNC),
        traffic_bytes=sum(t.nbytes for t in in_types) + out_type.nbytes,
        flops=int(spec.flops(attrs, list(in_types), out_type)),
    )
