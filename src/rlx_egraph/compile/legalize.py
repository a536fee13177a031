"""Legalization: rewrite a graph so that a target can run every node.

* A fused op the target does not support is replaced by its decomposition
  (``OpSpec.decompose``, recursively while the pieces are unsupported too).
* On a target without region kernels, every region (of each kind) is decomposed
  back into its steps (``Where`` and ``Cast`` steps included).
* An ElementwiseRegion longer than the target's ``region_max_steps`` or
  reading more than ``region_max_inputs`` inputs is clipped: decomposed, and
  its steps regrouped into regions within the limits
  (:func:`~rlx_egraph.engines.regions.clip_regions`; its value keeps the region's id).
* A node whose op the target lacks and that has no decomposition is an error
  naming every such node.

The input graph is never changed; a graph that is already legal comes back as is.
"""

from __future__ import annotations

from ..cost import Target, get_target
from ..engines.regions import clip_regions
from ..ir.decompose import decompose
from ..ir.graph import Graph, GraphError, Node
from ..ir.ops.regions import REGION_KINDS
from ..ir.registry import REGISTRY


class LegalizeError(GraphError):
    """The target cannot run some nodes; the message names them."""


def illegal_ops(target: Target) -> frozenset[str]:
    """The ops legalization removes for ``target``: unsupported ones, and regions without region kernels."""
    ops = {name for name in REGISTRY if not target.supports(name)}
    if not target.region_kernels:
        ops.update(REGION_KINDS)
    return frozenset(ops)


def legalize(graph: Graph, target: Target | str) -> Graph:
    """``graph`` rewritten so that ``target`` supports every op and runs every region (see the module doc)."""
    tgt = get_target(target)
    illegal = illegal_ops(tgt)
    stuck = [n for n in graph.nodes if n.op in illegal and n.spec.decompose is None]
    if stuck:
        raise LegalizeError(f"target {tgt.name!r} cannot run {_describe(stuck)}: the op is not supported there and "
                            "has no decomposition")
    if any(n.op in illegal for n in graph.nodes):
        try:
            graph = decompose(graph, illegal)
        except GraphError as exc:
            raise LegalizeError(f"target {tgt.name!r}: {exc}") from None
    return clip_regions(graph, tgt.region_max_steps, tgt.region_max_inputs)[0]


def _describe(nodes: list[Node]) -> str:
    shown = ", ".join(f"node {n.id} ({n.op})" for n in nodes[:8])
    more = f" and {len(nodes) - 8} more" if len(nodes) > 8 else ""
    return f"{len(nodes)} node(s): {shown}{more}"
