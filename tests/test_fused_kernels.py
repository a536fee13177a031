"""Every fused op computes what the unfused subgraph it replaces computes (FUSIONS.md section 3).

Each case builds the unfused subgraph from primitive ops in one Graph and the
fused node on the same named leaves in another, runs both on the same data and
compares at f32 with rtol=1e-5, atol=1e-6 over random shapes and attributes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_egraph import Graph, evaluate
from rlx_egraph.ir import REGISTRY, Kind, op_spec

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None)
DIM = st.integers(1, 5)
EPS = st.sampled_from([1e-6, 1e-5, 1e-3, 0.1])
ACTIVATIONS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "none": None, "gelu": ("Gelu", {"approximate": "none"}), "gelu_tanh": ("Gelu", {"approximate": "tanh"}),
    "silu": ("Silu", {}),
}

Ids = dict[str, int]
Build = Callable[[Graph, Ids], int]


@dataclass(frozen=True)
class Pair:
    """Named leaves (Inputs, or Params for names in ``params``) and the two ways to compute one value."""

    leaves: dict[str, tuple[int, ...]]
    unfused: Build
    fused: Build
    params: frozenset[str] = field(default_factory=frozenset)


def build(pair: Pair, fused: bool) -> Graph:
    g = Graph("fused" if fused else "unfused")
    ids = {name: (g.param if name in pair.params else g.input)(name, shape) for name, shape in pair.leaves.items()}
    g.set_outputs([(pair.fused if fused else pair.unfused)(g, ids)])
    return g


def assert_fused_matches(op: str, pair: Pair) -> None:
    """The fused graph is one ``op`` node on the leaves; its value equals the primitive subgraph's."""
    unfused, fused = build(pair, fused=False), build(pair, fused=True)
    assert [n.op for n in fused.nodes if n.kind is not Kind.LEAF] == [op]
    assert all(n.kind not in (Kind.FUSED, Kind.WEIGHT_PREP) for n in unfused.nodes)
    want_node, got_node = unfused.node(unfused.outputs[0]), fused.node(fused.outputs[0])
    assert got_node.type == want_node.type
    # evaluate's random data for a leaf depends on the op that reads it (norm scales are drawn
    # near 1 only for LayerNorm/RmsNorm/GroupNorm), so the fused graph gets the unfused graph's leaves.
    values = evaluate(unfused, return_all=True)
    feeds = {n.name: values[n.id] for n in unfused.inputs}
    params = {n.name: values[n.id] for n in unfused.params}
    (got,) = evaluate(fused, feeds=feeds, params=params)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, values[want_node.id], rtol=1e-5, atol=1e-6)


def activation(g: Graph, x: int, act: str) -> int:
    spec = ACTIVATIONS[act]
    return x if spec is None else g.add_node(spec[0], [x], **spec[1])


def draw_shape(data: st.DataObject, min_rank: int, max_rank: int) -> tuple[int, ...]:
    return tuple(data.draw(st.lists(DIM, min_size=min_rank, max_size=max_rank), label="shape"))


# --- cases ------------------------------------------------------------------------

Make = Callable[[st.DataObject], Pair]


MATMUL_ADD = {"FusedMatMulAdd": "MatMul", "FusedMatMulATAdd": "MatMulAT", "FusedMatMulBTAdd": "MatMulBT"}
D_SHAPES = ("full", "row", "column", "scalar")


def matmul_add(op: str, primitive: str, d_kind: str) -> Make:
    """Add(MatMul*(a, b), d) in either order; d is the full [..., M, N] or broadcast from a row, column or scalar."""
    transpose_a, transpose_b = primitive == "MatMulAT", primitive == "MatMulBT"

    def make(data: st.DataObject) -> Pair:
        m, k, n = data.draw(DIM), data.draw(DIM), data.draw(DIM)
        batch = draw_shape(data, 0, 2)
        a = (*batch, k, m) if transpose_a else (*batch, m, k)
        b_batch = data.draw(st.sampled_from([(), batch[-1:]]), label="b batch")
        b = (*b_batch, n, k) if transpose_b else (*b_batch, k, n)
        d = {"full": (*batch, m, n), "row": (n,), "column": (m, 1), "scalar": ()}[d_kind]
        swap = data.draw(st.booleans(), label="swap")

        def unfused(g: Graph, x: Ids) -> int:
            mm = g.add_node(primitive, [x["a"], x["b"]])
            return g.add(x["d"], mm) if swap else g.add(mm, x["d"])

        return Pair({"a": a, "b": b, "d": d}, unfused, lambda g, x: g.add_node(op, [x["a"], x["b"], x["d"]]),
                    frozenset({"b", "d"}))

    return make


