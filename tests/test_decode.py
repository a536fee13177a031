"""Decoding with a KV cache: a decoder-with-past step (past_key_values in, present out, sequence 1) imports,
its attention over Concat(past, new) becomes one KvCacheAttention (Attention, opset 23, with past) or, with
the head split, RoPE and head merge around it, one GroupQueryAttention (com.microsoft, RoPE inside)
(rules/decode.egg), in parity with the unfused export at several past lengths."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import calibrations
from onnx_models import decode_step
from rlx_egraph import Graph, evaluate
from rlx_egraph.cost import TARGETS
from rlx_egraph.cost.calibration import OpRate
from rlx_egraph.ir.decompose import decompose
from rlx_egraph.onnx import export_model, import_model, onnx_rules
from rlx_egraph.optimize import optimize_with_report

RULES = onnx_rules()
PAST_LENGTHS = (1, 7, 30)
ENGINES = ("egglog", "fallback")
# (heads, kv_heads, rope, concat axis, hidden, grouped query): GQA with RoPE (Llama, Qwen2) by repeat_kv or by the
# query grouped per key head (sdpa), MQA, multi-head without RoPE (GPT-2)
FORMS = {"gqa-rope": (4, 2, True, 2, 64, False), "gqa-rope-grouped-query": (4, 2, True, -2, 64, True),
         "mqa-rope": (4, 1, True, -2, 64, False), "mha": (2, 2, False, -2, 16, False)}


@pytest.fixture(autouse=True, scope="module")
def _onnxruntime_priced_uniformly() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TARGETS, "onnxruntime", calibrations.UNIFORM)
        yield


def step_inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Seeded normal floats; the mask keeps every key but the first of batch row 1 (left padding)."""
    rng = np.random.default_rng(3)
    out = {}
    for info in model.graph.input:
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        if info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            out[info.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            keep = np.ones(shape, np.int64)
            keep[1, 0] = 0
            out[info.name] = keep
    return out


def run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in model.graph.output], session.run(None, inputs), strict=True))


def optimized_step(model: onnx.ModelProto, engine: str = "egglog") -> tuple[Graph, Counter[str]]:
    out, report = optimize_with_report(import_model(model), target="onnxruntime", rules=RULES, engine=engine,
                                       verify=True)
    assert report.parity.ok
    return out, Counter(out.op_counts())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_decoding_step_is_one_group_query_attention_at_every_past_length(form: str, engine: str) -> None:
    """The heads split, RoPE, the cache Concats, the attention and the heads merged back: one GroupQueryAttention,
    written as com.microsoft GroupQueryAttention (RoPE inside), no layout node left around it."""
    heads, kv_heads, rope, axis, hidden, grouped = FORMS[form]
    for past in PAST_LENGTHS:
        model = decode_step(past, heads=heads, kv_heads=kv_heads, rope=rope, concat_axis=axis, hidden=hidden,
                            grouped_query=grouped)
        optimized, mir = optimized_step(model, engine)
        assert {op: mir[op] for op in ("GroupQueryAttention", "KvCacheAttention", "BiasedAttention", "Concat",
                                       "Softmax", "RotaryEmbedding", "Transpose", "Get")} == {
            "GroupQueryAttention": 1, "KvCacheAttention": 0, "BiasedAttention": 0, "Concat": 0, "Softmax": 0,
            "RotaryEmbedding": 0, "Transpose": 0, "Get": 3}
        exported = export_model(optimized)
        ops = Counter(n.op_type for n in exported.graph.node)
        assert {op: ops[op] for op in ("GroupQueryAttention", "Attention", "Concat", "Softmax", "RotaryEmbedding",
                                       "Transpose", "Expand")} == {
            "GroupQueryAttention": 1, "Attention": 0, "Concat": 0, "Softmax": 0, "RotaryEmbedding": 0,
            "Transpose": 0, "Expand": 0}
        (gqa,) = [n for n in exported.graph.node if n.op_type == "GroupQueryAttention"]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
        assert (gqa.domain, attrs["num_heads"], attrs["kv_num_heads"], attrs["do_rotary"]) == \
            ("com.microsoft", heads, kv_heads, int(rope))
        inputs = step_inputs(model)
        expected, got = run(model, inputs), run(exported, inputs)
        assert got["present.0.key"].shape == (2, kv_heads, past + 1, hidden // heads)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-5, err_msg=f"{name} at past {past}")


def exported_with_parity(model: onnx.ModelProto, optimized: Graph) -> Counter:
    """The ONNX op counts of ``optimized``'s export, once it has computed what the step ``model`` computes in
    onnxruntime."""
    exported = export_model(optimized)
    inputs = step_inputs(model)
    expected, got = run(model, inputs), run(exported, inputs)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-5, err_msg=name)
    return Counter(n.op_type for n in exported.graph.node)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_step_whose_mask_is_written_after_the_cache_is_one_group_query_attention(engine: str) -> None:
    """The mask computed after the cache Concats in the input's order (the dynamo exporter's first layer): the
    GroupQueryAttention that reads it computes the present outputs too, with no Concat or RotaryEmbedding left
    for them (extraction searches under the order that computes each value as early as its inputs allow)."""
    model = decode_step(7, rope=True, hidden=64, mask_last=True)
    optimized, mir = optimized_step(model, engine)
    assert {op: mir[op] for op in ("GroupQueryAttention", "KvCacheAttention", "Concat", "RotaryEmbedding",
                                   "Get")} == {"GroupQueryAttention": 1, "KvCacheAttention": 0, "Concat": 0,
                                               "RotaryEmbedding": 0, "Get": 3}
    ops = exported_with_parity(model, optimized)
    assert (ops["GroupQueryAttention"], ops["Concat"], ops["RotaryEmbedding"]) == (1, 0, 0)


