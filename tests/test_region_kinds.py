"""Region kinds: the upsample prologue of an ElementwiseRegion, TransformRegion, BatchElementwiseRegion, and
FusedSwiGLU's output cast; each with its kernel checked against the steps it replaces."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rlx_egraph
from rlx_egraph import Graph, evaluate, optimize, optimize_with_report
from rlx_egraph.compile import legalize
from rlx_egraph.cost import get_target, profile
from rlx_egraph.ir import PARITY_TOLERANCE, Kind, op_spec
from rlx_egraph.ir.decompose import decompose
from rlx_egraph.ir.ops.activations import SWIGLU_CASTS
from rlx_egraph.ir.ops.regions import REGION_KINDS
from rlx_egraph.report.fusion import FusionReport

CUDA = get_target("cuda")
ENGINES = ["egglog", "fallback"]


def bit_equal(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for a, b in zip(got, want, strict=True):
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes())


def upsample_then_scale() -> Graph:
    """An NCHW feature map upsampled 2x, scaled per column and passed through ReLU."""
    g = Graph("upsample")
    x, w = g.input("x", (1, 4, 8, 8)), g.param("w", (16,))
    g.set_outputs([g.relu(g.mul(g.upsample2x(x), w))])
    return g


@pytest.mark.parametrize("engine", ENGINES)
def test_an_upsample_feeding_a_chain_is_the_regions_prologue(engine: str) -> None:
    """design: fusion passes UnfuseElementwiseRegions (an ElementwiseRegion's RegionPrologue::ResizeNearest2x
    reads input 0 through the upsample) and fusion_report::count_ops (fk_prologue_region)."""
    g = upsample_then_scale()
    opt, report = optimize_with_report(g, "cuda", engine=engine, verify=True)
    (region,) = [n for n in opt.nodes if n.kind is not Kind.LEAF]
    assert (region.op, region.inputs, region.attrs["prologue"]) == ("ElementwiseRegion", (0, 1), "upsample2x")
    assert [s[0] for s in json.loads(region.attrs["chain"])["steps"]] == ["Mul", "Relu"]
    assert report.parity.ok
    bit_equal(evaluate(opt), evaluate(g))
    # the 4x larger upsampled map is never written nor read: 16 KiB of traffic and two launches saved
    before, after = report.profile_before, report.profile_after
    assert (before.launches, after.launches) == (3, 1)
    assert before.traffic_bytes - after.traffic_bytes == 2 * 2 * 4 * 16 * 16 * 4
    assert FusionReport.scan(opt).region_prologues == 1 and report.fusion.region_prologues == 1
    unfused = legalize(opt, "wgpu")  # no region kernels: the upsample and the steps come back
    assert [n.op for n in unfused.nodes if n.kind is not Kind.LEAF] == ["Upsample2x", "Mul", "Relu"]
    bit_equal(evaluate(unfused), evaluate(g))


def test_one_step_after_an_upsample_is_a_region_of_its_own() -> None:
    """design: fusion passes UnfuseElementwiseRegions (a prologue region decomposes to ResizeNearest2x and its
    chain)."""
    g = Graph("upsample-relu")
    g.set_outputs([g.relu(g.upsample2x(g.input("x", (2, 3, 4, 4), "f16")))])
    opt = optimize(g, "cuda")
    assert [(n.op, n.attrs.get("prologue")) for n in opt.nodes][1:] == [("ElementwiseRegion", "upsample2x")]
    bit_equal(evaluate(opt), evaluate(g))
    assert [n.op for n in decompose(opt, set(REGION_KINDS)).nodes] == ["Input", "Upsample2x", "Relu"]


def test_an_upsample_read_elsewhere_too_stays_a_node() -> None:
    """design: fusion passes MarkElementwiseRegions (a value read by more than one consumer ends a chain)."""
    g = Graph("upsample-shared")
    up = g.upsample2x(g.input("x", (1, 2, 4, 4)))
    g.set_outputs([g.tanh(g.relu(up)), up])
    opt = optimize(g, "cuda")
    assert [(n.op, n.attrs.get("prologue")) for n in opt.nodes][1:] == [("Upsample2x", None),
                                                                        ("ElementwiseRegion", "none")]


def transpose_between_chains() -> Graph:
    """bias and tanh, then a transpose, then a per-row scale and ReLU: two chains the elementwise pass splits."""
    g = Graph("transform")
    x, b, c = g.input("x", (16, 32)), g.param("b", (32,)), g.param("c", (16,))
    h = g.tanh(g.add(x, b))
    g.set_outputs([g.relu(g.mul(g.transpose(h, perm=(1, 0)), c))])
    return g


@pytest.mark.parametrize("engine", ENGINES)
def test_a_transpose_between_two_chains_is_one_transform_region(engine: str) -> None:
    """design: fusion_report::count_ops (Op::TransformRegion, counted as transform_region)."""
    g = transpose_between_chains()
    opt, report = optimize_with_report(g, "cuda", engine=engine, verify=True)
    (region,) = [n for n in opt.nodes if n.kind is not Kind.LEAF]
    assert region.op == "TransformRegion"
    assert [s[0] for s in json.loads(region.attrs["chain"])["steps"]] == ["Add", "Tanh", "Transpose", "Mul", "Relu"]
    assert report.parity.ok and report.fusion.after == {"TransformRegion": 1}
    bit_equal(evaluate(opt), evaluate(g))
    assert (report.profile_before.launches, report.profile_after.launches) == (4, 1)
    no_transform = CUDA.replace(name="no-transform", unsupported=frozenset({"TransformRegion"}))
    split = optimize(g, no_transform)  # the elementwise pass alone: a region on each side of the view
    assert [n.op for n in split.nodes if n.kind is not Kind.LEAF] == ["ElementwiseRegion", "Transpose",
                                                                      "ElementwiseRegion"]
    assert profile(opt, CUDA).ns < profile(split, CUDA).ns
    bit_equal(evaluate(split), evaluate(g))


def two_branches_of_one_program() -> Graph:
    """Q and K scaled by one vector and squashed the same way, then multiplied: two independent copies of one
    chain."""
    g = Graph("batch")
    q, k, s = g.input("q", (8, 16)), g.input("k", (8, 16)), g.param("s", (16,))
    qs, ks = g.tanh(g.mul(q, s)), g.tanh(g.mul(k, s))
    g.set_outputs([g.matmul(qs, g.transpose(ks, perm=(1, 0)))])
    return g


@pytest.mark.parametrize("engine", ENGINES)
def test_independent_copies_of_one_chain_are_one_batched_region(engine: str) -> None:
    """design: fusion_report::count_ops (Op::BatchElementwiseRegion, counted as batch_elementwise_region)."""
    g = two_branches_of_one_program()
    opt, report = optimize_with_report(g, "cuda", engine=engine, verify=True)
    batch = next(n for n in opt.nodes if n.op == "BatchElementwiseRegion")
    assert (batch.attrs["lanes"], batch.type.shape, batch.inputs) == (2, (2, 8, 16), (0, 2, 1, 2))
    assert [s[0] for s in json.loads(batch.attrs["chain"])["steps"]] == ["Mul", "Tanh"]
    lanes = [n for n in opt.nodes if n.op == "Reshape"]  # each lane keeps its id, a view of the batch
    assert [(n.id, opt.node(n.inputs[0]).attrs["start"]) for n in lanes] == [(4, 0), (6, 1)]
    assert report.parity.ok and report.fusion.after == {"BatchElementwiseRegion": 1}
    assert (report.profile_before.launches, report.profile_after.launches) == (5, 2)
    bit_equal(evaluate(opt), evaluate(g))
    result = rlx_egraph.compile(g, "cuda", engine=engine)  # the plan runs the lanes as views of the batch
    bit_equal(result.run(), evaluate(g))


def test_lanes_that_depend_on_each_other_are_not_batched() -> None:
    """design: fusion passes MarkElementwiseRegions (only independent work shares a kernel)."""
    g = Graph("chain")
    x = g.input("x", (8, 16))
    first = g.tanh(g.matmul(x, g.param("w1", (16, 16))))
    second = g.tanh(g.matmul(first, g.param("w2", (16, 16))))  # reads the first lane's value: not independent
    g.set_outputs([second])
    assert "BatchElementwiseRegion" not in optimize(g, "cuda").op_counts()


@pytest.mark.parametrize("op", ["TransformRegion", "BatchElementwiseRegion"])
def test_a_target_without_region_kernels_gets_the_steps_back(op: str) -> None:
    """design: fusion passes UnfuseElementwiseRegions (a backend without region kernels gets the atomic ops)."""
    g = transpose_between_chains() if op == "TransformRegion" else two_branches_of_one_program()
    fused = optimize(g, "cuda")
    assert op in fused.op_counts()
    assert op_spec(op).kind is Kind.FUSED and not get_target("wgpu").supports(op)
    unfused = legalize(fused, "wgpu")
    assert not set(REGION_KINDS) & set(unfused.op_counts())
    np.testing.assert_allclose(evaluate(unfused)[0], evaluate(g)[0], rtol=1e-6, atol=1e-6)
    assert not set(REGION_KINDS) & set(optimize(g, "wgpu").op_counts())


def swiglu_then_cast(dt: str) -> Graph:
    g = Graph("swiglu-cast")
    x = g.input("x", (4, 32))
    wg, wu = g.param("wg", (32, 64)), g.param("wu", (32, 64))
    h = g.mul(g.silu(g.matmul(x, wg)), g.matmul(x, wu))
    g.set_outputs([g.matmul(g.cast(h, dtype=dt), g.param("down", (64, 32), dt))])
    return g


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_a_cast_after_fused_swiglu_is_its_epilogue(engine: str, dt: str) -> None:
    """design: Op::FusedSwiGLU { cast_to, gate_first } (the fused kernel writes its result in the cast dtype)."""
    g = swiglu_then_cast(dt)
    opt, report = optimize_with_report(g, "cuda", engine=engine, verify=True)
    (swiglu,) = [n for n in opt.nodes if n.op == "FusedSwiGLU"]
    assert (swiglu.attrs, swiglu.dtype) == ({"gate_first": True, "cast_to": dt}, dt)
    assert "Cast" not in opt.op_counts() and report.parity.ok
    assert "fused-swiglu-cast" in report.matches_per_rule


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("cast_to", SWIGLU_CASTS[1:])
def test_fused_swiglu_cast_kernel_matches_its_decomposition(dtype: str, cast_to: str) -> None:
    """design: Op::FusedSwiGLU { cast_to } (the kernel computes what SwiGLU then Cast compute)."""
    g = Graph("cast")
    cat = g.param("cat", (3, 5, 12), dtype)
    g.set_outputs([g.fused_swiglu(cat, gate_first=False, cast_to=cast_to)])
    assert g.node(g.outputs[0]).dtype == cast_to
    unfused = decompose(g)
    assert unfused.op_counts()["Cast"] == 1 and "FusedSwiGLU" not in unfused.op_counts()
    (got,), (want,) = evaluate(g), evaluate(unfused)
    rtol, atol = PARITY_TOLERANCE[cast_to] if cast_to != "f32" else PARITY_TOLERANCE[dtype]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize("op", list(REGION_KINDS))
def test_every_region_kind_computes_its_steps_bit_for_bit(op: str) -> None:
    """design: fusion passes UnfuseElementwiseRegions (a region decomposes back to its atomic ops, same values)."""
    rng = np.random.default_rng(7)
    spec = op_spec(op)
    for _ in range(12):
        types, attrs = spec.sample(rng)
        g = Graph(op)
        g.set_outputs([g.add_node(op, [g.param(f"in{k}", t.shape) for k, t in enumerate(types)], **attrs)])
        bit_equal(evaluate(g), evaluate(decompose(g, set(REGION_KINDS))))
