"""The activation ops of ``ir/ops/activations.py``: QuickGelu (CLIP's QuickGELU, x * sigmoid(1.702 x)) and HardSwish
(MobileNetV3's x * relu6(x + 3) / 6), each recognised in a graph and in an ONNX model, its kernel against its
decomposition, and its export running as onnxruntime's kernel (com.microsoft QuickGelu, HardSwish) with parity."""

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


# --- HardSwish --------------------------------------------------------------------------------------


def hard_swish_graph(commuted: bool = False) -> Graph:
    """x [batch, 8, 6, 6] -> x * relu6(x + 3) / 6 (the sum's and the product's operands swapped when ``commuted``)."""
    g = Graph("hard-swish")
    x = g.input("x", ("batch", 8, 6, 6))
    shifted = g.add(g.scalar(3.0), x) if commuted else g.add(x, g.scalar(3.0))
    gate = g.clip(shifted, min=0.0, max=6.0)
    g.set_outputs([g.div(g.mul(gate, x) if commuted else g.mul(x, gate), g.scalar(6.0))])
    return g


@pytest.mark.parametrize("target", ["cpu", "onnxruntime"])
@pytest.mark.parametrize("commuted", [False, True])
def test_hard_swish_is_recognised_in_either_operand_order_with_parity(target: str, commuted: bool) -> None:
    out, report = optimize_with_report(hard_swish_graph(commuted), target, verify=True)
    assert out.op_counts() == {"Input": 1, "HardSwish": 1}
    assert report.matches_per_rule["hard-swish"] >= 1 and report.parity.ok


def test_hard_swish_is_recognised_from_min_max_relu6() -> None:
    """relu6 written min(max(x + 3, 0), 6), as exporters without Clip write it: Clip first, then HardSwish."""
    g = Graph("hard-swish-min-max")
    x = g.input("x", (4, 8))
    gate = g.min(g.max(g.add(x, g.scalar(3.0)), g.scalar(0.0)), g.scalar(6.0))
    g.set_outputs([g.div(g.mul(x, gate), g.scalar(6.0))])
    out, report = optimize_with_report(g, "cpu", verify=True)
    assert out.op_counts() == {"Input": 1, "HardSwish": 1} and report.parity.ok


def test_hard_swish_is_not_recognised_with_other_constants() -> None:
    """x * relu6(x + 2) / 6 is not a hard swish: the rule does not match it."""
    g = Graph("not-hard-swish")
    x = g.input("x", (4, 8))
    g.set_outputs([g.div(g.mul(x, g.clip(g.add(x, g.scalar(2.0)), min=0.0, max=6.0)), g.scalar(6.0))])
    out, report = optimize_with_report(g, "onnxruntime")
    assert report.matches_per_rule.get("hard-swish", 0) == 0
    assert out.op_counts() == {"Input": 1, "Scalar": 2, "Add": 1, "Clip": 1, "Mul": 1, "Div": 1}


def test_hard_swish_kernel_is_x_times_hard_sigmoid() -> None:
    """0 below -3, x above 3, x * (x + 3) / 6 between; equal to its decomposition."""
    x = np.array([[-5.0, -3.0, -1.5, 0.0, 1.5, 3.0, 5.0]], np.float32)
    fused = Graph("fused")
    fused.set_outputs([fused.hard_swish(fused.input("x", (1, 7)))])
    static = Graph("static")
    xs = static.input("x", (1, 7))
    static.set_outputs([static.div(static.mul(xs, static.clip(static.add(xs, static.scalar(3.0)), min=0.0, max=6.0)),
                                   static.scalar(6.0))])
    (got,) = evaluate(fused, {"x": x})
    np.testing.assert_array_equal(got, evaluate(static, {"x": x})[0])
    np.testing.assert_allclose(got, [[0.0, 0.0, -0.375, 0.0, 1.125, 3.0, 5.0]], rtol=1e-6)


def test_hard_swish_declares_its_export_and_cost_class() -> None:
    spec = REGISTRY["HardSwish"]
    target = TARGETS["onnxruntime"]
    assert spec.onnx.kernel == "HardSwish"
    assert target.supports("HardSwish") and target.rate(spec) is target.rates["Silu"]


def mobilenet_block_model() -> onnx.ModelProto:
    """A MobileNetV3 block as ``x * F.relu6(x + 3) / 6`` exports: Conv, Add 3, Clip(0, 6), Mul, Div 6, Conv."""
    rng = np.random.default_rng(3)
    tensors = [helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32).ravel()
                                  * 0.3) for name, shape in (("w1", [8, 4, 3, 3]), ("b1", [8]), ("w2", [4, 8, 1, 1]))]
    tensors += [helper.make_tensor(name, TensorProto.FLOAT, [], [value])
                for name, value in (("three", 3.0), ("zero", 0.0), ("six", 6.0))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["h", "three"], ["shifted"]),
             helper.make_node("Clip", ["shifted", "zero", "six"], ["gate"]),
             helper.make_node("Mul", ["h", "gate"], ["scaled"]),
             helper.make_node("Div", ["scaled", "six"], ["act"]),
             helper.make_node("Conv", ["act", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mobilenet_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 6, 6])], tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_an_onnx_hard_swish_exports_as_onnx_hard_swish_with_parity() -> None:
    model = mobilenet_block_model()
    out, report = optimize_with_report(import_model(model), "onnxruntime")
    assert report.matches_per_rule["hard-swish"] >= 1
    assert out.op_counts() == {"Input": 1, "Param": 3, "Conv": 2, "HardSwish": 1}  # the convolutions' bias kept in
    exported = export_model(out)
    assert [(n.op_type, n.domain) for n in exported.graph.node] == [  # (the Identity names the output "y")
        ("Conv", ""), ("HardSwish", ""), ("Conv", ""), ("Identity", "")]
    x = np.random.default_rng(4).standard_normal((2, 4, 6, 6)).astype(np.float32) * 3
    np.testing.assert_allclose(run(exported, x), run(model, x), rtol=1e-5, atol=1e-5)
