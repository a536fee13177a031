"""The activation ops of ``ir/ops/activations.py``: QuickGelu (CLIP's QuickGELU, x * sigmoid(1.702 x)) recognised in
a graph and in an ONNX model, its kernel against its decomposition, and its export running as onnxruntime's
com.microsoft QuickGelu with parity."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from rlx_egraph import Graph, evaluate, optimize_with_report
from rlx_egraph.cost import TARGETS
from rlx_egraph.ir import REGISTRY
from rlx_egraph.onnx import export_model, import_model


def quick_gelu_graph(alpha: float = 1.702, commuted: bool = False) -> Graph:
    """x [batch, 16] -> x * Sigmoid(x * alpha) (the product's operands swapped when ``commuted``)."""
    g = Graph("clip-mlp")
    x = g.input("x", ("batch", 16))
    scaled = g.mul(g.scalar(alpha), x) if commuted else g.mul(x, g.scalar(alpha))
    g.set_outputs([g.mul(g.sigmoid(scaled), x) if commuted else g.mul(x, g.sigmoid(scaled))])
    return g


@pytest.mark.parametrize("target", ["cpu", "onnxruntime"])
@pytest.mark.parametrize("commuted", [False, True])
def test_quick_gelu_is_recognised_in_either_operand_order_with_parity(target: str, commuted: bool) -> None:
    out, report = optimize_with_report(quick_gelu_graph(commuted=commuted), target, verify=True)
    assert out.op_counts() == {"Input": 1, "QuickGelu": 1}
    (node,) = [n for n in out.nodes if n.op == "QuickGelu"]
    assert node.attrs["alpha"] == pytest.approx(1.702, abs=1e-6)
    assert report.matches_per_rule["quick-gelu"] >= 1 and report.parity.ok


def test_quick_gelu_kernel_equals_its_decomposition_at_any_alpha() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 7)).astype(np.float32) * 4
    for alpha in (1.702, 1.0, 0.25):
        fused = Graph("fused")
        fused.set_outputs([fused.quick_gelu(fused.input("x", (3, 7)), alpha=alpha)])
        (expected,) = evaluate(_static(alpha), {"x": x})
        np.testing.assert_array_equal(evaluate(fused, {"x": x})[0], expected)


def _static(alpha: float) -> Graph:
    g = Graph("static")
    x = g.input("x", (3, 7))
    g.set_outputs([g.mul(x, g.sigmoid(g.mul(x, g.scalar(alpha))))])
    return g


def test_quick_gelu_declares_its_export_and_cost_class() -> None:
    """The onnxruntime target runs it (its export is declared with the op) and prices it by Silu's measured line:
    Silu is exported as the same kernel, QuickGelu with alpha 1."""
    spec = REGISTRY["QuickGelu"]
    target = TARGETS["onnxruntime"]
    assert target.supports("QuickGelu") and target.rate(spec) is target.rates["Silu"]


def clip_mlp_model() -> onnx.ModelProto:
    """CLIP's MLP as torch exports it: fc1, QuickGELU (Mul by 1.702, Sigmoid, Mul), fc2."""
    rng = np.random.default_rng(1)
    weights = [helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32).ravel()
                                  * 0.3) for name, shape in (("fc1", [16, 32]), ("fc2", [32, 16]))]
    alpha = helper.make_tensor("alpha", TensorProto.FLOAT, [], [1.702])
    nodes = [helper.make_node("MatMul", ["x", "fc1"], ["h"]),
             helper.make_node("Mul", ["h", "alpha"], ["scaled"]),
             helper.make_node("Sigmoid", ["scaled"], ["gate"]),
             helper.make_node("Mul", ["h", "gate"], ["act"]),
             helper.make_node("MatMul", ["act", "fc2"], ["y"])]
    graph = helper.make_graph(nodes, "clip_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
                              [*weights, alpha])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_an_onnx_quick_gelu_exports_as_one_onnxruntime_kernel_with_parity() -> None:
    model = clip_mlp_model()
    out, report = optimize_with_report(import_model(model), "onnxruntime")
    assert report.matches_per_rule["quick-gelu"] >= 1 and out.op_counts()["QuickGelu"] == 1
    exported = export_model(out)
    assert [(n.op_type, n.domain) for n in exported.graph.node] == [  # (the Identity names the output "y")
        ("MatMul", ""), ("QuickGelu", "com.microsoft"), ("MatMul", ""), ("Identity", "")]
    (alpha,) = exported.graph.node[1].attribute
    assert (alpha.name, alpha.f) == ("alpha", pytest.approx(1.702, abs=1e-6))
    x = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(run(exported, x), run(model, x), rtol=1e-5, atol=1e-5)
