"""Missed fusions in the design's vocabulary: the patterns a graph still holds unfused (``FusionReport.scan``,
and every run's report on either engine), their causes, hints and per-pattern counts."""

from __future__ import annotations

import json

import pytest

from rlx_egraph import Graph, RuleSet, examples, optimize, optimize_with_report
from rlx_egraph.cost import get_target
from rlx_egraph.report.fusion import IN_GRAPH, MISS_REASONS, NEAR_MISS, FusionReport, MissReason

ENGINES = ["egglog", "fallback"]
NO_GATE_FIRST = RuleSet.shipped().without(["fused-swiglu-gate-first"])


def causes(report: FusionReport) -> list[tuple[str, str, str, tuple[int, ...]]]:
    return [(m.kind, m.pattern, str(m.cause), m.nodes) for m in report.missed]


def swiglu_of_two_inputs() -> Graph:
    g = Graph("swiglu-two-inputs")
    x1, x2 = g.input("x1", (4, 32)), g.input("x2", (4, 32))
    wg, wu = g.param("wg", (32, 64)), g.param("wu", (32, 64))
    g.set_outputs([g.mul(g.silu(g.matmul(x1, wg)), g.matmul(x2, wu))])
    return g


def gate_first_swiglu() -> Graph:
    """The design's gate-first graph: the gate matmul declared (and computed) before the up matmul."""
    g = Graph("gate-first")
    x = g.input("x", (4, 8))
    gate_w, up_w = g.param("gate", (8, 16)), g.param("up", (8, 16))
    gate, up = g.matmul(x, gate_w), g.matmul(x, up_w)
    g.set_outputs([g.mul(g.silu(gate), up)])
    return g


def linear(act: str, bias_shape: tuple[int, ...] = (64,)) -> Graph:
    g = Graph(f"linear-{act}")
    x, w, b = g.input("x", (4, 64)), g.param("w", (64, 64)), g.param("b", bias_shape)
    g.set_outputs([getattr(g, act)(g.add(g.matmul(x, w), b))])
    return g


@pytest.mark.parametrize("engine", ENGINES)
def test_gate_and_up_of_different_inputs_is_swiglu_not_shared_input(engine: str) -> None:
    """design: fusion_report::scan_missed_swiglu (gate and up matmuls of different inputs: SwigluNotSharedInput)."""
    opt, report = optimize_with_report(swiglu_of_two_inputs(), engine=engine)
    assert opt.op_counts()["MatMul"] == 2 and opt.op_counts()["SwiGLU"] == 1  # no one matmul computes both
    assert causes(report.fusion) == [(IN_GRAPH, "swiglu", "SwigluNotSharedInput", (7, 4, 6))]
    (miss,) = report.fusion.missed
    assert (miss.op, miss.rule, miss.reason) == ("FusedSwiGLU", "-", IN_GRAPH)
    assert miss.detail == "gate node 4 (MatMul) reads node 0 (Input), up node 6 (MatMul) reads node 1 (Input)"
    assert miss.hint.startswith("SwiGLU's gate and up projections read different tensors")
    assert str(miss) == ("in graph: FusedSwiGLU at node(s) 7, 4, 6 (in graph): gate node 4 (MatMul) reads node 0 "
                         "(Input), up node 6 (MatMul) reads node 1 (Input); swiglu SwigluNotSharedInput: SwiGLU's gate "
                         "and up projections read different tensors, so no one matmul computes both: project one "
                         "shared input")


