"""Attention fusions (rules/attention.egg): scaled dot-product attention with RoPE, an additive bias or a packed
QKV projection, rotary embeddings, and the attention block and transformer layer built on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import dtype
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
    at_least_one,
    non_negative,
    op_spec,
    pick,
    positive,
    random_shape,
    register,
)
from ..shapes import broadcast, require_rank, same_dtype
from . import reference as K
from .matmul import EPILOGUES
from .onnx_op import ONNX_DTYPES
from .primitives import (
    attention_flops,
    causal_canonical,
    rope_degenerate,
    split_heads_degenerate,
)

if TYPE_CHECKING:
    from ..dims import Dim
    from ..export import ExportBuilder
    from ..graph import Graph, Node

T = TensorType
INT, F, B, S = AttrType.INT, AttrType.FLOAT, AttrType.BOOL, AttrType.STR
_SCALE = AttrSpec("scale", F, check=positive)


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


def biased_attention_infer(a: Attrs, ins: list[T]) -> T:
    q, k, v, bias = ins
    out = op_spec("CausalAttention").infer(a, [q, k, v])
    scores = (*q.shape[:3], k.shape[2])
    if bias.dtype != q.dtype or len(bias.shape) > 4 or broadcast(bias.shape, scores) != scores:
        raise ShapeError(f"BiasedAttention bias {list(bias.shape)} {bias.dtype} must be {q.dtype} and broadcast to "
                         f"the scores {list(scores)}")
    return out


def biased_attention_kernel(a: Attrs, q: np.ndarray, k: np.ndarray, v: np.ndarray,
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
        ctx = biased_attention_kernel({"scale": a["scale"], "nan_to_zero": False}, q, k, v, bias)
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


def _mha_infer(a: Attrs, ins: list[T]) -> T:
    q, k, v, *bias = ins
    for label, t in (("q", q), ("k", k), ("v", v)):
        require_rank(t, 3, f"MultiHeadAttention {label} ([B, S, heads * D])")
    same_dtype(ins, "MultiHeadAttention inputs")
    heads = a["heads"]
    if k.shape[0] != q.shape[0] or v.shape[:2] != k.shape[:2] or k.shape[2] != q.shape[2]:
        raise ShapeError(f"MultiHeadAttention q {list(q.shape)}, k {list(k.shape)} and v {list(v.shape)} must be "
                         "[B, S, E], [B, L, E] and [B, L, Ev]")
    for label, t in (("q", q), ("v", v)):
        if t.shape[2] % heads:
            raise ShapeError(f"MultiHeadAttention {label} width {t.shape[2]} is not divisible by heads={heads}")
    scores = (q.shape[0], heads, q.shape[1], k.shape[1])
    if bias and (bias[0].rank > 4 or broadcast(bias[0].shape, scores) != scores):
        raise ShapeError(f"MultiHeadAttention bias {list(bias[0].shape)} must broadcast to the scores {list(scores)}")
    return TensorType((q.shape[0], q.shape[1], heads, v.shape[2] // heads), q.dtype)


def _split(x: np.ndarray, heads: int) -> np.ndarray:
    """[B, S, heads * D] -> [B, heads, S, D]."""
    return x.reshape(*x.shape[:2], heads, -1).transpose(0, 2, 1, 3)


def _mha_kernel(a: Attrs, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    q4, k4, v4 = (_split(t, a["heads"]) for t in (q, k, v))
    scores = np.matmul(q4, np.swapaxes(k4, -1, -2)) * np.asarray(a["scale"], q.dtype)
    if bias is not None:
        scores = scores + bias
    if a["causal"]:
        sq, sk = q.shape[1], k.shape[1]
        keep = np.tril(np.ones((sq, sk), dtype=bool), k=sk - sq)
        with np.errstate(over="ignore"):  # a fill beyond the dtype's range is -inf
            scores = np.where(keep, scores, np.asarray(a["fill"], q.dtype))
    p = K.softmax(scores, -1)
    return np.matmul(np.where(np.isnan(p), 0, p) if a["nan_to_zero"] else p, v4).transpose(0, 2, 1, 3)


def _mha_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """q, k and v each split into heads (Reshape [B, S, heads, D], Transpose 0 2 1 3), BiasedAttention (a zero
    bias when there is none) or, causal, the scores plus the bias where the causal mask keeps a key, else the
    fill (Where(CausalMask, scores + bias, fill), softmax, (NaN rows to 0), @ v: what the exporters write),
    transposed back to [B, S, heads, Dv]."""
    q, k, v, *bias = ins
    q4, k4, v4 = (g.transpose(g.reshape(t, shape=(*g.node(t).shape[:2], a["heads"], g.node(t).shape[2] // a["heads"])),
                              perm=(0, 2, 1, 3)) for t in (q, k, v))
    dt = g.node(q).dtype
    if not a["causal"]:
        mask = bias[0] if bias else g.scalar(0.0, dt)
        return g.transpose(g.biased_attention(q4, k4, v4, mask, scale=a["scale"], nan_to_zero=a["nan_to_zero"]),
                           perm=(0, 2, 1, 3))
    scores = g.mul(g.matmul(q4, g.transpose(k4, perm=(0, 1, 3, 2))), g.scalar(a["scale"], dt))
    if bias:
        scores = g.add(scores, bias[0])
    keep = g.add_node("CausalMask", shape=(g.node(q).shape[1], g.node(k).shape[1]))
    p = g.softmax(g.where(keep, scores, g.scalar(a["fill"], dt)), axis=-1)
    if a["nan_to_zero"]:
        p = g.where(g.equal(p, p), p, g.scalar(0.0, dt))
    return g.transpose(g.matmul(p, v4), perm=(0, 2, 1, 3))


def _mha_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """q [B, S, heads * D], k and v [B, L, heads * D], heads and S >= 2 (cross attention: L and S apart, L >= S
    so that every query sees a key when causal); a bias [B, heads, S, L], [1, heads, S, L], [B, 1, 1, L] or [S, L],
    or none; causal or not."""
    batch, heads = random_shape(rng, 2, 2, high=3)
    seq, keys, d = random_shape(rng, 3, 3)
    heads, seq = heads + 1, max(seq, 2)  # two heads and queries at least: a head split, not a view
    keys = max(keys, seq)
    shapes = {"q": (batch, seq, heads * d), "k": (batch, keys, heads * d), "v": (batch, keys, heads * d)}
    bias = pick(rng, [(batch, heads, seq, keys), (1, heads, seq, keys), (batch, 1, 1, keys), (seq, keys), None])
    if bias is not None:
        shapes["bias"] = bias
    causal = bool(rng.integers(2))
    return shapes, {"heads": heads, "scale": pick(rng, [1.0, d**-0.5, float(rng.uniform(0.1, 1.0))]),
                    "causal": causal, "nan_to_zero": bool(rng.integers(2)),
                    "fill": pick(rng, [-1e9, float(np.finfo(np.float32).min)]) if causal else -1e9}


def rotary_infer(a: Attrs, ins: list[T]) -> T:
    """x [..., D]; the first ``rotary_dim`` channels (0: all D) rotated, an even number below D; cos and sin
    broadcast to those channels."""
    x, cos, sin = ins
    same_dtype(ins, "RotaryEmbedding operands")
    rotated = rotary_width(a, x)
    for label, t in (("cos", cos), ("sin", sin)):
        if broadcast((*x.shape[:-1], rotated), t.shape) != (*x.shape[:-1], rotated):
            raise ShapeError(f"RotaryEmbedding {label} {list(t.shape)} must broadcast to x's rotated channels "
                             f"{[*x.shape[:-1], rotated]}")
    return x


def rotary_width(a: Attrs, x: T) -> int:
    """The channels of x's last axis that RotaryEmbedding rotates (``rotary_dim``, 0 for all), checked: even, and
    below the axis's size when not all of it (one term per rotation: all of it is 0)."""
    if x.rank < 1:
        raise ShapeError("RotaryEmbedding needs a last axis to rotate")
    dim, r = x.shape[-1], a.get("rotary_dim", 0)
    if r == 0:
        if not isinstance(dim, int) or dim % 2:
            raise ShapeError(f"RotaryEmbedding needs an even last dim, got {list(x.shape)}")
        return dim
    if not isinstance(dim, int) or r % 2 or r >= dim:
        raise ShapeError(f"RotaryEmbedding rotary_dim={r} must be even and below the last dim of {list(x.shape)} "
                         "(0 rotates all of it)")
    return r


