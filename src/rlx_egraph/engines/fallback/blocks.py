"""Blocks: the graph cut at its residual values, so that repeated layers are optimized once.

A model's layers repeat: one residual value flows from layer to layer, and nothing computed before it is read
after it except through it (and leaves: Params, constants; and *side values*, computed early and read only
late, as an attention mask read by every layer: a block takes such a value as a node reading fresh inputs, as
it takes a leaf).  Such a value is a *cut value*: taking the non-leaf nodes in topological order, no edge leaps
over it but from a side value.  Two more conditions keep a block's decisions those
of the whole graph: two or more nodes read the value (a plain chain is no place to cut, a pattern runs along
it), and no rule matches through it (the value, what it reads and a reader of it in one match; see
:func:`straddles`).  The pieces between cut values are the *blocks* (a cut value closes its block; pieces
shorter than :data:`MIN_BLOCK` are merged with the next).

The fallback cuts each block out as a lookahead region (:func:`.lookahead.cut_out`: canonical ids, so the
repeats of a layer are one region, optimized once), transplants the region's result, then runs its passes near
the cut values only, where a rewrite can still span two blocks (a region keeps the values it reads from
outside as nodes, so a rule that matches a cut value and its readers, ``add-layer-norm``, matches in the next
block).  See ``_Engine.replay``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...ir.graph import Node
from ...ir.registry import Kind
from ...ir.rewrite import GraphRewriter
from .pattern import NodePat, Pattern, V

MIN_BLOCK = 8  # non-leaf nodes


@dataclass(frozen=True)
class Above:
    """What a pattern matches at and above a node: its op and, per input slot, what it matches there
    (None: any value)."""

    op: str
    inputs: tuple[Above | None, ...]

    def fits(self, nid: int, nodes: Mapping[int, Node]) -> bool:
        """Whether the ops at and above ``nid`` are these (guards aside: a cut is given up when in doubt)."""
        node = nodes[nid]
        if node.op != self.op:
            return False
        if len(node.inputs) != len(self.inputs):  # optional or variadic inputs: in doubt
            return True
        return all(s is None or s.fits(i, nodes) for s, i in zip(self.inputs, node.inputs, strict=True))


def straddles(patterns: Iterable[Pattern]) -> dict[tuple[str, str], list[Above]]:
    """Per (op, reader's op): what some pattern matches at and above a node of that op while it matches the node's
    reader too (the node, what it reads and its reader all in one match).  A value that fits one is no cut: a
    block would take the part above it alone (``onnx-attention-isnan`` matches a Softmax, its scores and its
    IsNaN reader)."""
    out: dict[tuple[str, str], list[Above]] = {}
    for pattern in patterns:
        made = {a.out: a for a in pattern.query if isinstance(a, NodePat)}
        for reader in made.values():
            for slot in reader.inputs:
                node = made.get(slot.name) if isinstance(slot, V) else None
                if node is None or not any(isinstance(s, V) and s.name in made for s in node.inputs):
                    continue
                found = _above(node, made, frozenset({node.out}))
                known = out.setdefault((node.op, reader.op), [])
                if found not in known:
                    known.append(found)
    return out


def _above(atom: NodePat, made: Mapping[str, NodePat], seen: frozenset[str]) -> Above:
    """What ``atom`` matches, the atoms binding its inputs followed up (``seen``: those on the way)."""
    return Above(atom.op, tuple(
        _above(made[s.name], made, seen | {s.name}) if isinstance(s, V) and s.name in made and s.name not in seen
        else None for s in atom.inputs))


def blocks(rw: GraphRewriter, through: Mapping[tuple[str, str], list[Above]] | None = None) -> list[list[int]]:
    """The live non-leaf nodes of ``rw`` in topological order, split after cut values into blocks of at least
    :data:`MIN_BLOCK` nodes (the last block may be shorter); one block when the graph has no cut value.  A
    value that a pattern matches through (``through``: see :func:`straddles`) is no cut, nor is a multi-result
    node (its projections stay in its block)."""
    nodes, readers, level = rw.nodes_by_id, rw.readers, rw.levels
    through = through or {}
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
                and nodes[n].dtype != "tuple" \
                and not any(above.fits(n, nodes) for r in readers[n]
                            for above in through.get((nodes[n].op, nodes[r].op), ())):
            out.append([])
    return out
