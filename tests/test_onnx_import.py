"""ONNX import: every listed op type (lowered to MIR or kept opaque) against onnxruntime, folding and
dim binding, scalar canonicalisation, errors, and the weight store's JSON + .npz round trip."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_models import MODELS, OnnxBuilder, feeds
from rlx_egraph import Graph, evaluate
from rlx_egraph.onnx import OnnxImportError, import_model

F = TensorProto.FLOAT
HALF = numpy_helper.from_array(np.array([0.5], np.float32))
X_SHAPE = (2, 3, 4)
SHAPES = {"bert": {"hidden_states": (2, 5, 16), "attention_mask": (2, 5)}, "gpt2": {"hidden_states": (2, 5, 16)},
          "llama": {"hidden_states": (2, 5, 16)}, "sdpa": {"hidden_states": (2, 5, 16), "attention_mask": (2, 5)}}


def run_ort(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    """f32 parity: 1e-4 relative to the output's largest magnitude."""
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * max(float(np.abs(want).max()), 1e-30))


def f(m: OnnxBuilder, name: str) -> str:
    return m.op("Cast", [name], to=F)


# (op type, opset, build(m, x) -> float output, the MIR op it becomes: an op name or "OnnxOp")
Build = Callable[[OnnxBuilder, str], str]
OP_CASES: list[tuple[str, int, Build, str]] = [
    ("MatMul", 17, lambda m, x: m.op("MatMul", [x, m.weight("w", 4, 5)]), "MatMul"),
    ("Gemm", 17, lambda m, x: m.op("Gemm", [m.op("Reshape", [x, m.ints(6, 4)]), m.weight("w", 5, 4),
                                            m.weight("c", 5)], transB=1, alpha=0.5, beta=2.0), "MatMulBT"),
    ("Gemm-transA", 17, lambda m, x: m.op("Gemm", [m.op("Reshape", [x, m.ints(4, 6)]), m.weight("w", 4, 5)],
                                          transA=1), "MatMulAT"),
    ("Add", 17, lambda m, x: m.op("Add", [x, m.weight("b", 4)]), "Add"),
    ("Sub", 17, lambda m, x: m.op("Sub", [m.const(1.0), x]), "Sub"),
    ("Mul", 17, lambda m, x: m.op("Mul", [x, x]), "Mul"),
    ("Div", 17, lambda m, x: m.op("Div", [x, m.const(3.0)]), "Div"),
    ("Pow", 17, lambda m, x: m.op("Pow", [x, m.const(2, np.int64)]), "Pow"),
    ("Sqrt", 17, lambda m, x: m.op("Sqrt", [x]), "Sqrt"),
    ("Reciprocal", 17, lambda m, x: m.op("Reciprocal", [x]), "Recip"),
    ("Neg", 17, lambda m, x: m.op("Neg", [x]), "Neg"),
    ("Erf", 17, lambda m, x: m.op("Erf", [x]), "Erf"),
    ("Tanh", 17, lambda m, x: m.op("Tanh", [x]), "Tanh"),
    ("Sigmoid", 17, lambda m, x: m.op("Sigmoid", [x]), "Sigmoid"),
    ("Relu", 17, lambda m, x: m.op("Relu", [m.op("Sub", [x, m.const(1.0)])]), "Relu"),
    ("Softmax", 17, lambda m, x: m.op("Softmax", [x], axis=1), "Softmax"),
    ("ReduceMean-attr", 14, lambda m, x: m.op("ReduceMean", [x], axes=[1], keepdims=0), "ReduceMean"),
    ("ReduceMean-input", 18, lambda m, x: m.op("ReduceMean", [x, m.ints(-1)]), "ReduceMean"),
    ("LayerNormalization", 17, lambda m, x: m.op("LayerNormalization", [x, m.weight("g", 4), m.weight("b", 4)],
                                                 epsilon=1e-5), "LayerNorm"),
    ("Gather-narrow", 17, lambda m, x: m.op("Gather", [x, m.const(2, np.int64)], axis=1), "Narrow"),
    ("Gather-embedding", 17, lambda m, x: m.op("Gather", [m.weight("table", 3, 5), m.op("Cast", [x], to=7)]),
     "Embedding"),
    ("GatherND", 17, lambda m, x: m.op("GatherND", [x, m.const([[0, 1], [1, 2]], np.int64)]), "OnnxOp"),
    ("Reshape", 17, lambda m, x: m.op("Reshape", [x, m.ints(0, -1)]), "Reshape"),
    ("Transpose", 17, lambda m, x: m.op("Transpose", [x], perm=[2, 0, 1]), "Transpose"),
    ("Flatten", 17, lambda m, x: m.op("Flatten", [x], axis=2), "Reshape"),
    ("Unsqueeze", 17, lambda m, x: m.op("Unsqueeze", [x, m.ints(1)]), "Reshape"),
    ("Squeeze", 17, lambda m, x: m.op("Squeeze", [m.op("Slice", [x, m.ints(0), m.ints(1), m.ints(0)]), m.ints(0)]),
     "Reshape"),
    ("Concat", 17, lambda m, x: m.op("Concat", [x, m.op("Neg", [x])], axis=1), "Concat"),
    ("Slice", 17, lambda m, x: m.op("Slice", [x, m.ints(1, -3), m.ints(100, 3), m.ints(2, 1)]), "Narrow"),
    ("Split", 18, lambda m, x: m.op("Add", m.op("Split", [x], outputs=2, axis=2, num_outputs=2)), "Narrow"),
    ("Where", 17, lambda m, x: m.op("Where", [m.op("Greater", [x, m.const(1.0)]), x, m.const(0.0)]), "Where"),
    ("Equal", 17, lambda m, x: f(m, m.op("Equal", [m.op("Cast", [x], to=7), m.const(1, np.int64)])), "Equal"),
    ("Greater", 17, lambda m, x: f(m, m.op("Greater", [x, m.const(1.0)])), "Greater"),
    ("GreaterOrEqual", 17, lambda m, x: f(m, m.op("GreaterOrEqual", [x, m.const(1.0)])), "OnnxOp"),
    ("Less", 17, lambda m, x: f(m, m.op("Less", [x, m.const(1.0)])), "Less"),
    ("LessOrEqual", 17, lambda m, x: f(m, m.op("LessOrEqual", [x, m.const(1.0)])), "OnnxOp"),
    ("And", 17, lambda m, x: f(m, m.op("And", [m.op("Less", [x, m.const(1.5)]), m.op("Greater", [x, m.const(1.0)])])),
     "OnnxOp"),
    ("Not", 17, lambda m, x: f(m, m.op("Not", [m.op("Less", [x, m.const(1.5)])])), "OnnxOp"),
    ("IsNaN", 17, lambda m, x: f(m, m.op("IsNaN", [m.op("Log", [m.op("Sub", [x, m.const(1.0)])])])), "OnnxOp"),
    ("Expand", 17, lambda m, x: m.op("Expand", [m.op("ReduceSum", [x, m.ints(0)]), m.ints(5, 1, 1)]), "Expand"),
    ("Cast", 17, lambda m, x: f(m, m.op("Cast", [x], to=TensorProto.INT64)), "Cast"),
    ("Cos", 17, lambda m, x: m.op("Cos", [x]), "OnnxOp"),
    ("Sin", 17, lambda m, x: m.op("Sin", [x]), "OnnxOp"),
    ("Range", 17, lambda m, x: m.op("Add", [x, m.op("Cast", [m.op("Range", [m.const(0.0), m.const(4.0),
                                                                           m.const(1.0)])], to=F)]), "Constant"),
    ("Trilu", 17, lambda m, x: m.op("Trilu", [x], upper=0), "OnnxOp"),
    ("Conv", 17, lambda m, x: m.op("Conv", [m.op("Reshape", [x, m.ints(1, 2, 3, 4)]), m.weight("w", 3, 2, 2, 2),
                                            m.weight("b", 3)], pads=[1, 1, 1, 1]), "Conv"),
    ("Identity", 17, lambda m, x: m.op("Identity", [m.op("Neg", [x])]), "Neg"),
    ("Constant", 17, lambda m, x: m.op("Mul", [x, m.const([1.0, 2.0, 3.0, 4.0])]), "Constant"),
    ("Shape", 17, lambda m, x: m.op("Reshape", [x, m.op("Concat", [m.op("Shape", [x], end=1), m.ints(-1)], axis=0)]),
     "Reshape"),
    ("ConstantOfShape", 17, lambda m, x: m.op("Add", [x, m.op("ConstantOfShape", [m.ints(4)], value=HALF)]), "Scalar"),
    ("Min", 17, lambda m, x: m.op("Min", [x, m.const(1.2), m.op("Neg", [x])]), "Min"),
    ("Max", 17, lambda m, x: m.op("Max", [x, m.const(1.2)]), "Max"),
    ("Abs", 17, lambda m, x: m.op("Abs", [m.op("Sub", [x, m.const(1.0)])]), "Abs"),
    ("Log", 17, lambda m, x: m.op("Log", [x]), "Log"),
    ("CumSum", 17, lambda m, x: m.op("CumSum", [x, m.const(1, np.int64)]), "OnnxOp"),
    ("ArgMax", 17, lambda m, x: f(m, m.op("ArgMax", [x], axis=2)), "OnnxOp"),
    ("BatchNormalization", 15, lambda m, x: m.op("BatchNormalization", [x, *(m.weight(n, 3) for n in "sbm"),
                                                                        m.init("v", np.ones(3, np.float32))]),
     "BatchNorm"),
    ("Clip", 17, lambda m, x: m.op("Clip", [x, m.const(0.75), m.const(1.5)]), "Clip"),
    ("Clip-min", 17, lambda m, x: m.op("Clip", [x, m.const(0.0)]), "Relu"),
    ("Clip-max", 17, lambda m, x: m.op("Clip", [x, "", m.const(1.5)]), "Min"),
    ("Clip-attributes", 6, lambda m, x: m.op("Clip", [x], min=0.75, max=1.5), "Clip"),
    ("Pad", 17, lambda m, x: m.op("Pad", [x, m.ints(0, 1, 0, 0, 2, 1), m.const(-0.5)]), "Pad"),
    ("Pad-reflect", 17, lambda m, x: m.op("Pad", [x, m.ints(0, 1, 0, 0, 1, 1)], mode="reflect"), "OnnxOp"),
]