def matmul_bias_act(act: str, rank: int) -> Make:
    """MatMul -> Add(bias of rank <= 1) -> activation, with x of the given rank."""

    def make(data: st.DataObject) -> Pair:
        m, k, n = data.draw(DIM), data.draw(DIM), data.draw(DIM)
        x = (*draw_shape(data, rank - 2, rank - 2), m, k)
        bias = data.draw(st.sampled_from([(n,), (1,), ()]), label="bias")
        return Pair({"x": x, "w": (k, n), "bias": bias},
                    lambda g, i: activation(g, g.add(g.matmul(i["x"], i["w"]), i["bias"]), act),
                    lambda g, i: g.fused_matmul_bias_act(i["x"], i["w"], i["bias"], act=act),
                    frozenset({"w", "bias"}))

    return make


def norm_shapes(data: st.DataObject) -> tuple[tuple[int, ...], int, float]:
    """A tensor shape of rank >= 2, a normalisation axis (-1 or -2) and an eps."""
    shape = draw_shape(data, 2, 4)
    return shape, data.draw(st.sampled_from([-1, -2]), label="axis"), data.draw(EPS, label="eps")


def residual_ln(data: st.DataObject) -> Pair:
    shape, axis, eps = norm_shapes(data)
    swap = data.draw(st.booleans(), label="swap")
    leaves = {"x": shape, "residual": shape, "gamma": shape[axis:], "beta": shape[axis:]}

    def unfused(g: Graph, i: Ids) -> int:
        total = g.add(i["residual"], i["x"]) if swap else g.add(i["x"], i["residual"])
        return g.layer_norm(total, i["gamma"], i["beta"], axis=axis, eps=eps)

    return Pair(leaves, unfused,
                lambda g, i: g.fused_residual_ln(i["x"], i["residual"], i["gamma"], i["beta"], axis=axis, eps=eps),
                frozenset({"gamma", "beta"}))


def residual_rms(with_beta: bool) -> Make:
    def make(data: st.DataObject) -> Pair:
        shape, axis, eps = norm_shapes(data)
        leaves = {"x": shape, "residual": shape, "gamma": shape[axis:]} | ({"beta": shape[axis:]} if with_beta else {})

        def norm_args(i: Ids) -> list[int]:
            return [i["gamma"], i["beta"]] if with_beta else [i["gamma"]]

        return Pair(leaves,
                    lambda g, i: g.rms_norm(g.add(i["x"], i["residual"]), *norm_args(i), axis=axis, eps=eps),
                    lambda g, i: g.fused_residual_rms_norm(i["x"], i["residual"], *norm_args(i), axis=axis, eps=eps),
                    frozenset({"gamma", "beta"}))

    return make


def rms_norm_matmul(data: st.DataObject) -> Pair:
    shape, axis, eps = norm_shapes(data)
    n = data.draw(DIM)
    return Pair({"x": shape, "w_norm": shape[axis:], "w_proj": (shape[-1], n)},
                lambda g, i: g.matmul(g.rms_norm(i["x"], i["w_norm"], axis=axis, eps=eps), i["w_proj"]),
                lambda g, i: g.fused_rms_norm_matmul(i["x"], i["w_norm"], i["w_proj"], axis=axis, eps=eps),
                frozenset({"w_norm", "w_proj"}))


