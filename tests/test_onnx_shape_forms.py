"""What a dynamic export computes from shapes costs no more launches than its static twin: models built with
onnx.helper in the forms transformers' exporters write with dynamic batch and sequence, imported without
bindings, optimized and exported with their dim_params; the exported graph's ops are counted exactly and the
model runs in onnxruntime at two shapes with the original's values."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto

from onnx_models import F, OnnxBuilder, dynamic_feeds
from rlx_egraph import Graph, evaluate, optimize, specialize
from rlx_egraph.onnx import export_model, import_model
from test_onnx_import import assert_close, run_ort

HIDDEN = 8
BINDINGS = ({"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 11})
LOWEST = float(np.finfo(np.float32).min)


def exported_ops(model: onnx.ModelProto) -> tuple[Counter[str], onnx.ModelProto]:
    """The op counts of ``model`` imported with its symbols, optimized for onnxruntime and exported, and the export
    (checked against the original at every binding)."""
    exported = export_model(optimize(import_model(model), target="onnxruntime", dim_hints={"batch": 2,
                                                                                        "sequence": 5}))
    for binding in BINDINGS:
        inputs = dynamic_feeds(model, binding)
        inputs["attention_mask"][0, -2:] = 0
        assert_close(run_ort(exported, inputs)[0], run_ort(model, inputs)[0])
    return Counter(n.op_type for n in exported.graph.node), exported


def masked_scores(m: OnnxBuilder, x: str, keep: str) -> str:
    """softmax(x @ x^T + Where(keep, 0, lowest)) @ x over one head: [B, 1, S, HIDDEN]."""
    x4 = m.op("Unsqueeze", [x, m.ints(1)])
    scores = m.op("MatMul", [x4, m.op("Transpose", [x4], perm=[0, 1, 3, 2])])
    bias = m.op("Where", [keep, m.const(0.0), m.const(LOWEST)])
    return m.op("MatMul", [m.op("Softmax", [m.op("Add", [scores, bias])], axis=-1), x4])


def test_a_mask_true_at_every_position_is_dropped_from_the_padding_mask() -> None:
    """transformers 5 ANDs the padding mask [B, 1, 1, S] with a mask function of the query positions that holds
    everywhere (``q_idx >= 0`` over Range(0, sequence)): the And, its comparison and the Range are no nodes."""
    m = OnnxBuilder(17)
    x = m.input("x", F, ["batch", "sequence", HIDDEN])
    mask = m.input("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    seq = m.op("Gather", [m.op("Shape", [x]), m.const(1, np.int64)], axis=0)
    q_idx = m.op("Unsqueeze", [m.op("Range", [m.const(0, np.int64), seq, m.const(1, np.int64)]), m.ints(0, 1, 3)])
    every = m.op("GreaterOrEqual", [q_idx, m.const(0, np.int64)])  # [1, 1, S, 1], true everywhere
    padding = m.op("Unsqueeze", [m.op("Cast", [mask], to=TensorProto.BOOL), m.ints(1, 2)])  # [B, 1, 1, S]
    keep = m.op("And", [every, padding])
    ops, _ = exported_ops(m.model({"y": masked_scores(m, x, keep)}))
    assert (ops["And"], ops["GreaterOrEqual"], ops["Less"], ops["Range"], ops["Mul"]) == (0, 0, 0, 0, 0), ops


def test_a_view_adding_unit_axes_to_symbolic_dims_is_an_unsqueeze() -> None:
    """A Reshape of [batch, sequence] to [batch, 1, 1, sequence] (the padding mask's view) is written as an
    Unsqueeze by constant axes: no target computed at run time (Shape, Concat)."""
    m = OnnxBuilder(17)
    x = m.input("x", F, ["batch", "sequence", HIDDEN])
    mask = m.input("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    b, s = m.dims(mask, 0, 1)
    keep = m.op("Reshape", [m.op("Cast", [mask], to=TensorProto.BOOL),
                            m.op("Concat", [b, m.ints(1), m.ints(1), s], axis=0)])
    ops, exported = exported_ops(m.model({"y": masked_scores(m, x, keep)}))
    assert (ops["Reshape"], ops["Unsqueeze"]) == (0, 2), ops  # x's and the mask's
    # a target computed at run time may only feed the Expand of an attention mask to [B, 1, S, S]
    nodes = exported.graph.node
    targets = {o for n in nodes if n.op_type == "Concat" for o in n.output}
    assert all(n.op_type == "Expand" for n in nodes if targets & set(n.input)), ops


def test_embeddings_of_a_dynamic_export_cost_their_static_launches() -> None:
    """BERT's embeddings as TorchScript exports them with dynamic axes: the token-type row Expanded to [batch,
    sequence, hidden] by a target from Shape (added to the word embeddings: broadcasting does it, no Expand), and
    the position table gathered at Range(0, sequence) (its first rows: a Slice, no Range)."""
    m = OnnxBuilder(17)
    ids = m.input("input_ids", TensorProto.INT64, ["batch", "sequence"])
    m.input("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    shape = m.op("Shape", [ids])
    batch, seq = (m.op("Unsqueeze", [m.op("Gather", [shape, m.const(k, np.int64)], axis=0), m.ints(0)])
                  for k in (0, 1))
    row = m.op("Gather", [m.weight("token_type", 2, HIDDEN), m.const([[0]], np.int64)])  # [1, 1, HIDDEN]
    types = m.op("Expand", [row, m.op("Concat", [batch, seq, m.ints(HIDDEN)], axis=0)])
    positions = m.op("Unsqueeze", [m.op("Range", [m.const(0, np.int64), m.op("Squeeze", [seq, m.ints(0)]),
                                                  m.const(1, np.int64)]), m.ints(0)])
    words = m.op("Gather", [m.weight("words", 40, HIDDEN), ids])
    emb = m.op("Add", [m.op("Add", [words, types]), m.op("Gather", [m.weight("positions", 32, HIDDEN), positions])])
    ops, _ = exported_ops(m.model({"y": m.op("Tanh", [emb])}))
    assert (ops["Expand"], ops["Range"], ops["Gather"], ops["Slice"], ops["Concat"]) == (0, 0, 1, 1, 0), ops


def test_a_chain_between_gemms_stays_on_rows() -> None:
    """Linear, GELU, linear, residual Add and LayerNorm on [batch, sequence, hidden] (a BERT feed-forward block):
    each Gemm takes the rows [batch * sequence, hidden] and the ops between them run on the rows too, so the only
    reshape to the 3-D shape is the output's (one Concat of Shape nodes for its target)."""
    m = OnnxBuilder(17)
    x = m.input("x", F, ["batch", "sequence", HIDDEN])
    m.input("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    inner = m.linear(x, "ffn.in", HIDDEN, 4 * HIDDEN)
    erf = m.op("Erf", [m.op("Div", [inner, m.const(np.sqrt(2.0))])])
    gelu = m.op("Mul", [m.op("Mul", [inner, m.op("Add", [erf, m.const(1.0)])]), m.const(0.5)])
    residual = m.op("Add", [m.linear(gelu, "ffn.out", 4 * HIDDEN, HIDDEN), x])
    gamma = m.init("ln.weight", np.linspace(0.5, 1.5, HIDDEN, dtype=np.float32))
    y = m.op("LayerNormalization", [residual, gamma, m.weight("ln.bias", HIDDEN)], axis=-1)
    ops, _ = exported_ops(m.model({"y": m.op("Tanh", [y])}))
    assert (ops["Gemm"], ops["Reshape"], ops["Concat"], ops["Shape"]) == (2, 2, 1, 2), ops


def test_a_padding_mask_of_the_lowest_fill_is_attentions_bool_mask() -> None:
    """MultiHeadAttention whose bias is Where(keep, 0, lowest) of a [batch, sequence] padding mask viewed as
    [batch, 1, 1, sequence] is exported with ``keep`` as Attention's bool attn_mask (expanded to the scores): no
    Where; any other fill stays the additive mask it is.  onnxruntime gives the MIR graph's values."""
    heads, width = 2, HIDDEN
    for fill, wheres in ((LOWEST, 0), (-1e9, 1)):
        g = Graph("mha")
        q, k, v = (g.input(n, ("batch", "sequence", width)) for n in "qkv")
        mask = g.input("attention_mask", ("batch", "sequence"), "i64")
        keep = g.reshape(g.cast(mask, dtype="bool"), shape=("batch", 1, 1, "sequence"))
        bias = g.where(keep, g.scalar(0.0), g.scalar(fill))
        ctx = g.add_node("MultiHeadAttention", [q, k, v, bias], heads=heads, scale=0.5, fill=fill)
        g.set_outputs([g.reshape(ctx, shape=("batch", "sequence", width))])
        model = export_model(g)
        ops = Counter(n.op_type for n in model.graph.node)
        attention = next(n for n in model.graph.node if n.op_type == "Attention")
        producer = {o: n for n in model.graph.node for o in n.output}
        expand = producer[attention.input[3]]  # to [batch, 1, sequence, sequence]
        masked = producer[expand.input[0]].op_type
        assert (ops["Where"], ops["Attention"], expand.op_type, masked) == (
            wheres, 1, "Expand", "Unsqueeze" if wheres == 0 else "Where")
        rng = np.random.default_rng(0)
        inputs = {n: rng.standard_normal((3, 7, width)).astype(np.float32) for n in "qkv"}
        inputs["attention_mask"] = np.ones((3, 7), np.int64)
        inputs["attention_mask"][1, 4:] = 0
        want = evaluate(specialize(g, {"batch": 3, "sequence": 7}), inputs)[0]
        assert_close(run_ort(model, inputs)[0], want)
