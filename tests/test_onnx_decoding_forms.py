"""Forms of dynamic decoding and speech exports, each in a model built with onnx.helper as the exporter writes it:
imported without bindings, optimized, exported with symbolic dims and run in onnxruntime at two shapes with the
original's values."""

from __future__ import annotations

import onnx
from onnx import TensorProto

from onnx_models import F, OnnxBuilder, dynamic_feeds
from rlx_egraph import optimize
from rlx_egraph.onnx import export_model, import_model
from test_onnx_import import assert_close, run_ort


def dims(info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]


def parity(model: onnx.ModelProto, exported: onnx.ModelProto, bindings: list[dict[str, int]]) -> None:
    """Every output of ``exported`` equals the original's at each binding (symbol -> size)."""
    for binding in bindings:
        inputs = dynamic_feeds(model, binding)
        for got, want in zip(run_ort(exported, inputs), run_ort(model, inputs), strict=True):
            assert_close(got, want)


def decoding_mask_model() -> onnx.ModelProto:
    """A TorchScript decoding step: the mask is [batch, total_sequence], a dim_param of its own, added (as a bias) to
    the scores over the cached and the new keys, [batch, 2, 1, past_sequence + 1]."""
    m = OnnxBuilder(17)
    ids = m.input("input_ids", TensorProto.INT64, ["batch", 1])
    mask = m.input("attention_mask", TensorProto.INT64, ["batch", "total_sequence"])
    past = m.input("past_key_values.0.key", F, ["batch", 2, "past_sequence", 4])
    x = m.op("Gather", [m.weight("embed", 40, 8), ids])
    q = m.op("Transpose", [m.op("Reshape", [x, m.ints(0, 1, 2, 4)])], perm=[0, 2, 1, 3])
    keys = m.op("Concat", [past, q], axis=2)
    scores = m.op("MatMul", [q, m.op("Transpose", [keys], perm=[0, 1, 3, 2])])
    keep = m.op("Cast", [m.op("Unsqueeze", [mask, m.ints(1, 2)])], to=F)
    bias = m.op("Mul", [m.op("Sub", [m.const(1.0), keep]), m.const(-1e4)])
    probs = m.op("Softmax", [m.op("Add", [scores, bias])], axis=-1)
    return m.model({"context": m.op("MatMul", [probs, keys]), "present": keys})


def test_a_decoding_masks_own_length_is_the_cached_and_the_new_tokens() -> None:
    """total_sequence is taken as past_sequence + 1 (the import records it) so that the bias broadcasts against the
    scores; the export names the mask's dim by it."""
    model = decoding_mask_model()
    g = import_model(model)
    assert g.meta["assumptions"] == [
        "total_sequence = past_sequence+1 (the attention mask covers the cached and the new tokens)"]
    exported = export_model(optimize(g, target="onnxruntime", dim_hints={"batch": 2, "past_sequence": 16}))
    assert dims(exported.graph.input[1]) == ["batch", "past_sequence+1"]
    parity(model, exported, [{"batch": 1, "past_sequence": 3, "total_sequence": 4},
                             {"batch": 3, "past_sequence": 17, "total_sequence": 18}])
    props = {p.key: p.value for p in exported.metadata_props}
    assert "total_sequence = past_sequence+1" in props["rlx_egraph.assumptions"]
