"""Every registered op: shape/dtype inference and the kernel's values against an
independent computation (plain numpy/scipy/math loops), plus the interpreter's
random filling of missing leaves."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from scipy import special, stats

from rlx_egraph import Graph, GraphError, evaluate
from rlx_egraph.ir import PARITY_TOLERANCE, REGISTRY, Kind, Node, TensorType, op_spec

RNG = np.random.default_rng(20240611)
STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "i64": np.int64, "i32": np.int32,
           "bool": np.bool_}
FUSED_KINDS = (Kind.FUSED, Kind.WEIGHT_PREP)
Array = np.ndarray


def randn(*shape: int) -> Array:
    return RNG.standard_normal(shape).astype(np.float32)


def uniform(low: float, high: float, *shape: int) -> Array:
    return RNG.uniform(low, high, shape).astype(np.float32)


def ints(high: int, *shape: int) -> Array:
    return RNG.integers(0, high, shape).astype(np.int64)


def elementwise(fn: Callable[[float], float]) -> Callable[[Array], Array]:
    """Apply a scalar python function to every element (an implementation independent of numpy's)."""
    return lambda x: np.vectorize(fn, otypes=[np.float64])(x)


def numeric_grad(f: Callable[[Array], float], x: Array, h: float = 1e-6) -> Array:
    """Central finite differences of a scalar function of ``x`` (float64)."""
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[idx] = h
        grad[idx] = (f(x + step) - f(x - step)) / (2 * h)
    return grad


def forward(op: str, **attrs: Any) -> Callable[..., Array]:
    """The registry kernel of forward op ``op`` (run in float64 by the finite-difference checks)."""
    return lambda *xs: op_spec(op).kernel(attrs, *xs)


# --- independent implementations ---------------------------------------------------


def layer_norm_ref(x: Array, gamma: Array, beta: Array, axes: tuple[int, ...], eps: float) -> Array:
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def rms_norm_ref(x: Array, gamma: Array, beta: Array | None, eps: float) -> Array:
    out = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps) * gamma
    return out if beta is None else out + beta


def group_norm_ref(x: Array, w: Array, b: Array, groups: int, eps: float) -> Array:
    out = np.empty_like(x)
    per = x.shape[1] // groups
    for n in range(x.shape[0]):
        for g in range(groups):
            block = x[n, g * per:(g + 1) * per]
            out[n, g * per:(g + 1) * per] = (block - block.mean()) / math.sqrt(block.var() + eps)
    return out * w[None, :, None, None] + b[None, :, None, None]


def rope_ref(x: Array, theta: float) -> Array:
    """Rotate-half RoPE one (position, pair) at a time."""
    out = np.empty_like(x)
    seq, dim = x.shape[-2:]
    half = dim // 2
    for p in range(seq):
        for i in range(half):
            angle = p * theta ** (-2.0 * i / dim)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[..., p, i], x[..., p, i + half]
            out[..., p, i] = a * c - b * s
            out[..., p, i + half] = b * c + a * s
    return out


def head_attention(q: Array, k: Array, v: Array, scale: float, keep: Array) -> Array:
    """One head: softmax(q k^T * scale, masked where ``keep`` is False) v."""
    scores = np.where(keep, q @ k.T * scale, -np.inf)
    return special.softmax(scores, axis=-1) @ v


def causal_keep(sq: int, sk: int) -> Array:
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None]


