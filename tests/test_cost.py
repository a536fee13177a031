"""The IO cost model: presets, graph profiles, per-node costs and the seed's fusion gate."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import calibrations
from rlx_egraph import Graph, examples, optimize
from rlx_egraph.cost import (
    TARGETS,
    FusionBenefit,
    IoProfile,
    NodeCost,
    Target,
    fusion_benefit,
    get_target,
    node_cost,
    profile,
)
from rlx_egraph.cost.calibration import OpRate
from rlx_egraph.ir import REGISTRY, Kind, OpSpec, TensorType, op_spec, register

SYNC_OP = "TestHostSync"

# --- the seed's gate tests ---------------------------------------------------------

DENSE = dict(launches=3, sync_points=0, readback_bytes=33_554_432, traffic_bytes=184_549_376, flops=0)
FUSED = dict(launches=4, sync_points=1, readback_bytes=1_048_576, traffic_bytes=219_152_384, flops=0)


def test_seed_gate_benefit_counts() -> None:
    b = fusion_benefit(IoProfile(**DENSE, target="metal"), IoProfile(**FUSED, target="metal"))
    assert b == FusionBenefit(launches_saved=-1, sync_points_saved=-1, readback_bytes_saved=32_505_856,
                              traffic_bytes_saved=-34_603_008, flops_saved=0)


def test_seed_gate_fuses_on_metal() -> None:
    dense, fused = IoProfile(**DENSE, target="metal"), IoProfile(**FUSED, target="metal")
    score = fusion_benefit(dense, fused).score_ns("metal")
    # -1 launch * 500 - 1 sync * 5_000 - 34_603_008 B / 200 + 32_505_856 B / 1.0 (unified) - 1 * 2_000_000
    print("metal gate score ns:", score)
    assert score == pytest.approx(30_327_340.96, rel=1e-12)
    assert TARGETS["metal"].should_fuse(dense, fused)


def test_seed_gate_rejects_on_wgpu() -> None:
    dense, fused = IoProfile(**DENSE, target="wgpu"), IoProfile(**FUSED, target="wgpu")
    score = fusion_benefit(dense, fused).score_ns(TARGETS["wgpu"])
    # -3_000 - 30_000 - 34_603_008 / 100 + 32_505_856 / 40 - 25_000_000
    print("wgpu gate score ns:", score)
    assert score == pytest.approx(-24_566_383.68, rel=1e-12)
    assert not TARGETS["wgpu"].should_fuse(dense, fused)


def test_seed_readback_saved_benefit() -> None:
    dense = IoProfile(launches=2, sync_points=1, readback_bytes=8192, traffic_bytes=16384, flops=0, target="metal")
    fused = IoProfile(launches=1, sync_points=1, readback_bytes=512, traffic_bytes=16384, flops=0, target="metal")
    b = fusion_benefit(dense, fused)
    assert b == FusionBenefit(1, 0, 7680, 0, 0)
    assert b.readback_bytes_saved > 0 and b.launches_saved >= 0
    assert b.score_ns("metal") == 500 + 7680 / 1.0


def test_a_sync_point_costs_roundtrip_and_penalty_both_ways() -> None:
    removed = FusionBenefit(0, 2, 0, 0, 0)
    added = FusionBenefit(0, -2, 0, 0, 0)
    assert removed.score_ns("metal") == 2 * (5_000 + 2_000_000)
    assert added.score_ns("metal") == -removed.score_ns("metal")
    assert added.score_ns("cuda") == -2 * 20_000 - 2 * 100_000


def test_should_fuse_is_the_extractions_rule() -> None:
    before = IoProfile(launches=3, sync_points=0, readback_bytes=0, traffic_bytes=0, flops=0, target="metal")
    after = dataclasses.replace(before, launches=1)
    metal = TARGETS["metal"]
    assert fusion_benefit(before, after).score_ns(metal) == before.ns - after.ns == 1_000
    assert metal.should_fuse(before, after) and not metal.should_fuse(after, before)
    assert not metal.should_fuse(before, before)  # no gain, no rewrite


def test_should_fuse_agrees_with_what_optimize_extracts() -> None:
    for target in ("cpu", "metal", "wgpu"):
        g = examples.mlp(layers=2)
        fused = optimize(g, target=target, regions=False)
        assert TARGETS[target].should_fuse(profile(g, target), profile(fused, target)) == (fused != g)


def test_should_fuse_respects_unsupported_ops() -> None:
    wgpu = TARGETS["wgpu"]
    plain = IoProfile(launches=3, sync_points=0, readback_bytes=0, traffic_bytes=0, flops=0, target=wgpu,
                      ops={"Add", "Relu"})
    region = IoProfile(launches=1, sync_points=0, readback_bytes=0, traffic_bytes=0, flops=0, target=wgpu,
                       ops={"ElementwiseRegion"})
    assert fusion_benefit(plain, region).score_ns(wgpu) == 6_000  # would pass the gate on counts alone
    assert not wgpu.should_fuse(plain, region)
    assert wgpu.should_fuse(region, plain)
    assert TARGETS["metal"].should_fuse(plain, region)


# --- targets -------------------------------------------------------------------------


def test_seed_presets_exact() -> None:
    metal, wgpu = TARGETS["metal"], TARGETS["wgpu"]
    assert (metal.dispatch_ns, metal.roundtrip_ns, metal.memory_bw, metal.host_readback_bw, metal.unified,
            metal.host_thunk_penalty_ns) == (500, 5_000, 200, 200, True, 2_000_000)
    assert (wgpu.dispatch_ns, wgpu.roundtrip_ns, wgpu.memory_bw, wgpu.host_readback_bw, wgpu.unified,
            wgpu.host_thunk_penalty_ns) == (3_000, 30_000, 100, 40, False, 25_000_000)
    assert metal.flops_per_ns == wgpu.flops_per_ns == math.inf
    assert metal.unified_readback_bw == 1.0 and metal.readback_bw == 1.0
    assert wgpu.readback_bw == 40


def test_preset_flags() -> None:
    assert list(TARGETS) == ["cpu", "cuda", "metal", "wgpu", "onnxruntime"]
    assert all(t.name == name for name, t in TARGETS.items())
    assert {n: t.region_kernels for n, t in TARGETS.items()} == {"cpu": True, "cuda": True, "metal": True,
                                                                   "wgpu": False, "onnxruntime": False}
    assert {n: t.unsupported for n, t in TARGETS.items()} == {
        "cpu": frozenset(), "cuda": frozenset(), "metal": frozenset(),
        "wgpu": frozenset({"FusedTransformerLayer", "ElementwiseRegion", "TransformRegion",
                           "BatchElementwiseRegion"}),
        "onnxruntime": frozenset({"CausalAttentionRoPE", "ElementwiseRegion", "FusedRmsNormMatMul", "FusedSwiGLU",
                                  "FusedTransformerLayer", "GroupNormSilu", "SwiGLU", "TransformRegion",
                                  "BatchElementwiseRegion"})}
    assert not TARGETS["wgpu"].supports("ElementwiseRegion") and TARGETS["wgpu"].supports("MatMul")
    assert TARGETS["cpu"].readback_bw == 20.0 and TARGETS["cuda"].readback_bw == 25.0


def test_get_target() -> None:
    assert get_target("cuda") is TARGETS["cuda"]
    custom = TARGETS["cpu"].replace(name="mine")
    assert get_target(custom) is custom
    with pytest.raises(ValueError, match=r"unknown target 'tpu' \(known: cpu, cuda, metal, wgpu, onnxruntime\)"):
        get_target("tpu")


def test_replace_and_frozen() -> None:
    cpu = TARGETS["cpu"]
    fast = cpu.replace(dispatch_ns=1.0)
    assert fast.dispatch_ns == 1.0 and cpu.dispatch_ns == 3_000.0 and fast.memory_bw == cpu.memory_bw
    with pytest.raises(dataclasses.FrozenInstanceError):
        cpu.dispatch_ns = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(("changes", "message"), [
    ({"memory_bw": 0.0}, "target 'cpu': memory_bw=0.0 must be > 0"),
    ({"flops_per_ns": -1.0}, "target 'cpu': flops_per_ns=-1.0 must be > 0"),
    ({"dispatch_ns": -5.0}, "target 'cpu': dispatch_ns=-5.0 must be a finite number >= 0"),
    ({"host_thunk_penalty_ns": math.inf}, "target 'cpu': host_thunk_penalty_ns=inf must be a finite number >= 0"),
    ({"unsupported": {"Relu", "NoSuchOp"}}, "target 'cpu': unsupported names unknown op(s) ['NoSuchOp']"),
    ({"name": ""}, "a target needs a name"),
])
def test_target_validation(changes: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        TARGETS["cpu"].replace(**changes)
    assert str(info.value) == message


def test_target_defaults() -> None:
    t = Target(name="plain", dispatch_ns=1.0, roundtrip_ns=2.0, memory_bw=3.0, host_readback_bw=4.0, unified=False,
               host_thunk_penalty_ns=5.0)
    assert (t.unified_readback_bw, t.flops_per_ns, t.unsupported, t.region_kernels) == (1.0, math.inf, frozenset(),
                                                                                        True)
    assert t.readback_bw == 4.0 and t.replace(unified=True).readback_bw == 1.0
    assert t.terms(1, 1, 3, 8, 10**9) == {"dispatch": 1.0, "sync": 7.0, "traffic": 1.0, "readback": 2.0,
                                         "compute": 0.0}


def test_unsupported_is_coerced_to_frozenset() -> None:
    t = TARGETS["cpu"].replace(unsupported=["Relu"])
    assert t.unsupported == frozenset({"Relu"}) and isinstance(t.unsupported, frozenset)


# --- profiles of small graphs --------------------------------------------------------


def mlp(dtype: str = "f32") -> tuple[Graph, int]:
    """relu(x @ w + b) with x [8, 16], w [16, 32], b [32]."""
    g = Graph("mlp")
    x = g.input("x", (8, 16), dtype)
    w = g.param("w", (16, 32), dtype)
    b = g.param("b", (32,), dtype)
    y = g.relu(g.add(g.matmul(x, w), b))
    g.set_outputs([y])
    return g, y


# MatMul: x 512 B + w 2048 B + out 1024 B; Add: 1024 + 128 + 1024; Relu: 1024 + 1024.
MLP_TRAFFIC = (512 + 2048 + 1024) + (1024 + 128 + 1024) + (1024 + 1024)
MLP_FLOPS = 2 * 8 * 32 * 16 + 8 * 32 + 8 * 32


def test_profile_mlp() -> None:
    p = profile(mlp()[0])
    assert MLP_TRAFFIC == 7808 and MLP_FLOPS == 8704
    assert (p.launches, p.sync_points, p.readback_bytes, p.traffic_bytes, p.flops) == (3, 0, 1024, 7808, 8704)
    assert p.target is TARGETS["cpu"]
    assert p.ops == frozenset({"Input", "Param", "MatMul", "Add", "Relu"})


def test_profile_f16_halves_bytes() -> None:
    p32, p16 = profile(mlp("f32")[0]), profile(mlp("f16")[0])
    assert (p16.traffic_bytes, p16.readback_bytes) == (3904, 512)
    assert (p16.traffic_bytes * 2, p16.readback_bytes * 2) == (p32.traffic_bytes, p32.readback_bytes)
    assert (p16.launches, p16.flops) == (p32.launches, p32.flops)


def test_layout_leaves_and_weight_prep_are_free() -> None:
    g = Graph()
    x = g.input("x", (4, 6))
    t = g.transpose(g.reshape(x, shape=(6, 4)), perm=(1, 0))
    n = g.narrow(t, axis=-1, start=0, length=3)
    c = g.concat([n, n], axis=-1)
    e = g.expand(g.reshape(c, shape=(1, 4, 6)), shape=(2, 4, 6))
    w = g.concat_params([g.param("wa", (6, 2)), g.param("wb", (6, 2))], axis=-1)
    g.scalar(2.0)
    g.constant([1.0, 2.0])
    g.set_outputs([e, w])
    p = profile(g, "metal")
    assert (p.launches, p.sync_points, p.traffic_bytes, p.flops) == (0, 0, 0, 0)
    assert p.readback_bytes == 2 * 4 * 6 * 4 + 6 * 4 * 4  # outputs are read back even when they are views
    assert p.breakdown()["dispatch"] == 0.0 and p.ns == p.readback_bytes / 1.0


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_only_a_node_that_launches_a_kernel_has_its_attributes_priced(name: str) -> None:
    """``prices_attributes`` (extraction's memo leaves attributes out of the key where it is false): a node that
    launches nothing, or that the target cannot run, costs the same whatever its attributes and types."""
    target = get_target(name)
    f32 = TensorType((4, 6), "f32")
    for op, spec in sorted(REGISTRY.items()):
        for reads_intermediate in (False, True):
            priced = target.prices_attributes(spec, reads_intermediate)
            copies = target.copies(spec, reads_intermediate)
            assert priced == (target.supports(op) and (spec.kind.launches > 0 or copies)), (op, reads_intermediate)
            if not priced:
                costs = {target.node_ns(spec, attrs, [f32] * 2, out, reads_intermediate)
                         for attrs in ({}, {"name": "w", "value": 2.0}) for out in (f32, TensorType((9,), "f16"))}
                assert costs == {math.inf if not target.supports(op) else 0.0}, (op, costs)
    assert target.prices_attributes(REGISTRY["MatMul"]) == target.supports("MatMul")
    assert not target.prices_attributes(REGISTRY["Param"], True)
    assert target.prices_attributes(REGISTRY["Transpose"], True) == ("Transpose" in target.copied_layouts)


def test_outputs_read_back_once() -> None:
    g, y = mlp()
    g.set_outputs([y, y])
    assert profile(g).readback_bytes == 1024
    mm = g.node(y).inputs[0]
    g.set_outputs([y, mm, y])
    assert profile(g).readback_bytes == 2048
    assert profile(g).traffic_bytes == MLP_TRAFFIC


def test_repeated_input_slot_counts_each_slot() -> None:
    g = Graph()
    x = g.input("x", (10,))
    g.set_outputs([g.mul(x, x)])
    assert profile(g).traffic_bytes == 40 + 40 + 40


def region_graph() -> Graph:
    g = Graph("region")
    x, b = g.input("x", (8, 32)), g.param("b", (32,))
    r = g.elementwise_region([x, b], chain=json.dumps([["Add", {}, [0, 1]], ["Relu", {}, [-1]]]))
    g.set_outputs([r])
    return g


def test_unsupported_op_costs_inf() -> None:
    g = region_graph()
    p = profile(g, "wgpu")
    assert (p.launches, p.traffic_bytes, p.flops, p.readback_bytes) == (1, 1024 + 128 + 1024, 2 * 256, 1024)
    assert p.unsupported_ops == ("ElementwiseRegion",)
    assert p.ns == math.inf and p.breakdown()["unsupported"] == math.inf
    assert "(unsupported: ElementwiseRegion)" in str(p)
    assert profile(g, "metal").ns == 500 + 2176 / 200 + 1024 / 1.0
    no_relu = TARGETS["cpu"].replace(unsupported={"Relu"})
    assert profile(mlp()[0], no_relu).ns == math.inf
    assert no_relu.node_ns(op_spec("Relu"), {}, [TensorType((4,))], TensorType((4,))) == math.inf


@contextmanager
def registered_host_sync() -> Iterator[OpSpec]:
    """A test-only HOST_SYNC op (identity), in the registry only inside the block."""
    spec = OpSpec(SYNC_OP, Kind.HOST_SYNC, ("x",), lambda a, ins: ins[0], lambda a, x: x,
                  doc="Test-only host-synchronising identity.")
    register(spec)
    try:
        yield spec
    finally:
        del REGISTRY[SYNC_OP]


@pytest.fixture
def host_sync_op() -> Iterator[OpSpec]:
    with registered_host_sync() as spec:
        yield spec


def test_host_sync_op_adds_sync(host_sync_op: OpSpec) -> None:
    g, y = mlp()
    s = g.add_node(SYNC_OP, [y])
    g.set_outputs([s])
    p = profile(g, "metal")
    assert (p.launches, p.sync_points, p.traffic_bytes, p.readback_bytes) == (4, 1, MLP_TRAFFIC + 2048, 1024)
    assert p.breakdown()["sync"] == 5_000.0 + 2_000_000.0  # roundtrip + host-thunk penalty
    assert node_cost(host_sync_op, {}, [TensorType((8, 32))], TensorType((8, 32))) == NodeCost(1, 1, 2048, 256, rows=8)


def test_host_sync_op_is_removed_even_on_error() -> None:
    with pytest.raises(RuntimeError), registered_host_sync():
        assert SYNC_OP in REGISTRY
        raise RuntimeError
    assert SYNC_OP not in REGISTRY


def test_node_cost_of_free_kinds() -> None:
    t = TensorType((3, 4))
    assert node_cost(op_spec("Transpose"), {"perm": (1, 0)}, [t], TensorType((4, 3))) == NodeCost(0, 0, 0, 0)
    assert node_cost(op_spec("ConcatParams"), {"axis": -1}, [t, t], TensorType((3, 8))) == NodeCost(0, 0, 0, 0)
    assert node_cost(op_spec("Relu"), {}, [t], t) == NodeCost(1, 0, 96, 12, rows=3)


# --- node_ns is the per-node share of profile ----------------------------------------

AddNode = Callable[[Graph, int], int]
NEW_NODES: dict[str, AddNode] = {
    "relu": lambda g, y: g.relu(y),
    "matmul": lambda g, y: g.matmul(y, g.param("w2", (32, 64))),
    "layer_norm": lambda g, y: g.layer_norm(y, g.param("g2", (32,)), g.param("b2", (32,)), eps=1e-5),
    "transpose": lambda g, y: g.transpose(y, perm=(1, 0)),
    "host_sync": lambda g, y: g.add_node(SYNC_OP, [y]),
}


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("new", list(NEW_NODES))
def test_node_ns_equals_profile_delta(target: str, new: str, host_sync_op: OpSpec) -> None:
    g, y = mlp()
    before = profile(g, target)
    nid = NEW_NODES[new](g, y)  # outputs unchanged, so the delta is the new node alone
    after = profile(g, target)
    node = g.node(nid)
    reads_intermediate = any(g.node(i).kind is not Kind.LEAF for i in node.inputs)
    ns = TARGETS[target].node_ns(node.spec, node.attrs, [g.node(i).type for i in node.inputs], node.type,
                                 reads_intermediate)
    assert after.ns - before.ns == pytest.approx(ns, rel=1e-12, abs=1e-9)
    copied = node.op in TARGETS[target].copied_layouts  # onnxruntime runs a Transpose of an intermediate
    assert (ns == 0.0) == (node.kind is Kind.LAYOUT and not copied)
    assert copied == (target == "onnxruntime" and new == "transpose")


def test_node_ns_exact_figures() -> None:
    relu = op_spec("Relu")
    t = TensorType((8, 32))
    # one launch, 2048 bytes, 256 FLOPs
    assert TARGETS["cpu"].node_ns(relu, {}, [t], t) == 3_000 + 2048 / 20 + 256 / 100
    assert TARGETS["cuda"].node_ns(relu, {}, [t], t) == 5_000 + 2048 / 1_000 + 256 / 20_000
    assert TARGETS["metal"].node_ns(relu, {}, [t], t) == 500 + 2048 / 200
    assert TARGETS["wgpu"].node_ns(relu, {}, [t], t) == 3_000 + 2048 / 100


# --- the ns formula term by term -----------------------------------------------------

# MLP: 3 launches, 0 syncs, 7808 traffic bytes, 1024 readback bytes, 8704 FLOPs.
MLP_TERMS = {
    "cpu": {"dispatch": 9_000.0, "sync": 0.0, "traffic": 390.4, "readback": 51.2, "compute": 87.04},
    "cuda": {"dispatch": 15_000.0, "sync": 0.0, "traffic": 7.808, "readback": 40.96, "compute": 0.4352},
    "metal": {"dispatch": 1_500.0, "sync": 0.0, "traffic": 39.04, "readback": 1_024.0, "compute": 0.0},
    "wgpu": {"dispatch": 9_000.0, "sync": 0.0, "traffic": 78.08, "readback": 25.6, "compute": 0.0},
}
MLP_NS = {"cpu": 9_528.64, "cuda": 15_049.2032, "metal": 2_563.04, "wgpu": 9_103.68}


@pytest.mark.parametrize("target", list(MLP_TERMS))
def test_ns_formula_per_preset(target: str) -> None:
    p = profile(mlp()[0], target)
    terms = p.breakdown()
    assert terms.pop("unsupported") == 0.0
    assert terms.pop("run") == terms.pop("values") == terms.pop("stream") == terms.pop("masked") == 0.0  # the presets
    # price none of them
    assert terms == pytest.approx(MLP_TERMS[target], rel=1e-12)
    assert p.ns == pytest.approx(MLP_NS[target], rel=1e-12)


def test_measured_lines_price_each_op_and_the_run() -> None:
    """On a calibrated target each op's nodes are priced by its line (MatMul's own; Add and Relu by the
    elementwise kind's), plus the run's fixed cost; readback at the calibration's memory bandwidth."""
    tgt = calibrations.target({"MatMul": OpRate(1_000.0, 0.5, 0.25), "elementwise": OpRate(400.0, 1.0, 0.0)}).replace(
        value_ns=600.0, value_ns_per_byte=0.5)
    p = profile(mlp()[0], tgt)
    assert {op: (c.launches, c.traffic_bytes, c.flops) for op, c in p.by_op.items()} == {
        "MatMul": (1, 3584, 8192), "Add": (1, 2176, 256), "Relu": (1, 2048, 256)}
    assert (p.values, p.value_bytes) == (2, 512 + 1024)  # the input x [8, 16] and the output [8, 32]
    terms = p.breakdown()
    assert terms == {"dispatch": 1_800.0, "sync": 0.0, "traffic": 1_792.0 + 2_176.0 + 2_048.0,
                     "readback": 1024 / 10.0, "compute": 2_048.0, "run": 5_000.0, "values": 2 * 600.0 + 768.0,
                     "stream": 0.0, "masked": 0.0, "unsupported": 0.0}  # the fixture prices no weights from memory
    # and no masked rows
    assert p.ns == 1_800.0 + 6_016.0 + 102.4 + 2_048.0 + 5_000.0 + 1_968.0
    relu = next(n for n in mlp()[0].nodes if n.op == "Relu")
    assert tgt.node_ns(relu.spec, {}, [relu.type], relu.type) == 400.0 + 2_048.0
    assert p.kind_ns("elementwise") == 400.0 + 2_176.0 + 400.0 + 2_048.0
    # a profile made without per-op counts is priced by the target-wide figures
    bare = IoProfile(p.launches, p.sync_points, p.readback_bytes, p.traffic_bytes, p.flops, tgt)
    assert bare.ns == 3 * 1_000.0 + 7808 / 10.0 + 102.4 + 8704 / 100.0 + 5_000.0  # and no graph values counted


def test_sync_term_is_roundtrip_plus_penalty(host_sync_op: OpSpec) -> None:
    g, y = mlp()
    g.set_outputs([g.add_node(SYNC_OP, [y])])
    assert {t: profile(g, t).breakdown()["sync"] for t in TARGETS} == {
        "cpu": 0.0, "cuda": 120_000.0, "metal": 2_005_000.0, "wgpu": 25_030_000.0, "onnxruntime": 0.0}


def test_str_and_to_dict() -> None:
    p = profile(mlp()[0], "metal")
    assert str(p) == "metal: 3 launches, 0 syncs, traffic 7.81 kB, readback 1.02 kB, 8,704 FLOPs -> 2.56 us"
    d = json.loads(json.dumps(p.to_dict()))
    assert d["target"] == "metal"
    assert (d["launches"], d["sync_points"], d["readback_bytes"], d["traffic_bytes"], d["flops"]) == (
        3, 0, 1024, 7808, 8704)
    assert d["ops"] == ["Add", "Input", "MatMul", "Param", "Relu"] and d["unsupported_ops"] == []
    assert d["ns"] == pytest.approx(2_563.04, rel=1e-12)
    assert d["breakdown"]["readback"] == 1_024.0


def test_profile_rejects_unknown_target() -> None:
    with pytest.raises(ValueError, match=r"unknown target 'npu' \(known: cpu, cuda, metal, wgpu, onnxruntime\)"):
        profile(mlp()[0], "npu")


def test_profile_by_kind_sums_node_costs_and_prices_each_kind() -> None:
    g = Graph()
    x = g.input("x", (4, 8))
    h = g.relu(g.add(g.matmul(x, g.param("w", (8, 8))), x))
    g.set_outputs([h])
    p = profile(g, TARGETS["cpu"].replace(unsupported=["Relu"]))
    assert {k: (part.nodes, part.ops) for k, part in p.by_kind.items()} == {
        "leaf": (2, frozenset({"Input", "Param"})), "matmul": (1, frozenset({"MatMul"})),
        "elementwise": (2, frozenset({"Add", "Relu"}))}
    assert sum((part.cost for part in p.by_kind.values()), NodeCost(0, 0, 0, 0)) == NodeCost(
        p.launches, p.sync_points, p.traffic_bytes, p.flops, p.rows, p.matrices)
    nodes = {n.id: n for n in g.nodes}
    matmul = next(n for n in g.nodes if n.op == "MatMul")
    assert p.kind_ns("matmul") == p.target.node_ns(matmul.spec, matmul.attrs,
                                                   [nodes[i].type for i in matmul.inputs], matmul.type)
    assert p.kind_ns("leaf") == 0.0 and p.kind_ns("elementwise") == math.inf  # Relu is unsupported


def _transposes_of_a_leaf_and_of_an_intermediate() -> Graph:
    """Two Transposes of one signature (op, attributes, types): on onnxruntime only the one of an intermediate
    copies."""
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.add(g.transpose(g.param("w", (4, 8)), perm=[1, 0]), g.transpose(g.relu(x), perm=[1, 0]))])
    return g


