"""``optimize(graph)``: the whole pipeline, and the choice of engine.

encode -> saturate (rules/*.egg) -> extract (IO cost, DAG-aware) -> decode ->
optional parity check.  The input graph is never changed.
"""

from __future__ import annotations

import time
from typing import Any

from egglog import bindings as eb

from .cost import Target, get_target, profile
from .egraph import extract as ex
from .egraph.decode import Decoded, Fusion, decode
from .egraph.encode import encode_graph
from .egraph.regions import apply_regions
from .egraph.rules import STAGES, RuleSet, load_rules
from .egraph.saturate import SaturationLimits, saturate
from .egraph.schema import schema_text
from .egraph.view import build_view
from .ir.graph import Graph
from .kernels.parity import ParityReport, check_parity
from .report import OptimizeReport

ENGINES = ("auto", "egglog", "fallback")
EXTRACTIONS = ("greedy", "exact")


def optimize(graph: Graph, target: str | Target = "cpu", rules: Any = None, verify: bool = False,
             **options: Any) -> Graph:
    """The cheapest equivalent graph under ``target``'s cost model (see :func:`optimize_with_report`)."""
    return optimize_with_report(graph, target, rules, verify, **options)[0]


def optimize_with_report(graph: Graph, target: str | Target = "cpu", rules: Any = None, verify: bool = False,
                         engine: str = "auto", extraction: str = "greedy", exact_gap: bool = False,
                         attention_block_max_tokens: int = 64, regions: bool = True, seed: int = 0,
                         **limits: Any) -> tuple[Graph, OptimizeReport]:
    """Optimize ``graph``; returns the new graph and an :class:`OptimizeReport`.

    ``rules``: None for the shipped rules, or rule files/folders (see ``load_rules``).
    ``engine``: "auto" | "egglog" | "fallback".  ``extraction``: "greedy" or "exact".
    ``exact_gap``: also solve the exact problem and report its optimum.
    ``regions``: fuse remaining elementwise chains into ElementwiseRegion nodes
    (a pass after extraction; only on targets with region kernels, only where it pays).
    ``verify``: check every node against the input graph with numpy (raises ParityError).
    ``limits``: SaturationLimits fields (max_iterations, max_enodes, max_seconds, ...).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if extraction not in EXTRACTIONS:
        raise ValueError(f"extraction must be one of {EXTRACTIONS}, got {extraction!r}")
    tgt = get_target(target)
    if engine == "fallback":
        return _optimize_fallback(graph, tgt, load_rules(rules), verify, attention_block_max_tokens, regions,
                                  seed, limits)
    try:
        sat_limits = SaturationLimits(**limits)
    except TypeError as exc:
        raise TypeError(f"unknown optimize option: {exc}") from None
    ruleset = load_rules(rules)
    phases: dict[str, float] = {}
    report = OptimizeReport("egglog", "auto: the egglog engine handles every size until the fallback lands"
                            if engine == "auto" else "requested", tgt.name)

    t0 = time.perf_counter()
    encoding = encode_graph(graph, attention_block_max_tokens)
    egraph = eb.EGraph()
    egraph.run_program(*egraph.parse_program(schema_text()))
    egraph.run_program(*egraph.parse_program("\n".join(f"(ruleset {s})" for s in STAGES)))
    egraph.run_program(*ruleset.commands())
    egraph.run_program(*egraph.parse_program(encoding.text))
    phases["encode"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    result = saturate(egraph, ruleset, sat_limits)
    phases["saturate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    view = build_view(egraph, graph, encoding.constants, ruleset)
    roots = [view.class_of_node[o] for o in graph.outputs]
    costs = ex.node_costs(view, tgt)
    if extraction == "exact":
        chosen = ex.exact(view, roots, tgt, costs)
    else:
        chosen = ex.greedy(view, roots, tgt, {n.id: k for k, n in enumerate(graph.nodes)}, costs)
    report.extracted_ns = chosen.cost_ns
    if exact_gap:
        best = ex.exact(view, roots, tgt, costs)
        report.exact_ns, report.exact_optimal = best.cost_ns, best.optimal
    phases["extract"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    decoded = decode(view, chosen.choice, graph, ruleset, result.matches_per_rule)
    if regions:
        decoded = _with_regions(decoded, tgt)
    phases["decode"] = time.perf_counter() - t0

    report.egglog_program = _program_text(ruleset, encoding.text)
    report.eclasses, report.enodes = len(view.classes), view.num_enodes
    report.stop_reason, report.iterations = result.stop_reason, result.history
    report.matches_per_rule = result.matches_per_rule
    report.nodes_before, report.nodes_after = len(graph), len(decoded.graph)
    report.fusions = decoded.fusions
    report.extraction, report.extraction_moves = chosen.method, chosen.moves
    report.profile_before, report.profile_after = profile(graph, tgt), profile(decoded.graph, tgt)
    if verify:
        t0 = time.perf_counter()
        report.parity = _parity(graph, decoded, ruleset, result.matches_per_rule, seed)
        phases["verify"] = time.perf_counter() - t0
    report.phases = phases
    return decoded.graph, report


def _parity(graph: Graph, decoded: Decoded, ruleset: RuleSet, fired: dict[str, int], seed: int) -> ParityReport:
    """Check every node against the input nodes of its value, naming the fired rules that may have equated them."""
    def suspects(new_op: str, old_op: str) -> list[str]:
        return [r.name for r in ruleset.rules if fired.get(r.name) and (old_op in r.reads or new_op in r.builds)]

    return check_parity(graph, decoded.graph, decoded.originals, suspects, seed)


def _optimize_fallback(graph: Graph, tgt: Target, ruleset: RuleSet, verify: bool, attention_block_max_tokens: int,
                       regions: bool, seed: int, limits: dict[str, Any]) -> tuple[Graph, OptimizeReport]:
    """The same rules applied by the fallback pattern matcher on the graph (see :mod:`rlx_egraph.fallback`)."""
    from .fallback import FallbackLimits, run

    try:
        fallback_limits = FallbackLimits(**limits)
    except TypeError as exc:
        raise TypeError(f"unknown option for the fallback engine: {exc}") from None
    result = run(graph, ruleset, tgt, fallback_limits, attention_block_max_tokens)
    stats = result.stats
    phases = dict(stats.phases)
    t0 = time.perf_counter()
    decoded = Decoded(result.graph, {n: n for n in result.provenance}, result.originals, result.fusions)
    if regions:
        decoded = _with_regions(decoded, tgt)
    phases["regions"] = time.perf_counter() - t0
    report = OptimizeReport("fallback", "requested", tgt.name)
    report.stop_reason = stats.stop_reason
    report.matches_per_rule = {name: s.matches for name, s in sorted(stats.rules.items())}
    report.nodes_before, report.nodes_after = len(graph), len(decoded.graph)
    report.fusions = decoded.fusions
    report.profile_before, report.profile_after = profile(graph, tgt), profile(decoded.graph, tgt)
    if verify:
        t0 = time.perf_counter()
        report.parity = _parity(graph, decoded, ruleset, stats.commits, seed)
        phases["verify"] = time.perf_counter() - t0
    report.phases = phases
    return decoded.graph, report


def _with_regions(decoded: Decoded, target: Target) -> Decoded:
    """Apply the ElementwiseRegion pass and carry provenance over to the new ids."""
    graph, same_value, applied = apply_regions(decoded.graph, target)
    if not applied:
        return decoded
    new_of = {old: new for new, old in same_value.items()}
    fusions = [Fusion(new_of[f.node], f.op, f.rules, f.replaces) for f in decoded.fusions if f.node in new_of]
    fusions += [Fusion(new_of[r.tail], "ElementwiseRegion", ("pass:elementwise-region",),
                       tuple(decoded.originals[r.tail])) for r in applied]
    return Decoded(graph, {n: decoded.class_of[o] for n, o in same_value.items()},
                   {n: decoded.originals[o] for n, o in same_value.items()}, sorted(fusions, key=lambda f: f.node))


def _program_text(ruleset: RuleSet, graph_text: str) -> str:
    return "\n".join([schema_text(), ruleset.text, graph_text, ruleset.schedule_text()])
