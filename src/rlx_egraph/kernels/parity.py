"""Numerical parity: an optimized graph against the graph it came from, on seeded random data.

Compared, anchored: every optimized node (leaves included) with every
input-graph node merged into its e-class, after which the run goes on from the
original's value (so each node is judged on its own error, from the original's
inputs), and every optimized graph output with the original output at the same
position; then, if anchoring changed a value, every float output of the
optimized graph run on its own values, within END_TO_END_FACTOR times a
norm-wise reach.  On two seeds for graphs of up to SECOND_SEED_MAX_ELEMENTS
values.  A float value may differ by the tolerance of
the loosest float dtype it was computed through in the original graph, plus
ROUNDING_FACTOR times the original's own rounding error (its distance to the
same graph computed in f32).  Integer and bool values are compared exactly,
except that a decision (an integer/bool value computed from floats: a
comparison, a Cast) may flip where its original operands lie within that
reach of the decision boundary, and a decision made inside a fused kernel
excuses the elements that depend on it.  docs/verifier.md has the whole story.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import RlxError
from ..ir.dtypes import PARITY_TOLERANCE, dtype, loosest, widened
from ..ir.graph import Graph, Node
from ..ir.registry import AttrType, Kind
from .interpreter import evaluate, run_graph_node

# A second seed is checked when the original graph's values hold at most this many elements in total.
SECOND_SEED_MAX_ELEMENTS = 1 << 22
# How many times the original's own rounding error (its distance to the f32 computation) a
# legitimate result may differ by, on top of the dtype tolerance.
ROUNDING_FACTOR = 4.0
# The end-to-end comparison of outputs (the optimized graph's own values throughout, no anchoring) allows this
# many times the reach, with |value| replaced by the output's largest magnitude: upstream differences, each
# within its own reach, may be amplified on the way (an Exp of a large value), never by orders of magnitude.
END_TO_END_FACTOR = 4.0
# Values written into an excused element of an input to see which output elements it reaches.
_PROBES = {True: (-1e4, 1e4), False: (0, 1)}  # by is_float


class ParityError(RlxError, AssertionError):
    """An optimized node differs from what it replaced; names the node and the rules."""


@dataclass(frozen=True)
class NodeParity:
    """One comparison of an optimized node with an original node, on one seed."""

    node: int
    op: str
    original: int
    seed: int
    max_abs: float
    tolerance_ratio: float  # max over elements of |new - old| / reach (see _Reference.reach); <= 1 passes
    rtol: float
    atol: float
    output: int | None = None  # the output position, for a comparison of graph outputs
    end_to_end: bool = False  # an output of the un-anchored run, against END_TO_END_FACTOR x its end-to-end reach

    @property
    def ok(self) -> bool:
        return self.tolerance_ratio <= 1.0

    def to_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "original": self.original, "seed": self.seed,
                "output": self.output, "end_to_end": self.end_to_end, "max_abs": self.max_abs,
                "tolerance_ratio": self.tolerance_ratio, "rtol": self.rtol, "atol": self.atol, "ok": self.ok}


@dataclass
class ParityReport:
    """Every comparison of one check, over its seeds."""

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


def tolerance_ratio(new: np.ndarray, old: np.ndarray, reach: Callable[[], np.ndarray | float],
                    excused: np.ndarray | None = None) -> tuple[float, float]:
    """Largest |new - old| and largest |new - old| / reach(), where ``reach()`` is the allowed difference.

    NaN equals NaN, equal infinities are equal, and ``excused`` elements are
    skipped.  A difference where the reach is 0 (exact dtypes) is infinitely
    far past it.  ``reach`` is only called when some element differs.
    """
    a, b = np.asarray(new, dtype=np.float64), np.asarray(old, dtype=np.float64)
    differs = _differs(a, b) if excused is None else _differs(a, b) & ~excused
    if not differs.any():
        return 0.0, 0.0
    bound = np.broadcast_to(reach(), b.shape)[differs]
    with np.errstate(all="ignore"):
        diff = np.nan_to_num(np.abs(a[differs] - b[differs]), nan=np.inf)
        ratio = np.nan_to_num(diff / bound, nan=np.inf)
    return float(diff.max()), float(ratio.max())


def parity_seeds(graph: Graph, seed: int = 0) -> tuple[int, ...]:
    """``(seed, seed + 1)`` when the graph's values hold at most SECOND_SEED_MAX_ELEMENTS elements, else ``(seed,)``."""
    size = sum(t.numel for n in graph.nodes for t in n.results)
    return (seed, seed + 1) if size <= SECOND_SEED_MAX_ELEMENTS else (seed,)