def kv_cache_step(past: int, heads: int = 4, kv_heads: int = 2, d: int = 8) -> Graph:
    """KvCacheAttention on split heads read from the graph's inputs (no head split to fold into it)."""
    g = Graph("kv-cache-step")
    q = g.input("q", (2, heads, 1, d))
    k, v = (g.tanh(g.input(name, (2, kv_heads, 1, d))) for name in ("k", "v"))
    past_k, past_v = (g.input(name, (2, kv_heads, past, d)) for name in ("past_k", "past_v"))
    step = g.kv_cache_attention(q, k, v, past_k, past_v, g.input("bias", (2, 1, 1, past + 1)), scale=d**-0.5)
    g.set_outputs([g.get(step, index=i) for i in range(3)])
    return g


def test_kv_cache_attention_exports_as_one_attention_with_past_at_every_past_length() -> None:
    for past in PAST_LENGTHS:
        g = kv_cache_step(past)
        exported = export_model(g)
        ops = Counter(n.op_type for n in exported.graph.node)
        assert (ops["Attention"], ops["Concat"], ops["Expand"]) == (1, 0, 0)
        (attention,) = [n for n in exported.graph.node if n.op_type == "Attention"]
        assert (attention.domain, len(attention.input), [bool(o) for o in attention.output]) == ("", 6, [True] * 3)
        rng = np.random.default_rng(past)
        inputs = {n.name: rng.standard_normal(n.shape).astype(np.float32) for n in g.inputs}
        inputs["bias"][1, ..., 0] = -1e9
        expected = evaluate(g, inputs)
        got = run(exported, inputs)
        for want, name in zip(expected, [o.name for o in exported.graph.output], strict=True):
            np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-5, err_msg=f"{name} at past {past}")


def test_the_cost_decides_between_group_query_attention_and_the_attention_with_past() -> None:
    """Where GroupQueryAttention's measured line is dear, the step stays KvCacheAttention (Attention with past)
    with its layout nodes; where it is cheap, GroupQueryAttention."""
    model = decode_step(7, hidden=64)
    for line, expected in ((OpRate(1e6, 0.1, 0.01), "KvCacheAttention"), (OpRate(500.0, 0.1, 0.01),
                                                                        "GroupQueryAttention")):
        target = calibrations.target({"GroupQueryAttention": line})
        out = optimize_with_report(import_model(model), target=target, rules=RULES)[0]
        counts = Counter(out.op_counts())
        assert (counts["KvCacheAttention"] + counts["GroupQueryAttention"], counts[expected]) == (1, 1), counts


