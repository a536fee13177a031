"""Numerical parity: an optimized graph against the graph it came from, on seeded random data.

Compared: every optimized node (leaves included) with every input-graph node
merged into its e-class, and every optimized graph output with the original
output at the same position.  A float value is judged with the tolerance of
the loosest float dtype it was computed through in the original graph; integer
and bool values are compared exactly, except that a decision (an integer/bool
value computed from floats: a comparison, a Cast) may flip where the original
operands lie within tolerance of its boundary.  The run then continues with
the original decision, and a decision a fused kernel makes internally excuses
the elements that depend on it.  docs/verifier.md has the whole story.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..ir.dtypes import PARITY_TOLERANCE, dtype, loosest
from ..ir.graph import Graph, Node
from .interpreter import evaluate, run_node

# A second seed is checked when the original graph's values hold at most this many elements in total.
SECOND_SEED_MAX_ELEMENTS = 1 << 22
# Values written into an excused element of an input to see which output elements it reaches.
_PROBES = {True: (-1e4, 1e4), False: (0, 1)}  # by is_float


class ParityError(AssertionError):
    """An optimized node differs from what it replaced; names the node and the rules."""


@dataclass(frozen=True)
class NodeParity:
    """One comparison of an optimized node with an original node, on one seed."""

    node: int
    op: str
    original: int
    seed: int
    max_abs: float
    tolerance_ratio: float  # max over elements of |new - old| / (atol + rtol * |old|); <= 1 passes
    rtol: float
    atol: float
    output: int | None = None  # the output position, for a comparison of graph outputs

    @property
    def ok(self) -> bool:
        return self.tolerance_ratio <= 1.0

    def to_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "original": self.original, "seed": self.seed,
                "output": self.output, "max_abs": self.max_abs, "tolerance_ratio": self.tolerance_ratio,
                "rtol": self.rtol, "atol": self.atol, "ok": self.ok}


@dataclass
class ParityReport:
    seeds: tuple[int, ...]
    nodes: list[NodeParity] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    @property
    def worst(self) -> NodeParity | None:
        """The comparison closest to (or furthest past) its tolerance."""
        return max(self.nodes, key=lambda n: n.tolerance_ratio, default=None)

    def to_dict(self) -> dict:
        return {"seeds": list(self.seeds), "ok": self.ok, "nodes": [n.to_dict() for n in self.nodes]}


def tolerance_ratio(new: np.ndarray, old: np.ndarray, rtol: float, atol: float,
                    excused: np.ndarray | None = None) -> tuple[float, float]:
    """Largest |new - old| and largest |new - old| / (atol + rtol * |old|).

    NaN equals NaN, equal infinities are equal, and ``excused`` elements are
    skipped.  A difference where the bound is 0 (exact dtypes) is infinitely
    far past it.
    """
    a, b = np.asarray(new, dtype=np.float64), np.asarray(old, dtype=np.float64)
    with np.errstate(all="ignore"):
        diff = np.where(_differs(a, b), np.nan_to_num(np.abs(a - b), nan=np.inf), 0.0)
        if excused is not None:
            diff = np.where(excused, 0.0, diff)
        if diff.size == 0:
            return 0.0, 0.0
        ratio = np.where(diff == 0, 0.0, diff / (atol + rtol * np.abs(b)))
    return float(diff.max()), float(np.nan_to_num(ratio, nan=np.inf).max())


def parity_seeds(graph: Graph, seed: int = 0) -> tuple[int, ...]:
    """``(seed, seed + 1)`` when the graph's values hold at most SECOND_SEED_MAX_ELEMENTS elements, else ``(seed,)``."""
    size = sum(math.prod(n.shape) for n in graph.nodes)
    return (seed, seed + 1) if size <= SECOND_SEED_MAX_ELEMENTS else (seed,)


def precisions(graph: Graph) -> dict[int, str | None]:
    """Each node's loosest float dtype among itself and its ancestors (None: no float on the way)."""
    out: dict[int, str | None] = {}
    for n in graph.nodes:
        out[n.id] = loosest([n.dtype, *(out[i] for i in n.inputs if out[i])])
    return out


def check_parity(original: Graph, optimized: Graph, same_value: Mapping[int, Sequence[int]],
                 blame: Callable[[int], Sequence[str]] | None = None, seed: int = 0) -> ParityReport:
    """Compare ``optimized`` with ``original`` on the seeds of :func:`parity_seeds`.

    ``same_value`` maps optimized node ids to the original node ids of the same
    value; the data for every input and parameter is drawn from the original
    graph.  ``blame(node)`` names the rules that built optimized node ``node``.
    Raises :class:`ParityError` on the first comparison outside its tolerance.
    """
    precision = precisions(original)
    report = ParityReport(parity_seeds(original, seed))
    for s in report.seeds:
        _check_seed(original, optimized, same_value, blame, s, precision, report)
    return report