def swiglu(data: st.DataObject) -> Pair:
    shape = draw_shape(data, 2, 3)
    swap = data.draw(st.booleans(), label="swap")

    def unfused(g: Graph, i: Ids) -> int:
        gate = g.silu(i["gate"])
        return g.mul(i["up"], gate) if swap else g.mul(gate, i["up"])

    return Pair({"gate": shape, "up": shape}, unfused, lambda g, i: g.swiglu(i["gate"], i["up"]))


def fused_swiglu(gate_first: bool) -> Make:
    """Narrow the two halves of cat, Silu the gate half, multiply."""

    def make(data: st.DataObject) -> Pair:
        half = data.draw(DIM)
        cat = (*draw_shape(data, 1, 2), 2 * half)

        def unfused(g: Graph, i: Ids) -> int:
            first = g.narrow(i["cat"], axis=-1, start=0, length=half)
            second = g.narrow(i["cat"], axis=-1, start=half, length=half)
            return g.mul(g.silu(first), second) if gate_first else g.mul(first, g.silu(second))

        return Pair({"cat": cat}, unfused, lambda g, i: g.fused_swiglu(i["cat"], gate_first=gate_first))

    return make


def group_norm_silu(data: st.DataObject) -> Pair:
    groups, per = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    c = groups * per
    x = (data.draw(st.integers(1, 2)), c, *draw_shape(data, 1, 2))
    eps = data.draw(EPS, label="eps")
    return Pair({"x": x, "w": (c,), "b": (c,)},
                lambda g, i: g.silu(g.group_norm(i["x"], i["w"], i["b"], groups=groups, eps=eps)),
                lambda g, i: g.group_norm_silu(i["x"], i["w"], i["b"], groups=groups, eps=eps), frozenset({"w", "b"}))


def causal_attention_rope(gqa: bool) -> Make:
    """CausalAttention(RoPE(q), RoPE(k), v); with ``gqa`` q has 2 or 3 heads per K/V head."""

    def make(data: st.DataObject) -> Pair:
        batch, kv_heads, seq = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), data.draw(DIM)
        rep = data.draw(st.integers(2, 3)) if gqa else 1
        dim, dv = 2 * data.draw(st.integers(1, 4)), data.draw(DIM)
        theta = data.draw(st.sampled_from([10000.0, 100.0, 10.0]), label="theta")
        scale = data.draw(st.sampled_from([0.0, 0.3]), label="scale")  # 0 means 1/sqrt(dim)
        leaves = {"q": (batch, kv_heads * rep, seq, dim), "k": (batch, kv_heads, seq, dim),
                  "v": (batch, kv_heads, seq, dv)}
        return Pair(leaves,
                    lambda g, i: g.causal_attention(g.rope(i["q"], theta=theta), g.rope(i["k"], theta=theta), i["v"],
                                                    scale=scale),
                    lambda g, i: g.causal_attention_rope(i["q"], i["k"], i["v"], theta=theta, scale=scale))

    return make


def attention_leaves(data: st.DataObject) -> tuple[dict[str, tuple[int, ...]], int, float]:
    """hidden [B, S, H], the QKV/output weights and biases, a [B, S] key mask; heads and scale."""
    b, s, heads, head_dim = data.draw(st.integers(1, 3)), data.draw(DIM), data.draw(st.integers(1, 3)), data.draw(DIM)
    h = heads * head_dim
    scale = data.draw(st.sampled_from([head_dim**-0.5, 0.2]), label="scale")
    leaves = {"hidden": (b, s, h), "qkv_w": (h, 3 * h), "qkv_b": (3 * h,), "out_w": (h, h), "out_b": (h,),
              "mask": (b, s)}
    return leaves, heads, scale


def unfused_attention_block(g: Graph, i: Ids, heads: int, scale: float) -> int:
    """QKV matmul+bias -> Narrows at 0, h, 2h -> Attention(custom mask) -> output matmul+bias."""
    h = g.node(i["hidden"]).shape[-1]
    qkv = g.add(g.matmul(i["hidden"], i["qkv_w"]), i["qkv_b"])
    q, k, v = (g.narrow(qkv, axis=-1, start=j * h, length=h) for j in range(3))
    ctx = g.attention(q, k, v, i["mask"], heads=heads, mask="custom", scale=scale)
    return g.add(g.matmul(ctx, i["out_w"]), i["out_b"])


