"""Forms of real dynamic exports that the hand-built models of test_onnx_dynamic.py do not write, each in a model
built with onnx.helper as the exporter writes it: imported without bindings, optimized, exported with its
dim_params and run in onnxruntime at several shapes with the original's values."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from onnx_models import F, OnnxBuilder, dynamic_feeds
from rlx_egraph import Graph, optimize
from rlx_egraph.onnx import OnnxImportError, export_model, import_model
from test_onnx_import import assert_close, run_ort


def dims(info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]


def ops(graph: Graph) -> Counter[str]:
    return Counter(n.attrs["op_type"] if n.op == "OnnxOp" else n.op for n in graph.nodes)


def runs_at_every_shape(model: onnx.ModelProto, bindings: list[dict[str, int]],
                        hints: dict[str, int]) -> onnx.ModelProto:
    """Import without bindings, optimize at ``hints``, export: the inputs keep their dim_params and every output
    equals the original's at each binding.  Returns the exported model."""
    exported = export_model(optimize(import_model(model), target="onnxruntime", dim_hints=hints))
    assert [dims(i) for i in exported.graph.input] == [dims(i) for i in model.graph.input]
    for binding in bindings:
        inputs = dynamic_feeds(model, binding)
        for got, want in zip(run_ort(exported, inputs), run_ort(model, inputs), strict=True):
            assert_close(got, want)
    return exported


def kv_flatten_model() -> onnx.ModelProto:
    """The dynamo exporter's decoding step: the key cache [batch, 4, past_sequence, 16] concatenated with the new
    key and reshaped to [-1, past_sequence + 1, 16] (the -1 is the numel over 16 * (past_sequence + 1))."""
    m = OnnxBuilder(18)
    past = m.input("past_key", F, ["batch", 4, "past_sequence", 16])
    new = m.input("key", F, ["batch", 4, 1, 16])
    keys = m.op("Concat", [past, new], axis=2)
    (total,) = m.dims(keys, 2)
    flat = m.op("Reshape", [keys, m.op("Concat", [m.ints(-1), total, m.ints(16)], axis=0)])
    scaled = m.op("Mul", [flat, m.weight("scale", 16)])
    return m.model({"present": m.op("Reshape", [scaled, m.op("Shape", [keys])])})


def test_a_cache_reshaped_to_minus_one_divides_its_numel_by_a_polynomial() -> None:
    model = kv_flatten_model()
    g = import_model(model)
    (flat,) = [n for n in g.nodes if n.op == "Reshape" and len(n.shape) == 3]
    assert [str(d) for d in flat.shape] == ["4*batch", "past_sequence+1", "16"]
    exported = runs_at_every_shape(model, [{"batch": 1, "past_sequence": 3}, {"batch": 3, "past_sequence": 17}],
                                   {"batch": 2, "past_sequence": 16})
    assert dims(exported.graph.output[0]) == ["batch", 4, "past_sequence+1", 16]


def local_mask_model(decode: bool) -> onnx.ModelProto:
    """GPT-Neo's local attention as TorchScript writes it: a [1, 1, 8, 8] bool buffer (causal within a window of
    3 keys) cut to the queries' rows [keys - queries, keys) and then to the keys' columns [:keys], the scores
    masked by it.  ``decode``: one query over a past of past_sequence keys (both row bounds symbolic)."""
    m = OnnxBuilder(17)
    x = m.input("hidden_states", F, ["batch", 1 if decode else "sequence", 4])
    keys = x
    if decode:
        keys = m.op("Concat", [m.input("past", F, ["batch", "past_sequence", 4]), x], axis=1)
    scores = m.op("Unsqueeze", [m.op("MatMul", [x, m.op("Transpose", [keys], perm=[0, 2, 1])]), m.ints(1)])
    window = np.tril(np.ones((8, 8), bool)) & ~np.tril(np.ones((8, 8), bool), -3)
    bias = m.op("Constant", [], value=onnx.numpy_helper.from_array(window[None, None]))
    (queries,) = m.dims(x, 1)
    (total,) = m.dims(keys, 1)
    rows = m.op("Slice", [bias, m.op("Sub", [total, queries]), total, m.ints(2), m.ints(1)])
    mask = m.op("Slice", [rows, m.ints(0), total, m.ints(3), m.ints(1)])
    masked = m.op("Where", [mask, scores, m.const(-1e4)])
    return m.model({"probs": m.op("Softmax", [masked], axis=-1)})


