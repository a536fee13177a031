"""The ONNX front door: bindings as documented (numbers, symbol names, symbol=hint) from Python and the command
line, the ONNX rules by provenance, the missing extra, external data, ONNX node names in reports and exports,
zero-size tensors, local functions, If branches reading the enclosing graph, and malformed models."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_models import DYNAMIC_MODELS, MODELS, OnnxBuilder, dynamic_feeds
from rlx_egraph import evaluate, optimize, optimize_with_report, specialize
from rlx_egraph.cli.main import main
from rlx_egraph.frontends.onnx import exporter
from rlx_egraph.ir.dims import parse
from rlx_egraph.kernels.parity import ParityError
from rlx_egraph.onnx import FoldLimits, OnnxImportError, export_model, import_model, onnx_rules
from rlx_egraph.rules import RuleSet
from test_onnx_import import assert_close, run_ort

F = TensorProto.FLOAT
ROOT = Path(__file__).resolve().parents[1]


# --- bindings ------------------------------------------------------------------------------------------------------


def test_input_shapes_take_numbers_symbol_names_and_hints() -> None:
    model = DYNAMIC_MODELS["bert", "torchscript"]()
    g = import_model(model, {"input_ids": ("batch", 16)})
    assert [n.shape for n in g.inputs] == [(parse("batch"), 16), (parse("batch"), 16)]
    g = import_model(model, {"input_ids": ("b", "s=128")})  # renamed symbols, and a pricing hint that fixes nothing
    assert g.symbols == ("b", "s") and g.meta["dim_hints"] == {"s": 128}
    assert g.meta["dim_names"] == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}
    # the hint is what optimize prices the symbol at (a dim_hints argument still wins)
    def traffic(**hints: int) -> int:
        return optimize_with_report(g, target="onnxruntime", dim_hints=hints)[1].profile_before.traffic_bytes

    assert traffic() == traffic(b=16, s=128) != traffic(s=16)


@pytest.mark.parametrize(("dims", "message"), [
    (("batch", 2.5), "input 'input_ids': dimension 1: 2.5 is not a dim (an int, a symbol name, or 'name=hint')"),
    (("batch", "2x"), "input 'input_ids': dimension 1: '2x' is neither a number nor a symbol name (a letter or _, "
                      "then letters, digits, _), optionally with '=hint'"),
    (("batch", "seq=0"), "input 'input_ids': dimension 1: the hint in 'seq=0' must be an int >= 1"),
    (("batch", 0), "input 'input_ids': dimension 1: 0 is not a dim size (inputs take sizes >= 1)"),
    (("batch",), "input 'input_ids': input_shapes gives rank 1 [batch], the model's input has rank 2"),
    ("batch", "input 'input_ids': input_shapes gives 'batch', not a sequence of dims"),
    ((True, 3), "input 'input_ids': dimension 0: True is not a dim (an int, a symbol name, or 'name=hint')"),
])
def test_every_bad_binding_names_the_input_and_the_dim(dims: object, message: str) -> None:
    with pytest.raises(OnnxImportError) as err:
        import_model(DYNAMIC_MODELS["bert", "torchscript"](), {"input_ids": dims})
    assert str(err.value) == message


def test_a_symbol_for_a_fixed_dim_and_conflicting_hints_are_refused() -> None:
    with pytest.raises(OnnxImportError, match=r"^input 'hidden_states': dimension 2 is fixed to 16 in the model, "
                                              r"input_shapes gives width$"):
        import_model(MODELS["llama"](), {"hidden_states": ("batch", "sequence", "width")})
    with pytest.raises(OnnxImportError, match=r"^input 'attention_mask': dimension 1: symbol 's' is hinted 8 here and "
                                              r"4 elsewhere$"):
        import_model(DYNAMIC_MODELS["bert", "torchscript"](),
                     {"input_ids": ("b", "s=4"), "attention_mask": ("b", "s=8")})


def write(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def test_cli_input_shape_as_documented(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--input-shape input_ids=batch,sequence=128 keeps both dims symbolic (the export keeps its dim_params);
    a number fixes one; a bad dim is one error line naming the input and the dim."""
    path = write(DYNAMIC_MODELS["gpt2", "torchscript"](), tmp_path / "m.onnx")
    out = tmp_path / "m.opt.onnx"
    assert main(["optimize", str(path), "-o", str(out), "--target", "onnxruntime", "--input-shape",
                 "input_ids=batch,sequence=128"]) == 0
    capsys.readouterr()
    assert [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in onnx.load(out).graph.input] \
        == [["batch", "sequence"], ["batch", "sequence"]]
    assert main(["optimize", str(path), "-o", str(out), "--input-shape", "input_ids=2,7"]) == 0
    capsys.readouterr()
    assert [i.type.tensor_type.shape.dim[1].dim_value for i in onnx.load(out).graph.input] == [7, 7]
    assert main(["optimize", str(path), "--input-shape", "input_ids=batch,2.5"]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: input 'input_ids': dimension 1: '2.5' is neither a number nor a symbol name (a letter or _, "
        "then letters, digits, _), optionally with '=hint'\n")


def test_cli_max_dim_and_json_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(DYNAMIC_MODELS["gpt2", "torchscript"](), tmp_path / "m.onnx")
    assert main(["optimize", str(path), "--max-dim", "sequence=64"]) == 2
    assert "cannot decide whether sequence passes the axis of size 32" in capsys.readouterr().err
    assert main(["optimize", str(path), "--max-dim", "sequence=16"]) == 0
    assert "assumes: sequence <= 32 (Slice node '/Slice_20': the given max_dims)" in capsys.readouterr().out
    assert main(["optimize", str(path), "--max-dim", "sequence=x"]) == 2  # argparse: SYMBOL=N
    graph = tmp_path / "g.json"
    assert main(["example", "mlp", "-o", str(graph)]) == 0
    capsys.readouterr()
    assert main(["optimize", str(graph), "--input-shape", "x=-1"]) == 2
    assert capsys.readouterr().err == (f"error: --input-shape applies to ONNX models only, and {graph} is a graph JSON "
                                       "(its dims are as the file gives them)\n")


# --- provenance: the ONNX rules without being asked; the README's example against the CLI ------------------------


def test_optimize_of_an_imported_graph_uses_the_onnx_rules_by_default() -> None:
    """sdpa attention needs rules/onnx (the IsNaN guard): optimize() without rules fuses it as onnx_rules() does
    (on its separate projections, MultiHeadAttention zeroing NaN rows)."""
    g = import_model(MODELS["sdpa"]())
    assert g.meta["source"] == "onnx"
    default, explicit = optimize(g, target="onnxruntime"), optimize(g, target="onnxruntime", rules=onnx_rules())
    assert default.op_counts() == explicit.op_counts() and default.op_counts()["MultiHeadAttention"] == 1
    shipped = optimize(g, target="onnxruntime", rules=[])  # the caller's rules win: here none
    assert (shipped.op_counts()["MultiHeadAttention"], shipped.op_counts()["Softmax"]) == (0, 1)


def readme_onnx_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## ONNX"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_python_onnx_example_fuses_as_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    write(DYNAMIC_MODELS["gpt2", "dynamo"](), tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    exec(readme_onnx_example(), {})
    # the command line that prices the symbols as the Python example does (sequence at 128): the fusions the cost
    # model takes depend on that size
    cli = re.search(r"```sh\n(rlx-egraph optimize model\.onnx .*?--input-shape input_ids=batch,sequence=128)\n```",
                    (ROOT / "README.md").read_text()).group(1)
    args = cli.split()[1:]
    args[args.index("-o") + 1] = "cli.onnx"
    assert main(args) == 0
    capsys.readouterr()
    python, command_line = (Counter(n.op_type for n in onnx.load(tmp_path / f).graph.node)
                            for f in ("model.opt.onnx", "cli.onnx"))
    # attention fused either way; whether a projection's MatMul + Add is one Gemm at sequence 128 is the
    # calibration's call (measured within a few percent of each other there)
    original = onnx.load(tmp_path / "model.onnx").graph.node
    assert python == command_line and python["Attention"] == 1 and python["Softmax"] == 0
    assert sum(python.values()) < len(original)


# --- the missing extra ------------------------------------------------------------------------------------------------


def test_without_the_onnx_extra_the_cli_says_what_to_install(tmp_path: Path) -> None:
    path = write(MODELS["gpt2"](), tmp_path / "m.onnx")
    code = ("import sys; sys.modules['onnx'] = None\n"  # as if onnx were not installed
            "from rlx_egraph.cli.main import main\n"
            f"sys.exit(main(['optimize', {str(path)!r}]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert (run.returncode, run.stdout, run.stderr) == (
        2, "", "error: ONNX support needs the onnx extra: pip install 'rlx-egraph[onnx]'\n")
    run = subprocess.run([sys.executable, "-c", "import sys; sys.modules['onnx'] = None\nimport rlx_egraph.onnx"],
                         capture_output=True, text=True)
    assert run.stderr.strip().splitlines()[-1] == ("rlx_egraph.onnx.MissingExtra: ONNX support needs the onnx extra: "
                                                   "pip install 'rlx-egraph[onnx]'")


# --- external data ------------------------------------------------------------------------------------------------


def test_export_writes_weights_beside_the_model_and_import_reads_them(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    model = DYNAMIC_MODELS["llama", "dynamo"]()
    opt = optimize(import_model(model), target="onnxruntime")
    path = tmp_path / "out" / "m.onnx"
    path.parent.mkdir()
    export_model(opt, path, external_data=True)
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.onnx", "m.onnx.data"]
    stored = onnx.load(path, load_external_data=False).graph.initializer
    assert any(t.data_location == TensorProto.EXTERNAL for t in stored)
    inputs = dynamic_feeds(model, {"batch": 2, "sequence": 6})
    loaded = onnx.load(path)
    assert_close(run_ort(loaded, inputs)[0], run_ort(model, inputs)[0])
    original = tmp_path / "in" / "model.onnx"  # an export with its weights beside it: read from its folder
    original.parent.mkdir()
    saved = onnx.ModelProto()
    saved.CopyFrom(model)  # onnx.save moves the weights of the proto it saves out
    onnx.save(saved, original, save_as_external_data=True, location="weights.bin", size_threshold=0)
    again = import_model(original)
    assert sorted(again.weights) == sorted(import_model(model).weights)
    assert_close(run_ort(export_model(optimize(again, target="onnxruntime")), inputs)[0], run_ort(model, inputs)[0])
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 1000)  # automatic above the threshold (1 GB)
    auto = tmp_path / "auto.onnx"
    export_model(opt, auto)
    assert (tmp_path / "auto.onnx.data").exists()
    with pytest.raises(Exception, match=r"export_model\(external_data=True\) needs the path"):
        export_model(opt, external_data=True)


def external_model(location: str) -> onnx.ModelProto:
    m = OnnxBuilder(17)
    x = m.input("x", F, [2, 4])
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    w.data_location = TensorProto.EXTERNAL
    del w.external_data[:]
    w.raw_data = b""
    entry = w.external_data.add()
    entry.key, entry.value = "location", location
    m.initializers.append(w)
    return m.model({"y": m.op("MatMul", [x, "w"])})


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "link.bin", ""])
def test_external_data_outside_the_models_folder_is_refused(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(np.ones(16, np.float32).tobytes())
    (folder / "link.bin").symlink_to(tmp_path / "outside.bin")
    path = folder / "m.onnx"
    path.write_bytes(external_model(location).SerializeToString())  # onnx.save refuses to write such a model
    with pytest.raises(OnnxImportError) as err:
        import_model(path)
    assert str(err.value) == (f"initializer 'w': external data location {location!r} is not a file in the model's "
                              "folder (only files beside the model are read)")
    with pytest.raises(OnnxImportError, match=r"^initializer 'w' keeps its data in an external file: import the "
                                              r"model from its path"):
        import_model(external_model("w.bin"))


# --- node names ------------------------------------------------------------------------------------------------------


def test_onnx_node_names_are_kept_and_name_reports_and_exported_fused_nodes() -> None:
    model = DYNAMIC_MODELS["llama", "dynamo"]()
    g = import_model(model)
    matmul = next(n for n in g.nodes if n.op == "MatMul")
    assert g.describe(matmul.id) == f"{g.source_names(matmul.id)[0]!r} (MatMul)"
    assert {name for name in g.meta["node_names"].values()} <= {n.name for n in model.graph.node}
    out, report = optimize_with_report(g, target="onnxruntime")
    (attention,) = [n for n in out.nodes if n.op == "CausalAttention"]
    names = out.source_names(attention.id)
    softmax = next(n.name for n in model.graph.node if n.op_type == "Softmax")
    assert softmax in names and len(names) > 10  # what it replaced
    rows = {r["node"]: r for r in report.data.provenance}
    assert rows[attention.id]["names"] == list(names)
    exported = export_model(out)
    (onnx_attention,) = [n for n in exported.graph.node if n.op_type == "Attention"]
    assert onnx_attention.name.startswith("/CausalAttention[") and ", +" in onnx_attention.name
    kept = {n.name for n in exported.graph.node} & {n.name for n in model.graph.node}
    assert kept  # unfused nodes keep their ONNX names
    assert report.fusion.missed and all(str(m).count("'/") >= 1 for m in report.fusion.missed)  # misses name them
    # the parity headline names its closest call by the ONNX nodes that node computes
    m = OnnxBuilder(17)
    fc = m.linear(m.input("x", F, ["batch", 16]), "fc", 16, 16)  # gelu_new: the tanh GELU, as GPT-2 writes it
    inner = m.op("Add", [fc, m.op("Mul", [m.op("Pow", [fc, m.const(3.0)]), m.const(0.044715)])])
    t = m.op("Tanh", [m.op("Mul", [inner, m.const(math.sqrt(2.0 / math.pi))])])
    gelu = m.op("Mul", [m.op("Mul", [fc, m.const(0.5)]), m.op("Add", [t, m.const(1.0)])])
    g = import_model(m.model({"y": gelu}))
    out, report = optimize_with_report(g, target="cpu", verify=True)
    worst = report.parity.worst
    assert worst.tolerance_ratio > 0 and out.describe(worst.node) == "'/MatMul_0' + 9 more (FusedMatMulBiasAct)"
    assert report.verification_lines()[-1].endswith("of tolerance ('/MatMul_0' + 9 more (FusedMatMulBiasAct))")
    # and a parity failure names both nodes so (a wrong rule alone: x * 0.5 -> x)
    wrong = RuleSet.from_strings('(rewrite (Mul ?x (Scalar 0.5 ?dt)) ?x :ruleset simplify :name "half-dropped")')
    with pytest.raises(ParityError, match=r"^parity failure: '/Add_1' \+ 1 more \(Add\) differs from original "
                                          r"'/Mul_11' \(Mul\) on seed 0"):
        optimize_with_report(g, rules=wrong, target="cpu", verify=True)


# --- zero-size tensors, local functions, If branches -----------------------------------------------------------


@pytest.mark.parametrize("shapes", [None, {"x": (2, 5, 8)}])
def test_an_empty_slice_absorbed_by_concat_imports_and_exports(shapes: dict | None) -> None:
    """Partial rotary with the rotary dim equal to the head dim: x[..., 8:] is empty, concatenated back."""
    m = OnnxBuilder(17)
    x = m.input("x", F, ["batch", "sequence", 8])
    rot = m.op("Slice", [x, m.ints(0), m.ints(8), m.ints(2)])
    rest = m.op("Slice", [x, m.ints(8), m.ints(2**62), m.ints(2)])
    model = m.model({"y": m.op("Concat", [m.op("Neg", [rot]), rest], axis=-1)})
    g = import_model(model, shapes)
    exported = export_model(optimize(g, target="onnxruntime"))
    xv = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(specialize(g, {"batch": 2, "sequence": 5}) if g.symbols else g,
                                           {"x": xv})[0], -xv)
    np.testing.assert_array_equal(run_ort(exported, {"x": xv})[0], run_ort(model, {"x": xv})[0])


