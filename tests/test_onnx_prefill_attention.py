"""Prefill attention forms that stayed unfused, each built with onnx.helper as an exporter writes it: BLOOM's ALiBi
through flat heads over a projection packed per head, sdpa's NaN guard over separate projections, and GPT-Neo's
padding mask added after its causal Where.  Each is imported, optimized (exact fused-op counts), exported and run in
onnxruntime against the original within 1e-4, padded rows included."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import calibrations
from onnx_models import OnnxBuilder
from rlx_egraph.cost import TARGETS
from rlx_egraph.onnx import export_model, import_model, onnx_rules
from rlx_egraph.optimize import optimize_with_report

F = TensorProto.FLOAT
B, S, H, D = 2, 5, 2, 4
E = H * D
LOWEST = float(np.finfo(np.float32).min)
RULES = onnx_rules()


@pytest.fixture(autouse=True, scope="module")
def _onnxruntime_priced_uniformly() -> Iterator[None]:
    """Decisions asserted on fixed figures (tests/calibrations.py), not on the shipped calibration."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TARGETS, "onnxruntime", calibrations.UNIFORM)
        yield


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def optimized(model: onnx.ModelProto, engine: str = "egglog") -> tuple[onnx.ModelProto, Counter[str], set[str], list]:
    """The export of ``model`` optimized for onnxruntime (parity verified), its MIR op counts, the rules that matched
    and its MultiHeadAttention nodes."""
    out, report = optimize_with_report(import_model(model), target="onnxruntime", rules=RULES, engine=engine,
                                       verify=True)
    assert report.parity.ok
    fired = {name.split("#")[0] for name, n in report.matches_per_rule.items() if n}
    return export_model(out), Counter(out.op_counts()), fired, [n for n in out.nodes if n.op == "MultiHeadAttention"]


def heads(m: OnnxBuilder, x: str) -> str:
    return m.op("Transpose", [m.op("Reshape", [x, m.ints(B, S, H, D)])], perm=[0, 2, 1, 3])


def merged(m: OnnxBuilder, ctx: str) -> str:
    return m.op("Reshape", [m.op("Transpose", [ctx], perm=[0, 2, 1, 3]), m.ints(B, S, E)])


def padding_bias(m: OnnxBuilder, fill: float = LOWEST) -> str:
    """Where(attention_mask as bool [B, 1, 1, S], 0, fill)."""
    keep = m.op("Unsqueeze", [m.op("Cast", [m.input("attention_mask", TensorProto.INT64, [B, S])],
                                   to=TensorProto.BOOL), m.ints(1, 2)])
    return m.op("Where", [keep, m.const(0.0), m.const(fill)])


