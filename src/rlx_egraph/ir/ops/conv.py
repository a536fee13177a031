"""Convolution ops: ONNX's general Conv, the Pad and BatchNormalization exporters write around it, FusedConv
(onnxruntime's com.microsoft FusedConv: a bias, a residual sum and an activation in the convolution's kernel) and
the derived weights that fold a BatchNormalization or give a convolution a zero bias (rules/conv.egg).

The seed's ``Conv2d`` (one stride and one padding for both spatial axes) stays in :mod:`.primitives`; a simplify
rule gives every Conv2d its general ``Conv`` form, so the conv rules are written once, on ``Conv``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..dims import at_least, floor_div
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
    pick,
    positive,
    register,
)
from ..shapes import require_float, same_dtype
from . import reference as K

if TYPE_CHECKING:
    from ..export import ExportBuilder
    from ..graph import Graph, Node

T = TensorType
INT, F, S, INTS = AttrType.INT, AttrType.FLOAT, AttrType.STR, AttrType.INTS

# The activations FusedConv runs in its kernel (onnxruntime's FusedConv runs each), and the op of each.
CONV_ACTIVATIONS = ("none", "relu", "clip", "sigmoid", "tanh")
_ACTIVATION_OPS = {"relu": "Relu", "clip": "Clip", "sigmoid": "Sigmoid", "tanh": "Tanh"}


def _conv_canonical(a: Attrs, ins: list[T]) -> dict:
    """Fill empty strides and dilations with 1 and empty pads with 0, one per spatial axis of ``x``; a FusedConv's
    clip bounds are 0 unless its activation is clip."""
    rank = max(ins[0].rank - 2, 0) if ins else 0
    out = {**a, "strides": a["strides"] or (1,) * rank, "pads": a["pads"] or (0,) * (2 * rank),
           "dilations": a["dilations"] or (1,) * rank}
    if "act" in a and a["act"] != "clip":
        out |= {"clip_min": 0.0, "clip_max": 0.0}
    return out


def conv_out_shape(x: T, w: T, a: Attrs, what: str) -> tuple:
    """The [N, O, *spatial] output of a convolution of ``x`` [N, C, *spatial] by ``w`` [O, C/groups, *kernel]."""
    rank = x.rank - 2
    if rank < 1 or w.rank != x.rank:
        raise ShapeError(f"{what} input {list(x.shape)} and weight {list(w.shape)} must be [N, C, *spatial] and "
                         "[O, C/groups, *kernel] of one rank, at least 3")
    strides, pads, dilations, groups = a["strides"], a["pads"], a["dilations"], a["groups"]
    if len(strides) != rank or len(dilations) != rank or len(pads) != 2 * rank:
        raise ShapeError(f"{what} over {rank} spatial axes takes {rank} strides and dilations and {2 * rank} pads, "
                         f"got {list(strides)}, {list(dilations)} and {list(pads)}")
    if min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
        raise ShapeError(f"{what} strides and dilations must be >= 1 and pads >= 0, got {list(strides)}, "
                         f"{list(dilations)} and {list(pads)}")
    if x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
        raise ShapeError(f"{what} input channels {x.shape[1]} / weight {list(w.shape)} do not fit groups={groups}")
    spatial = []
    for i in range(rank):
        reach = (w.shape[2 + i] - 1) * dilations[i] + 1
        size = floor_div(x.shape[2 + i] + pads[i] + pads[rank + i] - reach, strides[i]) + 1  # a floor atom if symbolic
        at_least(size, 1)  # a symbolic length: its floor atom is at least what keeps the output non-empty
        if isinstance(size, int) and size < 1:
            raise ShapeError(f"{what} window {reach} with stride {strides[i]} does not fit spatial axis {i} of "
                             f"{list(x.shape)} padded by {pads[i]} and {pads[rank + i]}")
        spatial.append(size)
    return (x.shape[0], w.shape[0], *spatial)


def _conv_infer(a: Attrs, ins: list[T]) -> T:
    x, w, *rest = ins
    require_float(x, "Conv input")
    out = conv_out_shape(x, w, a, "Conv")
    if rest and rest[0].shape != (w.shape[0],):
        raise ShapeError(f"Conv bias must be [{w.shape[0]}], got {list(rest[0].shape)}")
    return T(out, same_dtype(ins, "Conv operands"))


def _fused_conv_infer(a: Attrs, ins: list[T]) -> T:
    out = _conv_infer(a, ins[:3])
    if len(ins) > 3 and ins[3].shape != out.shape:
        raise ShapeError(f"FusedConv sum z {list(ins[3].shape)} must have the output's shape {list(out.shape)}")
    if a["act"] == "clip" and a["clip_min"] > a["clip_max"]:
        raise ShapeError(f"FusedConv clip bounds {a['clip_min']} > {a['clip_max']}")
    return T(out.shape, same_dtype(ins, "FusedConv operands"))


def _conv_flops(a: Attrs, ins: list[T], out: T) -> int:
    w = ins[1]
    return 2 * out.numel * math.prod(w.shape[1:])


def _fused_conv_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """Conv(x, w, b), + z, then the activation's op."""
    x, w, *rest = ins
    out = g.conv(x, w, *rest[:1], strides=a["strides"], pads=a["pads"], dilations=a["dilations"], groups=a["groups"])
    if len(rest) > 1:
        out = g.add(out, rest[1])
    if a["act"] == "clip":
        return g.clip(out, min=a["clip_min"], max=a["clip_max"])
    return out if a["act"] == "none" else g.add_node(_ACTIVATION_OPS[a["act"]], [out])


