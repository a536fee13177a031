"""Symbolic shape values of an ONNX import: integer tensors whose elements are ints or symbolic dims.

When an input's ``dim_param`` is left unbound, its dim is a :class:`~rlx_egraph.ir.dims.Sym` and
``Shape`` gives a *symbolic value*: a numpy array of dtype ``object`` holding Python ints and Syms
(:func:`dims_array`).  The shape computations exporters write on such values (Gather, Slice,
Unsqueeze, Concat, integer arithmetic, comparisons, Where, ...) fold here exactly
(:func:`fold_symbolic`); a result without symbols is a plain int64 (bool, or Cast's type) array again.
Read as a Reshape/Expand target or a Slice bound (:data:`DIM_INPUTS`) a symbolic value becomes symbolic
dim attributes; read as data it becomes a ``DimValues`` node; an op that makes a tensor of symbolic shape
of it (``Range``, ``ConstantOfShape``) makes a form (:mod:`.forms`).  A comparison that is not the same
for every value of the symbols (nor under the given ``max_dims``) is an :class:`OnnxImportError` naming
the node and the symbols and saying to pass ``input_shapes``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from functools import reduce
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from ...ir.dims import Dim, floor_div, symbols_of
from ...ir.registry import ShapeError
from .errors import OnnxImportError
from .forms import is_symbolic
from .values import Value, dim_range

if TYPE_CHECKING:
    from .importer import Importer

# Lowered op -> the input slots it reads as dims (a symbolic value there becomes a symbolic dim attribute).
DIM_INPUTS: dict[str, frozenset[int]] = {"Reshape": frozenset({1}), "Expand": frozenset({1}),
                                         "Slice": frozenset({1, 2, 3, 4})}


def dims_array(dims: Sequence[Dim]) -> np.ndarray:
    """The value of ``Shape`` for ``dims``: int64 when every dim is an int, else a symbolic value."""
    if not symbols_of(dims):
        return np.array(dims, dtype=np.int64)
    out = np.empty(len(dims), dtype=object)
    out[:] = list(dims)
    return out


def _symbols(arrays: Sequence[np.ndarray | None]) -> list[str]:
    return sorted(symbols_of(d for a in arrays if is_symbolic(a) for d in a.reshape(-1)))


def _refuse(imp: Importer, reason: str, symbols: Sequence[str]) -> OnnxImportError:
    """The error for a step that needs ``symbols`` bound; it also names the inputs whose static shapes bind every
    symbol (:func:`_binding`)."""
    named = ", ".join(repr(s) for s in symbols)
    return OnnxImportError(reason, f"pass input_shapes to bind {named}", _binding(imp))


def _binding(imp: Importer) -> dict[str, tuple[str, ...]]:
    """The model inputs whose static shapes bind every symbolic dim (in model order, each input that carries a
    symbol no earlier one does), with their dims as the model writes them: binding only the symbols one step
    needs would let the import fail again at the next."""
    bound: set[str] = set()
    chosen: dict[str, tuple[str, ...]] = {}
    for node in imp.graph.nodes:
        if node.op == "Input" and (carried := symbols_of(node.shape)) - bound:
            chosen[node.attrs["name"]] = tuple(map(str, node.shape))
            bound |= carried
    return chosen


def lowers(imp: Importer, node: onnx.NodeProto) -> bool:
    """Whether a node with known inputs is lowered rather than folded: known data (not symbolic itself) under a
    symbolic target or bound (Expand of a class token to [batch, 1, 64]) is a MIR node of symbolic shape."""
    if node.op_type not in DIM_INPUTS:
        return False
    values = [imp.value(n).array if n else None for n in node.input]
    return not is_symbolic(values[0]) and any(is_symbolic(values[k]) for k in DIM_INPUTS[node.op_type]
                                              if k < len(values))


def refuse_shape_error(imp: Importer, exc: ShapeError) -> OnnxImportError:
    """A ShapeError of a symbolic import (an undecidable comparison or division) as an import error."""
    return _refuse(imp, f"{imp.label}: {exc}", imp.graph.symbols)


def refuse(imp: Importer, reason: str) -> OnnxImportError:
    """An import error whose way out is to bind the symbolic dims (``input_shapes``)."""
    return _refuse(imp, reason, imp.graph.symbols)


# --- folding --------------------------------------------------------------------------------------------------


def _objects(array: np.ndarray) -> np.ndarray:
    """``array`` as dtype object holding Python ints (bools stay bools), Syms kept."""
    return array if is_symbolic(array) else array.astype(object)


def _cells(fn: Callable[..., Any]) -> Callable[..., np.ndarray]:
    """``fn`` applied element by element with numpy broadcasting, as an object array."""
    apply = np.frompyfunc(fn, 2, 1)
    return lambda a, b: np.asarray(apply(a, b), dtype=object)


def _trunc_div(imp: Importer, a: Dim, b: Dim) -> Dim:
    """ONNX integer Div (truncating); a Sym by an int >= 1 is its floor (:func:`~rlx_egraph.ir.dims.floor_div`, the
    same where it is >= 0 for every value), else it divides only exactly (ShapeError otherwise)."""
    if isinstance(a, int) and isinstance(b, int):
        return abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    if isinstance(b, int) and b >= 1 and imp.decide(a, ">=", 0):
        return floor_div(a, b)
    return a // b


def _mod(imp: Importer, a: Dim, b: Dim) -> Dim:
    """ONNX integer Mod (the divisor's sign): of a Sym >= 0 by an int >= 1, ``a - b * floor(a / b)``."""
    if isinstance(b, int) and b >= 1 and not isinstance(a, int) and imp.decide(a, ">=", 0):
        return a - b * floor_div(a, b)
    return a % b


def _extreme(first_wins: str, what: str) -> Callable[[Importer, Dim, Dim], Dim]:
    """Max (``first_wins`` is ``>=``) or Min (``<=``) of two dims, asking in both orders: ``max(1, batch)`` is
    ``batch`` because ``batch >= 1`` holds for every value (``1 >= batch`` does not decide)."""

    def pick(imp: Importer, a: Dim, b: Dim) -> Dim:
        if isinstance(a, int) and isinstance(b, int):
            return max(a, b) if first_wins == ">=" else min(a, b)
        for first, second in ((a, b), (b, a)):
            try:
                if imp.decide(first, first_wins, second):
                    return first
            except ShapeError:
                pass
        raise ShapeError(f"cannot decide {what}({a}, {b}) for every value of {', '.join(sorted(symbols_of((a, b))))}")

    return pick


def _compare(op: str) -> Callable[[Importer, Dim, Dim], bool]:
    """A comparison of two dims for every value of the symbols (else under the given max_dims)."""
    plain = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}[op]
    return lambda imp, a, b: plain(a, b) if isinstance(a, int) and isinstance(b, int) else imp.decide(a, op, b)