def precisions(graph: Graph) -> dict[int, str | None]:
    """Each node's loosest float dtype among itself and its ancestors (None: no float on the way)."""
    out: dict[int, str | None] = {}
    for n in graph.nodes:
        out[n.id] = loosest([*(t.dtype for t in n.results), *(out[i] for i in n.inputs if out[i])])
    return out


def check_parity(original: Graph, optimized: Graph, same_value: Mapping[int, Sequence[int]],
                 blame: Callable[[int], Sequence[str]] | None = None, seed: int = 0) -> ParityReport:
    """Compare ``optimized`` with ``original`` on the seeds of :func:`parity_seeds`.

    ``same_value`` maps optimized node ids to the original node ids of the same
    value; the data for every input and parameter is drawn from the original
    graph.  ``blame(node)`` names the rules that built optimized node ``node``.
    Raises :class:`ParityError` on the first comparison outside its tolerance.
    """
    if len(optimized.outputs) != len(original.outputs):
        raise ParityError(f"parity failure: the optimized graph has {len(optimized.outputs)} outputs, "
                          f"the original {len(original.outputs)}")
    precision, wide = precisions(original), widened_graph(original)
    materialized = {r for refs in same_value.values() for r in refs}
    report = ParityReport(parity_seeds(original, seed))
    for s in report.seeds:
        ref = _Reference.build(original, wide, s, precision, materialized)
        _check_seed(ref, optimized, same_value, blame, report)
    return report


@dataclass
class _Reference:
    """The original graph's values on one seed, and how far a legitimate result may stray from them."""

    graph: Graph
    seed: int
    values: dict[int, np.ndarray]
    precision: dict[int, str | None]
    rounding: dict[int, np.ndarray]  # |value - the same value computed in f32|, float nodes of low-precision graphs
    excused: dict[int, np.ndarray] = field(default_factory=dict)  # elements allowed to differ, by node

    @classmethod
    def build(cls, graph: Graph, wide: Graph | None, seed: int, precision: dict[int, str | None],
              materialized: set[int]) -> _Reference:
        values = evaluate(graph, seed=seed, return_all=True)
        ref = cls(graph, seed, values, precision, rounding_error(graph, values, wide))
        ref.excuse(materialized)
        return ref

    def tolerance(self, node_id: int) -> tuple[float, float]:
        """(rtol, atol) of a value: its loosest float precision's; exact for integer and bool values."""
        node = self.graph.node(node_id)
        return PARITY_TOLERANCE[self.precision[node_id] if dtype(node.dtype).is_float else node.dtype]

    def reach(self, node_id: int) -> np.ndarray:
        """Per element, how far a legitimate result may be: atol + rtol*|value| + ROUNDING_FACTOR*rounding."""
        rtol, atol = self.tolerance(node_id)
        bound = atol + rtol * np.abs(self.values[node_id].astype(np.float64))
        return bound + ROUNDING_FACTOR * self.rounding[node_id] if node_id in self.rounding else bound

    def end_to_end_reach(self, node_id: int) -> np.ndarray:
        """END_TO_END_FACTOR x the reach with |value| replaced by the value's largest finite magnitude."""
        rtol, atol = self.tolerance(node_id)
        value = np.abs(self.values[node_id].astype(np.float64))
        bound = atol + rtol * np.max(value, where=np.isfinite(value), initial=0.0)
        if node_id in self.rounding:
            bound = bound + ROUNDING_FACTOR * self.rounding[node_id]
        return END_TO_END_FACTOR * bound

    def excuse(self, materialized: set[int]) -> None:
        """Fill ``excused``: the ambiguous elements of each decision, and what they reach.

        Through nodes the optimized graph does not materialize (computed inside
        a fused kernel) an excuse spreads to every element that depends on an
        excused one; a materialized value goes on with the original's value
        there (see ``_check_seed``), so the excuse stops at it.
        """
        for node in self.graph.nodes:
            masks = [m for m in (self._ambiguous(node), self._reached(node, materialized)) if m is not None]
            if masks and (mask := np.logical_or.reduce(masks)).any():
                self.excused[node.id] = mask

    def _ambiguous(self, node: Node) -> np.ndarray | None:
        """Elements of a decision that operands within their reach could flip (None: not a decision)."""
        if node.parts or node.kind is Kind.PROJECTION:
            return None
        floats = [i for i in node.inputs if dtype(self.graph.node(i).dtype).is_float]
        if dtype(node.dtype).is_float or not floats or node.op not in ("Greater", "Less", "Equal", "Cast"):
            return None
        x = [self.values[i].astype(np.float64) for i in node.inputs]
        if node.op == "Cast":  # truncation flips at integers, a cast to bool at zero
            boundary = 0.0 if node.dtype == "bool" else np.rint(x[0])
            mask = np.abs(x[0] - boundary) <= self.reach(node.inputs[0])
        else:
            mask = np.abs(x[0] - x[1]) <= self.reach(node.inputs[0]) + self.reach(node.inputs[1])
        return np.broadcast_to(mask, node.shape)

    def _reached(self, node: Node, materialized: set[int]) -> np.ndarray | None:
        """Elements of ``node`` that depend on an excused element of an unmaterialized input.

        Found by running the kernel twice with the excused input elements set to
        two far-apart probe values: an output element that moves depends on them.
        """
        tainted = [k for k, i in enumerate(node.inputs) if i in self.excused and i not in materialized]
        if not tainted:
            return None
        if node.parts:  # not followed through a multi-result node (a stricter check of its results)
            return None
        moved = np.zeros(node.shape, dtype=bool)
        for probe in (0, 1):
            args = [self.values[i] for i in node.inputs]
            for k in tainted:
                i = node.inputs[k]
                args[k] = np.where(self.excused[i], _PROBES[dtype(self.graph.node(i).dtype).is_float][probe], args[k])
            try:
                moved |= _differs(run_graph_node(self.graph, node, args), self.values[node.id])
            except IndexError:  # a probe index out of range: everything may depend on it
                return np.ones(node.shape, dtype=bool)
        return moved