def rotate_half(x: np.ndarray) -> np.ndarray:
    """[-x2, x1] for x = [x1, x2] split in halves along the last axis."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotate_pairs(x: np.ndarray) -> np.ndarray:
    """[-x1, x0, -x3, x2, ...]: each pair of neighbouring channels rotated (GPT-J's rotate_every_two)."""
    return np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)


def rotary_kernel(a: Attrs, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The first ``rotary_dim`` channels (all for 0) as x * cos + rotate(x) * sin, the others passed through;
    rotate is rotate_half, or rotate_pairs when ``interleaved``."""
    r = a.get("rotary_dim", 0) or x.shape[-1]
    head = x[..., :r]
    rotated = head * cos + (rotate_pairs(head) if a.get("interleaved", False) else rotate_half(head)) * sin
    return rotated if r == x.shape[-1] else np.concatenate([rotated, x[..., r:]], axis=-1)


def _rotary_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """x * cos + rotate(x) * sin on the rotated channels as transformers exports it: rotate_half as
    Concat(-x2, x1); rotate_every_two as -x[..., 1::2] and x[..., 0::2] stacked on a new last axis (views of x as
    pairs); the channels passed through concatenated after."""
    x, cos, sin = ins
    shape = g.node(x).shape
    r = a["rotary_dim"] or shape[-1]
    head = x if r == shape[-1] else g.narrow(x, axis=-1, start=0, length=r)
    half = r // 2
    if a["interleaved"]:
        pairs = g.reshape(head, shape=(*shape[:-1], half, 2))
        column = [g.reshape(g.narrow(pairs, axis=-1, start=k, length=1), shape=(*shape[:-1], half)) for k in (1, 0)]
        stacked = [g.reshape(c, shape=(*shape[:-1], half, 1)) for c in (g.neg(column[0]), column[1])]
        rotated = g.reshape(g.concat(stacked, axis=-1), shape=(*shape[:-1], r))
    else:
        rotated = g.concat([g.neg(g.narrow(head, axis=-1, start=half, length=half)),
                            g.narrow(head, axis=-1, start=0, length=half)], axis=-1)
    y = g.add(g.mul(head, cos), g.mul(rotated, sin))
    return y if r == shape[-1] else g.concat([y, g.narrow(x, axis=-1, start=r, length=shape[-1] - r)], axis=-1)


def _rotary_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x [B, H, S, D even] or [B, S, D even], all or part of D rotated, in halves or in pairs; cos and sin [S, R],
    [1, 1, S, R] or [B, 1, S, R] (4-D x) for the R channels rotated."""
    b, h, s, half = random_shape(rng, 4, 4)
    passed = pick(rng, [0, 0, 2, 4])
    rotated = 2 * half
    x = pick(rng, [(b, h, s, rotated + passed), (b, s, rotated + passed)])
    table = pick(rng, [(s, rotated), (1, 1, s, rotated), (b, 1, s, rotated)] if len(x) == 4 else [(s, rotated)])
    return {"x": x, "cos": table, "sin": table}, {"rotary_dim": rotated if passed else 0,
                                                  "interleaved": bool(pick(rng, [False, True]))}


# --- ONNX exports (written against ExportBuilder, which the ONNX exporter's builder implements) ---


def _attention_block(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """com.microsoft.Attention (QKV projection, mask, heads) then the output projection."""
    hidden, qkv_w, out_w, mask, qkv_b, out_b = ins
    zero = b.const(np.zeros((), dtype(types[3].dtype).storage), types[3].dtype)
    keep = b.op("Cast", [b.op("Not", [b.op("Equal", [mask, zero])])], to=ONNX_DTYPES["i32"])
    ctx = b.op("Attention", [hidden, qkv_w, qkv_b, keep], domain=MS, num_heads=node.attrs["heads"],
               scale=node.attrs["scale"])
    return b.op("Add", [b.op("MatMul", [ctx, out_w]), out_b])


def onnx_attention(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType], **attrs: Any) -> str:
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


def _biased_attention(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """Attention (opset 23) with the bias as its additive attn_mask, expanded to [..., Sq, Sk] (which it needs);
    a zero Scalar bias (unmasked attention) is no mask.  Its rows whose keys are all masked give 0; without
    nan_to_zero the MIR op gives NaN there."""
    q, k, v, bias = ins
    source = b.graph.node(node.inputs[3]) if b.graph is not None else None
    if source is not None and source.op == "Scalar" and source.attrs["value"] == 0.0:
        return onnx_attention(b, node, [q, k, v], types, scale=node.attrs["scale"])
    bias = attention_mask(b, node.inputs[3], bias, types[3].shape, (types[0].shape[2], types[1].shape[2]),
                          clamp_lowest=not node.attrs["nan_to_zero"])
    return onnx_attention(b, node, [q, k, v, bias], types, scale=node.attrs["scale"])


def attention_mask(b: ExportBuilder, nid: int, bias: str, shape: tuple[Dim, ...], scores: tuple[Dim, Dim],
                   clamp_lowest: bool = False) -> str:
    """Attention's (opset 23) attn_mask for the additive ``bias`` (node ``nid``, written ``bias``), expanded to
    [..., Sq, Sk] (which it needs).  A bias Where(keep, 0, lowest) of the dtype's lowest value is ``keep`` itself,
    a bool mask: onnxruntime gives the same values for both (a query with every key masked: 0 alike), and the
    Where is not written.  onnxruntime also gives 0 for a query whose scores plus mask are all the lowest value;
    the softmax gives such a row equal weights.  So, with ``clamp_lowest`` (an attention without nan_to_zero and
    not causal: a causal one weighs such a row by its fill), a bias that adds one Where of the
    lowest value to other terms (DeBERTa: its position bias plus a masked_fill of every padded query's row) is
    clamped to half the lowest value first (one Max per bias): a row so masked then gets equal weights there too,
    and every other row the same weights (exp of half the lowest is 0 alike)."""
    graph = b.graph
    where = graph.node(nid) if graph is not None else None
    if where is not None and clamp_lowest and _adds_lowest_fill(graph, nid):
        key = ("lowest fill clamped", bias)
        if key not in b.dim_tensors:
            storage = dtype(where.dtype).storage
            floor = b.const(np.array(np.finfo(storage).min / 2, storage), where.dtype)
            b.dim_tensors[key] = b.op("Max", [bias, floor])
        bias = b.dim_tensors[key]
    elif where is not None and where.op == "Where":
        keep, zero, fill = (graph.node(i) for i in where.inputs)
        written = b.written.get(keep.id)
        if zero.op == "Scalar" and zero.attrs["value"] == 0.0 and fill.op == "Scalar" and keep.dtype == "bool" \
                and fill.attrs["value"] == float(np.finfo(dtype(where.dtype).storage).min) \
                and isinstance(written, str) and broadcast(keep.shape, shape) == shape:
            bias, shape = written, keep.shape
    if tuple(shape[-2:]) != scores:
        bias = b.expand(bias, broadcast(shape, scores))
    return bias


def _adds_lowest_fill(graph: Graph, nid: int) -> bool:
    """Whether node ``nid`` is a sum (through Reshape and Expand views) of terms exactly one of which is a Where
    with a fill of its dtype's lowest value, and none another Where with a fill, or a known constant with a value,
    at or below half that value (-inf: two such terms sum to -inf, which a clamp would lift to the other masked
    scores' value)."""
    node = graph.node(nid)
    while node.op in ("Reshape", "Expand"):
        node = graph.node(node.inputs[0])
    if node.op != "Add":
        return False
    lowest = float(np.finfo(dtype(node.dtype).storage).min)
    fills, pending = [], list(node.inputs)
    while pending:
        term = graph.node(pending.pop())
        while term.op in ("Reshape", "Expand"):
            term = graph.node(term.inputs[0])
        if term.op == "Add":
            pending.extend(term.inputs)
        elif term.op == "Where":
            fills += [graph.node(i).attrs["value"] for i in term.inputs[1:] if graph.node(i).op == "Scalar"
                      and graph.node(i).attrs["value"] <= lowest / 2]
        elif term.op in ("Constant", "Param"):
            known = term.attrs["value"] if term.op == "Constant" else graph.weights.get(term.name)
            if known is not None and np.size(known) and float(np.min(known)) <= lowest / 2:
                fills.append(float(np.min(known)))
    return fills == [lowest]


def _qkv_attention(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str:
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


def _multi_head_attention(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str | None:
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
        inputs.append(attention_mask(b, node.inputs[3], ins[3], types[3].shape, (types[0].shape[1], types[1].shape[1]),
                                     clamp_lowest=not (node.attrs["nan_to_zero"] or causal)))
    heads = node.attrs["heads"]
    ctx = b.op("Attention", inputs, q_num_heads=heads, kv_num_heads=heads, scale=node.attrs["scale"],
               **({"is_causal": 1} if causal else {}))
    b.shapes[ctx] = (*node.shape[:2], node.shape[2] * node.shape[3])
    return b.reshape(ctx, node.shape)


def _key_padding_mask(b: ExportBuilder, nid: int, batch: Dim, keys: Dim) -> tuple[str, float] | None:
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


def _rotary(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str | None:
    """RotaryEmbedding (opset 23; ``rotary_embedding_dim`` for part of the head, ``interleaved`` for pairs) on
    split heads [B, H, S, D], or on [B, S, H, D] through its [B, S, H * D] view (``num_heads``), when cos and sin
    have the form it takes: the same for every head, with equal halves ([c, c]; equal pairs when interleaved); its
    caches are one of each [B, S, R / 2] for the R channels rotated.  Known tables are checked by value; tables
    computed at run time (symbolic dims) by form (:func:`halves_alike`), [B or 1, 1, S, R] or [B or 1, S, 1, R],
    and the caches are their first halves (their even channels when interleaved), sliced at run time."""
    shape = types[0].shape
    if len(shape) != 4:
        return None
    rotated, interleaved = node.attrs["rotary_dim"] or shape[-1], node.attrs["interleaved"]
    half = rotated // 2
    tables = [(b.known(name), name, nid, t) for name, nid, t in zip(ins[1:], node.inputs[1:], types[1:],
                                                                     strict=True)]
    head_axis = _rotary_head_axis(shape, rotated, [t for *_, t in tables])
    if head_axis is None:
        return None
    caches = []
    for table, name, nid, t in tables:
        if table is None:
            seq = 3 - head_axis  # the sequence axis of x
            rows = (1,) * (4 - t.rank) + tuple(t.shape)
            if rows[0] not in (1, shape[0]) or not halves_alike(b, nid, interleaved):
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


def halves_alike(b: ExportBuilder, nid: int, interleaved: bool = False) -> bool:
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


ATTENTION = [
    OpSpec("CausalAttentionRoPE", Kind.FUSED, ("q", "k", "v"), _causal_rope_infer,
           lambda a, q, k, v: K.sdpa(K.rope(q, a["theta"]), K.rope(k, a["theta"]), v, a["scale"], causal=True),
           (AttrSpec("theta", F, 10000.0, check=positive), AttrSpec("scale", F, 0.0, check=non_negative)),
           flops=attention_flops, canonical=causal_canonical, doc="CausalAttention(RoPE(q), RoPE(k), v).",
           degenerate=_causal_rope_degenerate,
           decompose=lambda g, ins, a: g.causal_attention(g.rope(ins[0], theta=a["theta"]),
                                                          g.rope(ins[1], theta=a["theta"]), ins[2], scale=a["scale"]),
           sampler=_causal_rope_sample),
    OpSpec("BiasedAttention", Kind.FUSED, ("q", "k", "v", "bias"), biased_attention_infer,
           biased_attention_kernel, (_SCALE, AttrSpec("nan_to_zero", B, False)), flops=attention_flops,
           doc="Softmax(q @ k^T * scale + bias) @ v on split heads [B, H, S, D] (GQA), an additive mask "
               "broadcast to the scores; nan_to_zero: rows whose keys are all masked give 0, not NaN.",
           decompose=_biased_attention_decompose, sampler=_biased_attention_sample,
           degenerate=lambda a, ins: split_heads_degenerate(ins[0], ins[1]),
           onnx=OnnxWriter("Attention (opset 23) with an additive mask", _biased_attention)),
    OpSpec("QkvAttention", Kind.FUSED, ("x", "w", "b", "bias?"), _qkv_attention_infer, _qkv_attention_kernel,
           (AttrSpec("heads", INT, check=at_least_one), _SCALE, AttrSpec("causal", B, False)),
           flops=_qkv_attention_flops,
           doc="Attention over one packed projection: x @ w + b split into Q, K and V [B, S, E], each into heads, "
               "attended with an additive bias [B or 1, heads or 1, S or 1, S], causally or unmasked: the context "
               "[B, S, heads, D] (a Reshape merges the heads for free; onnxruntime's com.microsoft Attention).",
           decompose=_qkv_attention_decompose, sampler=_qkv_attention_sample,
           degenerate=lambda a, ins: "one head or token" if a["heads"] < 2 or ins[0].shape[1] < 2 else None,
           onnx=OnnxWriter("com.microsoft Attention (packed projection, additive bias or causal)", _qkv_attention)),
    OpSpec("MultiHeadAttention", Kind.FUSED, ("q", "k", "v", "bias?"), _mha_infer, _mha_kernel,
           (AttrSpec("heads", INT, check=at_least_one), _SCALE, AttrSpec("causal", B, False),
            AttrSpec("nan_to_zero", B, False), AttrSpec("fill", F, -1e9)), flops=attention_flops,
           doc="Attention over separate projections q [B, S, heads * D], k [B, L, heads * D] and v [B, L, heads * Dv] "
               "(cross attention: keys and values from another sequence), each split into heads, with an additive "
               "bias broadcast to the scores [B, heads, S, L] (a position bias, a padding mask) or none, causally "
               "(query i sees keys j <= i + L - S; the scores of the keys it drops, bias added, set to fill as the "
               "exporters' Where writes it) or not (nan_to_zero: rows whose keys are all masked give 0, not "
               "NaN): the context [B, S, heads, Dv] (a Reshape merges the heads for free; onnxruntime's "
               "MultiHeadAttention).",
           decompose=_mha_decompose, sampler=_mha_sample,
           degenerate=lambda a, ins: "one head or token" if a["heads"] < 2 or ins[0].shape[1] < 2 else None,
           onnx=OnnxWriter("Attention (opset 23) on separate q, k, v [B, S, heads * D], an additive mask",
                           _multi_head_attention)),
    OpSpec("RotaryEmbedding", Kind.FUSED, ("x", "cos", "sin"), rotary_infer, rotary_kernel,
           (AttrSpec("rotary_dim", INT, 0, check=non_negative), AttrSpec("interleaved", B, False)),
           doc="x * cos + rotate(x) * sin on the first rotary_dim channels (0: all), the rest passed through "
               "(RoPE with given tables; rotate_half, or neighbouring pairs when interleaved).",
           decompose=_rotary_decompose, sampler=_rotary_sample,
           onnx=OnnxWriter("RotaryEmbedding (opset 23)", _rotary)),
    OpSpec("FusedAttentionBlock", Kind.FUSED, ("hidden", "qkv_w", "out_w", "mask", "qkv_b", "out_b"),
           _attention_block_infer, K.attention_block, (AttrSpec("heads", INT, check=at_least_one), _SCALE),
           flops=lambda a, ins, out: 2 * ins[0].numel * 4 * ins[0].shape[-1] + 4 * out.numel * ins[0].shape[1],
           doc="QKV matmul+bias, split, masked attention, output matmul+bias.",
           decompose=_attention_block_decompose, sampler=_attention_block_sample,
           degenerate=lambda a, ins: "one head or token" if a["heads"] < 2 or ins[0].shape[1] < 2 else None,
           onnx=OnnxWriter("com.microsoft Attention (mask index), then MatMul + Add", _attention_block)),
    OpSpec("FusedTransformerLayer", Kind.FUSED,
           ("hidden", "qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b",
            "ln2_g", "ln2_b", "mask"), _transformer_layer_infer, K.transformer_layer,
           (AttrSpec("heads", INT, check=at_least_one), _SCALE, AttrSpec("eps1", F, check=positive),
            AttrSpec("eps2", F, check=positive),
            AttrSpec("act", S, "gelu", choices=EPILOGUES)), flops=_transformer_layer_flops,
           doc="A whole post-norm BERT layer; inputs in the seed's 14-input order.",
           decompose=_transformer_layer_decompose, sampler=_transformer_layer_sample,
           degenerate=lambda a, ins: "one head or token" if a["heads"] < 2 or ins[0].shape[1] < 2 else None),
]
register(*ATTENTION)
