"""Real exports' dynamic forms end to end: models built with onnx.helper as PyTorch's exporters write them with
dynamic batch and sequence (TorchScript and dynamo: position buffers sliced to the sequence, Range positions,
CumSum positions, causal masks from a sliced buffer, from ConstantOfShape + Trilu and from Range comparisons,
padding masks by GatherND or a flattened Gather, GQA repeat_kv) are imported without bindings, optimized and
exported with their dim_params, and run in onnxruntime at three shapes with the original's values; the fused ops
are those of the static import at the hint shape."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from onnx_models import DYNAMIC_MODELS, OnnxBuilder, bound_shapes, dynamic_feeds
from rlx_egraph import Graph, optimize, optimize_with_report, specialize
from rlx_egraph.onnx import export_model, import_model
from test_onnx_import import assert_close, run_ort

HINTS = {"batch": 2, "sequence": 5}
BINDINGS = ({"batch": 1, "sequence": 7}, {"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 17})
# (model, exporter) -> the fused ops of its optimization, symbolic and static alike
FUSED = {
    ("bert", "torchscript"): {"EmbedLayerNorm": 1, "FusedMatMulBiasAct": 6, "FusedResidualLN": 2,
                              "MultiHeadAttention": 1},
    ("bert", "dynamo"): {"EmbedLayerNorm": 1, "FusedMatMulBiasAct": 6, "FusedResidualLN": 2, "MultiHeadAttention": 1},
    ("gpt2", "torchscript"): {"FusedAddLayerNorm": 2, "FusedMatMulBiasAct": 6, "MultiHeadAttention": 1},
    ("gpt2", "dynamo"): {"FusedAddLayerNorm": 2, "FusedMatMulBiasAct": 6, "MultiHeadAttention": 1},
    ("llama", "torchscript"): {"CausalAttention": 1, "FusedAddRmsNorm": 1, "FusedMatMulAdd": 1},
    ("llama", "dynamo"): {"CausalAttention": 1, "FusedAddRmsNorm": 1, "FusedMatMulAdd": 1},
    ("llama-padded", "torchscript"): {"BiasedAttention": 1, "FusedAddRmsNorm": 1, "FusedMatMulAdd": 1},
    ("llama-padded", "dynamo"): {"BiasedAttention": 1, "FusedAddRmsNorm": 1, "FusedMatMulAdd": 1},
}


def fused(graph: Graph) -> dict[str, int]:
    kinds = ("Fused", "EmbedLayerNorm")
    return dict(sorted(Counter({op: n for op, n in graph.op_counts().items()
                                if op.startswith(kinds) or op.endswith("Attention")}).items()))


def dims(info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]


@pytest.mark.parametrize("key", list(DYNAMIC_MODELS), ids=["-".join(k) for k in DYNAMIC_MODELS])
def test_dynamic_export_form_runs_at_every_shape_with_the_static_fusions(key: tuple[str, str]) -> None:
    model = DYNAMIC_MODELS[key]()
    g = import_model(model)
    assert g.symbols == ("batch", "sequence")
    opt = optimize(g, target="onnxruntime", dim_hints=HINTS)
    static = optimize(import_model(model, bound_shapes(model, HINTS)), target="onnxruntime")
    assert fused(opt) == fused(static) == FUSED[key]
    assert fused(optimize(g, target="onnxruntime", dim_hints=HINTS, engine="fallback")) == FUSED[key]
    exported = export_model(opt)
    # every ONNX op of the static export is in the dynamic one (its contrib kernels included); the dynamic one
    # adds only what the static import folds: shape tensors, positions, rotary tables, causal masks.  A view is a
    # view: a reshape that only adds or drops size-1 axes is a Squeeze or Unsqueeze where its target is symbolic
    views = {"Squeeze": "Reshape", "Unsqueeze": "Reshape"}
    dynamic_ops, static_ops = (Counter(views.get(n.op_type, n.op_type) for n in m.graph.node)
                               for m in (exported, export_model(static)))
    assert static_ops - dynamic_ops == Counter()
    assert set(dynamic_ops - static_ops) <= {"Shape", "Concat", "Reshape", "Expand", "Range", "Unsqueeze",
                                             "LessOrEqual", "Cast", "MatMul", "Transpose", "Cos", "Sin", "Slice"}
    assert [dims(i) for i in exported.graph.input] == [dims(i) for i in model.graph.input]
    assert dims(exported.graph.output[0]) == ["batch", "sequence", 16]
    for binding in BINDINGS:
        inputs = dynamic_feeds(model, binding)
        got, want = run_ort(exported, inputs)[0], run_ort(model, inputs)[0]
        assert got.shape == (binding["batch"], binding["sequence"], 16)
        assert_close(got, want)


def ops(graph: Graph) -> Counter[str]:
    return Counter(n.attrs["op_type"] if n.op == "OnnxOp" else n.op for n in graph.nodes)


def test_position_and_token_type_buffers_cut_to_the_sequence_are_an_arange_and_a_row() -> None:
    """BERT's position_ids buffer [1, 32] = arange sliced to [:sequence] is Arange(0, sequence) (gathered from the
    position table by an Embedding); the token-type buffer of zeros, sliced and expanded, gathers one row of the
    token-type table everywhere: that row, broadcast.  Exported, the three terms are one EmbedLayerNormalization
    (at the hint shape: the cost decides the fusion, and at 16 x 16 tokens, the size a symbol without a hint is
    priced at, onnxruntime's calibrated EmbedLayerNormalization costs more than its parts)."""
    model = DYNAMIC_MODELS["bert", "torchscript"]()
    g = import_model(model)
    (arange,) = [n for n in g.nodes if n.op == "Arange"]
    assert (arange.attrs["start"], str(arange.attrs["length"])) == (0, "sequence")
    assert ops(g)["Embedding"] == 2 and "Slice" not in ops(g) and "Narrow" not in ops(g)
    (row,) = [n for n in g.params if n.name.endswith(".row")]
    table = next(t for t in model.graph.initializer if t.name == "embeddings.token_type_embeddings.weight")
    np.testing.assert_array_equal(g.weights[row.name], onnx.numpy_helper.to_array(table)[:1])
    exported = export_model(optimize(g, target="onnxruntime", dim_hints=HINTS))
    assert Counter(n.op_type for n in exported.graph.node)["EmbedLayerNormalization"] == 1
    assert not {"Gather", "Range"} & {n.op_type for n in exported.graph.node}


@pytest.mark.parametrize("key", [("gpt2", "torchscript"), ("gpt2", "dynamo"), ("llama", "torchscript"),
                                 ("llama", "dynamo")], ids=lambda k: "-".join(k))
def test_every_causal_mask_form_is_one_causal_mask_leaf(key: tuple[str, str]) -> None:
    """The bias buffer sliced to [:S, :S], ConstantOfShape + Trilu, and kv_idx <= q_idx on Ranges all import as
    one CausalMask of symbolic size (the leaf the causal attention rules match); no opaque comparison is left."""
    g = import_model(DYNAMIC_MODELS[key]())
    (mask,) = [n for n in g.nodes if n.op == "CausalMask"]
    assert [str(d) for d in mask.shape[-2:]] == ["sequence", "sequence"]
    assert not {"LessOrEqual", "Trilu", "Range", "ConstantOfShape"} & set(ops(g))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_padding_mask_index_gathers_over_ranges_are_a_reshape_and_an_expand(exporter: str) -> None:
    """padding_mask[arange(B)[:, None, None, None], arange(KV)] (dynamo: GatherND on the index pairs; TorchScript: a
    Gather on the flattened mask at b * KV + k) reads the mask in order: Reshape to [B, 1, 1, KV], no gather."""
    g = import_model(DYNAMIC_MODELS["llama-padded", exporter]())
    assert not {"GatherND", "Gather", "Embedding"} & set(ops(g))
    node = g.node(g.leaf("attention_mask").id)
    views = []
    while len(g.users(node.id)) == 1 and g.node(g.users(node.id)[0]).op in ("Cast", "Reshape"):
        node = g.node(g.users(node.id)[0])
        views.append(node.op)
    assert views[0] == "Cast" and set(views[1:]) == {"Reshape"}
    assert [str(d) for d in node.shape] == ["batch", "1", "1", "sequence"]


def test_positions_from_the_mask_by_cumsum_are_runtime_ops_at_every_shape() -> None:
    """GPT-2's position ids CumSum(mask) * mask - 1 read the input: an opaque CumSum with symbolic shape, the
    position table gathered by an Embedding."""
    g = import_model(DYNAMIC_MODELS["gpt2", "torchscript"]())
    (cumsum,) = [n for n in g.nodes if n.op == "OnnxOp" and n.attrs["op_type"] == "CumSum"]
    assert [str(d) for d in cumsum.shape] == ["batch", "sequence"]
    assert [g.node(u).op for u in g.users(cumsum.id)] == ["Mul"]


def test_a_range_over_the_batch_builds_the_mask_without_binding_it() -> None:
    """Binding the sequence and leaving the batch symbolic: the mask's Range over the batch is still exact."""
    model = DYNAMIC_MODELS["llama-padded", "dynamo"]()
    g = import_model(model, {"hidden_states": ("batch", 6, 16)})
    assert g.symbols == ("batch",)
    exported = export_model(optimize(g, target="onnxruntime"))
    for batch in (1, 3):
        inputs = dynamic_feeds(model, {"batch": batch, "sequence": 6})
        assert_close(run_ort(exported, inputs)[0], run_ort(model, inputs)[0])


def test_masks_over_more_keys_than_queries_keep_their_alignment() -> None:
    """A decode-style causal mask (the queries are the last S of 2S keys: keys j <= i + S) is the bottom-right
    CausalMask; a top-left one over the same keys (j <= i) is not that form and stays a comparison."""
    for q_from_end, causal in ((True, True), (False, False)):
        m = OnnxBuilder(18)
        x = m.input("x", onnx.TensorProto.FLOAT, ["batch", "sequence", 4])
        seq = m.op("Gather", [m.op("Shape", [x]), m.const(1, np.int64)], axis=0)
        keys = m.op("Concat", [x, x], axis=1)
        kv = m.op("Gather", [m.op("Shape", [keys]), m.const(1, np.int64)], axis=0)
        start = seq if q_from_end else m.const(0, np.int64)
        q = m.op("Range", [start, m.op("Add", [start, seq]), m.const(1, np.int64)])
        k = m.op("Range", [m.const(0, np.int64), kv, m.const(1, np.int64)])
        keep = m.op("LessOrEqual", [m.op("Unsqueeze", [k, m.ints(0)]), m.op("Unsqueeze", [q, m.ints(1)])])
        scores = m.op("MatMul", [x, m.op("Transpose", [keys], perm=[0, 2, 1])])
        model = m.model({"y": m.op("Where", [keep, scores, m.const(-1e9)])})
        g = import_model(model)
        assert ("CausalMask" in ops(g)) == causal
        exported = export_model(g)
        for b, s in ((1, 3), (2, 6)):
            xv = np.random.default_rng(s).standard_normal((b, s, 4)).astype(np.float32)
            np.testing.assert_array_equal(run_ort(exported, {"x": xv})[0], run_ort(model, {"x": xv})[0])


def test_the_report_says_which_choices_depended_on_the_size_hints() -> None:
    """Two activations of one linear layer: fused twice (the matmul computed twice, one launch less) pays at 64 rows
    on cuda and not at 1024; priced at the hint batch=64, the report names both values and what they would be."""
    g = Graph("two-heads")
    x = g.input("x", ("batch", 512))
    w, b = g.param("w", (512, 512)), g.param("b", (512,))
    h = g.add(g.matmul(x, w), b)
    g.set_outputs([g.gelu(h), g.silu(h)])
    out, report = optimize_with_report(g, target="cuda", dim_hints={"batch": 64})
    assert out.op_counts()["FusedMatMulBiasAct"] == 2
    assert report.hint_choices == [
        "node 5 (Gelu): FusedMatMulBiasAct at the hints (batch=64), Gelu at batch=1024",
        "node 6 (Silu): FusedMatMulBiasAct at the hints (batch=64), Silu at batch=1024"]
    assert f"choices that depend on the size hints (2): {report.hint_choices[0]}" in str(report)
    assert optimize(specialize(g, {"batch": 1024}), target="cuda").op_counts()["FusedMatMulBiasAct"] == 1
    assert optimize_with_report(specialize(g, {"batch": 64}), target="cuda")[1].hint_choices == []  # static: none


def t5_cross_attention(hidden: int = 16, heads: int = 2) -> onnx.ModelProto:
    """T5's decoder cross-attention as dynamo writes it with dynamic axes: the zero position bias
    zeros([1, heads, decoder_sequence, sequence]) (an Expand of 0 to a shape from the inputs' Shapes; a constant
    in a static export) added to the unscaled scores, then the encoder's padding mask Where(keep, 0, lowest)."""
    m = OnnxBuilder(18)
    x = m.input("decoder_hidden", onnx.TensorProto.FLOAT, ["batch", "decoder_sequence", hidden])
    enc = m.input("encoder_hidden", onnx.TensorProto.FLOAT, ["batch", "sequence", hidden])
    mask = m.input("attention_mask", onnx.TensorProto.INT64, ["batch", "sequence"])
    hd = hidden // heads
    q = m.split_heads(m.linear(x, "q", hidden, hidden, bias=False), heads, hd)
    k, v = (m.split_heads(m.linear(enc, n, hidden, hidden, bias=False), heads, hd) for n in "kv")
    scores = m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])])
    size = m.op("Concat", [m.ints(1, heads), m.op("Shape", [x], start=1, end=2), m.op("Shape", [mask], start=1)],
                axis=0)
    zeros = m.op("Expand", [m.const(0.0), size])
    keep = m.op("Unsqueeze", [m.op("Cast", [mask], to=onnx.TensorProto.BOOL), m.ints(1, 2)])
    bias = m.op("Where", [keep, m.const(0.0), m.const(float(np.finfo(np.float32).min))])
    probs = m.op("Softmax", [m.op("Add", [m.op("Add", [scores, zeros]), bias])], axis=-1)
    return m.model({"y": m.linear(m.merge_heads(m.op("MatMul", [probs, v]), hidden), "o", hidden, hidden, bias=False)})


