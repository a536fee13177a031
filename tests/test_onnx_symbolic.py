"""ONNX with symbolic dims: import without shapes keeps the dim_params as symbols (shape subgraphs folded
symbolically), optimizes like the specialised graph, exports with dim_params and run-time shape tensors that
onnxruntime runs at several bindings; what cannot be symbolic is refused naming the node and the symbols."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_models import MODELS, OnnxBuilder, feeds
from rlx_egraph import Graph, GraphError, evaluate, optimize, specialize
from rlx_egraph.frontends.onnx.importer import Importer
from rlx_egraph.frontends.onnx.values import Value
from rlx_egraph.ir.dims import evaluate as dim_value
from rlx_egraph.ir.dims import parse
from rlx_egraph.onnx import OnnxImportError, export_model, import_model, onnx_rules
from test_onnx_import import SHAPES, assert_close, run_ort

F = TensorProto.FLOAT
BINDINGS = ({"batch": 2, "sequence": 8}, {"batch": 3, "sequence": 5})


def dims(info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]


def bert_shapes(binding: dict[str, int]) -> dict[str, tuple[int, ...]]:
    b, s = binding["batch"], binding["sequence"]
    return {"hidden_states": (b, s, 16), "attention_mask": (b, s)}


def fused(graph: Graph) -> Counter[str]:
    return Counter({op: n for op, n in graph.op_counts().items()
                    if op.startswith("Fused") or op in ("QkvAttention", "MultiHeadAttention")})


def test_import_without_shapes_keeps_the_dim_params_as_symbols() -> None:
    g = import_model(MODELS["bert"]())
    assert set(g.symbols) == {"batch", "sequence"}
    batch, sequence = parse("batch"), parse("sequence")
    assert [n.shape for n in g.inputs] == [(batch, sequence, 16), (batch, sequence)]
    reshapes = sorted({tuple(map(str, n.attrs["shape"])) for n in g.nodes if n.op == "Reshape"})
    # mask unsqueezes, head split (Shape/Gather/Unsqueeze/Concat -> Reshape), head merge
    assert reshapes == [("batch", "1", "1", "sequence"), ("batch", "1", "sequence"), ("batch", "sequence", "16"),
                        ("batch", "sequence", "2", "8")]
    assert not [n for n in g.nodes if n.op == "OnnxOp"]


@pytest.mark.parametrize("name", ["bert", "sdpa"])
def test_symbolic_import_specialises_to_the_import_at_those_shapes(name: str) -> None:
    g = import_model(MODELS[name]())
    assert specialize(g, {"batch": 2, "sequence": 5}) == import_model(MODELS[name](), SHAPES[name])
    batch, sequence = parse("batch"), parse("sequence")  # onnx's shape inference types the opaque IsNaN
    assert [n.shape for n in g.nodes if n.op == "OnnxOp"] == ([(batch, 2, sequence, sequence)] if name == "sdpa"
                                                              else [])


def test_bound_dims_are_ints_and_unbound_ones_stay_symbols() -> None:
    m = OnnxBuilder(17)
    x, y = m.input("x", F, ["batch", 4]), m.input("y", F, ["rows", 4])
    model = m.model({"out": m.op("Concat", [x, y], axis=0)})
    g = import_model(model, {"x": (2, 4)})
    assert g.symbols == ("rows",)
    assert g.node(g.outputs[0]).shape == (parse("rows+2"), 4)
    exported = export_model(g)
    assert [dims(i) for i in (*exported.graph.input, *exported.graph.output)] == [[2, 4], ["rows", 4],
                                                                                  ["rows+2", 4]]
    xv, yv = np.ones((2, 4), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(run_ort(exported, {"x": xv, "y": yv})[0], np.concatenate([xv, yv]))


def test_symbolic_optimize_fuses_like_the_specialised_graph() -> None:
    g = import_model(MODELS["bert"]())
    hints = BINDINGS[0]
    opt = optimize(g, target="onnxruntime", rules=onnx_rules(), dim_hints=hints)
    at_hints = optimize(specialize(g, hints), target="onnxruntime", rules=onnx_rules())
    assert set(opt.symbols) == {"batch", "sequence"}
    # the residual LayerNorms stay unfused on onnxruntime (the shipped calibration prices the fused kernel higher)
    assert fused(opt) == fused(at_hints) == Counter({"FusedMatMulBiasAct": 6, "MultiHeadAttention": 1})
    assert specialize(opt, hints).op_counts() == at_hints.op_counts()


def test_symbolic_export_runs_in_onnxruntime_at_two_bindings() -> None:
    model = MODELS["bert"]()
    opt = optimize(import_model(model), target="onnxruntime", rules=onnx_rules(), dim_hints=BINDINGS[0])
    exported = export_model(opt)
    assert [dims(i) for i in (*exported.graph.input, *exported.graph.output)] == \
        [["batch", "sequence", 16], ["batch", "sequence"], ["batch", "sequence", 16]]
    for binding in BINDINGS:
        inputs = feeds(model, bert_shapes(binding))
        got = run_ort(exported, inputs)[0]
        assert got.shape == bert_shapes(binding)["hidden_states"]
        assert_close(got, evaluate(specialize(opt, binding), inputs)[0])
        assert_close(got, run_ort(model, inputs)[0])


def test_polynomial_dims_export_as_shape_arithmetic() -> None:
    g = Graph("poly")
    x = g.input("x", ("batch", "seq", 4))
    rows = g.reshape(x, shape=(parse("batch*seq"), 4))
    wide = g.concat([x, x], axis=1)  # [batch, 2*seq, 4]
    second = g.narrow(wide, axis=1, start=parse("seq"), length=parse("seq"))
    g.set_outputs([g.relu(rows), g.neg(second)])
    exported = export_model(g)
    assert [dims(o) for o in exported.graph.output] == [["batch*seq", 4], ["batch", "seq", 4]]
    for b, s in ((2, 3), (1, 7)):
        xv = np.random.default_rng(s).standard_normal((b, s, 4)).astype(np.float32)
        want = evaluate(specialize(g, {"batch": b, "seq": s}), {"x": xv})
        for got, expected in zip(run_ort(exported, {"x": xv}), want, strict=True):
            assert_close(got, expected)


def test_static_graphs_export_their_reshape_targets_as_constants() -> None:
    exported = export_model(import_model(MODELS["bert"](), SHAPES["bert"]))
    assert not [n for n in exported.graph.node if n.op_type == "Shape"]


# --- what cannot be symbolic ----------------------------------------------------------------------------------


def shape_model(build: Callable[[OnnxBuilder, str], str], out_type: int = F) -> onnx.ModelProto:
    m = OnnxBuilder(17)
    x = m.input("x", F, ["batch", 4])
    model = m.model({"out": build(m, x)})
    model.graph.output[0].type.tensor_type.elem_type = out_type
    return model


def runs_like_the_original(model: onnx.ModelProto, batches: tuple[int, ...] = (1, 2, 5)) -> onnx.ModelProto:
    """The model imported without shapes and exported keeps ``batch`` symbolic and gives onnxruntime's values of the
    original at every batch tried; returns the export."""
    exported = export_model(import_model(model))
    assert dims(exported.graph.input[0]) == ["batch", 4]
    for b in batches:
        xv = np.random.default_rng(b).standard_normal((b, 4)).astype(np.float32)
        got, want = run_ort(exported, {"x": xv})[0], run_ort(model, {"x": xv})[0]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    return exported


def test_values_computed_from_symbolic_shapes_import_as_dims_data() -> None:
    """A shape value read as data is a DimValues; a constant of symbolic shape a Scalar broadcast; Range over a
    symbol an Arange; each exports as run-time shape arithmetic."""
    def batch(m: OnnxBuilder, x: str) -> str:
        return m.op("Gather", [m.op("Shape", [x]), m.const(0, np.int64)], axis=0)

    cases = {
        "cast": (lambda m, x: m.op("Mul", [x, m.op("Cast", [batch(m, x)], to=F)]), F, "DimValues"),
        "filled": (lambda m, x: m.op("Add", [x, m.op("ConstantOfShape", [m.op("Shape", [x])])]), F, "Scalar"),
        "range": (lambda m, x: m.op("Add", [x, m.op("Cast", [m.op("Unsqueeze", [
            m.op("Range", [m.const(0, np.int64), batch(m, x), m.const(1, np.int64)]), m.ints(1)])], to=F)]), F,
            "Arange"),
        "shape": (lambda m, x: m.op("Shape", [x]), TensorProto.INT64, "DimValues"),
    }
    for build, out_type, leaf in cases.values():
        model = shape_model(build, out_type)
        assert import_model(model).op_counts()[leaf] >= 1
        runs_like_the_original(model)


def test_symbolic_imports_of_the_export_forms_run_at_several_bindings() -> None:
    """Each test model, imported with its dim_params kept, optimized and exported: onnxruntime's values of the
    original at three bindings (GPT-2's position buffer has 32 rows, the bound the import records)."""
    for name in MODELS:
        model = MODELS[name]()
        exported = export_model(optimize(import_model(model), target="onnxruntime", dim_hints=BINDINGS[0]))
        for binding in (*BINDINGS, {"batch": 1, "sequence": 17}):
            shapes = {i.name: tuple(binding.get(d, d) for d in dims(i)) for i in model.graph.input}
            inputs = feeds(model, shapes)
            assert_close(run_ort(exported, inputs)[0], run_ort(model, inputs)[0])


def test_a_slice_past_a_static_axis_is_an_assumption_or_an_error_under_max_dims() -> None:
    """GPT-2 slices its 32-row causal buffer to [:sequence]: assumed sequence <= 32 (recorded, exported as model
    metadata); max_dims that allow more is an error, max_dims within it decide the slice."""
    g = import_model(MODELS["gpt2"]())
    assert g.meta["assumptions"] == [
        "sequence <= 32 (Slice node '/Slice_71': the axis it slices has 32 entries)",
        "sequence <= 32 (Slice node '/Slice_74': the axis it slices has 32 entries)"]
    props = {p.key: p.value for p in export_model(g).metadata_props}
    assert props["rlx_egraph.assumptions"] == "; ".join(g.meta["assumptions"])
    with pytest.raises(OnnxImportError) as err:
        import_model(MODELS["gpt2"](), max_dims={"sequence": 64})
    assert str(err.value).startswith("Slice node '/Slice_71': cannot decide whether sequence passes the axis of "
                                     "size 32 for every value of sequence; pass input_shapes")
    bounded = import_model(MODELS["gpt2"](), max_dims={"sequence": 16})
    assert bounded.meta["assumptions"][0] == "sequence <= 32 (Slice node '/Slice_71': the given max_dims)"
    with pytest.raises(OnnxImportError, match=r"^max_dims names 'seq', which is no symbolic dim of the model's "
                                              r"inputs \(batch, sequence\)$"):
        import_model(MODELS["gpt2"](), max_dims={"seq": 16})


def test_a_step_over_a_symbolic_length_is_refused_naming_the_node() -> None:
    strided = shape_model(lambda m, x: m.op("Slice", [x, m.ints(0), m.op("Shape", [x], start=0, end=1), m.ints(0),
                                                      m.ints(2)]))
    with pytest.raises(OnnxImportError) as err:
        import_model(strided)  # a step of 2: (batch + 1) // 2 rows, no polynomial of batch
    assert str(err.value) == (
        "Slice node '/Slice_4': MIR has no op for it here, and as an ONNX node its output's type is unknown: onnx "
        "shape inference gives no static shape for output 0 of Slice (got [-1, -1]); pass input_shapes to bind "
        "'batch'")
    assert import_model(strided, {"x": (5, 4)}).op_counts()["OnnxOp"] == 1


def test_a_decision_that_depends_on_the_symbols_is_refused() -> None:
    def build(m: OnnxBuilder, x: str) -> str:
        batch = m.op("Gather", [m.op("Shape", [x]), m.const(0, np.int64)], axis=0)
        small = m.op("Less", [batch, m.const(4, np.int64)])
        return m.op("Reshape", [x, m.op("Where", [small, m.ints(-1, 4), m.ints(-1, 2)])])

    with pytest.raises(OnnxImportError) as err:
        import_model(shape_model(build))
    assert str(err.value) == ("Less node '/Less_4': cannot decide batch < 4 for every value of batch; pass "
                              "input_shapes to bind 'batch'")
    assert import_model(shape_model(build), max_dims={"batch": 3}).meta["assumptions"] == [
        "batch < 4 (Less node '/Less_4': the given max_dims)"]


def test_a_dim_param_that_is_not_a_symbolic_dim_is_refused() -> None:
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", F, ["batch size", 4])],
        [helper.make_tensor_value_info("y", F, None)]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxImportError) as err:
        import_model(model)
    assert str(err.value) == ("input 'x': dimension 0 'batch size' is not a symbolic dim (cannot parse dim "
                              "'batch size': unexpected 'size'); pass input_shapes={'x': (...)}")
    assert err.value.unbound == {"x": ("?", "4")}  # a name with a space would split a command line


