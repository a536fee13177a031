"""FusionReport (missed fusions and why), the run as data tables, honest counts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.cli.main import main
from rlx_egraph.cost import get_target
from rlx_egraph.report.fusion import NEAR_MISS, NOT_EXTRACTED, MissedFusions, MissReason
from rlx_egraph.report.optimize_report import FORMAT_VERSION
from rlx_egraph.rules import RuleSet


def _residual_ln_with_output_add() -> Graph:
    g = Graph()
    x, r = g.input("x", (4, 64)), g.input("r", (4, 64))
    w, gamma, beta = g.param("w", (64, 64)), g.param("g", (64,)), g.param("be", (64,))
    a = g.add(g.matmul(x, w), r)
    g.set_outputs([g.layer_norm(a, gamma, beta), a])  # the Add (node 6) is a graph output
    return g


def _linear(act: str, bias_shape: tuple[int, ...] = (64,)) -> Graph:
    g = Graph()
    x, w, b = g.input("x", (4, 64)), g.param("w", (64, 64)), g.param("b", bias_shape)
    g.set_outputs([getattr(g, act)(g.add(g.matmul(x, w), b))])
    return g


def test_graph_output_add_keeps_the_layer_norm_unfused() -> None:
    _, report = optimize_with_report(_residual_ln_with_output_add())
    (miss,) = report.fusion.missed
    assert (miss.kind, miss.op, miss.reason, miss.nodes) == (NOT_EXTRACTED, "FusedResidualLN", "another consumer", (7,))
    assert "node 6 (Add) is a graph output, so fusing would compute it twice" in miss.detail
    assert miss.fused_ns > miss.chosen_ns == pytest.approx(report.extracted_ns)
    assert miss.location.startswith("rules/") and miss.location.split(":")[1].isdigit()


def test_matmul_read_twice_is_another_consumer() -> None:
    g = Graph()
    x, w, b = g.input("x", (64, 512)), g.param("w", (512, 512)), g.param("b", (512,))
    m = g.matmul(x, w)
    g.set_outputs([g.gelu(g.add(m, b)), g.relu(m)])
    _, report = optimize_with_report(g)
    assert [(m.kind, m.op, m.reason, m.nodes) for m in report.fusion.missed] == [
        (NOT_EXTRACTED, "FusedMatMulBiasAct", "another consumer", (4,)),
        (NOT_EXTRACTED, "FusedMatMulBiasAct", "another consumer", (5,))]
    assert "node 3 (MatMul) is also read by node 6 (Relu)" in report.fusion.missed[0].detail


def test_unsupported_by_the_target() -> None:
    target = dataclasses.replace(get_target("cpu"), name="no-fmba", unsupported=frozenset({"FusedMatMulBiasAct"}))
    _, report = optimize_with_report(_linear("neg"), target, regions=False)
    assert [(m.kind, m.op, m.reason, m.nodes) for m in report.fusion.missed] == [
        (NOT_EXTRACTED, "FusedMatMulBiasAct", "unsupported", (4,)),
        (NEAR_MISS, "FusedMatMulAdd", "guard", (4,)),  # a full-tensor addend would have fused
        (NEAR_MISS, "FusedMatMulBiasAct", "other op", (5,))]  # no Neg epilogue
    miss = report.fusion.missed[0]
    assert (miss.rule, miss.location) == ("matmul-bias", "rules/matmul.egg:16")
    assert miss.detail == "node 4 (Add): target no-fmba does not run FusedMatMulBiasAct (unsupported op)"
    assert miss.fused_ns == float("inf") and miss.chosen_ns == pytest.approx(report.extracted_ns)


def test_a_fusion_predicted_slower_is_more_expensive_with_both_costs() -> None:
    # On a compute-bound target (no dispatch cost, 8 B/ns, 1 FLOP/ns) FusedRmsNormMatMul's norm passes
    # (4 FLOPs per x element, RmsNorm's own count is 1) cost more than the 2,048 bytes of traffic it saves.
    g = Graph("rms-proj")
    x, wn, wp = g.input("x", (4, 64)), g.param("wn", (64,)), g.param("wp", (64, 64))
    g.set_outputs([g.matmul(g.rms_norm(x, wn), wp)])
    target = get_target("cpu").replace(name="compute-bound", dispatch_ns=0.0, memory_bw=8.0, flops_per_ns=1.0)
    opt, report = optimize_with_report(g, target, regions=False)
    assert [n.op for n in opt.nodes][-2:] == ["RmsNorm", "MatMul"]
    (miss,) = report.fusion.missed
    assert (miss.kind, miss.op, miss.reason, miss.rule, miss.nodes) == (
        NOT_EXTRACTED, "FusedRmsNormMatMul", "more expensive", "rms-norm-matmul", (4,))
    # fused: 2*4*64*64 + 4*256 FLOPs + (1,024 + 256 + 16,384 + 1,024) B / 8; unfused: 2*4*64*64 + 256 FLOPs
    # + RmsNorm (1,024 + 256 + 1,024 B) and MatMul (1,024 + 16,384 + 1,024 B) / 8
    assert (miss.fused_ns, miss.chosen_ns) == (33_792 + 2_336, 33_024 + 2_592) == (36_128, report.extracted_ns)
    assert str(miss) == ("not extracted: FusedRmsNormMatMul at node(s) 4 (more expensive): node 4 (MatMul): "
                         "predicted slower on compute-bound: 36,128 ns with FusedRmsNormMatMul vs 35,616 ns without "
                         "[rule rms-norm-matmul at rules/matmul.egg:31]; rms_norm_matmul NotFused: the fusion was "
                         "possible and not made: the detail says why (a target without its kernel, a cost predicted "
                         "higher, a graph not optimized yet)")
    assert (miss.pattern, miss.cause) == ("rms_norm_matmul", MissReason("NotFused"))


def test_activation_without_epilogue_kernel_is_a_near_miss() -> None:
    _, report = optimize_with_report(_linear("relu"))
    (miss,) = report.fusion.missed
    assert (miss.kind, miss.reason, miss.rule, miss.nodes) == (NEAR_MISS, "other op", "matmul-bias-silu", (5,))
    assert str(miss) == ("near miss: FusedMatMulBiasAct at node(s) 5 (other op): node 5 (Relu) matches rule "
                         "matmul-bias-silu except that it is Relu where the rule needs Silu (no Relu epilogue) "
                         "[rule matmul-bias-silu at rules/matmul.egg:25]; matmul_bias_act "
                         "UnsupportedEpilogueActivation(Relu): FusedMatMulBiasAct's epilogue runs Gelu and Silu only: "
                         "Relu stays a kernel of its own (an elementwise region where the target has region kernels)")
    assert (miss.pattern, miss.cause) == ("matmul_bias_act", MissReason("UnsupportedEpilogueActivation",
                                                                        activation="Relu"))


def test_a_relu_mlp_lists_its_missing_relu_epilogue_once() -> None:
    # Every layer of a ReLU MLP misses the epilogue for the same reason: one record naming all of them.
    _, report = optimize_with_report(examples.mlp(layers=3))
    assert report.fusion.after == {"FusedMatMulBiasAct": 4}
    (miss,) = report.fusion.missed
    assert (miss.kind, miss.reason, miss.rule, miss.nodes) == (NEAR_MISS, "other op", "matmul-bias-silu", (5, 10, 15))
    assert str(miss) == ("near miss: FusedMatMulBiasAct at node(s) 5, 10, 15 (other op): node 5 (Relu), node 10 (Relu) "
                         "and node 15 (Relu) match rule matmul-bias-silu except that it is Relu where the rule needs "
                         "Silu (no Relu epilogue) [rule matmul-bias-silu at rules/matmul.egg:25]; matmul_bias_act "
                         "UnsupportedEpilogueActivation(Relu): FusedMatMulBiasAct's epilogue runs Gelu and Silu only: "
                         "Relu stays a kernel of its own (an elementwise region where the target has region kernels)")
    assert report.fusion.summary_line() == ("fused ops: FusedMatMulBiasAct 0->4; missed 1 (0 not extracted, 1 near, "
                                            "0 in graph; matmul_bias_act 3)")
    assert (miss.places, report.fusion.missed_per_pattern, report.fusion.missed_count("matmul_bias_act")) == (
        3, {"matmul_bias_act": 3}, 3)


def test_bias_rank_too_high_is_a_failed_guard() -> None:
    target = dataclasses.replace(get_target("cpu"), name="no-fma", unsupported=frozenset({"FusedMatMulAdd"}))
    _, report = optimize_with_report(_linear("gelu", bias_shape=(4, 64)), target, regions=False)
    near = [m for m in report.fusion.missed if m.kind == NEAR_MISS]
    assert [(m.rule, m.reason, m.nodes) for m in near] == [("matmul-bias", "guard", (4,))]
    assert near[0].detail.endswith("the guard (<= (vec-length (shape ?bias)) 1) does not hold")
    assert [(m.op, m.reason) for m in report.fusion.missed if m.kind == NOT_EXTRACTED] == [
        ("FusedMatMulAdd", "unsupported")]


def test_inputs_not_shared_is_a_near_miss() -> None:
    g = Graph()
    a, b = g.input("a", (4, 16)), g.input("b", (4, 16))
    g.set_outputs([g.mul(g.silu(g.narrow(a, start=0, length=8)), g.narrow(b, start=8, length=8))])
    _, report = optimize_with_report(g)
    (miss,) = report.fusion.missed
    assert (miss.op, miss.rule, miss.reason, miss.nodes) == (
        "FusedSwiGLU", "fused-swiglu-gate-first", "inputs not shared", (5,))
    assert "the uses of ?cat in (SwiGLU (Narrow ?cat -1 0 ?n) (Narrow ?cat -1 ?n ?n)) are different" in miss.detail


def test_counts_summary_and_strict() -> None:
    _, report = optimize_with_report(_residual_ln_with_output_add())
    assert report.fusion.before == {} and report.fusion.after == {"FusedMatMulAdd": 1}
    assert report.fusion.summary_line() == ("fused ops: FusedMatMulAdd 0->1; missed 1 (1 not extracted, 0 near, "
                                            "0 in graph; residual_ln 1)")
    with pytest.raises(MissedFusions, match=r"^1 missed fusion\(s\):\nnot extracted: FusedResidualLN at node\(s\) 7"):
        report.fusion.raise_if_missed()
    _, clean = optimize_with_report(examples.llama(layers=1))
    clean.fusion.raise_if_missed()  # nothing missed: no error
    assert clean.fusion.missed == []


def test_fused_op_counts_leave_out_views_and_derived_weights() -> None:
    _, report = optimize_with_report(examples.llama(layers=1))
    assert {"Narrow", "ConcatParams"} <= {f.op for f in report.fusions}  # provenance lists every built node
    assert report.fused_op_counts == {"CausalAttentionRoPE": 1, "FusedMatMulAdd": 2, "FusedRmsNormMatMul": 3,
                                      "FusedSwiGLU": 1}
    assert report.fused_op_counts == report.fusion.after


def test_applications_count_distinct_enodes_built() -> None:
    _, report = optimize_with_report(_linear("gelu"))
    # egglog finds matmul-bias again in a later iteration; it built one e-node and merged into one class
    assert report.matches_per_rule["matmul-bias"] == 2
    assert report.applications_per_rule["matmul-bias"] == 2
    rows = {r["rule"]: r for r in report.data.rule_applications}
    assert (rows["matmul-bias"]["enodes_built"], rows["matmul-bias"]["eclasses_merged_into"]) == (1, 1)
    assert "rule applications (distinct e-nodes built + e-classes merged into): " in str(report)


def test_data_tables_are_made_when_read_from_the_run_as_it_ended() -> None:
    out, report = optimize_with_report(_linear("gelu"), regions=False)
    assert not {"enodes", "eclasses", "provenance"} & vars(report.data).keys()  # nothing made yet
    ids = [n.id for n in out.nodes]
    out.set_outputs([out.relu(out.outputs[0])])  # the caller changes the optimized graph afterwards
    assert [p["node"] for p in report.data.provenance] == ids
    assert len(report.data.enodes) == report.enodes and "enodes" in vars(report.data)


def test_a_fallback_run_has_the_tables_that_need_no_egraph() -> None:
    out, report = optimize_with_report(_linear("gelu"), engine="fallback", regions=False)
    data = report.data
    assert [p["node"] for p in data.provenance] == [n.id for n in out.nodes]
    fused = next(p for p in data.provenance if p["op"] == "FusedMatMulBiasAct")
    assert (fused["replaces"], fused["built_by"]) == ([5], ["matmul-bias-gelu"])
    assert {r["when"] for r in data.io_by_kind} == {"before", "after"}
    assert (data.enodes, data.eclasses, data.choices, data.iterations) == ([], [], [], [])


def test_data_tables_describe_the_egraph_and_the_choice() -> None:
    g = _linear("gelu")
    _, report = optimize_with_report(g, regions=False)
    data = report.data
    assert len(data.eclasses) == report.eclasses and len(data.enodes) == report.enodes
    chosen = [e for e in data.enodes if e["chosen"]]
    assert sorted(e["eclass"] for e in chosen) == sorted(c["eclass"] for c in data.choices)
    fused = next(e for e in data.enodes if e["op"] == "FusedMatMulBiasAct" and e["attrs"]["act"] == "gelu")
    assert fused["chosen"] and fused["built_by"] == ["matmul-bias-gelu"] and fused["type"] == "f32[4, 64]"
    cost = {e["enode"]: e["cost_ns"] for e in data.enodes}
    assert all(c["cost_ns"] == cost[c["enode"]] for c in data.choices)
    out = next(p for p in data.provenance if p["op"] == "FusedMatMulBiasAct")
    assert (out["replaces"], out["built_by"]) == ([5], ["matmul-bias-gelu"])
    before = {r["kind"]: r["nodes"] for r in data.io_by_kind if r["when"] == "before"}
    after = {r["kind"]: r["nodes"] for r in data.io_by_kind if r["when"] == "after"}
    assert (before, after) == ({"leaf": 3, "matmul": 1, "elementwise": 2}, {"leaf": 3, "fused": 1})
    ns = {when: sum(r["ns"] for r in data.io_by_kind if r["when"] == when) for when in ("before", "after")}
    assert 0 < ns["after"] < ns["before"]
    assert {r["stage"] for r in data.iterations} == {"fuse"}
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="to_dataframe\\(\\) needs pandas"):
            data.enodes.to_dataframe()
    else:
        assert len(data.enodes.to_dataframe()) == report.enodes


def test_json_has_a_version_and_the_program_only_on_request() -> None:
    _, report = optimize_with_report(_residual_ln_with_output_add())
    d = json.loads(report.to_json())
    assert d["format_version"] == FORMAT_VERSION and "egglog_program" not in d and "data" not in d
    assert d["fusion"]["missed"][0]["reason"] == "another consumer"
    full = report.to_dict(include_program=True, include_data=True)
    assert "(ruleset fuse)" in full["egglog_program"] and len(full["data"]["enodes"]) == report.enodes


def test_cli_report_prints_the_fusion_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.json"
    _linear("relu").save(path)
    assert main(["optimize", str(path), "--report"]) == 0
    out = capsys.readouterr().out
    assert "fusion report: fused ops: FusedMatMulBiasAct 0->1; missed 1 (0 not extracted, 1 near, 0 in graph; " \
           "matmul_bias_act 1)\n" \
           "  near miss: FusedMatMulBiasAct at node(s) 5 (other op)" in out


def test_a_norm_of_a_plain_input_is_no_near_miss_of_the_residual_norm_rules() -> None:
    # Dropping add-rms-norm's only pattern part (the Add) would match every RmsNorm: that is no near miss,
    # and the rule's operand orders are one rule, reported once.
    g = Graph("norm")
    x, w = g.input("x", (4, 64)), g.param("w", (64,))
    g.set_outputs([g.rms_norm(x, w)])
    _, report = optimize_with_report(g, "cpu", regions=False)
    assert [m.rule for m in report.fusion.missed if m.rule.startswith("add-rms-norm")] == []


def test_a_dropped_part_takes_the_guards_on_its_own_variables_with_it() -> None:
    # Without attention-block's QKV projection, its guards on ?hidden and ?qkv_w would each match every
    # e-node on their own (a cross product: 83 s of near-miss search on a 320-node BERT graph).
    from rlx_egraph.report import fusion

    rule = RuleSet.shipped().by_name("attention-block")
    dropped = next(v for v in fusion._relaxations(rule, *fusion._pattern(rule))
                   if v.detail.startswith("its part (= ?qkv (FusedMatMulBiasAct ?hidden"))
    assert not any("?hidden" in f or "?qkv_w" in f for f in dropped.facts)
    assert any("(Narrow ?qkv -1 0 ?h)" in f for f in dropped.facts)  # the parts still joined stay
    rule = RuleSet.shipped().by_name("biased-attention")
    guard = next(v for v in fusion._relaxations(rule, *fusion._pattern(rule)) if "(split-qk" in v.detail)
    assert any(f.startswith("(attn-scores ") for f in guard.facts)  # a relation binds its variables: kept


def test_a_cheaper_fusion_the_choice_left_out_is_not_taken() -> None:
    # Greedy's gap is 0 on every example, so the choice is made worse by hand: the output class computes the
    # plain Gelu although its FusedMatMulBiasAct alternative is cheaper.
    import importlib

    from rlx_egraph.engines.egglog import extract
    from rlx_egraph.engines.egglog.rules import load_rules
    from rlx_egraph.engines.egglog.saturate import saturate
    from rlx_egraph.engines.egglog.view import build_view
    from rlx_egraph.report.fusion import missed_fusions

    pipeline = importlib.import_module("rlx_egraph.optimize")
    graph, rules, cpu = _linear("gelu"), load_rules(), get_target("cpu")
    egraph, encoding = pipeline.build_egraph(graph, rules)
    saturate(egraph, rules)
    view = build_view(egraph, graph, encoding.constants, rules)
    costs = extract.node_costs(view, cpu)
    (out,) = [view.class_of_node[o] for o in graph.outputs]
    greedy = extract.greedy(view, [out], cpu, {n.id: k for k, n in enumerate(graph.nodes)}, costs)
    assert view.nodes[greedy.choice[out]].op == "FusedMatMulBiasAct"
    worse = {**extract._best_tree_choice(view, costs)[0], **greedy.choice}
    worse[out] = next(i for i in view.classes[out].nodes if view.nodes[i].op == "Gelu")
    (miss,), _ = missed_fusions(view, graph, worse, costs, rules, cpu, None)
    assert (miss.kind, miss.op, miss.reason, miss.rule, miss.nodes) == (
        NOT_EXTRACTED, "FusedMatMulBiasAct", "not taken", "matmul-bias-gelu", (5,))
    assert miss.fused_ns == pytest.approx(greedy.cost_ns)
    assert miss.chosen_ns == pytest.approx(extract.dag_cost(view, worse, [out], costs))
    assert miss.chosen_ns > miss.fused_ns
    assert miss.detail.endswith("yet greedy extraction did not take it; try extraction='exact'")


def test_a_recognize_stage_miss_is_a_near_miss_naming_the_clause() -> None:
    """x * sigmoid(y) is SiLU's export form but for its two inputs: a near miss of the recognize-stage rule."""
    g = Graph()
    x, y = g.input("x", (4, 8)), g.input("y", (4, 8))
    g.set_outputs([g.exp(g.mul(x, g.sigmoid(y)))])
    _, report = optimize_with_report(g)
    (miss,) = report.fusion.missed
    assert (miss.kind, miss.op, miss.rule, miss.reason, miss.nodes) == (
        NEAR_MISS, "Silu", "silu-mul-sigmoid", "inputs not shared", (3,))
    assert miss.location == "rules/export_forms.egg:6"


