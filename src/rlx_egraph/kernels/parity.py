"""Numerical parity: an optimized graph against the graph it came from, on seeded random data.

Compared, anchored: every optimized node (leaves included) with every
input-graph node merged into its e-class, after which the run goes on from the
original's value (so each node is judged on its own error, from the original's
inputs), and every optimized graph output with the original output at the same
position; then, if anchoring changed a value, every float output of the
optimized graph run on its own values, within END_TO_END_FACTOR times a
norm-wise reach.  On two seeds for graphs of up to SECOND_SEED_MAX_ELEMENTS
values, and then on the first seed in special rounds with IEEE special values
(-0.0, +-inf, NaN, subnormals, +-max) at a share of every float leaf drawn at
random (for graphs of up to ALL_KINDS_MAX_ELEMENTS values, as many rounds as
put every kind in every such leaf):
there an element the original computes exactly (its non-finite values come
from its inputs', not from an overflow of its own) must come out the same, a
zero's sign and an infinity's included.  A float value may differ by the tolerance of
the loosest float dtype it was computed through in the original graph, plus
ROUNDING_FACTOR times the original's own rounding error (its distance to the
same graph computed in f32).  Integer and bool values are compared exactly,
except that a decision (an integer/bool value computed from floats: a
comparison, a Cast) may flip where its original operands lie within that
reach of the decision boundary, and a decision made inside a fused kernel
excuses the elements that depend on it.  docs/verifier.md has the whole story.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import RlxError
from ..ir.dtypes import PARITY_TOLERANCE, dtype, loosest, widened
from ..ir.graph import Graph, GraphError, Node, attrs_equal
from ..ir.ops.reference import run_node
from ..ir.registry import AttrType, Kind
from ..ir.specialize import bind_shapes
from .interpreter import IndexRangeError, evaluate, random_value, run_graph_node, special_rounds

# A second seed is checked when the original graph's values hold at most this many elements in total.
SECOND_SEED_MAX_ELEMENTS = 1 << 22
# The largest graph the check runs: the input graph's values (all nodes' results, in elements) it holds at once,
# with the optimized graph's and their float64 differences; above it, ParityInputError before anything runs.
VERIFY_MAX_ELEMENTS = 1 << 26
# Above VERIFY_MAX_ELEMENTS the check is sampled: each rewritten node is checked in a window of its own (the
# node and the fusion intermediates it reads, against the input graph's nodes that compute its value from the
# same values) of at most this many elements, while the windows checked hold at most VERIFY_MAX_ELEMENTS in all.
WINDOW_MAX_ELEMENTS = 1 << 22
# Up to this many elements, the special runs are as many as put every special kind in every drawn float leaf
# (interpreter.special_rounds); above it, one.
ALL_KINDS_MAX_ELEMENTS = 1 << 16
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


class WeightFoldError(ParityError):
    """A fold of stored weights that is not exact within the dtype's tolerance on their values: names the node, the
    rules and the weights."""


class ParityInputError(ParityError):
    """The check could not run the input graph on the data it drew (or was given): names the node and the
    inputs, and says how to give reference inputs.  Not a wrong rule."""


@dataclass(frozen=True)
class NodeParity:
    """One comparison of an optimized node with an original node, on one seed."""

    node: int
    op: str
    original: int
    seed: int
    max_abs: float
    tolerance_ratio: float  # max over elements of |new - old| / reach (see Reference.reach); <= 1 passes
    rtol: float
    atol: float
    output: int | None = None  # the output position, for a comparison of graph outputs
    end_to_end: bool = False  # an output of the un-anchored run, against END_TO_END_FACTOR x its end-to-end reach
    special: int = 0  # the special round (>= 1) whose leaves held IEEE special values, 0 on an ordinary run

    @property
    def ok(self) -> bool:
        return self.tolerance_ratio <= 1.0

    def to_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "original": self.original, "seed": self.seed,
                "output": self.output, "end_to_end": self.end_to_end, "special": self.special, "max_abs": self.max_abs,
                "tolerance_ratio": self.tolerance_ratio, "rtol": self.rtol, "atol": self.atol, "ok": self.ok}


@dataclass(frozen=True)
class ParitySample:
    """What a sampled check (an input graph above VERIFY_MAX_ELEMENTS) compared: each rewritten node in a window
    of its own, against the input-graph value it replaces, from random values of the values it reads."""

    elements: int  # the input graph's values, in elements
    rewritten: int  # optimized nodes that compute their value otherwise than the input graph (one window each)
    checked: int  # windows checked
    too_large: int  # windows above WINDOW_MAX_ELEMENTS, or past the sample's budget
    not_runnable: int  # windows the input graph's part could not run on random data (indices out of range)

    def __str__(self) -> str:
        left = self.rewritten - self.checked
        return (f"a sample: the input graph's values hold {self.elements:,} elements, more than the "
                f"{VERIFY_MAX_ELEMENTS:,} a whole check holds; {self.checked} of the {self.rewritten} rewritten "
                f"nodes checked, each against the value it replaces, run with the numpy reference kernels from seeded "
                f"random values of what it reads"
                + (f" ({left} not: {self.too_large} above {WINDOW_MAX_ELEMENTS:,} elements or the sample's budget, "
                   f"{self.not_runnable} not runnable on random data)" if left else "")
                + "; nodes the rules left as they were, and the end-to-end run, not checked")

    def to_dict(self) -> dict:
        return {"elements": self.elements, "rewritten": self.rewritten, "checked": self.checked,
                "too_large": self.too_large, "not_runnable": self.not_runnable}


@dataclass
class ParityReport:
    """Every comparison of one check, over its seeds."""

    seeds: tuple[int, ...]
    nodes: list[NodeParity] = field(default_factory=list)
    special: int = 0  # how many special rounds ran (on the first seed)
    sample: ParitySample | None = None  # set when the input graph was too large to check whole

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    @property
    def worst(self) -> NodeParity | None:
        """The comparison closest to (or furthest past) its tolerance."""
        return max(self.nodes, key=lambda n: n.tolerance_ratio, default=None)

    def to_dict(self) -> dict:
        return {"seeds": list(self.seeds), "special": self.special, "ok": self.ok,
                "sample": self.sample.to_dict() if self.sample else None,
                "nodes": [n.to_dict() for n in self.nodes]}


def tolerance_ratio(new: np.ndarray, old: np.ndarray, reach: Callable[[], np.ndarray | float],
                    excused: np.ndarray | None = None,
                    signless: Callable[[], np.ndarray | bool] | None = None) -> tuple[float, float]:
    """Largest |new - old| and largest |new - old| / reach(), where ``reach()`` is the allowed difference.

    NaN equals NaN, equal infinities are equal, and ``excused`` elements are
    skipped.  A zero of the other sign differs by 0 but is infinitely far past
    the reach (``1 / x`` tells them apart), unless ``signless()`` (called only
    then) marks it as a zero whose sign ``old`` did not compute exactly (True:
    none did); and so is a difference where the reach is 0 (exact dtypes).  An
    infinity of ``new`` where ``old`` is finite counts as the largest finite
    value of its sign (a result within reach of it may round up to infinity).
    ``reach`` is only called when some element differs.
    """
    a, b = np.asarray(new, dtype=np.float64), np.asarray(old, dtype=np.float64)
    differs = _differs(a, b) if excused is None else _differs(a, b) & ~excused
    if not differs.any():
        return 0.0, 0.0
    bound = np.broadcast_to(reach(), b.shape)[differs]
    a, b = a[differs], b[differs]
    if np.issubdtype(np.asarray(new).dtype, np.floating):  # an overflow counts as the largest finite value
        largest = float(np.finfo(np.asarray(new).dtype).max)
        a = np.where(np.isinf(a) & np.isfinite(b), np.copysign(largest, a), a)
    with np.errstate(all="ignore"):
        diff = np.nan_to_num(np.abs(a - b), nan=np.inf)
        ratio = np.nan_to_num(diff / bound, nan=np.inf)
    flipped = (diff == 0) & (a == 0)  # differs yet equal: zeros of opposite signs
    if flipped.any() and signless is not None:
        free = signless()
        if isinstance(free, bool):
            flipped &= not free
        else:
            flipped &= ~np.broadcast_to(free, differs.shape)[differs]
    ratio[flipped] = np.inf
    return float(diff.max()), float(ratio.max())


def made_by_kernel(kind: str, spec: Any, attrs: Mapping[str, Any], args: Sequence[np.ndarray],
                   in_dtypes: Sequence[str], out_type: Any, value: np.ndarray,
                   index: int | None = None) -> np.ndarray | None:
    """Elements of a kernel's float ``value`` that the kernel made itself rather than took from its inputs:
    ``kind`` "non-finite" (an overflow, ``0 * inf`` of its own) or "zero" (a cancellation ``a - a``, an
    underflow).  Found by running it again with every such input element (non-finite, or zero) set to 1.0:
    an element that stays so was made by the kernel.  It is not exact: a rewrite that rounds otherwise (a
    reassociated sum near the largest value, a zero of the other sign) may differ there.  ``index``: ``value``
    is that result of a multi-result kernel.  None when there is none (or the value is not float)."""
    def marked(x: np.ndarray) -> np.ndarray:
        return ~np.isfinite(x) if kind == "non-finite" else x == 0

    if not np.issubdtype(np.asarray(value).dtype, np.floating) or not (made := marked(value)).any():
        return None
    cleared = [np.where(marked(x), 1.0, x).astype(x.dtype) if np.issubdtype(x.dtype, np.floating) else x
               for x in map(np.asarray, args)]
    try:
        again = run_node(spec, attrs, cleared, in_dtypes, out_type)
    except (IndexError, ValueError):
        return made
    made &= marked(np.asarray(again if index is None else again[index]))
    return made if made.any() else None


def parity_seeds(graph: Graph, seed: int = 0) -> tuple[int, ...]:
    """``(seed, seed + 1)`` when the graph's values hold at most SECOND_SEED_MAX_ELEMENTS elements, else ``(seed,)``."""
    size = _size(graph)
    return (seed, seed + 1) if size <= SECOND_SEED_MAX_ELEMENTS else (seed,)


