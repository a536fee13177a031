"""The verifier's leaf values: integer inputs drawn as the graph uses them (masks recognised by use, indices
within the table they index), reference inputs from the user, and a clear error where it cannot draw safely."""

import numpy as np
import pytest
from onnx import TensorProto

from onnx_models import F, OnnxBuilder
from rlx_egraph import Graph
from rlx_egraph.cli.main import main
from rlx_egraph.kernels import parity
from rlx_egraph.kernels.parity import ParityError, ParityInputError
from rlx_egraph.onnx import import_model
from rlx_egraph.optimize import optimize_with_report


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


def test_a_graph_too_large_to_check_is_a_clear_error_before_it_runs(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(parity, "VERIFY_MAX_ELEMENTS", 100)
    g = Graph()
    g.set_outputs([g.relu(g.input("x", (8, 16)))])
    with pytest.raises(ParityInputError, match=r"parity check: the input graph's values hold 256 elements, more than "
                                               r"the 100 the check holds \(VERIFY_MAX_ELEMENTS\)"):
        optimize_with_report(g, verify=True)
    g.save(tmp_path / "g.json")
    assert main(["optimize", str(tmp_path / "g.json"), "--verify"]) == 2  # no wrong rule: bad input
    assert capsys.readouterr().err.startswith("error: parity check: the input graph's values hold 256 elements")
