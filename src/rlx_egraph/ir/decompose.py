"""Replace composite ops by their decompositions (``OpSpec.decompose``).

Legalization for a target calls :func:`decompose` with the ops the target
does not support; the default decomposes every fused op down to primitives.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count
from typing import Any

from .graph import Graph, GraphError, Node
from .registry import REGISTRY, Kind

MAX_DEPTH = 16  # decompositions nest a few levels (FusedTransformerLayer -> ... -> Gelu); more means a cycle


class _Failure(Exception):
    """A decomposition problem; :func:`decompose` names the graph node it came from."""


def fused_ops() -> frozenset[str]:
    """The ops :func:`decompose` replaces by default: every Kind.FUSED op."""
    return frozenset(name for name, spec in REGISTRY.items() if spec.kind is Kind.FUSED)


def decompose(graph: Graph, ops: Iterable[str] | None = None) -> Graph:
    """A new graph computing the same outputs with no node of ``ops`` (default: :func:`fused_ops`).

    Each such node is replaced by its op's decomposition, and so are the nodes
    of ``ops`` in that decomposition, recursively.  ``graph`` is not changed;
    outputs keep their order; nodes that are not replaced keep their ids, new
    nodes get the ids after the largest one of ``graph``, in order.  Raises
    ValueError for an unknown op name and GraphError naming the node when a
    decomposition is missing, fails or has the wrong type.
    """
    targets = fused_ops() if ops is None else frozenset(ops)
    unknown = sorted(targets - REGISTRY.keys())
    if unknown:
        raise ValueError(f"decompose: unknown op(s) {unknown}")
    work, new_of = _rebuild(graph, targets, ())
    kept = {new_of[n.id]: n.id for n in graph.nodes if n.op not in targets}
    fresh = count(max((n.id for n in graph.nodes), default=-1) + 1)
    ids = {n.id: kept[n.id] if n.id in kept else next(fresh) for n in work.nodes}
    records = [{"id": ids[n.id], "op": n.op, "inputs": [ids[i] for i in n.inputs], "attrs": n.attrs}
               for n in work.nodes]
    out = Graph.from_nodes(records, [ids[o] for o in work.outputs], graph.name)
    out.adopt_store(graph)
    return out


def _rebuild(graph: Graph, targets: frozenset[str], trail: tuple[str, ...]) -> tuple[Graph, dict[int, Any]]:
    """``graph`` rebuilt with its ``targets`` nodes expanded; returns it and the map old id -> new id
    (a tuple of ids for an expanded multi-result node, whose Gets become those nodes)."""
    work = Graph(graph.name)
    new_of: dict[int, Any] = {}
    for node in graph.nodes:
        if node.kind is Kind.PROJECTION and isinstance(new_of[node.inputs[0]], tuple):
            new_of[node.id] = new_of[node.inputs[0]][node.attrs["index"]]
            continue
        inputs = [new_of[i] for i in node.inputs]
        if node.op not in targets:
            new_of[node.id] = work.add_node(node.op, inputs, **node.attrs)
            continue
        try:
            new_of[node.id] = _expand(work, node, inputs, targets, trail)
        except _Failure as exc:
            if trail:
                raise
            raise GraphError(f"node {node.id} ({node.op}): {exc}") from None
    work.set_outputs(new_of[o] for o in graph.outputs)
    return work, new_of


def _expand(work: Graph, node: Node, inputs: list[int], targets: frozenset[str],
            trail: tuple[str, ...]) -> int | tuple[int, ...]:
    """Append ``node``'s decomposition on ``inputs`` to ``work``, itself decomposed; returns its result
    (its results, one id each, for a multi-result node)."""
    trail = (*trail, node.op)
    if len(trail) > MAX_DEPTH:
        raise _Failure(f"decompositions nest deeper than {MAX_DEPTH} levels: {' -> '.join(trail)}")
    build = node.spec.decompose
    if build is None:
        inside = f" (inside {' -> '.join(trail[:-1])})" if len(trail) > 1 else ""
        raise _Failure(f"{node.op} has no decomposition{inside}")
    scratch = Graph(node.op)
    slots = [scratch.input(f"in{k}", work.node(i).shape, work.node(i).dtype) for k, i in enumerate(inputs)]
    try:
        result = build(scratch, slots, node.attrs)
    except GraphError as exc:
        raise _Failure(f"the decomposition of {node.op} fails: {exc}") from None
    results = result if isinstance(result, tuple) else (result,)
    got = tuple(scratch.node(r).type for r in results)
    if got != node.results:
        shown = ", ".join(map(str, got))
        raise _Failure(f"the decomposition of {node.op} computes {shown}, the node is {node.type}")
    scratch.set_outputs(results)
    inner, inner_of = _rebuild(scratch, targets, trail)
    placed = {inner_of[s]: i for s, i in zip(slots, inputs, strict=True)}
    for n in inner.nodes:
        if n.id not in placed:
            placed[n.id] = work.add_node(n.op, [placed[i] for i in n.inputs], **n.attrs)
    out = tuple(placed[o] for o in inner.outputs)
    return out if node.parts else out[0]


__all__ = ["MAX_DEPTH", "decompose", "fused_ops"]
