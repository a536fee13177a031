"""The activation ops of ``ir/ops/activations.py``: QuickGelu (CLIP's QuickGELU, x * sigmoid(1.702 x)) and BiasGelu
(Gelu(x + bias)) recognised in a graph and in an ONNX model, their kernels against their decompositions, and their
exports running as onnxruntime's com.microsoft QuickGelu, BiasGelu and FastGelu with parity."""

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


def bias_gelu_graph(approximate: str = "none", bias_shape: tuple[int, ...] = (16,), commuted: bool = False) -> Graph:
    """x [3, 4, 16] -> Gelu(x + bias) (the sum's operands swapped when ``commuted``)."""
    g = Graph("bias-gelu")
    x, bias = g.input("x", (3, 4, 16)), g.param("bias", bias_shape)
    g.set_outputs([g.gelu(g.add(bias, x) if commuted else g.add(x, bias), approximate=approximate)])
    g.weights["bias"] = np.random.default_rng(3).standard_normal(bias_shape).astype(np.float32)
    return g


@pytest.mark.parametrize("target", ["cpu", "onnxruntime"])
@pytest.mark.parametrize(("approximate", "commuted"), [("none", False), ("none", True), ("tanh", False)])
def test_bias_gelu_is_recognised_with_parity(target: str, approximate: str, commuted: bool) -> None:
    out, report = optimize_with_report(bias_gelu_graph(approximate, commuted=commuted), target, verify=True)
    assert out.op_counts() == {"Input": 1, "Param": 1, "BiasGelu": 1}
    (node,) = [n for n in out.nodes if n.op == "BiasGelu"]
    assert node.attrs == {"approximate": approximate} and node.shape == out.node(out.outputs[0]).shape
    assert report.matches_per_rule["bias-gelu"] >= 1 and report.parity.ok


def test_bias_gelu_needs_a_bias_row_of_the_last_dim() -> None:
    out, report = optimize_with_report(bias_gelu_graph(bias_shape=(4, 16)), "onnxruntime")
    assert out.op_counts() == {"Input": 1, "Param": 1, "Add": 1, "Gelu": 1}
    assert "bias-gelu" not in report.matches_per_rule


def test_bias_gelu_kernel_equals_its_decomposition() -> None:
    x = np.random.default_rng(4).standard_normal((3, 4, 16)).astype(np.float32) * 3
    for approximate in ("none", "tanh"):
        g = bias_gelu_graph(approximate)
        fused = Graph("fused")
        fused.set_outputs([fused.bias_gelu(fused.input("x", (3, 4, 16)), fused.param("bias", (16,)),
                                           approximate=approximate)])
        fused.weights["bias"] = g.weights["bias"]
        np.testing.assert_array_equal(evaluate(fused, {"x": x})[0], evaluate(g, {"x": x})[0])


@pytest.mark.parametrize(("approximate", "kernel"), [("none", "BiasGelu"), ("tanh", "FastGelu")])
def test_bias_gelu_exports_as_one_onnxruntime_kernel_with_parity(approximate: str, kernel: str) -> None:
    g = bias_gelu_graph(approximate)
    exported = export_model(optimize_with_report(g, "onnxruntime")[0])
    assert [(n.op_type, n.domain, list(n.input)) for n in exported.graph.node] == [
        (kernel, "com.microsoft", ["x", "bias"]), ("Identity", "", [exported.graph.node[0].output[0]])]
    x = np.random.default_rng(5).standard_normal((3, 4, 16)).astype(np.float32)
    np.testing.assert_allclose(run(exported, x), evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert REGISTRY["BiasGelu"].cost_class == "Gelu" and TARGETS["onnxruntime"].supports("BiasGelu")


def test_bias_gelu_in_f16_exports_its_decomposition() -> None:
    """onnxruntime's CPU BiasGelu takes f32 only: another dtype is written as Add, then Gelu."""
    g = Graph("f16")
    g.set_outputs([g.bias_gelu(g.input("x", (2, 16), "f16"), g.input("bias", (16,), "f16"))])
    assert [(n.op_type, n.domain) for n in export_model(g).graph.node] == [
        ("Add", ""), ("Gelu", "com.microsoft"), ("Identity", "")]
