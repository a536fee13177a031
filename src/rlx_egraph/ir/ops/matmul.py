"""Matmul epilogues and prologues (rules/matmul.egg), and the weights concatenated once at load time for
shared-input matmuls (ConcatParams, rules/swiglu.egg).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..export import MS, OnnxWriter
from ..registry import (
    Attrs,
    AttrSpec,
    AttrType,
    DecompositionRule,
    Kind,
    OpSpec,
    ShapeError,
    Shapes,
    TensorType,
    op_spec,
    pick,
    positive,
    random_shape,
    register,
)
from ..shapes import broadcast, matmul_shape, norm_param_check, same_dtype
from . import reference as K
from .primitives import (
    concat_infer,
    matmul_flops,
    norm_sampler,
)

if TYPE_CHECKING:
    from ..export import ExportBuilder, WriteFn
    from ..graph import Graph, Node

T = TensorType
INT, F, S = AttrType.INT, AttrType.FLOAT, AttrType.STR
_AXIS = AttrSpec("axis", INT, -1)


EPILOGUES = ("none", "gelu", "gelu_tanh", "silu")


def _matmul_add(name: str, k_a: int, k_b: int, onnx: OnnxWriter) -> OpSpec:
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
                  decompose=lambda g, ins, a: g.add(g.add_node(primitive, ins[:2]), ins[2]), sampler=sample,
                  onnx=onnx)


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


def _rms_matmul_infer(a: Attrs, ins: list[T]) -> T:
    x, w_norm, w_proj = ins
    norm_param_check(x, w_norm, a["axis"], "FusedRmsNormMatMul w_norm")
    return T(matmul_shape(x.shape, w_proj.shape, -1, -2, "FusedRmsNormMatMul"), same_dtype(ins, "operands"))


def _rms_matmul_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """A norm's x and w_norm, and w_proj [H, 1 to 5]."""
    shapes, attrs = norm_sampler(("w_norm",))(rng)
    return shapes | {"w_proj": (shapes["x"][-1], *random_shape(rng, 1, 1))}, attrs


def _rms_matmul_flops(a: Attrs, ins: list[T], out: T) -> int:
    """The projection's matmul plus the norm's few passes over x."""
    return 2 * out.numel * ins[0].shape[-1] + 4 * ins[0].numel


def _concat_params_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """1 to 4 parts of one shape of rank 1 to 3 that differ along a random axis."""
    base = random_shape(rng, 1, 3)
    axis = int(rng.integers(len(base)))
    return {"ws": [(*base[:axis], size, *base[axis + 1:]) for size in random_shape(rng, 1, 4)]}, {"axis": axis}


# --- ONNX exports (written against ExportBuilder, which the ONNX exporter's builder implements) ---


def _gemm_fits(types: list[TensorType], out: tuple[int, ...]) -> bool:
    """Gemm takes 2-D a and b and a c that broadcasts one way to the [M, N] result."""
    a, w, c = types
    return a.rank == 2 and w.rank == 2 and c.rank <= 2 and all(
        d in (1, o) for d, o in zip(reversed(c.shape), reversed(out), strict=False))


def _gemm_rows(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType], trans_b: int) -> str | None:
    """Gemm on the rows of a batched ``a`` [..., K] (reshaped to [rows, K] and back: views, no copies) with a
    2-D ``b``, when the addend is a bias row (rank <= 1) or of the result's shape (reshaped alike); else None."""
    a, w, c = types
    if a.rank < 3 or w.rank != 2 or not (c.rank <= 1 or c.shape == node.shape):
        return None
    rows = b.reshape(ins[0], [-1, a.shape[-1]])
    addend = ins[2] if c.rank <= 1 else b.reshape(ins[2], [-1, node.shape[-1]])
    gemm = b.op("Gemm", [rows, ins[1], addend], transB=trans_b)
    b.shapes[gemm] = (math.prod(node.shape[:-1]), node.shape[-1])  # the rows, which a reader of rows takes as is
    return b.reshape(gemm, node.shape)


