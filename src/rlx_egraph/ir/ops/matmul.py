"""Matmul epilogues and prologues (rules/matmul.egg), and the weights concatenated once at load time for
shared-input matmuls (ConcatParams, rules/swiglu.egg).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..registry import (
    Attrs,
    AttrSpec,
    AttrType,
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
    from ..graph import Graph

T = TensorType
INT, F, S = AttrType.INT, AttrType.FLOAT, AttrType.STR
_AXIS = AttrSpec("axis", INT, -1)


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


MATMUL = [
    _matmul_add("FusedMatMulAdd", -1, -2),
    _matmul_add("FusedMatMulATAdd", -2, -2),
    _matmul_add("FusedMatMulBTAdd", -1, -1),
    OpSpec("FusedMatMulBiasAct", Kind.FUSED, ("x", "w", "bias"), _bias_act_infer, K.fused_matmul_bias_act,
           (AttrSpec("act", S, "none", choices=EPILOGUES),), flops=matmul_flops,
           doc="act(x @ w + bias) with a bias of rank <= 1 and an optional Gelu/Silu epilogue.",
           decompose=_bias_act_decompose, sampler=_bias_act_sample),
    OpSpec("FusedRmsNormMatMul", Kind.FUSED, ("x", "w_norm", "w_proj"), _rms_matmul_infer,
           lambda a, x, wn, wp: np.matmul(K.rms_norm(x, wn, None, a["axis"], a["eps"]), wp),
           (_AXIS, AttrSpec("eps", F, 1e-6, check=positive)), flops=_rms_matmul_flops,
           doc="RmsNorm(x, w_norm) @ w_proj.",
           decompose=lambda g, ins, a: g.matmul(g.rms_norm(ins[0], ins[1], axis=a["axis"], eps=a["eps"]), ins[2]),
           sampler=_rms_matmul_sample),
    OpSpec("ConcatParams", Kind.WEIGHT_PREP, ("ws*",), concat_infer,
           lambda a, *ws: np.concatenate(ws, axis=a["axis"]), (_AXIS,),
           doc="A derived weight: parameters concatenated once at load time (recipe: sources, axis, order).",
           decompose=lambda g, ins, a: g.concat(ins, axis=a["axis"]), sampler=_concat_params_sample),
]
register(*MATMUL)
