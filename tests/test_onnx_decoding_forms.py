"""Forms of dynamic decoding and speech exports, each in a model built with onnx.helper as the exporter writes it:
imported without bindings, optimized, exported with symbolic dims and run in onnxruntime at two shapes with the
original's values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from onnx_models import F, OnnxBuilder, dynamic_feeds
from rlx_egraph import Graph, optimize
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


def sliding_window_model() -> onnx.ModelProto:
    """Mistral's sliding window (6 keys) in a decoding step as both exporters write it: the cache cut to its last 6
    entries before the new key joins it (``past[:, :, -6:]``), and the window's first position ``max(past - 6, 0)``
    starting the key positions added to the scores; no table of that length."""
    m = OnnxBuilder(18)
    x = m.input("hidden_states", F, ["batch", 2, 1, 4])
    past = m.input("past_key", F, ["batch", 2, "past_sequence", 4])
    keys = m.op("Concat", [m.op("Slice", [past, m.ints(-6), m.ints(2**63 - 1), m.ints(2), m.ints(1)]), x], axis=2)
    scores = m.op("MatMul", [x, m.op("Transpose", [keys], perm=[0, 1, 3, 2])])
    (cached,) = m.dims(past, 2)
    first = m.op("Max", [m.op("Add", [cached, m.const(-6, np.int64)]), m.const(0, np.int64)])
    positions = m.op("Range", [first, m.op("Add", [cached, m.const(1, np.int64)]), m.const(1, np.int64)])
    biased = m.op("Add", [scores, m.op("Mul", [m.op("Cast", [positions], to=F), m.const(0.1)])])
    return m.model({"probs": m.op("Softmax", [biased], axis=-1), "present": keys})


def test_a_sliding_window_is_assumed_to_hold_the_whole_cache() -> None:
    """Both cuts by the window are decided as the cache fits in it (past_sequence <= 5, one assumption naming the
    window), so the step imports with past_sequence symbolic and runs at every length up to it; past it, where the
    original drops its oldest keys, the exported step fails at run time at the check named by the assumption."""
    model = sliding_window_model()
    g = import_model(model)
    assert [fact.split(" (")[0] for fact in g.meta["assumptions"]] == ["past_sequence <= 5"]
    assert "the model's window" in g.meta["assumptions"][0]
    assert g.meta["guarded_limits"] == {"past_sequence": 5}
    exported = export_model(optimize(g, target="onnxruntime", dim_hints={"batch": 2, "past_sequence": 4}))
    assert dims(exported.graph.output[1]) == ["batch", 2, "past_sequence+1", 4]
    parity(model, exported, [{"batch": 1, "past_sequence": 2}, {"batch": 3, "past_sequence": 5}])
    with pytest.raises(Exception, match=r"Reshape node\. Name:'assumes past_sequence <= 5'"):
        run_ort(exported, dynamic_feeds(model, {"batch": 1, "past_sequence": 6}))


def strided_conv_model() -> onnx.ModelProto:
    """Wav2Vec2's feature extractor in small: two strided convolutions over [batch, samples] (kernel 4 stride 2, then
    kernel 3 stride 2), and the output length as dynamo writes it from the input's, ``samples // 4 - 1`` (an integer
    Div), as a Reshape target."""
    m = OnnxBuilder(18)
    x = m.op("Unsqueeze", [m.input("input_values", F, ["batch", "samples"]), m.ints(1)])
    h = m.op("Conv", [x, m.weight("conv0", 2, 1, 4)], kernel_shape=[4], strides=[2])
    h = m.op("Conv", [h, m.weight("conv1", 2, 2, 3)], kernel_shape=[3], strides=[2])
    batch, samples = m.dims("input_values", 0, 1)
    frames = m.op("Sub", [m.op("Div", [samples, m.ints(4)]), m.ints(1)])
    flat = m.op("Reshape", [h, m.op("Concat", [batch, m.ints(2), frames], axis=0)])
    return m.model({"features": m.op("Transpose", [flat], perm=[0, 2, 1])})


def test_strided_convolutions_give_lengths_over_a_floor_of_the_input() -> None:
    """Each convolution's length is a floor of the input's (floor(samples / 2) - 1, then floor(samples / 4) - 1: the
    floors of floors meet), the same dim as dynamo's ``samples // 4 - 1``; exported, it is computed by an integer
    Div of the input's shape."""
    model = strided_conv_model()
    g = import_model(model)
    assert g.symbols == ("batch", "samples")
    assert [str(d) for d in g.node(g.outputs[0]).shape] == ["batch", "samples_div4-1", "2"]
    assert g.meta["assumptions"] == ["samples_div2 = floor((samples) / 2) >= 2 (the lengths it gives are not empty)",
                                     "samples_div4 = floor((samples) / 4) >= 2 (the lengths it gives are not empty)"]
    exported = export_model(optimize(g, target="onnxruntime", dim_hints={"batch": 2, "samples": 64}))
    assert dims(exported.graph.output[0]) == ["batch", "samples_div4-1", 2]
    parity(model, exported, [{"batch": 1, "samples": 17}, {"batch": 3, "samples": 42}])


