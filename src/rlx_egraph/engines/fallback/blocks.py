"""Blocks: the graph cut at its residual values (its *cut values*, defined in docs/engines.md), so that repeated
layers are optimized once: each block is cut out as a lookahead region (:func:`.lookahead.cut_out`), see
``_Engine.replay``.
"""
from __future__ import annotations

from ...ir.registry import Kind
from ...ir.rewrite import GraphRewriter

MIN_BLOCK = 8  # non-leaf nodes


def blocks(rw: GraphRewriter) -> list[list[int]]:
    """The live non-leaf nodes of ``rw`` in topological order, split after cut values into blocks of at least
    :data:`MIN_BLOCK` nodes (the last block may be shorter); one block when the graph has no cut value.  A
    multi-result node is no cut (its projections stay in its block)."""
    nodes, readers, level = rw.nodes_by_id, rw.readers, rw.levels
    order = [n for _, n in sorted([(level[n], n) for n, node in nodes.items() if node.kind is not Kind.LEAF])]
    position = {n: p for p, n in enumerate(order)}
    leaps = [0] * (len(order) + 1)  # leaps[p]: edges from before position p to after it, as a difference array
    # side values: two or more readers, none of which reads it as its deepest input (each reads something
    # computed later): an edge from one leaps harmlessly
    side = {n for n in order if len(readers[n]) > 1 and min([level[r] for r in readers[n]]) > level[n] + 1}
    for p, n in enumerate(order):
        for i in nodes[n].inputs:
            q = position.get(i)
            if q is not None and q < p - 1 and i not in side:
                leaps[q + 1] += 1
                leaps[p] -= 1
    out: list[list[int]] = [[]]
    over = 0
    for p, n in enumerate(order):
        over += leaps[p]
        out[-1].append(n)
        if over == 0 and len(readers[n]) > 1 and len(out[-1]) >= MIN_BLOCK and p < len(order) - 1 \
                and nodes[n].dtype != "tuple":
            out.append([])
    return out