def _absolute(imp: Importer, d: Dim) -> Dim:
    """|d|: a symbolic dim of one sign for every value (``abs(-batch)`` is ``batch``)."""
    if isinstance(d, int):
        return abs(d)
    return d if imp.decide(d, ">=", 0) else -d


def _equal(imp: Importer, a: Dim, b: Dim) -> bool:
    """Equal for every value of the symbols: decided when ``a - b`` is 0 or never 0 (else under max_dims)."""
    diff = a - b
    if isinstance(diff, int):
        return not diff
    try:
        return not bool(diff)
    except ShapeError:
        low, high = dim_range(diff, imp.max_dims)
        if low > 0 or high < 0:
            imp.assume(f"{a} != {b}", "the given max_dims")
            return False
        raise


def _ints(imp: Importer, name: str) -> list[int]:
    return [int(v) for v in imp.values[name].array.reshape(-1)]


def _axes(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], since: int) -> list[int] | None:
    """Axes from the attribute before opset ``since``, else from input 1 (None: absent)."""
    if imp.opset < since:
        return list(at["axes"]) if "axes" in at else None
    return _ints(imp, node.input[1]) if len(node.input) > 1 and node.input[1] else None


def _slice(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[np.ndarray]) -> np.ndarray:
    if imp.opset < 10:
        starts, ends, axes, steps = list(at["starts"]), list(at["ends"]), at.get("axes"), None
    else:
        given = [_ints(imp, n) if n else None for n in list(node.input[1:5]) + [""] * (5 - len(node.input))]
        starts, ends, axes, steps = given
    axes = list(range(len(starts))) if axes is None else list(axes)
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * a[0].ndim
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        index[axis] = slice(start, end, step)  # Python's clamping is ONNX's
    return a[0][tuple(index)]


def _unsqueeze(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[np.ndarray]) -> np.ndarray:
    axes = _axes(imp, node, at, 13) or []
    rank = a[0].ndim + len(axes)
    return np.expand_dims(a[0], tuple(sorted(ax % rank for ax in axes)))


def _squeeze(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[np.ndarray]) -> np.ndarray:
    axes = _axes(imp, node, at, 13)
    return np.squeeze(a[0], axis=None if not axes else tuple(ax % a[0].ndim for ax in axes))


def _reshape(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[np.ndarray]) -> np.ndarray:
    target = _ints(imp, node.input[1])
    if not at.get("allowzero", 0):
        target = [a[0].shape[k] if d == 0 else d for k, d in enumerate(target)]
    return a[0].reshape(target)


def _expand(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[np.ndarray]) -> np.ndarray:
    shape = np.broadcast_shapes(a[0].shape, tuple(_ints(imp, node.input[1])))
    return np.broadcast_to(a[0], shape).copy()


def _reduce(fn: Callable[..., np.ndarray], since: int) -> Callable[..., np.ndarray]:
    def fold(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[np.ndarray]) -> np.ndarray:
        axes = _axes(imp, node, at, since)
        if not axes and at.get("noop_with_empty_axes", 0):
            return a[0]
        return fn(a[0], axis=None if not axes else tuple(axes), keepdims=bool(at.get("keepdims", 1)))

    return fold


