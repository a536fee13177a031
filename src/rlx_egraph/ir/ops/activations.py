"""Activations that exporters spell out in pieces (their rules: ``rules/export_forms.egg``).

Each op here is declared once: its spec, kernel, decomposition (the subgraph its rule recognises), cost class and
ONNX export; the registry, interpreter, exporter, cost model, builder stubs and fusion catalogue read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..registry import (
    Attrs,
    AttrSpec,
    AttrType,
    Kind,
    OnnxExport,
    OpSpec,
    Shapes,
    TensorType,
    pick,
    random_shape,
    register,
)
from ..shapes import require_float
from . import reference as K

if TYPE_CHECKING:
    from ..graph import Graph

MS = "com.microsoft"


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


ACTIVATIONS = [
    OpSpec("QuickGelu", Kind.FUSED, ("x",), _quick_gelu_infer, _quick_gelu,
           (AttrSpec("alpha", AttrType.FLOAT, 1.702),), flops=lambda a, ins, out: 3 * out.numel,
           doc="x * Sigmoid(alpha * x) (CLIP's QuickGELU; Silu at alpha 1) in one kernel.",
           decompose=_quick_gelu_decompose, sampler=_quick_gelu_sample,
           onnx=OnnxExport("QuickGelu", MS, lambda a: {"alpha": a["alpha"]}),
           cost_class="Silu"),  # Silu is exported as QuickGelu(alpha=1): the same onnxruntime kernel
]
register(*ACTIVATIONS)