def attention_ref(q: Array, k: Array, v: Array, heads: int, kv_heads: int, scale: float, causal: bool = False,
                  mask: Array | None = None) -> Array:
    """Packed-layout attention [B, S, heads*d], head by head; q head h reads kv head h // (heads/kv_heads)."""
    batch, sq, width = q.shape
    sk, d = k.shape[1], width // heads
    out = np.zeros(q.shape)
    for b in range(batch):
        keep = causal_keep(sq, sk) if causal else np.ones((sq, sk), bool)
        if mask is not None:
            keep = keep & (mask[b][None, :] != 0)
        for h in range(heads):
            kv = slice((h // (heads // kv_heads)) * d, (h // (heads // kv_heads) + 1) * d)
            out[b, :, h * d:(h + 1) * d] = head_attention(q[b, :, h * d:(h + 1) * d], k[b, :, kv], v[b, :, kv],
                                                          scale, keep)
    return out


def causal_attention_ref(q: Array, k: Array, v: Array, scale: float) -> Array:
    """Split-head causal attention [B, H, S, D] with GQA."""
    batch, heads, sq = q.shape[:3]
    group = heads // k.shape[1]
    out = np.zeros((batch, heads, sq, v.shape[-1]))
    for b in range(batch):
        for h in range(heads):
            out[b, h] = head_attention(q[b, h], k[b, h // group], v[b, h // group], scale,
                                       causal_keep(sq, k.shape[2]))
    return out


def conv2d_ref(x: Array, w: Array, stride: int, padding: int, groups: int) -> Array:
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * padding, wd + 2 * padding))
    xp[:, :, padding:padding + h, padding:padding + wd] = x
    oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    per_group = o // groups
    for b, oc, i, j in np.ndindex(out.shape):
        g = oc // per_group
        patch = xp[b, g * cg:(g + 1) * cg, i * stride:i * stride + kh, j * stride:j * stride + kw]
        out[b, oc, i, j] = float(np.sum(patch * w[oc]))
    return out


def max_pool_ref(x: Array, kernel: int, stride: int, padding: int) -> Array:
    n, c, h, w = x.shape
    oh, ow = (h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1
    out = np.full((n, c, oh, ow), -np.inf)
    for b, ch, i, j in np.ndindex(out.shape):
        for di, dj in np.ndindex(kernel, kernel):
            r, s = i * stride + di - padding, j * stride + dj - padding
            if 0 <= r < h and 0 <= s < w:
                out[b, ch, i, j] = max(out[b, ch, i, j], x[b, ch, r, s])
    return out


def upsample_ref(x: Array) -> Array:
    out = np.zeros((*x.shape[:2], 2 * x.shape[2], 2 * x.shape[3]))
    for b, c, i, j in np.ndindex(out.shape):
        out[b, c, i, j] = x[b, c, i // 2, j // 2]
    return out


def gelu_tanh_ref(v: float) -> float:
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


# --- the case table -----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One op applied to Input leaves fed ``arrays``: the node's type and the value it must have."""

    op: str
    label: str
    build: Callable[..., int]  # (graph, *input ids) -> id of the node under test
    expected: Callable[..., Any]  # (*arrays, floats as float64) -> expected value
    arrays: tuple[Array, ...]
    shape: tuple[int, ...]
    dtype: str = "f32"
    tol: tuple[float, float] = (1e-5, 1e-5)


def case(op: str, build: Callable[..., int], expected: Callable[..., Any], *arrays: Array,
         shape: tuple[int, ...], dtype: str = "f32", label: str = "", tol: tuple[float, float] = (1e-5, 1e-5)) -> Case:
    return Case(op, label or op, build, expected, arrays, shape, dtype, tol)


P = randn(2, 3)  # the value fed to Param "p"
C = randn(3, 2)
X234, Y31, X214 = randn(2, 3, 4), randn(3, 1), randn(2, 1, 4)
POS = uniform(0.5, 2.0, 3, 4)
TIES_A, TIES_B = RNG.integers(0, 3, (3, 4)).astype(np.float32), RNG.integers(0, 3, (4,)).astype(np.float32)
COND = RNG.random((3, 1)) < 0.5
MASK = np.array([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0]], np.float32)
Q, K, V = randn(2, 4, 8), randn(2, 5, 8), randn(2, 5, 8)
K_GQA, V_GQA = randn(2, 5, 4), randn(2, 5, 4)
NORM_X = randn(2, 3, 6)
GAMMA, BETA = uniform(0.5, 1.5, 6), randn(6)
CONV_X = randn(2, 4, 5, 5)
SPLIT_Q, SPLIT_K, SPLIT_V = randn(2, 4, 5, 6), randn(2, 2, 5, 6), randn(2, 2, 5, 3)
DY26 = randn(2, 6)



def onnx_cumsum(g: Graph, x: int) -> int:
    """An OnnxOp holding ONNX CumSum over axis 1 (the axis a constant of its one-node graph)."""
    import onnx

    from rlx_egraph.ir.ops.onnx_op import encode_proto

    node = onnx.helper.make_node("CumSum", ["in0", "c0"], ["out0"])
    axis = onnx.numpy_helper.from_array(np.array(1, np.int64), "c0")
    proto = encode_proto(onnx.helper.make_graph([node], "cumsum", [], [], [axis]))
    return g.add_node("OnnxOp", [x], op_type="CumSum", opset=17, proto=proto)


CASES: list[Case] = [
    # leaves
    case("Input", lambda g, x: x, lambda x: x, X234, shape=(2, 3, 4)),
    case("Param", lambda g: g.param("p", P.shape), lambda: P, shape=(2, 3)),
    case("Constant", lambda g: g.constant(C), lambda: C, shape=(3, 2)),
    case("Constant", lambda g: g.constant(np.array([3, -1], np.int64)), lambda: np.array([3, -1]), shape=(2,),
         dtype="i64", label="Constant-i64"),
    case("Scalar", lambda g: g.scalar(2.5), lambda: 2.5, shape=()),
    # leaves made of dims (the ONNX importer's positions, causal masks and shape values)
    case("Arange", lambda g: g.add_node("Arange", start=3, length=4), lambda: np.arange(3, 7), shape=(4,),
         dtype="i64"),
    case("CausalMask", lambda g: g.add_node("CausalMask", shape=(1, 2, 4)), lambda: np.tri(2, 4, 2, bool)[None],
         shape=(1, 2, 4), dtype="bool"),
    case("DimValues", lambda g: g.add_node("DimValues", values=(2, 5, 7, 1), shape=(2, 2)),
         lambda: np.array([[2, 5], [7, 1]]), shape=(2, 2), dtype="i64"),
    # a standard ONNX op MIR has no op for, kept opaque
    case("OnnxOp", onnx_cumsum, lambda x: np.cumsum(x, axis=1), X234, shape=(2, 3, 4)),
    # matmul
    case("MatMul", lambda g, a, b: g.matmul(a, b), lambda a, b: np.einsum("bmk,kn->bmn", a, b),
         randn(3, 4, 8), randn(8, 5), shape=(3, 4, 5)),
    case("MatMul", lambda g, a, b: g.matmul(a, b), lambda a, b: np.einsum("xmk,ykn->xymn", a[:, 0], b),
         randn(2, 1, 4, 8), randn(3, 8, 5), shape=(2, 3, 4, 5), label="MatMul-broadcast-batch"),
    case("MatMulAT", lambda g, a, b: g.matmul_at(a, b), lambda a, b: np.einsum("bkm,kn->bmn", a, b),
         randn(2, 6, 4), randn(6, 5), shape=(2, 4, 5)),
    case("MatMulBT", lambda g, a, b: g.matmul_bt(a, b), lambda a, b: np.einsum("mk,bnk->bmn", a, b),
         randn(4, 8), randn(3, 5, 8), shape=(3, 4, 5)),
    # elementwise binary (broadcasting)
    case("Add", lambda g, a, b: g.add(a, b), lambda a, b: a + b, X214, Y31, shape=(2, 3, 4)),
    case("Sub", lambda g, a, b: g.sub(a, b), lambda a, b: a - b, Y31, X214, shape=(2, 3, 4)),
    case("Mul", lambda g, a, b: g.mul(a, b), lambda a, b: a * b, X234, randn(4), shape=(2, 3, 4)),
    case("Div", lambda g, a, b: g.div(a, b), lambda a, b: a / b, X234, POS, shape=(2, 3, 4)),
    case("Max", lambda g, a, b: g.max(a, b), lambda a, b: np.where(a > b, a, b), X214, Y31, shape=(2, 3, 4)),
    case("Min", lambda g, a, b: g.min(a, b), lambda a, b: np.where(a < b, a, b), X214, Y31, shape=(2, 3, 4)),
    case("Pow", lambda g, a, b: g.pow(a, b), lambda a, b: np.exp(b * np.log(a)),
         POS, randn(4), shape=(3, 4)),
    case("Greater", lambda g, a, b: g.greater(a, b), lambda a, b: a > b, TIES_A, TIES_B, shape=(3, 4), dtype="bool"),
    case("Less", lambda g, a, b: g.less(a, b), lambda a, b: a < b, TIES_A, TIES_B, shape=(3, 4), dtype="bool"),
    case("Equal", lambda g, a, b: g.equal(a, b), lambda a, b: a == b, TIES_A, TIES_B, shape=(3, 4), dtype="bool"),
    case("Where", lambda g, c, a, b: g.where(c, a, b), lambda c, a, b: c * a + (1 - c) * b,
         COND, randn(1, 4), randn(3, 4), shape=(3, 4)),
    # elementwise unary
    case("Relu", lambda g, x: g.relu(x), elementwise(lambda v: max(v, 0.0)), X234, shape=(2, 3, 4)),
    case("Silu", lambda g, x: g.silu(x), elementwise(lambda v: v / (1 + math.exp(-v))), X234, shape=(2, 3, 4)),
    case("Sigmoid", lambda g, x: g.sigmoid(x), elementwise(lambda v: 1 / (1 + math.exp(-v))), X234, shape=(2, 3, 4)),
    case("Tanh", lambda g, x: g.tanh(x), elementwise(math.tanh), X234, shape=(2, 3, 4)),
    case("Exp", lambda g, x: g.exp(x), elementwise(math.exp), X234, shape=(2, 3, 4)),
    case("Log", lambda g, x: g.log(x), elementwise(math.log), POS, shape=(3, 4)),
    case("Sqrt", lambda g, x: g.sqrt(x), elementwise(math.sqrt), POS, shape=(3, 4)),
    case("Rsqrt", lambda g, x: g.rsqrt(x), elementwise(lambda v: 1 / math.sqrt(v)), POS, shape=(3, 4)),
    case("Recip", lambda g, x: g.recip(x), elementwise(lambda v: 1 / v), POS, shape=(3, 4)),
    case("Erf", lambda g, x: g.erf(x), elementwise(math.erf), X234, shape=(2, 3, 4)),
    case("Neg", lambda g, x: g.neg(x), lambda x: np.array([[-3, 0, 7]]), np.array([[3, 0, -7]], np.int64),
         shape=(1, 3), dtype="i64"),
    case("Abs", lambda g, x: g.abs(x), elementwise(abs), X234, shape=(2, 3, 4)),
    case("Identity", lambda g, x: g.identity(x), lambda x: x, ints(9, 2, 3), shape=(2, 3), dtype="i64"),
    case("Gelu", lambda g, x: g.gelu(x), lambda x: x * stats.norm.cdf(x), X234, shape=(2, 3, 4)),
    case("Gelu", lambda g, x: g.gelu(x, approximate="tanh"), elementwise(gelu_tanh_ref), X234, shape=(2, 3, 4),
         label="Gelu-tanh"),
    case("Cast", lambda g, x: g.cast(x, dtype="i64"), lambda x: np.array([1, -1, 2, 0]),
         np.array([1.7, -1.7, 2.2, -0.5], np.float32), shape=(4,), dtype="i64"),
    case("Cast", lambda g, x: g.cast(x, dtype="bool"), lambda x: np.array([False, True, True, False]),
         np.array([0.0, 1.5, -2.0, 0.0], np.float32), shape=(4,), dtype="bool", label="Cast-bool"),
    case("Cast", lambda g, x: g.cast(x, dtype="f16"), lambda x: np.array([1.0, 1.0, 65504.0]),
         np.array([1.0, 1.0001, 65504.0], np.float32), shape=(3,), dtype="f16", label="Cast-f16", tol=(0, 0)),
    case("Cast", lambda g, x: g.cast(x, dtype="f32"), lambda x: np.array([1.0, 0.0]), np.array([True, False]),
         shape=(2,), label="Cast-from-bool"),
    # reductions
    case("Softmax", lambda g, x: g.softmax(x, axis=1), lambda x: np.exp(x - special.logsumexp(x, 1, keepdims=True)),
         X234, shape=(2, 3, 4)),
    case("LogSoftmax", lambda g, x: g.log_softmax(x), lambda x: x - special.logsumexp(x, -1, keepdims=True),
         X234, shape=(2, 3, 4)),
    case("ReduceSum", lambda g, x: g.reduce_sum(x, axes=(0, 2), keepdims=True),
         lambda x: x.sum(axis=(0, 2), keepdims=True), X234, shape=(1, 3, 1)),
    case("ReduceMean", lambda g, x: g.reduce_mean(x, axes=(-1,)), lambda x: x.mean(axis=-1), X234, shape=(2, 3)),
    case("SumAll", lambda g, x: g.sum_all(x), lambda x: sum(x.ravel().tolist()), X234, shape=()),
    case("MeanAll", lambda g, x: g.mean_all(x), lambda x: sum(x.ravel().tolist()) / 24, X234, shape=()),
    case("SumRows", lambda g, x: g.sum_rows(x), lambda x: x.sum(axis=(0, 1)), X234, shape=(4,)),
    # host-sync ops
    case("Item", lambda g, x: g.item(x), lambda x: x.reshape(()), randn(1, 1), shape=()),
    case("NonZero", lambda g, x: g.non_zero(x, count=5), lambda x: np.array([[0, 0, 1, 1, -1], [0, 2, 1, 3, -1]]),
         np.array([[1.0, 0.0, -2.0, 0.0], [0.0, 3.0, 0.0, 0.5]], np.float32), shape=(2, 5), dtype="i64"),
    case("NonZero", lambda g, x: g.non_zero(x, count=2), lambda x: np.array([[1, 3]]), np.array([0, 7, 0, 1, 4]),
         shape=(1, 2), dtype="i64", label="NonZero-first-count"),
    case("Cond", lambda g, p, a, b: g.cond(p, a, b), lambda p, a, b: b, np.array([False]), X234, randn(2, 3, 4),
         shape=(2, 3, 4)),
    case("Cond", lambda g, p, a, b: g.cond(p, a, b), lambda p, a, b: a, np.array(True), X234, randn(2, 3, 4),
         shape=(2, 3, 4), label="Cond-then"),
    # norms
    case("LayerNorm", lambda g, x, w, b: g.layer_norm(x, w, b, eps=1e-2),
         lambda x, w, b: layer_norm_ref(x, w, b, (-1,), 1e-2), NORM_X, GAMMA, BETA, shape=(2, 3, 6)),
    case("LayerNorm", lambda g, x, w, b: g.layer_norm(x, w, b, axis=1),
         lambda x, w, b: layer_norm_ref(x, w, b, (-2, -1), 1e-5), NORM_X, randn(3, 6), randn(3, 6),
         shape=(2, 3, 6), label="LayerNorm-two-axes"),
    case("RmsNorm", lambda g, x, w: g.rms_norm(x, w, eps=1e-2), lambda x, w: rms_norm_ref(x, w, None, 1e-2),
         NORM_X, GAMMA, shape=(2, 3, 6)),
    case("RmsNorm", lambda g, x, w, b: g.rms_norm(x, w, b), lambda x, w, b: rms_norm_ref(x, w, b, 1e-6),
         NORM_X, GAMMA, BETA, shape=(2, 3, 6), label="RmsNorm-beta"),
    case("GroupNorm", lambda g, x, w, b: g.group_norm(x, w, b, groups=3, eps=1e-3),
         lambda x, w, b: group_norm_ref(x, w, b, 3, 1e-3), randn(2, 6, 3, 2), randn(6), randn(6), shape=(2, 6, 3, 2)),
    # layout
    case("Reshape", lambda g, x: g.reshape(x, shape=(4, -1)), lambda x: np.array(x.ravel().tolist()).reshape(4, 6),
         X234, shape=(4, 6)),
    case("Transpose", lambda g, x: g.transpose(x, perm=(2, 0, 1)), lambda x: np.einsum("abc->cab", x), X234,
         shape=(4, 2, 3)),
    case("Narrow", lambda g, x: g.narrow(x, axis=1, start=1, length=2), lambda x: x[:, 1:3], X234, shape=(2, 2, 4)),
    case("Concat", lambda g, a, b, c: g.concat([a, b, c], axis=0), lambda a, b, c: np.vstack([a, b, c]),
         randn(1, 3), randn(2, 3), randn(1, 3), shape=(4, 3)),
    case("Expand", lambda g, x: g.expand(x, shape=(2, 3, 4)), lambda x: x * np.ones((2, 3, 4)), Y31, shape=(2, 3, 4)),
    # projection: result 1 (the sum) of a multi-result node
    case("Get", lambda g, x, r, w: g.get(g.fused_add_rms_norm(x, r, w), index=1), lambda x, r, w: x + r,
         X234, randn(2, 3, 4), randn(4), shape=(2, 3, 4)),
    # transformer
    case("Embedding", lambda g, t, i: g.embedding(t, i), lambda t, i: np.array([[t[j] for j in row] for row in i]),
         randn(5, 3), ints(5, 2, 4), shape=(2, 4, 3)),
    case("RoPE", lambda g, x: g.rope(x, theta=100.0), lambda x: rope_ref(x, 100.0), randn(2, 5, 6), shape=(2, 5, 6)),
    case("Attention", lambda g, q, k, v: g.attention(q, k, v, heads=2),  # 2 heads of width 4: scale 1/sqrt(4)
         lambda q, k, v: attention_ref(q, k, v, 2, 2, 0.5), Q, K, V, shape=(2, 4, 8)),
    case("Attention", lambda g, q, k, v: g.attention(q, q, v, heads=2, mask="causal", scale=0.3),
         lambda q, k, v: attention_ref(q, q, v, 2, 2, 0.3, causal=True), Q, K, randn(2, 4, 8), shape=(2, 4, 8),
         label="Attention-causal"),
    case("Attention", lambda g, q, k, v, m: g.attention(q, k, v, m, heads=2, mask="custom"),
         lambda q, k, v, m: attention_ref(q, k, v, 2, 2, 0.5, mask=m), Q, K, V, MASK, shape=(2, 4, 8),
         label="Attention-custom"),
    case("Attention", lambda g, q, k, v: g.attention(q, k, v, heads=4, kv_heads=2),
         lambda q, k, v: attention_ref(q, k, v, 4, 2, 1 / math.sqrt(2)), Q, K_GQA, V_GQA, shape=(2, 4, 8),
         label="Attention-gqa"),
    case("CausalAttention", lambda g, q, k, v: g.causal_attention(q, k, v),
         lambda q, k, v: causal_attention_ref(q, k, v, 1 / math.sqrt(6)), SPLIT_Q, SPLIT_K, SPLIT_V,
         shape=(2, 4, 5, 3)),
    # vision
    case("Conv2d", lambda g, x, w: g.conv2d(x, w), lambda x, w: conv2d_ref(x, w, 1, 0, 1), CONV_X, randn(3, 4, 3, 3),
         shape=(2, 3, 3, 3)),
    case("Conv2d", lambda g, x, w: g.conv2d(x, w, stride=2, padding=1, groups=2),
         lambda x, w: conv2d_ref(x, w, 2, 1, 2), CONV_X, randn(6, 2, 3, 3), shape=(2, 6, 3, 3), label="Conv2d-grouped"),
    case("MaxPool2d", lambda g, x: g.max_pool2d(x, kernel=2, stride=2), lambda x: max_pool_ref(x, 2, 2, 0),
         CONV_X, shape=(2, 4, 2, 2)),
    case("MaxPool2d", lambda g, x: g.max_pool2d(x, kernel=3, stride=2, padding=1), lambda x: max_pool_ref(x, 3, 2, 1),
         -np.abs(CONV_X), shape=(2, 4, 3, 3), label="MaxPool2d-padded"),
    case("GlobalAvgPool", lambda g, x: g.global_avg_pool(x),
         lambda x: np.array([[sum(x[n, c].ravel().tolist()) / 25 for c in range(4)] for n in range(2)]), CONV_X,
         shape=(2, 4)),
    case("Upsample2x", lambda g, x: g.upsample2x(x), upsample_ref, randn(1, 2, 2, 3), shape=(1, 2, 4, 6)),
    # losses
    case("CrossEntropyLoss", lambda g, x, t: g.cross_entropy_loss(x, t),
         lambda x, t: -np.mean([x[i, t[i]] - special.logsumexp(x[i]) for i in range(4)]), randn(4, 5), ints(5, 4),
         shape=()),
    case("BceLoss", lambda g, p, t: g.bce_loss(p, t),
         lambda p, t: -np.mean([math.log(a) if b else math.log(1 - a) for a, b in zip(p.ravel(), t.ravel(),
                                                                                      strict=True)]),
         uniform(0.05, 0.95, 3, 4), (RNG.random((3, 4)) < 0.5).astype(np.float32), shape=()),
    # backward, against finite differences of the forward op
    case("SiluGrad", lambda g, x, dy: g.silu_grad(x, dy),
         lambda x, dy: numeric_grad(lambda z: float(np.sum(forward("Silu")(z) * dy)), x), randn(2, 6), DY26,
         shape=(2, 6), tol=(1e-4, 1e-5)),
    case("RmsNormGradX", lambda g, x, w, dy: g.rms_norm_grad_x(x, w, dy, eps=1e-3),
         lambda x, w, dy: numeric_grad(lambda z: float(np.sum(forward("RmsNorm", axis=-1, eps=1e-3)(z, w) * dy)), x),
         randn(2, 6), GAMMA, DY26, shape=(2, 6), tol=(1e-4, 1e-5)),
    case("RmsNormGradW", lambda g, x, dy: g.rms_norm_grad_w(x, dy, eps=1e-3),
         lambda x, dy: numeric_grad(lambda w: float(np.sum(forward("RmsNorm", axis=-1, eps=1e-3)(x, w) * dy)),
                                    np.ones(6)), randn(2, 6), DY26, shape=(6,), tol=(1e-4, 1e-5)),
    case("LayerNormGradX", lambda g, x, w, dy: g.layer_norm_grad_x(x, w, dy, eps=1e-3),
         lambda x, w, dy: numeric_grad(
             lambda z: float(np.sum(forward("LayerNorm", axis=-1, eps=1e-3)(z, w, np.zeros(6)) * dy)), x),
         randn(2, 6), GAMMA, DY26, shape=(2, 6), tol=(1e-4, 1e-5)),
]


def input_dtype(a: Array, float_dtype: str) -> str:
    return {"f": float_dtype, "i": "i64", "b": "bool"}[a.dtype.kind]


def quantise(a: Array, dt: str) -> Array:
    """Round float inputs to values ``dt`` holds exactly (bf16: truncate the mantissa to 7 bits)."""
    if a.dtype.kind != "f" or dt == "f32":
        return a
    if dt == "f16":
        return a.astype(np.float16).astype(np.float32)
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def run_case(c: Case, float_dtype: str = "f32") -> tuple[Node, Array, Any]:
    """Build ``c`` on Input leaves of ``float_dtype``, evaluate it; return node, value and the expected value."""
    g = Graph(c.label)
    arrays = [quantise(a, float_dtype) for a in c.arrays]
    ids = [g.input(f"in{k}", a.shape, input_dtype(a, float_dtype)) for k, a in enumerate(arrays)]
    out = c.build(g, *ids)
    g.set_outputs([out])
    (value,) = evaluate(g, feeds={f"in{k}": a for k, a in enumerate(arrays)}, params={"p": P})
    expected = c.expected(*(a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays))
    return g.node(out), value, expected


def test_every_op_has_a_value_case() -> None:
    covered = {c.op for c in CASES}
    unfused = {name for name, spec in REGISTRY.items() if spec.kind not in FUSED_KINDS}
    assert sorted(unfused - covered) == []
    assert covered <= unfused  # fused ops are proven in test_decompositions.py


@pytest.mark.parametrize("c", CASES, ids=[c.label for c in CASES])
def test_op_type_and_value(c: Case) -> None:
    node, value, expected = run_case(c)
    assert node.op == c.op
    assert node.type == TensorType(c.shape, c.dtype)
    assert value.shape == c.shape and value.dtype == STORAGE[c.dtype]
    if c.dtype in ("bool", "i64", "i32"):
        np.testing.assert_array_equal(value, expected)
    else:
        np.testing.assert_allclose(value.astype(np.float64), expected, rtol=c.tol[0], atol=c.tol[1])


LOW_PRECISION = [("MatMul", "f16"), ("Add", "bf16"), ("Softmax", "bf16"), ("LayerNorm", "f16"), ("RmsNorm", "bf16"),
                 ("Gelu", "bf16"), ("Attention-custom", "f16"), ("Conv2d", "f16"), ("RoPE", "bf16")]


@pytest.mark.parametrize(("label", "dt"), LOW_PRECISION, ids=[f"{lb}-{d}" for lb, d in LOW_PRECISION])
def test_low_precision_through_evaluate(label: str, dt: str) -> None:
    (c,) = [c for c in CASES if c.label == label]
    node, value, expected = run_case(c, dt)
    assert node.dtype == dt
    assert value.dtype == STORAGE[dt]
    if dt == "bf16":  # bf16 is stored as float32 whose low 16 bits are zero
        assert not np.any(value.view(np.uint32) & np.uint32(0xFFFF))
    rtol, atol = PARITY_TOLERANCE[dt]
    np.testing.assert_allclose(value.astype(np.float64), expected, rtol=rtol, atol=atol)


# --- shape and dtype inference ----------------------------------------------------

Leaf = tuple[tuple[int, ...], str]
F32 = "f32"

# (label, leaves, build, expected type, expected canonical attributes)
INFERENCE: list[tuple[str, list[Leaf], Callable[..., int], TensorType, dict[str, Any]]] = [
    ("add-broadcast", [((2, 1, 4), F32), ((3, 1), F32)], lambda g, a, b: g.add(a, b), TensorType((2, 3, 4)), {}),
    ("matmul-batch-broadcast", [((2, 1, 4, 8), F32), ((3, 8, 5), F32)], lambda g, a, b: g.matmul(a, b),
     TensorType((2, 3, 4, 5)), {}),
    ("matmul-2d-weight", [((5, 4, 8), "f16"), ((8, 3), "f16")], lambda g, a, b: g.matmul(a, b),
     TensorType((5, 4, 3), "f16"), {}),
    ("matmul-at", [((2, 6, 4), F32), ((6, 5), F32)], lambda g, a, b: g.matmul_at(a, b), TensorType((2, 4, 5)), {}),
    ("matmul-bt", [((4, 8), F32), ((3, 5, 8), F32)], lambda g, a, b: g.matmul_bt(a, b), TensorType((3, 4, 5)), {}),
    ("compare-bf16", [((3, 1), "bf16"), ((4,), "bf16")], lambda g, a, b: g.less(a, b), TensorType((3, 4), "bool"), {}),
    ("where-broadcast", [((4, 1), "bool"), ((1, 3), "f16"), ((4, 3), "f16")], lambda g, c, a, b: g.where(c, a, b),
     TensorType((4, 3), "f16"), {}),
    ("reduce-keepdims", [((2, 3, 4), F32)], lambda g, x: g.reduce_sum(x, axes=(1,), keepdims=True),
     TensorType((2, 1, 4)), {"axes": (-2,), "keepdims": True}),
    ("reduce-axes-sorted-negative", [((2, 3, 4), F32)], lambda g, x: g.reduce_mean(x, axes=(2, 0)),
     TensorType((3,)), {"axes": (-3, -1), "keepdims": False}),
    ("softmax-axis", [((2, 3, 4), F32)], lambda g, x: g.softmax(x, axis=0), TensorType((2, 3, 4)), {"axis": -3}),
    ("layernorm-axis", [((2, 3, 4), F32), ((3, 4), F32), ((3, 4), F32)],
     lambda g, x, w, b: g.layer_norm(x, w, b, axis=1), TensorType((2, 3, 4)), {"axis": -2, "eps": 1e-5}),
    ("narrow-axis", [((5, 3, 4), F32)], lambda g, x: g.narrow(x, axis=0, start=1, length=3), TensorType((3, 3, 4)),
     {"axis": -3}),
    ("concat-axis", [((2, 3), F32), ((2, 5), F32)], lambda g, a, b: g.concat([a, b], axis=1), TensorType((2, 8)),
     {"axis": -1}),
    ("reshape-wildcard", [((2, 3, 4), "i64")], lambda g, x: g.reshape(x, shape=(-1, 4)), TensorType((6, 4), "i64"),
     {"shape": (6, 4)}),
    ("transpose", [((2, 3, 4), F32)], lambda g, x: g.transpose(x, perm=(1, 2, 0)), TensorType((3, 4, 2)), {}),
    ("expand", [((3, 1), F32)], lambda g, x: g.expand(x, shape=(2, 3, 4)), TensorType((2, 3, 4)), {}),
    ("attention-defaults", [((2, 3, 16), F32)] * 3, lambda g, q, k, v: g.attention(q, k, v, heads=4),
     TensorType((2, 3, 16)), {"heads": 4, "kv_heads": 4, "scale": 0.5, "mask": "none"}),
    ("attention-gqa", [((2, 3, 16), F32), ((2, 5, 8), F32), ((2, 5, 8), F32)],
     lambda g, q, k, v: g.attention(q, k, v, heads=4, kv_heads=2), TensorType((2, 3, 16)), {"kv_heads": 2}),
    ("causal-gqa", [((1, 4, 3, 16), F32), ((1, 2, 3, 16), F32), ((1, 2, 3, 8), F32)],
     lambda g, q, k, v: g.causal_attention(q, k, v), TensorType((1, 4, 3, 8)), {"scale": 0.25}),
    ("embedding", [((7, 5), "f16"), ((2, 3), "i64")], lambda g, t, i: g.embedding(t, i), TensorType((2, 3, 5), "f16"),
     {}),
    ("conv-stride-pad", [((1, 3, 7, 7), F32), ((8, 3, 3, 3), F32)], lambda g, x, w: g.conv2d(x, w, stride=2, padding=1),
     TensorType((1, 8, 4, 4)), {}),
    ("maxpool", [((1, 2, 7, 6), F32)], lambda g, x: g.max_pool2d(x, kernel=3, stride=2, padding=1),
     TensorType((1, 2, 4, 3)), {}),
    ("global-avg-pool", [((2, 5, 3, 3), F32)], lambda g, x: g.global_avg_pool(x), TensorType((2, 5)), {}),
    ("upsample", [((1, 2, 3, 4), "bf16")], lambda g, x: g.upsample2x(x), TensorType((1, 2, 6, 8), "bf16"), {}),
    ("cast", [((2, 3), F32)], lambda g, x: g.cast(x, dtype="bf16"), TensorType((2, 3), "bf16"), {}),
    ("cross-entropy", [((4, 5), F32), ((4,), "i64")], lambda g, x, t: g.cross_entropy_loss(x, t), TensorType(()), {}),
    ("sum-rows", [((2, 3, 4), F32)], lambda g, x: g.sum_rows(x), TensorType((4,)), {}),
    ("mean-all", [((2, 3, 4), "f16")], lambda g, x: g.mean_all(x), TensorType((), "f16"), {}),
    ("rms-grad-w-axis", [((2, 3, 4), F32), ((2, 3, 4), F32)], lambda g, x, dy: g.rms_norm_grad_w(x, dy, axis=1),
     TensorType((3, 4)), {"axis": -2}),
]


@pytest.mark.parametrize(("leaves", "build", "want", "attrs"), [row[1:] for row in INFERENCE],
                         ids=[row[0] for row in INFERENCE])
def test_shape_dtype_inference(leaves: list[Leaf], build: Callable[..., int], want: TensorType,
                               attrs: dict[str, Any]) -> None:
    g = Graph()
    ids = [g.input(f"in{k}", shape, dt) for k, (shape, dt) in enumerate(leaves)]
    node = g.node(build(g, *ids))
    assert node.type == want
    assert {key: node.attrs[key] for key in attrs} == attrs


# --- properties of particular kernels ----------------------------------------------


def run(build: Callable[..., int], *arrays: Array) -> Array:
    """Evaluate one node built on Input leaves fed ``arrays`` (all f32)."""
    g = Graph()
    ids = [g.input(f"in{k}", a.shape, input_dtype(a, "f32")) for k, a in enumerate(arrays)]
    g.set_outputs([build(g, *ids)])
    return evaluate(g, feeds={f"in{k}": a for k, a in enumerate(arrays)})[0]


def test_tanh_gelu_approximates_erf_gelu() -> None:
    x = np.linspace(-6, 6, 241, dtype=np.float32)
    exact = run(lambda g, v: g.gelu(v), x)
    approx = run(lambda g, v: g.gelu(v, approximate="tanh"), x)
    np.testing.assert_allclose(exact, x * stats.norm.cdf(x.astype(np.float64)), atol=1e-6)
    gap = np.abs(exact - approx)
    assert 1e-4 < gap.max() < 5e-4  # the two forms differ, but only slightly


def test_softmax_is_stable_and_sums_to_one() -> None:
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -1000.0], [0.0, 1.0, 2.0]], np.float32)
    out = run(lambda g, v: g.softmax(v), x)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out[0], out[2], rtol=1e-6)
    np.testing.assert_allclose(out[1], 1 / 3, rtol=1e-6)
    log = run(lambda g, v: g.log_softmax(v), x)
    np.testing.assert_allclose(log, np.log(out), rtol=1e-5, atol=1e-6)
    sums = run(lambda g, v: g.softmax(v, axis=0), randn(5, 3)).sum(axis=0)
    np.testing.assert_allclose(sums, 1.0, rtol=1e-6)