def single_op_model(opset: int, build: Build) -> onnx.ModelProto:
    m = OnnxBuilder(opset)
    x = m.input("x", F, ["batch", 3, 4])
    return m.model({"y": build(m, x)})


@pytest.mark.parametrize(("label", "opset", "build", "mir_op"), OP_CASES, ids=[c[0] for c in OP_CASES])
def test_op_type_imports_and_matches_onnxruntime(label: str, opset: int, build: Build, mir_op: str) -> None:
    model = single_op_model(opset, build)
    x = np.random.default_rng(1).uniform(0.5, 2.0, X_SHAPE).astype(np.float32)
    g = import_model(model, {"x": X_SHAPE})
    assert g.op_counts()[mir_op] >= 1, str(g)
    op_type = label.split("-")[0]
    opaque = {n.attrs["op_type"] for n in g.nodes if n.op == "OnnxOp"}
    assert (op_type in opaque) == (mir_op == "OnnxOp")
    assert_close(evaluate(g, {"x": x})[0], run_ort(model, {"x": x})[0])


def test_every_listed_op_type_has_a_case() -> None:
    listed = {"MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Erf", "Tanh",
              "Sigmoid", "Relu", "Softmax", "ReduceMean", "LayerNormalization", "Gather", "GatherND", "Reshape",
              "Transpose", "Flatten", "Unsqueeze", "Squeeze", "Concat", "Slice", "Split", "Where", "Equal", "Greater",
              "GreaterOrEqual", "Less", "LessOrEqual", "And", "Not", "IsNaN", "Expand", "Cast", "Cos", "Sin", "Range",
              "Trilu", "Conv", "Identity", "Constant", "Shape", "ConstantOfShape", "Min", "Max", "Abs", "Log",
              "BatchNormalization", "Clip", "Pad"}
    assert listed - {c[0].split("-")[0] for c in OP_CASES} == set()