def test_a_head_width_groupqueryattention_cannot_rotate_keeps_the_attention_with_past() -> None:
    """Head width 8 with RoPE (onnxruntime's GroupQueryAttention rotates widths that are multiples of 16 only):
    KvCacheAttention, RoPE and the layout nodes around it stay, and the export is one Attention with past."""
    model = decode_step(7, hidden=32)
    optimized, mir = optimized_step(model)
    assert (mir["GroupQueryAttention"], mir["KvCacheAttention"], mir["RotaryEmbedding"], mir["Concat"]) == (0, 1, 2, 0)
    ops = exported_with_parity(model, optimized)
    assert (ops["GroupQueryAttention"], ops["Attention"], ops["RotaryEmbedding"]) == (0, 1, 2)


def test_both_engines_agree_on_a_decoding_step() -> None:
    model = decode_step(7, hidden=64)
    counts = [Counter(optimize_with_report(import_model(model), target="onnxruntime", rules=RULES,
                                           engine=engine)[0].op_counts()) for engine in ENGINES]
    assert counts[0] == counts[1]
    assert counts[0]["GroupQueryAttention"] == 1


def test_attention_reading_a_concat_on_another_axis_is_not_a_kv_cache() -> None:
    """Keys concatenated on the head-dim axis are no cache: BiasedAttention stays, with its Concats."""
    g = Graph("not-a-cache")
    q = g.input("q", (1, 2, 1, 8))
    k, v = g.input("k", (1, 2, 3, 4)), g.input("v", (1, 2, 3, 8))
    pk = g.input("pk", (1, 2, 3, 4))
    bias = g.input("bias", (1, 1, 1, 3))
    keys = g.concat([pk, k], axis=3)
    g.set_outputs([g.biased_attention(q, keys, v, bias, scale=0.5), keys])
    optimized, _ = optimize_with_report(g, target="onnxruntime", rules=RULES)
    counts = optimized.op_counts()
    assert (counts.get("KvCacheAttention", 0), counts["BiasedAttention"], counts["Concat"]) == (0, 1, 1)


def test_the_decomposition_of_a_step_is_recovered_where_a_concat_is_a_launch() -> None:
    """On onnxruntime (a Concat of an intermediate is a kernel there) KvCacheAttention's decomposition, two Concats
    and BiasedAttention over new keys and values computed in the graph, is one KvCacheAttention again, with its
    attributes; its three results are the outputs."""

    g = Graph("step")
    q, k, v = g.input("q", (2, 4, 1, 8)), g.input("k", (2, 2, 1, 8)), g.input("v", (2, 2, 1, 8))
    past_k, past_v = g.input("past_k", (2, 2, 5, 8)), g.input("past_v", (2, 2, 5, 8))
    bias = g.input("bias", (2, 1, 1, 6))
    step = g.kv_cache_attention(q, g.tanh(k), g.tanh(v), past_k, past_v, bias, scale=0.25, nan_to_zero=True)
    g.set_outputs([g.get(step, index=i) for i in range(3)])
    unfused = decompose(g, {"KvCacheAttention"})
    assert Counter(unfused.op_counts())["Concat"] == 2
    out = optimize_with_report(unfused, target="onnxruntime", rules=RULES)[0]
    counts = Counter(out.op_counts())
    assert (counts["KvCacheAttention"], counts["Concat"], counts["BiasedAttention"], counts["Get"]) == (1, 0, 0, 3)
    (node,) = [n for n in out.nodes if n.op == "KvCacheAttention"]
    assert node.attrs == {"scale": 0.25, "nan_to_zero": True}
