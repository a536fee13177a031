"""Numpy reference kernels, one per op, and :func:`run_node`, the one way to run them.

Every kernel is ``kernel(attrs, *arrays) -> array``: arrays arrive in the
compute dtype (f16/bf16 widened to f32) and :func:`run_node` stores the result
in the node's dtype.  Fused kernels are written from the primitive kernels so
that they compute exactly what the unfused subgraph computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import to_compute, to_storage
from ..registry import TUPLE

if TYPE_CHECKING:
    from ..registry import OpSpec, ValueType

Attrs = dict[str, Any]


def run_node(spec: OpSpec, attrs: Mapping[str, Any], args: Sequence[Any], in_dtypes: Sequence[str],
             out_type: ValueType) -> Any:
    """One node's stored value: ``spec``'s kernel on ``args`` (stored or compute form, of ``in_dtypes``)
    widened to their compute type, broadcast to ``out_type``'s shape and stored in its dtype (f16 and bf16
    rounded, integers truncated, bool); a derived weight (a weight-prep op) is computed in float64 and rounded
    once into its dtype.  The interpreter runs every node through this, and an
    ElementwiseRegion every step, so a step is bit-identical to the node it replaced.

    A multi-result node's value is a tuple of stored arrays, one per part of its TupleType; a
    projection (Get) returns one of them as it is."""
    if out_type.dtype == TUPLE:  # a TupleType: every result stored in its own type
        with np.errstate(all="ignore"):
            outs = spec.kernel(attrs, *(to_compute(x, d) for x, d in zip(args, in_dtypes, strict=True)))
        return tuple(to_storage(np.broadcast_to(o, t.shape), t.dtype)
                     for o, t in zip(outs, out_type.parts, strict=True))
    if spec.kind == "projection":  # Get reads stored results
        return spec.kernel(attrs, *args)
    wide = spec.kind == "weight-prep"  # a derived weight: computed in float64 from the stored ones, rounded once
    with np.errstate(all="ignore"):
        out = spec.kernel(attrs, *(_widened(x, d) if wide else to_compute(x, d)
                                   for x, d in zip(args, in_dtypes, strict=True)))
        return to_storage(np.broadcast_to(out, out_type.shape), out_type.dtype)


def _widened(x: Any, name: str) -> np.ndarray:
    """A stored float array as float64 (other dtypes as kernels compute with them)."""
    computed = to_compute(x, name)
    return computed.astype(np.float64) if np.issubdtype(computed.dtype, np.floating) else computed


# --- leaves -----------------------------------------------------------------


def constant(a: Attrs) -> np.ndarray:
    return np.asarray(a["value"])


def scalar(a: Attrs) -> np.ndarray:
    return np.asarray(a["value"], dtype=np.float64)


# --- matmul -----------------------------------------------------------------


def matmul(a: Attrs, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.matmul(x, w)


def matmul_at(a: Attrs, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.matmul(np.swapaxes(x, -1, -2), w)


def matmul_bt(a: Attrs, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.matmul(x, np.swapaxes(w, -1, -2))


# --- elementwise ------------------------------------------------------------

def maximum(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """IEEE 754-2019 maximum: NaN when either is NaN, and +0.0 above -0.0, so ``maximum(x, y)`` equals
    ``maximum(y, x)`` bit for bit (``np.maximum`` returns its second argument for zeros of both signs, and Max is
    declared commutative).  For two zeros, ``x + y`` is -0.0 only when both are."""
    if not np.issubdtype(np.result_type(x, y), np.floating):
        return np.maximum(x, y)
    return np.where((x == 0) & (y == 0), x + y, np.maximum(x, y))


def minimum(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """IEEE 754-2019 minimum: NaN when either is NaN, and -0.0 below +0.0 (see :func:`maximum`)."""
    if not np.issubdtype(np.result_type(x, y), np.floating):
        return np.minimum(x, y)
    return np.where((x == 0) & (y == 0), -((-x) + (-y)), np.minimum(x, y))


BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Max": maximum,
    "Min": minimum,
    "Pow": np.power,
    "Greater": np.greater,
    "Less": np.less,
    "Equal": np.equal,
}


def _special() -> ModuleType:
    """``scipy.special``, imported when a kernel first runs: importing it (and the libraries it loads) takes
    about 0.6 s, which ``import rlx_egraph`` would otherwise pay, the CLI and a run without the parity check
    included."""
    from scipy import special

    return special


def sigmoid(x: np.ndarray) -> np.ndarray:
    return _special().expit(x)


def silu(x: np.ndarray) -> np.ndarray:
    return x * _special().expit(x)


def erf(x: np.ndarray) -> np.ndarray:
    return _special().erf(x)


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        c = np.asarray(math.sqrt(2.0 / math.pi), dtype=x.dtype)
        return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + erf(x / np.asarray(math.sqrt(2.0), dtype=x.dtype)))


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, np.zeros((), dtype=x.dtype))


UNARY = {
    "Relu": relu,
    "Silu": silu,
    "Sigmoid": sigmoid,
    "Tanh": np.tanh,
    "Exp": np.exp,
    "Log": np.log,
    "Neg": np.negative,
    "Abs": np.abs,
    "Sqrt": np.sqrt,
    "Rsqrt": lambda x: 1.0 / np.sqrt(x),
    "Recip": lambda x: 1.0 / x,
    "Erf": erf,
    "Identity": lambda x: x,
}

ACTIVATIONS = {
    "none": lambda x: x,
    "relu": relu,
    "gelu": gelu,
    "gelu_tanh": lambda x: gelu(x, "tanh"),
    "silu": silu,
}


def where(a: Attrs, cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(cond.astype(bool), x, y)


def cast(a: Attrs, x: np.ndarray) -> np.ndarray:
    return x  # run_node stores every output in the node's dtype


# --- reductions -------------------------------------------------------------


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


# --- norms ------------------------------------------------------------------


def _norm_axes(x: np.ndarray, axis: int) -> tuple[int, ...]:
    return tuple(range(axis % x.ndim, x.ndim))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, axis: int, eps: float) -> np.ndarray:
    axes = _norm_axes(x, axis)
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    return centered / np.sqrt(var + np.asarray(eps, dtype=x.dtype)) * gamma + beta


def rms_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, axis: int, eps: float) -> np.ndarray:
    axes = _norm_axes(x, axis)
    ms = np.mean(x * x, axis=axes, keepdims=True)
    out = x * (1.0 / np.sqrt(ms + np.asarray(eps, dtype=x.dtype))) * gamma
    return out if beta is None else out + beta


def group_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, groups: int, eps: float) -> np.ndarray:
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=2, keepdims=True)
    normed = ((g - mean) / np.sqrt(var + np.asarray(eps, dtype=x.dtype))).reshape(x.shape)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    return normed * w.reshape(bshape) + b.reshape(bshape)


# --- layout -----------------------------------------------------------------


def reshape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return x.reshape(shape)


def narrow(x: np.ndarray, axis: int, start: int, length: int) -> np.ndarray:
    index = [slice(None)] * x.ndim
    index[axis % x.ndim] = slice(start, start + length)
    return x[tuple(index)]


# --- transformer ------------------------------------------------------------


def rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Rotary embedding, rotate-half convention, positions along axis -2."""
    seq, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    inv_freq = 1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / dim))
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(np.concatenate([angles, angles], axis=-1)).astype(x.dtype)
    sin = np.sin(np.concatenate([angles, angles], axis=-1)).astype(x.dtype)
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool,
         key_mask: np.ndarray | None = None) -> np.ndarray:
    """Scaled dot-product attention on split heads [B, H, S, D]; K/V heads repeat for GQA."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads != heads:
        k = np.repeat(k, heads // kv_heads, axis=1)
        v = np.repeat(v, heads // kv_heads, axis=1)
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(scale, dtype=q.dtype)
    sq, sk = scores.shape[-2], scores.shape[-1]
    if causal:
        allowed = np.tril(np.ones((sq, sk), dtype=bool), k=sk - sq)
        scores = np.where(allowed, scores, np.asarray(-np.inf, dtype=scores.dtype))
    if key_mask is not None:
        keep = key_mask.astype(bool)[:, None, None, :]
        scores = np.where(keep, scores, np.asarray(-1e9, dtype=scores.dtype))
    return np.matmul(softmax(scores, -1), v)


def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    b, s, hd = x.shape
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    b, h, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def attention(a: Attrs, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Packed-layout attention: q [B, Sq, heads*hd], k/v [B, Sk, kv_heads*hd]."""
    out = sdpa(split_heads(q, a["heads"]), split_heads(k, a["kv_heads"]), split_heads(v, a["kv_heads"]),
               a["scale"], a["mask"] == "causal", mask if a["mask"] == "custom" else None)
    return merge_heads(out)