def test_an_opaque_op_with_two_used_outputs_is_one_node_read_through_gets() -> None:
    m = OnnxBuilder(17)
    x = m.input("x", F, [2, 3, 4])
    values, indices = m.op("TopK", [x, m.ints(2)], outputs=2, axis=-1)
    model = m.model({"y": m.op("Add", [values, m.op("Cast", [indices], to=F)])})
    g = import_model(model)
    (opaque,) = [n for n in g.nodes if n.op == "OnnxOp"]
    assert (opaque.attrs["op_type"], opaque.attrs["output"], str(opaque.type)) == \
        ("TopK", -1, "(f32[2, 3, 2], i64[2, 3, 2])")
    assert [(n.attrs["index"], str(n.type)) for n in g.nodes if n.op == "Get" and n.inputs == (opaque.id,)] == \
        [(0, "f32[2, 3, 2]"), (1, "i64[2, 3, 2]")]
    xv = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    assert_close(evaluate(g, {"x": xv})[0], run_ort(model, {"x": xv})[0])


def test_a_shape_that_depends_on_the_values_is_refused_naming_the_node() -> None:
    """An expert's tokens picked by NonZero (the dispatch loop of a mixture-of-experts layer, as TorchScript
    exports it): how many there are depends on the routing, which no static or symbolic dim holds."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [6, 4])
    picked = m.op("NonZero", [m.op("Greater", [x, m.const(0.0)])])
    model = m.model({"y": m.op("Cast", [picked], to=F)})
    with pytest.raises(OnnxImportError) as err:
        import_model(model)
    assert str(err.value) == (
        "NonZero node '/NonZero_2': MIR has no op for it here, and as an ONNX node its output's type is unknown: "
        "onnx shape inference gives no static shape for output 0 of NonZero (got [2, -1])")


def test_an_opaque_op_with_one_used_output_is_a_node_of_that_output() -> None:
    m = OnnxBuilder(17)
    x = m.input("x", F, [2, 3, 4])
    _, indices = m.op("TopK", [x, m.ints(2)], outputs=2, axis=-1)
    g = import_model(m.model({"y": m.op("Cast", [indices], to=F)}))
    assert [(n.attrs["output"], str(n.type)) for n in g.nodes if n.op == "OnnxOp"] == [(1, "i64[2, 3, 2]")]
    assert not [n for n in g.nodes if n.op == "Get"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_export_form_model_evaluates_like_onnxruntime(name: str) -> None:
    model = MODELS[name]()
    inputs = feeds(model, SHAPES[name])
    g = import_model(model, SHAPES[name])
    assert_close(evaluate(g, inputs)[0], run_ort(model, inputs)[0])
    assert sorted(g.weights) == sorted(p.name for p in g.params)
    for t in model.graph.initializer:
        if t.name in g.weights:
            np.testing.assert_array_equal(g.weights[t.name], numpy_helper.to_array(t))
    assert [n.attrs["op_type"] for n in g.nodes if n.op == "OnnxOp"] == (["IsNaN"] if name == "sdpa" else [])


def test_shape_subgraphs_fold_for_the_given_shapes() -> None:
    g = import_model(MODELS["bert"](), SHAPES["bert"])
    reshapes = sorted({n.attrs["shape"] for n in g.nodes if n.op == "Reshape"})
    assert reshapes == [(2, 1, 1, 5), (2, 1, 5), (2, 5, 2, 8), (2, 5, 16)]  # mask unsqueezes, split/merge heads


def test_symbolic_dims_bind_by_name_across_inputs_and_are_kept() -> None:
    g = import_model(MODELS["bert"](), {"hidden_states": (3, 7, 16)})  # binds batch=3, sequence=7 for the mask
    assert g.leaf("attention_mask").shape == (3, 7)
    assert g.meta["dim_names"] == {"hidden_states": ["batch", "sequence", None], "attention_mask": ["batch",
                                                                                                    "sequence"]}
    assert g.meta["output_names"] == ["last_hidden_state"]
    assert g.meta["opset"] == 14


def test_missing_dim_binding_names_the_input_and_the_dim() -> None:
    """A named dim left unbound stays symbolic (tests/test_onnx_symbolic.py); an unnamed one needs a binding."""
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", F, [None, 4])],
        [helper.make_tensor_value_info("y", F, None)]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxImportError) as err:
        import_model(model)
    assert str(err.value) == ("input 'x': dimension 0 (unnamed) has no binding; pass input_shapes={'x': (...)} "
                              "with a size or a symbol name for it")
    assert err.value.command_line_message() == ("input 'x': dimension 0 (unnamed) has no binding; give static "
                                                 "shapes: --input-shape x=?,4 (each dim a number)")


def test_conflicting_and_wrong_bindings_are_refused() -> None:
    with pytest.raises(OnnxImportError, match=r"^input 'attention_mask': dimension 1 'sequence' is bound to 6 here "
                                              r"and to 5 by input 'hidden_states': dimension 1$"):
        import_model(MODELS["bert"](), {"hidden_states": (2, 5, 16), "attention_mask": (2, 6)})
    with pytest.raises(OnnxImportError, match="dimension 2 is fixed to 16 in the model, input_shapes gives 8"):
        import_model(MODELS["bert"](), {"hidden_states": (2, 5, 8)})
    with pytest.raises(OnnxImportError, match=r"input_shapes names \['nope'\], which are not inputs"):
        import_model(MODELS["bert"](), {"nope": (1,)})


def test_ops_outside_the_standard_domains_are_listed_in_one_error() -> None:
    m = OnnxBuilder(17)
    x = m.input("x", F, [2, 4])
    y = m.op("FusedMatMul", [x, m.weight("w", 4, 4)], domain="com.microsoft")
    y = m.op("Relu", [m.op("Gelu", [y], domain="com.microsoft")])
    y = m.op("Frobnicate", [m.op("Frobnicate", [y], domain="my.ops")], domain="my.ops")
    model = m.model({"y": y}, {"com.microsoft": 1, "my.ops": 1})
    with pytest.raises(OnnxImportError) as err:
        import_model(model)
    assert str(err.value) == ("the model uses 3 op type(s) outside the standard ONNX domains, so nothing was "
                              "imported: com.microsoft.FusedMatMul (node '/FusedMatMul_0'), com.microsoft.Gelu "
                              "(node '/Gelu_1'), my.ops.Frobnicate (node '/Frobnicate_3')")


def test_scalars_are_canonical_whatever_the_exporter_wrote() -> None:
    m = OnnxBuilder(17)
    x = m.input("x", F, [2, 4])
    y = m.op("Mul", [x, m.init("two", np.array(2.0, np.float32))])  # a 0-d initializer
    y = m.op("Add", [y, m.const([3.0])])  # a 1-element Constant
    y = m.op("Sub", [y, m.op("ConstantOfShape", [m.ints(2, 4)],  # a ConstantOfShape the size of x
                             value=numpy_helper.from_array(np.array([0.5], np.float32)))])
    y = m.op("Div", [y, m.op("Expand", [m.const(4.0), m.ints(1, 4)])])  # a broadcast constant
    g = import_model(m.model({"y": y}))
    assert [(n.op, n.attrs.get("value")) for n in g.nodes if n.kind.value == "leaf"] == [
        ("Input", None), ("Scalar", 2.0), ("Scalar", 3.0), ("Scalar", 0.5), ("Scalar", 4.0)]
    assert [n.op for n in g.nodes if n.kind.value != "leaf"] == ["Mul", "Add", "Sub", "Div"]
    assert g.weights == {}


def test_initializers_become_params_with_their_values_and_folded_weights_are_derived_params() -> None:
    m = OnnxBuilder(17)
    x = m.input("x", F, [2, 4])
    w = m.weight("w", 4, 3)
    y = m.op("MatMul", [x, m.op("Transpose", [m.op("Transpose", [w], perm=[1, 0])], perm=[1, 0])])
    model = m.model({"y": y})
    g = import_model(model)
    (param,) = g.params
    np.testing.assert_array_equal(g.weights[param.name], numpy_helper.to_array(model.graph.initializer[0]))
    assert param.name == "/Transpose_1_output_0"  # folded from w: a derived weight named by its ONNX value


def test_import_does_not_change_the_model() -> None:
    model = MODELS["llama"]()
    before = model.SerializeToString()
    import_model(model, SHAPES["llama"])
    assert model.SerializeToString() == before


def test_weight_store_round_trips_through_json_and_npz(tmp_path: Path) -> None:
    model = MODELS["llama"]()
    g = import_model(model, SHAPES["llama"])
    path = tmp_path / "llama.json"
    g.save(path)
    assert json.loads(path.read_text())["weights"] == "llama.npz"
    back = Graph.load(path)
    assert back == g and back.meta == g.meta
    assert sorted(back.weights) == sorted(g.weights)
    for name, value in g.weights.items():
        np.testing.assert_array_equal(back.weights[name], value)
    inputs = feeds(model, SHAPES["llama"])
    np.testing.assert_array_equal(evaluate(back, inputs)[0], evaluate(g, inputs)[0])


def test_missing_weight_file_is_named(tmp_path: Path) -> None:
    g = import_model(MODELS["gpt2"](), SHAPES["gpt2"])
    g.save(tmp_path / "g.json")
    (tmp_path / "g.npz").unlink()
    with pytest.raises(Exception, match=r"weight store 'g\.npz' named by"):
        Graph.load(tmp_path / "g.json")


def test_unreadable_model_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(OnnxImportError, match=r"bad\.onnx: not a readable ONNX model"):
        import_model(bad)


def test_path_and_model_proto_import_alike(tmp_path: Path) -> None:
    model = MODELS["gpt2"]()
    onnx.save(model, tmp_path / "m.onnx")
    assert import_model(tmp_path / "m.onnx", SHAPES["gpt2"]) == import_model(model, SHAPES["gpt2"])


def test_value_with_no_producer_names_the_node() -> None:
    node = helper.make_node("Relu", ["ghost"], ["y"], name="r")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(OnnxImportError, match="Relu node 'r': reads 'ghost', which no earlier node"):
        import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_gather_elements_beyond_64_choices_folds_and_runs_like_onnxruntime() -> None:
    """BERT's token_type_ids form: a (1, 65) buffer gathered on axis 1 (onnx's reference gets it wrong)."""
    m = OnnxBuilder(17)
    x = m.input("x", F, ["batch", 65])
    buffer = m.init("buffer", (np.arange(65, dtype=np.int64) % 7)[None])
    folded = m.op("GatherElements", [buffer, m.const([[64, 0, 3, -1]], np.int64)], axis=1)
    runtime = m.op("GatherElements", [x, m.const([[64, 1, 2, -2], [0, 63, 5, 6]], np.int64)], axis=1)
    model = m.model({"y": m.op("Add", [runtime, f(m, folded)])})
    g = import_model(model, {"x": (2, 65)})
    assert [n.attrs["op_type"] for n in g.nodes if n.op == "OnnxOp"] == ["GatherElements"]
    xv = np.random.default_rng(3).standard_normal((2, 65)).astype(np.float32)
    got, want = evaluate(g, {"x": xv})[0], run_ort(model, {"x": xv})[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, xv[[[0], [1]], [[64, 1, 2, 63], [0, 63, 5, 6]]] + np.float32([[1, 0, 3, 1]]))


def test_folding_log_of_zero_is_minus_inf_without_a_warning() -> None:
    """T5's relative position buckets fold log(0) = -inf into a branch a Where discards: no RuntimeWarning."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [2])
    model = m.model({"y": m.op("Max", [x, m.op("Log", [m.const([0.0, 1.0])])])})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = import_model(model)
    xv = np.array([-3.0, -2.0], np.float32)
    np.testing.assert_array_equal(evaluate(g, {"x": xv})[0], [-3.0, 0.0])


