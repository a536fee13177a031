"""The import table: ONNX op type -> lowering into MIR ops.

A lowering ``(importer, node, attrs) -> outputs`` runs for a node with at least
one runtime input and returns one :class:`Value` (or None) per ONNX output.
None, for the whole node or for a used output, means "MIR has no equivalent
here": the importer keeps that output as an OnnxOp node.  Inputs that must be
known (shapes, axes, indices) make the lowering return None when they are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from ...ir.dims import Dim, as_dim, symbols_of
from ...ir.dtypes import dtype
from ...ir.ops.onnx_op import MIR_DTYPES, encode_proto
from ...ir.registry import ShapeError, TensorType
from ...ir.shapes import broadcast
from .forms import Affine, Filled, Form, Mask, Select, Stacked, from_array, is_symbolic
from .symbolic import dims_array
from .values import Value

if TYPE_CHECKING:
    from .importer import Importer

Lowering = Callable[["Importer", onnx.NodeProto, dict[str, Any]], list[Value | None] | None]
Outputs = list[Value | None] | None


def _out(nid: int) -> list[Value | None]:
    return [Value(node=nid)]


def _alias(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    return [imp.value(node.input[0])]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def elementwise(op: str) -> Lowering:
    """A broadcasting elementwise op (Add, Where, Equal, ...); variadic Min/Max/Sum fold left."""

    def lower(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
        names = list(node.input)
        shape = broadcast(*(imp.type(n).shape for n in names))
        groups = [names] if op == "Where" or len(names) <= 2 else [names[:2], *([n] for n in names[2:])]
        acc: int | None = None
        for group in groups:
            operands = ([acc] if acc is not None else []) + [None] * len(group)
            shapes = [imp.graph.node(acc).shape] if acc is not None else []
            for k, name in enumerate(group):
                others = shapes + [imp.type(n).shape for j, n in enumerate(group) if j != k]
                operands[len(operands) - len(group) + k] = imp.operand(name, others)
            if op == "Pow":  # the exponent may have another dtype: MIR wants the base's
                base, exp = (imp.graph.node(i) for i in operands)
                if exp.dtype != base.dtype:
                    operands[1] = imp.graph.scalar(exp.attrs["value"], base.dtype) if exp.op == "Scalar" \
                        else imp.graph.cast(exp.id, dtype=base.dtype)
            acc = imp.graph.add_node(op, operands)
        return _out(imp.fit(acc, shape))

    return lower


def _add(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """Add, except that x + an additive causal mask (0 where query i sees key j, one fill <= -1e4 elsewhere; a
    known array or a form of any size) is Where(causal keep mask, x, fill), the one form recognition rules know:
    x + fill is fill, a -inf fill becomes the dtype's lowest finite value (which a Softmax turns into the same 0:
    a causal row always keeps its diagonal).  And Where(causal keep mask, x, fill) + m, m a mask that is nowhere
    positive and the fill <= :data:`MASKED` (GPT-Neo: the causal Where on the scores, then the padding mask added),
    is x + (Where(keep, 0, fill) + m), x plus one additive mask, the form the attention rules take as a bias: the
    same sum wherever the keep mask holds, and fill + m (<= fill) elsewhere, which absorbs x as :func:`_where`'s
    masks do."""
    for mask_name, x_name in ((node.input[1], node.input[0]), (node.input[0], node.input[1])):
        found = additive_causal(imp, mask_name)
        x = imp.type(x_name)
        if found is None or not imp.value(x_name).runtime or broadcast(x.shape, found[0].shape) != x.shape:
            continue
        keep, fill = found
        fill_value = imp.graph.scalar(max(fill, float(np.finfo(dtype(x.dtype).storage).min)), x.dtype)
        mask = imp.form_operand(keep, [x.shape], f"{mask_name}\0keep")
        return _out(imp.graph.add_node("Where", [mask, imp.tensor(x_name), fill_value]))
    for where_name, mask_name in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
        masked = _causally_masked(imp, where_name)
        if masked is None or not imp.value(mask_name).runtime or not _nowhere_positive(imp, imp.tensor(mask_name)):
            continue
        x, keep, fill = masked
        g = imp.graph
        causal = g.add_node("Where", [keep, g.scalar(0.0, g.node(x).dtype), fill])
        shape = broadcast(imp.type(node.input[0]).shape, imp.type(node.input[1]).shape)
        return _out(imp.fit(g.add_node("Add", [x, g.add_node("Add", [causal, imp.tensor(mask_name)])]), shape))
    return elementwise("Add")(imp, node, at)


def _causally_masked(imp: Importer, name: str) -> tuple[int, int, int] | None:
    """(x, keep, fill) of ``name`` when it is a run-time Where(causal keep mask, x, fill) with a Scalar fill <=
    :data:`MASKED` (as :func:`_add` lowers an additive causal mask of such a fill), else None."""
    value = imp.value(name)
    if not value.runtime:
        return None
    g = imp.graph
    where = g.node(value.node)
    if where.op != "Where" or g.node(where.inputs[0]).op != "CausalMask":
        return None
    fill = g.node(where.inputs[2])
    if fill.op != "Scalar" or fill.attrs["value"] > MASKED:
        return None
    return where.inputs[1], where.inputs[0], where.inputs[2]


def _nowhere_positive(imp: Importer, nid: int) -> bool:
    """Whether MIR node ``nid`` is <= 0 (or NaN) everywhere by its form: a Scalar or Constant, a Where of such
    branches, or a sum of such terms (as padding masks are built)."""
    node = imp.graph.node(nid)
    if node.op == "Scalar":
        return not node.attrs["value"] > 0
    if node.op == "Constant":
        return not np.any(np.asarray(node.attrs["value"]) > 0)
    if node.op == "Where":
        return all(_nowhere_positive(imp, i) for i in node.inputs[1:])
    if node.op == "Add":
        return all(_nowhere_positive(imp, i) for i in node.inputs)
    return False


def _mask_constant(imp: Importer, mask: Mask) -> bool | None:
    """True (False) when ``mask`` (``sum(coefs * i) <= bound``) holds at every (no) index for every value of the
    symbols, by the sum's largest (least) value over the axes; None otherwise (or when it cannot be decided)."""
    if not all(isinstance(c, int) for c in mask.coefs):
        return None
    high = sum(c * (n - 1) for c, n in zip(mask.coefs, mask.shape, strict=True) if c > 0)
    low = sum(c * (n - 1) for c, n in zip(mask.coefs, mask.shape, strict=True) if c < 0)
    try:
        if imp.decide(high, "<=", mask.bound, model_limit=False):
            return True
        if imp.decide(low, ">", mask.bound, model_limit=False):
            return False
    except ShapeError:
        pass
    return None


