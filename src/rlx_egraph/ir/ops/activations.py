"""Activations (rules/swiglu.egg, rules/export_forms.egg): SwiGLU, its packed form, QuickGelu and HardSwish."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..export import MS, OnnxExport
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
    pick,
    random_shape,
    register,
)
from ..shapes import require_float, same_dtype
from . import reference as K

if TYPE_CHECKING:
    from ..graph import Graph

T = TensorType
B, S = AttrType.BOOL, AttrType.STR


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


def _quick_gelu_infer(a: Attrs, ins: list[TensorType]) -> TensorType:
    require_float(ins[0], "QuickGelu input")
    return ins[0]


def _quick_gelu(a: Attrs, x: np.ndarray) -> np.ndarray:
    return x * K.sigmoid(x * np.asarray(a["alpha"], x.dtype))


def _quick_gelu_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """x * Sigmoid(x * alpha), as CLIP's QuickGELU exports."""
    x = ins[0]
    return g.mul(x, g.sigmoid(g.mul(x, g.scalar(a["alpha"], g.node(x).dtype))))


def _quick_gelu_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x of rank 1 to 3; alpha CLIP's 1.702 or from [0.5, 2]."""
    return {"x": random_shape(rng, 1, 3)}, {"alpha": pick(rng, [1.702, float(rng.uniform(0.5, 2.0))])}


def _hard_swish_infer(a: Attrs, ins: list[TensorType]) -> TensorType:
    require_float(ins[0], "HardSwish input")
    return ins[0]


def _hard_swish(a: Attrs, x: np.ndarray) -> np.ndarray:
    three, six = np.asarray(3.0, x.dtype), np.asarray(6.0, x.dtype)
    return x * np.minimum(np.maximum(x + three, np.asarray(0.0, x.dtype)), six) / six


def _hard_swish_decompose(g: Graph, ins: list[int], a: Attrs) -> int:
    """x * Clip(x + 3, 0, 6) / 6, as ``x * F.relu6(x + 3) / 6`` exports."""
    x, dtype = ins[0], g.node(ins[0]).dtype
    return g.div(g.mul(x, g.clip(g.add(x, g.scalar(3.0, dtype)), min=0.0, max=6.0)), g.scalar(6.0, dtype))


ACTIVATIONS = [
    OpSpec("SwiGLU", Kind.FUSED, ("gate", "up"), _swiglu_infer, lambda a, g, u: K.swiglu(g, u),
           doc="Silu(gate) * up.", decompose=lambda g, ins, a: g.mul(g.silu(ins[0]), ins[1]),
           rule=DecompositionRule("swiglu", "fuse", "swiglu.egg", ("(= (shape ?gate) (shape ?up))",))),
    OpSpec("FusedSwiGLU", Kind.FUSED, ("cat",), _fused_swiglu_infer, K.fused_swiglu,
           (AttrSpec("gate_first", B, False), AttrSpec("cast_to", S, "none", choices=SWIGLU_CASTS)),
           doc="up * Silu(gate) where cat = [up | gate] (or [gate | up] when gate_first), written as cast_to "
               "(a float dtype; none: cat's).",
           decompose=_fused_swiglu_decompose,  # (cast_to: its own parity test, the dtype changes)
           sampler=lambda rng: ({"cat": (*random_shape(rng, 0, 2), 2 * int(rng.integers(1, 6)))},
                                {"cast_to": "none"})),
    OpSpec("QuickGelu", Kind.FUSED, ("x",), _quick_gelu_infer, _quick_gelu,
           (AttrSpec("alpha", AttrType.FLOAT, 1.702),), flops=lambda a, ins, out: 3 * out.numel,
           doc="x * Sigmoid(alpha * x) (CLIP's QuickGELU; Silu at alpha 1) in one kernel.",
           decompose=_quick_gelu_decompose, sampler=_quick_gelu_sample,
           onnx=OnnxExport("QuickGelu", MS, lambda a: {"alpha": a["alpha"]}),
           cost_class="Silu",  # Silu is exported as QuickGelu(alpha=1): the same onnxruntime kernel
           rule=DecompositionRule("quick-gelu", "recognize", "export_forms.egg")),
    OpSpec("HardSwish", Kind.FUSED, ("x",), _hard_swish_infer, _hard_swish, flops=lambda a, ins, out: 5 * out.numel,
           doc="x * Clip(x + 3, 0, 6) / 6 (MobileNetV3's hard swish, x * HardSigmoid(x)) in one kernel.",
           decompose=_hard_swish_decompose, onnx=OnnxExport("HardSwish"),  # the default domain's, since opset 14
           cost_class="Silu",  # one read and one write per element, like onnxruntime's other activation kernels
           rule=DecompositionRule("hard-swish", "recognize", "export_forms.egg")),
]
register(*ACTIVATIONS)
