"""OptimizeReport: what an optimize() run did, printable and JSON-ready.

``matches_per_rule`` is egglog's count: matches summed over iterations, so a match
found again in a later iteration counts again.  ``applications_per_rule`` counts
distinct applications from the provenance tables: the distinct e-nodes each rule
built (well-typed ones) plus the distinct e-classes it merged into.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..cost import IoProfile
from ..egraph.decode import Fusion
from ..egraph.saturate import IterationStats
from ..egraph.view import IllTyped
from ..ir.registry import REGISTRY, Kind
from ..kernels.parity import ParityReport
from .data import OptimizationData
from .fusion import FusionReport

if TYPE_CHECKING:
    from ..fallback import FallbackStats

# Version of the JSON layout of ``to_dict``; raised when a key changes meaning or goes away.
FORMAT_VERSION = 2


@dataclass
class OptimizeReport:
    """Everything one optimization run measured and decided."""

    engine: str
    engine_reason: str
    target: str
    program_text: Callable[[], str] = field(default=str, repr=False)  # builds egglog_program when first read
    eclasses: int = 0
    enodes: int = 0
    stop_reason: str = ""
    iterations: list[IterationStats] = field(default_factory=list)
    matches_per_rule: dict[str, int] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    fusions: list[Fusion] = field(default_factory=list)
    ill_typed: list[IllTyped] = field(default_factory=list)  # e-nodes left out of extraction
    profile_before: IoProfile | None = None
    profile_after: IoProfile | None = None
    extraction: str = ""
    extraction_moves: int = 0
    extracted_ns: float = 0.0
    exact_ns: float | None = None
    exact_optimal: bool = False
    phases: dict[str, float] = field(default_factory=dict)
    parity: ParityReport | None = None
    data: OptimizationData = field(default_factory=OptimizationData, repr=False)  # the run as tables
    fallback: FallbackStats | None = None  # the fallback engine's per-rule counts, passes and lookahead
    fusion: FusionReport = field(default_factory=FusionReport)  # fused ops before/after, missed fusions

    @cached_property
    def egglog_program(self) -> str:
        """The egglog program the run saturated (egglog engine; empty otherwise), as text that runs as-is."""
        return self.program_text()

    @property
    def fused_op_counts(self) -> dict[str, int]:
        """Fused-op nodes (kind ``fused``) the rules and passes built, per op; views and derived weights
        (Narrow, ConcatParams) are in ``fusions`` but not counted here."""
        return dict(sorted(Counter(f.op for f in self.fusions if REGISTRY[f.op].kind is Kind.FUSED).items()))

    @property
    def applications_per_rule(self) -> dict[str, int]:
        """Distinct applications per rule: distinct e-nodes built plus distinct e-classes merged into."""
        return {r["rule"]: r["enodes_built"] + r["eclasses_merged_into"] for r in self.data.rule_applications}

    @property
    def gain_ns(self) -> float:
        if self.profile_before is None or self.profile_after is None:
            return 0.0
        return self.profile_before.ns - self.profile_after.ns

    def to_dict(self, include_program: bool = False, include_data: bool = False) -> dict[str, Any]:
        """JSON-ready; the egglog program and the data tables only on request."""
        out = {
            "format_version": FORMAT_VERSION,
            "engine": self.engine,
            "engine_reason": self.engine_reason,
            "target": self.target,
            "eclasses": self.eclasses,
            "enodes": self.enodes,
            "stop_reason": self.stop_reason,
            "iterations": [{"stage": it.stage, "iterations": it.iterations, "matches": it.matches,
                            "enodes": it.enodes, "seconds": it.seconds} for it in self.iterations],
            "matches_per_rule": self.matches_per_rule,
            "applications_per_rule": self.applications_per_rule,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "fusions": [f.to_dict() for f in self.fusions],
            "fused_op_counts": self.fused_op_counts,
            "ill_typed": [bad.to_dict() for bad in self.ill_typed],
            "profile_before": self.profile_before.to_dict() if self.profile_before else None,
            "profile_after": self.profile_after.to_dict() if self.profile_after else None,
            "extraction": self.extraction,
            "extraction_moves": self.extraction_moves,
            "extracted_ns": self.extracted_ns,
            "exact_ns": self.exact_ns,
            "exact_optimal": self.exact_optimal,
            "phases": self.phases,
            "parity": self.parity.to_dict() if self.parity else None,
            "fusion": self.fusion.to_dict(),
            "fallback": self.fallback.to_dict() if self.fallback else None,
        }
        if include_program:
            out["egglog_program"] = self.egglog_program
        if include_data:
            out["data"] = self.data.to_dict()
        return out

    def to_json(self, indent: int | None = 1, include_program: bool = False, include_data: bool = False) -> str:
        return json.dumps(self.to_dict(include_program, include_data), indent=indent, default=str)

    def __str__(self) -> str:
        lines = [f"=== rlx-egraph optimize report ({self.engine} engine, target {self.target}) ===",
                 f"engine: {self.engine_reason}"]
        if self.engine == "egglog":
            lines.append(f"e-graph: {self.eclasses} e-classes, {self.enodes} e-nodes; stopped: {self.stop_reason}; "
                         f"{sum(it.iterations for it in self.iterations)} iterations")
        fired = {k: v for k, v in self.matches_per_rule.items() if v}
        if fired:
            counted = "egglog's, summed over iterations" if self.engine == "egglog" else "summed over passes"
            if self.fallback is not None and self.fallback.blocks:
                counted += " and blocks; a kind of block is matched once, counted for each"
            lines.append(f"rule matches ({counted}): "
                         + ", ".join(f"{k} x{v}" for k, v in fired.items()))
        applied = {k: v for k, v in self.applications_per_rule.items() if v}
        if applied:
            lines.append("rule applications (distinct e-nodes built + e-classes merged into): "
                         + ", ".join(f"{k} x{v}" for k, v in applied.items()))
        if self.fallback is not None:
            fb = self.fallback
            commits, starts = fb.commits, sum(s.chain_starts for s in fb.rules.values())
            passes = f"{sum(fb.passes.values())} passes"
            if fb.blocks:
                passes = (f"{fb.blocks} blocks ({fb.block_kinds} distinct, each optimized once), then {passes} "
                          "near their seams")
            lines.append(f"fallback: {sum(commits.values())} rewrites committed, {passes}; stopped: "
                         f"{fb.stop_reason}; lookahead: {fb.chains_asked} chain starts and {fb.ties_asked} ties asked "
                         f"about, {fb.regions_run} region runs, {starts} chains taken")
        lines.append(f"graph: {self.nodes_before} nodes -> {self.nodes_after} nodes")
        if self.engine == "egglog":
            lines.append(self.fusion.summary_line())
        if self.ill_typed:
            lines.append(f"ill-typed e-nodes left out: {len(self.ill_typed)}; first: {self.ill_typed[0].message}")
        if self.profile_before and self.profile_after:
            lines.append(f"before: {self.profile_before}")
            lines.append(f"after:  {self.profile_after}")
            before = self.profile_before.ns
            pct = 100.0 * self.gain_ns / before if before else 0.0
            lines.append(f"predicted gain: {self.gain_ns:,.0f} ns ({pct:.1f}%)")
        if self.exact_ns is not None:
            gap = self.extracted_ns - self.exact_ns
            what = "exact optimum" if self.exact_optimal else "best exact solution (time limit, not proven)"
            lines.append(f"extraction: {self.extraction} {self.extracted_ns:,.0f} ns of node costs; {what} "
                         f"{self.exact_ns:,.0f} ns (gap {gap:,.0f} ns)")
        if self.parity is not None:
            worst, seeds = self.parity.worst, ", ".join(map(str, self.parity.seeds))
            if self.parity.special:
                rounds = f" in {self.parity.special} rounds" if self.parity.special > 1 else ""
                seeds += f"; IEEE special values on seed {self.parity.seeds[0]}{rounds}"
            if worst is None or worst.tolerance_ratio == 0:
                detail = ", all values equal" if worst else ""
            else:
                detail = f", worst at {worst.tolerance_ratio:.2g} of tolerance (node {worst.node} {worst.op})"
            lines.append(f"parity: {'ok' if self.parity.ok else 'FAILED'} on {len(self.parity.nodes)} comparisons "
                         f"(seeds {seeds}){detail}")
        lines.append("time: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in self.phases.items()))
        return "\n".join(lines)