def _cast(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[np.ndarray]) -> np.ndarray | None:
    """Cast to an int type keeps the dims; to another type they are data (None: not folded here)."""
    return a[0] if helper.tensor_dtype_to_np_dtype(at["to"]).kind in "iu" else None


def _shape_of(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[np.ndarray]) -> np.ndarray:
    shape = a[0].shape
    return np.array(shape[slice(at.get("start", 0), at.get("end"))], dtype=np.int64)


Fold = Callable[["Importer", onnx.NodeProto, dict[str, Any], list[np.ndarray]], np.ndarray | None]


def _binary(fn: Callable[[Any, Any], Any]) -> Fold:
    cells = _cells(fn)
    return lambda imp, node, at, a: reduce(cells, a)


def _decided(fn: Callable[[Importer, Any, Any], Any]) -> Fold:
    """A binary fold whose cells decide on dims (comparisons, Max, Min): they may use the import's max_dims."""
    return lambda imp, node, at, a: reduce(_cells(lambda x, y: fn(imp, x, y)), a)


# op type -> (fold, the input slots that may be symbolic; the others must be static)
FOLDS: dict[str, tuple[Fold, frozenset[int] | None]] = {
    "Identity": (lambda imp, node, at, a: a[0], frozenset({0})),
    "Gather": (lambda imp, node, at, a: np.take(a[0], a[1].astype(np.int64), axis=at.get("axis", 0)),
               frozenset({0})),
    "Slice": (_slice, frozenset({0})),
    "Concat": (lambda imp, node, at, a: np.concatenate(a, axis=at["axis"]), None),
    "Unsqueeze": (_unsqueeze, frozenset({0})),
    "Squeeze": (_squeeze, frozenset({0})),
    "Reshape": (_reshape, frozenset({0})),
    "Expand": (_expand, frozenset({0})),
    "Cast": (_cast, frozenset({0})),
    "Shape": (_shape_of, frozenset({0})),
    "Size": (lambda imp, node, at, a: np.array(a[0].size, dtype=np.int64), frozenset({0})),
    "ReduceProd": (_reduce(lambda x, **kw: np.prod(x, initial=1, **kw), 18), frozenset({0})),
    "ReduceSum": (_reduce(lambda x, **kw: np.sum(x, initial=0, **kw), 13), frozenset({0})),
    "Add": (_binary(operator.add), None),
    "Sub": (_binary(operator.sub), None),
    "Mul": (_binary(operator.mul), None),
    "Div": (_decided(_trunc_div), None),
    "Mod": (_decided(_mod), None),
    "Max": (_decided(_extreme(">=", "max")), None),
    "Min": (_decided(_extreme("<=", "min")), None),
    "Neg": (lambda imp, node, at, a: -a[0], None),
    "Abs": (lambda imp, node, at, a: np.frompyfunc(lambda d: _absolute(imp, d), 1, 1)(a[0]), None),
    "Equal": (_decided(_equal), None),
    "Less": (_decided(_compare("<")), None),
    "LessOrEqual": (_decided(_compare("<=")), None),
    "Greater": (_decided(_compare(">")), None),
    "GreaterOrEqual": (_decided(_compare(">=")), None),
    "Where": (lambda imp, node, at, a: np.where(a[0].astype(bool), a[1], a[2]), frozenset({1, 2})),
}
_BOOL_RESULT = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})


def fold_symbolic(imp: Importer, node: onnx.NodeProto, ins: list[str],
                  at: dict[str, Any]) -> list[Value | None] | None:
    """Fold ``node``, whose inputs are known and some symbolic, exactly; None where it has no exact fold here (a
    symbolic value in a slot read as data: the importer makes a form or a runtime node of it); OnnxImportError
    for a decision that depends on the symbols' values."""
    arrays = [imp.values[n].array if n else None for n in ins]
    symbols = _symbols(arrays)
    fold, symbolic_slots = FOLDS.get(node.op_type, (None, frozenset()))
    if fold is None or any(is_symbolic(array) and symbolic_slots is not None and slot not in symbolic_slots
                           for slot, array in enumerate(arrays)):
        return None
    operands = [_objects(a) if a is not None and (symbolic_slots is None or k in symbolic_slots) else a
                for k, a in enumerate(arrays)]
    try:
        result = fold(imp, node, at, [a for a in operands if a is not None])
    except (ShapeError, ZeroDivisionError) as exc:
        raise _refuse(imp, f"{imp.label}: {exc}", symbols) from None
    if result is None:
        return None
    result = np.asarray(result, dtype=object)
    if is_symbolic(result) and not symbols_of(result.reshape(-1)):
        kind = np.bool_ if node.op_type in _BOOL_RESULT else (
            helper.tensor_dtype_to_np_dtype(at["to"]) if node.op_type == "Cast" else np.int64)
        result = result.astype(kind)
    return [Value(array=result), *[None] * (len(node.output) - 1)]


__all__ = ["DIM_INPUTS", "FOLDS", "dims_array", "fold_symbolic", "is_symbolic", "lowers", "refuse",
           "refuse_shape_error"]