@pytest.mark.parametrize("engine", ENGINES)
def test_shared_input_matmuls_left_apart_are_counted(engine: str) -> None:
    """design: fusion_report::scan_missed_shared_matmul (two matmuls of one input: NotFused; more:
    SharedMatmulCount { count })."""
    g = Graph("computed-weights")
    x = g.input("x", (4, 32))
    ws = [g.input(f"w{k}", (32, 16)) for k in range(3)]  # weights computed at run time: no load-time concatenation
    g.set_outputs([g.matmul(x, w) for w in ws])
    _, report = optimize_with_report(g, engine=engine)
    assert causes(report.fusion) == [(IN_GRAPH, "shared_input_matmul", "SharedMatmulCount(count=3)", (4, 5, 6))]
    assert report.fusion.missed[0].detail == (
        "node 4 (MatMul), node 5 (MatMul), node 6 (MatMul) read node 0 (Input) with 2-D weights of 32 rows and stay "
        "3 matmuls (the weight node 1 (Input), node 2 (Input), node 3 (Input) is no parameter: only parameters are "
        "concatenated at load time)")
    pair = Graph("pair")
    x = pair.input("x", (4, 32))
    pair.set_outputs([pair.matmul(x, pair.param(f"w{k}", (32, 16))) for k in range(2)])
    assert causes(FusionReport.scan(pair)) == [(IN_GRAPH, "shared_input_matmul", "NotFused", (2, 4))]
    assert optimize(pair).op_counts()["ConcatParams"] == 1  # parameters: one matmul over their concatenation


def test_shared_input_matmuls_the_cost_model_keeps_apart_on_onnxruntime() -> None:
    """design: fusion_report::scan_missed_shared_matmul (the three Q/K/V matmuls of one normalised input)."""
    _, report = optimize_with_report(examples.llama(layers=1), "onnxruntime")
    shared = [(str(m.cause), m.nodes) for m in report.fusion.missed if m.pattern == "shared_input_matmul"]
    assert shared == [("SharedMatmulCount(count=3)", (13, 17, 21)), ("NotFused", (42, 44))]
    assert report.fusion.missed_count("shared_input_matmul") == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_2_bias_before_gelu_is_bias_rank_too_high(engine: str) -> None:
    """design: fusion_report::scan_missed_matmul_bias_act (an Add of rank > 1 after the matmul:
    BiasRankTooHigh { rank })."""
    opt, report = optimize_with_report(linear("gelu", bias_shape=(4, 64)), engine=engine)
    assert [n.op for n in opt.nodes][-2:] == ["FusedMatMulAdd", "Gelu"]  # the GELU stays a kernel of its own
    assert causes(report.fusion) == [(IN_GRAPH, "matmul_bias_act", "BiasRankTooHigh(rank=2)", (4, 5))]
    (miss,) = report.fusion.missed
    assert miss.cause == MissReason("BiasRankTooHigh", rank=2)
    assert miss.detail == ("FusedMatMulAdd computing node 4 (Add) adds node 2 (Param), of rank 2, before node 5 "
                           "(Gelu), which stays a kernel of its own")
    assert "reshape the rank-2 addend to [N]" in miss.hint
    assert causes(FusionReport.scan(linear("gelu", bias_shape=(4, 64)))) == [
        (IN_GRAPH, "matmul_bias_act", "BiasRankTooHigh(rank=2)", (3, 4, 5))]


def test_a_failed_bias_rank_guard_is_bias_rank_too_high() -> None:
    """design: fusion_report::scan_missed_matmul_bias_act (BiasRankTooHigh), here the e-graph's near miss of
    matmul-bias's rank guard, on a target without FusedMatMulAdd."""
    no_fma = get_target("cpu").replace(name="no-fma", unsupported=frozenset({"FusedMatMulAdd"}))
    _, report = optimize_with_report(linear("gelu", bias_shape=(4, 64)), no_fma, regions=False)
    assert [(m.kind, m.rule, m.pattern, str(m.cause)) for m in report.fusion.missed] == [
        ("not extracted", "matmul-add", "matmul_add", "NotFused"),
        (NEAR_MISS, "matmul-bias", "matmul_bias_act", "BiasRankTooHigh(rank=2)")]


