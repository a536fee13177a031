"""A decoding step's attention with a KV cache (rules/decode.egg)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..dims import symbols_of
from ..export import MS, OnnxWriter
from ..registry import (
    Attrs,
    AttrSpec,
    AttrType,
    Kind,
    OpSpec,
    ShapeError,
    Shapes,
    TensorType,
    TupleType,
    ValueType,
    at_least_one,
    pick,
    positive,
    random_shape,
    register,
)
from ..shapes import broadcast, require_rank
from .attention import biased_attention_infer, biased_attention_kernel, halves_alike, rotary_infer, rotate_half
from .onnx_op import ONNX_DTYPES
from .primitives import (
    concat_infer,
)

if TYPE_CHECKING:
    from ..export import ExportBuilder
    from ..graph import Graph, Node

T = TensorType
INT, F, B = AttrType.INT, AttrType.FLOAT, AttrType.BOOL
_SCALE = AttrSpec("scale", F, check=positive)


def _kv_cache_attention_infer(a: Attrs, ins: list[ValueType]) -> TupleType:
    """(context [B, H, S, Dv], present key [B, KV, P + S, D], present value [B, KV, P + S, Dv])."""
    q, k, v, past_k, past_v, bias = ins
    for label, new, past in (("key", k, past_k), ("value", v, past_v)):
        require_rank(new, 4, f"KvCacheAttention new {label} ([B, KV, S, D])")
        require_rank(past, 4, f"KvCacheAttention past {label} ([B, KV, P, D])")
        if past.dtype != new.dtype or past.shape[:2] != new.shape[:2] or past.shape[3] != new.shape[3]:
            raise ShapeError(f"KvCacheAttention past {label} {list(past.shape)} {past.dtype} and new {label} "
                             f"{list(new.shape)} {new.dtype} must agree but for the sequence axis")
    present_k = concat_infer({"axis": 2}, [past_k, k])
    present_v = concat_infer({"axis": 2}, [past_v, v])
    out = biased_attention_infer(a, [q, present_k, present_v, bias])
    return TupleType((out, present_k, present_v))


def _kv_cache_attention_kernel(a: Attrs, q: np.ndarray, k: np.ndarray, v: np.ndarray, past_k: np.ndarray,
                               past_v: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, ...]:
    present_k, present_v = np.concatenate([past_k, k], axis=2), np.concatenate([past_v, v], axis=2)
    return biased_attention_kernel(a, q, present_k, present_v, bias), present_k, present_v


def _kv_cache_attention_decompose(g: Graph, ins: list[int], a: Attrs) -> tuple[int, int, int]:
    """Concat(past, new) on the sequence axis for K and V, then BiasedAttention over them."""
    q, k, v, past_k, past_v, bias = ins
    present_k, present_v = g.concat([past_k, k], axis=2), g.concat([past_v, v], axis=2)
    return g.biased_attention(q, present_k, present_v, bias, **a), present_k, present_v


def _kv_cache_attention_flops(a: Attrs, ins: list[ValueType], out: ValueType) -> int:
    q, k, past_k = ins[0], ins[1], ins[3]
    return 4 * q.numel * (k.shape[2] + past_k.shape[2])


def _kv_cache_attention_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """q [B, KV * (1 to 3), S, D], new k and v [B, KV, S, D], past [B, KV, P, D]; bias [B, 1, 1, P + S],
    [B, 1, S, P + S] or [B, H, S, P + S]."""
    b, kv_heads, rep = random_shape(rng, 3, 3, high=3)
    s, d, past = random_shape(rng, 3, 3)
    h, total = kv_heads * rep, past + s
    bias = pick(rng, [(b, 1, 1, total), (b, 1, s, total), (b, h, s, total)])
    return {"q": (b, h, s, d), "k": (b, kv_heads, s, d), "v": (b, kv_heads, s, d), "past_k": (b, kv_heads, past, d),
            "past_v": (b, kv_heads, past, d), "bias": bias}, {"scale": d**-0.5, "nan_to_zero": bool(rng.integers(2))}


def _gqa_heads(a: Attrs, ins: list[ValueType]) -> tuple[T, T, T]:
    """The split heads [B, H, S, D] of GroupQueryAttention's q, k and v [B, S, heads * D] (checked)."""
    q, k, v = ins[:3]
    for label, t, heads in (("q", q, a["heads"]), ("k", k, a["kv_heads"]), ("v", v, a["kv_heads"])):
        require_rank(t, 3, f"GroupQueryAttention {label} ([B, S, heads * D])")
        if not isinstance(t.shape[2], int) or t.shape[2] % heads:
            raise ShapeError(f"GroupQueryAttention {label} width {t.shape[2]} is not divisible by {heads} heads")
    if q.shape[1] != 1 or k.shape[:2] != q.shape[:2] or v.shape != k.shape:
        raise ShapeError(f"GroupQueryAttention takes one new token: q {list(q.shape)}, k {list(k.shape)} and v "
                         f"{list(v.shape)} must be [B, 1, width] with k and v alike")
    if a["heads"] % a["kv_heads"] or q.shape[2] // a["heads"] != k.shape[2] // a["kv_heads"]:
        raise ShapeError(f"GroupQueryAttention heads={a['heads']} must be a multiple of kv_heads={a['kv_heads']}, "
                         "with one head width")

    def split(t: T, heads: int) -> T:
        return T((t.shape[0], heads, t.shape[1], t.shape[2] // heads), t.dtype)

    return split(q, a["heads"]), split(k, a["kv_heads"]), split(v, a["kv_heads"])


def _gqa_infer(a: Attrs, ins: list[ValueType]) -> TupleType:
    """(context [B, 1, heads * D], present key [B, KV, P + 1, D], present value [B, KV, P + 1, D])."""
    q4, k4, v4 = _gqa_heads(a, ins)
    tables = ins[6:]
    if len(tables) == 1:
        raise ShapeError("GroupQueryAttention takes both rotary tables (cos and sin) or neither")
    if tables:
        rotary_infer({}, [q4, *tables])
        rotary_infer({}, [k4, *tables])
    _, present_k, present_v = _kv_cache_attention_infer(a, [q4, k4, v4, *ins[3:6]]).parts
    return TupleType((ins[0], present_k, present_v))


def _gqa_kernel(a: Attrs, q: np.ndarray, k: np.ndarray, v: np.ndarray, past_k: np.ndarray, past_v: np.ndarray,
                bias: np.ndarray, cos: np.ndarray | None = None,
                sin: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    def split(t: np.ndarray, heads: int) -> np.ndarray:
        b, s, width = t.shape
        return t.reshape(b, s, heads, width // heads).transpose(0, 2, 1, 3)

    q4, k4, v4 = split(q, a["heads"]), split(k, a["kv_heads"]), split(v, a["kv_heads"])
    if cos is not None:
        q4, k4 = (x * cos + rotate_half(x) * sin for x in (q4, k4))
    ctx, present_k, present_v = _kv_cache_attention_kernel(a, q4, k4, v4, past_k, past_v, bias)
    return ctx.transpose(0, 2, 1, 3).reshape(q.shape), present_k, present_v


def _gqa_decompose(g: Graph, ins: list[int], a: Attrs) -> tuple[int, int, int]:
    """Split q, k and v into heads (Reshape, Transpose 0 2 1 3), RotaryEmbedding of q and k, KvCacheAttention, its
    context merged back (Transpose, Reshape)."""
    q, k, v, past_k, past_v, bias, *tables = ins

    def split(t: int, heads: int) -> int:
        b, s, width = g.node(t).shape
        return g.transpose(g.reshape(t, shape=(b, s, heads, width // heads)), perm=(0, 2, 1, 3))

    q4, k4, v4 = split(q, a["heads"]), split(k, a["kv_heads"]), split(v, a["kv_heads"])
    if tables:
        q4, k4 = g.rotary_embedding(q4, *tables), g.rotary_embedding(k4, *tables)
    step = g.kv_cache_attention(q4, k4, v4, past_k, past_v, bias, scale=a["scale"], nan_to_zero=a["nan_to_zero"])
    ctx = g.transpose(g.get(step, index=0), perm=(0, 2, 1, 3))
    return g.reshape(ctx, shape=g.node(q).shape), g.get(step, index=1), g.get(step, index=2)


def _gqa_flops(a: Attrs, ins: list[ValueType], out: ValueType) -> int:
    return 4 * ins[0].numel * (ins[3].shape[2] + 1)


def _gqa_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """q [B, 1, H * D], k and v [B, 1, KV * D], past [B, KV, P, D], bias [B, 1, 1, P + 1], rotary tables
    [1 or B, 1, 1, D] or none."""
    b, kv_heads, rep = random_shape(rng, 3, 3, high=3)
    d, past = 2 * int(rng.integers(1, 4)), int(rng.integers(1, 6))
    h = kv_heads * rep
    shapes = {"q": (b, 1, h * d), "k": (b, 1, kv_heads * d), "v": (b, 1, kv_heads * d),
              "past_k": (b, kv_heads, past, d), "past_v": (b, kv_heads, past, d), "bias": (b, 1, 1, past + 1)}
    if rng.integers(2):
        table = pick(rng, [(1, 1, 1, d), (b, 1, 1, d)])
        shapes |= {"cos": table, "sin": table}
    return shapes, {"heads": h, "kv_heads": kv_heads, "scale": d**-0.5, "nan_to_zero": bool(rng.integers(2))}


# --- ONNX exports (written against ExportBuilder, which the ONNX exporter's builder implements) ---


def _kv_cache_attention(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> tuple[str, ...]:
    """Attention (opset 23) with past_key and past_value: the context and the present key and value (the
    Concats of past and new on the sequence axis) in one kernel, the bias its additive attn_mask expanded to
    [..., S, P + S]."""
    q, k, v, past_k, past_v, bias = ins
    scores = (types[0].shape[2], types[3].shape[2] + types[1].shape[2])
    if types[5].shape[-2:] != scores:
        bias = b.op("Expand", [bias, b.ints(broadcast(types[5].shape, scores))])
    return tuple(b.multi("Attention", [q, k, v, bias, past_k, past_v], (0, 1, 2), scale=node.attrs["scale"]))


def _group_query_attention(b: ExportBuilder, node: Node, ins: list[str],
                           types: list[TensorType]) -> tuple[str, ...] | None:
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


def _decoding_inputs(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType],
                     half: int) -> tuple[str, str, list[str]] | None:
    """GroupQueryAttention's seqlens_k, total_sequence_length and rotary caches at static shapes, the tables known
    initializers (None otherwise)."""
    batch, past = types[0].shape[0], types[3].shape[2]
    caches = []
    for name in ins[6:]:
        table = b.known(name)
        if table is None:
            return None
        full = np.broadcast_to(table, (batch, 1, 1, 2 * half))
        if not (np.array_equal(full[..., :half], full[..., half:]) and (full == full[:1]).all()):
            return None
        cache = np.zeros((past + 1, half), table.dtype)
        cache[past] = full[0, 0, 0, :half]
        caches.append(b.const(cache, types[6].dtype))
    return b.const(np.full((batch,), past, np.int32)), b.const(np.array(past + 1, np.int32)), caches


def _decoding_inputs_at_run_time(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType],
                                 half: int) -> tuple[str, str, list[str]] | None:
    """GroupQueryAttention's seqlens_k, total_sequence_length and rotary caches computed at run time (symbolic
    dims), once for every layer that reads them; None for a table that is known or not of the form taken."""
    batch, past = types[0].shape[0], types[3].shape[2]
    caches = []
    for name, nid, t in zip(ins[6:], node.inputs[6:], types[6:], strict=True):
        if b.known(name) is not None or t.shape[:3] != (1, 1, 1) or not halves_alike(b, nid):
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


DECODE = [
    OpSpec("KvCacheAttention", Kind.FUSED, ("q", "k", "v", "past_k", "past_v", "bias"), _kv_cache_attention_infer,
           _kv_cache_attention_kernel, (_SCALE, AttrSpec("nan_to_zero", B, False)),
           flops=_kv_cache_attention_flops,
           doc="A decoding step's attention with a KV cache: the present keys and values Concat(past, new) on the "
               "sequence axis, and BiasedAttention of q over them; results (context, present key, present value).",
           decompose=_kv_cache_attention_decompose, sampler=_kv_cache_attention_sample,
           results=("context", "present_key", "present_value"),
           onnx=OnnxWriter("Attention (opset 23) with past_key / past_value and the present outputs",
                           _kv_cache_attention)),
    OpSpec("GroupQueryAttention", Kind.FUSED, ("q", "k", "v", "past_k", "past_v", "bias", "cos?", "sin?"),
           _gqa_infer, _gqa_kernel, (AttrSpec("heads", INT, check=at_least_one),
                                     AttrSpec("kv_heads", INT, check=at_least_one), _SCALE,
                                     AttrSpec("nan_to_zero", B, False)), flops=_gqa_flops,
           doc="A decoding step's attention on merged heads: q [B, 1, heads * D], k and v [B, 1, kv_heads * D] split "
               "into heads, q and k rotated by the tables (RotaryEmbedding) when given, KvCacheAttention over the "
               "cache, the context merged back to [B, 1, heads * D]; results (context, present key, present "
               "value) (onnxruntime's com.microsoft GroupQueryAttention).",
           decompose=_gqa_decompose, sampler=_gqa_sample, results=("context", "present_key", "present_value"),
           onnx=OnnxWriter("com.microsoft GroupQueryAttention (past / present, attention_bias, do_rotary)",
                           _group_query_attention)),
]
register(*DECODE)