@pytest.mark.parametrize("decode", [False, True], ids=["prefill", "decode"])
def test_a_mask_buffer_cut_by_symbolic_rows_then_columns_gathers_them(decode: bool) -> None:
    """Each cut of the static buffer by a symbolic bound gathers its rows by an Arange (no Narrow of a symbolic
    bound on a static axis, which no shape rule can decide); the import assumes the keys fit the buffer."""
    model = local_mask_model(decode)
    g = import_model(model)
    assert ops(g)["Arange"] == 2 and ops(g)["Gather"] == 2 and "Narrow" not in ops(g)
    assert any("<= 8" in fact for fact in g.meta["assumptions"])
    bindings = ([{"batch": 1, "past_sequence": 1}, {"batch": 2, "past_sequence": 4}, {"batch": 3, "past_sequence": 7}]
                if decode else [{"batch": 1, "sequence": 3}, {"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 8}])
    runs_at_every_shape(model, bindings, {"batch": 2, "past_sequence": 4} if decode else {"batch": 2, "sequence": 5})



def alibi_model(exporter: str) -> onnx.ModelProto:
    """MPT's ALiBi bias as each exporter writes it: a [2, 1, 8] table (the slopes times the positions -7 ... 0)
    cut to its last ``sequence`` positions, added to the scores.  dynamo: the start is ``max(8 - sequence, 0)``
    (a Max of shape values); TorchScript: the start is ``-sequence`` (counted from the end)."""
    m = OnnxBuilder(18 if exporter == "dynamo" else 17)
    x = m.input("hidden_states", F, ["batch", "sequence", 2])
    scores = m.op("MatMul", [m.op("Unsqueeze", [m.op("Transpose", [x], perm=[0, 2, 1]), m.ints(3)]),
                             m.op("Unsqueeze", [m.op("Transpose", [x], perm=[0, 2, 1]), m.ints(2)])])
    slopes = np.array([0.5, 0.25], np.float32)[:, None, None]
    table = m.init("alibi", slopes * np.arange(-7, 1, dtype=np.float32)[None, None, :])
    (seq,) = m.dims(x, 1)
    start = (m.op("Max", [m.op("Sub", [m.ints(8), seq]), m.ints(0)]) if exporter == "dynamo" else
             m.op("Neg", [seq]))
    bias = m.op("Slice", [table, start, m.ints(2**63 - 1), m.ints(2), m.ints(1)])
    return m.model({"scores": m.op("Softmax", [m.op("Add", [scores, bias])], axis=-1)})


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_table_cut_to_its_last_positions_assumes_the_model_limit(exporter: str) -> None:
    """The cut is an Arange from 8 - sequence (negative at the optimizer's large stand-in values of the symbols,
    which an attribute may be); dynamo's max(8 - sequence, 0) is 8 - sequence up to the table's length, the
    model's own limit, recorded as an assumption."""
    model = alibi_model(exporter)
    g = import_model(model)
    (arange,) = [n for n in g.nodes if n.op == "Arange"]
    assert str(arange.attrs["start"]) == "-sequence+8"
    assert g.meta["assumptions"][0].startswith("sequence <= 8 (")
    runs_at_every_shape(model, [{"batch": 1, "sequence": 1}, {"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 8}],
                        {"batch": 2, "sequence": 5})


def test_a_model_limit_below_the_hint_is_not_assumed() -> None:
    with pytest.raises(OnnxImportError, match=r"cannot decide max\(-sequence\+8, 0\) for every value of sequence"):
        import_model(alibi_model("dynamo"), {"hidden_states": ("batch", "sequence=16", 2)})
    g = import_model(alibi_model("dynamo"), {"hidden_states": ("batch", "sequence=6", 2)})
    assert g.meta["assumptions"][0].startswith("sequence <= 8")


def tile_model() -> onnx.ModelProto:
    """Tiles by repeats built from the shapes (onnx's shape inference leaves their outputs unknown): DeBERTa's
    relative-position projection repeated over the batch ([1, batch, 2] on [batch, sequence, 4]), and Whisper's
    positions Range(0, sequence) unsqueezed to [1, sequence] and tiled to [batch, sequence]."""
    m = OnnxBuilder(18)
    x = m.input("hidden_states", F, ["batch", "sequence", 4])
    batch, seq = (m.op("Gather", [m.op("Shape", [x]), m.ints(k)], axis=0) for k in (0, 1))
    tiled = m.op("Tile", [x, m.op("Concat", [m.ints(1), batch, m.ints(2)], axis=0)])
    positions = m.op("Unsqueeze", [m.op("Range", [m.const(0, np.int64), m.op("Squeeze", [seq]),
                                                  m.const(1, np.int64)]), m.ints(0)])
    rows = m.op("Tile", [positions, m.op("Concat", [batch, m.ints(1)], axis=0)])
    table = m.weight("positions", 32, 4)
    return m.model({"tiled": m.op("Relu", [tiled]), "embedded": m.op("Gather", [table, rows], axis=0)})


def test_a_tile_by_symbolic_repeats_is_an_expand_between_reshapes() -> None:
    model = tile_model()
    g = import_model(model)
    assert "Tile" not in ops(g) and "OnnxOp" not in Counter(n.op for n in g.nodes)
    tiled = g.node(g.node(g.outputs[0]).inputs[0])
    assert [str(d) for d in tiled.shape] == ["batch", "batch*sequence", "8"]
    exported = runs_at_every_shape(model, [{"batch": 1, "sequence": 3}, {"batch": 3, "sequence": 7}],
                                   {"batch": 2, "sequence": 5})
    assert [dims(o) for o in exported.graph.output] == [["batch", "batch*sequence", 8], ["batch", "sequence", 4]]


def token_type_buffer_model() -> onnx.ModelProto:
    """BERT's embeddings as recent transformers write them: the token-type buffer of zeros [1, 32] gathered at the
    positions (GatherElements by Range(0, sequence) on axis 1) and expanded over the batch; word, token-type and
    position embeddings summed and normalized."""
    m = OnnxBuilder(17)
    ids = m.input("input_ids", TensorProto.INT64, ["batch", "sequence"])
    batch, seq = (m.op("Gather", [m.op("Shape", [ids]), m.ints(k)], axis=0) for k in (0, 1))
    positions = m.op("Unsqueeze", [m.op("Range", [m.const(0, np.int64), m.op("Squeeze", [seq]),
                                                  m.const(1, np.int64)]), m.ints(0)])
    buffer = m.init("token_type_ids", np.zeros((1, 32), np.int64))
    token_types = m.op("Expand", [m.op("GatherElements", [buffer, positions], axis=1),
                                  m.op("Concat", [batch, seq], axis=0)])
    total = m.op("Add", [m.op("Add", [m.op("Gather", [m.weight("word", 40, 16), ids], axis=0),
                                      m.op("Gather", [m.weight("token_type", 2, 16), token_types], axis=0)]),
                         m.op("Gather", [m.weight("position", 32, 16), positions], axis=0)])
    norm = m.op("LayerNormalization", [total, m.init("gamma", np.full(16, 1.1, np.float32)),
                                       m.weight("beta", 16, scale=0.1)], axis=-1, epsilon=1e-12)
    return m.model({"embedded": norm})


def test_a_buffer_of_one_value_gathered_at_symbolic_positions_is_that_value() -> None:
    """The gather of zeros is zeros at the positions' shape, whatever the positions: the token-type term is one
    row of its table, and the three terms export as one EmbedLayerNormalization, as the static import does."""
    model = token_type_buffer_model()
    g = import_model(model)
    assert "GatherElements" not in ops(g)
    exported = runs_at_every_shape(model, [{"batch": 1, "sequence": 3}, {"batch": 3, "sequence": 32}],
                                   {"batch": 2, "sequence": 5})
    assert Counter(n.op_type for n in exported.graph.node)["EmbedLayerNormalization"] == 1


def test_exported_dim_params_keep_the_models_spelling() -> None:
    """The dynamo exporter names a decoding step's mask dim "past_sequence + 1": the export writes that name, on
    the output too, not the canonical "past_sequence+1"."""
    m = OnnxBuilder(18)
    past = m.input("past_key", F, ["batch", "past_sequence", 4])
    mask = m.input("attention_mask", F, ["batch", "past_sequence + 1"])
    keys = m.op("Concat", [past, m.input("key", F, ["batch", 1, 4])], axis=1)
    scores = m.op("Add", [m.op("ReduceSum", [keys, m.ints(2)], keepdims=0), mask])
    model = m.model({"scores": scores})
    exported = runs_at_every_shape(model, [{"batch": 2, "past_sequence": 3, "past_sequence + 1": 4}],
                                   {"batch": 2, "past_sequence": 8})
    assert dims(exported.graph.input[1]) == ["batch", "past_sequence + 1"]
    assert dims(exported.graph.output[0]) == ["batch", "past_sequence + 1"]
