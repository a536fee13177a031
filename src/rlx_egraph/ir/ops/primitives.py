"""Primitive MIR ops: leaves, matmuls, elementwise,
reductions, norms, layout, transformer, vision, losses and backward ops.

A primitive has a decomposition exactly when the rules recognise an export form
of it (rules/export_forms.egg): Silu, Gelu, LayerNorm and RmsNorm decompose
into that form; every other primitive is atomic.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..registry import (
    Attrs,
    AttrSpec,
    AttrType,
    DecomposeFn,
    Kind,
    OpSpec,
    SampleFn,
    ShapeError,
    Shapes,
    TensorType,
    TupleType,
    ValueType,
    at_least_one,
    non_negative,
    positive,
    random_shape,
    register,
)
from ..shapes import (
    axis_index,
    broadcast,
    matmul_shape,
    norm_param_check,
    require_float,
    require_int,
    require_rank,
    reshape_target,
    same_dtype,
)
from . import reference as K

if TYPE_CHECKING:
    from ..graph import Graph

T = TensorType
INT, F, B, S, D, INTS = AttrType.INT, AttrType.FLOAT, AttrType.BOOL, AttrType.STR, AttrType.DTYPE, AttrType.INTS


def _dims_positive(shape: tuple[int, ...]) -> str | None:
    return None if all(d > 0 for d in shape) else "must hold positive dimensions"


def _axis(default: int = -1) -> AttrSpec:
    return AttrSpec("axis", INT, default)


def _eps(default: float) -> AttrSpec:
    return AttrSpec("eps", F, default, check=positive)


# --- leaves -------------------------------------------------------------------

_NUMPY_TO_DTYPE = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f32", np.dtype(np.float16): "f16",
                   np.dtype(np.int64): "i64", np.dtype(np.int32): "i32", np.dtype(np.bool_): "bool"}


def _leaf_type(a: Attrs, ins: list[T]) -> T:
    return T(a["shape"], a["dtype"])


def _constant_type(a: Attrs, ins: list[T]) -> T:
    value = a["value"]
    if value.dtype not in _NUMPY_TO_DTYPE:
        raise ShapeError(f"constant of numpy dtype {value.dtype} is not supported")
    return T(tuple(int(d) for d in value.shape), a["dtype"])


def _scalar_type(a: Attrs, ins: list[T]) -> T:
    if a["dtype"] in ("i64", "i32", "bool") and a["value"] != int(a["value"]):
        raise ShapeError(f"a {a['dtype']} scalar needs an integral value, got {a['value']}")
    return T((), a["dtype"])


_LEAF_ATTRS = (AttrSpec("name", S), AttrSpec("shape", INTS, check=_dims_positive, dims=True),
               AttrSpec("dtype", D, "f32"))

LEAVES = [
    OpSpec("Input", Kind.LEAF, (), _leaf_type, None, _LEAF_ATTRS, doc="A graph input fed at run time."),
    OpSpec("Param", Kind.LEAF, (), _leaf_type, None, _LEAF_ATTRS, doc="A named weight."),
    OpSpec("Constant", Kind.LEAF, (), _constant_type, lambda a: K.constant(a),
           (AttrSpec("value", AttrType.ARRAY), AttrSpec("dtype", D, "f32")), doc="A constant tensor."),
    OpSpec("Scalar", Kind.LEAF, (), _scalar_type, lambda a: K.scalar(a),
           (AttrSpec("value", F), AttrSpec("dtype", D, "f32")),
           doc="A rank-0 constant; rules match it by value."),
]

# --- matmul -------------------------------------------------------------------


def _matmul_infer(k_a: int, k_b: int, name: str):
    def infer(a: Attrs, ins: list[T]) -> T:
        dt = same_dtype(ins, f"{name} operands")
        require_float(ins[0], f"{name} operands")
        return T(matmul_shape(ins[0].shape, ins[1].shape, k_a, k_b, name), dt)

    return infer


def matmul_flops(a: Attrs, ins: list[T], out: T) -> int:
    k = ins[0].shape[-1] if ins[0].shape[-1] in (ins[1].shape[-2], ins[1].shape[-1]) else ins[0].shape[-2]
    return 2 * out.numel * k


MATMULS = [
    OpSpec("MatMul", Kind.MATMUL, ("a", "b"), _matmul_infer(-1, -2, "MatMul"), lambda a, x, w: K.matmul(a, x, w),
           flops=matmul_flops, doc="Batched [..., M, K] @ [..., K, N] with numpy broadcasting."),
    OpSpec("MatMulAT", Kind.MATMUL, ("a", "b"), _matmul_infer(-2, -2, "MatMulAT"),
           lambda a, x, w: K.matmul_at(a, x, w), flops=matmul_flops, doc="A^T B: [..., K, M], [..., K, N]."),
    OpSpec("MatMulBT", Kind.MATMUL, ("a", "b"), _matmul_infer(-1, -1, "MatMulBT"),
           lambda a, x, w: K.matmul_bt(a, x, w), flops=matmul_flops, doc="A B^T: [..., M, K], [..., N, K]."),
]

# --- elementwise --------------------------------------------------------------


def _binary_infer(name: str, out_dtype: str | None = None):
    def infer(a: Attrs, ins: list[T]) -> T:
        dt = same_dtype(ins, f"{name} operands")
        return T(broadcast(ins[0].shape, ins[1].shape), out_dtype or dt)

    return infer


_COMMUTATIVE = ("Add", "Mul", "Max", "Min", "Equal")  # a op b == b op a bit for bit


def _binary(name: str, out_dtype: str | None = None) -> OpSpec:
    fn = K.BINARY[name]
    return OpSpec(name, Kind.ELEMENTWISE, ("a", "b"), _binary_infer(name, out_dtype), lambda a, x, y: fn(x, y),
                  doc=f"Elementwise {name} with numpy broadcasting.", commutative=name in _COMMUTATIVE)


def _unary(name: str, float_only: bool = True, decompose: DecomposeFn | None = None) -> OpSpec:
    fn = K.UNARY[name]

    def infer(a: Attrs, ins: list[T]) -> T:
        if float_only:
            require_float(ins[0], f"{name} input")
        return ins[0]

    return OpSpec(name, Kind.ELEMENTWISE, ("x",), infer, lambda a, x: fn(x), doc=f"Elementwise {name}.",
                  decompose=decompose)


def _where_infer(a: Attrs, ins: list[T]) -> T:
    if ins[0].dtype != "bool":
        raise ShapeError(f"Where condition must be bool, got {ins[0].dtype}")
    dt = same_dtype(ins[1:], "Where branches")
    return T(broadcast(*(t.shape for t in ins)), dt)


def _gelu_infer(a: Attrs, ins: list[T]) -> T:
    require_float(ins[0], "Gelu input")
    return ins[0]


def _silu_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """Mul(x, Sigmoid(x)), as exported."""
    return g.mul(ins[0], g.sigmoid(ins[0]))


def _clip_infer(a: Attrs, ins: list[T]) -> T:
    require_float(ins[0], "Clip input")
    if a["min"] > a["max"]:
        raise ShapeError(f"Clip bounds min={a['min']} > max={a['max']}")
    return ins[0]


def _clip_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """Min(Max(x, min), max), as hardtanh and ReLU6 are written out."""
    dt = g.node(ins[0]).dtype
    return g.min(g.max(ins[0], g.scalar(a["min"], dt)), g.scalar(a["max"], dt))


def _clip_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    low = float(rng.uniform(-2.0, 1.0))
    return {"x": random_shape(rng, 1, 3)}, {"min": low, "max": low + float(rng.uniform(0.0, 3.0))}


SQRT_2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_COEF = 0.044715


def _gelu_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """Mul(Mul(x, 1 + Erf(x / sqrt 2)), 0.5), or with 1 + Tanh(sqrt(2/pi) * (x + 0.044715 * Pow(x, 3)))."""
    x = ins[0]
    dt = g.node(x).dtype
    if a["approximate"] == "tanh":
        inner = g.add(x, g.mul(g.pow(x, g.scalar(3.0, dt)), g.scalar(GELU_TANH_COEF, dt)))
        one_plus = g.add(g.tanh(g.mul(inner, g.scalar(SQRT_2_OVER_PI, dt))), g.scalar(1.0, dt))
    else:
        one_plus = g.add(g.erf(g.div(x, g.scalar(SQRT_2, dt))), g.scalar(1.0, dt))
    return g.mul(g.mul(x, one_plus), g.scalar(0.5, dt))


ELEMENTWISE = [
    *(_binary(n) for n in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")),
    *(_binary(n, "bool") for n in ("Greater", "Less", "Equal")),
    OpSpec("Where", Kind.ELEMENTWISE, ("cond", "a", "b"), _where_infer, K.where, doc="cond ? a : b."),
    _unary("Relu"),
    _unary("Silu", decompose=_silu_decompose),
    *(_unary(n) for n in ("Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Rsqrt", "Recip", "Erf")),
    *(_unary(n, float_only=False) for n in ("Neg", "Abs", "Identity")),
    OpSpec("Gelu", Kind.ELEMENTWISE, ("x",), _gelu_infer, lambda a, x: K.gelu(x, a["approximate"]),
           (AttrSpec("approximate", S, "none", choices=("none", "tanh")),),
           doc="GELU, erf form or the tanh approximation.", decompose=_gelu_decompose),
    OpSpec("Clip", Kind.ELEMENTWISE, ("x",), _clip_infer, K.clip, (AttrSpec("min", F), AttrSpec("max", F)),
           doc="min(max(x, min), max): ONNX's Clip with constant bounds (ReLU6, hardtanh).", decompose=_clip_decompose,
           sampler=_clip_sample),
    OpSpec("Cast", Kind.ELEMENTWISE, ("x",), lambda a, ins: T(ins[0].shape, a["dtype"]), K.cast,
           (AttrSpec("dtype", D),), doc="Convert to another dtype."),
]

# --- reductions ---------------------------------------------------------------


def one_element_along(a: Attrs, ins: list[T]) -> str | None:
    """Degenerate (see ``OpSpec.degenerate``): one element along ``axis``, which a Softmax makes 1."""
    if ins[0].shape[axis_index(a["axis"], ins[0].rank)] < 2:
        return f"one element along axis {a['axis']}"
    return None


def normalized_one(a: Attrs, ins: list[T]) -> str | None:
    """Degenerate: a norm over one element (LayerNorm gives beta whatever x and gamma are)."""
    if math.prod(ins[0].shape[axis_index(a["axis"], ins[0].rank):]) < 2:
        return f"one element normalized from axis {a['axis']}"
    return None


def _softmax_infer(a: Attrs, ins: list[T]) -> T:
    require_float(ins[0], "softmax input")
    axis_index(a["axis"], ins[0].rank)
    return ins[0]


def _reduce_infer(a: Attrs, ins: list[T]) -> T:
    x = ins[0]
    axes = {axis_index(ax, x.rank, "reduction axis") for ax in a["axes"]}
    if not axes or len(axes) != len(a["axes"]):
        raise ShapeError(f"reduction axes {list(a['axes'])} must be non-empty and distinct")
    if a["keepdims"]:
        return T(tuple(1 if i in axes else d for i, d in enumerate(x.shape)), x.dtype)
    return T(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


def _sum_rows_infer(a: Attrs, ins: list[T]) -> T:
    require_rank(ins[0], tuple(range(1, 9)), "SumRows input")
    return T(ins[0].shape[-1:], ins[0].dtype)


_REDUCE_ATTRS = (AttrSpec("axes", INTS), AttrSpec("keepdims", B, False))

REDUCTIONS = [
    OpSpec("Softmax", Kind.REDUCTION, ("x",), _softmax_infer, lambda a, x: K.softmax(x, a["axis"]), (_axis(),),
           degenerate=one_element_along),
    OpSpec("LogSoftmax", Kind.REDUCTION, ("x",), _softmax_infer, lambda a, x: K.log_softmax(x, a["axis"]),
           (_axis(),), degenerate=one_element_along),
    OpSpec("ReduceSum", Kind.REDUCTION, ("x",), _reduce_infer,
           lambda a, x: np.sum(x, axis=tuple(a["axes"]), keepdims=a["keepdims"]), _REDUCE_ATTRS),
    OpSpec("ReduceMean", Kind.REDUCTION, ("x",), _reduce_infer,
           lambda a, x: np.mean(x, axis=tuple(a["axes"]), keepdims=a["keepdims"]), _REDUCE_ATTRS),
    OpSpec("SumAll", Kind.REDUCTION, ("x",), lambda a, ins: T((), ins[0].dtype), lambda a, x: np.sum(x)),
    OpSpec("MeanAll", Kind.REDUCTION, ("x",), lambda a, ins: T((), ins[0].dtype), lambda a, x: np.mean(x)),
    OpSpec("SumRows", Kind.REDUCTION, ("x",), _sum_rows_infer,
           lambda a, x: np.sum(x.reshape(-1, x.shape[-1]), axis=0), doc="Sum over every axis but the last."),
]

# --- norms --------------------------------------------------------------------


def norm_infer(name: str, params: tuple[str, ...], residual: bool = False):
    """Shape rule of a norm over axes [axis, rank): x[, residual], then scale/shift params."""

    def infer(a: Attrs, ins: list[T]) -> T:
        x = ins[0]
        require_float(x, f"{name} input")
        same_dtype(ins, f"{name} inputs")
        if residual and ins[1].shape != x.shape:
            raise ShapeError(f"{name} x {list(x.shape)} and residual {list(ins[1].shape)} differ")
        for label, p in zip(params, ins[1 + residual:], strict=False):
            norm_param_check(x, p, a["axis"], f"{name} {label}")
        return x

    return infer


def norm_sampler(params: tuple[str, ...], residual: bool = False) -> SampleFn:
    """Sampler of a norm: x of rank 2 to 4 (and a residual of its shape), a random axis, and ``params`` of
    the normalised shape (a ``name?`` is optional: given half the time)."""

    def sample(rng: np.random.Generator) -> tuple[Shapes, dict[str, int]]:
        shape = random_shape(rng, 2, 4)
        axis = -int(rng.integers(1, len(shape) + 1))
        shapes = {"x": shape} | ({"residual": shape} if residual else {})
        for p in params:
            if not p.endswith("?") or rng.random() < 0.5:
                shapes[p.rstrip("?")] = shape[axis:]
        return shapes, {"axis": axis}

    return sample


def _norm_axes(a: Attrs) -> tuple[int, ...]:
    """The normalised axes [axis, rank) of a norm, negative."""
    return tuple(range(a["axis"], 0))


def _layer_norm_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta, as exported."""
    x, gamma, beta = ins
    dt, axes = g.node(x).dtype, _norm_axes(a)
    centered = g.sub(x, g.reduce_mean(x, axes=axes, keepdims=True))
    var = g.reduce_mean(g.pow(centered, g.scalar(2.0, dt)), axes=axes, keepdims=True)
    normed = g.div(centered, g.sqrt(g.add(var, g.scalar(a["eps"], dt))))
    return g.add(g.mul(normed, gamma), beta)