@pytest.mark.parametrize("build", [lambda: examples.synthetic(1_500), lambda: examples.llama(layers=2),
                                   lambda: examples.bert(layers=2), _transposes_of_a_leaf_and_of_an_intermediate],
                         ids=["synthetic", "llama", "bert", "transposes"])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_profile_prices_each_node_as_node_cost_does(build: Callable[[], Graph], target: str) -> None:
    """profile prices each signature once and multiplies: its sums are those of node_cost over every node (a
    layout op copies only when it reads an intermediate, so its nodes of one shape can price two ways)."""
    g = build()
    tgt = TARGETS[target]
    by_id = g.nodes_by_id
    per_kind: dict[str, NodeCost] = {}
    for n in g.nodes:
        ins = [by_id[i] for i in n.inputs]
        copies = n.op in tgt.copied_layouts and any(i.kind is not Kind.LEAF for i in ins)
        cost = node_cost(n.spec, n.attrs, [i.type for i in ins], n.type, copies)
        per_kind[n.kind.value] = per_kind.get(n.kind.value, NodeCost(0, 0, 0, 0)) + cost
    p = profile(g, tgt)
    assert {k: part.cost for k, part in p.by_kind.items()} == per_kind
    assert sum(per_kind.values(), NodeCost(0, 0, 0, 0)) == NodeCost(p.launches, p.sync_points, p.traffic_bytes,
                                                                     p.flops, p.rows, p.matrices)
    assert sum(part.nodes for part in p.by_kind.values()) == len(g)


def test_copied_layouts_must_be_layout_ops() -> None:
    with pytest.raises(ValueError, match=r"target 'cpu': copied_layouts names op\(s\) that are not layout ops "
                                         r"\['NoSuchOp', 'Relu'\]"):
        TARGETS["cpu"].replace(copied_layouts={"Relu", "Narrow", "NoSuchOp"})
    assert TARGETS["cpu"].replace(copied_layouts=["Narrow"]).copied_layouts == frozenset({"Narrow"})
