"""The compile pipeline: module or graph -> legalized, optimized graph -> launch order and memory plan.

``compile(graph_or_module, target)`` lowers a :class:`Module` (under its fusion
policy), legalizes the graph for the target (so a graph optimized for another
target can be retargeted), optimizes it, legalizes the result again (clipping
regions to the target's limits) and plans its memory.  A graph with symbolic
dims is compiled once (priced at the size hints) and planned per binding:
its result's ``plan`` is None until :func:`specialize` binds the symbols.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cost import Target, get_target
from ..ir.dims import as_dim, evaluate
from ..ir.graph import Graph, GraphError
from ..ir.specialize import specialize_graph
from ..optimize import optimize_with_report
from ..report import OptimizeReport
from .hir import Module, Policy, Stage
from .legalize import LegalizeError, legalize
from .plan import ALIGNMENT, Phase, Plan, PlanError, Section, plan_memory


@dataclass(frozen=True, eq=False)
class CompileResult:
    """What :func:`compile` made: the graph it planned, the optimize report (None when not optimized) and
    the plan (None while the graph has symbolic dims: :func:`specialize` plans it)."""

    graph: Graph
    target: Target
    fusion: OptimizeReport | None
    plan: Plan | None
    alignment: int = ALIGNMENT

    @property
    def stage(self) -> Stage:
        """A compile result is the LIR stage: a launch order and memory plan."""
        return Stage.LIR

    def run(self, feeds: Mapping[str, np.ndarray] | None = None, params: Mapping[str, np.ndarray] | None = None,
            seed: int = 0) -> list[np.ndarray]:
        """The outputs, computed by running the plan (equal to ``evaluate(self.graph, ...)``)."""
        if self.plan is None:
            raise GraphError(f"graph {self.graph.name!r} has symbolic dims {', '.join(self.graph.symbols)}: "
                             "specialize the compile result to plan and run it")
        return self.plan.run(feeds, params, seed)


def stage_of(value: Any) -> Stage:
    """The pipeline stage ``value`` stands at: a Module is HIR, a Graph MIR, a Plan or CompileResult LIR.
    TypeError for anything else."""
    for kind, stage in ((Module, Stage.HIR), (Graph, Stage.MIR), (Plan, Stage.LIR), (CompileResult, Stage.LIR)):
        if isinstance(value, kind):
            return stage
    raise TypeError(f"expected a Module (HIR), a Graph (MIR), or a Plan or CompileResult (LIR), got "
                    f"{type(value).__name__}")


def compile(graph_or_module: Graph | Module, target: Target | str = "cpu", optimize: bool = True,
            alignment: int = ALIGNMENT, assert_fusion_clean: bool = False, **options: Any) -> CompileResult:
    """Compile a graph or module for ``target``; ``options`` go to ``optimize_with_report``.

    ``assert_fusion_clean``: raise :class:`~rlx_egraph.report.fusion.MissedFusions` listing every missed fusion
    of the optimize report (the design's fusion contract) instead of returning a result that misses some.
    Raises LegalizeError naming the nodes when the target cannot run some op, and TypeError for anything but a
    Module (HIR) or Graph (MIR): a Plan or CompileResult (LIR) is compiled already.
    """
    stage = stage_of(graph_or_module)
    if stage is Stage.LIR:
        raise TypeError(f"compile takes a Module (HIR) or a Graph (MIR), got a {type(graph_or_module).__name__}, "
                        "which is LIR (compiled already): run it with .run(), or compile its graph again with "
                        "compile(x.graph, target)")
    if assert_fusion_clean and not optimize:
        raise ValueError("assert_fusion_clean=True needs optimize=True (the fusion report comes from the optimizer)")
    tgt = get_target(target)
    graph = graph_or_module.lower() if isinstance(graph_or_module, Module) else graph_or_module
    graph = legalize(graph, tgt)
    report = None
    if optimize:
        graph, report = optimize_with_report(graph, tgt, **options)
        if assert_fusion_clean:
            report.fusion.raise_if_missed()
        graph = legalize(graph, tgt)
    plan = None if graph.symbols else plan_memory(graph, tgt.name, alignment)
    return CompileResult(graph, tgt, report, plan, alignment)


def specialize[T: (Graph, Module, CompileResult)](graph_or_result: T, binding: Mapping[str, int]) -> T:
    """Bind symbolic dims to sizes (symbol -> int >= 1): the same kind of object, static.

    A Graph gives the static graph (same node ids); a Module the module whose inputs have the bound shapes;
    a CompileResult the result for the static graph with its memory plan.  Without symbols and with an empty
    binding the argument itself comes back.  GraphError (a ValueError) naming the symbol and an input using
    it when a value is missing or bad, or a symbol the graph lacks; naming the node when a value breaks a
    shape rule.
    """
    if isinstance(graph_or_result, Graph):
        return specialize_graph(graph_or_result, binding)
    if isinstance(graph_or_result, CompileResult):
        graph = specialize_graph(graph_or_result.graph, binding)
        if graph is graph_or_result.graph:
            return graph_or_result
        plan = plan_memory(graph, graph_or_result.target.name, graph_or_result.alignment)
        return CompileResult(graph, graph_or_result.target, graph_or_result.fusion, plan, graph_or_result.alignment)
    if isinstance(graph_or_result, Module):
        return _specialize_module(graph_or_result, binding)
    raise TypeError(f"specialize takes a Graph, Module or CompileResult, got {type(graph_or_result).__name__}")


def _specialize_module(module: Module, binding: Mapping[str, int]) -> Module:
    """``module`` with its inputs' shapes bound (checked on its lowered graph first)."""
    lowered = module.lower()
    if specialize_graph(lowered, binding) is lowered:  # static, empty binding
        return module
    out = Module(module.name, module.policy)
    for layer in module.layers:
        attrs = layer.attrs
        if layer.kind == "input":
            attrs = {**attrs, "shape": tuple(evaluate(as_dim(d), binding) for d in attrs["shape"])}
        out._add(layer.kind, layer.name, layer.inputs, **attrs)
    out.set_outputs(module.outputs)
    return out


__all__ = ["ALIGNMENT", "CompileResult", "LegalizeError", "Module", "Phase", "Plan", "PlanError", "Policy",
           "Section", "Stage", "compile", "legalize", "plan_memory", "specialize", "stage_of"]