def test_a_clip_with_bounds_the_wrong_way_round_is_a_near_miss_of_the_failed_guard() -> None:
    """min(max(x, 6), 0) is no Clip (its lower bound is above its upper): the guard that failed is named; a Relu
    before a Min is a Clip, so that graph has no miss."""
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.exp(g.min(g.max(x, g.scalar(6.0)), g.scalar(0.0)))])
    _, report = optimize_with_report(g)
    (miss,) = report.fusion.missed
    assert (miss.kind, miss.op, miss.rule, miss.reason) == (NEAR_MISS, "Clip", "clip-min-max", "guard")
    assert "except that the guard (<= ?lo ?hi) does not hold" in miss.detail
    relu6 = Graph()
    x = relu6.input("x", (4, 8))
    relu6.set_outputs([relu6.exp(relu6.min(relu6.relu(x), relu6.scalar(6.0)))])
    out, report = optimize_with_report(relu6, regions=False)
    assert report.fusion.missed == []
    assert {op: out.op_counts().get(op, 0) for op in ("Clip", "Min", "Relu")} == {"Clip": 1, "Min": 0, "Relu": 0}


def test_a_layout_rule_rooted_at_a_reshape_it_also_builds_is_a_near_miss_of_its_failed_guard() -> None:
    """unflatten-add takes Reshape(a + b) apart into Reshapes of its operands; a bias [1, S, L] broadcast over the
    flat heads (not along their leading axis) fails its guard on the operands' leading dim, which the report names
    where the attention it would have made stays unfused."""
    g = Graph()
    b, h, s, keys, d = 2, 2, 3, 5, 4
    q, k, v = g.input("q", (b, h, s, d)), g.input("k", (b, h, keys, d)), g.input("v", (b, h, keys, d))
    product = g.matmul(g.reshape(q, shape=(b * h, s, d)),
                       g.transpose(g.reshape(k, shape=(b * h, keys, d)), perm=(0, 2, 1)))
    flat = g.add(g.mul(product, g.scalar(0.5)), g.param("bias", (1, s, keys)))
    probs = g.softmax(g.add(g.reshape(flat, shape=(b, h, s, keys)), g.input("mask", (b, 1, 1, keys))))
    ctx = g.matmul(g.reshape(probs, shape=(b * h, s, keys)), g.reshape(v, shape=(b * h, keys, d)))
    g.set_outputs([g.exp(g.reshape(ctx, shape=(b, h, s, d)))])
    out, report = optimize_with_report(g)
    assert out.op_counts()["Softmax"] == 1
    (miss,) = [m for m in report.fusion.missed if m.rule == "unflatten-add"]
    assert (miss.kind, miss.op, miss.reason) == (NEAR_MISS, "Add", "guard")
    assert "except that the guard (= (vec-get ?sb 0) (vec-get ?ss 0)) does not hold" in miss.detail