def precisions(graph: Graph) -> dict[int, str | None]:
    """Each node's loosest float dtype among itself and its ancestors (None: no float on the way)."""
    out: dict[int, str | None] = {}
    for n in graph.nodes:
        out[n.id] = loosest([*(t.dtype for t in n.results), *(out[i] for i in n.inputs if out[i])])
    return out


def check_parity(original: Graph, optimized: Graph, same_value: Mapping[int, Sequence[int]],
                 blame: Callable[[int], Sequence[str]] | None = None, seed: int = 0,
                 feeds: Mapping[str, np.ndarray] | None = None) -> ParityReport:
    """Compare ``optimized`` with ``original`` on the seeds of :func:`parity_seeds`, then (when the second seed
    runs and some float leaf is drawn at random) on the first seed with IEEE special values.

    ``same_value`` maps optimized node ids to the original node ids of the same
    value; the data for every input and parameter is drawn from the original
    graph, but for ``feeds`` (reference values of inputs, by name) and the
    graph's weight store.  ``blame(node)`` names the rules that built optimized node ``node``.
    Raises :class:`ParityError` on the first comparison outside its tolerance, and
    :class:`ParityInputError` when the input graph cannot run on the data.
    """
    if len(optimized.outputs) != len(original.outputs):
        raise ParityError(f"parity failure: the optimized graph has {len(optimized.outputs)} outputs, "
                          f"the original {len(original.outputs)}")
    feeds = dict(feeds or {})
    check_reference_inputs(original, feeds)
    if (size := _size(original)) > VERIFY_MAX_ELEMENTS:
        return _check_sample(original, optimized, same_value, blame, seed, feeds, size)
    precision, wide = precisions(original), widened_graph(original)
    materialized = {r for refs in same_value.values() for r in refs}
    report = ParityReport(parity_seeds(original, seed))
    runs = [(s, 0) for s in report.seeds]
    drawn = _drawn_float_sizes(original, feeds)
    if len(report.seeds) > 1 and drawn:
        report.special = special_rounds(drawn) if _size(original) <= ALL_KINDS_MAX_ELEMENTS else 1
        runs += [(seed, k) for k in range(1, report.special + 1)]
    folded = _folded_params(optimized, [n.id for n in optimized.nodes if n.kind is Kind.WEIGHT_PREP])
    for s, special in runs:
        ref = Reference.build(original, wide, s, precision, materialized, feeds, special, folded)
        _check_seed(ref, optimized, same_value, blame, report)
    return report


