"""Regression tests for bugs found in review of the IR, kernels and interpreter."""

import json

import numpy as np
import pytest

from rlx_egraph import Graph, GraphError, evaluate


def test_leaf_data_does_not_depend_on_its_consumer():
    a = Graph()
    x = a.input("x", (2, 8))
    a.set_outputs([a.layer_norm(x, a.param("gamma", (8,)), a.param("beta", (8,)))])
    b = Graph()
    x = b.input("x", (2, 8))
    b.set_outputs([b.mul(x, b.param("gamma", (8,)))])
    va, vb = evaluate(a, return_all=True), evaluate(b, return_all=True)
    np.testing.assert_array_equal(va[a.leaf("gamma").id], vb[b.leaf("gamma").id])


def test_region_chain_fills_attribute_defaults():
    g = Graph()
    x = g.input("x", (3, 4))
    r = g.elementwise_region([x], chain=json.dumps([["Gelu", {}, [0]], ["Neg", {}, [-1]]]))
    g.set_outputs([r])
    assert json.loads(g.node(r).attrs["chain"])["steps"][0][1] == {"approximate": "none"}
    ref = Graph()
    x2 = ref.input("x", (3, 4))
    ref.set_outputs([ref.neg(ref.gelu(x2))])
    np.testing.assert_allclose(evaluate(g)[0], evaluate(ref)[0], rtol=1e-6)


def test_region_cast_step_converts_values():
    g = Graph()
    x = g.input("x", (3,))
    chain = [["Cast", {"dtype": "i64"}, [0]], ["Add", {}, [-1, -1]]]
    g.set_outputs([g.elementwise_region([x], chain=json.dumps(chain))])
    out = evaluate(g, feeds={"x": np.array([1.7, -0.6, 2.5], np.float32)})[0]
    np.testing.assert_array_equal(out, [2, 0, 4])
    assert out.dtype == np.int64


def test_builders_continue_after_gapped_ids():
    g = Graph.from_nodes([{"id": 0, "op": "Input", "attrs": {"name": "x", "shape": [2]}},
                          {"id": 2, "op": "Relu", "inputs": [0]}], outputs=[2])
    assert g.relu(2) == 3


@pytest.mark.parametrize("build, message", [
    (lambda g, x4: g.group_norm_silu(x4, g.param("w", (4,)), g.param("b", (4,)), groups=0),
     "node 3 (GroupNormSilu): attribute groups=0 must be >= 1"),
    (lambda g, x4: g.attention(g.scalar(1.0), g.scalar(1.0), g.scalar(1.0), heads=1),
     "node 4 (Attention): Attention q ([B, S, heads*head_dim]) must have rank 3"),
    (lambda g, x4: g.elementwise_region([x4], chain=json.dumps([["Nope", {}, [0]]])),
     "node 1 (ElementwiseRegion): chain step 0 op 'Nope' is not an elementwise op"),
    (lambda g, x4: g.scalar(1.5, dtype="i64"), "node 1 (Scalar): a i64 scalar needs an integral value, got 1.5"),
    (lambda g, x4: g.max_pool2d(x4, kernel=2, padding=2), "node 1 (MaxPool2d): padding 2 must be at most half"),
    (lambda g, x4: g.rms_norm_grad_x(x4, g.param("g", (5,)), x4),
     "node 2 (RmsNormGradX): RmsNormGradX gamma shape [5] must equal the normalised shape [4]"),
])
def test_bad_fused_and_backward_inputs_raise_graph_error(build, message):
    g = Graph()
    x4 = g.input("x", (1, 4, 4, 4))
    with pytest.raises(GraphError) as err:
        build(g, x4)
    assert message in str(err.value)


def test_causal_attention_rope_needs_even_head_dim():
    g = Graph()
    q = g.input("q", (1, 2, 4, 3))
    with pytest.raises(GraphError, match="RoPE needs an even head dim, got 3"):
        g.causal_attention_rope(q, q, q)
