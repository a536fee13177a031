"""Export forms of tests/onnx_models.py recognised by rules/onnx/onnx_forms.egg (with the shipped rules: onnx_rules()):
exact fused counts, parity with
the original graph (verify=True) or with onnxruntime, and the import canonicalisation of causal masks."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto

from onnx_models import MODELS, OnnxBuilder, feeds
from rlx_egraph import evaluate
from rlx_egraph.onnx import import_model, onnx_rules
from rlx_egraph.optimize import optimize_with_report

SHAPES = {"bert": {"hidden_states": (2, 5, 16), "attention_mask": (2, 5)}, "gpt2": {"hidden_states": (2, 5, 16)},
          "llama": {"hidden_states": (2, 5, 16)}, "sdpa": {"hidden_states": (2, 5, 16), "attention_mask": (2, 5)}}
ATTENTION_OPS = ("Attention", "CausalAttention", "QkvAttention", "Expand", "Softmax")


def ort_output(name: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(MODELS[name]().SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


@pytest.mark.parametrize(("name", "counts", "rules"), [
    # GPT-2's heads are one packed projection: the causal attention over it is one QkvAttention
    ("gpt2", {"Attention": 0, "CausalAttention": 0, "QkvAttention": 1, "Expand": 0, "Softmax": 0},
     {"onnx-attention-causal", "qkv-attention-causal"}),
    ("llama", {"Attention": 0, "CausalAttention": 1, "QkvAttention": 0, "Expand": 0, "Softmax": 0},
     {"onnx-attention-causal", "onnx-attention-gqa"}),
])
def test_causal_attention_forms_become_one_kernel_with_parity(name: str, counts: dict, rules: set) -> None:
    g = import_model(MODELS[name](), SHAPES[name])
    out, report = optimize_with_report(g, rules=onnx_rules(), verify=True)
    assert report.parity.ok
    assert {op: out.op_counts()[op] for op in ATTENTION_OPS} == counts
    assert all(report.matches_per_rule[r] >= 1 for r in rules)
    inputs = feeds(MODELS[name](), SHAPES[name])
    np.testing.assert_allclose(evaluate(out, inputs)[0], ort_output(name, inputs), rtol=0, atol=1e-4)


def test_padding_mask_attention_is_one_biased_attention_not_the_keep_mask_attention() -> None:
    """BERT's additive mask equals Attention's custom keep mask only for a 0/1 mask: it becomes BiasedAttention,
    which adds the mask as it is, with parity against onnxruntime; over the packed projection, QkvAttention."""
    out, report = optimize_with_report(import_model(MODELS["bert"](), SHAPES["bert"]), rules=onnx_rules(),
                                       verify=True)
    assert report.matches_per_rule["biased-attention"] >= 1
    assert {op: out.op_counts()[op] for op in (*ATTENTION_OPS, "BiasedAttention")} == {
        "Attention": 0, "CausalAttention": 0, "QkvAttention": 1, "Expand": 0, "Softmax": 0, "BiasedAttention": 0}
    inputs = feeds(MODELS["bert"](), SHAPES["bert"])
    np.testing.assert_allclose(evaluate(out, inputs)[0], ort_output("bert", inputs), rtol=0, atol=1e-4)


def test_causal_masks_import_as_one_keep_mask_op() -> None:
    gpt2 = import_model(MODELS["gpt2"](), SHAPES["gpt2"])  # Where(tril bool buffer slice, scores, finfo.min)
    llama = import_model(MODELS["llama"](), SHAPES["llama"])  # scores + Trilu(-inf, 1): Where(keep, scores, min)
    for g, shape in ((gpt2, (1, 1, 5, 5)), (llama, (5, 5))):
        (mask,) = [n for n in g.nodes if n.op == "CausalMask"]
        assert (mask.shape, mask.dtype) == (shape, "bool")
        np.testing.assert_array_equal(evaluate(g, return_all=True)[mask.id].reshape(5, 5), np.tri(5, dtype=bool))
        assert "CausalMask" not in str(sorted(g.weights))
    (where,) = [n for n in llama.nodes if n.op == "Where"]
    assert llama.node(where.inputs[2]).attrs["value"] == float(np.finfo(np.float32).min)


def test_a_mask_that_is_not_causal_is_not_recognised() -> None:
    """A keep mask that also shows the next key (tril offset 1) is an ordinary weight: no CausalAttention."""
    m = OnnxBuilder(17)
    q, k, v = (m.input(n, TensorProto.FLOAT, [1, 2, 4, 8]) for n in "qkv")
    scores = m.op("Mul", [m.op("MatMul", [q, m.op("Transpose", [k], perm=[0, 1, 3, 2])]), m.const(0.35)])
    keep = m.init("mask", np.tri(4, k=1, dtype=bool)[None, None])
    probs = m.op("Softmax", [m.op("Where", [keep, scores, m.const(-1e9)])], axis=-1)
    g = import_model(m.model({"y": m.op("MatMul", [probs, v])}))
    assert [p.name for p in g.params] == ["mask"]
    out, _ = optimize_with_report(g, rules=onnx_rules(), verify=True)
    assert out.op_counts()["CausalAttention"] == 0 and out.op_counts()["Softmax"] == 1


def test_sdpa_scaled_causal_scores_are_recognised() -> None:
    """q and k each multiplied by sqrt(scale) (the sdpa export) under a causal mask: CausalAttention(scale)."""
    m = OnnxBuilder(17)
    q, k, v = (m.input(n, TensorProto.FLOAT, [1, 2, 4, 8]) for n in "qkv")
    root = m.const(8**-0.25)
    kt = m.op("Mul", [m.op("Transpose", [k], perm=[0, 1, 3, 2]), root])
    scores = m.op("MatMul", [m.op("Mul", [q, root]), kt])
    keep = m.init("mask", np.tri(4, dtype=bool)[None, None])
    probs = m.op("Softmax", [m.op("Where", [keep, scores, m.const(float(np.finfo(np.float32).min))])], axis=-1)
    out, report = optimize_with_report(import_model(m.model({"y": m.op("MatMul", [probs, v])})), rules=onnx_rules(),
                                  verify=True)
    (attn,) = [n for n in out.nodes if n.op == "CausalAttention"]
    assert round(attn.attrs["scale"], 6) == round(8**-0.5, 6)
    assert report.matches_per_rule["attn-scores-sdpa"] > 0 and out.op_counts()["Softmax"] == 0