def _check_seed(original: Graph, optimized: Graph, same_value: Mapping[int, Sequence[int]],
                blame: Callable[[int], Sequence[str]] | None, seed: int, precision: dict[int, str | None],
                report: ParityReport) -> None:
    before = evaluate(original, seed=seed, return_all=True)
    excused = _excused(original, before, precision, {r for refs in same_value.values() for r in refs})

    def compare(node: Node, value: np.ndarray, ref: int, output: int | None = None) -> None:
        old = original.node(ref)
        prec = precision[ref] if dtype(old.dtype).is_float else None
        rtol, atol = PARITY_TOLERANCE[prec or old.dtype]
        max_abs, ratio = tolerance_ratio(value, before[ref], rtol, atol, excused.get(ref))
        entry = NodeParity(node.id, node.op, ref, seed, max_abs, ratio, rtol, atol, output)
        report.nodes.append(entry)
        if entry.ok:
            return
        at = "" if output is None else f", output {output},"
        how = (f"max abs error {max_abs:.3g}, {ratio:.3g} x its tolerance (rtol={rtol}, atol={atol}: {prec} "
               "precision)" if prec else f"exact {old.dtype} values differ beyond the decisions allowed to flip")
        rules = ", ".join(blame(node.id) if blame else ()) or "none recorded"
        raise ParityError(f"parity failure: node {node.id} ({node.op}){at} differs from original node {ref} "
                          f"({old.op}) on seed {seed}: {how}; built by rule(s): {rules}")

    def visit(node: Node, value: np.ndarray) -> np.ndarray:
        refs = same_value.get(node.id) or ()
        for ref in refs:
            compare(node, value, ref)
        for ref in refs:  # where a difference was excused, go on with the original's value
            if ref in excused:
                value = np.where(excused[ref], before[ref], value).astype(value.dtype, copy=False)
        return value

    feeds = {n.name: before[n.id] for n in original.inputs}
    params = {n.name: before[n.id] for n in original.params}
    after = evaluate(optimized, feeds, params, seed=seed, return_all=True, visit=visit)
    for k, (new, old) in enumerate(zip(optimized.outputs, original.outputs, strict=True)):
        if old not in (same_value.get(new) or ()):
            compare(optimized.node(new), after[new], old, output=k)


def _excused(graph: Graph, values: dict[int, np.ndarray], precision: dict[int, str | None],
             materialized: set[int]) -> dict[int, np.ndarray]:
    """Per original node, the elements an optimized value may differ in (only nodes that have some).

    A decision's ambiguous elements are excused.  Through nodes the optimized
    graph does not materialize (computed inside a fused kernel), the excuse
    spreads to every element that depends on an excused one; a materialized
    value goes on with the original's value there (see ``visit``), so it stops.
    """
    excused: dict[int, np.ndarray] = {}
    for node in graph.nodes:
        masks = [m for m in (_ambiguous(graph, node, values, precision),
                             _reached(graph, node, values, excused, materialized)) if m is not None]
        if masks and (mask := np.logical_or.reduce(masks)).any():
            excused[node.id] = mask
    return excused


def _ambiguous(graph: Graph, node: Node, values: dict[int, np.ndarray],
               precision: dict[int, str | None]) -> np.ndarray | None:
    """Elements of a decision that operands within their tolerance could flip (None: not a decision)."""
    floats = [i for i in node.inputs if dtype(graph.node(i).dtype).is_float]
    if dtype(node.dtype).is_float or not floats or node.op not in ("Greater", "Less", "Equal", "Cast"):
        return None
    x = [values[i].astype(np.float64) for i in node.inputs]
    reach = [PARITY_TOLERANCE[precision[i]][1] + PARITY_TOLERANCE[precision[i]][0] * np.abs(v)
             for i, v in zip(node.inputs, x, strict=True)]
    if node.op == "Cast":  # truncation flips at integers, a cast to bool at zero
        boundary = 0.0 if node.dtype == "bool" else np.rint(x[0])
        mask = np.abs(x[0] - boundary) <= reach[0]
    else:
        mask = np.abs(x[0] - x[1]) <= reach[0] + reach[1]
    return np.broadcast_to(mask, node.shape)


def _reached(graph: Graph, node: Node, values: dict[int, np.ndarray], excused: dict[int, np.ndarray],
             materialized: set[int]) -> np.ndarray | None:
    """Elements of ``node`` that depend on an excused element of an unmaterialized input.

    Found by running the kernel twice with the excused input elements set to
    two far-apart probe values: an output element that moves depends on them.
    """
    tainted = [k for k, i in enumerate(node.inputs) if i in excused and i not in materialized]
    if not tainted:
        return None
    moved = np.zeros(node.shape, dtype=bool)
    for probe in (0, 1):
        args = [values[i] for i in node.inputs]
        for k in tainted:
            i = node.inputs[k]
            args[k] = np.where(excused[i], _PROBES[dtype(graph.node(i).dtype).is_float][probe], args[k])
        try:
            moved |= _differs(run_node(graph, node, args), values[node.id])
        except IndexError:  # a probe index out of range: everything may depend on it
            return np.ones(node.shape, dtype=bool)
    return moved


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a != b where NaN equals NaN."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return ~((a == b) | (np.isnan(a) & np.isnan(b)))