def test_a_zero_size_value_evaluates_optimizes_and_exports() -> None:
    """A slice that is empty at every binding flows to an output: a size-0 tensor through MIR and onnxruntime."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [3, 4])
    model = m.model({"y": m.op("Relu", [m.op("Slice", [x, m.ints(2), m.ints(2), m.ints(1)])])})
    g = import_model(model)
    assert g.node(g.outputs[0]).shape == (3, 0)
    xv = np.ones((3, 4), np.float32)
    assert evaluate(g, {"x": xv})[0].shape == (3, 0)
    assert run_ort(export_model(optimize(g, target="onnxruntime")), {"x": xv})[0].shape == (3, 0)


def test_a_model_with_local_functions_is_inlined() -> None:
    body = [helper.make_node("Mul", ["a", "a"], ["sq"]), helper.make_node("Add", ["sq", "a"], ["out"])]
    function = helper.make_function("local", "SquarePlus", ["a"], ["out"], body, [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("SquarePlus", ["x"], ["y"], domain="local", name="f")], "g",
                              [helper.make_tensor_value_info("x", F, ["n"])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 17),
                                                                            helper.make_opsetid("local", 1)])
    g = import_model(model)
    assert g.op_counts()["Mul"] == 1 and g.op_counts()["Add"] == 1
    xv = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(evaluate(specialize(g, {"n": 5}), {"x": xv})[0], xv * xv + xv)


def test_an_if_whose_branches_read_the_enclosing_graph_is_one_opaque_node() -> None:
    then = helper.make_graph([helper.make_node("Add", ["x", "shift"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["total", "zero"], ["cond"], name="gt"),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other, name="branch")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3])],
                              [helper.make_tensor_value_info("y", F, [3])],
                              [numpy_helper.from_array(np.float32(0), "zero"),
                               numpy_helper.from_array(np.full(3, 2, np.float32), "shift")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    g = import_model(model)
    (branch,) = [n for n in g.nodes if n.op == "OnnxOp"]
    assert branch.attrs["op_type"] == "If" and len(branch.inputs) == 3  # cond, then the values the branches read
    exported = export_model(optimize(g, target="onnxruntime"))
    for xv in (np.array([1, 2, 3], np.float32), np.array([-1, -2, 0], np.float32)):
        want = run_ort(model, {"x": xv})[0]
        np.testing.assert_array_equal(evaluate(g, {"x": xv})[0], want)
        np.testing.assert_array_equal(run_ort(exported, {"x": xv})[0], want)


# --- malformed models ---------------------------------------------------------------------------------------------


def test_malformed_models_are_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(OnnxImportError, match=r"empty\.onnx: not an ONNX model: the file is empty$"):
        import_model(empty)
    model = MODELS["gpt2"]()
    del model.opset_import[:]
    with pytest.raises(OnnxImportError, match=r"^the model: not an ONNX model: it imports no opset of the default "
                                              r"domain \(ai\.onnx\), so its ops have no meaning$"):
        import_model(model)
    bad = MODELS["gpt2"]()
    bad.graph.initializer[0].dims[0] += 1
    with pytest.raises(OnnxImportError) as err:
        import_model(bad)
    assert str(err.value).startswith(f"initializer {bad.graph.initializer[0].name!r} (dims "
                                     f"{list(bad.graph.initializer[0].dims)}): its data does not match its dims")
    twice = MODELS["gpt2"]()
    twice.graph.node[3].output[0] = twice.graph.node[2].output[0]
    with pytest.raises(OnnxImportError) as err:
        import_model(twice)
    first, second = twice.graph.node[2], twice.graph.node[3]
    assert str(err.value) == (f"{second.op_type} node {second.name!r} writes {first.output[0]!r}, which "
                              f"{first.op_type} node {first.name!r} already defines (a value has one producer)")


def test_importing_reads_nothing_but_the_model_and_writes_nothing(tmp_path: Path) -> None:
    path = write(MODELS["llama"](), tmp_path / "m.onnx")
    before = sorted(os.listdir(tmp_path))
    import_model(path)
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("op", ["Pad", "Tile"])
def test_shapes_from_constant_initializers_are_computed_from_them(op: str) -> None:
    """An edge Pad whose pads, a Tile whose repeats, are initializers: onnx's shape inference reads them as constants of
    the opaque node, so the output's (symbolic) shape is known; the model runs at any batch."""
    m = OnnxBuilder(17)
    x = m.input("x", F, ["batch", 3])
    amounts = m.init("amounts", np.array([0, 1, 0, 2] if op == "Pad" else [2, 1], np.int64))
    model = m.model({"y": m.op(op, [x, amounts], **({"mode": "edge"} if op == "Pad" else {}))})  # MIR pads constants
    g = import_model(model)
    (node,) = [n for n in g.nodes if n.op == "OnnxOp"]
    assert [str(d) for d in node.shape] == (["batch", "6"] if op == "Pad" else ["2*batch", "3"])
    exported = export_model(optimize(g, target="onnxruntime"))
    for batch in (1, 4):
        xv = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3)
        np.testing.assert_array_equal(run_ort(exported, {"x": xv})[0], run_ort(model, {"x": xv})[0])