def test_export_refuses_a_symbol_no_input_carries() -> None:
    g = Graph("hidden")
    x = g.input("x", ("batch*seq", 4))
    g.set_outputs([g.reshape(x, shape=(parse("batch"), parse("seq"), 4))])
    with pytest.raises(GraphError) as err:
        export_model(g)
    assert str(err.value) == ("node 1 (Reshape): cannot be exported with symbolic dims: symbolic dim batch is no "
                              "dim of a graph input, so its value is not known at run time")


# --- the symbolic folds agree with onnx's reference evaluator at a binding -----------------------------------

AT = {"batch": 3, "sequence": 5}


def sym(*dims: object) -> np.ndarray:
    out = np.empty(len(dims), dtype=object)
    out[:] = [parse(d) if isinstance(d, str) else d for d in dims]
    return out


def at(array: np.ndarray) -> np.ndarray:
    """A symbolic value at the binding AT (int64), a static one as it is."""
    if array.dtype != object:
        return array
    return np.vectorize(lambda d: dim_value(d, AT), otypes=[np.int64])(array)


S = sym("batch", "sequence", 4)
I64 = np.int64
# (op, inputs (a symbolic value or a static array), attributes)
FOLD_CASES: list[tuple[str, list[np.ndarray], dict[str, object]]] = [
    ("Identity", [S], {}),
    ("Gather", [S, np.array([0, 2], I64)], {"axis": 0}),
    ("Gather", [S, np.array(-2, I64)], {}),
    ("Slice", [S, np.array([1], I64), np.array([2**62], I64)], {}),
    ("Slice", [S, np.array([-1], I64), np.array([-2**62], I64), np.array([0], I64), np.array([-1], I64)], {}),
    ("Concat", [S, np.array([7], I64)], {"axis": 0}),
    ("Unsqueeze", [S, np.array([0], I64)], {}),
    ("Squeeze", [S.reshape(1, 3), np.array([0], I64)], {}),
    ("Squeeze", [S.reshape(1, 3)], {}),
    ("Reshape", [S.reshape(1, 3), np.array([0, -1], I64)], {}),
    ("Expand", [S, np.array([2, 3], I64)], {}),
    ("Cast", [S], {"to": TensorProto.INT32}),
    ("Shape", [S.reshape(1, 3)], {"start": -1}),
    ("Size", [S], {}),
    ("ReduceProd", [S], {"keepdims": 0}),
    ("ReduceSum", [S.reshape(1, 3), np.array([1], I64)], {}),
    ("Add", [S, np.array(1, I64)], {}),
    ("Sub", [S, S], {}),
    ("Mul", [S, np.array([2, 3, 4], I64)], {}),
    ("Div", [sym("2*batch", "3*sequence+3", -7), np.array([2, 3, 2], I64)], {}),
    ("Mod", [sym("2*batch", 7, -7), np.array([2, 3, 2], I64)], {}),
    ("Max", [S, np.array(1, I64)], {}),
    ("Min", [S, np.array(1, I64), np.array(2, I64)], {}),
    ("Max", [np.array(1, I64), S], {}),
    ("Neg", [S], {}),
    ("Equal", [S, np.array(-1, I64)], {}),
    ("Equal", [S, S], {}),
    ("Less", [S, np.array(0, I64)], {}),
    ("Greater", [S, np.array(0, I64)], {}),
    ("LessOrEqual", [S, S], {}),
    ("GreaterOrEqual", [S, np.array(1, I64)], {}),
    ("Where", [np.array([True, False, True]), np.ones(3, I64), S], {}),
]