def _rms_norm_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """Pow 2, ReduceMean, Add eps, Rsqrt, Mul, Mul gamma (then Add beta when given), as exported."""
    x, gamma, *beta = ins
    dt = g.node(x).dtype
    mean_sq = g.reduce_mean(g.pow(x, g.scalar(2.0, dt)), axes=_norm_axes(a), keepdims=True)
    out = g.mul(g.mul(x, g.rsqrt(g.add(mean_sq, g.scalar(a["eps"], dt)))), gamma)
    return g.add(out, beta[0]) if beta else out


def _group_norm_infer(a: Attrs, ins: list[T]) -> T:
    x, w, b = ins
    if x.rank < 2:
        raise ShapeError(f"GroupNorm input must be [N, C, ...], got {list(x.shape)}")
    c = x.shape[1]
    if c % a["groups"]:
        raise ShapeError(f"GroupNorm channels {c} are not divisible by groups={a['groups']}")
    if w.shape != (c,) or b.shape != (c,):
        raise ShapeError(f"GroupNorm weight/bias must be [{c}], got {list(w.shape)} and {list(b.shape)}")
    return x


def group_of_one(a: Attrs, ins: list[T]) -> str | None:
    """Degenerate: a GroupNorm group of one element (it normalises to 0 whatever x is)."""
    x = ins[0]
    if x.shape[1] // a["groups"] * math.prod(x.shape[2:]) < 2:
        return "one element per group"
    return None