def widened_graph(graph: Graph) -> Graph | None:
    """``graph`` with every float computed and stored in f32 (same node ids); None if nothing widens."""
    if all(widened(t.dtype) == t.dtype for n in graph.nodes for t in n.results):
        return None
    records = [{"id": n.id, "op": n.op, "inputs": n.inputs,
                "attrs": {a.name: widened(n.attrs[a.name]) if a.type is AttrType.DTYPE else n.attrs[a.name]
                          for a in n.spec.attrs}} for n in graph.nodes]
    return Graph.from_nodes(records, graph.outputs, graph.name)


def rounding_error(graph: Graph, values: dict[int, np.ndarray], wide: Graph | None = None) -> dict[int, np.ndarray]:
    """Per computed float node, |value - the same value computed in f32| ({} when nothing is below f32).

    ``values`` are all of ``graph``'s node values; ``wide`` is
    ``widened_graph(graph)`` when the caller has it already.

    The original's own rounding error: large where a low-precision value is
    ill-conditioned (a norm of nearly constant rows, a cancellation).  Each
    element gets at least the value's mean error: one whose rounding happened
    to land on the exact result is not held to a tighter standard than its
    neighbours.  Leaves and decisions keep the original's values.
    """

    def keep(node: Node, value: np.ndarray) -> np.ndarray:
        if node.parts:
            return value
        return values[node.id] if node.kind is Kind.LEAF or not dtype(node.dtype).is_float else value

    def error(node: Node) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            err = np.abs(values[node.id].astype(np.float64) - wide_values[node.id])
        err = np.nan_to_num(err, nan=0.0, posinf=0.0)
        return np.maximum(err, err.mean())

    wide = wide or widened_graph(graph)
    if wide is None:
        return {}
    leaves = {n.name: values[n.id] for n in graph.nodes if n.op in ("Input", "Param")}
    wide_values = evaluate(wide, leaves, leaves, return_all=True, visit=keep)
    return {n.id: error(n) for n in graph.nodes
            if not n.parts and dtype(n.dtype).is_float and n.kind is not Kind.LEAF}


