"""Layout forms around matmuls and attention, each in a model built with onnx.helper as an exporter writes it:
optimized for onnxruntime, exported, and run in onnxruntime with the original's values."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto

from onnx_models import F, OnnxBuilder, feeds
from rlx_egraph import optimize
from rlx_egraph.onnx import export_model, import_model
from test_onnx_import import run_ort

B, S, HIDDEN, HEADS = 2, 5, 16, 2


def rows_attention_model() -> onnx.ModelProto:
    """Self-attention whose every linear layer runs on flattened rows, as TorchScript and GPT-2's Conv1D write it
    (Reshape [B*S, E], Gemm(transB=1) with a bias, Reshape back); heads split by Reshape + Transpose, a key mask
    made additive by Where with -inf and Where(IsNaN(p), 0, p) after the Softmax (sdpa); the context's heads
    merged and its rows flattened in one Reshape [B*S, E] before the output projection; a residual."""
    m = OnnxBuilder(17)
    x = m.input("hidden_states", F, [B, S, HIDDEN])
    mask = m.input("attention_mask", TensorProto.BOOL, [B, S])
    hd = HIDDEN // HEADS

    def gemm_rows(t: str, name: str) -> str:
        y = m.op("Gemm", [t, m.weight(f"{name}.weight", HIDDEN, HIDDEN), m.weight(f"{name}.bias", HIDDEN, scale=0.1)],
                 transB=1)
        return m.op("Reshape", [y, m.ints(B, S, HIDDEN)])

    def heads(name: str) -> str:
        t = gemm_rows(m.op("Reshape", [x, m.ints(-1, HIDDEN)]), name)
        return m.op("Transpose", [m.op("Reshape", [t, m.ints(B, S, HEADS, hd)])], perm=[0, 2, 1, 3])

    q, k, v = heads("q"), heads("k"), heads("v")
    scores = m.op("Div", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(float(np.sqrt(hd)))])
    additive = m.op("Where", [m.op("Unsqueeze", [mask, m.ints(1, 2)]), m.const(0.0), m.const(-np.inf)])
    probs = m.op("Softmax", [m.op("Add", [scores, additive])], axis=-1)
    probs = m.op("Where", [m.op("IsNaN", [probs]), m.const(0.0), probs])
    ctx = m.op("Transpose", [m.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    out = gemm_rows(m.op("Reshape", [ctx, m.ints(B * S, HIDDEN)]), "o")
    return m.model({"attn_output": m.op("Add", [out, x])})


def test_attention_reads_and_writes_merged_heads_with_no_layout_node_between_gemms() -> None:
    """The heads split of q, k and v and the merge of the context fold into Attention (opset 23 on [B, S, H*D],
    q_num_heads / kv_num_heads), and the 3-D <-> 2-D reshapes around each Gemm cancel where they meet: no
    Transpose, 7 Reshapes left of 11 (x's rows once for the three projections, each projection's result
    to [B, S, E] for Attention, the context's rows, the output's [B, S, E], the mask's), one launch per op."""
    model = rows_attention_model()
    exported = export_model(optimize(import_model(model), target="onnxruntime", verify=False))
    ops = Counter(n.op_type for n in exported.graph.node)
    assert ops == Counter({"Reshape": 7, "Gemm": 4, "Attention": 1, "Where": 1, "Expand": 1, "Add": 1,
                           "Identity": 1})
    (attention,) = [n for n in exported.graph.node if n.op_type == "Attention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in attention.attribute}
    assert (attention.domain, attrs["q_num_heads"], attrs["kv_num_heads"]) == ("", HEADS, HEADS)
    inputs = feeds(model, {"hidden_states": (B, S, HIDDEN), "attention_mask": (B, S)})
    inputs["attention_mask"][1] = False  # a fully masked batch row: its context is 0 in both
    np.testing.assert_allclose(run_ort(exported, inputs)[0], run_ort(model, inputs)[0], rtol=0, atol=1e-5)
