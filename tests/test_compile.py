"""The compile pipeline: HIR modules and their fusion policies, legalization for a target, and
``rlx_egraph.compile`` / ``specialize``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rlx_egraph
from rlx_egraph import Graph, GraphError, evaluate, examples, optimize
from rlx_egraph.compile import CompileResult, LegalizeError, Module, Phase, Policy, legalize, specialize
from rlx_egraph.compile.hir import ATTENTION_BLOCK_MAX_TOKENS
from rlx_egraph.cost import TARGETS, Target, get_target
from rlx_egraph.engines.regions import find_regions
from rlx_egraph.ir.decompose import decompose
from rlx_egraph.ir.rewrite import GraphRewriter
from rlx_egraph.report import OptimizeReport


def bit_equal(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return len(got) == len(want) and all(
        (a.dtype, a.shape) == (b.dtype, b.shape) and a.tobytes() == b.tobytes() for a, b in zip(got, want, strict=True))


def swiglu_module(policy: str) -> Module:
    m = Module("ffn", policy)
    x = m.input("x", (4, 768))
    m.set_outputs([m.swiglu_ffn(x, 2048, "mlp")])
    return m


def every_layer(policy: str) -> Module:
    """One of each layer: embedding, norms, a BERT block with a key mask, causal GQA attention without biases,
    attention over a key mask above the token bound, linear with an activation, SwiGLU FFN, residual add."""
    m = Module("all", policy)
    ids, mask = m.input("ids", (2, 8), "i64"), m.input("mask", (2, 8))
    h = m.layer_norm(m.embedding(ids, 50, 32, "emb"), "emb_ln")
    h = m.transformer_block(h, 4, 64, "block", mask)
    h = m.add(h, m.attention(m.rms_norm(h, "norm"), 4, "causal", "causal", kv_heads=2, bias=False))
    h = m.add(h, m.swiglu_ffn(h, 48, "mlp"))
    m.set_outputs([m.linear(h, 16, "head", act="silu")])
    return m


# --- HIR: layers and fusion policies -------------------------------------------------------------------


def test_linear_with_bias_compiles_to_one_fused_kernel():
    m = Module("layer")
    x = m.input("x", (2, 128))
    m.set_outputs([m.linear(x, 128, "fc")])
    result = rlx_egraph.compile(m)
    assert result.graph.op_counts() == {"Input": 1, "Param": 2, "FusedMatMulBiasAct": 1}
    assert [p.name for p in result.graph.params] == ["fc.weight", "fc.bias"]
    plan = result.plan
    assert 0 < plan.lower_bound_bytes <= plan.arena_bytes <= plan.no_reuse_bytes
    assert bit_equal(result.run(), evaluate(result.graph))


def test_direct_swiglu_ffn_lowers_to_fused_swiglu_over_one_wide_matmul():
    g = swiglu_module("direct").lower()
    assert g.op_counts() == {"Input": 1, "Param": 3, "ConcatParams": 1, "MatMul": 2, "FusedSwiGLU": 1}
    (cat,) = [n for n in g.nodes if n.op == "ConcatParams"]
    assert [g.node(i).name for i in cat.inputs] == ["mlp.gate_proj.weight", "mlp.up_proj.weight"]
    assert [n.attrs for n in g.nodes if n.op == "FusedSwiGLU"] == [{"gate_first": True, "cast_to": "none"}]
    assert rlx_egraph.compile(swiglu_module("direct")).graph.op_counts() == g.op_counts()


def test_fusable_swiglu_ffn_is_nine_primitive_nodes_that_the_optimizer_fuses():
    g = swiglu_module("fusable").lower()
    assert len(g) == 9
    assert g.op_counts() == {"Input": 1, "Param": 3, "MatMul": 3, "Silu": 1, "Mul": 1}
    result = rlx_egraph.compile(swiglu_module("fusable"))
    assert result.fusion.fused_op_counts["FusedSwiGLU"] == 1
    assert result.graph.op_counts() == swiglu_module("direct").lower().op_counts()
    np.testing.assert_allclose(evaluate(result.graph)[0], evaluate(g)[0], rtol=1e-4, atol=1e-5)


def test_fusable_is_the_decomposition_of_direct_where_no_weights_are_shared():
    direct, fusable = Module("d", "direct"), Module("d", "fusable")
    for m in (direct, fusable):
        x = m.input("x", (2, 3, 8))
        m.set_outputs([m.layer_norm(m.linear(m.rms_norm(x, "n"), 16, "fc", act="gelu_tanh"), "ln")])
    assert direct.lower().op_counts()["FusedMatMulBiasAct"] == 1
    assert fusable.lower() == decompose(direct.lower())


def test_every_layer_lowers_under_both_policies_to_the_same_values():
    direct, fusable = every_layer("direct").lower(), every_layer("fusable").lower()
    assert direct.op_counts() == {
        "Input": 2, "Param": 29, "Embedding": 1, "LayerNorm": 1, "ConcatParams": 4, "FusedTransformerLayer": 1,
        "RmsNorm": 1, "MatMul": 4, "Narrow": 3, "Attention": 1, "Add": 2, "FusedSwiGLU": 1,
        "FusedMatMulBiasAct": 1}
    assert fusable.op_counts() == {
        "Input": 2, "Param": 29, "Embedding": 1, "LayerNorm": 3, "MatMul": 14, "Add": 11, "Attention": 2,
        "Gelu": 1, "RmsNorm": 1, "Silu": 2, "Mul": 1}
    assert sorted(p.name for p in direct.params) == sorted(p.name for p in fusable.params)
    np.testing.assert_allclose(evaluate(direct)[0], evaluate(fusable)[0], rtol=1e-5, atol=1e-6)
    assert every_layer("direct").lower("fusable") == fusable


@pytest.mark.parametrize(("seq", "block"), [(ATTENTION_BLOCK_MAX_TOKENS // 2, True),
                                            (ATTENTION_BLOCK_MAX_TOKENS // 2 + 1, False)])
def test_direct_attention_is_one_fused_block_only_under_the_token_bound(seq, block):
    m = Module("attn")
    x, mask = m.input("x", (2, seq, 16)), m.input("mask", (2, seq))
    m.set_outputs([m.attention(x, 2, "attn", mask)])
    counts = m.lower().op_counts()
    if block:
        assert counts == {"Input": 2, "Param": 8, "ConcatParams": 2, "FusedAttentionBlock": 1}
    else:
        assert counts == {"Input": 2, "Param": 8, "ConcatParams": 2, "FusedMatMulBiasAct": 2, "Narrow": 3,
                          "Attention": 1}


def test_module_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"fusion policy must be one of \['direct', 'fusable'\], got 'eager'"):
        Module("m", "eager")
    m = Module("m")
    x = m.input("x", (2, 4, 32))
    m.linear(x, 8, "fc")
    before = m.lower()
    cases = [
        (lambda: m.linear(x, 8, "fc2", act="relu"),
         r"layer 2 \(linear 'fc2'\): act='relu' must be one of \['none', 'gelu', 'gelu_tanh', 'silu'\]"),
        (lambda: m.linear(x, 8, "fc"), r"layer 2 \(linear 'fc'\): node 4 \(Param\): name 'fc.weight' is already used "
                                        r"by node 1"),
        (lambda: m.add(x, 7), r"layer 2 \(add 'add'\): input 7 is not a value of the module"),
        (lambda: m.attention(x, 5, "attn"), r"layer 2 \(attention 'attn'\): attention needs x \[B, S, W\] with W "
                                             r"divisible by heads=5, got f32\[2, 4, 32\]"),
        (lambda: m.attention(x, 4, "attn", "full"), r"layer 2 \(attention 'attn'\): mask='full' must be None, "
                                                     r"'causal' or a key-mask value"),
        (lambda: m.set_outputs([3]), r"module 'm': output 3 is not a value of the module"),
    ]
    for call, message in cases:
        with pytest.raises(GraphError, match=message):
            call()
    assert len(m.layers) == 2 and m.lower() == before  # failed layers leave nothing behind
    assert m.type(1).shape == (2, 4, 8)
    with pytest.raises(GraphError, match=r"module 'm': 2 is not a value of the module"):
        m.type(2)


# --- legalization ----------------------------------------------------------------------------------------


def region_graph() -> Graph:
    """A 7-step region over 3 inputs with Greater/Where and a Cast, then a Relu."""
    g = Graph("region")
    a, b, c = g.input("a", (4, 8)), g.input("b", (4, 8)), g.input("c", (8,))
    chain = [["Add", {}, [0, 1]], ["Greater", {}, [-1, 2]], ["Where", {}, [-2, -1, 2]], ["Tanh", {}, [-3]],
             ["Mul", {}, [-4, 0]], ["Cast", {"dtype": "f16"}, [-5]], ["Neg", {}, [-6]]]
    g.set_outputs([g.relu(g.elementwise_region([a, b, c], chain=json.dumps(chain)))])
    return g


def test_a_target_without_region_kernels_gets_the_steps_back():
    g = region_graph()
    before = g.to_json()
    legal = legalize(g, "wgpu")
    assert g.to_json() == before
    assert [(n.id, n.op, n.inputs) for n in legal.nodes if n.op != "Input"] == [
        (5, "Add", (0, 1)), (6, "Greater", (5, 2)), (7, "Where", (6, 5, 2)), (8, "Tanh", (7,)), (9, "Mul", (8, 0)),
        (10, "Cast", (9,)), (11, "Neg", (10,)), (4, "Relu", (11,))]
    assert bit_equal(evaluate(legal), evaluate(g))


def test_regions_beyond_the_target_limits_are_clipped():
    small = get_target("cuda").replace(name="small", region_max_steps=3, region_max_inputs=2)
    g = region_graph()
    legal = legalize(g, small)
    pieces = [(n.id, n.op, n.inputs, [s[0] for s in json.loads(n.attrs["chain"])["steps"]] if n.attrs else None)
              for n in legal.nodes if n.op != "Input"]
    # Add's value is read twice (Greater and Where), so it stays a node of its own; the region's value keeps its id
    assert pieces == [(5, "Add", (0, 1), None), (6, "ElementwiseRegion", (5, 2), ["Greater", "Where", "Tanh"]),
                      (3, "ElementwiseRegion", (6, 0), ["Mul", "Cast", "Neg"]), (4, "Relu", (3,), None)]
    assert bit_equal(evaluate(legal), evaluate(g))
    assert legalize(g, "cuda") is g  # within cuda's limits: nothing to do


def test_an_op_no_kernel_runs_is_an_error_naming_the_nodes():
    no_conv = get_target("cpu").replace(name="no-conv", unsupported=frozenset({"Conv2d", "GroupNormSilu"}))
    with pytest.raises(LegalizeError, match=r"target 'no-conv' cannot run 2 node\(s\): node 4 \(Conv2d\), node 15 "
                                            r"\(Conv2d\): the op is not supported there and has no decomposition"):
        legalize(examples.conv_block(), no_conv)
    nested = get_target("cpu").replace(name="no-gn", unsupported=frozenset({"GroupNormSilu", "GroupNorm"}))
    g = Graph()
    x = g.input("x", (1, 4, 2, 2))
    g.set_outputs([g.group_norm_silu(x, g.param("w", (4,)), g.param("b", (4,)), groups=2)])
    with pytest.raises(LegalizeError, match=r"target 'no-gn': node 3 \(GroupNormSilu\): GroupNorm has no "
                                            r"decomposition \(inside GroupNormSilu\)"):
        legalize(g, nested)


def test_unsupported_fused_ops_are_decomposed_recursively():
    bare = get_target("cpu").replace(name="bare", unsupported=frozenset(
        {"FusedTransformerLayer", "FusedAttentionBlock", "FusedResidualLN", "FusedMatMulBiasAct"}))
    g = every_layer("direct").lower()
    legal = legalize(g, bare)
    assert not set(legal.op_counts()) & bare.unsupported
    assert legal.op_counts()["Attention"] == 2
    np.testing.assert_allclose(evaluate(legal)[0], evaluate(g)[0], rtol=1e-5, atol=1e-6)


def test_target_region_limits_default_to_the_region_pass_defaults_and_are_checked():
    assert {(t.region_max_steps, t.region_max_inputs) for t in TARGETS.values()} == {(16, 8)}
    g = Graph()
    v = g.input("x", (4,))
    for _ in range(20):
        v = g.tanh(v)
    g.set_outputs([v])
    assert [len(r.members) for r in find_regions(g)] == [16, 4]
    for value in (0, True, 2.5):
        with pytest.raises(ValueError, match=rf"target 'cuda': region_max_steps={value!r} must be an integer >= 1"):
            get_target("cuda").replace(region_max_steps=value)


# --- compile ---------------------------------------------------------------------------------------------


def test_retargeting_a_cuda_graph_to_wgpu():
    original = examples.bert(layers=1)
    on_cuda = optimize(original, "cuda")
    assert on_cuda.op_counts()["FusedTransformerLayer"] == 1
    result = rlx_egraph.compile(on_cuda, "wgpu")
    wgpu = get_target("wgpu")
    assert all(wgpu.supports(op) for op in result.graph.op_counts())
    assert result.graph.op_counts() == {"Input": 2, "Param": 20, "EmbedLayerNorm": 1, "ConcatParams": 2,
                                        "FusedAttentionBlock": 1, "FusedResidualLN": 2, "FusedMatMulBiasAct": 2}
    assert bit_equal(result.run(), evaluate(result.graph))
    np.testing.assert_allclose(result.run()[0], evaluate(original)[0], rtol=1e-4, atol=1e-4)


def test_retargeting_regions_to_a_target_without_region_kernels():
    g = Graph()
    v = g.mul(g.add(g.input("a", (8, 16)), g.input("b", (8, 16))), g.input("c", (16,)))
    for _ in range(10):
        v = g.relu(g.tanh(v))
    g.set_outputs([v])
    on_cuda = optimize(g, "cuda")
    assert on_cuda.op_counts() == {"Input": 3, "ElementwiseRegion": 2}
    result = rlx_egraph.compile(on_cuda, "wgpu")
    assert result.graph.op_counts() == {"Input": 3, "Add": 1, "Mul": 1, "Tanh": 10, "Relu": 10}
    assert bit_equal(result.run(), evaluate(g))


def test_compile_result_of_a_module_has_phases_io_and_a_stable_fingerprint():
    m = Module("stream")
    x = m.input("x", (1, 8))
    m.set_outputs([m.linear(x, 4, "proj", bias=False)])
    result = rlx_egraph.compile(m)
    assert isinstance(result, CompileResult) and isinstance(result.fusion, OptimizeReport)
    plan = result.plan
    (entry,) = plan.io.inputs
    assert (entry.name, entry.shape, entry.dtype) == ("x", (1, 8), "f32")
    assert plan.phase_of(entry.node) is Phase.PROLOGUE
    assert [s.action for s in plan.phase(Phase.EPILOGUE)] == ["read"]
    assert plan.alignment == 64 and all(b.offset % 64 == 0 for b in plan.buffers)
    assert plan.fingerprint() == rlx_egraph.compile(m).plan.fingerprint()
    assert plan.fingerprint() != rlx_egraph.compile(m, alignment=128).plan.fingerprint()
    feeds = {"x": np.arange(8.0).reshape(1, 8)}
    assert bit_equal(result.run(feeds, seed=3), evaluate(result.graph, feeds, seed=3))


def test_compile_without_optimizing_plans_the_graph_as_given():
    g = examples.mlp(layers=1)
    before = g.to_json()
    result = rlx_egraph.compile(g, "cuda", optimize=False)
    assert result.fusion is None and result.graph is g and result.target is get_target("cuda")
    assert g.to_json() == before
    assert result.plan.target == "cuda"
    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        rlx_egraph.compile(g, "tpu")


def test_compile_passes_options_to_the_optimizer():
    result = rlx_egraph.compile(examples.mlp(layers=1), verify=True, regions=False)
    assert result.fusion.parity is not None and result.fusion.parity.ok


def test_specialize_is_the_identity_on_static_graphs():
    g = examples.mlp(layers=1)
    result = rlx_egraph.compile(g, optimize=False)
    m = swiglu_module("direct")
    assert specialize(g, {}) is g and specialize(result, {}) is result and specialize(m, {}) is m
    with pytest.raises(ValueError, match=r"specialize: unknown symbol\(s\) \['batch', 'seq'\]: the graph has no "
                                         r"symbolic dims"):
        rlx_egraph.specialize(result, {"seq": 16, "batch": 2})
    with pytest.raises(TypeError, match="specialize takes a Graph, Module or CompileResult, got str"):
        specialize("graph", {})


def test_package_exports():
    from rlx_egraph.compile import compile as compile_fn

    assert rlx_egraph.compile is compile_fn and rlx_egraph.specialize is specialize
    assert Policy("fusable") is Policy.FUSABLE
    assert isinstance(get_target("wgpu"), Target)


# --- the weight store -------------------------------------------------------------------------------------


def stored_linear() -> Graph:
    """x[1, 4] @ w[4, 3] + b[3] with w = 2.25 and b = -0.5 in the graph's weight store: every output is 8.5 at x = 1."""
    g = Graph("stored")
    x, w, b = g.input("x", (1, 4)), g.param("w", (4, 3)), g.param("b", (3,))
    g.set_outputs([g.relu(g.add(g.matmul(x, w), b))])
    g.weights = {"w": np.full((4, 3), 2.25, np.float32), "b": np.full((3,), -0.5, np.float32)}
    return g