NORMS = [
    OpSpec("LayerNorm", Kind.NORM, ("x", "gamma", "beta"), norm_infer("LayerNorm", ("gamma", "beta")),
           lambda a, x, g, b: K.layer_norm(x, g, b, a["axis"], a["eps"]), (_axis(), _eps(1e-5)),
           doc="Normalise over axes [axis, rank), then scale and shift.", decompose=_layer_norm_decompose,
           sampler=norm_sampler(("gamma", "beta")), degenerate=normalized_one),
    OpSpec("RmsNorm", Kind.NORM, ("x", "gamma", "beta?"), norm_infer("RmsNorm", ("gamma", "beta")),
           lambda a, x, g, b=None: K.rms_norm(x, g, b, a["axis"], a["eps"]), (_axis(), _eps(1e-6)),
           doc="x / sqrt(mean(x^2) + eps) * gamma (+ beta).", decompose=_rms_norm_decompose,
           sampler=norm_sampler(("gamma", "beta?"))),
    OpSpec("GroupNorm", Kind.NORM, ("x", "w", "b"), _group_norm_infer,
           lambda a, x, w, b: K.group_norm(x, w, b, a["groups"], a["eps"]),
           (AttrSpec("groups", INT, check=at_least_one), _eps(1e-5)), degenerate=group_of_one),
]

