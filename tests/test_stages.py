"""Pipeline stages (HIR module, MIR graph, LIR plan), what ``compile`` takes, its fusion contract, and
oversized regions in ``optimize``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rlx_egraph
from rlx_egraph import Graph, evaluate, optimize, optimize_with_report
from rlx_egraph.compile import CompileResult, Module, Stage, stage_of
from rlx_egraph.cost import get_target
from rlx_egraph.report.fusion import MissedFusions


def linear_module() -> Module:
    m = Module("layer")
    x = m.input("x", (2, 64))
    m.set_outputs([m.linear(x, 64, "fc")])
    return m


def test_a_module_is_hir_its_graph_mir_its_plan_lir() -> None:
    """design: compile pipeline tests::compile_module_from_graph_define (``module.stage() == GraphStage::Hir``) and
    CompilePipeline::compile_module (one entry point dispatching on the stage)."""
    m = linear_module()
    result = rlx_egraph.compile(m)
    assert (m.stage, stage_of(m)) == (Stage.HIR, Stage.HIR)
    assert stage_of(m.lower()) is Stage.MIR
    assert (result.stage, stage_of(result), stage_of(result.plan)) == (Stage.LIR, Stage.LIR, Stage.LIR)
    assert Stage("hir") is Stage.HIR and str(Stage.LIR) == "lir"
    with pytest.raises(TypeError, match=r"^expected a Module \(HIR\), a Graph \(MIR\), or a Plan or CompileResult "
                                        r"\(LIR\), got str$"):
        stage_of("graph")


@pytest.mark.parametrize("compiled", ["plan", "result"])
def test_compiling_a_plan_is_a_clear_error(compiled: str) -> None:
    """design: CompilePipeline::compile_module (an LIR module is compiled already: it is not lowered again)."""
    result = rlx_egraph.compile(linear_module())
    value = result.plan if compiled == "plan" else result
    kind = type(value).__name__
    with pytest.raises(TypeError, match=rf"^compile takes a Module \(HIR\) or a Graph \(MIR\), got a {kind}, which is "
                                        r"LIR \(compiled already\): run it with \.run\(\), or compile its graph again "
                                        r"with compile\(x\.graph, target\)$"):
        rlx_egraph.compile(value)
    with pytest.raises(TypeError, match=r"got list$"):
        rlx_egraph.compile([1, 2])


def relu_mlp() -> Graph:
    g = Graph("relu-mlp")
    x, w, b = g.input("x", (4, 64)), g.param("w", (64, 64)), g.param("b", (64,))
    g.set_outputs([g.relu(g.add(g.matmul(x, w), b))])
    return g


def test_assert_fusion_clean_raises_listing_every_miss() -> None:
    """design: CompilePipeline::finish (``assert_fusion_clean`` and a missed pattern: "fusion contract violated")."""
    with pytest.raises(MissedFusions, match=r"^1 missed fusion\(s\):\nnear miss: FusedMatMulBiasAct at node\(s\) 5 "
                                            r"\(other op\)"):
        rlx_egraph.compile(relu_mlp(), assert_fusion_clean=True)
    result = rlx_egraph.compile(relu_mlp())  # off by default: the result, misses in its report
    assert isinstance(result, CompileResult) and len(result.fusion.fusion.missed) == 1
    m = Module("gelu")
    x = m.input("x", (2, 64))
    m.set_outputs([m.linear(x, 64, "fc", act="gelu")])
    clean = rlx_egraph.compile(m, "cpu", assert_fusion_clean=True)
    assert clean.fusion.fusion.missed == [] and clean.graph.op_counts()["FusedMatMulBiasAct"] == 1
    with pytest.raises(ValueError, match=r"assert_fusion_clean=True needs optimize=True"):
        rlx_egraph.compile(relu_mlp(), optimize=False, assert_fusion_clean=True)


def long_region(steps: int = 40) -> Graph:
    """One ElementwiseRegion of ``steps`` steps over x [4, 8] and a bias [8], alternating Add and Tanh."""
    g = Graph("long-region")
    x, b = g.input("x", (4, 8)), g.input("b", (8,))
    # operand i >= 0: region input i; -k: the value of step k-1
    chain = [["Tanh", {}, [-k]] if k % 2 else ["Add", {}, [-k if k else 0, 1]] for k in range(steps)]
    g.set_outputs([g.relu(g.elementwise_region([x, b], chain=json.dumps(chain)))])
    return g


def region_steps(graph: Graph) -> list[tuple[int, int]]:
    return [(n.id, len(json.loads(n.attrs["chain"])["steps"])) for n in graph.nodes if n.op == "ElementwiseRegion"]


@pytest.mark.parametrize("engine", ["egglog", "fallback"])
def test_optimize_clips_an_oversized_region_to_the_targets_limit(engine: str) -> None:
    """design: fusion passes::clip_elementwise_regions (run after the fusion passes with the target's limits) and
    tests::clip_unfuses_region_over_step_cap."""
    g = long_region()
    opt, report = optimize_with_report(g, "cpu", engine=engine, verify=True)
    assert region_steps(opt) == [(4, 16), (5, 16), (2, 8)]  # cpu: 16 steps per region; the value keeps id 2
    assert [(c.node, c.steps, c.inputs, c.pieces) for c in report.regions_clipped] == [(2, 40, 2, (4, 5, 2))]
    assert "regions over the target's limits, regrouped within them: node 2 (40 steps, 2 inputs) -> 3 nodes" \
        in str(report)
    assert report.to_dict()["regions_clipped"] == [{"node": 2, "steps": 40, "inputs": 2, "pieces": [4, 5, 2]}]
    assert {f.node: f.rules for f in report.fusions if f.op == "ElementwiseRegion"} == {
        4: ("pass:clip-region",), 5: ("pass:clip-region",), 2: ("pass:clip-region",)}
    assert report.parity.ok
    np.testing.assert_array_equal(evaluate(opt)[0], evaluate(g)[0])
    small = get_target("cuda").replace(name="small", region_max_steps=3)
    assert region_steps(optimize(long_region(7), small, regions=False)) == [(4, 3), (5, 3)]  # the step left: Add
    assert optimize(long_region(16), "cpu", regions=False).to_json() == long_region(16).to_json()
