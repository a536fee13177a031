"""The compile pipeline: module or graph -> legalized, optimized graph -> launch order and memory plan.

``compile(graph_or_module, target)`` lowers a :class:`Module` (under its fusion
policy), legalizes the graph for the target (so a graph optimized for another
target can be retargeted), optimizes it, legalizes the result again (clipping
regions to the target's limits) and plans its memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cost import Target, get_target
from ..ir.graph import Graph
from ..optimize import optimize_with_report
from ..report import OptimizeReport
from .hir import Module, Policy
from .legalize import LegalizeError, legalize
from .plan import ALIGNMENT, Phase, Plan, PlanError, Section, plan_memory


@dataclass(frozen=True, eq=False)
class CompileResult:
    """What :func:`compile` made: the graph it planned, the optimize report (None when not optimized) and
    the plan."""

    graph: Graph
    target: Target
    fusion: OptimizeReport | None
    plan: Plan

    def run(self, feeds: Mapping[str, np.ndarray] | None = None, params: Mapping[str, np.ndarray] | None = None,
            seed: int = 0) -> list[np.ndarray]:
        """The outputs, computed by running the plan (equal to ``evaluate(self.graph, ...)``)."""
        return self.plan.run(feeds, params, seed)


def compile(graph_or_module: Graph | Module, target: Target | str = "cpu", optimize: bool = True,
            alignment: int = ALIGNMENT, **options: Any) -> CompileResult:
    """Compile a graph or module for ``target``; ``options`` go to ``optimize_with_report``.

    Raises LegalizeError naming the nodes when the target cannot run some op.
    """
    tgt = get_target(target)
    graph = graph_or_module.lower() if isinstance(graph_or_module, Module) else graph_or_module
    graph = legalize(graph, tgt)
    report = None
    if optimize:
        graph, report = optimize_with_report(graph, tgt, **options)
        graph = legalize(graph, tgt)
    return CompileResult(graph, tgt, report, plan_memory(graph, tgt.name, alignment))


def specialize[T: (Graph, Module, CompileResult)](graph_or_result: T, binding: Mapping[str, int]) -> T:
    """Bind symbolic dims to sizes.  Every dim is static today, so this returns its argument unchanged and
    refuses a binding that names any symbol."""
    if not isinstance(graph_or_result, Graph | Module | CompileResult):
        raise TypeError(f"specialize takes a Graph, Module or CompileResult, got {type(graph_or_result).__name__}")
    if binding:
        raise ValueError(f"specialize: unknown symbol(s) {sorted(binding)}: the graph has no symbolic dims")
    return graph_or_result


__all__ = ["ALIGNMENT", "CompileResult", "LegalizeError", "Module", "Phase", "Plan", "PlanError", "Policy",
           "Section", "compile", "legalize", "plan_memory", "specialize"]
