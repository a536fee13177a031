"""Norm fusions (rules/norms.egg): a residual add in a LayerNorm or RmsNorm kernel, and GroupNorm with SiLU."""

from __future__ import annotations

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
    Shapes,
    TensorType,
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
    from ..export import ExportBuilder, WriteFn
    from ..graph import Graph, Node

INT, F = AttrType.INT, AttrType.FLOAT
_EPS = AttrSpec("eps", F, 1e-5, check=positive)
_AXIS = AttrSpec("axis", INT, -1)
_SAME_SHAPES = "(= (shape ?x) (shape ?residual))"  # the residual add is of two tensors of one shape


def _add_norm(name: str, norm: str, params: tuple[str, ...], eps: float, doc: str, onnx: OnnxWriter) -> OpSpec:
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
                  degenerate=norm_spec.degenerate, onnx=onnx)


def _group_norm_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x [N, groups * (1 to 3), spatial...] with 1 or 2 spatial dims; w and b [C]."""
    groups, per = random_shape(rng, 2, 2, high=3)
    c = groups * per
    return {"x": (*random_shape(rng, 1, 1, high=2), c, *random_shape(rng, 1, 2)), "w": (c,), "b": (c,)}, \
        {"groups": groups}


# --- ONNX exports (written against ExportBuilder, which the ONNX exporter's builder implements) ---


def plus_beta(b: ExportBuilder, out: str, ins: list[str], beta_slot: int) -> str:
    """``out`` + input ``beta_slot`` (a RmsNorm's beta, which onnxruntime's norms do not take) where the node has it."""
    return b.op("Add", [out, ins[beta_slot]]) if len(ins) > beta_slot else out


# Output slot of the sum (input + skip) of Skip[Simplified]LayerNormalization (after output, mean, inv_std_var).
SKIP_SUM_OUTPUT = 3


def _skip_norm(op_type: str, beta_after: bool) -> WriteFn:
    """SkipLayerNormalization / SkipSimplifiedLayerNormalization over the last axis of a rank-2 or rank-3
    input (others are reshaped to rank 2 around it); a RmsNorm beta is added after.  A multi-result
    node (FusedAddLayerNorm, FusedAddRmsNorm) also takes the sum, the op's output 3."""

    def emit(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str | tuple[str, ...] | None:
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
            outs[0] = plus_beta(b, outs[0], ins, 3)
        return tuple(outs) if node.parts else outs[0]

    return emit


NORMS = [
    OpSpec("FusedResidualLN", Kind.FUSED, ("x", "residual", "gamma", "beta"),
           norm_infer("FusedResidualLN", ("gamma", "beta"), residual=True),
           lambda a, x, r, g, b: K.layer_norm(x + r, g, b, a["axis"], a["eps"]), (_AXIS, _EPS),
           doc="LayerNorm(x + residual).",
           decompose=lambda g, ins, a: g.layer_norm(g.add(ins[0], ins[1]), *ins[2:], axis=a["axis"], eps=a["eps"]),
           sampler=norm_sampler(("gamma", "beta"), residual=True), degenerate=normalized_one,
           onnx=OnnxWriter("com.microsoft SkipLayerNormalization", _skip_norm("SkipLayerNormalization", False)),
           rule=DecompositionRule("residual-layer-norm", "fuse", "norms.egg", (_SAME_SHAPES,))),
    OpSpec("FusedResidualRmsNorm", Kind.FUSED, ("x", "residual", "gamma", "beta?"),
           norm_infer("FusedResidualRmsNorm", ("gamma", "beta"), residual=True),
           lambda a, x, r, g, b=None: K.rms_norm(x + r, g, b, a["axis"], a["eps"]),
           (_AXIS, AttrSpec("eps", F, 1e-6, check=positive)), doc="RmsNorm(x + residual).",
           decompose=lambda g, ins, a: g.rms_norm(g.add(ins[0], ins[1]), *ins[2:], axis=a["axis"], eps=a["eps"]),
           sampler=norm_sampler(("gamma", "beta?"), residual=True),
           onnx=OnnxWriter("com.microsoft SkipSimplifiedLayerNormalization",
                           _skip_norm("SkipSimplifiedLayerNormalization", True)),
           rule=DecompositionRule("residual-rms-norm", "fuse", "norms.egg", (_SAME_SHAPES,))),
    _add_norm("FusedAddLayerNorm", "LayerNorm", ("gamma", "beta"), 1e-5,
              "(LayerNorm(x + residual), x + residual): the sum is the next residual.",
              OnnxWriter("com.microsoft SkipLayerNormalization (its sum output too)",
                         _skip_norm("SkipLayerNormalization", False))),
    _add_norm("FusedAddRmsNorm", "RmsNorm", ("gamma", "beta?"), 1e-6,
              "(RmsNorm(x + residual), x + residual): the sum is the next residual.",
              OnnxWriter("com.microsoft SkipSimplifiedLayerNormalization (its sum output too)",
                         _skip_norm("SkipSimplifiedLayerNormalization", True))),
    OpSpec("GroupNormSilu", Kind.FUSED, ("x", "w", "b"), lambda a, ins: op_spec("GroupNorm").infer(a, ins),
           lambda a, x, w, b: K.silu(K.group_norm(x, w, b, a["groups"], a["eps"])),
           (AttrSpec("groups", INT, check=at_least_one), _EPS), doc="Silu(GroupNorm(x, w, b)).",
           decompose=lambda g, ins, a: g.silu(g.group_norm(*ins, groups=a["groups"], eps=a["eps"])),
           sampler=_group_norm_sample, degenerate=group_of_one,
           rule=DecompositionRule("group-norm-silu", "fuse", "norms.egg")),
]
register(*NORMS)
