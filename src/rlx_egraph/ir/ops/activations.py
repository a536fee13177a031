"""Activations (rules/swiglu.egg, rules/export_forms.egg): SwiGLU, its packed form, QuickGelu and BiasGelu."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..export import MS, OnnxExport, OnnxWriter
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
    from ..export import ExportBuilder
    from ..graph import Graph, Node

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


def _bias_gelu_infer(a: Attrs, ins: list[TensorType]) -> TensorType:
    x, bias = ins
    require_float(x, "BiasGelu input")
    if x.rank < 1 or bias.shape != x.shape[-1:]:
        raise ShapeError(f"BiasGelu bias {list(bias.shape)} must be [{x.shape[-1] if x.rank else '?'}], x's last dim")
    return T(x.shape, same_dtype(ins, "BiasGelu operands"))


# BiasGelu's guard: the bias is a row of x's last dim (the kernel adds it to every row).
_BIAS_OF_LAST_DIM = ("(= (shape ?x) ?sx)", "(= (shape ?bias) (vec-of (vec-get ?sx (- (vec-length ?sx) 1))))")


def _bias_gelu_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    """x of rank 1 to 3, bias its last dim."""
    x = random_shape(rng, 1, 3)
    return {"x": x, "bias": x[-1:]}, {}


def _bias_gelu_export(b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> str | None:
    """com.microsoft BiasGelu (erf) or FastGelu with its bias input (tanh) on f32; None (the decomposition: Add,
    then Gelu) for another dtype, which their CPU kernels do not take."""
    if types[0].dtype != "f32":
        return None
    return b.op("FastGelu" if node.attrs["approximate"] == "tanh" else "BiasGelu", ins, domain=MS)


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
    OpSpec("BiasGelu", Kind.FUSED, ("x", "bias"), _bias_gelu_infer, lambda a, x, b: K.gelu(x + b, a["approximate"]),
           (AttrSpec("approximate", S, "none", choices=("none", "tanh")),), flops=lambda a, ins, out: 9 * out.numel,
           doc="Gelu(x + bias) with a bias of x's last dim in one kernel (onnxruntime's com.microsoft BiasGelu; "
               "FastGelu for the tanh form).",
           decompose=lambda g, ins, a: g.gelu(g.add(ins[0], ins[1]), approximate=a["approximate"]),
           sampler=_bias_gelu_sample,
           onnx=OnnxWriter("com.microsoft BiasGelu (erf) / FastGelu (tanh), with the bias input", _bias_gelu_export),
           cost_class="Gelu",  # the same elementwise kernel reading one more row
           rule=DecompositionRule("bias-gelu", "fuse", "swiglu.egg", _BIAS_OF_LAST_DIM)),
]
register(*ACTIVATIONS)