def wide_conv_model() -> onnx.ModelProto:
    """One convolution of kernel 10, stride 2 over [batch, samples]: its length floor(samples / 2) - 4 is not empty
    for floor(samples / 2) >= 5, a stronger fact on the floor atom the strided model's first convolution makes."""
    m = OnnxBuilder(18)
    x = m.op("Unsqueeze", [m.input("input_values", F, ["batch", "samples"]), m.ints(1)])
    return m.model({"features": m.op("Conv", [x, m.weight("conv0", 2, 1, 10)], kernel_shape=[10], strides=[2])})


@pytest.mark.parametrize("first", ["strided", "wide"])
def test_the_facts_an_import_states_on_its_dims_stay_in_its_graph(first: str) -> None:
    """A graph's least values of its floor atoms are its own: imported in one process in either order, after the
    other or alone, each model gives the same graph and assumptions."""
    models = {"strided": strided_conv_model(), "wide": wide_conv_model()}

    def summary(g: Graph) -> tuple:
        return [(n.op, tuple(map(str, n.shape))) for n in g.nodes], g.meta["assumptions"], g.dim_context.minima

    alone = {name: summary(import_model(model)) for name, model in models.items()}
    in_turn = {name: summary(import_model(models[name])) for name in (first, *(set(models) - {first}))}
    assert in_turn == alone
    assert alone["strided"][1][0] == "samples_div2 = floor((samples) / 2) >= 2 (the lengths it gives are not empty)"
    assert alone["wide"][1] == ["samples_div2 = floor((samples) / 2) >= 5 (the lengths it gives are not empty)"]


