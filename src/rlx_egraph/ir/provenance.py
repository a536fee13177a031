"""Provenance: which rules built a node of an optimized graph, and which input-graph nodes it replaces.

Both engines record a :class:`Fusion` per node they built; reports, pictures and the ONNX exporter read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .registry import Kind, ops_of_kind

if TYPE_CHECKING:
    from .graph import Graph


@dataclass(frozen=True)
class Fusion:
    """A node of the optimized graph that no node of the input graph matches."""

    node: int
    op: str
    rules: tuple[str, ...]  # the rules that built it
    replaces: tuple[int, ...]  # original node ids of the same value

    def __init__(self, node: int, op: str, rules: tuple[str, ...], replaces: tuple[int, ...]) -> None:
        # Straight into the instance dict, as Node does: a run at 100k nodes makes some 22,000.
        d = self.__dict__
        d["node"], d["op"], d["rules"], d["replaces"] = node, op, rules, replaces

    def to_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "rules": list(self.rules), "replaces": list(self.replaces)}


def fold_projections(graph: Graph, fusions: list[Fusion]) -> list[Fusion]:
    """``fusions`` without projections: a Get is part of the multi-result node it reads, whose
    ``replaces`` gains the input-graph nodes the Get's result replaces (in result order)."""
    projections = ops_of_kind(Kind.PROJECTION)
    gets: dict[int, list[Fusion]] = {}
    for f in fusions:
        if f.op in projections:
            gets.setdefault(graph.node(f.node).inputs[0], []).append(f)
    out = []
    for f in fusions:
        if f.op in projections:
            continue
        if f.node in gets:
            extra = [r for g in sorted(gets[f.node], key=lambda g: graph.node(g.node).attrs["index"])
                     for r in g.replaces]
            f = Fusion(f.node, f.op, f.rules, tuple(dict.fromkeys((*f.replaces, *extra))))
        out.append(f)
    return out
