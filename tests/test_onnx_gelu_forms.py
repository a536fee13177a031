"""tanh GELU in the associations exporters and model code write it, recognised by the scalar-chain rules
(rules/export_forms.egg) in a model built with onnx.helper, exported as com.microsoft FastGelu with the bias of the
matmul before it, and run in onnxruntime with the original's values."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import onnx

from onnx_models import F, OnnxBuilder, feeds
from rlx_egraph import Graph, optimize, optimize_with_report
from rlx_egraph.onnx import export_model, import_model
from rlx_egraph.report.fusion import NEAR_MISS
from test_onnx_import import run_ort

K, C = 0.044715, 0.7978845608028654


def pow3(m: OnnxBuilder, x: str) -> str:
    return m.op("Pow", [x, m.const(3.0)])


# x -> 0.5 * x * (1 + tanh(c * (x + k x^3))), each spelled differently (none matched by one rule of each step)
FORMS: dict[str, Callable[[OnnxBuilder, str], str]] = {
    # BLOOM's bloom_gelu_forward: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
    "bloom": lambda m, x: m.op("Mul", [m.op("Mul", [x, m.const(0.5)]), m.op("Add", [m.const(1.0), m.op("Tanh", [
        m.op("Mul", [m.op("Mul", [m.const(0.79788456), x]), m.op("Add", [m.const(1.0), m.op("Mul", [
            m.op("Mul", [m.const(K), x]), x])])])])])]),
    # the constants distributed over the sum, the product halved by a division: (x / 2) * (1 + tanh(c x + ck x^3))
    "distributed": lambda m, x: m.op("Mul", [m.op("Div", [x, m.const(2.0)]), m.op("Add", [m.op("Tanh", [
        m.op("Add", [m.op("Mul", [x, m.const(C)]), m.op("Mul", [pow3(m, x), m.const(C * K)])])]), m.const(1.0)])]),
    # the cube as (k x) * (x * x), the product 0.5 x * O
    "cube-split": lambda m, x: m.op("Mul", [m.op("Mul", [m.const(0.5), x]), m.op("Add", [m.op("Tanh", [
        m.op("Mul", [m.const(C), m.op("Add", [x, m.op("Mul", [m.op("Mul", [m.const(K), x]), m.op("Mul", [x, x])])])])]),
        m.const(1.0)])]),
}


def gelu_mlp() -> onnx.ModelProto:
    """Three feed-forward layers x @ w1 + b1 -> GELU -> @ w2 + b2 in a chain, one per form of FORMS."""
    m = OnnxBuilder(17)
    h = m.input("x", F, [2, 5, 16])
    for name, gelu in FORMS.items():
        h = m.linear(gelu(m, m.linear(h, f"{name}.fc1", 16, 32)), f"{name}.fc2", 32, 16)
    return m.model({"y": h})


def test_every_association_of_tanh_gelu_exports_as_fast_gelu_with_its_bias() -> None:
    model = gelu_mlp()
    exported = export_model(optimize(import_model(model), target="onnxruntime", verify=False))
    ops = Counter(n.op_type for n in exported.graph.node)
    assert (ops["FastGelu"], ops["Tanh"], ops["Pow"], ops["Mul"]) == (3, 0, 0, 0)
    assert all(len(n.input) == 2 for n in exported.graph.node if n.op_type == "FastGelu")  # the bias inside
    inputs = feeds(model, {"x": (2, 5, 16)})
    np.testing.assert_allclose(run_ort(exported, inputs)[0], run_ort(model, inputs)[0], rtol=0, atol=1e-5)


def test_a_tanh_gelu_scaled_by_other_than_a_half_is_a_near_miss_of_the_scalar_chain_rule() -> None:
    """0.6 x * (1 + tanh(c (x + k x^3))) is no GELU: the one near miss is the rule that reads the chain, naming the
    guard on x-power's constant that failed."""
    g = Graph()
    x = g.input("x", (4, 16))
    inner = g.mul(g.add(x, g.mul(g.mul(g.mul(x, x), x), g.scalar(K))), g.scalar(C))
    g.set_outputs([g.mul(g.mul(x, g.scalar(0.6)), g.add(g.tanh(inner), g.scalar(1.0)))])
    _, report = optimize_with_report(g, regions=False)
    (miss,) = report.fusion.missed
    assert (miss.kind, miss.op, miss.rule, miss.reason) == (NEAR_MISS, "Gelu", "gelu-tanh-half-x-o", "guard")
    assert miss.detail.endswith("except that the guard (< (abs (- ?c 0.5)) 0.000000001) does not hold")