def dynamic_decode_step() -> onnx.ModelProto:
    """A Llama decoding step with dynamic axes (sdpa's grouped-query form, 4 query heads over 2 cached ones, head
    width 16): RoPE tables computed at run time from the past length (Cos and Sin of Concat(freqs, freqs), freqs
    the position ``Range(past, past + 1)`` times the inverse frequencies), the mask's additive bias."""
    m = OnnxBuilder(18)
    hidden, heads, kv_heads, hd = 64, 4, 2, 16
    x = m.input("hidden_states", F, ["batch", 1, hidden])
    mask = m.input("attention_mask", TensorProto.INT64, ["batch", "past_sequence+1"])
    past_k = m.input("past_key_values.0.key", F, ["batch", kv_heads, "past_sequence", hd])
    past_v = m.input("past_key_values.0.value", F, ["batch", kv_heads, "past_sequence", hd])
    cached = m.op("Gather", [m.op("Shape", [past_k]), m.const(2, np.int64)], axis=0)
    position = m.op("Range", [cached, m.op("Add", [cached, m.const(1, np.int64)]), m.const(1, np.int64)])
    inverse = m.init("inv_freq", (10000.0 ** -(np.arange(0, hd, 2) / hd)).astype(np.float32))
    freqs = m.op("Mul", [m.op("Reshape", [m.op("Cast", [position], to=F), m.ints(1, 1, 1, 1)]), inverse])
    emb = m.op("Concat", [freqs, freqs], axis=-1)
    cos, sin = m.op("Cos", [emb]), m.op("Sin", [emb])

    def heads_of(t: str, n: int) -> str:
        return m.op("Transpose", [m.op("Reshape", [t, m.ints(0, 1, n, hd)])], perm=[0, 2, 1, 3])

    def rotary(t: str) -> str:
        first = m.op("Slice", [t, m.ints(0), m.ints(hd // 2), m.ints(3)])
        second = m.op("Slice", [t, m.ints(hd // 2), m.ints(2**62), m.ints(3)])
        rotated = m.op("Concat", [m.op("Neg", [second]), first], axis=-1)
        return m.op("Add", [m.op("Mul", [t, cos]), m.op("Mul", [rotated, sin])])

    dropped = m.op("Sub", [m.const(1.0), m.op("Cast", [mask], to=F)])
    additive = m.op("Mul", [m.op("Unsqueeze", [dropped, m.ints(1, 2)]), m.const(float(np.finfo(np.float32).min))])
    q = rotary(heads_of(m.linear(x, "q_proj", hidden, heads * hd), heads))
    k = rotary(heads_of(m.linear(x, "k_proj", hidden, kv_heads * hd), kv_heads))
    v = heads_of(m.linear(x, "v_proj", hidden, kv_heads * hd), kv_heads)
    present_k = m.op("Concat", [past_k, k], axis=2)
    present_v = m.op("Concat", [past_v, v], axis=2)
    q = m.op("Reshape", [q, m.ints(0, kv_heads, heads // kv_heads, hd)])
    scores = m.op("Mul", [m.op("MatMul", [q, m.op("Transpose", [present_k], perm=[0, 1, 3, 2])]), m.const(hd**-0.5)])
    probs = m.op("Softmax", [m.op("Add", [scores, additive])], axis=-1)
    ctx = m.op("Reshape", [m.op("MatMul", [probs, present_v]), m.ints(0, heads, 1, hd)])
    merged = m.op("Reshape", [m.op("Transpose", [ctx], perm=[0, 2, 1, 3]), m.ints(0, 1, hidden)])
    return m.model({"output": m.linear(merged, "o_proj", hidden, hidden), "present.0.key": present_k,
                    "present.0.value": present_v})


def test_a_dynamic_decoding_step_exports_group_query_attention() -> None:
    """With the past length symbolic, the step is still one com.microsoft GroupQueryAttention rotating q and k
    itself: seqlens_k, total_sequence_length and the rotary caches ([past + 1, 8], the table's first half) are
    computed at run time."""
    model = dynamic_decode_step()
    g = optimize(import_model(model), target="onnxruntime", dim_hints={"batch": 2, "past_sequence": 16})
    assert g.op_counts()["GroupQueryAttention"] == 1
    exported = export_model(g)
    (gqa,) = [n for n in exported.graph.node if n.op_type == "GroupQueryAttention"]
    assert {a.name: a.i for a in gqa.attribute if a.name in ("do_rotary", "num_heads", "kv_num_heads")} == {
        "do_rotary": 1, "num_heads": 4, "kv_num_heads": 2}
    assert not {"Attention", "RotaryEmbedding", "Softmax"} & {n.op_type for n in exported.graph.node}
    parity(model, exported, [{"batch": 1, "past_sequence": 3, "past_sequence+1": 4},
                             {"batch": 3, "past_sequence": 9, "past_sequence+1": 10}])


def masked_decode_step(form: str) -> onnx.ModelProto:
    """A decoding step (4 heads of 16) whose scores are masked as GPT-Neo's local attention writes it, ``Where(keep,
    scores, min)`` with ``keep`` a [1, 1, 8, 8] window buffer (3 keys) cut to the query's row and the keys' columns
    (``form`` "local"), or as MPT writes its ALiBi step, the scores plus an [H, 1, 8] table cut to its last keys,
    then masked_fill's ``Where(drop, min, scores)`` with the padding mask (``form`` "alibi").  The local window is
    followed by the padding mask's additive bias."""
    m = OnnxBuilder(18)
    hidden, heads, hd = 64, 4, 16
    lowest = float(np.finfo(np.float32).min)
    x = m.input("hidden_states", F, ["batch", 1, hidden])
    mask = m.input("attention_mask", TensorProto.INT64, ["batch", "past_sequence+1"])
    past_k = m.input("past_key_values.0.key", F, ["batch", heads, "past_sequence", hd])
    past_v = m.input("past_key_values.0.value", F, ["batch", heads, "past_sequence", hd])

    def heads_of(t: str) -> str:
        return m.op("Transpose", [m.op("Reshape", [t, m.ints(0, 1, heads, hd)])], perm=[0, 2, 1, 3])

    q, k, v = (heads_of(m.linear(x, name, hidden, hidden)) for name in ("q_proj", "k_proj", "v_proj"))
    keys, values = m.op("Concat", [past_k, k], axis=2), m.op("Concat", [past_v, v], axis=2)
    scores = m.op("Mul", [m.op("MatMul", [q, m.op("Transpose", [keys], perm=[0, 1, 3, 2])]), m.const(hd**-0.5)])
    (total,) = m.dims(keys, 2)
    if form == "local":
        window = np.tril(np.ones((8, 8), bool)) & ~np.tril(np.ones((8, 8), bool), -3)
        buffer = m.op("Constant", [], value=onnx.numpy_helper.from_array(window[None, None]))
        rows = m.op("Slice", [buffer, m.op("Sub", [total, m.ints(1)]), total, m.ints(2), m.ints(1)])
        keep = m.op("Slice", [rows, m.ints(0), total, m.ints(3), m.ints(1)])
        scores = m.op("Where", [keep, scores, m.const(lowest)])
        padding = m.op("Mul", [m.op("Sub", [m.const(1.0), m.op("Cast", [mask], to=F)]), m.const(lowest)])
        scores = m.op("Add", [scores, m.op("Unsqueeze", [padding, m.ints(1, 2)])])
    else:
        slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)[:, None, None]
        table = m.init("alibi", slopes * np.arange(-7, 1, dtype=np.float32)[None, None, :])
        bias = m.op("Slice", [table, m.op("Neg", [total]), m.ints(2**63 - 1), m.ints(2), m.ints(1)])
        drop = m.op("Equal", [m.op("Unsqueeze", [mask, m.ints(1, 2)]), m.const(0, np.int64)])
        scores = m.op("Where", [drop, m.const(lowest), m.op("Add", [scores, bias])])
    ctx = m.op("MatMul", [m.op("Softmax", [scores], axis=-1), values])
    merged = m.op("Reshape", [m.op("Transpose", [ctx], perm=[0, 2, 1, 3]), m.ints(0, 1, hidden)])
    return m.model({"output": m.linear(merged, "o_proj", hidden, hidden), "present.0.key": keys,
                    "present.0.value": values})


@pytest.mark.parametrize("form", ["local", "alibi"])
def test_a_masked_fill_beside_an_additive_mask_is_one_attention_bias(form: str) -> None:
    """The Where that masks the scores with the lowest float is the scores plus its additive mask, so the step's
    attention takes both masks (and the ALiBi table, of rank 3) as one bias: one GroupQueryAttention, no Softmax."""
    model = masked_decode_step(form)
    g = optimize(import_model(model), target="onnxruntime", dim_hints={"batch": 2, "past_sequence": 5})
    assert g.op_counts()["GroupQueryAttention"] == 1 and "Softmax" not in g.op_counts()
    exported = export_model(g)
    assert "Softmax" not in {n.op_type for n in exported.graph.node}
    parity(model, exported, [{"batch": 1, "past_sequence": 2, "past_sequence+1": 3},
                             {"batch": 3, "past_sequence": 6, "past_sequence+1": 7}])
