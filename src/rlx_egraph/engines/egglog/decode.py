"""Chosen e-nodes -> a new Graph.

Nodes come out in the input graph's order wherever they existed there (a new
node right after its inputs), so an unchanged graph decodes to an equal graph.
Every new node remembers its e-class, hence which original nodes compute the
same value (for parity), the rules that built its e-node (none for a node of
the input graph), the rules that merged into its e-class (for reports and
blame) and the rules that wrote the helper rows those rules read (for blame).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.graph import Graph, Node, check_node
from ...ir.provenance import Fusion, fold_projections
from ...ir.registry import Kind, ops_of_kind
from ._choice import least_per_class
from ._decoding import decode_order, decoded_nodes
from .view import EGraphView


@dataclass
class Decoded:
    graph: Graph
    class_of: dict[int, int]  # new node id -> e-class
    originals: dict[int, list[int]]  # new node id -> input-graph node ids with the same value
    built_by: dict[int, tuple[str, ...]] = field(default_factory=dict)  # new node id -> rules that built it
    merged_by: dict[int, tuple[str, ...]] = field(default_factory=dict)  # new node id -> rules merged into its class
    fusions: list[Fusion] = field(default_factory=list)
    # new node id -> the rules that wrote the helper-relation rows the rules that built it read (only nodes with some)
    relied_on: dict[int, tuple[str, ...]] = field(default_factory=dict)


def decode(view: EGraphView, choice: dict[int, int], graph: Graph) -> Decoded:
    """Build the optimized graph from ``choice`` (class -> e-node).

    Each class goes in when its chosen e-node's inputs are in, the least sort key first: an input-graph class
    at its node's position, a rule-made one just after its inputs (see :func:`._decoding.decode_order`)."""
    wanted = dict(choice)
    for node in graph.inputs:  # graph inputs are the interface: always kept
        c = view.class_of_node[node.id]
        wanted.setdefault(c, next(i for i in view.classes[c].nodes if view.nodes[i].original == node.id))
    first = least_per_class(view.class_of_node, graph.positions(), len(view.classes))
    order = decode_order(view.flat(), wanted, first)  # ``first``: per class its first input-graph node's place
    if len(order) != len(wanted):
        stuck = sorted(set(wanted) - set(order))[:5]
        raise RuntimeError(f"decode: the extracted choice is cyclic around e-classes {stuck}")

    def check(nid: int, op: str, inputs: tuple[int, ...], attrs: dict, built: list[Node]) -> Node:
        """Check a rule-made e-node as node ``nid`` (a leaf's name is checked by Graph.from_checked)."""
        return check_node(nid, op, inputs, attrs, built.__getitem__, {})

    nodes, new_id, class_of, originals, built_by, merged_by, made = decoded_nodes(
        order, wanted, view.nodes, view.classes, graph.nodes_by_id, ops_of_kind(Kind.WEIGHT_PREP),
        view.type_numbers(), check)
    out = Graph.from_checked(graph.name, nodes)
    fusions = [Fusion(nid, op, built_by[nid], tuple(originals[nid])) for nid in made
               if (op := nodes[nid].op) != "Input" and op != "Param"]
    relied = view.relied_on
    decoded = Decoded(out, class_of, originals, built_by, merged_by,
                      relied_on={nid: relied[c] for nid, c in class_of.items() if c in relied} if relied else {})
    out.set_outputs(new_id[view.class_of_node[o]] for o in graph.outputs)
    decoded.fusions = fold_projections(out, fusions)
    return decoded