# --- layout -------------------------------------------------------------------


def _reshape_canonical(a: Attrs, ins: list[T]) -> Attrs:
    return {**a, "shape": reshape_target(ins[0].shape, a["shape"])}


def _reshape_infer(a: Attrs, ins: list[T]) -> T:
    return T(reshape_target(ins[0].shape, a["shape"]), ins[0].dtype)


def _transpose_degenerate(a: Attrs, ins: list[T]) -> str | None:
    """Degenerate: a perm that moves only axes of size 1 moves no element."""
    if all(p == k or ins[0].shape[p] == 1 for k, p in enumerate(a["perm"])):
        return f"perm {list(a['perm'])} moves no element of {list(ins[0].shape)}"
    return None


def _transpose_infer(a: Attrs, ins: list[T]) -> T:
    x, perm = ins[0], a["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"perm {list(perm)} is not a permutation of the {x.rank} axes")
    return T(tuple(x.shape[p] for p in perm), x.dtype)


def _narrow_infer(a: Attrs, ins: list[T]) -> T:
    x = ins[0]
    ax = axis_index(a["axis"], x.rank)
    start, length = a["start"], a["length"]
    if start < 0 or length < 1 or start + length > x.shape[ax]:
        raise ShapeError(f"Narrow [{start}, {start + length}) runs past the end of axis {a['axis']} "
                         f"(size {x.shape[ax]})")
    return T((*x.shape[:ax], length, *x.shape[ax + 1:]), x.dtype)


def concat_infer(a: Attrs, ins: list[T]) -> T:
    first = ins[0]
    ax = axis_index(a["axis"], first.rank)
    dt = same_dtype(ins, "Concat inputs")
    for t in ins[1:]:
        off_axis = [i for i in range(first.rank) if i != ax]
        if t.rank != first.rank or any(t.shape[i] != first.shape[i] for i in off_axis):
            raise ShapeError(f"Concat inputs {[list(t.shape) for t in ins]} differ off axis {a['axis']}")
    return T((*first.shape[:ax], sum(t.shape[ax] for t in ins), *first.shape[ax + 1:]), dt)


def _expand_infer(a: Attrs, ins: list[T]) -> T:
    if broadcast(ins[0].shape, a["shape"]) != a["shape"]:
        raise ShapeError(f"cannot expand {list(ins[0].shape)} to {list(a['shape'])}")
    return T(a["shape"], ins[0].dtype)


LAYOUT = [
    OpSpec("Reshape", Kind.LAYOUT, ("x",), _reshape_infer, lambda a, x: K.reshape(x, a["shape"]),
           (AttrSpec("shape", INTS, dims=True),), canonical=_reshape_canonical,
           doc="View with a new shape (one -1 is resolved at build time)."),
    OpSpec("Transpose", Kind.LAYOUT, ("x",), _transpose_infer, lambda a, x: np.transpose(x, a["perm"]),
           (AttrSpec("perm", INTS),), degenerate=_transpose_degenerate),
    OpSpec("Narrow", Kind.LAYOUT, ("x",), _narrow_infer,
           lambda a, x: K.narrow(x, a["axis"], a["start"], a["length"]),
           (_axis(), AttrSpec("start", INT, dims=True), AttrSpec("length", INT, dims=True)),
           doc="Slice [start, start+length) of one axis."),
    OpSpec("Concat", Kind.LAYOUT, ("xs*",), concat_infer, lambda a, *xs: np.concatenate(xs, axis=a["axis"]),
           (_axis(),)),
    OpSpec("Expand", Kind.LAYOUT, ("x",), _expand_infer, lambda a, x: np.broadcast_to(x, a["shape"]).copy(),
           (AttrSpec("shape", INTS, check=_dims_positive, dims=True),), doc="Broadcast to a shape."),
]



def _get_infer(a: Attrs, ins: list[ValueType]) -> T:
    results = ins[0]
    assert isinstance(results, TupleType)  # OpSpec.resolve lets a projection read results only
    if not 0 <= a["index"] < len(results.parts):
        raise ShapeError(f"index {a['index']} is out of range for {len(results.parts)} results {results}")
    return results.parts[a["index"]]


# A node of a multi-result op is read only through Get: a free view of one of its results.
PROJECTIONS = [
    OpSpec("Get", Kind.PROJECTION, ("results",), _get_infer, lambda a, results: results[a["index"]],
           (AttrSpec("index", INT),), flops=lambda a, ins, out: 0,
           doc="Result ``index`` of a multi-result node (no launch, no bytes moved)."),
]

# --- transformer --------------------------------------------------------------


def _embedding_infer(a: Attrs, ins: list[T]) -> T:
    table, ids = ins
    require_rank(table, 2, "Embedding table")
    require_int(ids, "Embedding ids")
    return T(ids.shape + table.shape[1:], table.dtype)


def _rope_infer(a: Attrs, ins: list[T]) -> T:
    x = ins[0]
    require_float(x, "RoPE input")
    if x.rank < 2 or x.shape[-1] % 2:
        raise ShapeError(f"RoPE input must be [..., S, D] with D even, got {list(x.shape)}")
    return x


def attention_canonical(a: Attrs, ins: list[T]) -> Attrs:
    """Fill kv_heads (0 means = heads) and scale (0 means 1/sqrt(head_dim))."""
    out = dict(a)
    out["kv_heads"] = a["kv_heads"] or a["heads"]
    head_dim = ins[0].shape[-1] // a["heads"] if a["heads"] and ins[0].rank else 1
    out["scale"] = a["scale"] or 1.0 / math.sqrt(head_dim)
    return out


def rope_degenerate(x: T) -> str | None:
    """Degenerate for a RoPE of ``x`` [..., S, D]: theta matters from head dim 4 (at 2 the one frequency is 1)
    and from sequence 2 (position 0 turns by angle 0)."""
    if x.shape[-1] < 4 or x.shape[-2] < 2:
        return f"RoPE of [..., S, D] = {list(x.shape)}: theta matters from D = 4 and S = 2"
    return None


def split_heads_degenerate(q: T, k: T) -> str | None:
    """Degenerate for attention on split heads [B, H, S, D]: one head, or one key (the scale then does not
    matter), or one query (so no causal mask does)."""
    if q.shape[-3] < 2 or k.shape[-2] < 2 or q.shape[-2] < 2:
        return f"attention of q {list(q.shape)} and k {list(k.shape)}: one head, key or query"
    return None


def _attention_infer(a: Attrs, ins: list[T]) -> T:
    q, k, v = ins[:3]
    same_dtype(ins[:3], "Attention q/k/v")
    for label, t in (("q", q), ("k", k), ("v", v)):
        require_rank(t, 3, f"Attention {label} ([B, S, heads*head_dim])")
    heads, kv_heads = a["heads"], a["kv_heads"]
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ShapeError(f"heads={heads} must be a positive multiple of kv_heads={kv_heads}")
    if q.shape[-1] % heads:
        raise ShapeError(f"q width {q.shape[-1]} is not divisible by heads={heads}")
    hd = q.shape[-1] // heads
    if k.shape[-1] != kv_heads * hd or v.shape[-1] != kv_heads * hd:
        raise ShapeError(f"k/v widths {k.shape[-1]}, {v.shape[-1]} must be kv_heads*head_dim = {kv_heads * hd}")
    if k.shape[:2] != v.shape[:2] or k.shape[0] != q.shape[0]:
        raise ShapeError(f"q/k/v batch and key lengths disagree: {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    has_mask = len(ins) == 4
    if has_mask != (a["mask"] == "custom"):
        raise ShapeError(f"mask={a['mask']!r} {'takes' if a['mask'] == 'custom' else 'takes no'} mask tensor input")
    if has_mask and ins[3].shape != (q.shape[0], k.shape[1]):
        raise ShapeError(f"custom mask must be [B, Sk] = {[q.shape[0], k.shape[1]]}, got {list(ins[3].shape)}")
    return q


def attention_flops(a: Attrs, ins: list[T], out: T) -> int:
    q, k = ins[0], ins[1]
    return 4 * q.numel * k.shape[-2 if k.rank == 4 else 1]


def _causal_attention_infer(a: Attrs, ins: list[T]) -> T:
    q, k, v = ins
    same_dtype(ins, "CausalAttention q/k/v")
    for label, t in (("q", q), ("k", k), ("v", v)):
        require_rank(t, 4, f"CausalAttention {label} ([B, H, S, D])")
    if q.shape[1] % k.shape[1] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0]:
        raise ShapeError(f"CausalAttention q/k/v shapes {list(q.shape)}, {list(k.shape)}, {list(v.shape)} "
                         "do not fit [B, H, S, D] with H a multiple of the K/V heads")
    return T(q.shape[:3] + v.shape[3:], q.dtype)


def causal_canonical(a: Attrs, ins: list[T]) -> Attrs:
    head_dim = ins[0].shape[-1] if ins[0].rank else 1
    return {**a, "scale": a["scale"] or 1.0 / math.sqrt(head_dim)}


_SCALE = AttrSpec("scale", F, 0.0, check=non_negative)

TRANSFORMER = [
    OpSpec("Embedding", Kind.ELEMENTWISE, ("table", "ids"), _embedding_infer, K.embedding,
           doc="Gather rows of table [V, D] by integer ids.", index_inputs=("ids",)),
    OpSpec("RoPE", Kind.ELEMENTWISE, ("x",), _rope_infer, lambda a, x: K.rope(x, a["theta"]),
           (AttrSpec("theta", F, 10000.0, check=positive),),
           doc="Rotary position embedding (rotate-half) over [..., S, D].",
           degenerate=lambda a, ins: rope_degenerate(ins[0])),
    OpSpec("Attention", Kind.ATTENTION, ("q", "k", "v", "key_mask?"), _attention_infer, K.attention,
           (AttrSpec("heads", INT, check=at_least_one), AttrSpec("kv_heads", INT, 0),
            AttrSpec("mask", S, "none", choices=("none", "causal", "custom")), _SCALE),
           flops=attention_flops, canonical=attention_canonical,
           doc="Attention on packed [B, S, heads*head_dim]; custom mask [B, Sk] (1 keeps, 0 drops).",
           degenerate=lambda a, ins: "one head, key or query" if a["heads"] < 2 or ins[1].shape[1] < 2
           or ins[0].shape[1] < 2 else None),
    OpSpec("CausalAttention", Kind.ATTENTION, ("q", "k", "v"), _causal_attention_infer, K.causal_attention,
           (_SCALE,), flops=attention_flops, canonical=causal_canonical,
           doc="Causal attention on split heads [B, H, S, D] (GQA).",
           degenerate=lambda a, ins: split_heads_degenerate(ins[0], ins[1])),
]

# --- vision -------------------------------------------------------------------


def _conv_out(size: int, k: int, stride: int, pad: int) -> int:
    out = (size + 2 * pad - k) // stride + 1
    if out < 1:
        raise ShapeError(f"window {k} with stride {stride} and padding {pad} does not fit size {size}")
    return out


def _conv_infer(a: Attrs, ins: list[T]) -> T:
    x, w = ins
    require_rank(x, 4, "Conv2d input ([N, C, H, W])")
    require_rank(w, 4, "Conv2d weight ([O, C/groups, kh, kw])")
    g = a["groups"]
    if x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        raise ShapeError(f"Conv2d input channels {x.shape[1]} / weight {list(w.shape)} do not fit groups={g}")
    oh = _conv_out(x.shape[2], w.shape[2], a["stride"], a["padding"])
    ow = _conv_out(x.shape[3], w.shape[3], a["stride"], a["padding"])
    return T((x.shape[0], w.shape[0], oh, ow), same_dtype(ins, "Conv2d operands"))


def _conv_flops(a: Attrs, ins: list[T], out: T) -> int:
    w = ins[1]
    return 2 * out.numel * w.shape[1] * w.shape[2] * w.shape[3]


def _conv2d_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x [N, C, H, W] and w [O, C/groups, k, k] with groups 1 or 2, stride 1 or 2, padding 0 or 1."""
    groups, k = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    c, o = groups * int(rng.integers(1, 3)), groups * int(rng.integers(1, 3))
    h, w = (k + int(d) for d in rng.integers(0, 3, size=2))
    return ({"x": (int(rng.integers(1, 3)), c, h, w), "w": (o, c // groups, k, k)},
            {"stride": int(rng.integers(1, 3)), "padding": int(rng.integers(0, 2)), "groups": groups})


def _pool_infer(a: Attrs, ins: list[T]) -> T:
    x = ins[0]
    require_rank(x, 4, "MaxPool2d input ([N, C, H, W])")
    k, s, p = a["kernel"], a["stride"], a["padding"]
    if 2 * p > k:
        raise ShapeError(f"padding {p} must be at most half the kernel {k} (a window would see only padding)")
    return T((*x.shape[:2], _conv_out(x.shape[2], k, s, p), _conv_out(x.shape[3], k, s, p)), x.dtype)


def _gap_infer(a: Attrs, ins: list[T]) -> T:
    require_rank(ins[0], 4, "GlobalAvgPool input ([N, C, H, W])")
    return T(ins[0].shape[:2], ins[0].dtype)


def _upsample_infer(a: Attrs, ins: list[T]) -> T:
    x = ins[0]
    require_rank(x, 4, "Upsample2x input ([N, C, H, W])")
    return T((*x.shape[:2], 2 * x.shape[2], 2 * x.shape[3]), x.dtype)


_STRIDE = AttrSpec("stride", INT, 1, check=at_least_one)
_PAD = AttrSpec("padding", INT, 0, check=non_negative)

VISION = [
    OpSpec("Conv2d", Kind.VISION, ("x", "w"), _conv_infer, K.conv2d,
           (_STRIDE, _PAD, AttrSpec("groups", INT, 1, check=at_least_one)), flops=_conv_flops,
           sampler=_conv2d_sample),
    OpSpec("MaxPool2d", Kind.VISION, ("x",), _pool_infer, K.max_pool2d,
           (AttrSpec("kernel", INT, check=at_least_one), _STRIDE, _PAD)),
    OpSpec("GlobalAvgPool", Kind.REDUCTION, ("x",), _gap_infer, lambda a, x: x.mean(axis=(2, 3))),
    OpSpec("Upsample2x", Kind.VISION, ("x",), _upsample_infer, K.upsample2x, doc="Nearest-neighbour 2x."),
]

# --- losses -------------------------------------------------------------------


def _ce_infer(a: Attrs, ins: list[T]) -> T:
    logits, targets = ins
    require_rank(logits, 2, "CrossEntropyLoss logits ([N, C])")
    require_int(targets, "CrossEntropyLoss targets")
    if targets.shape != logits.shape[:1]:
        raise ShapeError(f"targets {list(targets.shape)} must be [{logits.shape[0]}]")
    return T((), logits.dtype)


def _bce_infer(a: Attrs, ins: list[T]) -> T:
    if ins[0].shape != ins[1].shape:
        raise ShapeError(f"BceLoss operands differ in shape: {list(ins[0].shape)} and {list(ins[1].shape)}")
    return T((), same_dtype(ins, "BceLoss operands"))


LOSSES = [
    OpSpec("CrossEntropyLoss", Kind.LOSS, ("logits", "targets"), _ce_infer, K.cross_entropy_loss),
    OpSpec("BceLoss", Kind.LOSS, ("p", "t"), _bce_infer, K.bce_loss),
]

# --- backward -----------------------------------------------------------------


def _grad_infer(name: str, has_gamma: bool):
    """(x[, gamma], dy): dy has x's shape, gamma the normalised shape."""

    def infer(a: Attrs, ins: list[T]) -> T:
        same_dtype(ins, f"{name} inputs")
        x, dy = ins[0], ins[-1]
        if dy.shape != x.shape:
            raise ShapeError(f"{name} dy {list(dy.shape)} must have x's shape {list(x.shape)}")
        if has_gamma:
            norm_param_check(x, ins[1], a.get("axis", -1), f"{name} gamma")
        return x

    return infer


def _rms_grad_w_infer(a: Attrs, ins: list[T]) -> T:
    x = _grad_infer("RmsNormGradW", False)(a, ins)
    return T(x.shape[axis_index(a["axis"], x.rank):], x.dtype)


BACKWARD = [
    OpSpec("SiluGrad", Kind.BACKWARD, ("x", "dy"), _grad_infer("SiluGrad", False), K.silu_grad),
    OpSpec("RmsNormGradX", Kind.BACKWARD, ("x", "gamma", "dy"), _grad_infer("RmsNormGradX", True),
           K.rms_norm_grad_x, (_axis(), _eps(1e-6))),
    OpSpec("RmsNormGradW", Kind.BACKWARD, ("x", "dy"), _rms_grad_w_infer, K.rms_norm_grad_w, (_axis(), _eps(1e-6))),
    OpSpec("LayerNormGradX", Kind.BACKWARD, ("x", "gamma", "dy"), _grad_infer("LayerNormGradX", True),
           K.layer_norm_grad_x, (_axis(), _eps(1e-5))),
]

ALL = [*LEAVES, *MATMULS, *ELEMENTWISE, *REDUCTIONS, *NORMS, *LAYOUT, *PROJECTIONS, *TRANSFORMER, *VISION, *LOSSES,
       *BACKWARD]
register(*ALL)

__all__ = ["ALL", "GELU_TANH_COEF", "SQRT_2", "SQRT_2_OVER_PI", "attention_canonical", "attention_flops",
           "causal_canonical", "concat_infer", "matmul_flops", "norm_infer", "norm_sampler"]
