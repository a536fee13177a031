"""Fused ops (the catalogue: docs/fusions.md).

Each op's ``decompose`` builds the subgraph its rule recognises (the rule's
left side, which may name other fused ops), and its kernel computes exactly
what that subgraph computes; tests/test_decompositions.py proves it on random
samples drawn by each op's ``sampler``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..registry import (
    REGISTRY,
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
    non_negative,
    op_spec,
    pick,
    positive,
    random_shape,
    register,
    short_repr,
)
from ..shapes import broadcast, matmul_shape, norm_param_check, require_rank, same_dtype
from . import reference as K
from .primitives import (
    attention_flops,
    causal_canonical,
    concat_infer,
    group_of_one,
    matmul_flops,
    norm_infer,
    norm_sampler,
    normalized_one,
    rope_degenerate,
    split_heads_degenerate,
)

if TYPE_CHECKING:
    from ..graph import Graph

T = TensorType
INT, F, B, S = AttrType.INT, AttrType.FLOAT, AttrType.BOOL, AttrType.STR

_EPS = AttrSpec("eps", F, 1e-5, check=positive)
_AXIS = AttrSpec("axis", INT, -1)
_SCALE = AttrSpec("scale", F, check=positive)
EPILOGUES = ("none", "gelu", "gelu_tanh", "silu")


def _matmul_add(name: str, k_a: int, k_b: int) -> OpSpec:
    primitive = name.removeprefix("Fused").removesuffix("Add")
    mm = op_spec(primitive).kernel

    def infer(a: Attrs, ins: list[T]) -> T:
        dt = same_dtype(ins, f"{name} operands")
        return T(broadcast(matmul_shape(ins[0].shape, ins[1].shape, k_a, k_b, name), ins[2].shape), dt)

    def sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
        """Batched a and b (b batched or not); d full [..., M, N] or broadcast from a row, column or scalar."""
        m, k, n = random_shape(rng, 3, 3)
        batch = random_shape(rng, 0, 2)
        a = (*batch, k, m) if k_a == -2 else (*batch, m, k)
        b_batch = pick(rng, [(), batch[-1:]])
        b = (*b_batch, n, k) if k_b == -1 else (*b_batch, k, n)
        return {"a": a, "b": b, "d": pick(rng, [(*batch, m, n), (n,), (m, 1), ()])}, {}

    return OpSpec(name, Kind.FUSED, ("a", "b", "d"), infer, lambda at, x, w, d: mm(at, x, w) + d,
                  flops=matmul_flops, doc=f"{primitive}(a, b) + d in one kernel.",
                  decompose=lambda g, ins, a: g.add(g.add_node(primitive, ins[:2]), ins[2]), sampler=sample)


def _bias_act_infer(a: Attrs, ins: list[T]) -> T:
    x, w, bias = ins
    dt = same_dtype(ins, "FusedMatMulBiasAct operands")
    if bias.rank > 1:
        raise ShapeError(f"bias must have rank <= 1, got {list(bias.shape)}")
    return T(broadcast(matmul_shape(x.shape, w.shape, -1, -2, "FusedMatMulBiasAct"), bias.shape), dt)


# The epilogue op of each act of FusedMatMulBiasAct and FusedTransformerLayer ("none": no op).
EPILOGUE_OPS: dict[str, tuple[str, dict[str, str]]] = {
    "gelu": ("Gelu", {"approximate": "none"}), "gelu_tanh": ("Gelu", {"approximate": "tanh"}), "silu": ("Silu", {}),
}


def _bias_act_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """Add(MatMul(x, w), bias), then the epilogue op."""
    x, w, bias = ins
    out = g.add(g.matmul(x, w), bias)
    if a["act"] == "none":
        return out
    op, attrs = EPILOGUE_OPS[a["act"]]
    return g.add_node(op, [out], **attrs)


def _bias_act_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x [M, K] or [B, M, K], w [K, N], a bias [N], [1] or []."""
    m, k, n = random_shape(rng, 3, 3)
    return {"x": (*random_shape(rng, 0, 1), m, k), "w": (k, n), "bias": pick(rng, [(n,), (1,), ()])}, {}