def test_scan_flags_the_designs_gate_before_up_where_the_rules_need_up_first() -> None:
    """design: fusion_report::tests::report_flags_gate_before_up (a gate matmul declared before the up matmul:
    SwigluGateBeforeUp).  The shipped rules fuse either order (fused-swiglu-gate-first), so there the pattern is
    only not fused yet; without that rule the order is the reason, as in the design."""
    g = gate_first_swiglu()
    assert causes(FusionReport.scan(g, NO_GATE_FIRST)) == [
        (IN_GRAPH, "shared_input_matmul", "NotFused", (3, 4)),
        (IN_GRAPH, "swiglu", "SwigluGateBeforeUp", (6, 3, 4))]
    assert causes(FusionReport.scan(g)) == [
        (IN_GRAPH, "shared_input_matmul", "NotFused", (3, 4)), (IN_GRAPH, "swiglu", "NotFused", (6, 3, 4))]
    report = FusionReport.scan(g)
    assert report.missed_per_pattern == {"shared_input_matmul": 1, "swiglu": 1} and report.missed_count("swiglu") == 1
    opt, fused = optimize_with_report(g)
    assert opt.op_counts()["FusedSwiGLU"] == 1 and fused.fusion.missed == []
    opt, unfused = optimize_with_report(g, rules=NO_GATE_FIRST)
    assert "FusedSwiGLU" not in opt.op_counts()  # one wide matmul, its halves [gate | up] into SwiGLU
    assert causes(unfused.fusion) == [(IN_GRAPH, "swiglu", "SwigluGateBeforeUp", (6, 3, 4))]
    assert unfused.fusion.missed[0].hint.startswith("the gate projection comes first and the rules in use fuse only")


def test_scan_of_an_optimized_graph_counts_its_fused_ops() -> None:
    """design: fusion_report::tests::report_counts_fused_ops (FusionReport of the passes' result: one FusedSwiGLU,
    fewer nodes) and FusionReport::scan."""
    g = gate_first_swiglu()
    opt = optimize(g)
    report = FusionReport.scan(opt)
    assert (report.before, report.after, report.missed) == ({"FusedSwiGLU": 1}, {"FusedSwiGLU": 1}, [])
    assert len(opt) < len(g)
    assert FusionReport.scan(g).after == {}


def test_a_matmul_read_twice_is_multi_consumer() -> None:
    """design: fusion_report::scan_missed_matmul_bias_act (a matmul with more than one user: MultiConsumer)."""
    g = Graph("read-twice")
    x, w, b = g.input("x", (64, 512)), g.param("w", (512, 512)), g.param("b", (512,))
    m = g.matmul(x, w)
    g.set_outputs([g.gelu(g.add(m, b)), g.relu(m)])
    assert causes(FusionReport.scan(g)) == [(IN_GRAPH, "matmul_bias_act", "MultiConsumer", (3, 4))]
    assert FusionReport.scan(g).missed[0].detail == ("node 3 (MatMul) is read by node 4 (Add), node 6 (Relu): it "
                                                     "fuses into its bias Add only as that Add's one input")
    for engine in ENGINES:  # the egglog engine's priced misses say the same, at the nodes it would have replaced
        _, report = optimize_with_report(g, engine=engine)
        assert {str(m.cause) for m in report.fusion.missed} == {"MultiConsumer"}, engine


def test_a_matmul_into_gelu_without_bias_is_non_add_bias_consumer() -> None:
    """design: fusion_report::scan_missed_matmul_bias_act (the matmul's one user is not an Add:
    NonAddBiasConsumer)."""
    g = Graph("no-bias")
    x, w = g.input("x", (4, 64)), g.param("w", (64, 64))
    g.set_outputs([g.gelu(g.matmul(x, w))])
    for engine in ENGINES:
        _, report = optimize_with_report(g, engine=engine)
        assert causes(report.fusion) == [(IN_GRAPH, "matmul_bias_act", "NonAddBiasConsumer", (2, 3))], engine
    assert report.fusion.missed[0].hint.startswith("FusedMatMulBiasAct needs a bias Add between the matmul")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_activation_without_an_epilogue_is_unsupported_epilogue_activation(engine: str) -> None:
    """design: fusion_report::scan_missed_matmul_bias_act (an activation other than Gelu/Silu after the bias:
    UnsupportedEpilogueActivation(act))."""
    _, report = optimize_with_report(linear("relu"), engine=engine)
    (miss,) = report.fusion.missed
    assert (miss.pattern, miss.cause) == ("matmul_bias_act", MissReason("UnsupportedEpilogueActivation",
                                                                        activation="Relu"))
    assert miss.kind == (NEAR_MISS if engine == "egglog" else IN_GRAPH)  # the e-graph's record, or the scan's
    assert miss.hint.startswith("FusedMatMulBiasAct's epilogue runs Gelu and Silu only: Relu stays")


