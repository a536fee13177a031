"""Legalization: rewrite a graph so that a target can run every node.

* A fused op the target does not support is replaced by its decomposition
  (``OpSpec.decompose``, recursively while the pieces are unsupported too).
* On a target without region kernels, every ElementwiseRegion is decomposed
  back into its steps (``Where`` and ``Cast`` steps included).
* An ElementwiseRegion longer than the target's ``region_max_steps`` or
  reading more than ``region_max_inputs`` inputs is clipped: decomposed, and
  its steps regrouped into regions within the limits.
* A node whose op the target lacks and that has no decomposition is an error
  naming every such node.

The input graph is never changed; a graph that is already legal comes back as is.
"""

from __future__ import annotations

from itertools import count

from ..cost import Target, get_target
from ..egraph.regions import find_regions, fuse_regions
from ..ir.decompose import decompose
from ..ir.graph import Graph, GraphError, Node
from ..ir.ops.fused import region_program
from ..ir.registry import REGISTRY

REGION = "ElementwiseRegion"


class LegalizeError(GraphError):
    """The target cannot run some nodes; the message names them."""


def illegal_ops(target: Target) -> frozenset[str]:
    """The ops legalization removes for ``target``: unsupported ones, and regions without region kernels."""
    ops = {name for name in REGISTRY if not target.supports(name)}
    if not target.region_kernels:
        ops.add(REGION)
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
    if any(_too_long(graph, n, tgt) for n in graph.nodes):
        graph = _clip(graph, tgt)
    return graph


def _describe(nodes: list[Node]) -> str:
    shown = ", ".join(f"node {n.id} ({n.op})" for n in nodes[:8])
    more = f" and {len(nodes) - 8} more" if len(nodes) > 8 else ""
    return f"{len(nodes)} node(s): {shown}{more}"


def _too_long(graph: Graph, node: Node, target: Target) -> bool:
    """A region with more steps or inputs than ``target``'s region kernels take."""
    if node.op != REGION:
        return False
    steps = region_program(node.attrs, [graph.node(i).type for i in node.inputs])
    return len(steps) > target.region_max_steps or len(node.inputs) > target.region_max_inputs


def _clip(graph: Graph, target: Target) -> Graph:
    """``graph`` with each too-long region replaced by its steps regrouped into regions within the limits.

    Untouched nodes keep their ids; the new nodes get ids after the largest one.
    """
    out = Graph(graph.name)
    new_of: dict[int, int] = {}
    fresh = count(max(n.id for n in graph.nodes) + 1)
    for node in graph.nodes:
        inputs = [new_of[i] for i in node.inputs]
        if not _too_long(graph, node, target):
            new_of[node.id] = out.add_node(node.op, inputs, node_id=node.id, **node.attrs)
            continue
        pieces = _regrouped(graph, node, target)
        placed = dict(zip((n.id for n in pieces.inputs), inputs, strict=True))
        for n in pieces.nodes:
            if n.op != "Input":
                placed[n.id] = out.add_node(n.op, [placed[i] for i in n.inputs], node_id=next(fresh), **n.attrs)
        new_of[node.id] = placed[pieces.outputs[0]]
    out.set_outputs(new_of[o] for o in graph.outputs)
    out.adopt_store(graph)
    return out


def _regrouped(graph: Graph, node: Node, target: Target) -> Graph:
    """Region ``node`` alone over Inputs, as its steps grouped into regions of at most the target's limits."""
    alone = Graph(f"region {node.id}")
    slots = [alone.input(f"in{k}", graph.node(i).shape, graph.node(i).dtype) for k, i in enumerate(node.inputs)]
    alone.set_outputs([alone.add_node(REGION, slots, **node.attrs)])
    steps = decompose(alone, {REGION})
    return fuse_regions(steps, find_regions(steps, target.region_max_steps, target.region_max_inputs))[0]