def test_a_zero_position_bias_computed_at_run_time_fuses_like_the_static_constant() -> None:
    """Softmax((scores + 0) + mask): the zero a Scalar broadcast under symbols, a zero constant when static; both
    fuse to one cross-attention, exported as one Attention, and run at three shapes with the original's values."""
    model = t5_cross_attention()
    g = import_model(model)
    assert g.symbols == ("batch", "decoder_sequence", "sequence")
    hints = {"batch": 2, "decoder_sequence": 3, "sequence": 5}
    opt = optimize(g, target="onnxruntime", dim_hints=hints)
    static = optimize(import_model(model, bound_shapes(model, hints)), target="onnxruntime")
    assert fused(opt) == fused(static) == {"MultiHeadAttention": 1}
    exported = export_model(opt)
    assert Counter(n.op_type for n in exported.graph.node)["Attention"] == 1
    assert [dims(i) for i in exported.graph.input] == [dims(i) for i in model.graph.input]
    assert dims(exported.graph.output[0]) == ["batch", "decoder_sequence", 16]
    for binding in ({"batch": 1, "decoder_sequence": 1, "sequence": 7}, {"batch": 2, "decoder_sequence": 3,
                                                                         "sequence": 5},
                    {"batch": 3, "decoder_sequence": 9, "sequence": 17}):
        inputs = dynamic_feeds(model, binding)
        assert_close(run_ort(exported, inputs)[0], run_ort(model, inputs)[0])