def test_padding_mask_anded_with_all_true_is_the_mask_broadcast() -> None:
    """transformers' padding mask: And(all-true [1, 1, S, 1], mask [B, 1, 1, S]) -> Expand, no opaque And."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [2, 1, 4, 4])
    mask = m.input("mask", TensorProto.INT64, [2, 4])
    keep = m.op("Reshape", [m.op("Cast", [mask], to=TensorProto.BOOL), m.ints(2, 1, 1, 4)])
    everything = m.op("ConstantOfShape", [m.ints(1, 1, 4, 1)], value=numpy_helper.from_array(np.array([True])))
    both = m.op("And", [everything, keep])
    model = m.model({"y": m.op("Where", [both, x, m.const(-1e9)])})
    g = import_model(model)
    assert "OnnxOp" not in g.op_counts() and g.op_counts()["Expand"] == 1
    inputs = {"x": np.random.default_rng(4).standard_normal((2, 1, 4, 4)).astype(np.float32),
              "mask": np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.int64)}
    np.testing.assert_array_equal(evaluate(g, inputs)[0], run_ort(model, inputs)[0])


def test_gather_of_a_whole_axis_is_no_narrow() -> None:
    """Gather(x, [0, 1, ..., n-1]) on an axis of n (transformers' flattened padding mask): just a reshape."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [2, 3])
    model = m.model({"y": m.op("Gather", [m.op("Flatten", [x], axis=2), m.const([[0, 1, 2, 3, 4, 5]], np.int64)])})
    g = import_model(model)
    assert [(n.op, n.shape) for n in g.nodes] == [("Input", (2, 3)), ("Reshape", (6, 1)), ("Reshape", (1, 6, 1))]
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(evaluate(g, {"x": xv})[0], run_ort(model, {"x": xv})[0])


def test_gather_nd_reading_the_mask_in_order_is_a_reshape_and_an_expand() -> None:
    """The dynamo exporter's padding mask: GatherND(mask [B, S], indices [B, 1, Q, S, 2] = (b, k)) repeats the
    mask along Q: a Reshape to [B, 1, 1, S] and an Expand, no opaque GatherND."""
    m = OnnxBuilder(18)
    mask = m.input("mask", TensorProto.INT64, ["batch", 4])
    b, _, k = np.meshgrid(np.arange(2), np.arange(3), np.arange(4), indexing="ij")
    indices = np.stack([b, k], axis=-1)[:, None]  # [2, 1, 3, 4, 2]
    model = m.model({"y": f(m, m.op("GatherND", [mask, m.const(indices, np.int64)]))})
    g = import_model(model, {"mask": (2, 4)})
    assert [(n.op, n.shape) for n in g.nodes if n.op in ("Reshape", "Expand", "OnnxOp")] == [
        ("Reshape", (2, 1, 1, 4)), ("Expand", (2, 1, 3, 4))]
    mv = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.int64)
    np.testing.assert_array_equal(evaluate(g, {"mask": mv})[0], run_ort(model, {"mask": mv})[0])