def feeds(model: onnx.ModelProto, mask: list[list[int]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    out = {"attention_mask": np.array(mask, np.int64)}
    for info in model.graph.input:
        if info.name != "attention_mask":
            shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
            out[info.name] = rng.standard_normal(shape).astype(np.float32)
    return out


RIGHT_PADDED = [[1] * S, [1] * (S - 2) + [0, 0]]
LEFT_PADDED = [[1] * S, [0, 0] + [1] * (S - 2)]  # row 1's first queries see only padded keys causally


def bloom_attention() -> onnx.ModelProto:
    """BLOOM (dynamo): one packed projection viewed per head [B, S, H, 3, D], q, k and v its slices along the fourth
    axis (Gather), split heads flattened to [B*H, S, D]; baddbmm: ALiBi [B*H, 1, S] + (q @ k^T) * D^-0.5 on the flat
    heads, unflattened to [B, H, S, S], plus the padding mask; Softmax, the context by bmm on the flat heads."""
    m = OnnxBuilder(18)
    x = m.input("x", F, [B, S, E])
    alibi = m.input("alibi", F, [B * H, 1, S])
    packed = m.op("Reshape", [m.linear(x, "query_key_value", E, 3 * E), m.ints(B, S, H, 3, D)])
    q, k, v = (m.op("Transpose", [m.op("Gather", [packed, m.const(j, np.int64)], axis=3)], perm=[0, 2, 1, 3])
               for j in range(3))
    flat_q, flat_k, flat_v = (m.op("Reshape", [t, m.ints(B * H, S, D)]) for t in (q, k, v))
    product = m.op("MatMul", [flat_q, m.op("Transpose", [flat_k], perm=[0, 2, 1])])
    scores = m.op("Add", [m.op("Mul", [product, m.const(D**-0.5)]), alibi])
    unflat = m.op("Add", [m.op("Reshape", [scores, m.ints(B, H, S, S)]), padding_bias(m)])
    probs = m.op("Reshape", [m.op("Softmax", [unflat], axis=-1), m.ints(B * H, S, S)])
    ctx = m.op("Reshape", [m.op("MatMul", [probs, flat_v]), m.ints(B, H, S, D)])
    return m.model({"y": m.linear(merged(m, ctx), "dense", E, E)})


def test_bloom_alibi_over_a_per_head_packed_projection_is_one_multi_head_attention() -> None:
    """The ALiBi bias broadcast over the queries unflattens with the scores, and each per-head slice is the head
    split of its [B, S, H*D] view: one MultiHeadAttention with ALiBi plus the padding mask as its bias."""
    model = bloom_attention()
    exported, mir, fired, mha = optimized(model)
    assert {op: mir[op] for op in ("MultiHeadAttention", "BiasedAttention", "Softmax")} == \
        {"MultiHeadAttention": 1, "BiasedAttention": 0, "Softmax": 0}
    assert {"unflatten-add", "flat-heads-scores", "reshape-through-rows", "multi-head-attention"} <= fired
    assert [(n.attrs["causal"], n.attrs["nan_to_zero"], n.attrs["scale"]) for n in mha] == [(False, False,
                                                                                             pytest.approx(D**-0.5))]
    ops = Counter(n.op_type for n in exported.graph.node)
    # the projections as Gemm on rows, the per-head slices as one Split, the bias ALiBi + mask expanded once
    assert (ops["Attention"], ops["Softmax"], ops["Gemm"], ops["Split"], ops["Transpose"]) == (1, 0, 2, 1, 0)
    inputs = feeds(model, RIGHT_PADDED)
    np.testing.assert_allclose(run(exported, inputs), run(model, inputs), rtol=0, atol=1e-4)


def sdpa_separate_projections() -> onnx.ModelProto:
    """OPT under sdpa (TorchScript): q, k and v projections split into heads, q and k^T each multiplied by D^-0.25,
    a bool mask [B, 1, S, S] (causal And padding) as Where(keep, 0, -inf), Softmax, Where(IsNaN(p), 0, p) @ v."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [B, S, E])
    keep = m.op("And", [m.init("causal", np.tril(np.ones((S, S), bool))[None, None]),
                        m.op("Unsqueeze", [m.op("Cast", [m.input("attention_mask", TensorProto.INT64, [B, S])],
                                                to=TensorProto.BOOL), m.ints(1, 2)])])
    bias = m.op("Where", [keep, m.const(0.0), m.const(-np.inf)])
    q, k, v = (heads(m, m.linear(x, n, E, E)) for n in ("q_proj", "k_proj", "v_proj"))
    root = m.const(D**-0.25)
    scores = m.op("MatMul", [m.op("Mul", [q, root]), m.op("Mul", [m.op("Transpose", [k], perm=[0, 1, 3, 2]), root])])
    p = m.op("Softmax", [m.op("Add", [scores, bias])], axis=-1)
    p = m.op("Where", [m.op("IsNaN", [p]), m.const(0.0), p])
    return m.model({"y": m.linear(merged(m, m.op("MatMul", [p, v])), "out_proj", E, E)})


def test_sdpas_nan_guard_over_separate_projections_is_multi_head_attention_zeroing_nan_rows() -> None:
    """BiasedAttention(nan_to_zero) on three head splits is MultiHeadAttention(nan_to_zero): one Attention (opset
    23), which gives 0 for a row whose keys are all masked, as the guard does (row 1's queries under left padding)."""
    model = sdpa_separate_projections()
    exported, mir, fired, mha = optimized(model)
    assert {op: mir[op] for op in ("MultiHeadAttention", "BiasedAttention", "Softmax", "Where")} == \
        {"MultiHeadAttention": 1, "BiasedAttention": 0, "Softmax": 0, "Where": 1}
    assert {"onnx-attention-isnan", "multi-head-attention"} <= fired
    assert [(n.attrs["causal"], n.attrs["nan_to_zero"]) for n in mha] == [(False, True)]
    ops = Counter(n.op_type for n in exported.graph.node)
    assert (ops["Attention"], ops["Softmax"], ops["IsNaN"], ops["Transpose"]) == (1, 0, 0, 0)
    inputs = feeds(model, LEFT_PADDED)
    want = run(model, inputs)
    assert np.all(want[1, :2] != 0)  # (the output projection's bias) and rows of zeros before it
    np.testing.assert_allclose(run(exported, inputs), want, rtol=0, atol=1e-4)


def gpt_neo_attention(fill: float = LOWEST, mask: str = "where") -> onnx.ModelProto:
    """GPT-Neo: unscaled scores of separate projections, Where(causal buffer, scores, fill), then the padding mask
    added: Where(keep, 0, lowest) (``mask`` "where"), or (1 - m) * lowest of the int64 mask ("one_minus")."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [B, S, E])
    q, k, v = (heads(m, m.linear(x, n, E, E, bias=False)) for n in ("q_proj", "k_proj", "v_proj"))
    scores = m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])])
    causal = m.op("Where", [m.init("bias", np.tril(np.ones((S, S), bool))[None, None]), scores, m.const(fill)])
    if mask == "where":
        pad = padding_bias(m)
    else:
        ext = m.op("Cast", [m.op("Unsqueeze", [m.input("attention_mask", TensorProto.INT64, [B, S]), m.ints(1, 2)])],
                   to=F)
        pad = m.op("Mul", [m.op("Sub", [m.const(1.0), ext]), m.const(LOWEST)])
    p = m.op("Softmax", [m.op("Add", [causal, pad])], axis=-1)
    return m.model({"y": m.linear(merged(m, m.op("MatMul", [p, v])), "out_proj", E, E)})


@pytest.mark.parametrize("engine", ["egglog", "fallback"])
def test_a_padding_mask_added_after_the_causal_where_is_one_additive_mask(engine: str) -> None:
    """Where(causal, S, lowest) + Where(keep, 0, lowest) imports as S + (Where(causal, 0, lowest) + Where(keep, 0,
    lowest)): one MultiHeadAttention with that bias, equal in the optimization's parity check (random masks) in every
    row.  A query whose keys are all masked (left padding) weighs them as the original does in MIR; onnxruntime's
    Attention gives 0 there, as for every additive mask, so its parity is checked with right padding."""
    model = gpt_neo_attention()
    exported, mir, fired, mha = optimized(model, engine)
    assert "multi-head-attention" in fired
    assert {op: mir[op] for op in ("MultiHeadAttention", "CausalAttention", "Softmax")} == \
        {"MultiHeadAttention": 1, "CausalAttention": 0, "Softmax": 0}
    assert [(n.attrs["causal"], n.attrs["scale"]) for n in mha] == [(False, 1.0)]
    ops = Counter(n.op_type for n in exported.graph.node)
    # no Max: two lowest-filled masks sum to -inf where both mask a key, which a clamp would lift
    assert (ops["Attention"], ops["Softmax"], ops["Where"], ops["Max"]) == (1, 0, 2, 0)
    inputs = feeds(model, RIGHT_PADDED)
    np.testing.assert_allclose(run(exported, inputs), run(model, inputs), rtol=0, atol=1e-4)


@pytest.mark.parametrize(("fill", "mask"), [(-1e9, "where"), (LOWEST, "one_minus")])
def test_a_mask_after_the_causal_where_stays_apart_where_the_sum_could_differ(fill: float, mask: str) -> None:
    """A fill above -1e36 does not absorb the scores (-1e9 + S is not -1e9), and (1 - m) * lowest is positive where
    an int64 mask holds 2: the causal Where and the Add stay, the attention unfused, the values the original's."""
    model = gpt_neo_attention(fill, mask)
    exported, mir, _, _ = optimized(model)
    assert (mir["MultiHeadAttention"], mir["BiasedAttention"], mir["Softmax"]) == (0, 0, 1)
    inputs = feeds(model, RIGHT_PADDED)
    np.testing.assert_allclose(run(exported, inputs), run(model, inputs), rtol=0, atol=1e-5)


def deberta_attention(projection_bias: bool) -> onnx.ModelProto:
    """DeBERTa-v2 (dynamo): split heads flattened to [B*H, S, D]; the scores q @ (k^T / c), the keys scaled before
    the product (c = sqrt(3 D)), plus its relative-position bias [B*H, S, S]; unflattened to [B, H, S, S] and
    masked_fill(~(m_i * m_j), lowest) with the outer product of the padding mask (a padded query's row all masked);
    Softmax, the context by bmm on the flat heads.  Its projections have biases (DeBERTa's), or not."""
    m = OnnxBuilder(18)
    x = m.input("x", F, [B, S, E])
    position_bias = m.input("position_bias", F, [B * H, S, S])
    flat_q, flat_k, flat_v = (m.op("Reshape", [heads(m, m.linear(x, n, E, E, projection_bias)), m.ints(B * H, S, D)])
                              for n in ("query_proj", "key_proj", "value_proj"))
    keys = m.op("Div", [m.op("Transpose", [flat_k], perm=[0, 2, 1]), m.const(np.sqrt(3.0 * D))])
    scores = m.op("Add", [m.op("MatMul", [flat_q, keys]), position_bias])
    mask = m.input("attention_mask", TensorProto.INT64, [B, S])
    outer = m.op("Mul", [m.op("Unsqueeze", [mask, m.ints(1, 2)]), m.op("Unsqueeze", [mask, m.ints(1, 3)])])
    hidden = m.op("Not", [m.op("Cast", [outer], to=TensorProto.BOOL)])
    masked = m.op("Where", [hidden, m.const(LOWEST), m.op("Reshape", [scores, m.ints(B, H, S, S)])])
    probs = m.op("Reshape", [m.op("Softmax", [masked], axis=-1), m.ints(B * H, S, S)])
    ctx = m.op("Reshape", [m.op("MatMul", [probs, flat_v]), m.ints(B, H, S, D)])
    return m.model({"y": m.linear(merged(m, ctx), "dense", E, E)})


@pytest.mark.parametrize("projection_bias", [True, False])
def test_debertas_keys_scaled_before_the_flat_head_product_are_one_attention(projection_bias: bool) -> None:
    """The scaled transposed keys unflatten with the product, and keys divided by c give scores of scale 1/c: one
    attention whose bias is the position bias plus the mask (QkvAttention over the biased projections packed, as
    the fixed figures price it; MultiHeadAttention over unbiased ones).  A padded query's row is all the lowest
    value, which onnxruntime's opset-23 Attention would zero where the softmax weighs every key alike: the bias it
    reads is clamped to half the lowest value (one Max), and the padded rows match too.  (The egglog engine: the
    fallback fuses the flat product and the position bias added to it as FusedMatMulAdd first.)"""
    model = deberta_attention(projection_bias)
    out, report = optimize_with_report(import_model(model), target="onnxruntime", rules=RULES, verify=True)
    assert report.parity.ok
    fused = "QkvAttention" if projection_bias else "MultiHeadAttention"
    mir = Counter(out.op_counts())
    assert {op: mir[op] for op in ("QkvAttention", "MultiHeadAttention", "BiasedAttention", "Softmax")} == \
        {"QkvAttention": 0, "MultiHeadAttention": 0, "BiasedAttention": 0, "Softmax": 0, fused: 1}
    fired = {name.split("#")[0] for name, n in report.matches_per_rule.items() if n}
    assert {"flat-heads-scores-keys-div", "attn-scores-div", "unflatten-add"} <= fired
    assert [n.attrs["scale"] for n in out.nodes if n.op == fused] == [pytest.approx((3.0 * D) ** -0.5)]
    exported = export_model(out)
    ops = Counter(n.op_type for n in exported.graph.node)
    # MatMul: the three unbiased projections (the biased ones packed into Attention); the scores' product gone
    assert (ops["Attention"], ops["Softmax"], ops["MatMul"], ops["Max"], ops["Where"]) == \
        (1, 0, 0, 0, 1) if projection_bias else (1, 0, 3, 1, 1)
    launches = [sum(n.op_type not in ("Reshape", "Unsqueeze", "Identity", "Constant") for n in g.graph.node)
                for g in (exported, model)]
    assert launches[0] < launches[1], launches
    inputs = feeds(model, RIGHT_PADDED)
    np.testing.assert_allclose(run(exported, inputs), run(model, inputs), rtol=0, atol=1e-4)
