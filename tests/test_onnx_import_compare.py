"""The comparison with onnxruntime's optimizers (frontends/onnx/compare.py) on an onnx.helper-built model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_models import MODELS
from rlx_egraph.frontends.onnx.compare import compare, feeds, input_shapes, op_counts


def test_op_counts_leave_out_alias_ops_and_count_fused_ops() -> None:
    model = MODELS["gpt2"]()
    nodes, launches, fused = op_counts(model)
    ops = [n.op_type for n in model.graph.node]
    aliases = sum(ops.count(op) for op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Constant"))
    assert (nodes, launches) == (len(ops), len(ops) - aliases)
    assert fused == {"LayerNormalization": ops.count("LayerNormalization"), "Gemm": ops.count("Gemm")}


def test_onnxruntime_rms_norm_in_the_default_domain_counts_as_fused() -> None:
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1, epsilon=1e-6)
    graph = helper.make_graph([node], "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "g")])
    assert op_counts(helper.make_model(graph)) == (1, 1, {"SimplifiedLayerNormalization": 1})


def test_feeds_pad_the_last_key_of_every_batch_row_but_the_first() -> None:
    model = MODELS["bert"]()
    shapes = input_shapes(model, {"batch": 3, "sequence": 4})
    assert shapes == {"hidden_states": (3, 4, 16), "attention_mask": (3, 4)}
    inputs = feeds(model, shapes, max_id=5)
    assert inputs["hidden_states"].dtype == np.float32
    np.testing.assert_array_equal(inputs["attention_mask"], [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]])


def test_compare_tables_every_variant_and_names_a_missing_optimizer(tmp_path: Path) -> None:
    onnx.save(MODELS["bert"](), tmp_path / "bert_layer.onnx")
    text = compare(tmp_path, {"batch": 2, "sequence": 5}, runs=3, python=str(tmp_path / "no-python"))
    lines = text.splitlines()
    assert lines[0] == "Inputs: {'hidden_states': (2, 5, 16), 'attention_mask': (2, 5)}."
    counts = next(line for line in lines if line.startswith("| bert_layer.onnx |") and " / " in line).split(" | ")
    assert counts[2:5] == ["-", "-", "-"]  # no transformer optimizer
    nodes, launches, _ = op_counts(MODELS["bert"]())
    assert counts[1] == f"{nodes} / {launches}"
    latency = [line.split(" | ") for line in lines if line.startswith("| bert_layer.onnx | BASIC")]
    assert len(latency) == 1 and latency[0][3] == "-" and float(latency[0][-1].rstrip(" |")) <= 1e-4
    fused = [line for line in lines if line.startswith("| bert_layer.onnx |")][-1]
    assert fused.count(f"failed: cannot run {tmp_path / 'no-python'}: No such file or directory") == 3
    ours = fused.strip(" |").rsplit(" | ", 1)[1]
    assert "LayerNormalization" in ours, fused
