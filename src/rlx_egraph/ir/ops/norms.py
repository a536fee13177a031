"""Norm fusions (rules/norms.egg): a residual add in a LayerNorm or RmsNorm kernel, and GroupNorm with SiLU."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..registry import (
    Attrs,
    AttrSpec,
    AttrType,
    Kind,
    OpSpec,
    Shapes,
    TupleType,
    ValueType,
    at_least_one,
    op_spec,
    positive,
    random_shape,
    register,
)
from . import reference as K
from .primitives import (
    group_of_one,
    norm_infer,
    norm_sampler,
    normalized_one,
)

if TYPE_CHECKING:
    from ..graph import Graph

INT, F = AttrType.INT, AttrType.FLOAT
_EPS = AttrSpec("eps", F, 1e-5, check=positive)
_AXIS = AttrSpec("axis", INT, -1)


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


def _group_norm_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x [N, groups * (1 to 3), spatial...] with 1 or 2 spatial dims; w and b [C]."""
    groups, per = random_shape(rng, 2, 2, high=3)
    c = groups * per
    return {"x": (*random_shape(rng, 1, 1, high=2), c, *random_shape(rng, 1, 2)), "w": (c,), "b": (c,)}, \
        {"groups": groups}


NORMS = [
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
    OpSpec("GroupNormSilu", Kind.FUSED, ("x", "w", "b"), lambda a, ins: op_spec("GroupNorm").infer(a, ins),
           lambda a, x, w, b: K.silu(K.group_norm(x, w, b, a["groups"], a["eps"])),
           (AttrSpec("groups", INT, check=at_least_one), _EPS), doc="Silu(GroupNorm(x, w, b)).",
           decompose=lambda g, ins, a: g.silu(g.group_norm(*ins, groups=a["groups"], eps=a["eps"])),
           sampler=_group_norm_sample, degenerate=group_of_one),
]
register(*NORMS)
