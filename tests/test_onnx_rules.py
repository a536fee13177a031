"""Recognition rules for the forms PyTorch's exporters write (rules/attention.egg, rules/export_forms.egg,
rules/onnx): each form built with onnx.helper, imported, optimized in both engines with exact fused-op counts
and the rules that fired, then exported (Attention and RotaryEmbedding of opset 23, Gemm on rows) and run in
onnxruntime against the original model within 1e-4."""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import calibrations
from onnx_models import MODELS, OnnxBuilder, feeds
from rlx_egraph.cost import TARGETS
from rlx_egraph.frontends.onnx.compare import op_counts, session
from rlx_egraph.onnx import export_model, import_model, onnx_rules
from rlx_egraph.optimize import optimize_with_report

F = TensorProto.FLOAT
RULES = onnx_rules()
ENGINES = ("egglog", "fallback")
B, H, S, D = 2, 4, 5, 8


@pytest.fixture(autouse=True, scope="module")
def _onnxruntime_priced_uniformly() -> Iterator[None]:
    """The onnxruntime target these tests assert decisions on is priced by fixed figures
    (tests/calibrations.py), not by the shipped calibration, which measuring again changes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TARGETS, "onnxruntime", calibrations.UNIFORM)
        yield


def optimized(model: onnx.ModelProto, engine: str) -> tuple[onnx.ModelProto, Counter[str], set[str]]:
    """The exported optimization of ``model`` (target onnxruntime, parity verified), its MIR op counts and
    the rules that matched (operand orders under their base names)."""
    out, report = optimize_with_report(import_model(model), target="onnxruntime", rules=RULES, engine=engine,
                                       verify=True)
    assert report.parity.ok
    fired = {name.split("#")[0] for name, n in report.matches_per_rule.items() if n}
    return export_model(out), Counter(out.op_counts()), fired


def ort_run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]


def onnx_ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node)


def inputs_of(model: onnx.ModelProto, mask_row: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Seeded normal floats; a [B, S] mask keeps every key of row 0 and ``mask_row`` (default: all but the
    last two keys) in row 1."""
    rng = np.random.default_rng(1)
    out = {}
    for info in model.graph.input:
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        elem = info.type.tensor_type.elem_type
        if elem == F:
            out[info.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            keep = np.ones(shape, bool)
            keep[1] = mask_row if mask_row is not None else np.arange(shape[1]) < shape[1] - 2
            out[info.name] = keep.astype(onnx.helper.tensor_dtype_to_np_dtype(elem))
    return out


# --- attention -------------------------------------------------------------------------------------------


def attention_model(scores: str, keys: str, mask: str, kv_heads: int = H, nan_to_zero: bool = False,
                    mask_first: bool = False, repeat_kv: bool = True) -> onnx.ModelProto:
    """Softmax(scores + mask) @ v on split heads as the exporters write it.

    scores: "div" (/ sqrt D), "mul" (* D^-0.5), "sdpa" (q and k^T each * D^-0.25), "plain" (T5: no scale).
    keys: k^T as "t" (Transpose 0 1 3 2 of k [B, KV, S, D]), "heads_last" (Transpose 0 2 3 1 of k [B, S, KV, D])
    "flat" (Reshape, Transpose 0 2 1, Reshape through [B*H, S, D]) or "flat_merged" (the dynamo exporter's under sdpa:
    repeat_kv's Expand reshaped straight to [B*H, S, D], then the same).  mask: "bert" ((1 - m) * -10000 of an
    int64 attention_mask), "bool" (sdpa: Where(m, 0, -inf)), "float4d" (a [B, 1, S, S] additive input), "two"
    (T5: a [1, H, S, S] position bias, then the BERT mask), "causal" (a static sdpa export's mask folded to a
    constant [S, S] of 0 and -inf) or "none".  kv_heads < H repeats K/V as repeat_kv
    does, or (not ``repeat_kv``, kv_heads 1: multi-query attention) broadcasts them.
    """
    m = OnnxBuilder(17)
    q = m.input("q", F, [B, H, S, D])
    k = m.input("k", F, [B, S, kv_heads, D] if keys == "heads_last" else [B, kv_heads, S, D])
    v = m.input("v", F, [B, kv_heads, S, D])

    def repeat(t: str, shape: tuple[int, ...] = (B, H, S, D)) -> str:
        if not repeat_kv:  # (keys "t" only)
            return t
        grown = m.op("Expand", [m.op("Unsqueeze", [t, m.ints(2)]), m.ints(B, kv_heads, H // kv_heads, S, D)])
        return m.op("Reshape", [grown, m.ints(*shape)])

    if keys == "heads_last":  # (no repeat_kv: its k is not split yet)
        kt = m.op("Transpose", [k], perm=[0, 2, 3, 1])
    elif keys == "flat_merged":
        flat = repeat(k, (B * H, S, D)) if kv_heads != H else m.op("Reshape", [k, m.ints(B * H, S, D)])
        kt = m.op("Reshape", [m.op("Transpose", [flat], perm=[0, 2, 1]), m.ints(B, H, D, S)])
    else:
        k = repeat(k) if kv_heads != H else k
        if keys == "t":
            kt = m.op("Transpose", [k], perm=[0, 1, 3, 2])
        else:
            flat = m.op("Transpose", [m.op("Reshape", [k, m.ints(B * H, S, D)])], perm=[0, 2, 1])
            kt = m.op("Reshape", [flat, m.ints(B, H, D, S)])
    v = repeat(v) if kv_heads != H else v
    if scores == "sdpa":
        root = m.const(D**-0.25)
        s = m.op("MatMul", [m.op("Mul", [q, root]), m.op("Mul", [kt, root])])
    else:
        s = m.op("MatMul", [q, kt])
        if scores == "div":
            s = m.op("Div", [s, m.const(math.sqrt(D))])
        elif scores == "mul":
            s = m.op("Mul", [s, m.const(D**-0.5)])
    if mask == "none":
        bias = None
    elif mask == "float4d":
        bias = m.input("bias", F, [B, 1, S, S])
    elif mask == "causal":
        bias = m.const(np.where(np.tril(np.ones((S, S), bool)), 0.0, -np.inf))
    elif mask == "bool":
        keep = m.op("Unsqueeze", [m.input("attention_mask", TensorProto.BOOL, [B, S]), m.ints(1, 2)])
        bias = m.op("Where", [keep, m.const(0.0), m.const(-np.inf)])
    else:
        ext = m.op("Cast", [m.op("Unsqueeze", [m.input("attention_mask", TensorProto.INT64, [B, S]), m.ints(1, 2)])],
                   to=F)
        bias = m.op("Mul", [m.op("Sub", [m.const(1.0), ext]), m.const(-10000.0)])
    if mask == "two":
        s = m.op("Add", [s, m.weight("position_bias", 1, H, S, S)])
    p = m.op("Softmax", [s if bias is None else m.op("Add", [bias, s] if mask_first else [s, bias])], axis=-1)
    if nan_to_zero:
        p = m.op("Where", [m.op("IsNaN", [p]), m.const(0.0), p])
    return m.model({"y": m.op("MatMul", [p, v])})


ATTENTION_CASES = {  # case -> (model arguments, rules that must fire)
    "bert-div-gqa": (("div", "t", "bert", 2), {"attn-keys-t", "attn-scores", "attn-scores-div", "attn-repeat-kv",
                                                "biased-attention", "biased-attention-gqa"}),
    "mask-first-mul-heads-last": (("mul", "heads_last", "float4d", H, False, True),
                                  {"attn-keys-heads-last", "attn-scores-bt", "attn-scores-mul",
                                   "biased-attention"}),
    "sdpa-flat-isnan": (("sdpa", "flat", "bool", H, True), {"flat-swap-last-heads", "attn-scores-sdpa",
                                                            "onnx-attention-isnan"}),
    "sdpa-heads-last-isnan": (("sdpa", "heads_last", "bool", H, True),
                              {"attn-keys-heads-last-sdpa", "attn-scores-bt", "onnx-attention-isnan"}),
    "sdpa-isnan-gqa": (("sdpa", "t", "bool", 2, True), {"attn-scores-sdpa", "onnx-attention-isnan",
                                                        "biased-attention-gqa"}),
    "sdpa-flat-isnan-gqa": (("sdpa", "flat", "bool", 2, True), {"flat-swap-last-heads", "onnx-attention-isnan",
                                                                "biased-attention-gqa"}),
    "sdpa-flat-merged-gqa": (("sdpa", "flat_merged", "bool", 2, True),
                             {"flat-swap-last", "attn-repeat-kv", "onnx-attention-isnan", "biased-attention-gqa"}),
    "sdpa-flat-merged-mqa": (("sdpa", "flat_merged", "bool", 1, True), {"flat-swap-last", "attn-repeat-kv",
                                                                        "biased-attention-gqa"}),
    "sdpa-causal-isnan": (("sdpa", "t", "causal", H, True), {"onnx-causal-where", "onnx-attention-causal-isnan"}),
    "t5-plain-two-masks": (("plain", "t", "two"), {"attn-scores", "biased-attention-two-masks"}),
    "mqa-broadcast-div": (("div", "t", "bert", 1, False, False, False), {"attn-split-qk-mqa", "biased-attention"}),
    "mqa-broadcast-sdpa": (("sdpa", "t", "bool", 1, True, False, False), {"attn-split-qk-mqa",
                                                                           "onnx-attention-isnan"}),
    "unmasked-mul-heads-last": (("mul", "heads_last", "none"), {"attn-keys-heads-last", "unmasked-attention"}),
    "unmasked-mqa-sdpa": (("sdpa", "t", "none", 1, False, False, False), {"attn-split-qk-mqa",
                                                                          "unmasked-attention"}),
}
ATTENTION_RUNS = [(case, engine) for case in sorted(ATTENTION_CASES) for engine in ENGINES]
# The fallback runs the stages once in order, so the flat keys are simplified (merged) before the attention is
# recognized: its route goes through the merged form's rule.
FALLBACK_ROUTES = {"sdpa-flat-isnan-gqa": {"flat-swap-last", "onnx-attention-isnan", "biased-attention-gqa"}}


@pytest.mark.parametrize(("case", "engine"), ATTENTION_RUNS)
def test_attention_forms_become_one_biased_attention_and_one_onnx_attention(case: str, engine: str) -> None:
    args, rules = ATTENTION_CASES[case]
    if engine == "fallback":
        rules = FALLBACK_ROUTES.get(case, rules)
    model = attention_model(*args)
    exported, mir, fired = optimized(model, engine)
    assert {op: mir[op] for op in ("BiasedAttention", "Softmax", "MatMul", "Expand")} == \
        {"BiasedAttention": 1, "Softmax": 0, "MatMul": 0, "Expand": 0}
    assert rules <= fired, rules - fired
    ops = onnx_ops(exported)
    assert (ops["Attention"], ops["Softmax"], ops["MatMul"]) == (1, 0, 0)
    inputs = inputs_of(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


def test_sdpa_rows_whose_keys_are_all_masked_give_zeros_like_the_export() -> None:
    """Where(IsNaN(p), 0, p) zeroes a row whose keys are all masked; BiasedAttention(nan_to_zero) and the
    exported Attention do the same."""
    model = attention_model("sdpa", "t", "bool", nan_to_zero=True)
    exported, mir, _ = optimized(model, "egglog")
    inputs = inputs_of(model, mask_row=np.zeros(S, bool))
    want = ort_run(model, inputs)
    assert np.all(want[1] == 0) and mir["BiasedAttention"] == 1
    np.testing.assert_allclose(ort_run(exported, inputs), want, rtol=0, atol=1e-4)


def test_softmax_without_the_nan_guard_is_not_the_nan_to_zero_kernel() -> None:
    """Without Where(IsNaN) the op keeps the Softmax's meaning (nan_to_zero false)."""
    out, _ = optimize_with_report(import_model(attention_model("div", "t", "bool")), target="onnxruntime",
                                  rules=RULES, verify=True)
    (attn,) = [n for n in out.nodes if n.op == "BiasedAttention"]
    assert attn.attrs == {"scale": pytest.approx(D**-0.5), "nan_to_zero": False}


def test_a_mask_that_grows_the_scores_is_not_taken() -> None:
    """A bias [B, H, S, S, 1]-like mask that broadcasts the scores to a larger shape stays a Softmax."""
    m = OnnxBuilder(17)
    q, k, v = (m.input(n, F, [1, 2, S, D]) for n in "qkv")
    s = m.op("Div", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(math.sqrt(D))])
    p = m.op("Softmax", [m.op("Add", [s, m.input("bias", F, [3, 1, S, S])])], axis=-1)
    out, _ = optimize_with_report(import_model(m.model({"y": m.op("MatMul", [p, v])})), target="onnxruntime",
                                  rules=RULES, verify=True)
    assert (out.op_counts()["BiasedAttention"], out.op_counts()["Softmax"]) == (0, 1)


# --- RoPE rotate-half ---------------------------------------------------------------------------------------


def rope_model(tables: str, swapped: bool = False) -> onnx.ModelProto:
    """x * cos + rotate_half(x) * sin on [B, H, S, D] (Add and Mul operands swapped when ``swapped``), cos and
    sin [1, 1, S, D] computed from inv_freq and Range ("computed"), folded initializers ("folded"), or
    initializers whose halves differ ("other"), which RotaryEmbedding(opset 23) cannot take."""
    m = OnnxBuilder(18)
    x = m.input("x", F, [B, H, S, D])
    if tables == "computed":
        positions = m.op("Cast", [m.op("Range", [m.const(0, np.int64), m.const(S, np.int64), m.const(1, np.int64)])],
                         to=F)
        inv_freq = m.init("inv_freq", 1.0 / 10000.0 ** (np.arange(0, D, 2, dtype=np.float32) / D))
        freqs = m.op("Mul", [m.op("Unsqueeze", [positions, m.ints(1)]), m.op("Unsqueeze", [inv_freq, m.ints(0)])])
        emb = m.op("Concat", [freqs, freqs], axis=-1)
        cos, sin = (m.op("Unsqueeze", [m.op(f, [emb]), m.ints(0, 1)]) for f in ("Cos", "Sin"))
    else:
        angles = np.arange(S)[:, None] * np.linspace(0.1, 1.0, D // 2)[None, :]
        both = np.concatenate([angles, angles if tables == "folded" else 2 * angles], axis=-1)[None, None]
        cos, sin = (m.init(n, f(both).astype(np.float32)) for n, f in (("cos", np.cos), ("sin", np.sin)))
    first = m.op("Slice", [x, m.ints(0), m.ints(D // 2), m.ints(3)])
    second = m.op("Slice", [x, m.ints(D // 2), m.ints(2**62), m.ints(3)])
    rotated = m.op("Concat", [m.op("Neg", [second]), first], axis=-1)
    terms = [m.op("Mul", [cos, x] if swapped else [x, cos]), m.op("Mul", [sin, rotated] if swapped else [rotated, sin])]
    return m.model({"y": m.op("Add", terms[::-1] if swapped else terms)})


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("tables", "swapped", "onnx_rotary"), [("computed", False, 1), ("folded", True, 1),
                                                                 ("other", False, 0)])
def test_rotate_half_rope_is_one_rotary_embedding(tables: str, swapped: bool, onnx_rotary: int, engine: str) -> None:
    """One RotaryEmbedding in MIR whatever the tables; exported as RotaryEmbedding (opset 23) when the tables have
    its form (equal halves, the same for every head), else as the unfused form; the values match either way."""
    model = rope_model(tables, swapped)
    exported, mir, fired = optimized(model, engine)
    assert {op: mir[op] for op in ("RotaryEmbedding", "Concat", "Neg", "Mul", "Add")} == \
        {"RotaryEmbedding": 1, "Concat": 0, "Neg": 0, "Mul": 0, "Add": 0}
    assert "rope-rotate-half" in fired
    ops = onnx_ops(exported)
    assert (ops["RotaryEmbedding"], ops["Neg"]) == (onnx_rotary, 1 - onnx_rotary)
    inputs = inputs_of(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


# --- BERT embeddings -----------------------------------------------------------------------------------------

VOCAB, POSITIONS, WIDTH, PAD = 50, 32, 16, 1


def bert_embeddings_model(token_type: str = "buffer", positions: str = "buffer") -> onnx.ModelProto:
    """Word Gather of input_ids + token-type Gather + position Gather, then the decomposed LayerNorm (TorchScript,
    opset 14); position ids and (token_type "buffer") zero token-type ids are windows of constant buffers,
    (token_type "ids") the token-type ids an int64 input, or (token_type "input") the token-type term a float
    input; (positions "cumsum") RoBERTa's position ids from the padding: CumSum(ids != pad) * (ids != pad) + pad."""
    m = OnnxBuilder(14)
    ids = m.input("input_ids", TensorProto.INT64, [B, S])

    def window(buffer: np.ndarray) -> str:
        return m.op("Slice", [m.const(buffer, np.int64), m.ints(0), m.ints(S), m.ints(1)])

    if token_type == "buffer":
        token_type_ids = m.op("Expand", [window(np.zeros((1, POSITIONS))), m.ints(B, S)])
        types = m.op("Gather", [m.weight("token_type_embeddings", 2, WIDTH), token_type_ids])
    elif token_type == "ids":
        types = m.op("Gather", [m.weight("token_type_embeddings", 2, WIDTH),
                                m.input("token_type_ids", TensorProto.INT64, [B, S])])
    elif token_type == "input":
        types = m.input("token_type", F, [B, S, WIDTH])
    words = m.op("Gather", [m.weight("word_embeddings", VOCAB, WIDTH), ids])
    x = words if token_type == "none" else m.op("Add", [words, types])
    if positions == "cumsum":
        keep = m.op("Cast", [m.op("Not", [m.op("Equal", [ids, m.const(PAD, np.int64)])])], to=TensorProto.INT32)
        counted = m.op("Mul", [m.op("CumSum", [keep, m.const(1, np.int32)]), keep])
        position_ids = m.op("Add", [m.op("Cast", [counted], to=TensorProto.INT64), m.const(PAD, np.int64)])
    else:
        position_ids = window(np.arange(POSITIONS)[None])
    x = m.op("Add", [x, m.op("Gather", [m.weight("position_embeddings", POSITIONS, WIDTH), position_ids])])
    return m.model({"y": m.layer_norm_decomposed(x, "LayerNorm", WIDTH)})


def embeddings_inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    ids = {"input_ids": rng.integers(0, VOCAB, (B, S)), "token_type_ids": rng.integers(0, 2, (B, S))}
    return inputs_of(model) | {name: ids[name] for name in ids if name in {i.name for i in model.graph.input}}


@pytest.mark.parametrize("engine", ENGINES)
def test_bert_embeddings_are_one_embed_layer_normalization(engine: str) -> None:
    """The constant token-type and position gathers fold; Gather, Add, Add, LayerNorm become EmbedLayerNorm,
    exported as Cast (int64 ids to int32) and com.microsoft EmbedLayerNormalization: 2 launches, not 4."""
    model = bert_embeddings_model()
    exported, mir, fired = optimized(model, engine)
    assert {op: mir[op] for op in ("EmbedLayerNorm", "Embedding", "Add", "LayerNorm")} == \
        {"EmbedLayerNorm": 1, "Embedding": 0, "Add": 0, "LayerNorm": 0}
    assert "embed-layer-norm" in fired
    assert onnx_ops(exported) == Counter({"Cast": 1, "EmbedLayerNormalization": 1, "Identity": 1})
    assert op_counts(exported)[1] == 2
    inputs = embeddings_inputs(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_bert_embeddings_with_token_type_ids_at_run_time_are_one_embed_layer_normalization(engine: str) -> None:
    """token_type_ids an input (BERT's usual export): its Gather is EmbedLayerNormalization's segment term
    (segment_ids and segment_embedding): Cast, Cast (both ids to int32), EmbedLayerNormalization, not Gather x2,
    Add x2 and LayerNormalization."""
    model = bert_embeddings_model(token_type="ids")
    exported, mir, fired = optimized(model, engine)
    assert (mir["EmbedLayerNorm"], mir["Embedding"], mir["Add"], mir["LayerNorm"]) == (1, 1, 0, 0)
    assert "embed-layer-norm" in fired
    assert onnx_ops(exported) == Counter({"Cast": 2, "EmbedLayerNormalization": 1, "Identity": 1})
    (node,) = [n for n in exported.graph.node if n.op_type == "EmbedLayerNormalization"]
    # (the two gathers add alike: either may be the word term, the other the segment term)
    assert {node.input[2], node.input[4]} == {"word_embeddings", "token_type_embeddings"} and node.input[1]
    inputs = embeddings_inputs(model)
    assert inputs["token_type_ids"].any() and not inputs["token_type_ids"].all()
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_distilbert_embeddings_without_token_types_are_one_embed_layer_normalization(engine: str) -> None:
    """Word and position gathers only (DistilBERT): EmbedLayerNorm without a second term, exported as Cast and
    EmbedLayerNormalization without segment inputs: 2 launches, not Gather x2, Add and LayerNormalization."""
    model = bert_embeddings_model(token_type="none")
    exported, mir, fired = optimized(model, engine)
    assert {op: mir[op] for op in ("EmbedLayerNorm", "Embedding", "Add", "LayerNorm")} == \
        {"EmbedLayerNorm": 1, "Embedding": 0, "Add": 0, "LayerNorm": 0}
    assert "embed-layer-norm-one-term" in fired and "embed-layer-norm" not in fired
    assert onnx_ops(exported) == Counter({"Cast": 1, "EmbedLayerNormalization": 1, "Identity": 1})
    (node,) = [n for n in exported.graph.node if n.op_type == "EmbedLayerNormalization"]
    assert (node.input[1], node.input[2], node.input[4]) == ("", "word_embeddings", "")
    inputs = embeddings_inputs(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_roberta_embeddings_with_cumsum_positions_are_one_embed_layer_normalization(engine: str) -> None:
    """Position ids computed at run time from the padding (CumSum) and token_type_ids an input: the two gathers
    are EmbedLayerNormalization's position term (position_embedding by position_ids) and segment term; the
    position ids' own computation stays (Equal, Not, Cast, CumSum, Mul, Cast, Add, and Casts to int32)."""
    model = bert_embeddings_model(token_type="ids", positions="cumsum")
    exported, mir, fired = optimized(model, engine)
    assert (mir["EmbedLayerNorm"], mir["LayerNorm"]) == (1, 0) and "embed-layer-norm" in fired
    ops = onnx_ops(exported)
    assert (ops["EmbedLayerNormalization"], ops["Gather"], ops["LayerNormalization"], ops["CumSum"]) == (1, 0, 0, 1)
    (node,) = [n for n in exported.graph.node if n.op_type == "EmbedLayerNormalization"]
    assert len(node.input) == 9 and node.input[8] and node.input[3] == "position_embeddings"
    inputs = embeddings_inputs(model)
    inputs["input_ids"][1, -2:] = PAD  # padded keys: their positions stay at the pad index
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


def test_embeddings_with_a_term_known_only_at_run_time_export_unfused() -> None:
    """EmbedLayerNormalization takes one position table for every batch row: a token-type term that is an
    input is not one, so EmbedLayerNorm exports as its decomposition (and computes the same)."""
    model = bert_embeddings_model(token_type="input")
    exported, mir, _ = optimized(model, "egglog")
    assert mir["EmbedLayerNorm"] == 1
    ops = onnx_ops(exported)
    # the last sum is read only by the LayerNormalization: written as Sum (see test_onnx_export.py)
    assert (ops["EmbedLayerNormalization"], ops["Gather"], ops["Add"], ops["Sum"], ops["LayerNormalization"]) == (
        0, 1, 1, 1, 1)
    inputs = embeddings_inputs(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


# --- RMSNorm as 1 / Sqrt, linear layers on rows -------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_rms_norm_with_one_over_sqrt_weight_first_is_one_norm(engine: str) -> None:
    """TorchScript writes rsqrt as Div(1, Sqrt(.)); Llama multiplies by the weight first."""
    m = OnnxBuilder(14)
    x = m.input("x", F, [B, S, 16])
    var = m.op("ReduceMean", [m.op("Pow", [x, m.const(2.0)])], axes=[-1])
    inv = m.op("Div", [m.const(1.0), m.op("Sqrt", [m.op("Add", [var, m.const(1e-6)])])])
    model = m.model({"y": m.op("Mul", [m.weight("norm.weight", 16), m.op("Mul", [x, inv])])})
    exported, mir, fired = optimized(model, engine)
    assert (mir["RmsNorm"], mir["ReduceMean"], mir["Div"]) == (1, 0, 0)
    assert "rms-one-div-sqrt" in fired
    assert onnx_ops(exported)["SimplifiedLayerNormalization"] == 1
    inputs = inputs_of(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_dynamo_gelu_form_is_one_bias_gelu(engine: str) -> None:
    """dynamo writes erf GELU as Mul(x, Mul(0.5, Add(Erf(Div(x, 1.4142135)), 1))) on x = MatMul + bias."""
    m = OnnxBuilder(18)
    x = m.linear(m.input("x", F, [B, S, 16]), "fc", 16, 32)
    erf = m.op("Erf", [m.op("Div", [x, m.const(1.4142135)])])
    model = m.model({"y": m.op("Mul", [x, m.op("Mul", [m.const(0.5), m.op("Add", [erf, m.const(1.0)])])])})
    exported, mir, fired = optimized(model, engine)
    assert (mir["FusedMatMulBiasAct"], mir["Erf"], mir["Mul"]) == (1, 0, 0)
    assert "gelu-erf-x-by-half-o" in fired
    ops = onnx_ops(exported)
    assert (ops["BiasGelu"], ops["MatMul"], ops["Erf"], ops["Mul"]) == (1, 1, 0, 0)
    inputs = inputs_of(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("association", ["x_o_half", "x_half_o", "x_by_half_o", "half_x_o"])
def test_tanh_gelu_in_every_association_is_one_fast_gelu(association: str, engine: str) -> None:
    """x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) on x = MatMul + bias, its product in each
    association ((x * O) * 0.5, (x * 0.5) * O, x * (0.5 * O), (0.5 * x) * O): one FastGelu(bias)."""
    m = OnnxBuilder(18)
    x = m.linear(m.input("x", F, [B, S, 16]), "fc", 16, 32)
    inner = m.op("Add", [x, m.op("Mul", [m.const(0.044715), m.op("Pow", [x, m.const(3.0)])])])
    o = m.op("Add", [m.const(1.0), m.op("Tanh", [m.op("Mul", [m.const(math.sqrt(2 / math.pi)), inner])])])
    half = m.const(0.5)
    y = {"x_o_half": lambda: m.op("Mul", [m.op("Mul", [x, o]), half]),
         "x_half_o": lambda: m.op("Mul", [m.op("Mul", [x, half]), o]),
         "x_by_half_o": lambda: m.op("Mul", [x, m.op("Mul", [half, o])]),
         "half_x_o": lambda: m.op("Mul", [m.op("Mul", [half, x]), o])}[association]()
    model = m.model({"y": y})
    exported, mir, fired = optimized(model, engine)
    assert (mir["FusedMatMulBiasAct"], mir["Tanh"], mir["Mul"], mir["Pow"]) == (1, 0, 0, 0)
    assert {"gelu-tanh-one", "matmul-bias-gelu-tanh"} <= fired
    ops = onnx_ops(exported)
    assert (ops["FastGelu"], ops["MatMul"], ops["Tanh"], op_counts(exported)[1]) == (1, 1, 0, 2)
    inputs = inputs_of(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


@pytest.mark.parametrize("addend", ["bias", "residual"])
def test_a_batched_linear_layer_exports_as_one_gemm_on_rows(addend: str) -> None:
    """x [B, S, K] @ w + bias (or + a residual of the result's shape) is Reshape, Gemm, Reshape: one kernel."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [B, S, 16])
    other = m.weight("b", 8, scale=0.1) if addend == "bias" else m.input("r", F, [B, S, 8])
    model = m.model({"y": m.op("Add", [m.op("MatMul", [x, m.weight("w", 16, 8)]), other])})
    exported, _, _ = optimized(model, "egglog")
    ops = onnx_ops(exported)
    assert (ops["Gemm"], ops["MatMul"], ops["Add"]) == (1, 0, 0)
    inputs = inputs_of(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


def gemm_bt_model(rows: bool) -> onnx.ModelProto:
    """Linear layers as Gemm(transB=1) with a 1-D bias, weights [out, in]: a pooler (Gemm on [B, E], Tanh) or
    (``rows``) an OPT-style FFN on the rows of [B, S, E] (Reshape, Gemm, Relu, Gemm, Reshape)."""
    m = OnnxBuilder(17)
    x = m.op("Reshape", [m.input("x", F, [B, S, 16]), m.ints(-1, 16)]) if rows else m.input("x", F, [B, 16])

    def gemm(t: str, name: str, n_in: int, n_out: int) -> str:
        return m.op("Gemm", [t, m.weight(f"{name}.weight", n_out, n_in), m.weight(f"{name}.bias", n_out, scale=0.1)],
                    transB=1)

    if rows:
        y = gemm(m.op("Relu", [gemm(x, "fc1", 16, 32)]), "fc2", 32, 16)
        return m.model({"y": m.op("Reshape", [y, m.ints(B, S, 16)])})
    return m.model({"y": m.op("Tanh", [gemm(x, "pooler.dense", 16, 16)])})


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("rows", [False, True])
def test_gemm_with_transposed_weights_and_a_bias_round_trips_as_one_gemm(rows: bool, engine: str) -> None:
    """Gemm(transB=1) + bias imports as MatMulBT + Add, fuses to FusedMatMulBTAdd and exports as one Gemm again:
    as many launches out as in."""
    model = gemm_bt_model(rows)
    exported, mir, fired = optimized(model, engine)
    gemms = 2 if rows else 1
    assert (mir["FusedMatMulBTAdd"], mir["MatMulBT"], mir["Add"]) == (gemms, 0, 0)
    assert "matmul-bt-add" in fired
    ops = onnx_ops(exported)
    assert (ops["Gemm"], ops["MatMul"], ops["Add"], ops["Transpose"]) == (gemms, 0, 0, 0)
    assert op_counts(exported)[1] == op_counts(model)[1] == gemms + 1
    inputs = inputs_of(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


def packed_pieces_model(cut: str) -> onnx.ModelProto:
    """One packed projection x @ w [B, S, 24] cut in two along the last axis as the exporters write it:
    "even" Split(num_outputs=2) (dynamo, opset 18, w [16, 32]), "uneven" Split with sizes [8, 16], "slices"
    two Slices [0, 8) and [8, 24); Relu of the first piece, Tanh of the second."""
    m = OnnxBuilder(18)
    width = 32 if cut == "even" else 24
    packed = m.op("MatMul", [m.input("x", F, [B, S, 16]), m.weight("w", 16, width)])
    if cut == "even":
        first, second = m.op("Split", [packed], outputs=2, axis=-1, num_outputs=2)
    elif cut == "uneven":
        first, second = m.op("Split", [packed, m.ints(8, 16)], outputs=2, axis=2)
    else:
        first = m.op("Slice", [packed, m.ints(0), m.ints(8), m.ints(-1)])
        second = m.op("Slice", [packed, m.ints(8), m.ints(24), m.ints(-1)])
    return m.model({"y": m.op("Relu", [first]), "z": m.op("Tanh", [second])})


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("cut", ["even", "uneven", "slices"])
def test_the_pieces_of_one_tensor_export_as_one_split(cut: str, engine: str) -> None:
    """A Split imports as Narrows (one per piece) and exports as one Split again, as do Slices that cut one
    tensor along one axis without overlapping: MatMul, Split, Relu, Tanh (4 launches)."""
    model = packed_pieces_model(cut)
    exported, mir, _ = optimized(model, engine)
    assert mir["Narrow"] == 2
    ops = onnx_ops(exported)
    assert (ops["Split"], ops["Slice"], ops["MatMul"]) == (1, 0, 1)
    assert op_counts(exported)[1] == 4 == op_counts(model)[1] - (cut == "slices")
    inputs = inputs_of(model)
    session_in, session_out = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                               for m in (model, exported))
    for want, got in zip(session_in.run(None, inputs), session_out.run(None, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_narrows_that_overlap_export_as_slices() -> None:
    """Pieces [0, 16) and [8, 24) share elements: no Split has them as outputs, so they stay two Slices."""
    m = OnnxBuilder(18)
    packed = m.op("MatMul", [m.input("x", F, [B, S, 16]), m.weight("w", 16, 24)])
    first = m.op("Slice", [packed, m.ints(0), m.ints(16), m.ints(-1)])
    second = m.op("Slice", [packed, m.ints(8), m.ints(24), m.ints(-1)])
    model = m.model({"y": m.op("Relu", [first]), "z": m.op("Tanh", [second])})
    exported, _, _ = optimized(model, "egglog")
    assert (onnx_ops(exported)["Split"], onnx_ops(exported)["Slice"]) == (0, 2)


# --- the export-form layers against onnxruntime's own optimizer ---------------------------------------------

SHAPES = {"bert": {"hidden_states": (2, 5, 16), "attention_mask": (2, 5)}, "gpt2": {"hidden_states": (2, 5, 16)},
          "llama": {"hidden_states": (2, 5, 16)}, "sdpa": {"hidden_states": (2, 5, 16), "attention_mask": (2, 5)}}
LAUNCHES = {"bert": 13, "gpt2": 9, "llama": 18, "sdpa": 7}  # ours; compare.op_counts counts Transpose and Cast


@pytest.mark.parametrize("name", sorted(LAUNCHES))
def test_layers_take_fewer_launches_than_onnxruntime_enable_all(name: str) -> None:
    model = MODELS[name]()
    out, _ = optimize_with_report(import_model(model, SHAPES[name]), target="onnxruntime", rules=RULES,
                                       verify=True)
    exported = export_model(out)
    with tempfile.TemporaryDirectory() as tmp:
        session(model, "ORT_ENABLE_ALL", str(Path(tmp) / "all.onnx"))
        theirs = op_counts(onnx.load(str(Path(tmp) / "all.onnx")))[1]
    assert op_counts(exported)[1] == LAUNCHES[name] < theirs
    inputs = feeds(model, SHAPES[name])
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)


def vit_attention(hidden: int = 16, heads: int = 2) -> onnx.ModelProto:
    """ViT self-attention as the TorchScript exporter writes it: no mask, keys split heads-last (Transpose
    0 2 3 1 of [B, S, H, D]), the scores multiplied by D^-0.5, Q/K/V each a MatMul + Add of the hidden state."""
    m = OnnxBuilder(14)
    x = m.input("hidden_states", F, [B, S, hidden])
    hd = hidden // heads
    q, k, v = (m.linear(x, f"attention.{n}", hidden, hidden) for n in ("query", "key", "value"))  # module order
    q, v = m.split_heads(q, heads, hd), m.split_heads(v, heads, hd)
    k = m.op("Reshape", [k, m.ints(B, S, heads, hd)])
    scores = m.op("Mul", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 2, 3, 1])]), m.const(hd**-0.5)])
    ctx = m.merge_heads(m.op("MatMul", [m.op("Softmax", [scores], axis=-1), v]), hidden)
    return m.model({"out": m.linear(ctx, "output.dense", hidden, hidden)})


def test_vit_unmasked_attention_over_the_qkv_projections_is_one_contrib_attention() -> None:
    """The egglog engine only: the fallback matches on the graph and the heads-last keys K4 = Transpose(K,
    0 2 1 3) are a term that a facts rule (attn-keys-heads-last) builds, not a graph node, so packed-heads
    does not see them there (it stays MatMul, Softmax, MatMul, verified)."""
    model = vit_attention()
    exported, counts, fired = optimized(model, "egglog")
    assert {op: counts[op] for op in ("QkvAttention", "Softmax", "MatMul", "Transpose", "Narrow")} == {
        "QkvAttention": 1, "Softmax": 0, "MatMul": 0, "Transpose": 0, "Narrow": 0}
    assert {"shared-input-linear", "qkv-projection", "packed-heads", "qkv-attention-plain"} <= fired
    ops = onnx_ops(exported)
    assert (ops["Attention"], ops["Gemm"], op_counts(exported)[1]) == (1, 1, 2)  # the output projection
    (attention,) = [n for n in exported.graph.node if n.op_type == "Attention"]
    assert attention.domain == "com.microsoft" and attention.input[5:] in ([], [""])
    inputs = inputs_of(model)
    np.testing.assert_allclose(ort_run(exported, inputs), ort_run(model, inputs), rtol=0, atol=1e-4)