def causal_attention(a: Attrs, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    return sdpa(q, k, v, a["scale"], causal=True)


def embedding(a: Attrs, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return table[ids.astype(np.int64)]


def embed_layer_norm(a: Attrs, table: np.ndarray, ids: np.ndarray, first: np.ndarray, gamma: np.ndarray,
                     beta: np.ndarray, second: np.ndarray | None = None) -> np.ndarray:
    """LayerNorm over the last axis of (table[ids] + first) + second (BERT's embeddings; DistilBERT's have no
    second term)."""
    x = embedding(a, table, ids) + first
    return layer_norm(x if second is None else x + second, gamma, beta, -1, a["eps"])


# --- vision -----------------------------------------------------------------


def _windows(x: np.ndarray, kh: int, kw: int, stride: int, pad: int, fill: float) -> np.ndarray:
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    return win[:, :, ::stride, ::stride]  # [N, C, OH, OW, kh, kw]


def conv2d(a: Attrs, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    groups = a["groups"]
    win = _windows(x, w.shape[2], w.shape[3], a["stride"], a["padding"], 0.0)
    _n, c, _oh, _ow = win.shape[:4]
    cg, og = c // groups, w.shape[0] // groups
    outs = []
    for g in range(groups):
        patch = win[:, g * cg:(g + 1) * cg]
        outs.append(np.einsum("nchwij,ocij->nohw", patch, w[g * og:(g + 1) * og], optimize=True))
    return np.concatenate(outs, axis=1)


def max_pool2d(a: Attrs, x: np.ndarray) -> np.ndarray:
    k = a["kernel"]
    return _windows(x, k, k, a["stride"], a["padding"], -np.inf).max(axis=(4, 5))


def upsample2x(a: Attrs, x: np.ndarray) -> np.ndarray:
    return x.repeat(2, axis=2).repeat(2, axis=3)


def conv(a: Attrs, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """ONNX's Conv: ``x`` [N, C, *spatial], ``w`` [O, C/groups, *kernel], ``pads`` the begins of the spatial axes
    then their ends, ``strides`` and ``dilations`` per spatial axis; ``b`` [O] added per output channel."""
    rank = x.ndim - 2
    pads, strides, dilations, groups = a["pads"], a["strides"], a["dilations"], a["groups"]
    x = np.pad(x, [(0, 0), (0, 0), *((pads[i], pads[i + rank]) for i in range(rank))])
    reach = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], dilations, strict=True)]
    win = np.lib.stride_tricks.sliding_window_view(x, reach, axis=tuple(range(2, 2 + rank)))
    win = win[(slice(None), slice(None), *(slice(None, None, s) for s in strides),
               *(slice(None, None, d) for d in dilations))]  # [N, C, *out, *kernel]
    n, c, out = x.shape[0], x.shape[1], win.shape[2:2 + rank]
    grouped = win.reshape(n, groups, c // groups, *win.shape[2:])
    kernel = w.reshape(groups, w.shape[0] // groups, *w.shape[1:])
    spatial, taps = "hwd"[:rank], "ijk"[:rank]
    y = np.einsum(f"ngc{spatial}{taps},goc{taps}->ngo{spatial}", grouped, kernel, optimize=True)
    y = y.reshape(n, w.shape[0], *out)
    return y if b is None else y + b.reshape(-1, *([1] * rank))


CONV_ACTIVATIONS = {
    "none": lambda a, x: x,
    "relu": lambda a, x: relu(x),
    "clip": lambda a, x: clip({"min": a["clip_min"], "max": a["clip_max"]}, x),
    "sigmoid": lambda a, x: sigmoid(x),
    "tanh": lambda a, x: np.tanh(x),
}


def fused_conv(a: Attrs, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
               z: np.ndarray | None = None) -> np.ndarray:
    """act(Conv(x, w, b) + z): onnxruntime's FusedConv (``z`` its sum input)."""
    y = conv(a, x, w, b)
    return CONV_ACTIVATIONS[a["act"]](a, y if z is None else y + z)


def clip(a: Attrs, x: np.ndarray) -> np.ndarray:
    """min(max(x, min), max): NaN stays NaN."""
    return np.minimum(np.maximum(x, np.asarray(a["min"], x.dtype)), np.asarray(a["max"], x.dtype))


def pad(a: Attrs, x: np.ndarray) -> np.ndarray:
    """Constant padding: ``pads`` the begins of every axis, then the ends (ONNX's layout)."""
    rank = x.ndim
    widths = [(a["pads"][i], a["pads"][i + rank]) for i in range(rank)]
    return np.pad(x, widths, constant_values=np.asarray(a["value"], x.dtype))


def _channel(v: np.ndarray, rank: int) -> np.ndarray:
    """A per-channel vector [C] shaped to broadcast along axis 1 of a rank-``rank`` tensor."""
    return v.reshape(-1, *([1] * (rank - 2)))


def batch_norm(a: Attrs, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray,
               var: np.ndarray) -> np.ndarray:
    """Inference BatchNormalization over axis 1: (x - mean) / sqrt(var + eps) * scale + bias."""
    eps = np.asarray(a["eps"], x.dtype)
    return (x - _channel(mean, x.ndim)) / np.sqrt(_channel(var, x.ndim) + eps) * _channel(scale, x.ndim) \
        + _channel(bias, x.ndim)


def _bn_factor(a: Attrs, scale: np.ndarray, var: np.ndarray) -> np.ndarray:
    return scale / np.sqrt(var + np.asarray(a["eps"], var.dtype))


def bn_fold_weight(a: Attrs, w: np.ndarray, scale: np.ndarray, var: np.ndarray) -> np.ndarray:
    """A convolution's weight [O, ...] with a following BatchNormalization folded in: w * scale / sqrt(var + eps)."""
    return w * _bn_factor(a, scale, var).reshape(-1, *([1] * (w.ndim - 1)))


def bn_fold_bias(a: Attrs, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray,
                 b: np.ndarray | None = None) -> np.ndarray:
    """A convolution's bias [O] (absent: 0) with a following BatchNormalization folded in:
    (b - mean) * scale / sqrt(var + eps) + bias."""
    return ((0.0 if b is None else b) - mean) * _bn_factor(a, scale, var) + bias


# --- losses -----------------------------------------------------------------


def cross_entropy_loss(a: Attrs, logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    logp = log_softmax(logits, -1)
    picked = np.take_along_axis(logp, targets.astype(np.int64)[..., None], axis=-1)
    return -np.mean(picked)


def bce_loss(a: Attrs, p: np.ndarray, t: np.ndarray) -> np.ndarray:
    eps = np.asarray(1e-12, dtype=p.dtype)
    return -np.mean(t * np.log(np.maximum(p, eps)) + (1 - t) * np.log(np.maximum(1 - p, eps)))


# --- backward ---------------------------------------------------------------


def silu_grad(a: Attrs, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    s = sigmoid(x)
    return dy * (s + x * s * (1 - s))


def rms_norm_grad_x(a: Attrs, x: np.ndarray, gamma: np.ndarray, dy: np.ndarray) -> np.ndarray:
    axes = _norm_axes(x, a["axis"])
    n = math.prod(x.shape[i] for i in axes)
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + a["eps"])
    g = dy * gamma
    return inv * g - x * inv**3 * np.sum(g * x, axis=axes, keepdims=True) / n


def rms_norm_grad_w(a: Attrs, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    axes = _norm_axes(x, a["axis"])
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + a["eps"])
    lead = tuple(range(x.ndim - len(axes)))
    return np.sum(dy * x * inv, axis=lead)


def layer_norm_grad_x(a: Attrs, x: np.ndarray, gamma: np.ndarray, dy: np.ndarray) -> np.ndarray:
    axes = _norm_axes(x, a["axis"])
    mean = np.mean(x, axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(np.mean((x - mean) ** 2, axis=axes, keepdims=True) + a["eps"])
    xhat = (x - mean) * inv
    g = dy * gamma
    return inv * (g - np.mean(g, axis=axes, keepdims=True) - xhat * np.mean(g * xhat, axis=axes, keepdims=True))


# --- fused ------------------------------------------------------------------


def fused_matmul_bias_act(a: Attrs, x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return ACTIVATIONS[a["act"]](np.matmul(x, w) + bias)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return silu(gate) * up


def fused_swiglu(a: Attrs, cat: np.ndarray) -> np.ndarray:
    n = cat.shape[-1] // 2
    first, second = cat[..., :n], cat[..., n:]
    gate, up = (first, second) if a["gate_first"] else (second, first)
    return up * silu(gate)


def attention_block(a: Attrs, hidden: np.ndarray, qkv_w: np.ndarray, out_w: np.ndarray, mask: np.ndarray,
                    qkv_b: np.ndarray, out_b: np.ndarray) -> np.ndarray:
    h = qkv_w.shape[-1] // 3
    qkv = np.matmul(hidden, qkv_w) + qkv_b
    attn_attrs = {"heads": a["heads"], "kv_heads": a["heads"], "scale": a["scale"], "mask": "custom"}
    ctx = attention(attn_attrs, qkv[..., :h], qkv[..., h:2 * h], qkv[..., 2 * h:], mask)
    return np.matmul(ctx, out_w) + out_b


def transformer_layer(a: Attrs, hidden: np.ndarray, qkv_w: np.ndarray, qkv_b: np.ndarray, out_w: np.ndarray,
                      out_b: np.ndarray, ln1_g: np.ndarray, ln1_b: np.ndarray, fc1_w: np.ndarray,
                      fc1_b: np.ndarray, fc2_w: np.ndarray, fc2_b: np.ndarray, ln2_g: np.ndarray,
                      ln2_b: np.ndarray, mask: np.ndarray) -> np.ndarray:
    attn = attention_block(a, hidden, qkv_w, out_w, mask, qkv_b, out_b)
    h1 = layer_norm(attn + hidden, ln1_g, ln1_b, -1, a["eps1"])
    inner = ACTIVATIONS[a["act"]](np.matmul(h1, fc1_w) + fc1_b)
    return layer_norm(np.matmul(inner, fc2_w) + fc2_b + h1, ln2_g, ln2_b, -1, a["eps2"])


# --- host-sync ops ----------------------------------------------------------


def item(a: Attrs, x: np.ndarray) -> np.ndarray:
    """``x.item()``: its one element, as a scalar."""
    return x.reshape(())


def non_zero(a: Attrs, x: np.ndarray) -> np.ndarray:
    """The indices [rank, count] of the first ``count`` non-zero elements of ``x`` in row-major order, one column
    per element; columns past the last non-zero element are -1."""
    found = np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)[:, :a["count"]]
    out = np.full((x.ndim, a["count"]), -1, dtype=np.int64)
    out[:, :found.shape[1]] = found
    return out


def cond(a: Attrs, pred: np.ndarray, then: np.ndarray, otherwise: np.ndarray) -> np.ndarray:
    """``then`` if the one element of ``pred`` is true, else ``otherwise``."""
    return then if bool(pred.reshape(())) else otherwise
