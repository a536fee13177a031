"""Fused kernels against the swapped operand orders their rules also accept.

tests/test_decompositions.py checks every fused op against its decomposition
(``OpSpec.decompose``).  The rules also match the other operand order of a
commutative Add or Mul (the loader's operand-order variants of matmul.egg
``matmul*-add`` and ``matmul-bias``, swiglu.egg ``swiglu``, norms.egg
``residual-layer-norm``); each such form is checked here against the fused node
on the same leaves, on the op's own sampler, at f32 with rtol=1e-5, atol=1e-6.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_egraph import Graph, evaluate
from rlx_egraph.ir import Kind, op_spec
from rlx_egraph.ir.ops.matmul import EPILOGUE_OPS

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None)

Build = Callable[[Graph, list[int], dict[str, Any]], int]


def epilogue(g: Graph, x: int, act: str) -> int:
    return x if act == "none" else g.add_node(EPILOGUE_OPS[act][0], [x], **EPILOGUE_OPS[act][1])


SWAPPED: dict[str, Build] = {
    "FusedMatMulAdd": lambda g, i, a: g.add(i[2], g.matmul(i[0], i[1])),
    "FusedMatMulATAdd": lambda g, i, a: g.add(i[2], g.matmul_at(i[0], i[1])),
    "FusedMatMulBTAdd": lambda g, i, a: g.add(i[2], g.matmul_bt(i[0], i[1])),
    "FusedMatMulBiasAct": lambda g, i, a: epilogue(g, g.add(i[2], g.matmul(i[0], i[1])), a["act"]),
    "FusedResidualLN": lambda g, i, a: g.layer_norm(g.add(i[1], i[0]), i[2], i[3], axis=a["axis"], eps=a["eps"]),
    "SwiGLU": lambda g, i, a: g.mul(i[1], g.silu(i[0])),
}


@pytest.mark.parametrize("op", SWAPPED)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_swapped_form_matches_fused(op: str, seed: int) -> None:
    """The fused graph is one ``op`` node on the leaves; its value equals the swapped primitive form's."""
    types, attrs = op_spec(op).sample(np.random.default_rng(seed))
    fused, swapped = Graph("fused"), Graph("swapped")
    for g, build in ((fused, lambda g, ins: g.add_node(op, ins, **attrs)),
                     (swapped, lambda g, ins: SWAPPED[op](g, ins, attrs))):
        g.set_outputs([build(g, [g.input(f"in{k}", t.shape) for k, t in enumerate(types)])])
    assert [n.op for n in fused.nodes if n.kind is not Kind.LEAF] == [op]
    assert all(n.kind not in (Kind.FUSED, Kind.WEIGHT_PREP) for n in swapped.nodes)
    assert fused.node(fused.outputs[0]).type == swapped.node(swapped.outputs[0]).type
    (got,), (want,) = evaluate(fused), evaluate(swapped)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
