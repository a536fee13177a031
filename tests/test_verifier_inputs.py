"""The verifier's leaf values: integer inputs drawn as the graph uses them (masks recognised by use, indices
within the table they index), reference inputs from the user, and a clear error where it cannot draw safely."""

import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from onnx_models import F, OnnxBuilder
from rlx_egraph import Graph
from rlx_egraph.cli.main import main
from rlx_egraph.kernels.parity import ParityError, ParityInputError
from rlx_egraph.onnx import import_model
from rlx_egraph.optimize import optimize_with_report
from rlx_egraph.rules import RuleSet


def positions_from_mask(batch: int = 2, seq: int = 6, width: int = 8):
    """A decoder's position ids as exported: Gather(pos_table, CumSum(m) * m - 1), m an int mask not named so."""
    b = OnnxBuilder(17)
    m = b.input("m", TensorProto.INT64, [batch, seq])
    x = b.input("x", F, [batch, seq, width])
    pos = b.op("Sub", [b.op("Mul", [b.op("CumSum", [m, b.const(1, np.int64)]), m]), b.const(1, np.int64)])
    emb = b.op("Gather", [b.weight("pos_table", seq, width), pos])
    return b.model({"y": b.op("Add", [x, emb])})


def test_an_integer_input_that_positions_are_counted_from_is_drawn_as_a_mask() -> None:
    g = import_model(positions_from_mask())
    assert "OnnxOp" in g.op_counts()  # the CumSum is kept as an ONNX node
    _, report = optimize_with_report(g, verify=True)
    assert report.parity.ok and report.parity.seeds == (0, 1)


def test_reference_inputs_are_used_and_checked() -> None:
    g = import_model(positions_from_mask())
    mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], np.int64)
    _, report = optimize_with_report(g, verify={"m": mask})
    assert report.parity.ok
    with pytest.raises(ParityInputError, match=r"reference input\(s\) 'mask' name no input of the graph "
                                                r"\(its inputs: 'm', 'x'\)"):
        optimize_with_report(g, verify={"mask": mask})
    with pytest.raises(ParityInputError, match=r"node 0 \(Input 'm'\): given shape \[2, 5\], expected \[2, 6\]"):
        optimize_with_report(g, verify={"m": mask[:, :5]})


def test_indices_the_verifier_cannot_draw_are_a_parity_input_error_naming_the_input() -> None:
    g = Graph()
    x = g.input("x", (4,))
    ids = g.cast(g.mul(x, g.scalar(100.0)), dtype="i64")  # float data turned into indices: any value
    g.set_outputs([g.embedding(g.param("table", (5, 3)), ids)])
    with pytest.raises(ParityInputError, match=r"node \d+ \(Embedding\): index values out of range.*from the values "
                                               r"drawn for input\(s\) 'x'; give reference inputs") as err:
        optimize_with_report(g, verify=True)
    assert isinstance(err.value, ParityError)
    _, report = optimize_with_report(g, verify={"x": np.array([0.0, 0.01, 0.02, 0.04], np.float32)})
    assert report.parity.ok