def fold(op: str, inputs: list[np.ndarray], attrs: dict[str, object]) -> tuple[np.ndarray, onnx.ModelProto]:
    """The importer's fold of one ``op`` node on ``inputs`` (values given directly), and the node's model."""
    names = [f"in{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["out"], name="n", **attrs)
    model = helper.make_model(helper.make_graph([node], "fold", [], [helper.make_tensor_value_info("out", 0, None)]),
                              opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    imp = Importer(model, {})
    imp.values.update({n: Value(array=a) for n, a in zip(names, inputs, strict=True)})
    imp.label = "Node 'n'"
    return imp.fold(node, names)[0].array, model


@pytest.mark.parametrize(("op", "inputs", "attrs"), FOLD_CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(FOLD_CASES)])
def test_symbolic_fold_agrees_with_the_reference_evaluator(op: str, inputs: list[np.ndarray],
                                                           attrs: dict[str, object]) -> None:
    got, model = fold(op, inputs, attrs)
    want = ReferenceEvaluator(model).run(None, {f"in{k}": at(a) for k, a in enumerate(inputs)})[0]
    assert at(got).shape == want.shape
    np.testing.assert_array_equal(at(got), want)
    if got.dtype != object:
        assert got.dtype == want.dtype


@pytest.mark.parametrize(("op", "inputs", "message"), [
    ("Max", [S, np.array(4, I64)], "cannot decide max(batch, 4) for every value of batch"),
    ("Equal", [S[:1], S[1:2]], "cannot decide whether batch-sequence != 0 for every value of batch, sequence"),
    ("Div", [S[:1], S[1:2]], "cannot decide batch // sequence for every value of batch, sequence"),
])
def test_symbolic_fold_refuses_what_depends_on_the_values(op: str, inputs: list[np.ndarray], message: str) -> None:
    with pytest.raises(OnnxImportError) as err:
        fold(op, inputs, {})
    assert str(err.value) == f"Node 'n': {message}; pass input_shapes to bind 'batch', 'sequence'"  # S's symbols