def _check_sample(original: Graph, optimized: Graph, same_value: Mapping[int, Sequence[int]],
                  blame: Callable[[int], Sequence[str]] | None, seed: int, feeds: Mapping[str, np.ndarray],
                  size: int) -> ParityReport:
    """The check of a graph above VERIFY_MAX_ELEMENTS: every rewritten node of ``optimized`` in a window of its
    own (:func:`_window`), one of each op and set of rules first, then in graph order, while the windows fit
    WINDOW_MAX_ELEMENTS each and VERIFY_MAX_ELEMENTS in all; nothing of the whole graph is computed."""
    outputs = {new: old for new, old in zip(optimized.outputs, original.outputs, strict=True)
               if old not in (same_value.get(new) or ())}
    rewritten = [n for n in optimized.nodes if n.id in outputs or _rewritten(n, original, same_value)]
    first: dict[tuple[str, tuple[str, ...]], int] = {}
    for n in rewritten:
        first.setdefault((n.op, tuple(blame(n.id) if blame else ())), n.id)
    order = sorted(rewritten, key=lambda n: (n.id not in first.values(), optimized.positions()[n.id]))
    report = ParityReport((seed, seed + 1))
    checked = too_large = not_runnable = budget = 0
    for node in order:
        refs = [*(same_value.get(node.id) or ()), *([outputs[node.id]] if node.id in outputs else [])]
        window = _window(original, optimized, same_value, node.id, refs)
        if window is None or budget + _size(window[0]) > VERIFY_MAX_ELEMENTS:
            too_large += 1
            continue
        old, new, same = window
        try:
            part = check_parity(old, new, same, blame, seed, {k: v for k, v in feeds.items()
                                                             if k in {n.name for n in old.inputs}})
        except ParityInputError:
            not_runnable += 1
            continue
        budget += _size(old)
        checked += 1
        report.nodes += part.nodes
        report.special = max(report.special, part.special)
    report.sample = ParitySample(size, len(rewritten), checked, too_large, not_runnable)
    return report


def _rewritten(node: Node, original: Graph, same_value: Mapping[int, Sequence[int]]) -> bool:
    """Whether optimized ``node`` holds an input-graph value that it computes otherwise than the input graph: not
    the same op and attributes over the same values (a leaf: not the same leaf alone)."""
    refs = same_value.get(node.id) or ()
    if not refs or node.parts:
        return False
    old = original.node(refs[0])
    if len(refs) > 1 and any(original.node(r).op != old.op for r in refs[1:]):
        return True
    if node.kind is Kind.LEAF:
        return not (old.kind is Kind.LEAF and node.same_as(old))
    return not (node.op == old.op and len(node.inputs) == len(old.inputs) and attrs_equal(node.attrs, old.attrs)
                and node.type == old.type and all(o in (same_value.get(i) or ())
                                                  for i, o in zip(node.inputs, old.inputs, strict=True)))