def test_compile_run_and_plan_run_read_the_weight_store(tmp_path):
    g = stored_linear()
    feeds = {"x": np.ones((1, 4), np.float32)}
    want = [np.full((1, 3), 8.5, np.float32)]
    assert bit_equal(evaluate(g, feeds), want)
    result = rlx_egraph.compile(g)
    assert result.graph.op_counts()["FusedMatMulBiasAct"] == 1
    assert bit_equal(result.run(feeds), want)
    assert bit_equal(result.plan.run(feeds), want)
    assert bit_equal(rlx_egraph.compile(g, optimize=False).run(feeds), want)
    g.save(tmp_path / "g.json")  # and a graph read back from JSON + .npz
    assert bit_equal(rlx_egraph.compile(Graph.load(tmp_path / "g.json")).run(feeds), want)
    # a parameter given to run() still wins over the store
    assert bit_equal(result.run(feeds, {"b": np.zeros(3, np.float32)}), [np.full((1, 3), 9.0, np.float32)])


def test_every_graph_derived_from_another_keeps_its_weight_store():
    g = stored_linear()
    fused = optimize(g)
    assert fused.op_counts()["FusedMatMulBiasAct"] == 1 and fused.weights.keys() == {"w", "b"}
    no_fused = get_target("cpu").replace(name="no-fused", unsupported=frozenset({"FusedMatMulBiasAct"}))
    for derived in (decompose(fused), legalize(fused, no_fused), legalize(optimize(g, "cuda"), "wgpu"),
                    GraphRewriter(g).finish()):
        assert derived.weights.keys() == {"w", "b"}
        assert bit_equal(evaluate(derived, {"x": np.ones((1, 4), np.float32)}), [np.full((1, 3), 8.5, np.float32)])
    small = get_target("cuda").replace(name="small", region_max_steps=1, region_max_inputs=1)
    regions = optimize(stored_region_graph(), "cuda")
    assert regions.op_counts() == {"Input": 1, "Param": 1, "ElementwiseRegion": 1}
    clipped = legalize(regions, small)  # the region cut into its steps
    assert clipped.op_counts() == {"Input": 1, "Param": 1, "Mul": 1, "Tanh": 3, "Relu": 3}
    assert clipped.weights.keys() == {"s"}
    assert bit_equal(evaluate(clipped), evaluate(stored_region_graph()))


def stored_region_graph() -> Graph:
    g = Graph()
    v = g.mul(g.input("a", (8, 16)), g.param("s", (16,)))
    for _ in range(3):
        v = g.relu(g.tanh(v))
    g.set_outputs([v])
    g.weights = {"s": np.full((16,), 0.5, np.float32)}
    return g
