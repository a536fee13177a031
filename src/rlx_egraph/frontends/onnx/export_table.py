"""The export table: MIR op -> ONNX nodes (standard, or com.microsoft contrib ops that onnxruntime runs).

An entry ``(b, node, ins, types) -> name`` writes the node through the builder
``b`` (:class:`rlx_egraph.frontends.onnx.exporter.Builder`) and returns the
ONNX name of its value (a multi-result node: one name per result); ``None`` means "not in this case": the exporter then
writes the node's unfused form.  The unfused form is the op spec's
``decompose`` or, for a primitive with no single ONNX op, its entry in
:data:`MIR_FORMS` (the same computation as its kernel in other MIR ops).
The primitives' entries are written here; an op whose spec declares its export (``OpSpec.onnx``: every fused op
onnxruntime runs, declared in its family module under ``ir/ops/``, see :mod:`rlx_egraph.ir.export`) gets its entry
from the declaration.  The fused ops written as onnxruntime kernels are thus exactly those the ``onnxruntime`` cost
target runs (``cost/targets.ONNXRUNTIME_FUSED``, read from the same declarations).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...ir.dtypes import dtype
from ...ir.export import MS
from ...ir.ops.attention import onnx_attention, repeat_kv
from ...ir.ops.norms import plus_beta
from ...ir.ops.onnx_op import ONNX_DTYPES
from ...ir.registry import REGISTRY, Attrs, TensorType

if TYPE_CHECKING:
    from ...ir.graph import Graph, Node
    from .exporter import Builder

ExportFn = Callable[["Builder", "Node", list[str], list[TensorType]], str | tuple[str, ...] | None]


def same(op_type: str) -> ExportFn:
    """The ONNX op of the same meaning and inputs, no attributes."""
    return lambda b, node, ins, types: b.op(op_type, ins)


def on_rows(write: ExportFn) -> ExportFn:
    """``write`` (of one result) on the rows of its inputs where one of them views rows (:meth:`Builder.rows`; an
    elementwise op or a norm over the last axis between two Gemms), its result viewed back; else as it is."""

    def emit(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str | tuple[str, ...] | None:
        rows = b.rows(ins, node.shape) if node.attrs.get("axis", -1) == -1 else None
        if rows is None:
            return write(b, node, ins, types)
        out = write(b, node, rows, types)
        assert not isinstance(out, tuple), f"{node.op}: a writer of one result is written on rows"
        return None if out is None else b.on_rows(out, node.shape)

    return emit


def _with_axis(op_type: str) -> ExportFn:
    return lambda b, node, ins, types: b.op(op_type, ins, axis=node.attrs["axis"])


def _reduce(op_type: str) -> ExportFn:
    def emit(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
        return b.reduce(op_type, ins[0], list(node.attrs["axes"]), node.attrs["keepdims"])

    return emit


def _reduce_all(op_type: str) -> ExportFn:
    return lambda b, node, ins, types: b.reduce(op_type, ins[0], None, False)


def _sum_rows(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    rows = b.reshape(ins[0], [-1, types[0].shape[-1]])
    return b.reduce("ReduceSum", rows, [0], False)


def _swap_last(b: Builder, name: str, rank: int) -> str:
    return b.op("Transpose", [name], perm=[*range(rank - 2), rank - 1, rank - 2])


def _matmul_at(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    return b.op("MatMul", [_swap_last(b, ins[0], types[0].rank), ins[1]])


def _matmul_bt(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    return b.op("MatMul", [ins[0], _swap_last(b, ins[1], types[1].rank)])


def _rsqrt(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    return b.op("Reciprocal", [b.op("Sqrt", ins)])


def _gelu(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    return b.op("FastGelu" if node.attrs["approximate"] == "tanh" else "Gelu", ins, domain=MS)


def _narrow(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """Slice; or, where two or more distinct Narrows of one tensor along one axis do not overlap (a Split as
    imported, a packed projection cut unevenly), one Split whose outputs they are (a piece for each gap between
    them, unread): one launch, not one per piece."""
    a = node.attrs
    axis = a["axis"] % len(types[0].shape)
    key = (ins[0], axis)
    if key not in b.splits:
        b.splits[key] = _split_pieces(b, node, ins[0], axis, types[0].shape[axis])
    pieces = b.splits[key]
    if pieces is not None:
        return pieces[(a["start"], a["length"])]
    return b.op("Slice", [ins[0], b.ints([a["start"]]), b.ints([a["start"] + a["length"]]), b.ints([a["axis"]])])


def _embedding(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """Gather of the table's rows; rows gathered at consecutive positions (an Arange, viewed with size-1 axes: the
    position ids of a dynamic export) are a Slice of the table, viewed as the result: the Range is not written."""
    ids = b.graph.node(node.inputs[1]) if b.graph is not None else None
    while ids is not None and ids.op == "Reshape" and sum(d != 1 for d in ids.shape) <= 1:
        ids = b.graph.node(ids.inputs[0])
    start = ids.attrs["start"] if ids is not None and ids.op == "Arange" else -1
    if isinstance(start, int) and start < 0:  # (a negative id counts from the end: a Gather's, not a Slice's)
        return b.op("Gather", ins, axis=0)
    length = ids.attrs["length"]
    rows = b.op("Slice", [ins[0], b.ints([start]), b.ints([start + length]), b.ints([0])])
    b.shapes[rows] = (length, types[0].shape[1])
    return b.reshape(rows, node.shape)


def _split_pieces(b: Builder, node: Node, x: str, axis: int, size: object) -> dict[tuple[int, int], str] | None:
    """The Split (written now) of ``x`` whose outputs are the Narrows of ``node``'s input along ``axis``, each
    (start, length) its output's name; None when there are fewer than two of them, they overlap, or the axis is
    symbolic."""
    graph = b.graph
    if graph is None or not isinstance(size, int):
        return None
    rank = len(node.shape)
    cuts = sorted({(n.attrs["start"], n.attrs["length"]) for n in map(graph.node, graph.users(node.inputs[0]))
                   if n.op == "Narrow" and n.attrs["axis"] % rank == axis})
    if len(cuts) < 2 or not all(isinstance(d, int) for cut in cuts for d in cut):
        return None
    if any(start + length > after for (start, length), (after, _) in itertools.pairwise(cuts)):
        return None
    sizes, slots, at = [], {}, 0
    for start, length in cuts:
        if start > at:
            sizes.append(start - at)
        slots[(start, length)] = len(sizes)
        sizes.append(length)
        at = start + length
    if at < size:
        sizes.append(size - at)
    outs = b.multi("Split", [x, b.ints(sizes)], range(len(sizes)), axis=axis)
    return {cut: outs[k] for cut, k in slots.items()}


def _layer_norm(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    return b.op("LayerNormalization", ins, axis=node.attrs["axis"], epsilon=node.attrs["eps"])


def _rms_norm(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """onnxruntime's SimplifiedLayerNormalization (registered in the default domain), then + beta."""
    out = b.op("SimplifiedLayerNormalization", ins[:2], axis=node.attrs["axis"], epsilon=node.attrs["eps"])
    return plus_beta(b, out, ins, 2)