def test_folding_is_bounded_by_elements_and_by_time() -> None:
    m = OnnxBuilder(17)
    x = m.input("x", F, [4, 4])
    model = m.model({"y": m.op("Add", [x, m.op("ConstantOfShape", [m.ints(4, 4)], value=numpy_helper.from_array(
        np.array([1.5], np.float32)))])})
    assert import_model(model).op_counts()["Scalar"] == 1
    with pytest.raises(OnnxImportError) as err:
        import_model(model, fold_limits=FoldLimits(max_elements=10))
    assert str(err.value) == ("ConstantOfShape node '/ConstantOfShape_1': folding it would make 16 elements, more than "
                              "the import's limit of 10 (import_model(..., fold_limits=FoldLimits(max_elements=...)))")
    with pytest.raises(OnnxImportError, match=r"^ConstantOfShape node '/ConstantOfShape_1': folding the model's "
                                              r"constants has taken 0 s, more than the import's limit of 0 s"):
        import_model(model, fold_limits=FoldLimits(max_seconds=0.0))


def test_an_if_on_a_known_condition_is_its_taken_branch() -> None:
    """An If whose condition folds (a shape test, as TorchScript writes `if x.size(1) > 2:`) is replaced by the branch
    it takes: no opaque If, and the values are the original's at every batch."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"], name="double")], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="negate")], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=1, end=2, name="width"),
             helper.make_node("Greater", ["shape", "limit"], ["wide"], name="test"),
             helper.make_node("Squeeze", ["wide"], ["cond"], name="scalar"),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other, name="branch")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["batch", 3])],
                              [helper.make_tensor_value_info("y", F, ["batch", 3])],
                              [numpy_helper.from_array(np.array([2], np.int64), "limit"),
                               numpy_helper.from_array(np.float32(2), "two")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    g = import_model(model)
    assert "OnnxOp" not in g.op_counts() and g.op_counts()["Mul"] == 1
    assert g.source_names(next(n.id for n in g.nodes if n.op == "Mul")) == ("double",)
    exported = export_model(optimize(g, target="onnxruntime"))
    for batch in (1, 4):
        xv = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3)
        np.testing.assert_array_equal(run_ort(exported, {"x": xv})[0], run_ort(model, {"x": xv})[0])