def _gemm_or_matmul_add(trans_a: int, trans_b: int) -> WriteFn:
    """Gemm where it fits (on the rows of a batched a too), else the matmul (FusedMatMul for a transposed
    operand) and an Add."""

    def emit(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str:
        if _gemm_fits(types, node.shape):
            return b.op("Gemm", ins, transA=trans_a, transB=trans_b)
        rows = None if trans_a else _gemm_rows(b, node, ins, types, trans_b)
        if rows is not None:
            return rows
        mm = b.op("FusedMatMul", ins[:2], domain=MS, transA=trans_a, transB=trans_b) if trans_a or trans_b \
            else b.op("MatMul", ins[:2])
        return b.op("Add", [mm, ins[2]])

    return emit


def _bias_act(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """MatMul then BiasGelu / FastGelu(bias) for a full-width bias; Gemm without epilogue where it fits."""
    act, x, w, bias = node.attrs["act"], *ins
    if act == "none":
        return _gemm_or_matmul_add(0, 0)(b, node, ins, types)
    mm = b.op("MatMul", [x, w])
    if types[2].shape == node.shape[-1:] and act in ("gelu", "gelu_tanh"):
        return b.op("BiasGelu" if act == "gelu" else "FastGelu", [mm, bias], domain=MS)
    out = b.op("Add", [mm, bias])
    if act == "silu":
        return b.op("QuickGelu", [out], domain=MS, alpha=1.0)
    return b.op("FastGelu" if act == "gelu_tanh" else "Gelu", [out], domain=MS)


MATMUL = [
    _matmul_add("FusedMatMulAdd", -1, -2, OnnxWriter("Gemm (MatMul + Add when batched)", _gemm_or_matmul_add(0, 0))),
    _matmul_add("FusedMatMulATAdd", -2, -2,
                OnnxWriter("Gemm transA (Transpose, MatMul + Add when batched)", _gemm_or_matmul_add(1, 0))),
    _matmul_add("FusedMatMulBTAdd", -1, -1,
                OnnxWriter("Gemm transB (MatMul + Add when batched)", _gemm_or_matmul_add(0, 1))),
    OpSpec("FusedMatMulBiasAct", Kind.FUSED, ("x", "w", "bias"), _bias_act_infer, K.fused_matmul_bias_act,
           (AttrSpec("act", S, "none", choices=EPILOGUES),), flops=matmul_flops,
           doc="act(x @ w + bias) with a bias of rank <= 1 and an optional Gelu/Silu epilogue.",
           decompose=_bias_act_decompose, sampler=_bias_act_sample, cost_attr="act",
           onnx=OnnxWriter("Gemm, or MatMul + com.microsoft BiasGelu / FastGelu / QuickGelu", _bias_act)),
    OpSpec("FusedRmsNormMatMul", Kind.FUSED, ("x", "w_norm", "w_proj"), _rms_matmul_infer,
           lambda a, x, wn, wp: np.matmul(K.rms_norm(x, wn, None, a["axis"], a["eps"]), wp),
           (_AXIS, AttrSpec("eps", F, 1e-6, check=positive)), flops=_rms_matmul_flops,
           doc="RmsNorm(x, w_norm) @ w_proj.",
           decompose=lambda g, ins, a: g.matmul(g.rms_norm(ins[0], ins[1], axis=a["axis"], eps=a["eps"]), ins[2]),
           sampler=_rms_matmul_sample, rule=DecompositionRule("rms-norm-matmul", "fuse", "matmul.egg")),
    OpSpec("ConcatParams", Kind.WEIGHT_PREP, ("ws*",), concat_infer,
           lambda a, *ws: np.concatenate(ws, axis=a["axis"]), (_AXIS,),
           doc="A derived weight: parameters concatenated once at load time (recipe: sources, axis, order).",
           decompose=lambda g, ins, a: g.concat(ins, axis=a["axis"]), sampler=_concat_params_sample),
]
register(*MATMUL)
