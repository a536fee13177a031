"""Numerical parity: every node of an optimized graph against the input-graph
node that computes the same value, on the same seeded random data."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import RlxError
from ..ir.dtypes import PARITY_TOLERANCE
from ..ir.graph import Graph
from .interpreter import evaluate


class ParityError(RlxError, AssertionError):
    """An optimized node differs from what it replaced; names the node and the rules."""


@dataclass(frozen=True)
class NodeParity:
    node: int
    op: str
    original: int
    max_abs: float
    max_rel: float
    ok: bool

    def to_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "original": self.original, "max_abs": self.max_abs,
                "max_rel": self.max_rel, "ok": self.ok}


@dataclass
class ParityReport:
    seed: int
    nodes: list[NodeParity] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    @property
    def worst(self) -> NodeParity | None:
        return max(self.nodes, key=lambda n: n.max_rel, default=None)

    def to_dict(self) -> dict:
        return {"seed": self.seed, "ok": self.ok, "nodes": [n.to_dict() for n in self.nodes]}


def errors(new: np.ndarray, old: np.ndarray) -> tuple[float, float]:
    """Largest absolute and relative difference (relative to |old|, guarded near zero)."""
    a, b = np.asarray(new, dtype=np.float64), np.asarray(old, dtype=np.float64)
    diff = np.abs(a - b)
    if diff.size == 0:
        return 0.0, 0.0
    diff = np.where(np.isnan(a) & np.isnan(b), 0.0, diff)
    return float(np.max(diff)), float(np.max(diff / np.maximum(np.abs(b), 1e-6)))


def check_parity(original: Graph, optimized: Graph, same_value: Mapping[int, Sequence[int]],
                 blame: Callable[[int], Sequence[str]] | None = None, seed: int = 0) -> ParityReport:
    """Compare each optimized node with every original node of the same value.

    ``same_value`` maps optimized node ids to original node ids; the data for
    every input and parameter is drawn once, from the original graph.
    ``blame(node_id)`` names the rules that built optimized node ``node_id`` or merged into its value.
    Raises :class:`ParityError` on the first node outside its dtype's tolerance.
    """
    before = evaluate(original, seed=seed, return_all=True)
    feeds = {n.name: before[n.id] for n in original.inputs}
    params = {n.name: before[n.id] for n in original.params}
    after = evaluate(optimized, feeds, params, seed=seed, return_all=True)
    report = ParityReport(seed)
    for node in optimized.nodes:
        if node.op in ("Input", "Param"):
            continue
        rtol, atol = PARITY_TOLERANCE[node.dtype]
        for ref in same_value.get(node.id) or ():  # every input-graph node merged into its e-class
            new, old = after[node.id], before[ref]
            ok = bool(np.allclose(new.astype(np.float64), old.astype(np.float64), rtol=rtol, atol=atol,
                                  equal_nan=True))
            max_abs, max_rel = errors(new, old)
            report.nodes.append(NodeParity(node.id, node.op, ref, max_abs, max_rel, ok))
            if ok:
                continue
            old_op = original.node(ref).op
            rules = ", ".join(blame(node.id) if blame else ()) or "none recorded"
            raise ParityError(f"parity failure: node {node.id} ({node.op}) differs from original node {ref} "
                              f"({old_op}): max abs error {max_abs:.3g}, max rel error "
                              f"{max_rel:.3g} (tolerance rtol={rtol}, atol={atol} for {node.dtype}); "
                              f"built by rule(s): {rules}")
    return report