def _conv(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    a = node.attrs
    return b.op("Conv", ins, strides=[a["stride"]] * 2, pads=[a["padding"]] * 4, group=a["groups"])


def _conv_nd(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    a = node.attrs
    return b.op("Conv", ins, strides=list(a["strides"]), pads=list(a["pads"]), dilations=list(a["dilations"]),
                group=a["groups"])


def _clip(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    storage = dtype(node.dtype).storage
    bounds = [b.const(np.array(node.attrs[k], storage), node.dtype) for k in ("min", "max")]
    return b.op("Clip", [ins[0], *bounds])


def _max_pool(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    a = node.attrs
    return b.op("MaxPool", ins, kernel_shape=[a["kernel"]] * 2, strides=[a["stride"]] * 2, pads=[a["padding"]] * 4)


def _global_avg_pool(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    return b.op("Reshape", [b.op("GlobalAveragePool", ins), b.ints(node.shape)])


def _upsample(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    return b.op("Resize", [ins[0], "", b.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest",
                coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _non_zero(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """ONNX NonZero, with -1 columns appended and the first ``count`` kept."""
    rank, count = node.shape
    padded = b.op("Concat", [b.op("NonZero", ins), b.const(np.full((rank, count), -1, np.int64))], axis=1)
    return b.op("Slice", [padded, b.ints([0]), b.ints([count]), b.ints([1])])


def _causal_attention(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """Attention (opset 23) on split heads (GQA included): is_causal when queries and keys are equally many
    (its causal mask is aligned top-left), else the kernel's bottom-right aligned keep mask."""
    sq, sk = types[0].shape[2], types[1].shape[2]
    if sq == sk:
        return onnx_attention(b, node, ins, types, is_causal=1, scale=node.attrs["scale"])
    keep = b.const(np.tril(np.ones((sq, sk), dtype=bool), k=sk - sq), "bool")
    return onnx_attention(b, node, [*ins, keep], types, scale=node.attrs["scale"])


def _int_dtype(b: Builder, name: str, dtype: str) -> str:
    """An int64 tensor cast to ``dtype`` (i64 or i32)."""
    return name if dtype == "i64" else b.op("Cast", [name], to=ONNX_DTYPES[dtype])


def _arange(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    a = node.attrs
    ends = b.scalar_dim(a["start"]), b.scalar_dim(a["start"] + a["length"])
    return _int_dtype(b, b.op("Range", [*ends, b.const(np.array(1, np.int64))]), node.dtype)


def _causal_mask(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """keys j <= i + C - R: Range(0, C) against Range(C - R, C) on a new axis, then the leading dims."""
    *lead, rows, cols = node.attrs["shape"]
    keys = b.op("Range", [b.scalar_dim(0), b.scalar_dim(cols), b.const(np.array(1, np.int64))])
    last = b.op("Range", [b.scalar_dim(cols - rows), b.scalar_dim(cols), b.const(np.array(1, np.int64))])
    keep = b.op("LessOrEqual", [keys, b.op("Unsqueeze", [last, b.ints([1])])])
    if not lead:
        return keep
    shaped = b.op("Reshape", [keep, b.ints([*(1 for _ in lead), rows, cols])])
    return shaped if all(d == 1 for d in lead) else b.op("Expand", [shaped, b.ints(node.attrs["shape"])])


def _dim_values(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    flat = b.ints(node.attrs["values"])
    shape = node.attrs["shape"]
    shaped = flat if len(shape) == 1 else b.op("Reshape", [flat, b.const(np.array(shape, np.int64))])
    return _int_dtype(b, shaped, node.dtype)


EXPORTS: dict[str, ExportFn] = {
    **{op: on_rows(same(op)) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Greater", "Less", "Equal",
                                        "Where", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Neg", "Abs", "Sqrt",
                                        "Erf")},
    "Identity": same("Identity"),
    "MatMul": same("MatMul"),
    "Recip": on_rows(same("Reciprocal")),
    "Rsqrt": on_rows(_rsqrt),
    "Silu": on_rows(lambda b, node, ins, types: b.op("QuickGelu", ins, domain=MS, alpha=1.0)),
    "Gelu": on_rows(_gelu),
    "Cast": on_rows(lambda b, node, ins, types: b.op("Cast", ins, to=ONNX_DTYPES[node.dtype])),
    "Softmax": _with_axis("Softmax"),
    "LogSoftmax": _with_axis("LogSoftmax"),
    "ReduceSum": _reduce("ReduceSum"),
    "ReduceMean": _reduce("ReduceMean"),
    "SumAll": _reduce_all("ReduceSum"),
    "MeanAll": _reduce_all("ReduceMean"),
    "SumRows": _sum_rows,
    "MatMulAT": _matmul_at,
    "MatMulBT": _matmul_bt,
    "LayerNorm": on_rows(_layer_norm),
    "RmsNorm": on_rows(_rms_norm),
    "Reshape": lambda b, node, ins, types: b.reshape(ins[0], node.attrs["shape"]),
    "Transpose": lambda b, node, ins, types: b.transpose(ins[0], node.attrs["perm"]),
    "Narrow": _narrow,
    "Concat": _with_axis("Concat"),
    "Expand": lambda b, node, ins, types: b.op("Expand", [ins[0], b.ints(node.attrs["shape"])]),
    "Embedding": _embedding,
    "Conv2d": _conv,
    "Conv": _conv_nd,
    "BatchNorm": lambda b, node, ins, types: b.op("BatchNormalization", ins, epsilon=node.attrs["eps"]),
    "Clip": _clip,
    "Pad": lambda b, node, ins, types: b.op("Pad", [ins[0], b.ints(node.attrs["pads"]),
                                                    b.const(np.array(node.attrs["value"], dtype(node.dtype).storage),
                                                            node.dtype)]),
    "MaxPool2d": _max_pool,
    "GlobalAvgPool": _global_avg_pool,
    "Upsample2x": _upsample,
    "CrossEntropyLoss": lambda b, node, ins, types: b.op("SoftmaxCrossEntropyLoss", ins, reduction="mean"),
    # host-sync ops: their values (onnxruntime decides on the device)
    "Item": lambda b, node, ins, types: b.op("Reshape", [ins[0], b.ints([])]),
    "NonZero": _non_zero,
    "Cond": lambda b, node, ins, types: b.op("Where", [b.op("Reshape", [ins[0], b.ints([])]), *ins[1:]]),
    "CausalAttention": _causal_attention,
    # leaves made of dims, computed at run time from the inputs' shapes (static ones are initializers)
    "Arange": _arange,
    "CausalMask": _causal_mask,
    "DimValues": _dim_values,
}


EXPORTS.update({name: spec.onnx.write for name, spec in REGISTRY.items() if spec.onnx is not None})


# --- unfused forms of primitives with no single ONNX op (the kernels' computations in MIR ops) ---------


def _norm_axes(a: Attrs, rank: int) -> tuple[int, ...]:
    return tuple(range(a["axis"] % rank - rank, 0))


def _inv_rms(g: Graph, x: int, axes: tuple[int, ...], eps: float) -> int:
    dt = g.node(x).dtype
    return g.recip(g.sqrt(g.add(g.reduce_mean(g.mul(x, x), axes=axes, keepdims=True), g.scalar(eps, dt))))


def _group_norm(g: Graph, ins: list[int], a: Attrs) -> int:
    x, w, b = ins
    shape, dt = g.node(x).shape, g.node(x).dtype
    groups = g.reshape(x, shape=(shape[0], a["groups"], math.prod(shape[1:]) // a["groups"]))
    d = g.sub(groups, g.reduce_mean(groups, axes=(-1,), keepdims=True))
    var = g.reduce_mean(g.mul(d, d), axes=(-1,), keepdims=True)
    normed = g.reshape(g.div(d, g.sqrt(g.add(var, g.scalar(a["eps"], dt)))), shape=shape)
    per_channel = (shape[1],) + (1,) * (len(shape) - 2)
    return g.add(g.mul(normed, g.reshape(w, shape=per_channel)), g.reshape(b, shape=per_channel))


def _rope(g: Graph, ins: list[int], a: Attrs) -> int:
    """x * cos + rotate_half(x) * sin with the kernel's cos/sin tables as constants."""
    x = ins[0]
    seq, dim = g.node(x).shape[-2:]
    half = dim // 2
    inv_freq = 1.0 / (a["theta"] ** (np.arange(half, dtype=np.float64) * 2.0 / dim))
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    both = np.concatenate([angles, angles], axis=-1)
    dt = g.node(x).dtype
    cos, sin = (g.constant(f(both).astype(np.float32), dt) for f in (np.cos, np.sin))
    rotated = g.concat([g.neg(g.narrow(x, axis=-1, start=half, length=half)),
                        g.narrow(x, axis=-1, start=0, length=half)], axis=-1)
    return g.add(g.mul(x, cos), g.mul(rotated, sin))


def sdpa(g: Graph, q: int, k: int, v: int, scale: float, causal: bool, key_mask: int | None = None) -> int:
    """The kernel's scaled dot-product attention on [B, H, S, D] (K/V heads repeated for GQA)."""
    (b, heads, sq, _), sk = g.node(q).shape, g.node(k).shape[2]
    dt = g.node(q).dtype
    k, v = repeat_kv(g, k, heads), repeat_kv(g, v, heads)
    scores = g.mul(g.matmul_bt(q, k), g.scalar(scale, dt))
    if causal:
        allowed = g.constant(np.tril(np.ones((sq, sk), dtype=bool), k=sk - sq))
        scores = g.where(allowed, scores, g.constant(np.array(-np.inf, np.float32), dt))
    if key_mask is not None:
        dropped = g.equal(g.reshape(key_mask, shape=(b, 1, 1, sk)), g.scalar(0.0, g.node(key_mask).dtype))
        scores = g.where(dropped, g.scalar(-1e9, dt), scores)
    return g.matmul(g.softmax(scores, axis=-1), v)


def _attention(g: Graph, ins: list[int], a: Attrs) -> int:
    def split(t: int, heads: int) -> int:
        b, s, width = g.node(t).shape
        return g.transpose(g.reshape(t, shape=(b, s, heads, width // heads)), perm=(0, 2, 1, 3))

    q, k, v = split(ins[0], a["heads"]), split(ins[1], a["kv_heads"]), split(ins[2], a["kv_heads"])
    out = sdpa(g, q, k, v, a["scale"], a["mask"] == "causal", ins[3] if a["mask"] == "custom" else None)
    b, h, s, d = g.node(out).shape
    return g.reshape(g.transpose(out, perm=(0, 2, 1, 3)), shape=(b, s, h * d))


def _bce(g: Graph, ins: list[int], a: Attrs) -> int:
    p, t = ins
    dt = g.node(p).dtype
    eps, one = g.scalar(1e-12, dt), g.scalar(1.0, dt)
    terms = g.add(g.mul(t, g.log(g.max(p, eps))), g.mul(g.sub(one, t), g.log(g.max(g.sub(one, p), eps))))
    return g.neg(g.mean_all(terms))


def _silu_grad(g: Graph, ins: list[int], a: Attrs) -> int:
    x, dy = ins
    s = g.sigmoid(x)
    return g.mul(dy, g.add(s, g.mul(g.mul(x, s), g.sub(g.scalar(1.0, g.node(x).dtype), s))))


def _rms_grad_x(g: Graph, ins: list[int], a: Attrs) -> int:
    x, gamma, dy = ins
    shape, dt = g.node(x).shape, g.node(x).dtype
    axes = _norm_axes(a, len(shape))
    inv = _inv_rms(g, x, axes, a["eps"])
    scaled = g.mul(dy, gamma)
    total = g.reduce_sum(g.mul(scaled, x), axes=axes, keepdims=True)
    n = math.prod(shape[i] for i in axes)
    return g.sub(g.mul(inv, scaled), g.div(g.mul(g.mul(x, g.pow(inv, g.scalar(3.0, dt))), total), g.scalar(n, dt)))


def _rms_grad_w(g: Graph, ins: list[int], a: Attrs) -> int:
    x, dy = ins
    rank = len(g.node(x).shape)
    axes = _norm_axes(a, rank)
    out = g.mul(g.mul(dy, x), _inv_rms(g, x, axes, a["eps"]))
    lead = tuple(range(rank - len(axes)))
    return g.reduce_sum(out, axes=lead, keepdims=False) if lead else out


def _layer_norm_grad_x(g: Graph, ins: list[int], a: Attrs) -> int:
    x, gamma, dy = ins
    shape, dt = g.node(x).shape, g.node(x).dtype
    axes = _norm_axes(a, len(shape))

    def mean(t: int) -> int:
        return g.reduce_mean(t, axes=axes, keepdims=True)

    centered = g.sub(x, mean(x))
    inv = g.recip(g.sqrt(g.add(mean(g.pow(centered, g.scalar(2.0, dt))), g.scalar(a["eps"], dt))))
    xhat = g.mul(centered, inv)
    scaled = g.mul(dy, gamma)
    return g.mul(inv, g.sub(g.sub(scaled, mean(scaled)), g.mul(xhat, mean(g.mul(scaled, xhat)))))


MIR_FORMS: dict[str, Callable[[Graph, list[int], Attrs], int]] = {
    "GroupNorm": _group_norm,
    "RoPE": _rope,
    "Attention": _attention,
    "BceLoss": _bce,
    "SiluGrad": _silu_grad,
    "RmsNormGradX": _rms_grad_x,
    "RmsNormGradW": _rms_grad_w,
    "LayerNormGradX": _layer_norm_grad_x,
}


__all__ = ["EXPORTS", "MIR_FORMS", "MS", "ExportFn", "sdpa"]