WEIGHTS = frozenset({"qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b", "ln2_g",
                     "ln2_b"})


def attention_block(data: st.DataObject) -> Pair:
    leaves, heads, scale = attention_leaves(data)
    return Pair(leaves, lambda g, i: unfused_attention_block(g, i, heads, scale),
                lambda g, i: g.fused_attention_block(i["hidden"], i["qkv_w"], i["out_w"], i["mask"], i["qkv_b"],
                                                     i["out_b"], heads=heads, scale=scale), WEIGHTS)


def transformer_layer(act: str) -> Make:
    """The whole post-norm BERT layer from primitives (the default act, "gelu", is the erf Gelu op)."""

    def make(data: st.DataObject) -> Pair:
        leaves, heads, scale = attention_leaves(data)
        h, inner = leaves["hidden"][-1], data.draw(st.integers(1, 8))
        leaves |= {"ln1_g": (h,), "ln1_b": (h,), "fc1_w": (h, inner), "fc1_b": (inner,), "fc2_w": (inner, h),
                   "fc2_b": (h,), "ln2_g": (h,), "ln2_b": (h,)}
        eps1, eps2 = data.draw(EPS, label="eps1"), data.draw(EPS, label="eps2")
        attrs = {"heads": heads, "scale": scale, "eps1": eps1, "eps2": eps2} | ({} if act == "gelu" else {"act": act})
        order = op_spec("FusedTransformerLayer").input_names
        assert len(order) == 14 and set(order) == set(leaves)

        def unfused(g: Graph, i: Ids) -> int:
            attn = unfused_attention_block(g, i, heads, scale)
            h1 = g.layer_norm(g.add(attn, i["hidden"]), i["ln1_g"], i["ln1_b"], eps=eps1)
            ffn_in = activation(g, g.add(g.matmul(h1, i["fc1_w"]), i["fc1_b"]), act)
            ffn = g.add(g.matmul(ffn_in, i["fc2_w"]), i["fc2_b"])
            return g.layer_norm(g.add(ffn, h1), i["ln2_g"], i["ln2_b"], eps=eps2)

        return Pair(leaves, unfused, lambda g, i: g.add_node("FusedTransformerLayer", [i[n] for n in order], **attrs),
                    WEIGHTS)

    return make


UNARY_STEPS: list[tuple[str, dict[str, Any]]] = [
    ("Relu", {}), ("Silu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Neg", {}), ("Abs", {}), ("Erf", {}),
    ("Identity", {}), ("Gelu", {"approximate": "none"}), ("Gelu", {"approximate": "tanh"}),
]
BINARY_STEPS = ["Add", "Sub", "Mul", "Max", "Min"]


def region_pair(inputs: dict[str, tuple[int, ...]], chain: list[list[Any]]) -> Pair:
    """An ElementwiseRegion over the leaves ``inputs`` (in order) and the same chain as separate nodes."""
    names = list(inputs)

    def unfused(g: Graph, i: Ids) -> int:
        results: list[int] = []
        for op, attrs, operands in chain:
            results.append(g.add_node(op, [i[names[k]] if k >= 0 else results[-k - 1] for k in operands], **attrs))
        return results[-1]

    return Pair(inputs, unfused, lambda g, i: g.elementwise_region([i[n] for n in names], chain=json.dumps(chain)))