def _window(original: Graph, optimized: Graph, same_value: Mapping[int, Sequence[int]], node_id: int,
            refs: Sequence[int]) -> tuple[Graph, Graph, dict[int, list[int]]] | None:
    """Optimized node ``node_id`` and the fusion intermediates it reads (nodes that hold no input-graph value),
    and the input graph's nodes ``refs`` computed from the same values: each value the window reads that holds
    an input-graph value becomes a leaf of both (an Input named after the value, or the leaf itself), so both
    run from the same data.  A value the input graph computes at several nodes stands for the one the input graph's
    side reads.  None when the window holds more than WINDOW_MAX_ELEMENTS, or a value it reads has several results
    (no leaf can stand for it), or the input graph's side reads a value the optimized side reads at no node or at
    several (it computes it from other values, or twice: the two sides would not run from the same data)."""
    new_ids: set[int] = set()
    held_by: dict[int, Sequence[int]] = {}  # optimized node read -> the input-graph nodes whose value it holds
    elements = 0
    stack = [node_id]
    while stack:
        nid = stack.pop()
        if nid in new_ids or nid in held_by:
            continue
        node = optimized.node(nid)
        held = same_value.get(nid) or ()
        if nid != node_id and held:
            held_by[nid] = held
            continue
        new_ids.add(nid)
        if (elements := elements + sum(t.numel for t in node.results)) > WINDOW_MAX_ELEMENTS:
            return None
        if node.kind is not Kind.LEAF:
            stack.extend(node.inputs)
    stops = {h for held in held_by.values() for h in held}
    if any(original.node(h).parts for h in stops):
        return None
    old_ids: set[int] = set()
    stack = list(refs)
    while stack:
        oid = stack.pop()
        if oid in old_ids:
            continue
        old_ids.add(oid)
        if (elements := elements + sum(t.numel for t in original.node(oid).results)) > WINDOW_MAX_ELEMENTS:
            return None
        if oid not in stops:
            stack.extend(original.node(oid).inputs)
    bounds: dict[int, int] = {}  # optimized node read -> the input-graph node of its value that the window reads
    for nid, held in held_by.items():
        read = [h for h in held if h in old_ids]
        if len(read) != 1:  # none: see above; several: each would be drawn apart, though they are one value
            return None
        bounds[nid] = read[0]
    stops = set(bounds.values())
    old, new = Graph(f"{original.name} window {node_id}"), Graph(f"{optimized.name} window {node_id}")
    for src, graph, ids, leaf_of in ((original, old, old_ids, {b: b for b in stops}),
                                     (optimized, new, new_ids | set(bounds), bounds)):
        for n in sorted((src.node(i) for i in ids), key=lambda n: src.positions()[n.id]):  # inputs first
            if n.id in leaf_of and original.node(leaf_of[n.id]).kind is not Kind.LEAF:
                stand_in = original.node(leaf_of[n.id])
                graph.add_node("Input", node_id=n.id, name=f"value of node {stand_in.id}", shape=stand_in.shape,
                               dtype=stand_in.dtype)
            elif n.id in leaf_of:
                leaf = original.node(leaf_of[n.id])
                graph.add_checked(Node(n.id, leaf.op, (), leaf.attrs, leaf.shape, leaf.dtype))
            else:
                graph.add_checked(n)
            if n.op == "Param" and n.id not in leaf_of and n.name in src.weights:
                graph.weights[n.name] = src.weights[n.name]
        for b in leaf_of.values():
            stand_in = original.node(b)
            if stand_in.op == "Param" and stand_in.name in original.weights:
                graph.weights[stand_in.name] = original.weights[stand_in.name]
    old.set_outputs([refs[0]])
    new.set_outputs([node_id])
    same = {b: [h] for b, h in bounds.items()} | {node_id: list(refs)}
    return old, new, same


def check_weight_folds(original: Graph, optimized: Graph, same_value: Mapping[int, Sequence[int]],
                       blame: Callable[[int], Sequence[str]] | None = None, seed: int = 0) -> int:
    """Check every fold of stored weights in ``optimized`` against the unfolded computation it replaced, on the
    stored values: each optimized node that reads a derived weight (a weight-prep node, computed in float64 from
    parameters and rounded once into its dtype) whose parameters the weight store holds, and that holds an
    input-graph value, is run in a window of its own (:func:`_window`: the node and the derived weights it reads,
    against the input-graph nodes that compute its value) on seed ``seed``'s data for its other inputs, and judged
    as the parity check judges a node (anchored, then end to end).  Returns how many nodes were checked; raises
    :class:`WeightFoldError` naming the node, the rules and the weights.  Folds of parameters without stored
    values, windows above WINDOW_MAX_ELEMENTS and windows whose input-graph side cannot run on random data are
    not checked here."""
    checked = 0
    for node in optimized.nodes:
        refs = same_value.get(node.id) or ()
        derived = [i for i in dict.fromkeys(node.inputs) if optimized.node(i).kind is Kind.WEIGHT_PREP]
        if node.kind is Kind.WEIGHT_PREP or not derived or not refs:
            continue
        weights = _folded_params(optimized, derived)
        if any(name not in optimized.weights for name in weights):
            continue
        window = _window(original, optimized, same_value, node.id, refs)
        if window is None:
            continue
        old, new, same = window
        try:
            ref = Reference.build(old, widened_graph(old), seed, precisions(old),
                                  {r for held in same.values() for r in held})
        except ParityInputError:  # the unfolded side cannot run on random data (indices computed from other values)
            continue
        try:
            _check_seed(ref, new, same, blame, ParityReport((seed,)))
        except ParityError as exc:
            rules = ", ".join(dict.fromkeys(r for d in derived for r in (blame(d) if blame else ()))) \
                or "none recorded"  # the rules that folded the weights
            raise WeightFoldError(
                f"weight fold: {optimized.describe(node.id)} reads weights folded from the stored "
                f"{', '.join(map(repr, weights))} by rule(s) {rules}, not within tolerance of the unfolded "
                f"computation on their values: {exc}") from None
        checked += 1
    return checked


