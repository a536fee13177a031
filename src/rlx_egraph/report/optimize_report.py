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
from ..cost.profile import format_ns as _time
from ..engines.egglog.decode import Fusion
from ..engines.egglog.saturate import IterationStats
from ..engines.egglog.view import IllTyped
from ..engines.regions import ClippedRegion
from ..ir.graph import Graph
from ..ir.registry import REGISTRY, Kind
from ..kernels.parity import ParityReport
from .data import OptimizationData
from .explorer import MAX_EXPLORED_ENODES, EGraphExplorer
from .fusion import FusionReport
from .html import notebook_html, report_html

if TYPE_CHECKING:
    from ..engines.fallback import FallbackStats

# Version of the JSON layout of ``to_dict``; raised when a key changes meaning or goes away.
FORMAT_VERSION = 2
HOW_CHECKED = ("the input graph and the optimized graph run with the numpy reference kernels on the same seeded "
               "random data; every optimized node compared with the input-graph value it replaces, every output "
               "with the input graph's, within the tolerance of its dtype")


@dataclass(frozen=True)
class Verification:
    """Whether a run's values were checked (the parity check, docs/verifier.md), and why.

    ``user_rules``: the rule files of the run from outside the shipped set; with ``verify=None`` (the default)
    they are what turns the check on.  ``sample``: what was checked when the input graph was too large to check
    whole (:class:`~rlx_egraph.kernels.parity.ParitySample`), else empty.  ``weight_folds``: the optimized nodes
    reading weights folded from stored ones, each checked on those weights whether or not values are checked.
    """

    checked: bool
    why: str
    user_rules: tuple[str, ...] = ()
    sample: str = ""
    weight_folds: int = 0  # nodes reading folded stored weights, checked on those weights (check_weight_folds)

    @property
    def how(self) -> str | None:
        """How the values were checked (None: they were not)."""
        if not self.checked:
            return None
        return f"on {self.sample}" if self.sample else HOW_CHECKED

    def to_dict(self) -> dict[str, Any]:
        return {"checked": self.checked, "why": self.why, "user_rules": list(self.user_rules), "how": self.how,
                "weight_folds": self.weight_folds}


@dataclass(frozen=True)
class Measured:
    """The measured latency (ns) of the graph given to optimize and of the graph it returned, and how it was
    measured (``rlx_egraph.onnx.measure_report`` records one); ``predicted_before_ns`` and ``predicted_after_ns``:
    the predicted latency of each as exported (``rlx_egraph.onnx.price_export``), None where not priced (the
    report then compares with the profiles)."""

    before_ns: float
    after_ns: float
    how: str
    predicted_before_ns: float | None = None
    predicted_after_ns: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"before_ns": self.before_ns, "after_ns": self.after_ns, "how": self.how,
                "predicted_before_ns": self.predicted_before_ns, "predicted_after_ns": self.predicted_after_ns}