def test_a_foreign_graph_lists_what_would_fuse_and_what_cannot() -> None:
    """design: FusionReport::scan (a graph scanned as it is)."""
    report = FusionReport.scan(linear("relu"))
    assert causes(report) == [(IN_GRAPH, "matmul_bias_act", "NotFused", (3, 4)),
                              (IN_GRAPH, "matmul_bias_act", "UnsupportedEpilogueActivation(Relu)", (3, 4, 5))]
    assert report.summary_line() == ("fused ops: none; missed 2 (0 not extracted, near misses not checked, 2 in graph; "
                                     "matmul_bias_act 2)")


def test_a_step_inside_a_region_is_named_by_its_region() -> None:
    """design: fusion_report::count_ops (regions are ops of the graph) and scan_missed_matmul_bias_act."""
    g = Graph("region")
    x, w = g.input("x", (4, 64)), g.param("w", (64, 64))
    chain = [["Gelu", {}, [0]], ["Tanh", {}, [-1]]]
    g.set_outputs([g.elementwise_region([g.matmul(x, w)], chain=json.dumps(chain))])
    report = FusionReport.scan(g)
    assert report.after == {"ElementwiseRegion": 1}
    # the region's Gelu reads the matmul with no bias Add between them; the Gelu is a step of region node 3
    assert causes(report) == [(IN_GRAPH, "matmul_bias_act", "NonAddBiasConsumer", (2, 3))]
    assert report.missed[0].detail == "node 3 (ElementwiseRegion) reads node 2 (MatMul) with no bias Add between them"


def test_every_reason_has_a_hint_and_reads_as_the_design_names_it() -> None:
    """design: fusion_report::MissReason and fusion_hint (one hint per reason)."""
    assert MISS_REASONS == ("MultiConsumer", "NonAddBiasConsumer", "BiasRankTooHigh", "UnsupportedEpilogueActivation",
                            "SharedMatmulCount", "SwigluGateBeforeUp", "SwigluNotSharedInput", "NotFused")
    hints = {name: MissReason(name, rank=2, count=3, activation="Tanh").hint for name in MISS_REASONS}
    assert len(set(hints.values())) == len(MISS_REASONS) and all(hints.values())
    assert "rank-2" in hints["BiasRankTooHigh"] and "3 matmuls" in hints["SharedMatmulCount"]
    assert "Tanh stays" in hints["UnsupportedEpilogueActivation"]
    assert [str(MissReason("BiasRankTooHigh", rank=2)), str(MissReason("SharedMatmulCount", count=4)),
            str(MissReason("UnsupportedEpilogueActivation", activation="Relu")), str(MissReason("NotFused"))] == [
        "BiasRankTooHigh(rank=2)", "SharedMatmulCount(count=4)", "UnsupportedEpilogueActivation(Relu)", "NotFused"]
    with pytest.raises(ValueError, match=r"unknown miss reason 'Missing' \(known: MultiConsumer, "):
        MissReason("Missing")


def test_json_carries_pattern_cause_hint_and_counts() -> None:
    """design: fusion_report::MissedFusion (pattern, node, reason, context, hint) and FusionReport::summary_line
    (missed counts per pattern)."""
    _, report = optimize_with_report(linear("gelu", bias_shape=(4, 64)))
    d = json.loads(report.to_json())["fusion"]
    assert d["missed_per_pattern"] == {"matmul_bias_act": 1}
    (miss,) = d["missed"]
    assert (miss["kind"], miss["pattern"], miss["places"]) == (IN_GRAPH, "matmul_bias_act", 1)
    assert miss["cause"] == {"name": "BiasRankTooHigh", "rank": 2, "count": None, "activation": None}
    assert miss["hint"].startswith("FusedMatMulBiasAct adds a bias of rank <= 1")