def test_rope_rotates_pairs() -> None:
    x = randn(2, 3, 7, 8)
    out = run(lambda g, v: g.rope(v), x)
    np.testing.assert_array_equal(out[..., 0, :], x[..., 0, :])  # position 0 is the identity
    pair_norm = lambda a: np.hypot(a[..., :4], a[..., 4:])  # pairs are (i, i + D/2)
    np.testing.assert_allclose(pair_norm(out), pair_norm(x), rtol=1e-5)
    assert not np.allclose(out[..., 1:, :], x[..., 1:, :], atol=1e-3)


def test_causal_attention_first_query_sees_only_key_zero() -> None:
    q, k, v = randn(2, 5, 8), randn(2, 5, 8), randn(2, 5, 8)
    out = run(lambda g, a, b, c: g.attention(a, b, c, heads=2, mask="causal"), q, k, v)
    np.testing.assert_allclose(out[:, 0], v[:, 0], rtol=1e-6)
    split = run(lambda g, a, b, c: g.causal_attention(a, b, c), SPLIT_Q, SPLIT_K[:, :1], SPLIT_V[:, :1])
    np.testing.assert_allclose(split[:, :, 0], np.broadcast_to(SPLIT_V[:, :1, 0], (2, 4, 3)), rtol=1e-6)


