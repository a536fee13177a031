"""Blocks: the graph cut at the values every later node reaches only through, so that repeated layers are
optimized once.

A model's layers repeat: one residual value flows from layer to layer, and nothing computed before it is read
after it except through it (and leaves: Params, constants).  Such a value is a *cut value*: taking the
non-leaf nodes in topological order, no edge leaps over it.  The pieces between cut values are the *blocks*
(a cut value closes its block; pieces shorter than :data:`MIN_BLOCK` are merged with the next).  The fallback
cuts each block out as a lookahead region (:func:`.lookahead.cut_out`: canonical ids, so the repeats of a layer
are one region, optimized once) and transplants the region's result, then runs its passes near the cut values
only, where a rewrite can span two blocks (see ``_Engine.replay``).
"""

from __future__ import annotations

from ..ir.registry import Kind
from ..ir.rewrite import GraphRewriter

MIN_BLOCK = 8  # non-leaf nodes


def blocks(rw: GraphRewriter) -> list[list[int]]:
    """The live non-leaf nodes of ``rw`` in topological order, split after cut values into blocks of at least
    :data:`MIN_BLOCK` nodes (the last block may be shorter); one block when the graph has no cut value."""
    nodes, readers, level = rw.nodes_by_id, rw.readers, rw.level
    order = sorted((n for n, node in nodes.items() if node.kind is not Kind.LEAF), key=lambda n: (level(n), n))
    position = {n: p for p, n in enumerate(order)}
    leaps = [0] * (len(order) + 1)  # leaps[p]: edges from before position p to after it, as a difference array
    for p, n in enumerate(order):
        for i in nodes[n].inputs:
            q = position.get(i)
            if q is not None and q < p - 1:
                leaps[q + 1] += 1
                leaps[p] -= 1
    out: list[list[int]] = [[]]
    over = 0
    for p, n in enumerate(order):
        over += leaps[p]
        out[-1].append(n)
        if over == 0 and len(readers[n]) > 1 and len(out[-1]) >= MIN_BLOCK and p < len(order) - 1:
            out.append([])
    return out