def test_reference_inputs_from_an_npz_at_the_command_line(tmp_path, capsys) -> None:
    g = import_model(positions_from_mask())
    g.save(tmp_path / "g.json")
    mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], np.int64)
    np.savez(tmp_path / "feeds.npz", m=mask)
    assert main(["optimize", str(tmp_path / "g.json"), "--verify-inputs", str(tmp_path / "feeds.npz")]) == 0
    out = capsys.readouterr().out
    assert "values checked: requested with reference inputs ('m')" in out and "parity: ok on " in out
    np.savez(tmp_path / "feeds.npz", m=mask[:, :5])
    assert main(["optimize", str(tmp_path / "g.json"), "--verify-inputs", str(tmp_path / "feeds.npz")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: reference inputs '{tmp_path / 'feeds.npz'}': array 'm' has shape [2, 5]; its Input has shape [2, 6]")
    assert main(["optimize", str(tmp_path / "g.json"), "--no-verify", "--verify-inputs",
                 str(tmp_path / "feeds.npz")]) == 2
    assert "--verify-inputs gives the data of the parity check, which --no-verify switches off" in \
        capsys.readouterr().err


def _huge_and_small() -> Graph:
    """A Relu of 2^27 f32 elements (512 MB, more than VERIFY_MAX_ELEMENTS with its input) beside a small linear
    layer the rules fuse."""
    g = Graph()
    big = g.relu(g.input("big", (1 << 14, 1 << 13)))
    x, w, b = g.input("x", (4, 8)), g.param("w", (8, 16)), g.param("b", (16,))
    g.set_outputs([big, g.relu(g.add(g.matmul(x, w), b))])
    return g


def test_a_graph_above_the_bound_is_checked_on_a_sample_without_computing_its_values() -> None:
    g = _huge_and_small()
    tracemalloc.start()
    try:
        _, report = optimize_with_report(g, verify=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # the 512 MB values are never made
    sample = report.parity.sample
    assert (sample.elements, sample.rewritten, sample.checked, sample.too_large) == ((1 << 28) + 368, 1, 1, 0)
    assert report.parity.ok and {n.op for n in report.parity.nodes} == {"FusedMatMulBiasAct", "Input", "Param"}
    assert report.verification.how == (
        "on a sample: the input graph's values hold 268,435,824 elements, more than the 67,108,864 a whole check "
        "holds; 1 of the 1 rewritten nodes checked, each against the value it replaces, run with the numpy "
        "reference kernels from seeded random values of what it reads; nodes the rules left as they were, and the "
        "end-to-end run, not checked")
    assert report.to_dict()["verification"]["how"] == report.verification.how
    assert report.to_dict()["parity"]["sample"]["checked"] == 1
    assert f"values checked: requested (verify=True); {report.verification.how}\nparity: ok on " in str(report)


def test_a_sampled_window_reads_the_copy_of_a_value_the_input_graph_reads() -> None:
    """The input graph computes exp(x) twice (as TorchScript exports repeat work); the optimized graph computes it
    once, and its fused layer's window stands that value in for the copy the input graph's layer reads."""
    g = Graph()
    big = g.relu(g.input("big", (1 << 14, 1 << 13)))
    x, w, b = g.input("x", (4, 8)), g.param("w", (8, 16)), g.param("b", (16,))
    first, second = g.exp(x), g.exp(x)
    g.set_outputs([big, g.relu(g.add(g.matmul(second, w), b)), g.neg(first)])
    optimized, report = optimize_with_report(g, verify=True)
    assert [n.op for n in optimized.nodes].count("Exp") == 1
    sample = report.parity.sample
    assert (sample.rewritten, sample.checked, sample.too_large, sample.not_runnable) == (1, 1, 0, 0)
    assert report.parity.ok and {n.op for n in report.parity.nodes} == {"FusedMatMulBiasAct", "Input", "Param"}


def test_a_sampled_check_still_catches_a_wrong_rule_and_skips_a_window_above_its_bound() -> None:
    dropped = RuleSet.shipped() + RuleSet.from_strings('(rewrite (Relu ?x) ?x :ruleset simplify :name "relu-dropped")')
    with pytest.raises(ParityError, match=r"parity failure: node \d+ \(FusedMatMulBiasAct\) differs from original "
                                          r"node \d+ \(Relu\) .*built by rule\(s\): .*relu-dropped"):
        optimize_with_report(_huge_and_small(), rules=dropped, verify=True)


def test_reference_inputs_size_an_onnx_models_symbols_at_the_command_line(tmp_path, capsys) -> None:
    """``--verify-inputs feeds.npz`` on an ONNX model with dynamic axes: the arrays' shapes give the sizes the check
    runs at and the exported model keeps its symbols; arrays that disagree on a symbol are one error line, exit 2."""
    b = OnnxBuilder(17)
    m = b.input("m", TensorProto.INT64, ["batch", "sequence"])
    x = b.input("x", F, ["batch", "sequence", 8])
    pos = b.op("Sub", [b.op("Mul", [b.op("CumSum", [m, b.const(1, np.int64)]), m]), b.const(1, np.int64)])
    onnx.save(b.model({"y": b.op("Add", [x, b.op("Gather", [b.weight("pos_table", 8, 8), pos])])}), tmp_path / "m.onnx")
    mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], np.int64)
    np.savez(tmp_path / "feeds.npz", m=mask, x=np.ones((2, 6, 8), np.float32))
    command = ["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out.onnx"), "--verify-inputs",
               str(tmp_path / "feeds.npz")]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "values checked: requested with reference inputs ('m', 'x')" in out and "parity: ok on " in out
    exported = onnx.load(tmp_path / "out.onnx")
    assert [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in exported.graph.input] == \
        [["batch", "sequence"], ["batch", "sequence", 8]]
    np.savez(tmp_path / "feeds.npz", m=mask, x=np.ones((2, 5, 8), np.float32))
    assert main(command) == 2
    assert capsys.readouterr().err.strip() == ("error: parity check: reference inputs: node 1 (Input 'x'): symbol "
                                               "'sequence' is 5 here and 6 in an input before")