def _folded_params(graph: Graph, derived: Sequence[int]) -> list[str]:
    """The names of the parameters the derived weights ``derived`` are computed from, in graph order."""
    found: set[int] = set()
    stack = list(derived)
    while stack:
        if (nid := stack.pop()) not in found:
            found.add(nid)
            stack.extend(graph.node(nid).inputs)
    return [n.name for n in graph.nodes if n.id in found and n.op == "Param"]


def check_reference_inputs(graph: Graph, feeds: Mapping[str, Any]) -> dict[str, int]:
    """Check reference inputs for ``graph`` (arrays by input name): every name an input, every value a real
    array of the input's rank (and, for a static dim, extent).  Returns the sizes their shapes give ``graph``'s
    symbols (:func:`~rlx_egraph.ir.specialize.bind_shapes`).  ParityInputError naming the input otherwise."""
    inputs = [n.name for n in graph.inputs]
    unknown = sorted(set(feeds) - set(inputs))
    if unknown:
        raise ParityInputError(f"parity check: reference input(s) {', '.join(map(repr, unknown))} name no input of "
                               f"the graph (its inputs: {', '.join(map(repr, inputs)) or 'none'})")
    try:
        sizes = bind_shapes(graph, feeds)
        for node in graph.inputs:
            if node.name in feeds:
                value = np.asarray(feeds[node.name])
                if value.dtype.kind not in "biuf":
                    raise GraphError(f"node {node.id} (Input {node.name!r}): given {value.dtype} values, expected "
                                     f"a real array for {node.dtype}")
                if any(isinstance(d, int) and d != n for d, n in zip(node.shape, value.shape, strict=True)):
                    raise GraphError(f"node {node.id} (Input {node.name!r}): given shape {list(value.shape)}, "
                                     f"expected {list(node.shape)}")
    except GraphError as exc:
        raise ParityInputError(f"parity check: reference inputs: {exc}") from None
    return sizes