def _conv_sample(rng: np.random.Generator, fused: bool) -> tuple[Shapes, dict]:
    """x [N, groups * (1 to 2), *spatial] (1 to 3 spatial axes), w [groups * (1 to 2), C/groups, *kernel] (groups 1,
    2 or 3), a bias [O] half the time; strides and dilations of 1 or 2, pads 0 to 2 either side; a FusedConv also a
    sum of the output's shape half the time (with a bias then) and a random activation."""
    rank = int(rng.integers(1, 4))
    groups = int(pick(rng, [1, 2, 3]))
    c = groups * int(rng.integers(1, 3))
    o = groups * int(rng.integers(1, 3))
    kernel = [int(k) for k in rng.integers(1, 4, size=rank)]
    strides = [int(s) for s in rng.integers(1, 3, size=rank)]
    dilations = [int(d) for d in rng.integers(1, 3, size=rank)]
    pads = [int(p) for p in rng.integers(0, 3, size=2 * rank)]
    size = [int(rng.integers(1, 4)) + (k - 1) * d for k, d in zip(kernel, dilations, strict=True)]
    shapes: Shapes = {"x": (int(rng.integers(1, 3)), c, *size), "w": (o, c // groups, *kernel)}
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups}
    with_sum = fused and rng.random() < 0.5
    if with_sum or rng.random() < 0.5:
        shapes["b"] = (o,)
    if with_sum:
        out = [(s + pads[i] + pads[rank + i] - (k - 1) * d - 1) // st + 1
               for i, (s, k, d, st) in enumerate(zip(size, kernel, dilations, strides, strict=True))]
        shapes["z"] = (shapes["x"][0], o, *out)
    if fused:
        attrs["act"] = pick(rng, CONV_ACTIVATIONS)
        lo = float(rng.uniform(-1.0, 0.5))
        attrs |= {"clip_min": lo, "clip_max": lo + float(rng.uniform(0.0, 2.0))}
    return shapes, attrs


_CONV_ATTRS = (AttrSpec("strides", INTS, ()), AttrSpec("pads", INTS, ()), AttrSpec("dilations", INTS, ()),
               AttrSpec("groups", INT, 1, check=at_least_one))


def _pad_infer(a: Attrs, ins: list[T]) -> T:
    x = ins[0]
    pads = a["pads"]
    if len(pads) != 2 * x.rank or min(pads, default=0) < 0:
        raise ShapeError(f"Pad of a rank-{x.rank} tensor takes {2 * x.rank} pads >= 0 (the begins of every axis, "
                         f"then the ends), got {list(pads)}")
    return T(tuple(d + pads[i] + pads[x.rank + i] for i, d in enumerate(x.shape)), x.dtype)


def _pad_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """Any rank 1 to 4 and pads 0 to 2; half the time an image [N, C, *spatial] (1 or 2 spatial axes) padded on its
    spatial axes only, as exporters write a convolution's padding."""
    if rng.random() < 0.5:
        spatial = int(rng.integers(1, 3))
        shape = tuple(int(d) for d in rng.integers(1, 4, size=2 + spatial))
        side = [int(p) for p in rng.integers(0, 3, size=2 * spatial)]
        pads = [0, 0, *side[:spatial], 0, 0, *side[spatial:]]
    else:
        shape = tuple(int(d) for d in rng.integers(1, 4, size=int(rng.integers(1, 5))))
        pads = [int(p) for p in rng.integers(0, 3, size=2 * len(shape))]
    return {"x": shape}, {"pads": pads, "value": pick(rng, [0.0, float(rng.uniform(-2.0, 2.0))])}


def _batch_norm_infer(a: Attrs, ins: list[T]) -> T:
    x = ins[0]
    require_float(x, "BatchNorm input")
    if x.rank < 2:
        raise ShapeError(f"BatchNorm input must be [N, C, ...], got {list(x.shape)}")
    for label, t in zip(("scale", "bias", "mean", "var"), ins[1:], strict=True):
        if t.shape != (x.shape[1],):
            raise ShapeError(f"BatchNorm {label} must be [{x.shape[1]}], got {list(t.shape)}")
    return T(x.shape, same_dtype(ins, "BatchNorm inputs"))


def _batch_norm_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    shape = tuple(int(d) for d in rng.integers(1, 4, size=int(rng.integers(2, 5))))
    c = (shape[1],)
    return {"x": shape, "scale": c, "bias": c, "mean": c, "var": c}, {}


def _fold_sample(*inputs: str) -> Callable[[np.random.Generator], tuple[Shapes, dict]]:
    """A sampler of ``inputs`` among a convolution weight ``w`` [O, C, k...] (1 or 2 spatial axes), its bias ``b``
    [O] (half the time) and its BatchNorm's per-channel vectors [O]."""

    def sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
        o = int(rng.integers(1, 5))
        shapes: Shapes = {name: (o,) for name in ("scale", "bias", "mean", "var") if name in inputs}
        if "w" in inputs:
            shapes["w"] = (o, *(int(d) for d in rng.integers(1, 4, size=int(rng.integers(2, 4)))))
        if "b" in inputs and rng.random() < 0.5:
            shapes["b"] = (o,)
        return shapes, {}

    return sample


def _fold_weight_infer(a: Attrs, ins: list[T]) -> T:
    w, scale, var = ins
    if w.rank < 2 or scale.shape != (w.shape[0],) or var.shape != (w.shape[0],):
        raise ShapeError(f"BnFoldWeight weight {list(w.shape)} must be [O, ...] with scale and var [O], got "
                         f"{list(scale.shape)} and {list(var.shape)}")
    return T(w.shape, same_dtype(ins, "BnFoldWeight inputs"))


def _fold_bias_infer(a: Attrs, ins: list[T]) -> T:
    first = ins[0]
    if first.rank != 1 or any(t.shape != first.shape for t in ins):
        raise ShapeError(f"BnFoldBias inputs must be vectors of one length, got {[list(t.shape) for t in ins]}")
    return T(first.shape, same_dtype(ins, "BnFoldBias inputs"))


def _zero_bias_infer(a: Attrs, ins: list[T]) -> T:
    w = ins[0]
    if w.rank < 2:
        raise ShapeError(f"ConvZeroBias reads a convolution weight [O, ...], got {list(w.shape)}")
    return T(w.shape[:1], w.dtype)


def _weight_scale_infer(a: Attrs, ins: list[T]) -> T:
    w, s = ins
    if w.rank < 1 or s.shape != w.shape[-1:]:
        raise ShapeError(f"WeightScale scales the last axis of {list(w.shape)} by a vector of its length, got "
                         f"{list(s.shape)}")
    return T(w.shape, same_dtype(ins, "WeightScale inputs"))


def _weight_scale_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """A Linear's weight [K, N] (or its bias [N]) and a per-channel scale [N]."""
    n = int(rng.integers(1, 5))
    w = (int(rng.integers(1, 4)), n) if rng.random() < 0.5 else (n,)
    return {"w": w, "s": (n,)}, {}


def _bn_factor(g: Graph, scale: int, var: int, eps: float) -> int:
    """scale / sqrt(var + eps), per channel."""
    return g.div(scale, g.sqrt(g.add(var, g.scalar(eps, g.node(var).dtype))))


def _fold_weight_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    w, scale, var = ins
    rank = len(g.node(w).shape)
    return g.mul(w, g.reshape(_bn_factor(g, scale, var, a["eps"]), shape=(g.node(w).shape[0], *([1] * (rank - 1)))))


def _fold_bias_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    scale, bias, mean, var, *b = ins
    centered = g.sub(b[0], mean) if b else g.neg(mean)
    return g.add(g.mul(centered, _bn_factor(g, scale, var, a["eps"])), bias)


def _zero_bias_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """0 * w summed over every axis but the first: zeros [O] for finite weights."""
    w = ins[0]
    zero = g.mul(w, g.scalar(0.0, g.node(w).dtype))
    return g.reduce_sum(zero, axes=tuple(range(1, len(g.node(w).shape))), keepdims=False)


def _bn_eps() -> AttrSpec:
    return AttrSpec("eps", F, 1e-5, check=positive)


# --- ONNX exports (written against ExportBuilder, which the ONNX exporter's builder implements) ---


# FusedConv's activations by onnxruntime's names (its activation attribute); "none" writes no attribute.
_FUSED_CONV_ACTIVATIONS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "clip": "Clip"}


