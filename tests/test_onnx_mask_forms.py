"""A [B, S] key-padding mask made a dense additive bias, as transformers' encoders export it (Cast to bool,
Unsqueeze to [B, 1, 1, S], Expand to [B, 1, S, S] or not, Where(keep, 0, finfo.min)), built with onnx.helper:
exported as com.microsoft Attention's 2-D mask_index (the mask cast to int32 once, mask_filter_value the fill)
instead of the dense bias, and run in onnxruntime with the original's values."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper

import calibrations
from onnx_models import F, OnnxBuilder, feeds
from rlx_egraph import optimize
from rlx_egraph.onnx import export_model, import_model
from test_onnx_import import run_ort

B, S, HIDDEN, HEADS = 2, 5, 16, 2
FILL = float(np.finfo(np.float32).min)


def padded_encoder(expand: bool) -> onnx.ModelProto:
    """Two self-attention layers over one padding mask: its bias [B, 1, 1, S], expanded to [B, 1, S, S] when
    ``expand`` (TorchScript) or left to broadcast (dynamo)."""
    m = OnnxBuilder(17)
    x = m.input("hidden_states", F, [B, S, HIDDEN])
    mask = m.input("attention_mask", TensorProto.INT64, [B, S])
    keep = m.op("Unsqueeze", [m.op("Cast", [mask], to=TensorProto.BOOL), m.ints(1, 2)])
    keep = m.op("Expand", [keep, m.ints(B, 1, S, S)]) if expand else keep
    bias = m.op("Where", [keep, m.const(0.0), m.const(FILL)])
    hd = HIDDEN // HEADS
    for layer in range(2):
        q, k, v = (m.split_heads(m.linear(x, f"{layer}.{n}", HIDDEN, HIDDEN), HEADS, hd) for n in "qkv")
        scores = m.op("Div", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(math.sqrt(hd))])
        probs = m.op("Softmax", [m.op("Add", [scores, bias])], axis=-1)
        x = m.linear(m.merge_heads(m.op("MatMul", [probs, v]), HIDDEN), f"{layer}.o", HIDDEN, HIDDEN)
    return m.model({"y": x})


def test_a_key_padding_bias_is_attentions_mask_index() -> None:
    """Priced by one set of figures for every op (``calibrations.UNIFORM``), where the packed Attention's one node
    wins: the form's recognition, not the shipped calibration's call at this toy size, is under test."""
    for expand in (True, False):
        model = padded_encoder(expand)
        exported = export_model(optimize(import_model(model), target=calibrations.UNIFORM, verify=False))
        ops = Counter(n.op_type for n in exported.graph.node)
        assert (ops["Attention"], ops["Where"], ops["Expand"], ops["Cast"]) == (2, 0, 0, 2), ops
        attention = [n for n in exported.graph.node if n.op_type == "Attention"]
        assert {n.input[3] for n in attention} == {n.output[0] for n in exported.graph.node if n.op_type == "Cast"
                                                   and helper.get_attribute_value(n.attribute[0]) == TensorProto.INT32}
        assert all(len(n.input) < 6 or not n.input[5] for n in attention)  # no dense bias
        assert {helper.get_attribute_value(a) for n in attention for a in n.attribute
                if a.name == "mask_filter_value"} == {FILL}
        inputs = feeds(model, {"hidden_states": (B, S, HIDDEN), "attention_mask": (B, S)})
        inputs["attention_mask"] = np.array([[1] * S, [1] * (S - 2) + [0, 0]], np.int64)
        np.testing.assert_allclose(run_ort(exported, inputs)[0], run_ort(model, inputs)[0], rtol=0, atol=1e-5)
