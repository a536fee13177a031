"""Folding ONNX nodes over forms (:mod:`.forms`): the table :data:`FORM_FOLDS`, op type -> fold.

A fold runs for a node none of whose inputs is a runtime value and at least one a form (or a symbolic value
where the symbolic folds of :mod:`.symbolic` have no exact rule, as ``Range`` over a symbol).  Its inputs are
forms and known arrays (plain or symbolic); it returns one form or array per output, or None when the result
is not a form: the importer then materializes the forms and lowers the node as a runtime one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...ir.dims import Dim, Sym
from ...ir.shapes import broadcast
from .forms import Affine, Filled, Form, Mask, Select, Stacked, from_array, single, unit_moves
from .symbolic import dims_array, is_symbolic

if TYPE_CHECKING:
    from .importer import Importer

Operand = np.ndarray | Form | None
Result = list[np.ndarray | Form | None] | None
FormFold = Callable[["Importer", onnx.NodeProto, dict[str, Any], list[Operand]], Result]


def shape_of(x: Operand) -> tuple[Dim, ...]:
    return x.shape if isinstance(x, Form) else tuple(x.shape)


def as_affine(x: Operand) -> Affine | None:
    """An int operand as an affine form: a form, or a known int array (a symbolic one of one element)."""
    if isinstance(x, Affine):
        return x
    if isinstance(x, Filled) and x.value.dtype.kind in "iu":
        return Affine(x.shape, (0,) * len(x.shape), int(x.value), x.value.dtype)
    if isinstance(x, np.ndarray):
        one = single(x)
        if isinstance(one, Sym) or (one is not None and x.dtype.kind in "iu"):
            return Affine(tuple(x.shape), (0,) * x.ndim, one)
        form = from_array(x) if x.dtype.kind in "iu" else None
        return form if isinstance(form, Affine) else None
    return None


def _scalar_value(x: Operand) -> np.ndarray | None:
    """The one value of a single-valued operand (a Filled form or a known numeric array of one repeated value)."""
    if isinstance(x, Filled):
        return x.value
    if isinstance(x, np.ndarray) and x.dtype != object and x.size:
        flat = x.reshape(-1)
        if np.all(flat == flat[0]) or (x.dtype.kind == "f" and np.all(np.isnan(flat))):
            return flat[:1].reshape(())
    return None


def _ints(x: Operand) -> list[Dim] | None:
    """A known 1-D (or 0-d) array of dims."""
    if not isinstance(x, np.ndarray):
        return None
    return [d if isinstance(d, Sym) else int(d) for d in x.reshape(-1)]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


# --- shape ops ---------------------------------------------------------------------------------------------------


def _range(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    start, limit, delta = (single(x) if isinstance(x, np.ndarray) else None for x in a)
    if start is None or limit is None or delta not in (1, -1) \
            or not all(isinstance(v, int | Sym) for v in (start, limit)):
        return None
    length = (limit - start) * delta
    kind = a[0].dtype if a[0].dtype != object else np.dtype(np.int64)
    if imp.decide(length, "<=", 0):
        return [np.zeros(0, kind)]
    return [Affine((length,), (delta,), start, kind)]


def _constant_of_shape(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    shape = _ints(a[0])
    if shape is None:
        return None
    value = numpy_helper.to_array(at["value"]).reshape(()) if "value" in at else np.zeros((), np.float32)
    return [Filled(tuple(shape), value.copy())]


def _expand(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    target = _ints(a[1])
    if target is None:
        return None
    shape = broadcast(shape_of(a[0]), tuple(target))
    if isinstance(a[0], Form):
        return [a[0].expand(shape)]
    value = _scalar_value(a[0])
    return [Filled(shape, value.copy())] if value is not None else None


def _reshaped(x: Form, shape: Sequence[Dim]) -> Result:
    perm = unit_moves(x.shape, tuple(shape))
    return [x.axes(perm, tuple(shape))] if perm is not None and not isinstance(x, Stacked) else None


def _unsqueeze(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    axes = list(at["axes"]) if imp.opset < 13 else _ints(a[1]) if len(a) > 1 else None
    if not isinstance(a[0], Form) or axes is None:
        return None
    shape = list(a[0].shape)
    for axis in sorted(_axis(int(k), len(shape) + len(axes)) for k in axes):
        shape.insert(axis, 1)
    return _reshaped(a[0], shape)


def _squeeze(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    axes = list(at.get("axes", [])) if imp.opset < 13 else (_ints(a[1]) if len(a) > 1 and a[1] is not None else [])
    if not isinstance(a[0], Form) or axes is None:
        return None
    rank = len(a[0].shape)
    drop = {_axis(int(k), rank) for k in axes} if axes else {k for k, d in enumerate(a[0].shape) if d == 1}
    return _reshaped(a[0], [d for k, d in enumerate(a[0].shape) if k not in drop])


def _reshape(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    target = _ints(a[1])
    if not isinstance(a[0], Form) or target is None:
        return None
    src = a[0].shape
    if not at.get("allowzero", 0):
        target = [src[k] if isinstance(d, int) and d == 0 else d for k, d in enumerate(target)]
    if -1 in target:
        known = math.prod(d for d in target if not (isinstance(d, int) and d == -1))
        target = [math.prod(src) // known if isinstance(d, int) and d == -1 else d for d in target]
    return _reshaped(a[0], target)


def _transpose(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    if not isinstance(a[0], Form) or isinstance(a[0], Stacked):
        return None
    rank = len(a[0].shape)
    perm = list(at.get("perm", range(rank - 1, -1, -1)))
    return [a[0].axes(perm, tuple(a[0].shape[p] for p in perm))]


def _slice(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    x = a[0]
    if isinstance(x, np.ndarray) and not is_symbolic(x):
        x = from_array(x)  # a known table sliced with symbolic bounds
    if not isinstance(x, Form):
        return None
    if imp.opset < 10:
        starts, ends, axes, steps = list(at["starts"]), list(at["ends"]), at.get("axes"), None
    else:
        starts, ends = _ints(a[1]), _ints(a[2])
        axes = _ints(a[3]) if len(a) > 3 and a[3] is not None else None
        steps = _ints(a[4]) if len(a) > 4 and a[4] is not None else None
        if starts is None or ends is None:
            return None
    rank = len(x.shape)
    axes = list(range(len(starts))) if axes is None else [_axis(int(k), rank) for k in axes]
    if steps is not None and any(s != 1 for s in steps):
        return None
    for axis, start, end in zip(axes, starts, ends, strict=True):
        begin, stop = imp.slice_bounds(x.shape[axis], start, end)
        x = x.shift(axis, begin, stop - begin)
    return [x]


def _gather_same(node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    """A gather (Gather, GatherElements) from a known array holding one repeated value, by indices of symbolic
    shape: that value at the result's shape, whatever the (in-range) indices (BERT's token-type buffer of zeros
    gathered at the positions)."""
    x, index = a
    value = _scalar_value(x) if isinstance(x, np.ndarray) else None
    if value is None or not isinstance(index, Form):
        return None
    if node.op_type == "GatherElements":
        return [Filled(index.shape, value.copy())]
    axis = _axis(at.get("axis", 0), x.ndim)
    return [Filled((*x.shape[:axis], *index.shape, *x.shape[axis + 1:]), value.copy())]


def _gather(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    x, index = a
    if not isinstance(x, Form):
        return _gather_same(node, at, a)
    if node.op_type != "Gather" or isinstance(x, Stacked) or not isinstance(index, np.ndarray) or is_symbolic(index):
        return None
    axis = _axis(at.get("axis", 0), len(x.shape))
    if index.ndim != 0:
        flat = index.reshape(-1)
        if index.ndim != 1 or not flat.size or not np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)):
            return None
        begin, stop = imp.slice_bounds(x.shape[axis], int(flat[0]), int(flat[0]) + flat.size)
        return [x.shift(axis, begin, stop - begin)]
    begin, _ = imp.slice_bounds(x.shape[axis], int(index), int(index) + 1 if int(index) != -1 else 2**62)
    taken = x.shift(axis, begin, 1)
    perm = [k for k in range(len(x.shape)) if k != axis]
    return [taken.axes(perm, tuple(taken.shape[k] for k in perm))]


def _concat(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    """Affine values each of size 1 on the last axis, concatenated there: GatherND's index tuples."""
    parts = [as_affine(x) for x in a if x is not None]
    if not parts or any(p is None for p in parts) or not any(isinstance(x, Form) for x in a):
        return None
    rank = len(parts[0].shape)
    if _axis(at["axis"], rank) != rank - 1 or any(len(p.shape) != rank or p.shape[-1] != 1 for p in parts):
        return None
    shape = broadcast(*(p.shape[:-1] for p in parts))
    squeezed = [p.axes(list(range(rank - 1)), p.shape[:-1]).expand(shape) for p in parts]
    return [Stacked((*shape, len(squeezed)), tuple(squeezed))]  # type: ignore[arg-type]


