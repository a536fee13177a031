"""Chosen e-nodes -> a new Graph.

Nodes come out in the input graph's order wherever they existed there (a new
node right after its inputs), so an unchanged graph decodes to an equal graph.
Every new node remembers its e-class, hence which original nodes compute the
same value (for parity), the rules that built its e-node (none for a node of
the input graph) and the rules that merged into its e-class (for reports and
blame).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import Graph, Node
from ..ir.registry import Kind, ops_of_kind
from ._solver import decode_order
from .view import EGraphView, ENode


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


def _add_checked_once(out: Graph, nid: int, enode: ENode, inputs: list[int], type_numbers: list[int],
                      checked: dict[tuple, Node]) -> int:
    """Append ``enode`` (rule-made, or a weight prep) reading ``inputs`` as node ``nid``.
    :meth:`Graph.add_node` checks it once per (op, attributes, input classes' types, and for a weight prep its
    inputs' ops): the checks are pure functions of these (e-nodes of equal attributes share one dict, see
    :func:`.view.build_view`).  A leaf is checked every time (its name must be new)."""
    if enode.spec.kind is Kind.LEAF:
        return out.add_node(enode.op, inputs, nid, **enode.attrs)
    key = (enode.op, id(enode.attrs), *[type_numbers[c] for c in enode.children])
    if enode.spec.kind is Kind.WEIGHT_PREP:
        key += tuple([out.node(i).op for i in inputs])
    seen = checked.get(key)
    if seen is None:
        out.add_node(enode.op, inputs, nid, **enode.attrs)
        checked[key] = out.node(nid)
        return nid
    return out.add_checked(Node(nid, seen.op, tuple(inputs), dict(seen.attrs), seen.shape, seen.dtype, seen.parts))


def decode(view: EGraphView, choice: dict[int, int], graph: Graph) -> Decoded:
    """Build the optimized graph from ``choice`` (class -> e-node).

    Each class goes in when its chosen e-node's inputs are in, the least sort key first: an input-graph class
    at its node's position, a rule-made one just after its inputs (compiled: :func:`._solver.decode_order`)."""
    wanted = dict(choice)
    for node in graph.inputs:  # graph inputs are the interface: always kept
        c = view.class_of_node[node.id]
        wanted.setdefault(c, next(i for i in view.classes[c].nodes if view.nodes[i].original == node.id))
    first = [-1.0] * len(view.classes)  # per class the position of its first input-graph node
    class_of = view.class_of_node
    for k, node in enumerate(graph.nodes):
        c = class_of[node.id]
        if first[c] < 0:
            first[c] = float(k)
    order = decode_order(view.flat(), wanted, first)
    if len(order) != len(wanted):
        stuck = sorted(set(wanted) - set(order))[:5]
        raise RuntimeError(f"decode: the extracted choice is cyclic around e-classes {stuck}")
    out = Graph(graph.name)
    new_id = [-1] * len(view.classes)  # class -> its node in ``out`` (ids count up from 0 in order)
    nodes, classes, type_numbers = view.nodes, view.classes, view.type_numbers()
    input_node, add_checked = graph.node, out.add_checked
    checked: dict[tuple, Node] = {}
    originals: list[list[int]] = []  # per new node, as the fields of Decoded
    built_by: list[tuple[str, ...]] = []
    merged_by: list[tuple[str, ...]] = []
    fusions: list[Fusion] = []
    weight_preps = ops_of_kind(Kind.WEIGHT_PREP)
    for nid, c in enumerate(order):
        enode, cls = nodes[wanted[c]], classes[c]
        inputs = [new_id[ch] for ch in enode.children]
        if enode.original is None or enode.op in weight_preps:  # weight prep: its inputs' ops matter too
            _add_checked_once(out, nid, enode, inputs, type_numbers, checked)
        else:  # checked in the input graph, and its children's classes have its inputs' types: not checked again
            was = input_node(enode.original)
            add_checked(Node(nid, was.op, tuple(inputs), dict(was.attrs), was.shape, was.dtype, was.parts))
        new_id[c] = nid
        originals.append(list(cls.originals))
        merged_by.append(cls.merged_by)
        if enode.original is None:
            built_by.append(enode.built_by)
            if enode.op != "Input" and enode.op != "Param":
                fusions.append(Fusion(nid, enode.op, enode.built_by, tuple(cls.originals)))
        else:
            built_by.append(())
    decoded = Decoded(out, dict(enumerate(order)), dict(enumerate(originals)), dict(enumerate(built_by)),
                      dict(enumerate(merged_by)))
    out.set_outputs(new_id[view.class_of_node[o]] for o in graph.outputs)
    decoded.fusions = fold_projections(out, fusions)
    return decoded
