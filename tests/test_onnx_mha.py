"""Attention over separate q, k and v projections as encoder-decoder exports write it (T5: unscaled scores, a
position bias inside the causal mask; cross attention with a padding mask; an unmasked encoder): one
MultiHeadAttention each, exported as one attention kernel, with parity against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from onnx_models import OnnxBuilder
from rlx_egraph.onnx import export_model, import_model, onnx_rules
from rlx_egraph.optimize import optimize_with_report

F = TensorProto.FLOAT
HIDDEN, HEADS, TARGET, SOURCE = 16, 2, 5, 7  # the decoder's and the encoder's sequence lengths differ
LOWEST = float(np.finfo(np.float32).min)


def split(m: OnnxBuilder, x: str, seq: int) -> str:
    return m.op("Transpose", [m.op("Reshape", [x, m.ints(2, seq, HEADS, HIDDEN // HEADS)])], perm=[0, 2, 1, 3])


def merge(m: OnnxBuilder, ctx: str, seq: int) -> str:
    return m.op("Reshape", [m.op("Transpose", [ctx], perm=[0, 2, 1, 3]), m.ints(2, seq, HIDDEN)])


def encoder_decoder_attention() -> onnx.ModelProto:
    """T5's decoder self attention (no bias on the projections, no scale, Where(causal, scores + position bias,
    lowest)), its cross attention over the encoder's states with the encoder's padding mask, and an unmasked
    encoder self attention scaled by Div (keys without bias)."""
    m = OnnxBuilder(18)
    x = m.input("decoder_states", F, [2, TARGET, HIDDEN])
    enc = m.input("encoder_states", F, [2, SOURCE, HIDDEN])
    mask = m.input("attention_mask", TensorProto.INT64, [2, SOURCE])

    def attend(q: str, k: str, v: str, bias: str | None = None, causal: str | None = None) -> str:
        scores = m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])])
        if bias is not None:
            scores = m.op("Add", [scores, bias])
        if causal is not None:
            scores = m.op("Where", [causal, scores, m.const(LOWEST)])
        return m.op("MatMul", [m.op("Softmax", [scores], axis=-1), v])

    def project(h: str, name: str, seq: int, bias: bool = False) -> str:
        return split(m, m.linear(h, name, HIDDEN, HIDDEN, bias=bias), seq)

    position_bias = m.weight("position_bias", 1, HEADS, TARGET, TARGET, scale=1.0)
    keep = m.init("causal", np.tril(np.ones((TARGET, TARGET), bool)))
    self_ctx = merge(m, attend(*(project(x, f"self.{n}", TARGET) for n in "qkv"), position_bias, keep), TARGET)
    h = m.op("Add", [x, m.linear(self_ctx, "self.o", HIDDEN, HIDDEN, bias=False)])
    padding = m.op("Where", [m.op("Unsqueeze", [m.op("Cast", [mask], to=TensorProto.BOOL), m.ints(1, 2)]),
                             m.const(0.0), m.const(LOWEST)])
    cross_ctx = merge(m, attend(project(h, "cross.q", TARGET), project(enc, "cross.k", SOURCE),
                                project(enc, "cross.v", SOURCE), padding), TARGET)
    q, k, v = project(enc, "enc.q", SOURCE, True), project(enc, "enc.k", SOURCE), project(enc, "enc.v", SOURCE, True)
    scaled = m.op("Div", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(2.0)])
    enc_ctx = merge(m, m.op("MatMul", [m.op("Softmax", [scaled], axis=-1), v]), SOURCE)
    return m.model({"decoder_out": m.linear(cross_ctx, "cross.o", HIDDEN, HIDDEN), "encoder_out": enc_ctx})


def test_t5_style_and_cross_attention_become_multi_head_attention_with_onnxruntime_parity() -> None:
    model = encoder_decoder_attention()
    rng = np.random.default_rng(0)
    mask = np.ones((2, SOURCE), np.int64)
    mask[1, -3:] = 0
    feeds = {"decoder_states": rng.standard_normal((2, TARGET, HIDDEN)).astype(np.float32),
             "encoder_states": rng.standard_normal((2, SOURCE, HIDDEN)).astype(np.float32), "attention_mask": mask}
    out, report = optimize_with_report(import_model(model), target="onnxruntime", rules=onnx_rules(), verify=True)
    assert report.parity.ok
    rules = ("multi-head-attention", "multi-head-attention-plain", "onnx-multi-head-attention-causal-biased")
    assert {r: report.matches_per_rule[r] >= 1 for r in rules} == dict.fromkeys(rules, True)
    counts = out.op_counts()
    assert {op: counts[op] for op in ("MultiHeadAttention", "Softmax", "Transpose", "BiasedAttention")} == {
        "MultiHeadAttention": 3, "Softmax": 0, "Transpose": 0, "BiasedAttention": 0}
    assert sorted((n.attrs["causal"], n.attrs["scale"], len(n.inputs)) for n in out.nodes
                  if n.op == "MultiHeadAttention") == [(False, 0.5, 3), (False, 1.0, 4), (True, 1.0, 4)]
    exported = export_model(out)
    ops = [n.op_type for n in exported.graph.node]
    assert (ops.count("Attention"), ops.count("Softmax"), ops.count("Transpose")) == (3, 0, 0)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


def gqa_sdpa_attention(key_scale: float) -> onnx.ModelProto:
    """The dynamo exporter's GQA under sdpa: the keys' repeat_kv merged into the flat key reshape
    (Reshape(Expand(Unsqueeze(k)), [B*H, S, D]), Transpose, Reshape [B, H, D, S]), q and the keys each multiplied
    by sqrt(scale) (the keys by ``key_scale``: another value breaks that one clause), an additive mask and
    Where(IsNaN(p), 0, p) after the Softmax."""
    m = OnnxBuilder(18)
    heads, kv_heads, seq, hd = 4, 2, 5, 4
    x = m.input("hidden_states", F, [2, seq, HIDDEN])
    mask = m.input("mask", F, [2, 1, seq, seq])

    def project(name: str, width: int, n: int) -> str:
        return m.op("Transpose", [m.op("Reshape", [m.linear(x, name, HIDDEN, width, bias=False),
                                                   m.ints(2, seq, n, hd)])], perm=[0, 2, 1, 3])

    q, k, v = project("q", heads * hd, heads), project("k", kv_heads * hd, kv_heads), project("v", kv_heads * hd,
                                                                                          kv_heads)
    wide = m.ints(2, kv_heads, heads // kv_heads, seq, hd)
    flat = m.op("Reshape", [m.op("Expand", [m.op("Unsqueeze", [k, m.ints(2)]), wide]), m.ints(2 * heads, seq, hd)])
    keys_t = m.op("Reshape", [m.op("Transpose", [flat], perm=[0, 2, 1]), m.ints(2, heads, hd, seq)])
    values = m.op("Reshape", [m.op("Expand", [m.op("Unsqueeze", [v, m.ints(2)]), wide]), m.ints(2, heads, seq, hd)])
    root = hd**-0.25
    scores = m.op("MatMul", [m.op("Mul", [q, m.const(root)]), m.op("Mul", [keys_t, m.const(key_scale)])])
    probs = m.op("Softmax", [m.op("Add", [scores, mask])], axis=-1)
    probs = m.op("Where", [m.op("IsNaN", [probs]), m.const(0.0), probs])
    return m.model({"context": m.op("MatMul", [probs, values])})


def test_a_gqa_sdpa_attention_with_one_clause_broken_is_a_near_miss_naming_that_clause() -> None:
    """As exported, one BiasedAttention on the unrepeated keys and values.  With the keys scaled by another
    factor than the queries the scores are no attn-scores form: the near miss names that clause, not the Softmax
    the relaxation without it would match anywhere the root matches."""
    out, _ = optimize_with_report(import_model(gqa_sdpa_attention(4**-0.25)), rules=onnx_rules())
    (fused,) = [n for n in out.nodes if n.op == "BiasedAttention"]
    assert [out.node(i).shape[1] for i in fused.inputs[:3]] == [4, 2, 2]
    out, report = optimize_with_report(import_model(gqa_sdpa_attention(0.5)), rules=onnx_rules())
    assert "BiasedAttention" not in out.op_counts()
    (miss,) = [m for m in report.fusion.missed if m.rule == "onnx-attention-isnan"]
    assert (miss.kind, miss.reason, miss.detail.split(" except that ")[1]) == (
        "near miss", "guard", "the guard (attn-scores ?s ?q4 ?k4 ?scale) does not hold")


def left_padded_decoder_attention() -> onnx.ModelProto:
    """T5's decoder self attention over a left-padded batch: Where(causal, scores + position bias + padding,
    lowest), the padding Where(attention_mask, 0, lowest)."""
    m = OnnxBuilder(18)
    x = m.input("decoder_states", F, [2, TARGET, HIDDEN])
    mask = m.input("attention_mask", TensorProto.INT64, [2, TARGET])
    q, k, v = (split(m, m.linear(x, f"self.{n}", HIDDEN, HIDDEN, bias=False), TARGET) for n in "qkv")
    padding = m.op("Where", [m.op("Unsqueeze", [m.op("Cast", [mask], to=TensorProto.BOOL), m.ints(1, 2)]),
                             m.const(0.0), m.const(LOWEST)])
    bias = m.op("Add", [m.weight("position_bias", 1, HEADS, TARGET, TARGET, scale=1.0), padding])
    scores = m.op("Add", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), bias])
    keep = m.init("causal", np.tril(np.ones((TARGET, TARGET), bool)))
    probs = m.op("Softmax", [m.op("Where", [keep, scores, m.const(LOWEST)])], axis=-1)
    return m.model({"context": merge(m, m.op("MatMul", [probs, v]), TARGET)})


def test_a_left_padded_decoders_fully_masked_rows_keep_the_originals_values() -> None:
    """The first two queries of the left-padded row see only padded keys: the Where's fill ties with the masked
    scores there (weights spread over every key), which the fused op keeps by carrying the fill.  onnxruntime's
    Attention gives 0 on exactly those rows (docs/onnx.md); every other row agrees."""
    model = left_padded_decoder_attention()
    mask = np.ones((2, TARGET), np.int64)
    mask[1, :2] = 0
    out, report = optimize_with_report(import_model(model), target="onnxruntime", rules=onnx_rules(),
                                       verify={"attention_mask": mask})
    assert report.parity.ok
    (fused,) = [n for n in out.nodes if n.op == "MultiHeadAttention"]
    assert (fused.attrs["causal"], fused.attrs["fill"]) == (True, LOWEST)
    feeds = {"decoder_states": np.random.default_rng(0).standard_normal((2, TARGET, HIDDEN)).astype(np.float32),
             "attention_mask": mask}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = ort.InferenceSession(export_model(out).SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, feeds)
    differ = np.abs(got - want).max(axis=-1) > 1e-5
    assert np.argwhere(differ).tolist() == [[1, 0], [1, 1]]
    assert not got[1, :2].any() and want[1, :2].any()