def _causal(keep: np.ndarray) -> bool:
    form = from_array(keep)
    return isinstance(form, Mask) and form.is_causal()


MASKED = -1e36  # a fill this low absorbs any score added to it in f32 and f64


def _where(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """Where, except for a known bool condition: all true (all false) picks its first (second) branch, a run-time
    value, broadcast to the result's shape (a mask buffer cut to a decoding step's one query row where every key is
    in the window).  A bool condition that is not a causal keep mask (known, or computed at run time) choosing
    between a run-time value and a fill <= :data:`MASKED` (``Where(keep, x, fill)``, or masked_fill's
    ``Where(drop, fill, x)``) is the value plus the additive mask (0 where kept, the fill elsewhere: GPT-Neo's
    local attention window, MPT's and BLOOM's masks beside their ALiBi bias), the form the attention rules take as
    a bias.  The sum is the fill wherever the fill is taken (a value of magnitude below 1e30 vanishes
    against it)."""
    keep, cond = imp.known(node.input[0]), imp.value(node.input[0])
    shape = broadcast(*(imp.type(n).shape for n in node.input))
    constant = _mask_constant(imp, cond.form) if isinstance(cond.form, Mask) else None
    if keep is not None and keep.size and keep.dtype == np.bool_ and (keep.all() or not keep.any()):
        constant = bool(keep.all())
    if constant is not None:
        chosen = node.input[1] if constant else node.input[2]
        if imp.value(chosen).runtime:
            return _out(imp.fit(imp.tensor(chosen), shape))
    for kept, value in ((True, 1), (False, 2)):  # Where(keep, x, fill), or masked_fill's Where(drop, fill, x)
        fill, x = imp.known(node.input[3 - value]), imp.type(node.input[value])
        if (fill is None or fill.size != 1 or not imp.value(node.input[value]).runtime
                or x.dtype not in ("f32", "f64") or float(fill.reshape(-1)[0]) > MASKED
                or imp.type(node.input[0]).dtype != "bool"):
            continue
        fill_value = fill.reshape(-1)[0].item()
        branches = (0.0, fill_value) if kept else (fill_value, 0.0)
        if keep is not None and keep.size and not (kept and _causal(keep)):
            bias = imp.graph.add_node("Constant", value=np.where(keep, *branches).astype(dtype(x.dtype).storage),
                                      dtype=x.dtype)
        elif cond.runtime and imp.graph.node(cond.node).op != "CausalMask":
            bias = imp.graph.add_node("Where", [cond.node, *(imp.graph.scalar(b, x.dtype) for b in branches)])
        else:
            continue
        return _out(imp.fit(imp.graph.add_node("Add", [imp.tensor(node.input[value]), bias]), shape))
    return elementwise("Where")(imp, node, at)


def additive_causal(imp: Importer, name: str) -> tuple[Mask, float] | None:
    """The causal keep mask and fill of an additive causal mask (a known float array or a Select form), else None."""
    form, array = imp.form(name), imp.known(name)
    if isinstance(form, Select) and form.dtype.kind == "f":
        for mask, keep, fill in ((form.mask, form.a, form.b), (form.mask.negate(), form.b, form.a)):
            if float(keep) == 0.0 and float(fill) <= -1e4 and mask.is_causal():
                return mask, float(fill)
        return None
    if array is None or array.dtype.kind != "f" or array.ndim < 2:
        return None
    keep = from_array(array == 0)
    if not isinstance(keep, Mask) or not keep.is_causal():
        return None
    above = array[array != 0]
    if not above.size or not np.all(above == above[0]) or not above[0] <= -1e4:
        return None
    return keep, float(above[0])


def unary(op: str) -> Lowering:
    def lower(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
        return _out(imp.graph.add_node(op, [imp.tensor(node.input[0])]))

    return lower


def _gelu(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    return _out(imp.graph.gelu(imp.tensor(node.input[0]), approximate=at.get("approximate", "none")))


def _softmax(op: str) -> Lowering:
    def lower(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
        x = imp.type(node.input[0])
        axis = _axis(at.get("axis", -1 if imp.opset >= 13 else 1), x.rank)
        if imp.opset < 13 and axis != x.rank - 1:
            return None  # the old definition flattens from axis into one row: no MIR equivalent
        return _out(imp.graph.add_node(op, [imp.tensor(node.input[0])], axis=axis))

    return lower


def _reduce(op: str, axes_input_since: int) -> Lowering:
    def lower(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
        x = imp.type(node.input[0])
        if imp.opset >= axes_input_since:
            given = imp.known(node.input[1]) if len(node.input) > 1 and node.input[1] else None
            if len(node.input) > 1 and node.input[1] and given is None:
                return None
            axes = [] if given is None else [int(a) for a in given.reshape(-1)]
        else:
            axes = list(at.get("axes", []))
        if not axes:
            if at.get("noop_with_empty_axes", 0):
                return [imp.value(node.input[0])]
            axes = list(range(x.rank))
        return _out(imp.graph.add_node(op, [imp.tensor(node.input[0])], axes=axes,
                                       keepdims=bool(at.get("keepdims", 1))))

    return lower


def _layer_norm(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    x = imp.type(node.input[0])
    axis = _axis(at.get("axis", -1), x.rank)
    normalized = x.shape[axis:]
    if imp.type(node.input[1]).shape != normalized:
        return None
    if len(node.input) > 2 and node.input[2]:
        if imp.type(node.input[2]).shape != normalized:
            return None
        beta = imp.tensor(node.input[2])
    else:
        beta = imp.graph.add_node("Constant", value=np.zeros(normalized, dtype(x.dtype).storage), dtype=x.dtype)
    out = imp.graph.layer_norm(imp.tensor(node.input[0]), imp.tensor(node.input[1]), beta, axis=axis,
                               eps=at.get("epsilon", 1e-5))
    return [Value(node=out)]


def _matmul(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """numpy's matmul: a 1-D operand gains a unit dim that the result drops again."""
    a, b = (imp.type(n) for n in node.input)
    if a.rank == 1 and b.rank == 1:
        return None  # a dot product: a rank-0 result
    g = imp.graph
    x, w = imp.tensor(node.input[0]), imp.tensor(node.input[1])
    x = g.reshape(x, shape=(1, a.shape[0])) if a.rank == 1 else x
    w = g.reshape(w, shape=(b.shape[0], 1)) if b.rank == 1 else w
    out = g.matmul(x, w)
    shape = g.node(out).shape
    shape = shape[:-2] + (shape[-2:-1] if a.rank > 1 else ()) + (shape[-1:] if b.rank > 1 else ())
    return _out(imp.fit(out, shape))


def _gemm(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    g = imp.graph
    a, b = imp.tensor(node.input[0]), imp.tensor(node.input[1])
    trans_a, trans_b = at.get("transA", 0), at.get("transB", 0)
    if trans_a and trans_b:
        out = g.matmul_at(a, g.transpose(b, perm=(1, 0)))
    elif trans_a:
        out = g.matmul_at(a, b)
    elif trans_b:
        out = g.matmul_bt(a, b)
    else:
        out = g.matmul(a, b)
    dt = g.node(out).dtype
    if at.get("alpha", 1.0) != 1.0:
        out = g.mul(out, g.scalar(at["alpha"], dt))
    if len(node.input) > 2 and node.input[2]:
        shape = g.node(out).shape
        c = imp.operand(node.input[2], [shape])
        if at.get("beta", 1.0) != 1.0:
            c = g.mul(c, g.scalar(at["beta"], dt))
        out = imp.fit(g.add(out, c), shape)
    return _out(out)


def _view(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """A gather (Gather, GatherND, GatherElements) with known indices that reads the data in order, each element
    possibly repeated along some axes, is a Reshape then an Expand (transformers' padding-mask index gathers).
    With indices that are forms (built from Range over symbolic dims), :func:`_form_view`.  None when the indices
    are not known or read otherwise."""
    forms = [imp.form(n) for n in node.input[1:]]
    if any(f is not None for f in forms):
        return _form_view(imp, node, at, forms[0])
    data = imp.type(node.input[0])
    arrays = {n: imp.known(n) for n in node.input[1:]}
    if not data.shape or any(a is None for a in arrays.values()) or symbols_of(data.shape):
        return None
    order = np.arange(math.prod(data.shape), dtype=np.int64).reshape(data.shape)
    positions = np.asarray(imp.evaluate(node, {node.input[0]: order, **arrays})[0])
    if not positions.shape:
        return None
    source = positions
    for axis, size in enumerate(positions.shape):  # drop the axes along which an element repeats
        if size > 1 and np.all(source == source.take([0], axis=axis)):
            source = source.take([0], axis=axis)
    if not np.array_equal(source.reshape(-1), order.reshape(-1)):
        return None
    return _out(imp.fit(imp.fit(imp.tensor(node.input[0]), source.shape), positions.shape))


def _form_view(imp: Importer, node: onnx.NodeProto, at: dict, index: Form | None) -> Outputs:
    """Gather on one axis by affine indices, or GatherND by stacked ones, that read the data in order (each element
    possibly repeated along the indices' other axes): a Reshape then an Expand; else None (a runtime gather)."""
    data = imp.type(node.input[0])
    if node.op_type == "Gather" and isinstance(index, Affine):
        axis = _axis(at.get("axis", 0), data.rank)
        sizes = _strided_sizes(index, data.shape[axis])
        if sizes is None:
            return None
        shape = data.shape[:axis] + sizes + data.shape[axis + 1:]
        out = data.shape[:axis] + index.shape + data.shape[axis + 1:]
    elif node.op_type == "GatherND" and isinstance(index, Stacked) and not at.get("batch_dims", 0):
        depth = len(index.parts)
        seen = []
        for c, part in enumerate(index.parts):
            varying = [a for a, k in enumerate(part.coefs) if not (isinstance(k, int) and k == 0)]
            if part.offset != 0 or len(varying) != 1 or part.coefs[varying[0]] != 1 \
                    or (part.shape[varying[0]] - data.shape[c]) != 0:
                return None
            seen.append(varying[0])
        if seen != sorted(set(seen)):
            return None
        lead = index.shape[:-1]
        shape = tuple(data.shape[seen.index(t)] if t in seen else 1 for t in range(len(lead))) + data.shape[depth:]
        out = lead + data.shape[depth:]
    else:
        return None
    return _out(imp.fit(imp.fit(imp.tensor(node.input[0]), shape), out))


def _strided_sizes(index: Affine, size: Dim) -> tuple[Dim, ...] | None:
    """For affine indices into an axis of ``size`` that enumerate it in order (offset 0, the varying axes'
    coefficients the row-major strides of their sizes, which multiply to ``size``): the indices' shape with size 1
    on the other axes; else None."""
    varying = [a for a, k in enumerate(index.coefs) if not (isinstance(k, int) and k == 0)]
    if index.offset != 0 or not varying:
        return None
    stride: Dim = 1
    for a in reversed(varying):
        if (index.coefs[a] - stride) != 0:
            return None
        stride = stride * index.shape[a]
    if (stride - size) != 0:
        return None
    return tuple(index.shape[a] if a in varying else 1 for a in range(len(index.shape)))


def _gather(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """A known contiguous run of indices is a Narrow; indices that read the data in order a view (:func:`_view`);
    rows of a matrix by integer ids an Embedding."""
    data, indices = imp.type(node.input[0]), imp.type(node.input[1])
    axis = _axis(at.get("axis", 0), data.rank)
    idx = imp.known(node.input[1])
    g = imp.graph
    size = data.shape[axis]
    if idx is not None and isinstance(size, int):
        flat = np.where(idx < 0, idx + size, idx).reshape(-1)
        shape = data.shape[:axis] + idx.shape + data.shape[axis + 1:]
        if shape and flat.size and np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)) \
                and flat[0] >= 0 and flat[-1] < size:  # the whole axis: no Narrow at all
            (piece,) = _narrows(imp, node.input[0], [(axis, int(flat[0]), int(flat[0] + flat.size))])
            return _out(imp.fit(piece.node, shape))
        if np.any(flat < 0) or np.any(flat >= size):
            return None
    form, table = imp.form(node.input[1]), imp.known(node.input[0])
    if isinstance(form, Filled) and table is not None:  # one known row everywhere (BERT's token types)
        row = np.take(table, [int(form.value)], axis=axis)
        name = f"{node.output[0]}.row"
        imp.values[name] = Value(array=row, weight=imp.value(node.input[0]).weight)
        shape = data.shape[:axis] + form.shape + data.shape[axis + 1:]
        return _out(imp.fit(imp.fit(imp.tensor(name), row.shape[:axis] + (1,) * len(form.shape) +
                                    row.shape[axis + 1:]), shape))
    if idx is not None or form is not None:
        view = _view(imp, node, at)
        if view is not None:
            return view
    if axis == 0 and data.rank == 2 and indices.dtype in ("i64", "i32"):
        return _out(g.embedding(imp.tensor(node.input[0]), imp.tensor(node.input[1])))
    return None


def _gather_nd(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """Indices that read the data in order are a view (:func:`_view`); rows of a matrix by integer ids ``[..., 1]``
    (dynamo's spelling of ``table[positions]``) the Embedding TorchScript's Gather of those rows imports as."""
    view = _view(imp, node, at)
    if view is not None:
        return view
    data, indices = imp.type(node.input[0]), imp.type(node.input[1])
    if at.get("batch_dims", 0) or data.rank != 2 or indices.rank < 2 or indices.shape[-1] != 1 \
            or indices.dtype not in ("i64", "i32"):
        return None
    rows = imp.fit(imp.tensor(node.input[1]), indices.shape[:-1])
    return _out(imp.graph.embedding(imp.tensor(node.input[0]), rows))


def _reshape_to(imp: Importer, name: str, shape: tuple[int, ...]) -> Outputs:
    if not shape:
        return None  # rank 0: MIR's Reshape needs at least one dim
    nid = imp.tensor(name)
    return _out(nid if imp.graph.node(nid).shape == shape else imp.graph.reshape(nid, shape=shape))


def _reshape(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    target = imp.known_dims(node.input[1])
    if target is None:
        return None
    src = imp.type(node.input[0]).shape
    dims = [as_dim(d) for d in target.reshape(-1)]  # ints and, from symbolic shape values, Syms
    if not at.get("allowzero", 0):
        dims = [src[k] if d == 0 else d for k, d in enumerate(dims)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims = [math.prod(src) // known if d == -1 else d for d in dims]
    return _reshape_to(imp, node.input[0], tuple(dims))


def _flatten(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    shape = imp.type(node.input[0]).shape
    axis = _axis(at.get("axis", 1), len(shape))
    return _reshape_to(imp, node.input[0], (math.prod(shape[:axis]), math.prod(shape[axis:])))


def _axes(imp: Importer, node: onnx.NodeProto, at: dict) -> list[int] | None:
    """Unsqueeze/Squeeze axes: an attribute before opset 13, an input since (None: not known)."""
    if imp.opset < 13:
        return list(at.get("axes", []))
    if len(node.input) < 2 or not node.input[1]:
        return []
    given = imp.known(node.input[1])
    return None if given is None else [int(a) for a in given.reshape(-1)]


def _unsqueeze(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    axes = _axes(imp, node, at)
    if axes is None:
        return None
    shape = list(imp.type(node.input[0]).shape)
    rank = len(shape) + len(axes)
    for a in sorted(_axis(a, rank) for a in axes):
        shape.insert(a, 1)
    return _reshape_to(imp, node.input[0], tuple(shape))


def _squeeze(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    axes = _axes(imp, node, at)
    if axes is None:
        return None
    shape = imp.type(node.input[0]).shape
    drop = {_axis(a, len(shape)) for a in axes} if axes else {k for k, d in enumerate(shape) if d == 1}
    return _reshape_to(imp, node.input[0], tuple(d for k, d in enumerate(shape) if k not in drop))


def _transpose(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    rank = imp.type(node.input[0]).rank
    perm = tuple(at.get("perm", range(rank - 1, -1, -1)))
    x = imp.tensor(node.input[0])
    return _out(x if perm == tuple(range(rank)) else imp.graph.transpose(x, perm=perm))


def _concat(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    parts = [n for n in node.input if n and imp.type(n).numel > 0]
    rank = imp.type(parts[0]).rank
    ids = [imp.tensor(n) for n in parts]
    return _out(ids[0] if len(ids) == 1 else imp.graph.concat(ids, axis=_axis(at["axis"], rank)))


def _narrows(imp: Importer, name: str, ranges: list[tuple[int, int, int]]) -> Outputs:
    """Narrow ``name`` to [start, end) on each (axis, start, end); None when a range is empty."""
    if any(end <= start for _, start, end in ranges):
        return None
    x = imp.tensor(name)
    for axis, start, end in ranges:
        size = imp.graph.node(x).shape[axis]
        if (start, end) != (0, size):
            x = imp.graph.narrow(x, axis=axis, start=start, length=end - start)
    return _out(x)


def _slice(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """Narrows (step 1); bounds may be symbolic (:meth:`Importer.slice_bounds`).  A static axis cut by symbolic
    bounds is a gather of its rows by an Arange (a position table cut to the sequence, a causal-mask buffer cut to
    the queries' rows and then the keys' columns)."""
    shape = imp.type(node.input[0]).shape
    if imp.opset < 10:
        starts, ends, axes, steps = at["starts"], at["ends"], at.get("axes"), None
    else:
        given = [imp.known_dims(n) if k < len(node.input) and n else None for k, n in enumerate(node.input)]
        given += [None] * (5 - len(given))
        if given[1] is None or given[2] is None or any(
                given[k] is None for k in (3, 4) if k < len(node.input) and node.input[k]):
            return None
        starts, ends = given[1].tolist(), given[2].tolist()
        axes = None if given[3] is None else given[3].tolist()
        steps = None if given[4] is None else given[4].tolist()
    axes = list(range(len(starts))) if axes is None else [_axis(a, len(shape)) for a in axes]
    if steps is not None and any(s != 1 for s in steps):
        return _every_kth(imp, node.input[0], axes, starts, ends, steps)
    ranges = [(axis, *imp.slice_bounds(shape[axis], start, end)) for axis, start, end in zip(axes, starts, ends,
                                                                                            strict=True)]
    if any(symbols_of([start, end]) and isinstance(shape[axis], int) for axis, start, end in ranges):
        return _table_rows(imp, node.input[0], ranges)
    return _narrows(imp, node.input[0], ranges)


def _every_kth(imp: Importer, name: str, axes: list[int], starts: list[int], ends: list[int],
               steps: list[int]) -> Outputs:
    """One axis of static size ``n`` cut every ``k``-th element from ``s < k`` to its end (``x[..., 1::2]``, the
    odd channels of interleaved RoPE): the axis viewed as ``[n / k, k]``, column ``s`` narrowed out and the view
    undone (Reshape, Narrow, Reshape), the form every rule reads, whether the other axes are static or symbolic.
    None (an ONNX Slice) for any other step, and for an axis or bounds of symbolic size."""
    shape = imp.type(name).shape
    if len(axes) != 1 or symbols_of([shape[axes[0]], *starts, *ends]):
        return None
    (axis,), (start,), (end,), (k,) = axes, starts, ends, steps
    n = shape[axis]
    start = start + n if start < 0 else start
    if not (1 < k <= n and n % k == 0 and 0 <= start < k and end >= n - k + start + 1):
        return None
    g = imp.graph
    pairs = g.reshape(imp.tensor(name), shape=(*shape[:axis], n // k, k, *shape[axis + 1:]))
    column = g.narrow(pairs, axis=axis - len(shape), start=start, length=1)  # the new axis, counted from the end
    return _out(g.reshape(column, shape=(*shape[:axis], n // k, *shape[axis + 1:])))


def _table_rows(imp: Importer, name: str, ranges: list[tuple[int, Dim, Dim]]) -> Outputs:
    """A tensor (a known table or a value computed from one) cut by symbolic bounds on static axes: rows gathered by
    an Arange per such axis (an Embedding on axis 0 of a matrix, else an ONNX Gather), the static cuts Narrows;
    valid while the bounds stay within the table (the assumption :meth:`Importer.slice_bounds` recorded)."""
    g = imp.graph
    x = imp.tensor(name)
    for axis, start, end in ranges:
        size = g.node(x).shape[axis]
        if not symbols_of([start, end]):
            if (start, end) != (0, size):
                x = g.narrow(x, axis=axis, start=start, length=end - start)
            continue
        rows = g.add_node("Arange", start=start, length=end - start, dtype="i64")
        x = g.embedding(x, rows) if axis == 0 and len(g.node(x).shape) == 2 else gather_node(imp, x, rows, axis)
    return _out(x)


def gather_node(imp: Importer, data: int, indices: int, axis: int) -> int:
    """An ONNX Gather of MIR nodes ``data`` by ``indices`` on ``axis`` (an OnnxOp: MIR gathers only rows)."""
    graph = helper.make_graph([helper.make_node("Gather", ["in0", "in1"], ["out0"], axis=axis)], "Gather", [], [])
    return imp.graph.add_node("OnnxOp", [data, indices], op_type="Gather", domain="", opset=imp.opset, output=0,
                              proto=encode_proto(graph))


def _split(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    shape = imp.type(node.input[0]).shape
    axis = _axis(at.get("axis", 0), len(shape))
    if len(node.input) > 1 and node.input[1]:
        sizes = imp.known(node.input[1])
        if sizes is None:
            return None
        sizes = [int(s) for s in sizes.reshape(-1)]
    elif "split" in at:
        sizes = list(at["split"])
    else:
        n = len(node.output)
        chunk = -(-shape[axis] // n)
        sizes = [min(chunk, shape[axis] - k * chunk) for k in range(n)]
    outs: list[Value | None] = []
    start = 0
    for size in sizes:
        piece = _narrows(imp, node.input[0], [(axis, start, start + size)])
        outs.append(piece[0] if piece else None)
        start += size
    return outs


def _and(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """And with a constant all-true operand (a known array or a filled form) is the other one broadcast
    (transformers ANDs an all-true mask into the padding mask); any other And stays opaque."""
    a, b = node.input
    shape = broadcast(imp.type(a).shape, imp.type(b).shape)
    for constant, other in ((a, b), (b, a)):
        array, form = imp.known(constant), imp.form(constant)
        true = (array is not None and array.all()) or (isinstance(form, Filled) and bool(form.value))
        if true and imp.value(other).runtime:
            return _out(imp.fit(imp.tensor(other), shape))
    return None


def _expand(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    target = imp.known_dims(node.input[1])
    if target is None:
        return None
    x = imp.tensor(node.input[0])
    shape = broadcast(imp.graph.node(x).shape, tuple(as_dim(d) for d in target.reshape(-1)))
    return _out(imp.fit(x, shape))


def _tile(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """Tile by symbolic repeats (a mask or positions repeated over the batch, whose output onnx's shape inference
    leaves unknown): a size-1 axis before each repeated axis of size > 1, an Expand over the repeats, a Reshape
    merging each repeat into its axis.  Tile by static repeats of axes of size 1 only is an Expand (TorchScript's
    repeat_interleave of a rotary table: Tile of [..., n, 1] by [1, ..., 1, 2], dynamo's Expand); by other static
    repeats it stays an ONNX node."""
    repeats = imp.known_dims(node.input[1])
    if repeats is None or not imp.type(node.input[0]).shape:
        return None
    x = imp.tensor(node.input[0])
    shape = imp.graph.node(x).shape
    reps = [as_dim(r) for r in repeats.reshape(-1)]
    if not is_symbolic(repeats) and any(r != 1 and d != 1 for d, r in zip(shape, reps, strict=True)):
        return None
    split: list[Dim] = []
    expanded: list[Dim] = []
    for d, r in zip(shape, reps, strict=True):
        split += [d] if r == 1 or d == 1 else [1, d]
        expanded += [d] if r == 1 else [r] if d == 1 else [r, d]
    tiled = tuple(d * r for d, r in zip(shape, reps, strict=True))
    if tiled == shape:
        return _out(x)
    y = x if tuple(split) == shape else imp.graph.reshape(x, shape=tuple(split))
    y = imp.graph.expand(y, shape=tuple(expanded))
    return _out(y if tuple(expanded) == tiled else imp.graph.reshape(y, shape=tiled))


def _cast(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    if node.op_type == "CastLike":
        dt = imp.type(node.input[1]).dtype
    elif at["to"] in MIR_DTYPES:
        dt = MIR_DTYPES[at["to"]]
    else:
        return None
    x = imp.tensor(node.input[0])
    return _out(x if imp.graph.node(x).dtype == dt else imp.graph.cast(x, dtype=dt))


def _auto_pads(at: dict, x: TensorType, w: TensorType, strides: list[int], dilations: list[int]) -> list[int] | None:
    """Conv's pads (the spatial begins, then the ends) under its auto_pad; None where they depend on a symbolic
    spatial size."""
    rank = x.rank - 2
    mode = at.get("auto_pad", "NOTSET") or "NOTSET"
    if mode == "NOTSET":
        return list(at.get("pads", [0] * (2 * rank)))
    if mode == "VALID":
        return [0] * (2 * rank)
    begins, ends = [], []
    for i in range(rank):
        size = x.shape[2 + i]
        if not isinstance(size, int):
            return None
        reach = (w.shape[2 + i] - 1) * dilations[i] + 1
        total = max((-(-size // strides[i]) - 1) * strides[i] + reach - size, 0)
        begin = total // 2 if mode == "SAME_UPPER" else total - total // 2
        begins.append(begin)
        ends.append(total - begin)
    return begins + ends


def _conv(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """ONNX's Conv, its bias inside (one op, as in the model)."""
    x, w = imp.type(node.input[0]), imp.type(node.input[1])
    rank = x.rank - 2
    if rank < 1 or list(at.get("kernel_shape", w.shape[2:])) != list(w.shape[2:]):
        return None
    strides, dilations = list(at.get("strides", [1] * rank)), list(at.get("dilations", [1] * rank))
    pads = _auto_pads(at, x, w, strides, dilations)
    if pads is None:
        return None
    bias = [imp.tensor(node.input[2])] if len(node.input) > 2 and node.input[2] else []
    return _out(imp.graph.conv(imp.tensor(node.input[0]), imp.tensor(node.input[1]), *bias, strides=strides,
                               pads=pads, dilations=dilations, groups=at.get("group", 1)))


def _pad(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """Constant-mode Pad with known pads >= 0 and value over every axis (as TF-style "same" padding before a
    Conv is exported); other modes, negative pads (crops) and an axes input stay opaque."""
    x = imp.type(node.input[0])
    if (at.get("mode", "constant") or "constant") != "constant" or (len(node.input) > 3 and node.input[3]):
        return None
    pads = imp.known(node.input[1]) if len(node.input) > 1 and node.input[1] else \
        np.asarray(at.get("pads", []), np.int64)
    value = imp.known(node.input[2]) if len(node.input) > 2 and node.input[2] else np.asarray(at.get("value", 0.0))
    if pads is None or value is None or value.size != 1 or pads.shape != (2 * x.rank,) or np.any(pads < 0):
        return None
    return _out(imp.graph.pad(imp.tensor(node.input[0]), pads=[int(p) for p in pads], value=float(value.reshape(()))))


def _batch_norm(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """Inference BatchNormalization (training mode, whose running statistics are outputs, stays opaque)."""
    if at.get("training_mode", 0):
        return None
    ins = [imp.tensor(name) for name in node.input[:5]]
    out = imp.graph.batch_norm(*ins, eps=at.get("epsilon", 1e-5))
    return [Value(node=out)] + [None] * (len(node.output) - 1)


def _clip(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    """Clip with known bounds (inputs since opset 11, attributes before): Clip with both, Relu for a lone 0 minimum,
    Max or Min for another lone bound, the input itself for none."""
    x = imp.type(node.input[0])
    if x.dtype not in ("f32", "f16", "bf16"):
        return None
    bounds: list[float | None] = []
    for slot, attr in ((1, "min"), (2, "max")):
        name = node.input[slot] if len(node.input) > slot else ""
        if name:
            value = imp.known(name)
            if value is None or value.size != 1:
                return None
            bounds.append(float(value.reshape(())))
        else:
            bounds.append(at.get(attr))
    lo, hi = bounds
    g, src = imp.graph, imp.tensor(node.input[0])
    if lo is not None and hi is not None:
        if lo > hi:
            return None  # onnx's Clip then gives max everywhere: no MIR Clip
        return _out(g.clip(src, min=lo, max=hi))
    if lo is not None:
        return _out(g.relu(src) if lo == 0.0 else g.max(src, g.scalar(lo, x.dtype)))
    if hi is not None:
        return _out(g.min(src, g.scalar(hi, x.dtype)))
    return [imp.value(node.input[0])]


def _dropout(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    return [imp.value(node.input[0])]  # inference: the identity (a used mask output stays opaque)


def _shape(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    shape = imp.type(node.input[0]).shape
    rank = len(shape)
    start = min(max(_axis(at.get("start", 0), rank), 0), rank)
    end = min(max(_axis(at.get("end", rank), rank), 0), rank) if "end" in at else rank
    return [Value(array=dims_array(shape[start:end]))]


def _size(imp: Importer, node: onnx.NodeProto, at: dict) -> Outputs:
    return [Value(array=dims_array([imp.type(node.input[0]).numel]).reshape(()))]


LOWERINGS: dict[str, Lowering] = {
    "Add": _add,
    "Tile": _tile,
    "Where": _where,
    **{op: elementwise(op) for op in ("Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Greater",
                                      "Less")},
    "Sum": elementwise("Add"),
    **{op: unary(op) for op in ("Sqrt", "Neg", "Erf", "Tanh", "Sigmoid", "Relu", "Abs", "Log", "Exp")},
    "Reciprocal": unary("Recip"),
    "Gelu": _gelu,
    "Identity": _alias,
    "Dropout": _dropout,
    "Softmax": _softmax("Softmax"),
    "LogSoftmax": _softmax("LogSoftmax"),
    "ReduceMean": _reduce("ReduceMean", 18),
    "ReduceSum": _reduce("ReduceSum", 13),
    "LayerNormalization": _layer_norm,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Gather": _gather,
    "GatherND": _gather_nd,
    "GatherElements": _view,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Transpose": _transpose,
    "Concat": _concat,
    "Slice": _slice,
    "Split": _split,
    "Expand": _expand,
    "And": _and,
    "Cast": _cast,
    "CastLike": _cast,
    "Conv": _conv,
    "BatchNormalization": _batch_norm,
    "Pad": _pad,
    "Clip": _clip,
    "Shape": _shape,
    "Size": _size,
}

__all__ = ["LOWERINGS", "Lowering"]