def test_custom_mask_drops_masked_keys() -> None:
    mask = np.array([[1, 0, 1, 0, 0], [0, 0, 0, 1, 0]], np.float32)
    build = lambda g, a, b, c, m: g.attention(a, b, c, m, heads=2, mask="custom")
    base = run(build, Q, K, V, mask)
    dropped = mask[:, :, None] == 0
    noisy = run(build, Q, np.where(dropped, 100 * randn(*K.shape), K), np.where(dropped, randn(*V.shape), V), mask)
    np.testing.assert_allclose(noisy, base, rtol=1e-6, atol=1e-7)  # masked keys carry ~0 weight
    np.testing.assert_allclose(base[1], np.tile(V[1, 3], (4, 1)), rtol=1e-6)  # one kept key: its value


def test_gqa_equals_repeating_kv_heads() -> None:
    def repeat_packed(x: Array) -> Array:  # [B, S, 2*d] -> [B, S, 4*d], each kv head twice
        b, s, w = x.shape
        return np.repeat(x.reshape(b, s, 2, w // 2), 2, axis=2).reshape(b, s, 2 * w)

    gqa = run(lambda g, a, b, c: g.attention(a, b, c, heads=4, kv_heads=2, mask="causal"), Q, K_GQA, V_GQA)
    mha = run(lambda g, a, b, c: g.attention(a, b, c, heads=4, mask="causal"), Q, repeat_packed(K_GQA),
              repeat_packed(V_GQA))
    np.testing.assert_allclose(gqa, mha, rtol=1e-6, atol=1e-7)
    split = run(lambda g, a, b, c: g.causal_attention(a, b, c), SPLIT_Q, SPLIT_K, SPLIT_V)
    full = run(lambda g, a, b, c: g.causal_attention(a, b, c), SPLIT_Q, np.repeat(SPLIT_K, 2, axis=1),
               np.repeat(SPLIT_V, 2, axis=1))
    np.testing.assert_allclose(split, full, rtol=1e-6, atol=1e-7)


# --- evaluate's random leaves -------------------------------------------------------


def leaves_graph() -> tuple[Graph, dict[str, int]]:
    g = Graph()
    ids = {"x": g.input("x", (3, 4)), "w": g.param("w", (4, 2)), "h": g.input("h", (2, 2), "f16"),
           "b": g.param("b", (2,), "bf16"), "i": g.input("i", (5,), "i64"), "c": g.input("c", (6,), "bool")}
    g.set_outputs([g.matmul(ids["x"], ids["w"])])
    return g, ids


def test_evaluate_fills_missing_leaves_deterministically() -> None:
    g, ids = leaves_graph()
    first, again, other = (evaluate(g, seed=s, return_all=True) for s in (1, 1, 2))
    for nid in first:
        np.testing.assert_array_equal(first[nid], again[nid])
    for name in ("x", "w", "h", "b", "i"):
        assert not np.array_equal(first[ids[name]], other[ids[name]]), name
    assert {name: first[i].dtype for name, i in ids.items()} == {
        "x": np.float32, "w": np.float32, "h": np.float16, "b": np.float32, "i": np.int64, "c": np.bool_}
    assert not np.any(first[ids["b"]].view(np.uint32) & np.uint32(0xFFFF))  # bf16 values
    # The same name gets the same data in another graph that uses it the same way.
    g2 = Graph()
    x2 = g2.input("x", (3, 4))
    g2.set_outputs([g2.relu(x2)])
    np.testing.assert_array_equal(evaluate(g2, seed=1, return_all=True)[x2], first[ids["x"]])
    # Feeds override the random values; other leaves keep theirs.
    fed = evaluate(g, feeds={"x": np.ones((3, 4))}, seed=1, return_all=True)
    np.testing.assert_array_equal(fed[ids["x"]], np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(fed[ids["w"]], first[ids["w"]])
    np.testing.assert_allclose(fed[g.outputs[0]], np.ones((3, 4)) @ first[ids["w"]], rtol=1e-6)


def test_evaluate_keeps_integer_leaves_in_range() -> None:
    g = Graph()
    ids = g.input("ids", (400,), "i64")
    targets = g.input("targets", (300,), "i64")
    g.set_outputs([g.embedding(g.param("table", (5, 3)), ids),
                   g.cross_entropy_loss(g.input("logits", (300, 3)), targets)])
    values = evaluate(g, return_all=True)
    assert set(values[ids].tolist()) == set(range(5))
    assert set(values[targets].tolist()) == set(range(3))


@pytest.mark.parametrize(("batch", "keys"), [(6, 4), (3, 1), (1, 5)])
def test_evaluate_key_masks_keep_a_key_per_row(batch: int, keys: int) -> None:
    g = Graph()
    q, k = g.input("q", (batch, 2, 8)), g.input("k", (batch, keys, 8))
    mask = g.input("mask", (batch, keys))
    hidden = g.input("hidden", (batch, keys, 8))
    block_mask = g.input("block_mask", (batch, keys))
    block = g.fused_attention_block(hidden, g.param("qkv_w", (8, 24)), g.param("out_w", (8, 8)), block_mask,
                                    g.param("qkv_b", (24,)), g.param("out_b", (8,)), heads=2, scale=0.5)
    g.set_outputs([g.attention(q, k, k, mask, heads=2, mask="custom"), block])
    values = evaluate(g, return_all=True)
    for m in (values[mask], values[block_mask]):
        assert set(np.unique(m).tolist()) <= {0.0, 1.0}
        assert np.all(m.sum(axis=1) >= 1)
        if batch > 1 and keys > 1:
            assert (m == 0).any()  # the masks exercise masking
    assert all(np.all(np.isfinite(v)) for v in values.values())


def test_evaluate_rejects_wrongly_shaped_feed() -> None:
    g, _ = leaves_graph()
    with pytest.raises(GraphError, match=r"^node 0 \(Input 'x'\): fed shape \[4, 3\], expected \[3, 4\]$"):
        evaluate(g, feeds={"x": np.zeros((4, 3))})
    with pytest.raises(GraphError, match=r"^node 1 \(Param 'w'\): fed shape \[4\], expected \[4, 2\]$"):
        evaluate(g, params={"w": np.zeros(4)})
