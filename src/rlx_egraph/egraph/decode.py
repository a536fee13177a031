"""Chosen e-nodes -> a new Graph.

Nodes come out in the input graph's order wherever they existed there (a new
node right after its inputs), so an unchanged graph decodes to an equal graph.
Every new node remembers its e-class, hence which original nodes compute the
same value (for parity), the rules that built its e-node (none for a node of
the input graph) and the rules that merged into its e-class (for reports and
blame).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..ir.graph import Graph, Node
from ..ir.registry import Kind
from .view import EGraphView


@dataclass(frozen=True)
class Fusion:
    """A node of the optimized graph that no node of the input graph matches."""

    node: int
    op: str
    rules: tuple[str, ...]  # the rules that built it
    replaces: tuple[int, ...]  # original node ids of the same value

    def to_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "rules": list(self.rules), "replaces": list(self.replaces)}


def fold_projections(graph: Graph, fusions: list[Fusion]) -> list[Fusion]:
    """``fusions`` without projections: a Get is part of the multi-result node it reads, whose
    ``replaces`` gains the input-graph nodes the Get's result replaces (in result order)."""
    gets: dict[int, list[Fusion]] = {}
    for f in fusions:
        node = graph.node(f.node)
        if node.kind is Kind.PROJECTION:
            gets.setdefault(node.inputs[0], []).append(f)
    out = []
    for f in fusions:
        if f.node in gets:
            extra = [r for g in sorted(gets[f.node], key=lambda g: graph.node(g.node).attrs["index"])
                     for r in g.replaces]
            f = Fusion(f.node, f.op, f.rules, tuple(dict.fromkeys((*f.replaces, *extra))))
        if graph.node(f.node).kind is not Kind.PROJECTION:
            out.append(f)
    return out


@dataclass
class Decoded:
    graph: Graph
    class_of: dict[int, int]  # new node id -> e-class
    originals: dict[int, list[int]]  # new node id -> input-graph node ids with the same value
    built_by: dict[int, tuple[str, ...]] = field(default_factory=dict)  # new node id -> rules that built it
    merged_by: dict[int, tuple[str, ...]] = field(default_factory=dict)  # new node id -> rules merged into its class
    fusions: list[Fusion] = field(default_factory=list)


def _sort_key(c: int, view: EGraphView, wanted: Mapping[int, int], position: Mapping[int, int],
              key: dict[int, float]) -> float:
    """Where class ``c`` goes in the decoded graph: an input-graph class at its node's position, a rule-made one
    just after its chosen e-node's children (remembered in ``key``).  A module function, not a recursive closure:
    such a closure is a reference cycle, which kept the whole view alive for the garbage collector."""
    if c not in key:
        originals = view.classes[c].originals
        if originals:
            key[c] = float(min(position[o] for o in originals))
        else:
            children = view.nodes[wanted[c]].children
            key[c] = max((_sort_key(ch, view, wanted, position, key) for ch in children), default=-1.0) + 0.5
    return key[c]


def decode(view: EGraphView, choice: dict[int, int], graph: Graph) -> Decoded:
    """Build the optimized graph from ``choice`` (class -> e-node)."""
    position = {n.id: k for k, n in enumerate(graph.nodes)}
    wanted = dict(choice)
    for node in graph.inputs:  # graph inputs are the interface: always kept
        c = view.class_of_node[node.id]
        wanted.setdefault(c, next(i for i in view.classes[c].nodes if view.nodes[i].original == node.id))

    key: dict[int, float] = {}

    def sort_key(c: int) -> float:
        return _sort_key(c, view, wanted, position, key)

    pending = {c: len(set(view.nodes[n].children)) for c, n in wanted.items()}
    readers: dict[int, list[int]] = {}
    for c, n in wanted.items():
        for ch in set(view.nodes[n].children):
            readers.setdefault(ch, []).append(c)
    heap = [(sort_key(c), c) for c, p in pending.items() if p == 0]
    heapq.heapify(heap)
    out = Graph(graph.name)
    new_id: dict[int, int] = {}
    decoded = Decoded(out, {}, {})
    while heap:
        _, c = heapq.heappop(heap)
        enode = view.nodes[wanted[c]]
        inputs = [new_id[ch] for ch in enode.children]
        if enode.original is None or enode.spec.kind is Kind.WEIGHT_PREP:  # weight prep: its inputs' ops matter too
            nid = out.add_node(enode.op, inputs, **enode.attrs)
        else:  # checked in the input graph, and its children's classes have its inputs' types: not checked again
            was = graph.node(enode.original)
            nid = out.add_checked(Node(len(new_id), was.op, tuple(inputs), dict(was.attrs), was.shape, was.dtype,
                                       was.parts))
        new_id[c] = nid
        decoded.class_of[nid] = c
        decoded.originals[nid] = list(view.classes[c].originals)
        decoded.built_by[nid] = () if enode.original is not None else enode.built_by
        decoded.merged_by[nid] = view.classes[c].merged_by
        if enode.original is None and enode.op not in ("Input", "Param"):
            decoded.fusions.append(Fusion(nid, enode.op, enode.built_by, tuple(view.classes[c].originals)))
        for r in readers.get(c, ()):
            pending[r] -= 1
            if pending[r] == 0:
                heapq.heappush(heap, (sort_key(r), r))
    if len(new_id) != len(wanted):
        stuck = sorted(set(wanted) - set(new_id))[:5]
        raise RuntimeError(f"decode: the extracted choice is cyclic around e-classes {stuck}")
    out.set_outputs(new_id[view.class_of_node[o]] for o in graph.outputs)
    decoded.fusions = fold_projections(out, decoded.fusions)
    return decoded