def _shape(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    shape = shape_of(a[0])
    rank = len(shape)
    start = min(max(_axis(at.get("start", 0), rank), 0), rank)
    end = min(max(_axis(at.get("end", rank), rank), 0), rank) if "end" in at else rank
    return [dims_array(shape[start:end])]


def _size(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    return [dims_array([math.prod(shape_of(a[0]))]).reshape(())]


# --- values ------------------------------------------------------------------------------------------------------


def _arith(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    """Add, Sub, Mul and Neg of affine values (a product needs one side single-valued); else elementwise."""
    forms = [as_affine(x) for x in a]
    if all(f is not None for f in forms) and any(isinstance(x, Affine) for x in a):
        if node.op_type == "Neg":
            return [forms[0].times(-1)]
        left, right = forms
        if node.op_type in ("Add", "Sub"):
            return [left.plus(right, 1 if node.op_type == "Add" else -1)]
        for affine, other in ((left, right), (right, left)):
            if all(c == 0 for c in other.coefs):
                shape = broadcast(affine.shape, other.shape)
                return [affine.times(other.offset).expand(shape)]
        return None
    return _elementwise(imp, node, at, a)


def _compare(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    """Comparisons of affine values: a mask (sum(coefs * i) <= bound)."""
    left, right = (as_affine(x) for x in a)
    if left is None or right is None or not any(isinstance(x, Affine) for x in a):
        return _elementwise(imp, node, at, a)
    if node.op_type in ("Greater", "GreaterOrEqual"):
        left, right = right, left
    diff = left.plus(right, -1)  # left - right <= 0, or < 0 (ints: <= -1)
    strict = node.op_type in ("Less", "Greater")
    return [Mask(diff.shape, diff.coefs, -diff.offset - (1 if strict else 0))]


def _not(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    return [a[0].negate()] if isinstance(a[0], Mask) else _elementwise(imp, node, at, a)


def _and_or(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    """And/Or with a constant side: the other operand (broadcast), or the constant."""
    for k in (0, 1):
        value = _scalar_value(a[k])
        other = a[1 - k]
        if value is not None and isinstance(other, Form):
            shape = broadcast(shape_of(a[0]), shape_of(a[1]))
            keeps = bool(value) == (node.op_type == "And")
            return [other.expand(shape) if keeps else Filled(shape, value.astype(np.bool_).copy())]
    return _elementwise(imp, node, at, a)


def _where(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    cond, x, y = a
    values = [_scalar_value(v) for v in (x, y)]
    if not isinstance(cond, Mask) or any(v is None for v in values) or values[0].dtype != values[1].dtype:
        return _elementwise(imp, node, at, a)
    shape = broadcast(cond.shape, shape_of(x), shape_of(y))
    mask = cond.expand(shape)
    assert isinstance(mask, Mask)
    return [Select(shape, mask, values[0].copy(), values[1].copy())]


def _trilu(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    """Trilu of a filled value: a Select on the diagonal mask (upper keeps j - i >= k, lower j - i <= k)."""
    value = _scalar_value(a[0])
    k = single(a[1]) if len(a) > 1 and isinstance(a[1], np.ndarray) else 0 if len(a) < 2 or a[1] is None else None
    shape = shape_of(a[0])
    if value is None or k is None or len(shape) < 2 or not isinstance(a[0], Form):
        return None
    rows, cols = shape[-2:]
    row, col = (1 if rows != 1 else 0), (1 if cols != 1 else 0)
    lead = (0,) * (len(shape) - 2)
    # upper keeps i - j <= -k, lower j - i <= k
    mask = Mask(shape, (*lead, row, -col), -k) if at.get("upper", 1) else Mask(shape, (*lead, -row, col), k)
    if value.dtype == np.bool_ and bool(value):
        return [mask]
    return [Select(shape, mask, value.copy(), np.zeros((), value.dtype))]


def _cast(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    kind = np.dtype(helper.tensor_dtype_to_np_dtype(at["to"])) if node.op_type == "Cast" else shape_dtype(a[1])
    x = a[0]
    if isinstance(x, Mask):
        return [x] if kind == np.bool_ else [Select(x.shape, x, np.ones((), kind), np.zeros((), kind))]
    if isinstance(x, Affine) and kind.kind in "iu":
        return [Affine(x.shape, x.coefs, x.offset, kind)]
    return _elementwise(imp, node, at, [x])


def shape_dtype(x: Operand) -> np.dtype:
    return x.dtype if isinstance(x, Form) else np.dtype(x.dtype)


def _elementwise(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    """An elementwise op whose operands are single-valued but for at most one Select: the op run on the single
    values (by onnx's reference evaluator: its exact semantics), once per branch of the Select."""
    present = [x for x in a if x is not None]
    if node.op_type not in ELEMENTWISE or not any(isinstance(x, Form) for x in present):
        return None
    selects = [x for x in present if isinstance(x, Select)]
    if len(selects) > 1 or any(_scalar_value(x) is None for x in present if not isinstance(x, Select)):
        return None
    shape = broadcast(*(shape_of(x) for x in present))

    def run(branch: int) -> np.ndarray:
        arrays = {n: (x.a if branch == 0 else x.b) if isinstance(x, Select) else _scalar_value(x)
                  for n, x in zip(node.input, a, strict=False) if n and x is not None}
        return np.asarray(imp.evaluate(node, arrays)[0]).reshape(())

    if not selects:
        return [Filled(shape, run(0))]
    mask = selects[0].mask.expand(shape)
    assert isinstance(mask, Mask)
    return [Select(shape, mask, run(0), run(1))]


ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Sigmoid", "Tanh",
    "Erf", "Relu", "Cast", "CastLike", "Not", "And", "Or", "Xor", "Equal", "Less", "LessOrEqual", "Greater",
    "GreaterOrEqual", "Where", "Min", "Max", "Sum", "Mean", "Floor", "Ceil", "Round", "Sign", "IsNaN", "IsInf",
    "Sin", "Cos", "Softplus", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Identity"})

FORM_FOLDS: dict[str, FormFold] = {
    "Identity": lambda imp, node, at, a: [a[0]],
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Slice": _slice,
    "Gather": _gather,
    "GatherElements": _gather,
    "Concat": _concat,
    "Shape": _shape,
    "Size": _size,
    "Add": _arith,
    "Sub": _arith,
    "Mul": _arith,
    "Neg": _arith,
    "Less": _compare,
    "LessOrEqual": _compare,
    "Greater": _compare,
    "GreaterOrEqual": _compare,
    "Not": _not,
    "And": _and_or,
    "Or": _and_or,
    "Where": _where,
    "Trilu": _trilu,
    "Cast": _cast,
    "CastLike": _cast,
}


def fold_forms(imp: Importer, node: onnx.NodeProto, at: dict[str, Any], a: list[Operand]) -> Result:
    """The outputs of ``node`` as forms or arrays, or None when they are not forms (see the module doc)."""
    fold = FORM_FOLDS.get(node.op_type, _elementwise if node.op_type in ELEMENTWISE else None)
    if fold is None:
        return None
    out = fold(imp, node, at, a)
    if out is None:
        return None
    return [_empty_as_array(_settled(x)) for x in out] + [None] * (len(node.output) - len(out))


def _settled(x: np.ndarray | Form | None) -> np.ndarray | Form | None:
    """A mask that holds everywhere or nowhere (``kv_idx >= 0``, which transformers ANDs into a padding mask) as
    that one value, and a Select on it as the branch it picks: the forms a constant operand simplifies."""
    mask = x.mask if isinstance(x, Select) else x
    held = mask.settled() if isinstance(mask, Mask) else None
    if held is None:
        return x
    if isinstance(x, Select):
        return Filled(x.shape, (x.a if held else x.b).copy())
    return Filled(x.shape, np.array(held))


def _empty_as_array(x: np.ndarray | Form | None) -> np.ndarray | Form | None:
    """A form with a static 0 dim is an empty array (it holds no value)."""
    if isinstance(x, Form) and any(isinstance(d, int) and d == 0 for d in x.shape):
        return np.zeros(tuple(int(d) if isinstance(d, int) else 0 for d in x.shape), x.dtype)
    return x


__all__ = ["ELEMENTWISE", "FORM_FOLDS", "as_affine", "fold_forms"]