def _add_norm(name: str, norm: str, params: tuple[str, ...], eps: float, doc: str) -> OpSpec:
    """``(norm(x + residual), x + residual)``: the residual+norm of a pre-norm block, whose sum the next
    residual reads, as one kernel with two results (onnxruntime's Skip[Simplified]LayerNormalization)."""
    residual_infer = norm_infer(name, tuple(p.rstrip("?") for p in params), residual=True)
    norm_spec = op_spec(norm)

    def infer(a: Attrs, ins: list[ValueType]) -> TupleType:
        out = residual_infer(a, ins)
        return TupleType((out, out))

    def kernel(a: Attrs, x: np.ndarray, r: np.ndarray, *params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        total = x + r
        return norm_spec.kernel(a, total, *params), total

    def decompose(g: Graph, ins: list[int], a: Attrs) -> tuple[int, int]:
        total = g.add(ins[0], ins[1])
        return g.add_node(norm, [total, *ins[2:]], **a), total

    def flops(a: Attrs, ins: list[ValueType], out: ValueType) -> int:
        return ins[0].numel + norm_spec.flops(a, [ins[0], *ins[2:]], ins[0])

    return OpSpec(name, Kind.FUSED, ("x", "residual", *params), infer, kernel,
                  (_AXIS, AttrSpec("eps", F, eps, check=positive)), flops=flops, doc=doc, decompose=decompose,
                  sampler=norm_sampler(params, residual=True), results=("norm", "sum"),
                  degenerate=norm_spec.degenerate)


def _rms_matmul_infer(a: Attrs, ins: list[T]) -> T:
    x, w_norm, w_proj = ins
    norm_param_check(x, w_norm, a["axis"], "FusedRmsNormMatMul w_norm")
    return T(matmul_shape(x.shape, w_proj.shape, -1, -2, "FusedRmsNormMatMul"), same_dtype(ins, "operands"))


def _causal_rope_degenerate(a: Attrs, ins: list[T]) -> str | None:
    return rope_degenerate(ins[0]) or split_heads_degenerate(ins[0], ins[1])


def _causal_rope_infer(a: Attrs, ins: list[T]) -> T:
    out = op_spec("CausalAttention").infer(a, ins)
    if ins[0].shape[-1] % 2:
        raise ShapeError(f"RoPE needs an even head dim, got {ins[0].shape[-1]}")
    return out


def _causal_rope_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """q [B, kv_heads * (1 to 3), S, D even], k [B, kv_heads, S, D], v [B, kv_heads, S, Dv]; S >= 2 and D >= 4,
    where theta matters."""
    batch, kv_heads, rep = random_shape(rng, 3, 3, high=3)
    seq, dv, half = random_shape(rng, 3, 3)
    seq, half = max(seq, 2), max(half, 2)
    return {"q": (batch, kv_heads * rep, seq, 2 * half), "k": (batch, kv_heads, seq, 2 * half),
            "v": (batch, kv_heads, seq, dv)}, {}


def _group_norm_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x [N, groups * (1 to 3), spatial...] with 1 or 2 spatial dims; w and b [C]."""
    groups, per = random_shape(rng, 2, 2, high=3)
    c = groups * per
    return {"x": (*random_shape(rng, 1, 1, high=2), c, *random_shape(rng, 1, 2)), "w": (c,), "b": (c,)}, \
        {"groups": groups}


def _rms_matmul_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """A norm's x and w_norm, and w_proj [H, 1 to 5]."""
    shapes, attrs = norm_sampler(("w_norm",))(rng)
    return shapes | {"w_proj": (shapes["x"][-1], *random_shape(rng, 1, 1))}, attrs


def _rms_matmul_flops(a: Attrs, ins: list[T], out: T) -> int:
    """The projection's matmul plus the norm's few passes over x."""
    return 2 * out.numel * ins[0].shape[-1] + 4 * ins[0].numel


def _swiglu_infer(a: Attrs, ins: list[T]) -> T:
    if ins[0].shape != ins[1].shape:
        raise ShapeError(f"SwiGLU gate {list(ins[0].shape)} and up {list(ins[1].shape)} differ")
    return T(ins[0].shape, same_dtype(ins, "SwiGLU operands"))


# FusedSwiGLU's output cast (the design's cast_to): "none", or the float dtype its epilogue writes.
SWIGLU_CASTS = ("none", "f32", "f16", "bf16")


def _fused_swiglu_infer(a: Attrs, ins: list[T]) -> T:
    cat = ins[0]
    if cat.rank < 1 or cat.shape[-1] % 2:
        raise ShapeError(f"FusedSwiGLU input must have an even last dim, got {list(cat.shape)}")
    return T((*cat.shape[:-1], cat.shape[-1] // 2), cat.dtype if a["cast_to"] == "none" else a["cast_to"])


def _fused_swiglu_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """SwiGLU(gate, up) of the two Narrow halves of cat, then Cast to ``cast_to``."""
    n = g.node(ins[0]).shape[-1] // 2
    first = g.narrow(ins[0], axis=-1, start=0, length=n)
    second = g.narrow(ins[0], axis=-1, start=n, length=n)
    out = g.swiglu(first, second) if a["gate_first"] else g.swiglu(second, first)
    return out if a["cast_to"] == "none" else g.cast(out, dtype=a["cast_to"])


def _attention_block_infer(a: Attrs, ins: list[T]) -> T:
    hidden, qkv_w, out_w, mask, qkv_b, out_b = ins
    require_rank(hidden, 3, "FusedAttentionBlock hidden ([B, S, H])")
    h = hidden.shape[-1]
    expected = {"qkv_w": (h, 3 * h), "out_w": (h, h), "mask": hidden.shape[:2], "qkv_b": (3 * h,), "out_b": (h,)}
    for label, t in zip(expected, (qkv_w, out_w, mask, qkv_b, out_b), strict=True):
        if t.shape != expected[label]:
            raise ShapeError(f"FusedAttentionBlock {label} must be {list(expected[label])}, got {list(t.shape)}")
    same_dtype(ins, "FusedAttentionBlock inputs")
    if a["heads"] < 1 or h % a["heads"]:
        raise ShapeError(f"hidden width {h} is not divisible by heads={a['heads']}")
    return hidden


def _attention_block_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """QKV matmul+bias, Narrows at 0, h, 2h, Attention with the custom mask, output matmul+bias."""
    hidden, qkv_w, out_w, mask, qkv_b, out_b = ins
    h = g.node(hidden).shape[-1]
    qkv = g.fused_matmul_bias_act(hidden, qkv_w, qkv_b, act="none")
    q, k, v = (g.narrow(qkv, axis=-1, start=j * h, length=h) for j in range(3))
    ctx = g.attention(q, k, v, mask, heads=a["heads"], kv_heads=a["heads"], mask="custom", scale=a["scale"])
    return g.fused_matmul_bias_act(ctx, out_w, out_b, act="none")


def _attention_block_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """hidden [B, S, heads*head_dim], its weights and a [B, S] key mask; scale 1/sqrt(head_dim) or random."""
    b, heads = random_shape(rng, 2, 2, high=3)
    s, head_dim = random_shape(rng, 2, 2)
    h = heads * head_dim
    shapes = {"hidden": (b, s, h), "qkv_w": (h, 3 * h), "out_w": (h, h), "mask": (b, s), "qkv_b": (3 * h,),
              "out_b": (h,)}
    return shapes, {"heads": heads, "scale": pick(rng, [head_dim**-0.5, float(rng.uniform(0.1, 1.0))])}


def _transformer_layer_infer(a: Attrs, ins: list[T]) -> T:
    hidden, qkv_w, qkv_b, out_w, out_b, ln1_g, ln1_b, fc1_w, fc1_b, fc2_w, fc2_b, ln2_g, ln2_b, mask = ins
    _attention_block_infer(a, [hidden, qkv_w, out_w, mask, qkv_b, out_b])
    h = hidden.shape[-1]
    inner = fc1_w.shape[-1]
    expected = {"ln1_g": (h,), "ln1_b": (h,), "fc1_w": (h, inner), "fc1_b": (inner,), "fc2_w": (inner, h),
                "fc2_b": (h,), "ln2_g": (h,), "ln2_b": (h,)}
    for label, t in zip(expected, (ln1_g, ln1_b, fc1_w, fc1_b, fc2_w, fc2_b, ln2_g, ln2_b), strict=True):
        if t.shape != expected[label]:
            raise ShapeError(f"FusedTransformerLayer {label} must be {list(expected[label])}, got {list(t.shape)}")
    return hidden


def _transformer_layer_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """Attention block, residual LayerNorm, FFN (matmul+bias+act, matmul+bias), residual LayerNorm."""
    hidden, qkv_w, qkv_b, out_w, out_b, ln1_g, ln1_b, fc1_w, fc1_b, fc2_w, fc2_b, ln2_g, ln2_b, mask = ins
    attn = g.fused_attention_block(hidden, qkv_w, out_w, mask, qkv_b, out_b, heads=a["heads"], scale=a["scale"])
    h1 = g.fused_residual_ln(attn, hidden, ln1_g, ln1_b, axis=-1, eps=a["eps1"])
    inner = g.fused_matmul_bias_act(h1, fc1_w, fc1_b, act=a["act"])
    ffn = g.fused_matmul_bias_act(inner, fc2_w, fc2_b, act="none")
    return g.fused_residual_ln(ffn, h1, ln2_g, ln2_b, axis=-1, eps=a["eps2"])


def _transformer_layer_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """An attention block's inputs plus the LayerNorm and FFN weights (inner width 1 to 8)."""
    shapes, attrs = _attention_block_sample(rng)
    h, inner = shapes["hidden"][-1], int(rng.integers(1, 9))
    shapes |= {"ln1_g": (h,), "ln1_b": (h,), "fc1_w": (h, inner), "fc1_b": (inner,), "fc2_w": (inner, h),
               "fc2_b": (h,), "ln2_g": (h,), "ln2_b": (h,)}
    return shapes, attrs


def _transformer_layer_flops(a: Attrs, ins: list[T], out: T) -> int:
    h, inner = ins[0].shape[-1], ins[7].shape[-1]
    tokens = ins[0].numel // h
    return 2 * tokens * h * (4 * h + 2 * inner) + 4 * out.numel * ins[0].shape[1]


def repeat_kv(g: Graph, t: int, heads: int) -> int:
    """K or V [B, KV, S, D] with each head repeated heads/KV times, as transformers' repeat_kv exports it:
    Reshape to [B, KV, 1, S, D], Expand to [B, KV, heads/KV, S, D], Reshape to [B, heads, S, D]."""
    b, kv_heads, *rest = g.node(t).shape
    if kv_heads == heads:
        return t
    wide = g.expand(g.reshape(t, shape=(b, kv_heads, 1, *rest)), shape=(b, kv_heads, heads // kv_heads, *rest))
    return g.reshape(wide, shape=(b, heads, *rest))


def _biased_attention_infer(a: Attrs, ins: list[T]) -> T:
    q, k, v, bias = ins
    out = op_spec("CausalAttention").infer(a, [q, k, v])
    scores = (*q.shape[:3], k.shape[2])
    if bias.dtype != q.dtype or len(bias.shape) > 4 or broadcast(bias.shape, scores) != scores:
        raise ShapeError(f"BiasedAttention bias {list(bias.shape)} {bias.dtype} must be {q.dtype} and broadcast to "
                         f"the scores {list(scores)}")
    return out


def _biased_attention_kernel(a: Attrs, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                             bias: np.ndarray) -> np.ndarray:
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    p = K.softmax(np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(a["scale"], q.dtype) + bias, -1)
    return np.matmul(np.where(np.isnan(p), 0, p) if a["nan_to_zero"] else p, v)


def _biased_attention_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """MatMul(q, k^T) * scale + bias, Softmax, (NaN rows to 0: Where(p == p, p, 0)), @ v; GQA by repeat_kv."""
    q, k, v, bias = ins
    heads, dt = g.node(q).shape[1], g.node(q).dtype
    k, v = repeat_kv(g, k, heads), repeat_kv(g, v, heads)
    scores = g.mul(g.matmul(q, g.transpose(k, perm=(0, 1, 3, 2))), g.scalar(a["scale"], dt))
    p = g.softmax(g.add(scores, bias), axis=-1)
    if a["nan_to_zero"]:
        p = g.where(g.equal(p, p), p, g.scalar(0.0, dt))
    return g.matmul(p, v)


def _biased_attention_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """q [B, KV * (1 to 3), S, D], k and v [B, KV, S, D]; bias [B, 1, 1, S], [B, 1, S, S], [S, S] or [B, H, S, S]."""
    b, kv_heads, rep = random_shape(rng, 3, 3, high=3)
    s, d = random_shape(rng, 2, 2)
    h = kv_heads * rep
    bias = pick(rng, [(b, 1, 1, s), (b, 1, s, s), (s, s), (b, h, s, s)])
    return {"q": (b, h, s, d), "k": (b, kv_heads, s, d), "v": (b, kv_heads, s, d), "bias": bias}, \
        {"scale": pick(rng, [d**-0.5, float(rng.uniform(0.1, 1.0))])}


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
    out = _biased_attention_infer(a, [q, present_k, present_v, bias])
    return TupleType((out, present_k, present_v))


def _kv_cache_attention_kernel(a: Attrs, q: np.ndarray, k: np.ndarray, v: np.ndarray, past_k: np.ndarray,
                               past_v: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, ...]:
    present_k, present_v = np.concatenate([past_k, k], axis=2), np.concatenate([past_v, v], axis=2)
    return _biased_attention_kernel(a, q, present_k, present_v, bias), present_k, present_v


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
        _rotary_infer({}, [q4, *tables])
        _rotary_infer({}, [k4, *tables])
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


def _qkv_attention_infer(a: Attrs, ins: list[T]) -> T:
    x, w, b, *bias = ins
    require_rank(x, 3, "QkvAttention x ([B, S, E_in])")
    same_dtype(ins, "QkvAttention inputs")
    width = w.shape[-1] if w.rank == 2 else 0
    if w.shape != (x.shape[-1], width) or width % 3 or b.shape != (width,):
        raise ShapeError(f"QkvAttention w {list(w.shape)} and b {list(b.shape)} must be [{x.shape[-1]}, 3E] and [3E]")
    e, heads = width // 3, a["heads"]
    if e % heads:
        raise ShapeError(f"QkvAttention width {e} is not divisible by heads={heads}")
    if bias and a["causal"]:
        raise ShapeError("QkvAttention takes an additive bias or causal=True, not both")
    batch, seq = x.shape[:2]
    if bias and (bias[0].rank != 4 or bias[0].shape[3] != seq or bias[0].shape[0] not in (1, batch)
                 or bias[0].shape[1] not in (1, heads) or bias[0].shape[2] not in (1, seq)):
        raise ShapeError(f"QkvAttention bias {list(bias[0].shape)} must be [{batch} or 1, {heads} or 1, {seq} or 1, "
                         f"{seq}]")
    return TensorType((batch, seq, heads, e // heads), x.dtype)


def _qkv_heads(g: Graph, qkv: int, heads: int) -> list[int]:
    """Q, K and V [B, heads, S, D]: the thirds of the packed projection [B, S, 3E], split into heads."""
    batch, seq, width = g.node(qkv).shape
    e = width // 3
    return [g.transpose(g.reshape(g.narrow(qkv, axis=-1, start=j * e, length=e), shape=(batch, seq, heads, e // heads)),
                        perm=(0, 2, 1, 3)) for j in range(3)]


def _qkv_attention_kernel(a: Attrs, x: np.ndarray, w: np.ndarray, b: np.ndarray,
                          bias: np.ndarray | None = None) -> np.ndarray:
    batch, seq = x.shape[:2]
    q, k, v = (t.reshape(batch, seq, a["heads"], -1).transpose(0, 2, 1, 3)
               for t in np.split(np.matmul(x, w) + b, 3, axis=-1))
    if bias is None:
        ctx = K.sdpa(q, k, v, a["scale"], causal=a["causal"])
    else:
        ctx = _biased_attention_kernel({"scale": a["scale"], "nan_to_zero": False}, q, k, v, bias)
    return ctx.transpose(0, 2, 1, 3)


def _qkv_attention_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """x @ w + b, its thirds split into heads, BiasedAttention, CausalAttention or Softmax(q @ k^T * scale) @ v,
    transposed back."""
    x, w, b, *bias = ins
    q, k, v = _qkv_heads(g, g.fused_matmul_bias_act(x, w, b, act="none"), a["heads"])
    if bias:
        ctx = g.biased_attention(q, k, v, bias[0], scale=a["scale"], nan_to_zero=False)
    elif a["causal"]:
        ctx = g.causal_attention(q, k, v, scale=a["scale"])
    else:
        scores = g.mul(g.matmul(q, g.transpose(k, perm=(0, 1, 3, 2))), g.scalar(a["scale"], g.node(x).dtype))
        ctx = g.matmul(g.softmax(scores, axis=-1), v)
    return g.transpose(ctx, perm=(0, 2, 1, 3))


def _qkv_attention_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x [B, S, E_in], w [E_in, 3 * heads * D]; a bias [B or 1, heads or 1, S or 1, S], causal, or neither."""
    batch, heads = random_shape(rng, 2, 2, high=3)
    seq, d, e_in = random_shape(rng, 3, 3)
    width = 3 * heads * d
    shapes = {"x": (batch, seq, e_in), "w": (e_in, width), "b": (width,)}
    mask = pick(rng, ["bias", "causal", "none"])
    causal = mask == "causal"
    if mask == "bias":
        shapes["bias"] = (pick(rng, [1, batch]), pick(rng, [1, heads]), pick(rng, [1, seq]), seq)
    return shapes, {"heads": heads, "causal": causal, "scale": pick(rng, [d**-0.5, float(rng.uniform(0.1, 1.0))])}


def _qkv_attention_flops(a: Attrs, ins: list[T], out: T) -> int:
    x, w = ins[0], ins[1]
    return 2 * x.numel * w.shape[-1] + 4 * out.numel * x.shape[1]


def _rotary_infer(a: Attrs, ins: list[T]) -> T:
    x, cos, sin = ins
    same_dtype(ins, "RotaryEmbedding operands")
    if x.rank < 1 or x.shape[-1] % 2:
        raise ShapeError(f"RotaryEmbedding needs an even last dim, got {list(x.shape)}")
    for label, t in (("cos", cos), ("sin", sin)):
        if broadcast(x.shape, t.shape) != x.shape:
            raise ShapeError(f"RotaryEmbedding {label} {list(t.shape)} must broadcast to x {list(x.shape)}")
    return x


def rotate_half(x: np.ndarray) -> np.ndarray:
    """[-x2, x1] for x = [x1, x2] split in halves along the last axis."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotary_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """x * cos + Concat(-x2, x1) * sin, as transformers' apply_rotary_pos_emb exports it."""
    x, cos, sin = ins
    half = g.node(x).shape[-1] // 2
    rotated = g.concat([g.neg(g.narrow(x, axis=-1, start=half, length=half)),
                        g.narrow(x, axis=-1, start=0, length=half)], axis=-1)
    return g.add(g.mul(x, cos), g.mul(rotated, sin))


def _rotary_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x [B, H, S, D even] or [B, S, D even]; cos and sin [S, D], [1, 1, S, D] or [B, 1, S, D] (4-D x)."""
    b, h, s, half = random_shape(rng, 4, 4)
    x = pick(rng, [(b, h, s, 2 * half), (b, s, 2 * half)])
    table = pick(rng, [(s, 2 * half), (1, 1, s, 2 * half), (b, 1, s, 2 * half)] if len(x) == 4 else [(s, 2 * half)])
    return {"x": x, "cos": table, "sin": table}, {}


def _embed_layer_norm_infer(a: Attrs, ins: list[T]) -> T:
    table, ids, first, second, gamma, beta = ins
    x = op_spec("Embedding").infer({}, [table, ids])
    for label, t in (("first", first), ("second", second)):
        if t.dtype != x.dtype or broadcast(x.shape, t.shape) != x.shape:
            raise ShapeError(f"EmbedLayerNorm {label} {list(t.shape)} {t.dtype} must be {x.dtype} and broadcast to "
                             f"the embeddings {list(x.shape)}")
    return op_spec("LayerNorm").infer({"axis": -1}, [x, gamma, beta])


def _embed_layer_norm_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """LayerNorm(Add(Add(Embedding(table, ids), first), second)) over the last axis."""
    table, ids, first, second, gamma, beta = ins
    return g.layer_norm(g.add(g.add(g.embedding(table, ids), first), second), gamma, beta, axis=-1, eps=a["eps"])


def _embed_layer_norm_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """table [V, H], ids [S] or [B, S]; each addend of the embeddings' shape [..., S, H], or [S, H], [1, S, H]
    (2-D ids) or [H] broadcast over them; gamma and beta [H]."""
    vocab, width = random_shape(rng, 2, 2)
    ids = random_shape(rng, 1, 2)
    rows = (*ids, width)
    addends = [rows, rows[-2:], (width,), *([(1, *rows[-2:])] if len(ids) == 2 else [])]
    return {"table": (vocab, width), "ids": ids, "first": pick(rng, addends), "second": pick(rng, addends),
            "gamma": (width,), "beta": (width,)}, {}


# The region kinds: ops whose ``chain`` attribute is a program of steps run as one kernel.
ELEMENTWISE_REGION, TRANSFORM_REGION, BATCH_REGION = "ElementwiseRegion", "TransformRegion", "BatchElementwiseRegion"
REGION_KINDS = (ELEMENTWISE_REGION, TRANSFORM_REGION, BATCH_REGION)
# What an ElementwiseRegion may do to its input 0 before its steps: nothing, or a nearest-neighbour 2x upsample.
PROLOGUES = ("none", "upsample2x")
# The layout steps a TransformRegion runs between its elementwise steps: each moves every element once.
TRANSFORM_STEPS = frozenset({"Transpose", "Reshape"})


@dataclass(frozen=True)
class RegionStep:
    """One step of a region's chain, resolved by its op's shape rule."""

    spec: OpSpec
    attrs: dict[str, Any]
    operands: tuple[int, ...]  # i >= 0: region input i; -k: the value of step k-1
    type: T


def _parse_chain(a: Attrs) -> tuple[list[str] | None, list]:
    """The chain's declared input dtypes (None in the list shorthand) and its raw steps."""
    try:
        chain = json.loads(a["chain"])
    except ValueError as exc:
        raise ShapeError(f"chain is not JSON: {exc}") from None
    except RecursionError:
        raise ShapeError("chain is nested too deeply to read") from None
    if isinstance(chain, list):
        return None, chain
    if isinstance(chain, dict) and chain.keys() == {"inputs", "steps"} and isinstance(chain["inputs"], list) \
            and isinstance(chain["steps"], list):
        return chain["inputs"], chain["steps"]
    raise ShapeError('chain must be {"inputs": [dtype, ...], "steps": [[op, attrs, operands], ...]} '
                     "or the list of steps alone")


def _step_ops(transform: bool) -> str:
    return "an elementwise or transform (Transpose, Reshape) op" if transform else "an elementwise op"


def region_program(a: Attrs, ins: list[T], transform: bool = False) -> list[RegionStep]:
    """Check a region's chain over inputs of types ``ins`` step by step and type every step.

    The chain is ``{"inputs": [dtype, ...], "steps": [[op, attrs, operands], ...]}``; operand
    i >= 0 is region input i, -k the value of step k-1.  ``"inputs"`` (the inputs' dtypes, which
    the kernel cannot see in its compute-typed arrays) may be left out and must match ``ins``.
    A ``prologue`` of ``upsample2x`` gives the steps input 0 upsampled (Upsample2x); ``transform``
    (TransformRegion) also admits the layout steps :data:`TRANSFORM_STEPS`.
    """
    declared, steps = _parse_chain(a)
    if declared is not None and declared != [t.dtype for t in ins]:
        raise ShapeError(f"chain inputs are {declared}, the region's inputs are {[t.dtype for t in ins]}")
    if not steps:
        raise ShapeError("chain must have at least one step")
    if a.get("prologue", "none") != "none":
        if not ins:
            raise ShapeError("a prologue needs an input 0")
        try:
            ins = [op_spec("Upsample2x").infer({}, [ins[0]]), *ins[1:]]
        except ShapeError as exc:
            raise ShapeError(f"prologue {a['prologue']}: {exc}") from None
    program: list[RegionStep] = []
    for k, step in enumerate(steps):
        if not (isinstance(step, list) and len(step) == 3 and isinstance(step[1], dict)
                and isinstance(step[2], list)):
            raise ShapeError(f"chain step {k} is not [op, attrs, operands]: {short_repr(step)}")
        op, attrs, operands = step
        spec = REGISTRY.get(op) if isinstance(op, str) else None
        if spec is None or not (spec.kind is Kind.ELEMENTWISE or (transform and op in TRANSFORM_STEPS)):
            raise ShapeError(f"chain step {k} op {short_repr(op)} is not {_step_ops(transform)}")
        if not all(type(i) is int and -k <= i < len(ins) for i in operands):
            raise ShapeError(f"chain step {k} refers to a missing operand in {short_repr(operands)}")
        try:
            resolved, out = spec.resolve(attrs, [ins[i] if i >= 0 else program[-i - 1].type for i in operands])
        except ShapeError as exc:
            raise ShapeError(f"chain step {k} ({op}): {exc}") from None
        program.append(RegionStep(spec, resolved, tuple(operands), out))
    return program


def _canonical_chain(a: Attrs, ins: list[T], transform: bool) -> str:
    """The chain with the inputs' dtypes and every step's attributes filled in."""
    steps = [[s.spec.name, {key: list(v) if isinstance(v, tuple) else v for key, v in s.attrs.items()},
              list(s.operands)] for s in region_program(a, ins, transform)]
    return json.dumps({"inputs": [t.dtype for t in ins], "steps": steps})


def _run_program(a: Attrs, xs: tuple[np.ndarray, ...], transform: bool) -> np.ndarray:
    """Run every step as the interpreter runs the node it replaces: in and out of that step's dtype."""
    declared, _ = _parse_chain(a)
    if declared is None:
        raise ShapeError("the kernel needs a resolved chain (with its inputs' dtypes)")
    program = region_program(a, [T(x.shape, d) for x, d in zip(xs, declared, strict=True)], transform)
    if a.get("prologue", "none") == "upsample2x":
        xs = (K.upsample2x({}, xs[0]), *xs[1:])
    values: list[np.ndarray] = []
    for step in program:
        args = [xs[i] if i >= 0 else values[-i - 1] for i in step.operands]
        dtypes = [declared[i] if i >= 0 else program[-i - 1].type.dtype for i in step.operands]
        values.append(K.run_node(step.spec, step.attrs, args, dtypes, step.type))
    return values[-1]


def _build_program(g: Graph, ins: list[int], a: Attrs, transform: bool) -> int:
    """One node per step (after an Upsample2x of input 0 for the prologue)."""
    if a.get("prologue", "none") == "upsample2x":
        ins = [g.upsample2x(ins[0]), *ins[1:]]
        a = {**a, "prologue": "none"}
    results: list[int] = []
    for step in region_program(a, [g.node(i).type for i in ins], transform):
        inputs = [ins[i] if i >= 0 else results[-i - 1] for i in step.operands]
        results.append(g.add_node(step.spec.name, inputs, **step.attrs))
    return results[-1]


def _program_flops(a: Attrs, ins: list[T], out: T) -> int:
    return out.numel * len(_parse_chain(a)[1])


def _chain_region(name: str, transform: bool, attrs: tuple[AttrSpec, ...], doc: str,
                  sampler: Any) -> OpSpec:
    """A region op running its chain (ElementwiseRegion, TransformRegion): one kernel, each step stored in its
    own dtype, decomposed into one node per step."""
    return OpSpec(name, Kind.FUSED, ("xs*",), lambda a, ins: region_program(a, ins, transform)[-1].type,
                  lambda a, *xs: _run_program(a, xs, transform), (AttrSpec("chain", AttrType.JSON), *attrs),
                  flops=_program_flops,
                  canonical=lambda a, ins: {**a, "chain": _canonical_chain(a, ins, transform)}, doc=doc,
                  decompose=lambda g, ins, a: _build_program(g, ins, a, transform), sampler=sampler)


def _lanes(a: Attrs, ins: list[T]) -> list[list[T]]:
    """A batched region's inputs, lane by lane (``lanes`` lanes of equal input types)."""
    k = a["lanes"]
    if len(ins) % k:
        raise ShapeError(f"{len(ins)} inputs do not split into {k} lanes")
    m = len(ins) // k
    lanes = [ins[j * m:(j + 1) * m] for j in range(k)]
    if any(lane != lanes[0] for lane in lanes):
        raise ShapeError(f"every lane must read inputs of the types {[str(t) for t in lanes[0]]}, got "
                         f"{[[str(t) for t in lane] for lane in lanes]}")
    return lanes


def _batch_infer(a: Attrs, ins: list[T]) -> T:
    out = region_program(a, _lanes(a, ins)[0])[-1].type
    return T((a["lanes"], *out.shape), out.dtype)


def _batch_kernel(a: Attrs, *xs: np.ndarray) -> np.ndarray:
    m = len(xs) // a["lanes"]
    return np.stack([_run_program(a, xs[j * m:(j + 1) * m], False) for j in range(a["lanes"])])


def _batch_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """Each lane's steps, its result given a leading axis, the lanes concatenated along it."""
    m = len(ins) // a["lanes"]
    outs = [_build_program(g, ins[j * m:(j + 1) * m], a, False) for j in range(a["lanes"])]
    return g.concat([g.reshape(o, shape=(1, *g.node(o).shape)) for o in outs], axis=0)


# Steps a sampled region draws from: finite on every finite input (Exp, Log, Div, Pow, ... overflow or
# leave their domain), so every sample has a value to compare.
_REGION_UNARY: tuple[tuple[str, dict[str, str]], ...] = (
    ("Relu", {}), ("Silu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Neg", {}), ("Abs", {}), ("Erf", {}), ("Identity", {}),
    ("Gelu", {"approximate": "none"}), ("Gelu", {"approximate": "tanh"}),
)
_REGION_BINARY = ("Add", "Sub", "Mul", "Max", "Min")


def _random_steps(rng: np.random.Generator, chain: list[list[Any]], values: list[int], steps: int) -> None:
    """Append ``steps`` random unary, binary or select (Where(Greater(p, q), p, r)) steps over ``values`` (the float
    operands of one shape so far: inputs i >= 0, step results -(step + 1)) to ``chain``."""
    for _ in range(steps):
        kind = pick(rng, ["unary", "binary", "select"])
        if kind == "unary":
            op, attrs = pick(rng, _REGION_UNARY)
            chain.append([op, attrs, [pick(rng, values)]])
        elif kind == "binary":
            chain.append([pick(rng, _REGION_BINARY), {}, [pick(rng, values), pick(rng, values)]])
        else:
            p, q, r = (pick(rng, values) for _ in range(3))
            chain.append(["Greater", {}, [p, q]])
            chain.append(["Where", {}, [-len(chain), p, r]])
        values.append(-len(chain))


def _region_inputs(rng: np.random.Generator, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """``shape`` and 0 to 2 trailing parts of it: a region's inputs."""
    return [shape, *(shape[int(rng.integers(0, len(shape))):] for _ in range(int(rng.integers(0, 3))))]


def _region_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """1 to 6 random steps over 1 to 3 inputs (the region's shape and trailing parts of it); one time in three
    input 0 is read through the upsample prologue (then 4-D, at half the region's height and width)."""
    prologue = pick(rng, ["none", "none", "upsample2x"])
    shape = (*random_shape(rng, 2, 2), *(2 * d for d in random_shape(rng, 2, 2))) if prologue != "none" \
        else random_shape(rng, 2, 3)
    xs = _region_inputs(rng, shape)
    chain: list[list[Any]] = []
    _random_steps(rng, chain, list(range(len(xs))), int(rng.integers(1, 7)))
    if prologue != "none":
        xs[0] = (*shape[:2], shape[2] // 2, shape[3] // 2)
    return {"xs": xs}, {"chain": json.dumps(chain), "prologue": prologue}


def _transform_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """Random steps on x, a Transpose or Reshape of their value, random steps on that and on inputs of its shape."""
    shape = random_shape(rng, 2, 3)
    chain: list[list[Any]] = []
    _random_steps(rng, chain, [0], int(rng.integers(1, 4)))
    if rng.random() < 0.5:
        perm = tuple(int(p) for p in rng.permutation(len(shape)))
        chain.append(["Transpose", {"perm": list(perm)}, [-len(chain)]])
        moved = tuple(shape[p] for p in perm)
    else:
        moved = (int(np.prod(shape)),)
        chain.append(["Reshape", {"shape": list(moved)}, [-len(chain)]])
    xs = [shape, *_region_inputs(rng, moved)]
    _random_steps(rng, chain, [-len(chain), *range(1, len(xs))], int(rng.integers(1, 4)))
    return {"xs": xs}, {"chain": json.dumps(chain)}


def _batch_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """2 or 3 lanes of one sampled region program (no prologue)."""
    shape = random_shape(rng, 2, 3)
    lane = _region_inputs(rng, shape)
    chain: list[list[Any]] = []
    _random_steps(rng, chain, list(range(len(lane))), int(rng.integers(1, 5)))
    lanes = int(rng.integers(2, 4))
    return {"xs": lane * lanes}, {"chain": json.dumps(chain), "lanes": lanes}


def _concat_params_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """1 to 4 parts of one shape of rank 1 to 3 that differ along a random axis."""
    base = random_shape(rng, 1, 3)
    axis = int(rng.integers(len(base)))
    return {"ws": [(*base[:axis], size, *base[axis + 1:]) for size in random_shape(rng, 1, 4)]}, {"axis": axis}


FUSED = [
    _matmul_add("FusedMatMulAdd", -1, -2),
    _matmul_add("FusedMatMulATAdd", -2, -2),
    _matmul_add("FusedMatMulBTAdd", -1, -1),
    OpSpec("FusedMatMulBiasAct", Kind.FUSED, ("x", "w", "bias"), _bias_act_infer, K.fused_matmul_bias_act,
           (AttrSpec("act", S, "none", choices=EPILOGUES),), flops=matmul_flops,
           doc="act(x @ w + bias) with a bias of rank <= 1 and an optional Gelu/Silu epilogue.",
           decompose=_bias_act_decompose, sampler=_bias_act_sample),
    OpSpec("FusedResidualLN", Kind.FUSED, ("x", "residual", "gamma", "beta"),
           norm_infer("FusedResidualLN", ("gamma", "beta"), residual=True),
           lambda a, x, r, g, b: K.layer_norm(x + r, g, b, a["axis"], a["eps"]), (_AXIS, _EPS),
           doc="LayerNorm(x + residual).",
           decompose=lambda g, ins, a: g.layer_norm(g.add(ins[0], ins[1]), *ins[2:], axis=a["axis"], eps=a["eps"]),
           sampler=norm_sampler(("gamma", "beta"), residual=True), degenerate=normalized_one),
    OpSpec("FusedResidualRmsNorm", Kind.FUSED, ("x", "residual", "gamma", "beta?"),
           norm_infer("FusedResidualRmsNorm", ("gamma", "beta"), residual=True),
           lambda a, x, r, g, b=None: K.rms_norm(x + r, g, b, a["axis"], a["eps"]),
           (_AXIS, AttrSpec("eps", F, 1e-6, check=positive)), doc="RmsNorm(x + residual).",
           decompose=lambda g, ins, a: g.rms_norm(g.add(ins[0], ins[1]), *ins[2:], axis=a["axis"], eps=a["eps"]),
           sampler=norm_sampler(("gamma", "beta?"), residual=True)),
    _add_norm("FusedAddLayerNorm", "LayerNorm", ("gamma", "beta"), 1e-5,
              "(LayerNorm(x + residual), x + residual): the sum is the next residual."),
    _add_norm("FusedAddRmsNorm", "RmsNorm", ("gamma", "beta?"), 1e-6,
              "(RmsNorm(x + residual), x + residual): the sum is the next residual."),
    OpSpec("FusedRmsNormMatMul", Kind.FUSED, ("x", "w_norm", "w_proj"), _rms_matmul_infer,
           lambda a, x, wn, wp: np.matmul(K.rms_norm(x, wn, None, a["axis"], a["eps"]), wp),
           (_AXIS, AttrSpec("eps", F, 1e-6, check=positive)), flops=_rms_matmul_flops,
           doc="RmsNorm(x, w_norm) @ w_proj.",
           decompose=lambda g, ins, a: g.matmul(g.rms_norm(ins[0], ins[1], axis=a["axis"], eps=a["eps"]), ins[2]),
           sampler=_rms_matmul_sample),
    OpSpec("SwiGLU", Kind.FUSED, ("gate", "up"), _swiglu_infer, lambda a, g, u: K.swiglu(g, u),
           doc="Silu(gate) * up.", decompose=lambda g, ins, a: g.mul(g.silu(ins[0]), ins[1])),
    OpSpec("FusedSwiGLU", Kind.FUSED, ("cat",), _fused_swiglu_infer, K.fused_swiglu,
           (AttrSpec("gate_first", B, False), AttrSpec("cast_to", S, "none", choices=SWIGLU_CASTS)),
           doc="up * Silu(gate) where cat = [up | gate] (or [gate | up] when gate_first), written as cast_to "
               "(a float dtype; none: cat's).",
           decompose=_fused_swiglu_decompose,  # (cast_to: its own parity test, the dtype changes)
           sampler=lambda rng: ({"cat": (*random_shape(rng, 0, 2), 2 * int(rng.integers(1, 6)))},
                                {"cast_to": "none"})),
    OpSpec("GroupNormSilu", Kind.FUSED, ("x", "w", "b"), lambda a, ins: op_spec("GroupNorm").infer(a, ins),
           lambda a, x, w, b: K.silu(K.group_norm(x, w, b, a["groups"], a["eps"])),
           (AttrSpec("groups", INT, check=at_least_one), _EPS), doc="Silu(GroupNorm(x, w, b)).",
           decompose=lambda g, ins, a: g.silu(g.group_norm(*ins, groups=a["groups"], eps=a["eps"])),
           sampler=_group_norm_sample, degenerate=group_of_one),
    OpSpec("CausalAttentionRoPE", Kind.FUSED, ("q", "k", "v"), _causal_rope_infer,
           lambda a, q, k, v: K.sdpa(K.rope(q, a["theta"]), K.rope(k, a["theta"]), v, a["scale"], causal=True),
           (AttrSpec("theta", F, 10000.0, check=positive), AttrSpec("scale", F, 0.0, check=non_negative)),
           flops=attention_flops, canonical=causal_canonical, doc="CausalAttention(RoPE(q), RoPE(k), v).",
           degenerate=_causal_rope_degenerate,
           decompose=lambda g, ins, a: g.causal_attention(g.rope(ins[0], theta=a["theta"]),
                                                          g.rope(ins[1], theta=a["theta"]), ins[2], scale=a["scale"]),
           sampler=_causal_rope_sample),
    OpSpec("BiasedAttention", Kind.FUSED, ("q", "k", "v", "bias"), _biased_attention_infer,
           _biased_attention_kernel, (_SCALE, AttrSpec("nan_to_zero", B, False)), flops=attention_flops,
           doc="Softmax(q @ k^T * scale + bias) @ v on split heads [B, H, S, D] (GQA), an additive mask "
               "broadcast to the scores; nan_to_zero: rows whose keys are all masked give 0, not NaN.",
           decompose=_biased_attention_decompose, sampler=_biased_attention_sample,
           degenerate=lambda a, ins: split_heads_degenerate(ins[0], ins[1])),
    OpSpec("KvCacheAttention", Kind.FUSED, ("q", "k", "v", "past_k", "past_v", "bias"), _kv_cache_attention_infer,
           _kv_cache_attention_kernel, (_SCALE, AttrSpec("nan_to_zero", B, False)),
           flops=_kv_cache_attention_flops,
           doc="A decoding step's attention with a KV cache: the present keys and values Concat(past, new) on the "
               "sequence axis, and BiasedAttention of q over them; results (context, present key, present value).",
           decompose=_kv_cache_attention_decompose, sampler=_kv_cache_attention_sample,
           results=("context", "present_key", "present_value")),
    OpSpec("GroupQueryAttention", Kind.FUSED, ("q", "k", "v", "past_k", "past_v", "bias", "cos?", "sin?"),
           _gqa_infer, _gqa_kernel, (AttrSpec("heads", INT, check=at_least_one),
                                     AttrSpec("kv_heads", INT, check=at_least_one), _SCALE,
                                     AttrSpec("nan_to_zero", B, False)), flops=_gqa_flops,
           doc="A decoding step's attention on merged heads: q [B, 1, heads * D], k and v [B, 1, kv_heads * D] split "
               "into heads, q and k rotated by the tables (RotaryEmbedding) when given, KvCacheAttention over the "
               "cache, the context merged back to [B, 1, heads * D]; results (context, present key, present "
               "value) (onnxruntime's com.microsoft GroupQueryAttention).",
           decompose=_gqa_decompose, sampler=_gqa_sample, results=("context", "present_key", "present_value")),
    OpSpec("QkvAttention", Kind.FUSED, ("x", "w", "b", "bias?"), _qkv_attention_infer, _qkv_attention_kernel,
           (AttrSpec("heads", INT, check=at_least_one), _SCALE, AttrSpec("causal", B, False)),
           flops=_qkv_attention_flops,
           doc="Attention over one packed projection: x @ w + b split into Q, K and V [B, S, E], each into heads, "
               "attended with an additive bias [B or 1, heads or 1, S or 1, S], causally or unmasked: the context "
               "[B, S, heads, D] (a Reshape merges the heads for free; onnxruntime's com.microsoft Attention).",
           decompose=_qkv_attention_decompose, sampler=_qkv_attention_sample,
           degenerate=lambda a, ins: "one head or token" if a["heads"] < 2 or ins[0].shape[1] < 2 else None),
    OpSpec("RotaryEmbedding", Kind.FUSED, ("x", "cos", "sin"), _rotary_infer,
           lambda a, x, cos, sin: x * cos + rotate_half(x) * sin,
           doc="x * cos + rotate_half(x) * sin (RoPE with given tables, rotate-half convention).",
           decompose=_rotary_decompose, sampler=_rotary_sample),
    OpSpec("EmbedLayerNorm", Kind.FUSED, ("table", "ids", "first", "second", "gamma", "beta"),
           _embed_layer_norm_infer, K.embed_layer_norm, (_EPS,),
           doc="LayerNorm over the last axis of (table[ids] + first) + second: BERT's word embeddings plus its "
               "token-type and position terms, then the embeddings' norm.",
           decompose=_embed_layer_norm_decompose, sampler=_embed_layer_norm_sample, index_inputs=("ids",)),
    OpSpec("FusedAttentionBlock", Kind.FUSED, ("hidden", "qkv_w", "out_w", "mask", "qkv_b", "out_b"),
           _attention_block_infer, K.attention_block, (AttrSpec("heads", INT, check=at_least_one), _SCALE),
           flops=lambda a, ins, out: 2 * ins[0].numel * 4 * ins[0].shape[-1] + 4 * out.numel * ins[0].shape[1],
           doc="QKV matmul+bias, split, masked attention, output matmul+bias.",
           decompose=_attention_block_decompose, sampler=_attention_block_sample,
           degenerate=lambda a, ins: "one head or token" if a["heads"] < 2 or ins[0].shape[1] < 2 else None),
    OpSpec("FusedTransformerLayer", Kind.FUSED,
           ("hidden", "qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b",
            "ln2_g", "ln2_b", "mask"), _transformer_layer_infer, K.transformer_layer,
           (AttrSpec("heads", INT, check=at_least_one), _SCALE, AttrSpec("eps1", F, check=positive),
            AttrSpec("eps2", F, check=positive),
            AttrSpec("act", S, "gelu", choices=EPILOGUES)), flops=_transformer_layer_flops,
           doc="A whole post-norm BERT layer; inputs in the seed's 14-input order.",
           decompose=_transformer_layer_decompose, sampler=_transformer_layer_sample,
           degenerate=lambda a, ins: "one head or token" if a["heads"] < 2 or ins[0].shape[1] < 2 else None),
    _chain_region(ELEMENTWISE_REGION, False, (AttrSpec("prologue", S, "none", choices=PROLOGUES),),
                  "A chain of elementwise ops run as one kernel, each step stored in its own dtype; with the "
                  "upsample2x prologue the kernel reads input 0 through a nearest-neighbour 2x upsample.",
                  _region_sample),
    _chain_region(TRANSFORM_REGION, True, (),
                  "A chain of elementwise ops with Transposes and Reshapes between them run as one kernel (each "
                  "step computed in its own shape, stored in its own dtype).", _transform_sample),
    OpSpec(BATCH_REGION, Kind.FUSED, ("xs*",), _batch_infer, _batch_kernel,
           (AttrSpec("chain", AttrType.JSON), AttrSpec("lanes", INT, check=at_least_one)), flops=_program_flops,
           canonical=lambda a, ins: {**a, "chain": _canonical_chain(a, _lanes(a, ins)[0], False)},
           doc="One elementwise chain run on several independent lanes of inputs in one kernel: the lanes' results "
               "stacked along a new leading axis.", decompose=_batch_decompose, sampler=_batch_sample),
    OpSpec("ConcatParams", Kind.WEIGHT_PREP, ("ws*",), concat_infer,
           lambda a, *ws: np.concatenate(ws, axis=a["axis"]), (_AXIS,),
           doc="A derived weight: parameters concatenated once at load time (recipe: sources, axis, order).",
           decompose=lambda g, ins, a: g.concat(ins, axis=a["axis"]), sampler=_concat_params_sample),
]
register(*FUSED)