@dataclass
class OptimizeReport:
    """Everything one optimization run measured and decided."""

    engine: str
    engine_reason: str
    target: str
    program_text: Callable[[], str] = field(default=str, repr=False)  # builds egglog_program when first read
    terms_text: Callable[[], str] = field(default=str, repr=False)  # builds egglog_terms when first read
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
    verification: Verification = field(default_factory=lambda: Verification(False, "not requested"))
    data: OptimizationData = field(default_factory=OptimizationData, repr=False)  # the run as tables
    fallback: FallbackStats | None = None  # the fallback engine's per-rule counts, passes and lookahead
    fusion: FusionReport = field(default_factory=FusionReport)  # fused ops before/after, missed fusions
    # the input graph and the optimized graph as they were at the end of the run (for pictures; None from optimize())
    graphs: tuple[Graph, Graph] | None = field(default=None, repr=False)
    rules: list[dict[str, Any]] = field(default_factory=list, repr=False)  # RuleSet.list() of the rules that ran
    measured: Measured | None = None  # measured latencies, when measured (rlx_egraph.onnx.measure_report)
    calibration: str = ""  # where the target's figures come from, when measured (Target.calibration)
    regions_clipped: list[ClippedRegion] = field(default_factory=list)  # regions over the target's limits, regrouped
    assumptions: list[str] = field(default_factory=list)  # what the input graph holds only under (ONNX import)
    hint_choices: list[str] = field(default_factory=list)  # choices that depended on the symbolic dims' hints

    @cached_property
    def egglog_program(self) -> str:
        """The egglog program the run saturated (egglog engine; empty otherwise), as text that runs as-is."""
        return self.program_text()

    @cached_property
    def egglog_terms(self) -> str:
        """:attr:`egglog_program` with the graph as one readable term per node (``$n<id>``), ending with
        egglog's extraction of each output: the program to read and re-run by hand (egglog engine; empty
        otherwise)."""
        return self.terms_text()

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
            "verification": self.verification.to_dict(),
            "parity": self.parity.to_dict() if self.parity else None,
            "fusion": self.fusion.to_dict(),
            "regions_clipped": [{"node": c.node, "steps": c.steps, "inputs": c.inputs, "pieces": list(c.pieces)}
                                for c in self.regions_clipped],
            "fallback": self.fallback.to_dict() if self.fallback else None,
            "measured": self.measured.to_dict() if self.measured else None,
            "calibration": self.calibration,
            "assumptions": self.assumptions,
            "hint_choices": self.hint_choices,
        }
        if include_program:
            out["egglog_program"] = self.egglog_program
        if include_data:
            out["data"] = self.data.to_dict()
        return out

    def to_json(self, indent: int | None = 1, include_program: bool = False, include_data: bool = False) -> str:
        return json.dumps(self.to_dict(include_program, include_data), indent=indent, default=str)

    def to_html(self, title: str | None = None) -> str:
        """The report as one self-contained HTML page: both graphs drawn side by side, the fused nodes with what
        they replaced and the rules that built them, missed fusions, cost charts, e-graph statistics (see
        :mod:`rlx_egraph.report.html`).  Nothing in it is fetched from the network."""
        return report_html(self, title)

    def explore(self, max_enodes: int = MAX_EXPLORED_ENODES) -> EGraphExplorer:
        """An interactive explorer of the run's e-graph (egglog's visualizer; see :mod:`rlx_egraph.report.explorer`):
        in Jupyter, show it; elsewhere, ``save("egraph.html")``."""
        return EGraphExplorer.from_report(self, max_enodes)

    def _repr_html_(self) -> str:
        """Jupyter shows the report as the HTML page's body."""
        return notebook_html(self)

    def verification_lines(self) -> list[str]:
        """Whether and why values were checked, then the parity check's headline (docs/verifier.md)."""
        check = self.verification
        folds = [f"weight folds: {check.weight_folds} node(s) reading folded weights checked on the stored weights "
                 "against the computation they replace"] if check.weight_folds else []
        if self.parity is None:
            return [f"values not checked: {check.why} (verify=True checks them)", *folds]
        worst, seeds = self.parity.worst, ", ".join(map(str, self.parity.seeds))
        if self.parity.special:
            rounds = f" in {self.parity.special} rounds" if self.parity.special > 1 else ""
            seeds += f"; IEEE special values on seed {self.parity.seeds[0]}{rounds}"
        if worst is None or worst.tolerance_ratio == 0:
            detail = ", all values equal" if worst else ""
        else:
            after = self.graphs[1] if self.graphs is not None else None
            where = after.describe(worst.node) if after is not None and worst.node in after \
                and after.source_names(worst.node) else f"node {worst.node} {worst.op}"
            detail = f", worst at {worst.tolerance_ratio:.2g} of tolerance ({where})"
        what = f"on {check.sample}" if check.sample else \
            "every optimized node against the value it replaces, with the numpy reference kernels on seeded random data"
        why = [f"values checked: {check.why}; {what}"] if check.checked else []
        return [*why, *folds, f"parity: {'ok' if self.parity.ok else 'FAILED'} on {len(self.parity.nodes)} "
                              f"comparisons (seeds {seeds}){detail}"]

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
                          "over the whole graph")
            lines.append(f"fallback: {sum(commits.values())} rewrites committed, {passes}; stopped: "
                         f"{fb.stop_reason}; lookahead: {fb.chains_asked} chain starts asked about, {fb.regions_run} "
                         f"region runs, {starts} chains taken")
        lines.append(f"graph: {self.nodes_before} nodes -> {self.nodes_after} nodes")
        lines.append(self.fusion.summary_line())
        if self.regions_clipped:
            lines.append("regions over the target's limits, regrouped within them: "
                         + "; ".join(map(str, self.regions_clipped)))
        if self.ill_typed:
            lines.append(f"ill-typed e-nodes left out: {len(self.ill_typed)}; first: {self.ill_typed[0].message}")
        if self.profile_before and self.profile_after:
            lines.append(f"before: {self.profile_before}")
            lines.append(f"after:  {self.profile_after}")
            before = self.profile_before.ns
            pct = 100.0 * self.gain_ns / before if before else 0.0
            lines.append(f"predicted gain: {self.gain_ns:,.0f} ns ({pct:.1f}%)")
            if self.calibration:
                lines.append(f"priced by: {self.calibration}")
            if self.measured is not None:
                m = self.measured
                first = m.predicted_before_ns if m.predicted_before_ns is not None else before
                then = m.predicted_after_ns if m.predicted_after_ns is not None else self.profile_after.ns
                lines.append(f"measured: before {_time(m.before_ns)} (predicted {_time(first)}, "
                             f"{first / m.before_ns:.2f}x), after {_time(m.after_ns)} (predicted "
                             f"{_time(then)}, {then / m.after_ns:.2f}x); {m.how}")
        if self.exact_ns is not None:
            gap = self.extracted_ns - self.exact_ns
            what = "exact optimum" if self.exact_optimal else "best exact solution (time limit, not proven)"
            lines.append(f"extraction: {self.extraction} {self.extracted_ns:,.0f} ns of node costs; {what} "
                         f"{self.exact_ns:,.0f} ns (gap {gap:,.0f} ns)")
        lines.extend(self.verification_lines())
        if self.assumptions:
            lines.append("assumes: " + "; ".join(self.assumptions))
        if self.hint_choices:
            lines.append(f"choices that depend on the size hints ({len(self.hint_choices)}): "
                         + "; ".join(self.hint_choices))
        lines.append("time: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in self.phases.items()))
        return "\n".join(lines)