def _fused_conv(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str:
    """com.microsoft FusedConv: Conv's attributes, then the activation (Clip's bounds as activation_params)."""
    a = node.attrs
    act = {}
    if a["act"] != "none":
        act["activation"] = _FUSED_CONV_ACTIVATIONS[a["act"]]
    if a["act"] == "clip":
        act["activation_params"] = [a["clip_min"], a["clip_max"]]
    return b.op("FusedConv", ins, domain=MS, strides=list(a["strides"]), pads=list(a["pads"]),
                dilations=list(a["dilations"]), group=a["groups"], **act)


CONV_OPS = [
    OpSpec("Conv", Kind.VISION, ("x", "w", "b?"), _conv_infer, K.conv, _CONV_ATTRS, flops=_conv_flops,
           canonical=_conv_canonical, sampler=lambda rng: _conv_sample(rng, False),
           doc="ONNX's Conv over any number of spatial axes: strides, dilations, pads (the spatial begins, then "
               "the ends), groups (every channel: depthwise) and an optional bias [O]."),
    OpSpec("Pad", Kind.VISION, ("x",), _pad_infer, K.pad, (AttrSpec("pads", INTS), AttrSpec("value", F, 0.0)),
           sampler=_pad_sample,
           doc="Constant padding; pads: the begins of every axis, then the ends (ONNX's layout), each >= 0."),
    OpSpec("BatchNorm", Kind.NORM, ("x", "scale", "bias", "mean", "var"), _batch_norm_infer, K.batch_norm,
           (_bn_eps(),), sampler=_batch_norm_sample,
           doc="Inference BatchNormalization over axis 1: (x - mean) / sqrt(var + eps) * scale + bias."),
    OpSpec("FusedConv", Kind.FUSED, ("x", "w", "b?", "z?"), _fused_conv_infer, K.fused_conv,
           (*_CONV_ATTRS, AttrSpec("act", S, "none", choices=CONV_ACTIVATIONS), AttrSpec("clip_min", F, 0.0),
            AttrSpec("clip_max", F, 0.0)),
           flops=_conv_flops, canonical=_conv_canonical, decompose=_fused_conv_decompose,
           sampler=lambda rng: _conv_sample(rng, True),
           doc="act(Conv(x, w, b) + z) in one kernel (onnxruntime's com.microsoft FusedConv): z, a residual of "
               "the output's shape, needs a bias before it; act relu, clip (to [clip_min, clip_max]), sigmoid or "
               "tanh.",
           onnx=OnnxWriter("com.microsoft FusedConv (activation, sum input)", _fused_conv),
           # onnxruntime runs a FusedConv, and a Conv with the activation and sum it fuses when the session loads,
           # as one convolution kernel (its blocked NCHWc Conv at ORT_ENABLE_ALL): Conv's line prices both
           cost_class="Conv"),
    OpSpec("BnFoldWeight", Kind.WEIGHT_PREP, ("w", "scale", "var"), _fold_weight_infer, K.bn_fold_weight,
           (_bn_eps(),), decompose=_fold_weight_decompose,
           sampler=_fold_sample("w", "scale", "var"),
           doc="A derived weight: a convolution's weight with the following BatchNormalization's scale folded in, "
               "w * scale / sqrt(var + eps) per output channel."),
    OpSpec("BnFoldBias", Kind.WEIGHT_PREP, ("scale", "bias", "mean", "var", "b?"), _fold_bias_infer,
           K.bn_fold_bias, (_bn_eps(),), decompose=_fold_bias_decompose,
           sampler=_fold_sample("scale", "bias", "mean", "var", "b"),
           doc="A derived weight: a convolution's bias b (absent: 0) with the following BatchNormalization folded "
               "in, (b - mean) * scale / sqrt(var + eps) + bias."),
    OpSpec("WeightScale", Kind.WEIGHT_PREP, ("w", "s"), _weight_scale_infer, lambda a, w, s: w * s,
           decompose=lambda g, ins, a: g.mul(ins[0], ins[1]), sampler=_weight_scale_sample,
           doc="A derived weight: w * s, a per-channel scale s [N] of the last axis of w (a Linear's weight [K, N] "
               "or bias [N]): a layer scale after the Linear folded into its parameters."),
    OpSpec("ConvZeroBias", Kind.WEIGHT_PREP, ("w",), _zero_bias_infer, lambda a, w: np.zeros(w.shape[:1], w.dtype),
           decompose=_zero_bias_decompose,
           sampler=_fold_sample("w"),
           doc="A derived weight: the zero bias [O] of a convolution without one, so a FusedConv sum can follow it."),
]
register(*CONV_OPS)

__all__ = ["CONV_ACTIVATIONS", "CONV_OPS", "conv_out_shape"]
