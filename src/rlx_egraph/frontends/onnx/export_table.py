"""The export table: MIR op -> ONNX nodes (standard, or com.microsoft contrib ops that onnxruntime runs).

An entry ``(b, node, ins, types) -> name`` writes the node through the builder
``b`` (:class:`rlx_egraph.frontends.onnx.exporter.Builder`) and returns the
ONNX name of its value (a multi-result node: one name per result); ``None`` means "not in this case": the exporter then
writes the node's unfused form.  The unfused form is the op spec's
``decompose`` or, for a primitive with no single ONNX op, its entry in
:data:`MIR_FORMS` (the same computation as its kernel in other MIR ops).
An op whose spec declares its export as data (``OpSpec.onnx``, an :class:`~rlx_egraph.ir.registry.OnnxExport`)
gets its entry from it (:func:`declared`).  The fused ops it writes as onnxruntime kernels are exactly those
the ``onnxruntime`` cost target declares it runs (``cost/targets.ONNXRUNTIME_FUSED``; a test checks it).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...ir.dims import Dim, symbols_of
from ...ir.dtypes import dtype
from ...ir.ops.attention import repeat_kv
from ...ir.ops.onnx_op import ONNX_DTYPES
from ...ir.registry import REGISTRY, Attrs, OnnxExport, TensorType
from ...ir.shapes import broadcast

if TYPE_CHECKING:
    from ...ir.graph import Graph, Node
    from .exporter import Builder

ExportFn = Callable[["Builder", "Node", list[str], list[TensorType]], str | tuple[str, ...] | None]
MS = "com.microsoft"


def same(op_type: str) -> ExportFn:
    """The ONNX op of the same meaning and inputs, no attributes."""
    return lambda b, node, ins, types: b.op(op_type, ins)


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


def _plus_beta(b: Builder, out: str, ins: list[str], beta_slot: int) -> str:
    return b.op("Add", [out, ins[beta_slot]]) if len(ins) > beta_slot else out


def _rms_norm(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """onnxruntime's SimplifiedLayerNormalization (registered in the default domain), then + beta."""
    out = b.op("SimplifiedLayerNormalization", ins[:2], axis=node.attrs["axis"], epsilon=node.attrs["eps"])
    return _plus_beta(b, out, ins, 2)