def _drawn_float_sizes(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[int]:
    """The sizes of the float leaves of ``graph`` drawn at random (neither fed nor in the weight store)."""
    return [n.type.numel for n in graph.nodes if n.op in ("Input", "Param") and dtype(n.dtype).is_float
            and n.name not in (feeds if n.op == "Input" else graph.weights)]


def _size(graph: Graph) -> int:
    return sum(t.numel for n in graph.nodes for t in n.results)


def _run_original(graph: Graph, feeds: Mapping[str, np.ndarray], seed: int, special: int,
                  folded: Container[str] = ()) -> dict[int, np.ndarray]:
    """Every value of the input graph on the data of one run; ParityInputError when a node reads indices out of
    range (naming the inputs drawn at random on the way, and how to give reference inputs).  Parameters named in
    ``folded`` (those the optimized graph's derived weights read) are drawn as stored weights would be: without
    special values."""
    params = {n.name: random_value(graph, n, seed) for n in graph.params
              if special and n.name in folded and n.name not in graph.weights}
    try:
        return evaluate(graph, feeds, params, seed=seed, return_all=True, special=special)
    except IndexRangeError as exc:
        node = int(str(exc).split()[1])
        drawn = [n for n in graph.inputs if n.name not in feeds and n.id in _ancestors(graph, node)]
        named = ", ".join(f"{n.name!r}" for n in drawn)
        raise ParityInputError(
            f"parity check: the input graph cannot run on the data drawn for it: {exc}" + (
                f"; from the values drawn for input(s) {named}" if drawn else "")
            + "; give reference inputs: optimize(..., verify={'name': array, ...}) or --verify-inputs feeds.npz"
        ) from None


@dataclass
class Reference:
    """The original graph's values on one seed, and how far a legitimate result may stray from them."""

    graph: Graph
    seed: int
    values: dict[int, np.ndarray]
    precision: dict[int, str | None]
    rounding: dict[int, np.ndarray]  # |value - the same value computed in f32|, float nodes of low-precision graphs
    excused: dict[int, np.ndarray] = field(default_factory=dict)  # elements allowed to differ, by node

    special: int = 0  # the special round: the leaves drawn at random hold IEEE special values
    _magnitudes: dict[int, float] | None = None  # see magnitudes()
    _sign_free: dict[int, np.ndarray | None] | None = None  # see sign_free()

    @classmethod
    def build(cls, graph: Graph, wide: Graph | None, seed: int, precision: dict[int, str | None],
              materialized: set[int], feeds: Mapping[str, np.ndarray] | None = None,
              special: int = 0, folded: Container[str] = ()) -> Reference:
        values = _run_original(graph, feeds or {}, seed, special, folded)
        ref = cls(graph, seed, values, precision, rounding_error(graph, values, wide), special=special)
        ref.excuse(materialized)
        return ref

    def tolerance(self, node_id: int) -> tuple[float, float]:
        """(rtol, atol) of a value: its loosest float precision's; exact for integer and bool values."""
        node = self.graph.node(node_id)
        return PARITY_TOLERANCE[self.precision[node_id] if dtype(node.dtype).is_float else node.dtype]

    def reach(self, node_id: int) -> np.ndarray:
        """Per element, how far a legitimate result may be: atol + rtol*|value| + ROUNDING_FACTOR*rounding.

        On the special run |value| is the largest finite magnitude among the value and every value it is
        computed from: magnitudes there reach the dtype's largest, whose rounding a cancellation brings down to
        any element (``x + (y - (x + y))`` with y the largest is x, not 0).  What that run judges element by
        element is each element's IEEE kind: NaN, an infinity and its sign, an exact zero's sign."""
        if not self.special:
            return self._bound(node_id, norm_wise=False)
        rtol, atol = self.tolerance(node_id)
        bound = atol + rtol * self.magnitudes()[node_id]
        return bound + ROUNDING_FACTOR * self.rounding[node_id] if node_id in self.rounding else np.asarray(bound)

    def magnitudes(self) -> dict[int, float]:
        """Per node, the largest finite magnitude among its value and the values of all its ancestors."""
        if self._magnitudes is None:
            out: dict[int, float] = {}
            for n in self.graph.nodes:
                own = [np.abs(np.asarray(v, dtype=np.float64)) for v in
                       (self.values[n.id] if n.parts else (self.values[n.id],))]
                mine = max((float(np.max(v, where=np.isfinite(v), initial=0.0)) for v in own), default=0.0)
                out[n.id] = max([mine, *(out[i] for i in n.inputs)])
            self._magnitudes = out
        return self._magnitudes

    def end_to_end_reach(self, node_id: int) -> np.ndarray:
        """END_TO_END_FACTOR x the reach with |value| replaced by the value's largest finite magnitude."""
        return END_TO_END_FACTOR * self._bound(node_id, norm_wise=True)

    def _bound(self, node_id: int, norm_wise: bool) -> np.ndarray:
        rtol, atol = self.tolerance(node_id)
        value = np.abs(self.values[node_id].astype(np.float64))
        bound = atol + rtol * (np.max(value, where=np.isfinite(value), initial=0.0) if norm_wise else value)
        return bound + ROUNDING_FACTOR * self.rounding[node_id] if node_id in self.rounding else bound

    def excuse(self, materialized: set[int]) -> None:
        """Fill ``excused``: the ambiguous elements of each decision, and what they reach.

        Through nodes the optimized graph does not materialize (computed inside
        a fused kernel) an excuse spreads to every element that depends on an
        excused one; a materialized value goes on with the original's value
        there (see ``_check_seed``), so the excuse stops at it.  The elements an
        overflow made inexact (see :func:`made_by_kernel`) are excused too, and so is
        everything the original computes from them, materialized or not: an
        optimized node that does not read the overflowed value may differ there.
        """
        inexact: dict[int, np.ndarray] = {}
        for node in self.graph.nodes:
            made = [m for m in (self._made(node, "non-finite"), self._reached(node, inexact, ())) if m is not None]
            if made and (mask := np.logical_or.reduce(made)).any():
                inexact[node.id] = mask
            masks = [m for m in (self._ambiguous(node), self._reached(node, self.excused, materialized),
                                 inexact.get(node.id)) if m is not None]
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
        with np.errstate(invalid="ignore"):  # inf - inf: NaN, no element within reach
            if node.op == "Cast":  # truncation flips at integers, a cast to bool at zero
                boundary = 0.0 if node.dtype == "bool" else np.rint(x[0])
                mask = np.abs(x[0] - boundary) <= self.reach(node.inputs[0])
            else:
                mask = np.abs(x[0] - x[1]) <= self.reach(node.inputs[0]) + self.reach(node.inputs[1])
        return np.broadcast_to(mask, node.shape)

    def _made(self, node: Node, kind: str) -> np.ndarray | None:
        """Elements the node's kernel made non-finite or zero itself (see :func:`made_by_kernel`); a multi-result
        node's are taken through its projections."""
        if node.parts or node.kind is Kind.LEAF:
            return None
        value, index = self.values[node.id], None
        if node.kind is Kind.PROJECTION:  # the multi-result kernel's own, for this result
            node, index = self.graph.node(node.inputs[0]), node.attrs["index"]
        args = [self.values[i] for i in node.inputs]
        return made_by_kernel(kind, node.spec, node.attrs, args, [self.graph.node(i).dtype for i in node.inputs],
                              node.type, value, index)

    def sign_free(self, node_id: int) -> np.ndarray | bool:
        """The zeros of an original value whose sign is not exact: made by a kernel on the way (a cancellation
        ``a - a``, an underflow), rather than taken from a zero leaf: a rewrite may give the other sign there.
        Found node by node in graph order up to ``node_id`` (each node's own zeros, and the zeros that move
        with the sign-free zeros of its inputs), once per run."""
        if self._sign_free is None:
            self._sign_free = {}
        free = self._sign_free
        if node_id not in free:
            wanted = _ancestors(self.graph, node_id)
            for node in self.graph.nodes:
                if node.id in free or node.id not in wanted:
                    continue
                value = self.values[node.id]
                zeros = None if node.parts else np.asarray(value) == 0
                if zeros is None or not zeros.any() or not np.issubdtype(np.asarray(value).dtype, np.floating):
                    free[node.id] = None
                    continue
                inputs = {i: m for i in node.inputs if (m := free.get(i)) is not None}
                masks = [m for m in (self._made(node, "zero"), self._reached(node, inputs, ())) if m is not None]
                mask = np.logical_or.reduce(masks) & zeros if masks else None
                free[node.id] = mask if mask is not None and mask.any() else None
        return False if free[node_id] is None else free[node_id]

    def _reached(self, node: Node, marked: Mapping[int, np.ndarray], stops: Container[int]) -> np.ndarray | None:
        """Elements of ``node`` that depend on a ``marked`` element of an input not in ``stops``.

        Found by running the kernel twice with the marked input elements set to
        two far-apart probe values: an output element that moves depends on them.
        """
        tainted = [k for k, i in enumerate(node.inputs) if i in marked and i not in stops]
        if not tainted:
            return None
        if node.parts:  # not followed through a multi-result node (a stricter check of its results)
            return None
        moved = np.zeros(node.shape, dtype=bool)
        for probe in (0, 1):
            args = [self.values[i] for i in node.inputs]
            for k in tainted:
                i = node.inputs[k]
                args[k] = np.where(marked[i], _PROBES[dtype(self.graph.node(i).dtype).is_float][probe], args[k])
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


def _check_seed(ref: Reference, optimized: Graph, same_value: Mapping[int, Sequence[int]],
                blame: Callable[[int], Sequence[str]] | None, report: ParityReport) -> None:
    """Run ``optimized`` anchored (comparing as it goes), then, if anchoring changed anything, end to end."""
    original, before = ref.graph, ref.values
    own: dict[int, np.ndarray] = {}  # each optimized value as computed from its (anchored) inputs
    used: dict[int, Any] = {}  # the value each optimized node's readers got (anchored, or its own)
    moved: list[int] = []  # optimized nodes whose anchored value differs from the original's
    extreme: dict[int, np.ndarray | None] = {}  # see reads_extreme

    def reads_extreme(nid: int) -> np.ndarray | None:
        """Special run: the elements of optimized node ``nid`` that its kernel computes from a non-finite input
        element, one of the largest magnitude (see :func:`extreme_values`), or such an element of an intermediate
        that holds no original value; found by running it again with those set to 1.0."""
        if nid in extreme:
            return extreme[nid]
        node, index = optimized.node(nid), None
        if node.kind is Kind.PROJECTION:
            node, index = optimized.node(node.inputs[0]), node.attrs["index"]
        marks = [extreme_values(used[i]) for i in node.inputs]
        for k, i in enumerate(node.inputs):
            if same_value.get(i) or optimized.node(i).kind is Kind.LEAF:
                continue
            if (m := reads_extreme(i)) is not None:  # an intermediate of a fusion
                marks[k] = m if marks[k] is None else marks[k] | m
        args = [used[i] for i in node.inputs]
        extreme[nid] = computed_from(node.spec, node.attrs, args, [optimized.node(i).dtype for i in node.inputs],
                                     node.type, used[node.id], marks, index)
        return extreme[nid]

    def rules(nodes: Sequence[int]) -> str:
        names = dict.fromkeys(r for n in nodes for r in (blame(n) if blame else ()))
        return ", ".join(names) or "none recorded"

    def compare(node: Node, value: np.ndarray, old_id: int, excused: np.ndarray | None,
                output: int | None = None) -> None:
        old = original.node(old_id)
        rtol, atol = ref.tolerance(old_id)
        max_abs, ratio = tolerance_ratio(value, before[old_id], lambda: ref.reach(old_id), excused,
                                         lambda: ref.sign_free(old_id))
        if ratio > 1.0 and ref.special and node.kind is not Kind.LEAF and node.op != old.op \
                and (wide := reads_extreme(node.id)) is not None:  # a rewritten kernel reading extreme values
            excused = wide if excused is None else excused | wide
            max_abs, ratio = tolerance_ratio(value, before[old_id], lambda: ref.reach(old_id), excused,
                                             lambda: ref.sign_free(old_id))
        entry = NodeParity(node.id, node.op, old_id, ref.seed, max_abs, ratio, rtol, atol, output,
                           special=ref.special)
        report.nodes.append(entry)
        if entry.ok:
            return
        at = "" if output is None else f", output {output},"
        prec = ref.precision[old_id] if dtype(old.dtype).is_float else None
        if prec and max_abs == 0.0:
            how = "a zero of the other sign (-0.0 for 0.0 or the reverse, which 1/x tells apart)"
        elif prec:
            how = (f"max abs error {max_abs:.3g}, {ratio:.3g} x its tolerance (rtol={rtol}, atol={atol}: {prec} "
                   "precision, plus its rounding error)")
        else:
            how = f"exact {old.dtype} values differ beyond the decisions allowed to flip"
        raise ParityError(f"parity failure: {optimized.describe(node.id)}{at} differs from original "
                          f"{original.describe(old_id)} on {_run_name(ref)}: {how}; built by rule(s): "
                          f"{rules([node.id])}")

    def shared_excuse(refs: Sequence[int]) -> np.ndarray | None:
        masks = [ref.excused[r] for r in refs if r in ref.excused]
        return np.logical_or.reduce(masks) if masks else None  # the refs hold one value: one excuse

    def anchored(node: Node, value: np.ndarray) -> np.ndarray:
        """Compare ``node`` with the original values it holds, then go on from the original's value."""
        if node.parts:  # a multi-result node: each result is compared through its Get
            used[node.id] = value
            return value
        own[node.id] = used[node.id] = value
        refs = same_value.get(node.id) or ()
        for old_id in refs:
            compare(node, value, old_id, shared_excuse(refs))
        if not refs:  # an intermediate of a fusion: followed through to the next original value
            return value
        anchor = used[node.id] = before[refs[0]].astype(value.dtype, copy=False)
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
    if not moved or ref.special:  # anchoring changed nothing: the run above was the end-to-end run; the special
        return  # run judges each element's IEEE kind anchored, its magnitudes are the dtype's largest
    after = evaluate(optimized, feeds, params, seed=ref.seed, return_all=True, visit=followed)
    for k, (new, old) in pairs:
        if not dtype(original.node(old).dtype).is_float:
            continue
        rtol, atol = ref.tolerance(old)
        unjudged = ~(np.isfinite(after[new]) & np.isfinite(before[old]))  # overflow near the largest value
        excused = unjudged if old not in ref.excused else unjudged | ref.excused[old]
        max_abs, ratio = tolerance_ratio(after[new], before[old], lambda o=old: ref.end_to_end_reach(o), excused,
                                         lambda: True)  # the anchored run judged the signs of zeros
        node = optimized.node(new)
        entry = NodeParity(new, node.op, old, ref.seed, max_abs, ratio, rtol, atol, k, end_to_end=True,
                           special=ref.special)
        report.nodes.append(entry)
        if not entry.ok:
            on_the_way = [n for n in moved if n in _ancestors(optimized, new)]
            raise ParityError(
                f"parity failure: {optimized.describe(new)}, output {k}, end to end, differs from original "
                f"{original.describe(old)} on {_run_name(ref)}: max abs error {max_abs:.3g}, {ratio:.3g} x its "
                f"end-to-end tolerance ({END_TO_END_FACTOR:g} x (atol={atol} + rtol={rtol} x the output's largest "
                f"magnitude, plus its rounding error): {ref.precision[old]} precision); differing on the way: "
                f"node(s) {', '.join(map(str, on_the_way))}, built by rule(s): {rules(on_the_way)}")


def computed_from(spec: Any, attrs: Mapping[str, Any], args: Sequence[Any], in_dtypes: Sequence[str],
                  out_type: Any, value: Any, marks: Sequence[np.ndarray | None] | None = None,
                  index: int | None = None) -> np.ndarray | None:
    """The elements of a kernel's ``value`` computed from the ``marks`` elements of its ``args`` (default: their
    :func:`extreme_values`): those that move when the kernel runs again with the marked elements set to 1.0
    (all of them when it then fails).  ``index``: ``value`` is that result of a multi-result kernel (``value``
    the whole tuple).  None when nothing is marked or moves."""
    marks = [extreme_values(a) for a in args] if marks is None else marks
    if all(m is None for m in marks):
        return None
    cleared = [a if m is None else np.where(m, 1.0, a).astype(np.asarray(a).dtype) for a, m in zip(args, marks,
                                                                                                   strict=True)]
    mine = value if index is None else value[index]
    try:
        again = run_node(spec, attrs, cleared, in_dtypes, out_type)
    except (IndexError, ValueError):
        return np.ones(np.shape(mine), bool)
    moved = _differs(mine, again if index is None else again[index])
    return moved if moved.any() else None


def extreme_values(value: Any) -> np.ndarray | None:
    """The elements of a float value that are non-finite or of a magnitude whose square overflows its dtype
    (above the square root of the largest): where a fused kernel may order its operations otherwise and
    overflow, or mask with an infinity, where the original did not (None: none, or not a float value)."""
    value = np.asarray(value)
    if not np.issubdtype(value.dtype, np.floating):
        return None
    with np.errstate(invalid="ignore"):
        mask = ~(np.abs(value) <= math.sqrt(float(np.finfo(value.dtype).max)))
    return mask if mask.any() else None


def _run_name(ref: Reference) -> str:
    return f"seed {ref.seed}" + (f" with IEEE special values (-0.0, +-inf, NaN, subnormals, +-max) in the drawn inputs "
                                 f"(round {ref.special})" if ref.special else "")


def _ancestors(graph: Graph, node_id: int) -> set[int]:
    """``node_id`` and every node it is computed from."""
    seen, todo = set(), [node_id]
    while todo:
        if (n := todo.pop()) not in seen:
            seen.add(n)
            todo.extend(graph.node(n).inputs)
    return seen


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a != b where NaN equals NaN and -0.0 differs from 0.0."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return ~(((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b)))