def elementwise_region(data: st.DataObject) -> Pair:
    """A random chain: operand i >= 0 is region input i, -k the result of step k-1."""
    shape = draw_shape(data, 2, 3)
    n_inputs = data.draw(st.integers(1, 3), label="inputs")
    # every input has the region's shape or a trailing part of it (trailing broadcast)
    inputs = {f"x{j}": shape[data.draw(st.integers(0, len(shape) - 1)) if j else 0:] for j in range(n_inputs)}
    chain: list[list[Any]] = []
    for step in range(data.draw(st.integers(1, 6), label="steps")):
        operand = st.sampled_from([*range(n_inputs), *(-s - 1 for s in range(step))])
        if data.draw(st.booleans(), label="binary"):
            chain.append([data.draw(st.sampled_from(BINARY_STEPS)), {}, [data.draw(operand), data.draw(operand)]])
        else:
            op, attrs = data.draw(st.sampled_from(UNARY_STEPS))
            chain.append([op, attrs, [data.draw(operand)]])
    return region_pair(inputs, chain)


def elementwise_region_where(data: st.DataObject) -> Pair:
    """A chain with a bool intermediate: Mul(Where(Greater(x, y), x, z), z)."""
    shape = draw_shape(data, 2, 3)
    chain = [["Greater", {}, [0, 1]], ["Where", {}, [-1, 0, 2]], ["Mul", {}, [-2, 2]]]
    return region_pair({"x": shape, "y": shape[1:], "z": shape}, chain)


def concat_params(data: st.DataObject) -> Pair:
    base = draw_shape(data, 1, 3)
    axis = data.draw(st.integers(-len(base), len(base) - 1), label="axis")
    sizes = data.draw(st.lists(DIM, min_size=1, max_size=4), label="sizes")
    names = [f"w{j}" for j in range(len(sizes))]
    leaves = {n: tuple(s if d == axis % len(base) else b for d, b in enumerate(base)) for n, s in zip(names, sizes,
                                                                                                   strict=True)}
    return Pair(leaves, lambda g, i: g.concat([i[n] for n in names], axis=axis),
                lambda g, i: g.concat_params([i[n] for n in names], axis=axis), frozenset(names))


CASES: list[tuple[str, str, Make]] = [
    *((op, f"{op}-d-{d}", matmul_add(op, primitive, d)) for op, primitive in MATMUL_ADD.items() for d in D_SHAPES),
    *(("FusedMatMulBiasAct", f"FusedMatMulBiasAct-{a}-{r}d", matmul_bias_act(a, r))
      for a in ACTIVATIONS for r in (2, 3)),
    ("FusedResidualLN", "FusedResidualLN", residual_ln),
    ("FusedResidualRmsNorm", "FusedResidualRmsNorm", residual_rms(False)),
    ("FusedResidualRmsNorm", "FusedResidualRmsNorm-beta", residual_rms(True)),
    ("FusedRmsNormMatMul", "FusedRmsNormMatMul", rms_norm_matmul),
    ("SwiGLU", "SwiGLU", swiglu),
    ("FusedSwiGLU", "FusedSwiGLU-up-first", fused_swiglu(False)),
    ("FusedSwiGLU", "FusedSwiGLU-gate-first", fused_swiglu(True)),
    ("GroupNormSilu", "GroupNormSilu", group_norm_silu),
    ("CausalAttentionRoPE", "CausalAttentionRoPE", causal_attention_rope(False)),
    ("CausalAttentionRoPE", "CausalAttentionRoPE-gqa", causal_attention_rope(True)),
    ("FusedAttentionBlock", "FusedAttentionBlock", attention_block),
    *(("FusedTransformerLayer", f"FusedTransformerLayer-{a}", transformer_layer(a)) for a in ACTIVATIONS),
    ("ElementwiseRegion", "ElementwiseRegion", elementwise_region),
    ("ElementwiseRegion", "ElementwiseRegion-where", elementwise_region_where),
    ("ConcatParams", "ConcatParams", concat_params),
]


def test_every_fused_op_has_a_case() -> None:
    fused = {name for name, spec in REGISTRY.items() if spec.kind in (Kind.FUSED, Kind.WEIGHT_PREP)}
    assert {op for op, _, _ in CASES} == fused


@pytest.mark.parametrize(("op", "make"), [(op, make) for op, _, make in CASES], ids=[label for _, label, _ in CASES])
@SETTINGS
@given(data=st.data())
def test_fused_matches_unfused(op: str, make: Make, data: st.DataObject) -> None:
    assert_fused_matches(op, make(data))