def _conv(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    a = node.attrs
    return b.op("Conv", ins, strides=[a["stride"]] * 2, pads=[a["padding"]] * 4, group=a["groups"])


def _conv_nd(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    a = node.attrs
    return b.op("Conv", ins, strides=list(a["strides"]), pads=list(a["pads"]), dilations=list(a["dilations"]),
                group=a["groups"])


# FusedConv's activations by onnxruntime's names (its activation attribute); "none" writes no attribute.
_FUSED_CONV_ACTIVATIONS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "clip": "Clip"}


def _fused_conv(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """com.microsoft FusedConv: Conv's attributes, then the activation (Clip's bounds as activation_params)."""
    a = node.attrs
    act = {}
    if a["act"] != "none":
        act["activation"] = _FUSED_CONV_ACTIVATIONS[a["act"]]
    if a["act"] == "clip":
        act["activation_params"] = [a["clip_min"], a["clip_max"]]
    return b.op("FusedConv", ins, domain=MS, strides=list(a["strides"]), pads=list(a["pads"]),
                dilations=list(a["dilations"]), group=a["groups"], **act)


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


def _gemm_fits(types: list[TensorType], out: tuple[int, ...]) -> bool:
    """Gemm takes 2-D a and b and a c that broadcasts one way to the [M, N] result."""
    a, w, c = types
    return a.rank == 2 and w.rank == 2 and c.rank <= 2 and all(
        d in (1, o) for d, o in zip(reversed(c.shape), reversed(out), strict=False))


def _gemm_rows(b: Builder, node: Node, ins: list[str], types: list[TensorType], trans_b: int) -> str | None:
    """Gemm on the rows of a batched ``a`` [..., K] (reshaped to [rows, K] and back: views, no copies) with a
    2-D ``b``, when the addend is a bias row (rank <= 1) or of the result's shape (reshaped alike); else None."""
    a, w, c = types
    if a.rank < 3 or w.rank != 2 or not (c.rank <= 1 or c.shape == node.shape):
        return None
    rows = b.reshape(ins[0], [-1, a.shape[-1]])
    addend = ins[2] if c.rank <= 1 else b.reshape(ins[2], [-1, node.shape[-1]])
    return b.reshape(b.op("Gemm", [rows, ins[1], addend], transB=trans_b), node.shape)


def _matmul_add(trans_a: int, trans_b: int) -> ExportFn:
    """Gemm where it fits (on the rows of a batched a too), else the matmul (FusedMatMul for a transposed
    operand) and an Add."""

    def emit(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
        if _gemm_fits(types, node.shape):
            return b.op("Gemm", ins, transA=trans_a, transB=trans_b)
        rows = None if trans_a else _gemm_rows(b, node, ins, types, trans_b)
        if rows is not None:
            return rows
        mm = b.op("FusedMatMul", ins[:2], domain=MS, transA=trans_a, transB=trans_b) if trans_a or trans_b \
            else b.op("MatMul", ins[:2])
        return b.op("Add", [mm, ins[2]])

    return emit


def _bias_act(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """MatMul then BiasGelu / FastGelu(bias) for a full-width bias; Gemm without epilogue where it fits."""
    act, x, w, bias = node.attrs["act"], *ins
    if act == "none":
        return _matmul_add(0, 0)(b, node, ins, types)
    mm = b.op("MatMul", [x, w])
    if types[2].shape == node.shape[-1:] and act in ("gelu", "gelu_tanh"):
        return b.op("BiasGelu" if act == "gelu" else "FastGelu", [mm, bias], domain=MS)
    out = b.op("Add", [mm, bias])
    if act == "silu":
        return b.op("QuickGelu", [out], domain=MS, alpha=1.0)
    return b.op("FastGelu" if act == "gelu_tanh" else "Gelu", [out], domain=MS)


# Output slot of the sum (input + skip) of Skip[Simplified]LayerNormalization (after output, mean, inv_std_var).
SKIP_SUM_OUTPUT = 3


def _skip_norm(op_type: str, beta_after: bool) -> ExportFn:
    """SkipLayerNormalization / SkipSimplifiedLayerNormalization over the last axis of a rank-2 or rank-3
    input (others are reshaped to rank 2 around it); a RmsNorm beta is added after.  A multi-result
    node (FusedAddLayerNorm, FusedAddRmsNorm) also takes the sum, the op's output 3."""

    def emit(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str | tuple[str, ...] | None:
        if node.attrs["axis"] != -1:
            return None
        x, residual = ins[:2]
        shape = types[0].shape
        flat = len(shape) not in (2, 3)
        if flat:
            rows = [-1, shape[-1]]
            x, residual = b.reshape(x, rows), b.reshape(residual, rows)
        params = ins[2:3] if beta_after else ins[2:4]
        outs = b.multi(op_type, [x, residual, *params], (0, SKIP_SUM_OUTPUT) if node.parts else (0,), domain=MS,
                       epsilon=node.attrs["eps"])
        if flat and x in b.shapes:
            b.shapes.update((out, b.shapes[x]) for out in outs)  # each result has the rows' shape
        if flat:
            outs = [b.reshape(out, shape) for out in outs]
        if beta_after:
            outs[0] = _plus_beta(b, outs[0], ins, 3)
        return tuple(outs) if node.parts else outs[0]

    return emit


def _attention_block(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """com.microsoft.Attention (QKV projection, mask, heads) then the output projection."""
    hidden, qkv_w, out_w, mask, qkv_b, out_b = ins
    zero = b.const(np.zeros((), dtype(types[3].dtype).storage), types[3].dtype)
    keep = b.op("Cast", [b.op("Not", [b.op("Equal", [mask, zero])])], to=ONNX_DTYPES["i32"])
    ctx = b.op("Attention", [hidden, qkv_w, qkv_b, keep], domain=MS, num_heads=node.attrs["heads"],
               scale=node.attrs["scale"])
    return b.op("Add", [b.op("MatMul", [ctx, out_w]), out_b])


def _onnx_attention(b: Builder, node: Node, ins: list[str], types: list[TensorType], **attrs: Any) -> str:
    """Attention (opset 23) on q, k, v [B, H, S, D] and the other inputs ``ins[3:]``.  Where q, k and v were
    written as split heads (Transpose(Reshape(x, [B, S, H, D]), 0 2 1 3), as the exporters write them), it
    reads the unsplit [B, S, H*D] values (q_num_heads, kv_num_heads) and its [B, S, H*D] result is split
    back: the reshapes and transposes on both sides are then views a reader merging the heads undoes, so
    no layout node is written."""
    merged = [b.merged_heads(name) for name in ins[:3]]
    if any(m is None for m in merged):
        return b.op("Attention", ins, **attrs)
    heads, kv_heads = types[0].shape[1], types[1].shape[1]
    out = b.op("Attention", [*merged, *ins[3:]], q_num_heads=heads, kv_num_heads=kv_heads, **attrs)
    batch, seq, width = types[0].shape[0], types[0].shape[2], heads * types[2].shape[3]
    b.shapes[out] = (batch, seq, width)
    return b.split_heads(out, heads)


def _causal_attention(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """Attention (opset 23) on split heads (GQA included): is_causal when queries and keys are equally many
    (its causal mask is aligned top-left), else the kernel's bottom-right aligned keep mask."""
    sq, sk = types[0].shape[2], types[1].shape[2]
    if sq == sk:
        return _onnx_attention(b, node, ins, types, is_causal=1, scale=node.attrs["scale"])
    keep = b.const(np.tril(np.ones((sq, sk), dtype=bool), k=sk - sq), "bool")
    return _onnx_attention(b, node, [*ins, keep], types, scale=node.attrs["scale"])


def _biased_attention(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """Attention (opset 23) with the bias as its additive attn_mask, expanded to [..., Sq, Sk] (which it needs);
    a zero Scalar bias (unmasked attention) is no mask.  Its rows whose keys are all masked give 0; without
    nan_to_zero the MIR op gives NaN there."""
    q, k, v, bias = ins
    source = b.graph.node(node.inputs[3]) if b.graph is not None else None
    if source is not None and source.op == "Scalar" and source.attrs["value"] == 0.0:
        return _onnx_attention(b, node, [q, k, v], types, scale=node.attrs["scale"])
    scores = (types[0].shape[2], types[1].shape[2])
    if types[3].shape[-2:] != scores:
        bias = b.op("Expand", [bias, b.ints(broadcast(types[3].shape, scores))])
    return _onnx_attention(b, node, [q, k, v, bias], types, scale=node.attrs["scale"])


def _kv_cache_attention(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> tuple[str, ...]:
    """Attention (opset 23) with past_key and past_value: the context and the present key and value (the
    Concats of past and new on the sequence axis) in one kernel, the bias its additive attn_mask expanded to
    [..., S, P + S]."""
    q, k, v, past_k, past_v, bias = ins
    scores = (types[0].shape[2], types[3].shape[2] + types[1].shape[2])
    if types[5].shape[-2:] != scores:
        bias = b.op("Expand", [bias, b.ints(broadcast(types[5].shape, scores))])
    return tuple(b.multi("Attention", [q, k, v, bias, past_k, past_v], (0, 1, 2), scale=node.attrs["scale"]))


def _group_query_attention(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> tuple[str, ...] | None:
    """com.microsoft GroupQueryAttention on one new token: q, k and v [B, 1, heads * D] as they are, the cache
    (past_key / past_value in, present out), the bias its attention_bias ([B or 1, 1, 1, P + 1]), every row's
    keys 0 .. P (seqlens_k = P, total_sequence_length = P + 1).  With rotary tables (the same for every batch row,
    equal halves) it rotates q and k itself (do_rotary) at position P: its cos/sin caches are [P + 1, D / 2], their
    row P the tables' first halves (the rows before are never read).  Static shapes: known tables checked by value.
    Symbolic dims: the lengths computed at run time from the inputs' shapes, and tables computed at run time taken
    by form ([1, 1, 1, D], a Cos or Sin of a Concat of one value with itself), each cache the table's first half
    expanded to [P + 1, D / 2].  None (the decomposition) for others."""
    q, k, v, past_k, past_v, bias, *tables = ins
    half = types[0].shape[2] // node.attrs["heads"] // 2
    if (2 * half) % (16 if tables else 8):  # the kernel's head widths (rules/decode.egg guards them)
        return None
    symbolic = any(symbols_of(t.shape) for t in types)
    parts = (_decoding_inputs_at_run_time if symbolic else _decoding_inputs)(b, node, ins, types, half)
    if parts is None:
        return None
    seqlens, total, caches = parts
    scores = (1, types[3].shape[2] + 1)
    if types[5].shape[-2:] != scores or types[5].rank != 4:
        bias = b.op("Expand", [bias, b.ints(broadcast(types[5].shape, (1, 1, *scores)))])
    inputs = [q, k, v, past_k, past_v, seqlens, total, *(caches or ["", ""]), "", bias]
    return tuple(b.multi("GroupQueryAttention", inputs, (0, 1, 2), domain=MS, num_heads=node.attrs["heads"],
                         kv_num_heads=node.attrs["kv_heads"], scale=node.attrs["scale"], do_rotary=int(bool(caches)),
                         rotary_interleaved=0))


def _decoding_inputs(b: Builder, node: Node, ins: list[str], types: list[TensorType],
                     half: int) -> tuple[str, str, list[str]] | None:
    """GroupQueryAttention's seqlens_k, total_sequence_length and rotary caches at static shapes, the tables known
    initializers (None otherwise)."""
    batch, past = types[0].shape[0], types[3].shape[2]
    caches = []
    for name in ins[6:]:
        table = _known(b, name)
        if table is None:
            return None
        full = np.broadcast_to(table, (batch, 1, 1, 2 * half))
        if not (np.array_equal(full[..., :half], full[..., half:]) and (full == full[:1]).all()):
            return None
        cache = np.zeros((past + 1, half), table.dtype)
        cache[past] = full[0, 0, 0, :half]
        caches.append(b.const(cache, types[6].dtype))
    return b.const(np.full((batch,), past, np.int32)), b.const(np.array(past + 1, np.int32)), caches


def _decoding_inputs_at_run_time(b: Builder, node: Node, ins: list[str], types: list[TensorType],
                                 half: int) -> tuple[str, str, list[str]] | None:
    """GroupQueryAttention's seqlens_k, total_sequence_length and rotary caches computed at run time (symbolic
    dims), once for every layer that reads them; None for a table that is known or not of the form taken."""
    batch, past = types[0].shape[0], types[3].shape[2]
    caches = []
    for name, nid, t in zip(ins[6:], node.inputs[6:], types[6:], strict=True):
        if _known(b, name) is not None or t.shape[:3] != (1, 1, 1) or not _halves_alike(b, nid):
            return None
        key = ("decoding rotary cache", name)
        if key not in b.dim_tensors:
            row = b.op("Reshape", [b.op("Slice", [name, b.ints([0]), b.ints([half]), b.ints([-1])]),
                                   b.ints([1, half])])
            b.dim_tensors[key] = b.op("Expand", [row, b.ints([past + 1, half])])
        caches.append(b.dim_tensors[key])
    key = ("decoding lengths", batch, past)
    if key not in b.dim_tensors:
        i32 = ONNX_DTYPES["i32"]
        b.dim_tensors[key] = (b.op("Expand", [b.op("Cast", [b.dim(past)], to=i32), b.ints([batch])]),
                              b.op("Cast", [b.scalar_dim(past + 1)], to=i32))
    return (*b.dim_tensors[key], caches)


def _qkv_attention(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """com.microsoft Attention: the packed projection, the heads and the additive bias (its attention_bias
    input, expanded to [B or 1, H or 1, S, S]: once per mask; a bias that only hides padded keys as its 2-D
    mask_index, :func:`_key_padding_mask`) or the causal mask (unidirectional) in one kernel; its [B, S, H*D]
    result reshaped to the op's [B, S, H, D] (a view)."""
    bias, mask, masked = "", "", {}
    padding = _key_padding_mask(b, node.inputs[3], *node.shape[:2]) if len(ins) > 3 else None
    if padding is not None:
        mask, masked = padding[0], {"mask_filter_value": padding[1]}
    elif len(ins) > 3:
        bias, shape = ins[3], types[3].shape
        if shape[2] != shape[3]:
            bias = b.expand(bias, [*shape[:2], shape[3], shape[3]])
    ctx = b.op("Attention", [*ins[:3], mask, "", bias], domain=MS, num_heads=node.attrs["heads"],
               scale=node.attrs["scale"], unidirectional=int(node.attrs["causal"]), **masked)
    b.shapes[ctx] = (*node.shape[:2], node.shape[2] * node.shape[3])
    return b.reshape(ctx, node.shape)


def _multi_head_attention(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str | None:
    """Attention (opset 23) on q, k and v [B, S, heads * D] as they are (q_num_heads = kv_num_heads = heads), the
    bias its additive attn_mask expanded to [..., S, L] (which it needs), causal by is_causal where queries and
    keys are equally many (its causal mask is aligned top-left; None, the decomposition, otherwise); its
    [B, S, heads * Dv] result reshaped to the op's [B, S, heads, Dv] (a view).  onnxruntime's com.microsoft
    MultiHeadAttention computes the same from the same inputs, and its CPU kernel is the slower of the two at
    every size the calibration measures (docs/onnx.md)."""
    causal = node.attrs["causal"]
    if causal and types[0].shape[1] != types[1].shape[1]:
        return None
    inputs = ins[:3]
    if len(ins) > 3:
        scores = (types[0].shape[1], types[1].shape[1])
        bias = ins[3]
        if tuple(types[3].shape[-2:]) != scores:
            bias = b.expand(bias, broadcast(types[3].shape, scores))
        inputs.append(bias)
    heads = node.attrs["heads"]
    ctx = b.op("Attention", inputs, q_num_heads=heads, kv_num_heads=heads, scale=node.attrs["scale"],
               **({"is_causal": 1} if causal else {}))
    b.shapes[ctx] = (*node.shape[:2], node.shape[2] * node.shape[3])
    return b.reshape(ctx, node.shape)


def _key_padding_mask(b: Builder, nid: int, batch: Dim, keys: Dim) -> tuple[str, float] | None:
    """An attention bias that only hides keys: Where(keep, 0, c) with ``keep`` a [B, S] bool padding mask viewed
    as [B, 1, 1, S] (a Reshape), broadcast along the queries or not (an Expand).  Attention takes it as its 2-D
    mask_index (keep as int32, one Cast per mask) and adds c where it is 0 (mask_filter_value): the same sum.
    Returns that mask and c; None for any other bias."""
    graph = b.graph
    where = graph.node(nid) if graph is not None else None
    if where is None or where.op != "Where":
        return None
    cond, zero, fill = (graph.node(i) for i in where.inputs)
    if zero.op != "Scalar" or zero.attrs["value"] != 0.0 or fill.op != "Scalar":
        return None
    cond = graph.node(cond.inputs[0]) if cond.op == "Expand" else cond
    keep = graph.node(cond.inputs[0]) if cond.op == "Reshape" and cond.shape == (batch, 1, 1, keys) else None
    if keep is None or keep.shape != (batch, keys) or keep.dtype != "bool" or not isinstance(b.written.get(keep.id),
                                                                                                 str):
        return None
    key = ("key padding mask", keep.id)
    if key not in b.dim_tensors:
        b.dim_tensors[key] = b.op("Cast", [b.written[keep.id]], to=ONNX_DTYPES["i32"])
    return b.dim_tensors[key], fill.attrs["value"]


def _known(b: Builder, name: str) -> np.ndarray | None:
    """The value of an initializer already written, else None."""
    from onnx import numpy_helper

    return next((numpy_helper.to_array(t) for t in b.initializers if t.name == name), None)


def _rotary(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str | None:
    """RotaryEmbedding (opset 23; ``rotary_embedding_dim`` for part of the head, ``interleaved`` for pairs) on
    split heads [B, H, S, D], or on [B, S, H, D] through its [B, S, H * D] view (``num_heads``), when cos and sin
    have the form it takes: the same for every head, with equal halves ([c, c]; equal pairs when interleaved); its
    caches are one of each [B, S, R / 2] for the R channels rotated.  Known tables are checked by value; tables
    computed at run time (symbolic dims) by form (:func:`_halves_alike`), [B or 1, 1, S, R] or [B or 1, S, 1, R],
    and the caches are their first halves (their even channels when interleaved), sliced at run time."""
    shape = types[0].shape
    if len(shape) != 4:
        return None
    rotated, interleaved = node.attrs["rotary_dim"] or shape[-1], node.attrs["interleaved"]
    half = rotated // 2
    tables = [(_known(b, name), name, nid, t) for name, nid, t in zip(ins[1:], node.inputs[1:], types[1:],
                                                                     strict=True)]
    head_axis = _rotary_head_axis(shape, rotated, [t for *_, t in tables])
    if head_axis is None:
        return None
    caches = []
    for table, name, nid, t in tables:
        if table is None:
            seq = 3 - head_axis  # the sequence axis of x
            rows = (1,) * (4 - t.rank) + tuple(t.shape)
            if rows[0] not in (1, shape[0]) or not _halves_alike(b, nid, interleaved):
                return None
            key = ("rotary cache", name, shape[0], shape[seq])
            if key not in b.dim_tensors:  # q and k read the same tables: one cache each
                cut = [b.ints([0]), b.ints([rotated]), b.ints([-1]), b.ints([2])] if interleaved else \
                    [b.ints([0]), b.ints([half]), b.ints([-1])]
                cache = b.op("Reshape", [b.op("Slice", [name, *cut]), b.ints([rows[0], rows[seq], half])])
                b.dim_tensors[key] = cache if (rows[0], rows[seq]) == (shape[0], shape[seq]) else \
                    b.expand(cache, [shape[0], shape[seq], half])
            caches.append(b.dim_tensors[key])
            continue
        if not all(isinstance(d, int) for d in shape):
            return None
        full = np.moveaxis(np.broadcast_to(table, (*shape[:-1], rotated)), head_axis, 1)  # [B, H, S, R]
        first, second = (full[..., 0::2], full[..., 1::2]) if interleaved else (full[..., :half], full[..., half:])
        if not (np.array_equal(first, second) and np.array_equal(full, full[:, :1].repeat(full.shape[1], axis=1))):
            return None
        caches.append(b.const(np.ascontiguousarray(first[:, 0]), t.dtype))
    attrs = {"interleaved": 1} if interleaved else {}
    if rotated != shape[-1]:
        attrs["rotary_embedding_dim"] = rotated
    if head_axis == 1:
        return b.op("RotaryEmbedding", [ins[0], *caches], **attrs)
    merged = b.reshape(ins[0], (*shape[:2], shape[2] * shape[3]))
    b.shapes[merged] = (*shape[:2], shape[2] * shape[3])
    return b.reshape(b.op("RotaryEmbedding", [merged, *caches], num_heads=shape[2], **attrs), shape)


def _rotary_head_axis(shape: tuple, rotated: int, tables: list[TensorType]) -> int | None:
    """The heads' axis of x [B, ., ., D] under RotaryEmbedding's tables: 1 ([B, H, S, D], tables [.., 1, S, R]) or
    2 ([B, S, H, D], tables [.., S, 1, R]); None when the tables vary along both (or are not of that form)."""
    padded = [(1,) * (4 - t.rank) + tuple(t.shape) for t in tables]
    if any(p[-1] != rotated for p in padded):
        return None
    for axis, seq in ((1, 2), (2, 1)):
        if all(p[axis] == 1 and p[seq] in (1, shape[seq]) for p in padded):
            return axis
    return None


def _halves_alike(b: Builder, nid: int, interleaved: bool = False) -> bool:
    """Node ``nid`` of the graph being written has equal halves on its last axis by its form: a Cos or Sin (kept as
    ONNX ops) of a Concat of one value with itself, through views that keep the last axis, a Cast or a scale.
    ``interleaved``: equal pairs (channels 2i and 2i + 1) instead, each value repeated twice along the last axis
    (repeat_interleave: [..., n, 1] expanded to [..., n, 2] and viewed as [..., 2n]) through the same."""
    graph = b.graph
    if graph is None:
        return False
    n = graph.node(nid)
    while _keeps_halves(graph, n):
        n = graph.node(n.inputs[0])
    if interleaved:
        pairs = graph.node(n.inputs[0]) if n.op == "Reshape" else None
        return pairs is not None and pairs.op == "Expand" and len(pairs.shape) >= 2 and pairs.shape[-1] == 2 \
            and graph.node(pairs.inputs[0]).shape[-1:] == (1,) and n.shape == (*pairs.shape[:-2], 2 * pairs.shape[-2])
    return n.op == "Concat" and n.attrs["axis"] in (-1, len(n.shape) - 1) and len(n.inputs) == 2 \
        and n.inputs[0] == n.inputs[1]


def _keeps_halves(graph: Graph, n: Node) -> bool:
    """``n`` has equal halves on its last axis when its first input has: a view keeping that axis, a Cast, a scale,
    a Cos or Sin (kept as ONNX ops)."""
    if n.op in ("Reshape", "Expand"):
        return n.shape[-1:] == graph.node(n.inputs[0]).shape[-1:]
    if n.op == "Mul":
        return graph.node(n.inputs[1]).op == "Scalar"
    return n.op == "Cast" or (n.op == "OnnxOp" and n.attrs["op_type"] in ("Cos", "Sin"))


def _embed_layer_norm(b: Builder, node: Node, ins: list[str], types: list[TensorType]) -> str | None:
    """com.microsoft EmbedLayerNormalization (f32, ids [B, S]) when first + second are the same in every batch row,
    given per position: known terms of static shape (their sum is its position table [S, H], row s for token s), or
    at any sequence length a gather of a table's rows by Arange(0, S) plus constant rows (BERT's position and
    token-type terms with symbolic dims: the table's rows plus the constant row).  A term that gathers a table's
    rows by ids known only at run time (BERT's token_type_ids input) is its segment term; a second such term
    (RoBERTa's positions from a CumSum of the mask) its position table with position_ids.  Ids not int32 are cast
    (one launch each); its mask_index output is written and unread.  Out-of-range ids fail in it (Gather takes
    negative ones)."""
    table, ids, *_, gamma, beta = ins
    if types[0].dtype != "f32" or types[1].rank != 2:
        return None
    gathers = {k: g for k in (2, 3) if (g := _run_time_gather(b, node, ins, k)) is not None}
    position_ids, (segment_ids, segment_table) = "", next(iter(gathers.values()), ("", ""))
    terms = [k for k in (2, 3) if k not in list(gathers)[:1]]
    known = [_known(b, ins[k]) for k in terms]
    if all(t is not None for t in known) and all(isinstance(d, int) for d in node.shape):
        total = np.broadcast_to(sum(known), node.shape)
        if not (total == total[:1]).all():
            return None
        positions = b.const(np.ascontiguousarray(total[0]), types[2].dtype)
    elif len(gathers) == 2:
        position_ids, positions = gathers[3]
    else:
        rows = _position_rows(b, node, [node.inputs[k] for k in terms])
        if rows is None:
            return None
        positions = b.const(np.ascontiguousarray(rows), types[2].dtype)
    if types[1].dtype != "i32":
        ids = b.op("Cast", [ids], to=ONNX_DTYPES["i32"])
    inputs = [ids, segment_ids, table, positions, segment_table, gamma, beta, "", position_ids]
    return b.multi("EmbedLayerNormalization", inputs if position_ids else inputs[:7], (0, 1), domain=MS,
                   epsilon=node.attrs["eps"])[0]


def _run_time_gather(b: Builder, node: Node, ins: list[str], k: int) -> tuple[str, str] | None:
    """Input ``k`` of EmbedLayerNorm ``node`` when it gathers the rows of a 2-D parameter by ids [B, S] known only at
    run time: the ids (cast to int32) and the table as written; else None."""
    graph = b.graph
    if graph is None:
        return None
    n = graph.node(node.inputs[k])
    if n.op != "Embedding" or graph.node(n.inputs[0]).op != "Param":
        return None
    ids = graph.node(n.inputs[1])
    written = next((w for w in b.nodes if w.output and w.output[0] == ins[k]), None)
    if ids.op in ("Arange", "Scalar", "Constant") or ids.shape != node.shape[:-1] or written is None or \
            written.op_type != "Gather":
        return None
    table, index = written.input
    return (index if ids.dtype == "i32" else b.op("Cast", [index], to=ONNX_DTYPES["i32"])), table


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


def _position_rows(b: Builder, node: Node, terms: list[int]) -> np.ndarray | None:
    """The position table [P, H] of embedding terms of any sequence length: one term a gather of a weight's rows by
    positions 0, 1, ... (Embedding of Arange(0, S), reshaped or broadcast), the other (if any) the same row
    everywhere (an Embedding by one constant id, or a known value of one row); None for other terms."""
    graph = b.graph
    if graph is None:
        return None

    def through_views(nid: int) -> Node:
        n = graph.node(nid)
        while n.op in ("Reshape", "Expand"):
            n = graph.node(n.inputs[0])
        return n

    def weight(nid: int) -> np.ndarray | None:
        n = graph.node(nid)
        return graph.weights.get(n.name) if n.op == "Param" else n.attrs["value"] if n.op == "Constant" else None

    positional, constant = None, None
    for nid in terms:
        n = through_views(nid)
        if n.op == "Embedding" and (rows := weight(n.inputs[0])) is not None and rows.ndim == 2:
            index = through_views(n.inputs[1])
            if index.op == "Arange" and index.attrs["start"] == 0:
                positional = rows
            elif index.op == "Scalar":
                constant = rows[int(index.attrs["value"])]
            continue
        value = weight(n.id)
        if value is None or value.shape[-1] != node.shape[-1]:
            return None
        flat = value.reshape(-1, value.shape[-1])
        if not (flat == flat[:1]).all():
            return None
        constant = flat[0]
    if positional is None or (constant is None and len(terms) > 1):
        return None
    if constant is None:  # (one term: the positions alone)
        return positional
    return positional + constant if positional.shape[-1] == constant.shape[-1] else None


EXPORTS: dict[str, ExportFn] = {
    **{op: same(op) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Greater", "Less", "Equal", "Where",
                               "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Neg", "Abs", "Sqrt", "Erf", "Identity",
                               "MatMul")},
    "Recip": same("Reciprocal"),
    "Rsqrt": _rsqrt,
    "Silu": lambda b, node, ins, types: b.op("QuickGelu", ins, domain=MS, alpha=1.0),
    "Gelu": _gelu,
    "Cast": lambda b, node, ins, types: b.op("Cast", ins, to=ONNX_DTYPES[node.dtype]),
    "Softmax": _with_axis("Softmax"),
    "LogSoftmax": _with_axis("LogSoftmax"),
    "ReduceSum": _reduce("ReduceSum"),
    "ReduceMean": _reduce("ReduceMean"),
    "SumAll": _reduce_all("ReduceSum"),
    "MeanAll": _reduce_all("ReduceMean"),
    "SumRows": _sum_rows,
    "MatMulAT": _matmul_at,
    "MatMulBT": _matmul_bt,
    "LayerNorm": _layer_norm,
    "RmsNorm": _rms_norm,
    "Reshape": lambda b, node, ins, types: b.reshape(ins[0], node.attrs["shape"]),
    "Transpose": lambda b, node, ins, types: b.transpose(ins[0], node.attrs["perm"]),
    "Narrow": _narrow,
    "Concat": _with_axis("Concat"),
    "Expand": lambda b, node, ins, types: b.op("Expand", [ins[0], b.ints(node.attrs["shape"])]),
    "Embedding": lambda b, node, ins, types: b.op("Gather", ins, axis=0),
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
    # fused ops onnxruntime runs as one kernel (Gemm, SkipLayerNormalization, Attention, ...)
    "FusedMatMulAdd": _matmul_add(0, 0),
    "FusedMatMulATAdd": _matmul_add(1, 0),
    "FusedMatMulBTAdd": _matmul_add(0, 1),
    "FusedMatMulBiasAct": _bias_act,
    "FusedResidualLN": _skip_norm("SkipLayerNormalization", beta_after=False),
    "FusedResidualRmsNorm": _skip_norm("SkipSimplifiedLayerNormalization", beta_after=True),
    "FusedAddLayerNorm": _skip_norm("SkipLayerNormalization", beta_after=False),
    "FusedAddRmsNorm": _skip_norm("SkipSimplifiedLayerNormalization", beta_after=True),
    "FusedAttentionBlock": _attention_block,
    "CausalAttention": _causal_attention,
    "BiasedAttention": _biased_attention,
    "QkvAttention": _qkv_attention,
    "MultiHeadAttention": _multi_head_attention,
    "KvCacheAttention": _kv_cache_attention,
    "GroupQueryAttention": _group_query_attention,
    "RotaryEmbedding": _rotary,
    "EmbedLayerNorm": _embed_layer_norm,
    "FusedConv": _fused_conv,
    # leaves made of dims, computed at run time from the inputs' shapes (static ones are initializers)
    "Arange": _arange,
    "CausalMask": _causal_mask,
    "DimValues": _dim_values,
}


def declared(export: OnnxExport) -> ExportFn:
    """The entry of an op that declares its ONNX export as data (:attr:`OpSpec.onnx`): one node on its inputs."""
    return lambda b, node, ins, types: b.op(export.op_type, ins, domain=export.domain, **export.attributes(node.attrs))


EXPORTS.update({name: declared(spec.onnx) for name, spec in REGISTRY.items() if spec.onnx is not None})


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


__all__ = ["EXPORTS", "MIR_FORMS", "MS", "ExportFn", "declared", "sdpa"]