def _check_seed(ref: _Reference, optimized: Graph, same_value: Mapping[int, Sequence[int]],
                blame: Callable[[int], Sequence[str]] | None, report: ParityReport) -> None:
    """Run ``optimized`` anchored (comparing as it goes), then, if anchoring changed anything, end to end."""
    original, before = ref.graph, ref.values
    own: dict[int, np.ndarray] = {}  # each optimized value as computed from its (anchored) inputs
    moved: list[int] = []  # optimized nodes whose anchored value differs from the original's

    def rules(nodes: Sequence[int]) -> str:
        names = dict.fromkeys(r for n in nodes for r in (blame(n) if blame else ()))
        return ", ".join(names) or "none recorded"

    def compare(node: Node, value: np.ndarray, old_id: int, excused: np.ndarray | None,
                output: int | None = None) -> None:
        old = original.node(old_id)
        rtol, atol = ref.tolerance(old_id)
        max_abs, ratio = tolerance_ratio(value, before[old_id], lambda: ref.reach(old_id), excused)
        entry = NodeParity(node.id, node.op, old_id, ref.seed, max_abs, ratio, rtol, atol, output)
        report.nodes.append(entry)
        if entry.ok:
            return
        at = "" if output is None else f", output {output},"
        prec = ref.precision[old_id] if dtype(old.dtype).is_float else None
        how = (f"max abs error {max_abs:.3g}, {ratio:.3g} x its tolerance (rtol={rtol}, atol={atol}: {prec} "
               "precision, plus its rounding error)" if prec
               else f"exact {old.dtype} values differ beyond the decisions allowed to flip")
        raise ParityError(f"parity failure: {optimized.describe(node.id)}{at} differs from original "
                          f"{original.describe(old_id)} on seed {ref.seed}: {how}; built by rule(s): "
                          f"{rules([node.id])}")

    def shared_excuse(refs: Sequence[int]) -> np.ndarray | None:
        masks = [ref.excused[r] for r in refs if r in ref.excused]
        return np.logical_or.reduce(masks) if masks else None  # the refs hold one value: one excuse

    def anchored(node: Node, value: np.ndarray) -> np.ndarray:
        """Compare ``node`` with the original values it holds, then go on from the original's value."""
        if node.parts:  # a multi-result node: each result is compared through its Get
            return value
        own[node.id] = value
        refs = same_value.get(node.id) or ()
        for old_id in refs:
            compare(node, value, old_id, shared_excuse(refs))
        if not refs:  # an intermediate of a fusion: followed through to the next original value
            return value
        anchor = before[refs[0]].astype(value.dtype, copy=False)
        if _differs(value, anchor).any():
            moved.append(node.id)
        return anchor

    def followed(node: Node, value: np.ndarray) -> np.ndarray:
        """The optimized graph's own float values; the original's decisions, integers and excused elements."""
        refs = same_value.get(node.id) or ()
        if node.parts or not refs:
            return value
        if not dtype(node.dtype).is_float:
            return before[refs[0]].astype(value.dtype, copy=False)
        excused = shared_excuse(refs)
        return value if excused is None else np.where(excused, before[refs[0]], value).astype(value.dtype, copy=False)

    feeds = {n.name: before[n.id] for n in original.inputs}
    params = {n.name: before[n.id] for n in original.params}
    evaluate(optimized, feeds, params, seed=ref.seed, visit=anchored)
    pairs = list(enumerate(zip(optimized.outputs, original.outputs, strict=True)))
    for k, (new, old) in pairs:
        if old not in (same_value.get(new) or ()):
            compare(optimized.node(new), own[new], old, ref.excused.get(old), output=k)
    if not moved:  # anchoring changed nothing: the run above was the end-to-end run
        return
    after = evaluate(optimized, feeds, params, seed=ref.seed, return_all=True, visit=followed)
    for k, (new, old) in pairs:
        if not dtype(original.node(old).dtype).is_float:
            continue
        rtol, atol = ref.tolerance(old)
        unjudged = ~(np.isfinite(after[new]) & np.isfinite(before[old]))  # overflow near the largest value
        excused = unjudged if old not in ref.excused else unjudged | ref.excused[old]
        max_abs, ratio = tolerance_ratio(after[new], before[old], lambda o=old: ref.end_to_end_reach(o), excused)
        node = optimized.node(new)
        entry = NodeParity(new, node.op, old, ref.seed, max_abs, ratio, rtol, atol, k, end_to_end=True)
        report.nodes.append(entry)
        if not entry.ok:
            on_the_way = [n for n in moved if n in _ancestors(optimized, new)]
            raise ParityError(
                f"parity failure: {optimized.describe(new)}, output {k}, end to end, differs from original "
                f"{original.describe(old)} on seed {ref.seed}: max abs error {max_abs:.3g}, {ratio:.3g} x its "
                f"end-to-end tolerance ({END_TO_END_FACTOR:g} x (atol={atol} + rtol={rtol} x the output's largest "
                f"magnitude, plus its rounding error): {ref.precision[old]} precision); differing on the way: "
                f"node(s) {', '.join(map(str, on_the_way))}, built by rule(s): {rules(on_the_way)}")


def _ancestors(graph: Graph, node_id: int) -> set[int]:
    """``node_id`` and every node it is computed from."""
    seen, todo = set(), [node_id]
    while todo:
        if (n := todo.pop()) not in seen:
            seen.add(n)
            todo.extend(graph.node(n).inputs)
    return seen


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a != b where NaN equals NaN."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return ~((a == b) | (np.isnan(a) & np.isnan(b)))
