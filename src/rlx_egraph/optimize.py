"""``optimize(graph)``: the whole pipeline, and the choice of engine.

Two engines apply the same rules (``rules/*.egg``) and decide with the same
cost function (``Target.node_ns`` summed over the DAG):

* ``egglog``: encode -> saturate -> extract (IO cost, DAG-aware) -> decode.
  ``max_seconds`` is the budget of the whole run (the parity check excluded):
  saturation, the view, extraction and decoding all respect one deadline.
* ``fallback``: the rules compiled to patterns and matched on the graph itself,
  committing a rewrite only when the predicted cost drops (:mod:`.fallback`).

``engine="auto"`` takes the fallback above :data:`FALLBACK_THRESHOLD` nodes, and
when an egglog saturation stops at a limit; the report says which ran and why.
Then the ElementwiseRegion pass, the report and the optional parity check are
the same for both.  The input graph is never changed.

A graph with symbolic dims runs as a static graph whose symbols stand as
sentinel primes (:class:`~rlx_egraph.ir.specialize.Sentinels`), priced at the
size hints (``dim_hints``, else the target's), and is mapped back; its parity
check runs at the hints.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from functools import partial
from typing import Any

from egglog import bindings as eb

from . import fallback
from .cost import Target, get_target, profile
from .cost.targets import unsupported_op
from .egraph import extract as ex
from .egraph.budget import Deadline, DeadlineExceeded, gc_paused
from .egraph.decode import Decoded, Fusion, decode
from .egraph.encode import Encoding, encode_graph
from .egraph.regions import apply_regions
from .egraph.rules import RuleSet, load_rules
from .egraph.saturate import STOP_SATURATED, STOP_TIME, SaturationLimits, egraph_size, saturate
from .egraph.schema import schema_text
from .egraph.view import EGraphView, build_view
from .ir.graph import Graph
from .ir.specialize import Sentinels, specialize_graph
from .kernels.parity import check_parity, check_reference_inputs
from .options import check_options
from .report import OptimizeReport
from .report.data import OptimizationData
from .report.fusion import fused_op_counts, missed_fusions
from .report.progress import phase, tracked

log = logging.getLogger("rlx_egraph")

# Above this many nodes ``engine="auto"`` runs the fallback engine (see the README's "Two engines" figures).
FALLBACK_THRESHOLD = 100_000


def engine_by_size(engine: str, nodes: int) -> str:
    """The engine ``engine`` ("auto", "egglog" or "fallback") runs first on a graph of ``nodes`` nodes ("auto" may
    still fall back when a saturation stops at a limit)."""
    return "fallback" if engine == "fallback" or (engine == "auto" and nodes > FALLBACK_THRESHOLD) else "egglog"


# Whether optimize_with_report computes the report's summaries (the IO profiles, the data tables, the fused-op counts
# and the missed fusions): optimize() returns only the graph, so it turns them off for its call.
_SUMMARIES: ContextVar[bool] = ContextVar("rlx_egraph_report_summaries", default=True)


def optimize(graph: Graph, target: str | Target = "cpu", rules: Any = None,
             verify: bool | Mapping[str, Any] = False, **options: Any) -> Graph:
    """The cheapest equivalent graph under ``target``'s cost model: :func:`optimize_with_report`'s graph, same
    options.  The report's summaries, which only the report shows, are not computed (at 100k nodes its two IO
    profiles alone take some 0.3 s)."""
    token = _SUMMARIES.set(False)
    try:
        return optimize_with_report(graph, target, rules, verify, **options)[0]
    finally:
        _SUMMARIES.reset(token)


@tracked("optimize")
@gc_paused()
def optimize_with_report(graph: Graph, target: str | Target = "cpu", rules: Any = None,
                         verify: bool | Mapping[str, Any] = False,
                         engine: str = "auto", extraction: str = "greedy", exact_gap: bool = False,
                         attention_block_max_tokens: int = 64, regions: bool = True, seed: int = 0,
                         strict: bool = False, dim_hints: Mapping[str, int] | None = None,
                         **limits: Any) -> tuple[Graph, OptimizeReport]:
    """Optimize ``graph``; returns the new graph and an :class:`OptimizeReport`.

    ``rules``: None for the shipped rules, or rule files/folders (see ``load_rules``).
    ``engine``: "auto" | "egglog" | "fallback".  ``extraction``: "greedy" or "exact".
    ``exact_gap``: also solve the exact problem and report its optimum.
    ``regions``: fuse remaining elementwise chains into ElementwiseRegion nodes
    (a pass after extraction; only on targets with region kernels, only where it pays).
    ``verify``: check every node against the input graph with numpy (raises ParityError); True draws the inputs,
    a mapping gives reference values for some or all of them by name (a symbolic graph is then checked at the
    sizes their shapes give its symbols).
    ``strict``: raise UnsoundRewrite when a rule built an ill-typed e-node or merged input-graph
    nodes of different types.  Otherwise ill-typed e-nodes are left out of extraction and listed
    in ``report.ill_typed``, and after a bad merge the input graph is returned unchanged (the
    reason in ``report.stop_reason`` and a warning on the ``rlx_egraph`` logger).
    ``limits``: SaturationLimits fields (max_iterations, max_enodes, max_seconds, match_limit);
    ``max_seconds`` is the budget of the whole run (the parity check excluded).
    ``report.stop_reason`` says which limit, if any, stopped the run.
    ``dim_hints``: the sizes symbolic dims are priced at (symbol -> int), over the target's ``dim_hints``.
    Every option is checked first (:mod:`rlx_egraph.options`): TypeError or ValueError naming it.
    """
    check_options(optimize_with_report, locals())
    feeds = dict(verify) if isinstance(verify, Mapping) else {}
    verifying = verify is True or isinstance(verify, Mapping)
    feed_sizes = check_reference_inputs(graph, feeds)  # before the run, not after it
    summaries = _SUMMARIES.get()
    sat_limits = SaturationLimits(**limits)
    deadline = Deadline(sat_limits.max_seconds)  # the whole run's, up to the parity check: both engines share it
    tgt = get_target(target)
    if dim_hints:
        tgt = tgt.replace(dim_hints={**tgt.dim_hints, **dim_hints})
    ruleset = load_rules(rules)
    sentinels = Sentinels.choose(graph) if graph.symbols else None
    static, run_tgt = graph, tgt
    if sentinels is not None:
        static = specialize_graph(graph, sentinels.binding)
        run_tgt = tgt.priced_as(sentinels.price({s: tgt.hint(s) for s in graph.symbols}))
    if engine_by_size(engine, len(graph)) == "fallback":
        why = "requested" if engine == "fallback" else \
            f"auto: {len(graph):,} nodes is above the egglog engine's threshold of {FALLBACK_THRESHOLD:,}"
        new, report, tables = _optimize_fallback(static, run_tgt, ruleset, sat_limits, attention_block_max_tokens,
                                                 regions, why, deadline)
    else:
        new, report, tables = _optimize_egglog(static, run_tgt, ruleset, sat_limits, extraction, exact_gap,
                                               attention_block_max_tokens, regions, strict, summaries, deadline)
        stopped = report.stop_reason != STOP_SATURATED and not report.stop_reason.startswith("unsound")
        if engine == "auto" and stopped and deadline.expired():
            report.engine_reason = (f"auto: the egglog engine stopped at a limit ({report.stop_reason}) with no time "
                                    "left for the fallback, so its result stands")
        elif engine == "auto" and stopped:
            why = (f"auto: the egglog engine stopped at a limit ({report.stop_reason}), so the fallback ran in the "
                   "time left")
            log.warning(why)
            new, report, tables = _optimize_fallback(static, run_tgt, ruleset, sat_limits,
                                                     attention_block_max_tokens, regions, why, deadline)
        elif engine == "egglog":
            report.engine_reason = "requested"
    result, original, optimized = new.graph, graph, new.graph
    if sentinels is not None:  # back to symbols; priced and checked at the hints (or at the reference inputs')
        result = sentinels.restore(new.graph)
        sizes = {s: tgt.hint(s) for s in graph.symbols} | feed_sizes
        original, optimized = specialize_graph(graph, sizes), specialize_graph(result, sizes)
    if summaries:  # of the graphs as given and returned: a symbolic graph is priced at the hints
        _summarize(report, graph, result, tgt, new, *tables)
    if verifying:
        t0 = time.perf_counter()
        phase("verify")
        report.parity = check_parity(original, optimized, new.originals, blame(new), seed, feeds)
        report.phases["verify"] = time.perf_counter() - t0
    return result, report


def _optimize_egglog(graph: Graph, tgt: Target, ruleset: RuleSet, sat_limits: SaturationLimits, extraction: str,
                     exact_gap: bool, attention_block_max_tokens: int, regions: bool, strict: bool,
                     missed: bool, deadline: Deadline) -> tuple[Decoded, OptimizeReport,
                                                                tuple[EGraphView | None, Any, Any]]:
    """The egglog engine: encode, saturate, extract, decode, then the regions pass (each timed in the report);
    ``missed``: and the missed fusions.  Also returns what the report's e-graph tables are made from (the view, the
    choice and the e-node costs; None where the run stopped before them)."""
    phases: dict[str, float] = {}
    report = OptimizeReport("egglog", f"auto: {len(graph):,} nodes is within the egglog engine's threshold of "
                            f"{FALLBACK_THRESHOLD:,}", tgt.name)

    t0 = time.perf_counter()
    phase("encode")
    egraph, encoding = build_egraph(graph, ruleset, attention_block_max_tokens)
    phases["encode"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    phase("saturate")
    result = saturate(egraph, ruleset, sat_limits, deadline)
    phases["saturate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    phase("extract")
    notes: list[str] = []
    decoded = view = chosen = costs = None
    try:
        view = build_view(egraph, graph, encoding.constants, ruleset, strict, deadline)
    except DeadlineExceeded as exc:
        notes.append(f"{exc}, so the input graph is returned unchanged")
        report.enodes = egraph_size(egraph)
    else:
        report.eclasses, report.enodes = len(view.classes), view.num_enodes
        report.ill_typed = view.ill_typed
        if view.ill_typed:
            log.warning("%d ill-typed e-node(s) left out of extraction (report.ill_typed lists them); first: %s",
                        len(view.ill_typed), view.ill_typed[0].message)
        if view.merged:
            notes.append(f"{view.merged[0].message}; the input graph is returned unchanged")
            log.warning(notes[-1])
        else:
            costs = ex.node_costs(view, tgt)
            chosen = _extract(view, graph, tgt, extraction, exact_gap, deadline, report, costs)
            notes.extend(chosen.notes)
            report.extraction, report.extraction_moves = chosen.method, chosen.moves
            phases["extract"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            phase("decode")
            decoded = decode(view, chosen.choice, graph)
            phases["decode"] = time.perf_counter() - t0
            if regions:  # the pass after either engine's decision, timed apart as in the fallback's report
                t0 = time.perf_counter()
                phase("regions")
                decoded = _with_regions(decoded, tgt, deadline)
                phases["regions"] = time.perf_counter() - t0
    if decoded is None:
        decoded = Decoded(graph.copy(), {}, {n.id: [n.id] for n in graph.nodes},
                          {n.id: () for n in graph.nodes}, {n.id: () for n in graph.nodes})
    decoded.graph.adopt_store(graph)

    report.program_text = partial(_program_text, ruleset, encoding)
    choice = chosen.choice if chosen is not None else None
    if missed and choice is not None:
        report.fusion.missed, report.fusion.near_misses_checked = missed_fusions(
            view, graph, choice, costs, ruleset, tgt, egraph)
    report.stop_reason = _stop_reason(result.stop_reason, result.detail, notes)
    report.iterations = result.history
    report.matches_per_rule = result.matches_per_rule
    report.nodes_before, report.nodes_after = len(graph), len(decoded.graph)
    report.fusions = decoded.fusions
    report.phases = phases
    return decoded, report, (view, choice, costs)


def _optimize_fallback(graph: Graph, tgt: Target, ruleset: RuleSet, sat_limits: SaturationLimits,
                       attention_block_max_tokens: int, regions: bool,
                       why: str, deadline: Deadline) -> tuple[Decoded, OptimizeReport, tuple[None, None, None]]:
    """The fallback engine: the same rules matched on the graph itself (see :mod:`rlx_egraph.fallback`).  It has
    no e-graph, so nothing for the report's e-graph tables (see :func:`_optimize_egglog`)."""
    phase("fallback")
    limits = fallback.FallbackLimits(sat_limits.max_iterations, sat_limits.max_seconds)
    result = fallback.run(graph, ruleset, tgt, limits, attention_block_max_tokens, deadline)
    stats = result.stats
    if math.isinf(stats.cost_after_ns):
        held = {o for n in result.graph.nodes if not tgt.supports(n.op) for o in result.originals[n.id]}
        error = unsupported_op(tgt, ((n.id, n.op) for n in graph.nodes if n.id in held))
        if error is not None:
            raise error
    phases = dict(stats.phases)
    t0 = time.perf_counter()
    ids = result.built_by.keys()  # (dict.fromkeys and zip make the id-keyed tables in C: 600,000 ids at 1M)
    decoded = Decoded(result.graph, dict(zip(ids, ids, strict=True)), result.originals, result.built_by,
                      dict.fromkeys(ids, ()), result.fusions)
    if regions:
        decoded = _with_regions(decoded, tgt, deadline)
    decoded.graph.adopt_store(graph)
    phases["regions"] = time.perf_counter() - t0
    report = OptimizeReport("fallback", why, tgt.name)
    report.fallback = stats
    report.stop_reason = stats.stop_reason
    report.matches_per_rule = {name: s.matches for name, s in sorted(stats.rules.items())}
    report.nodes_before, report.nodes_after = len(graph), len(decoded.graph)
    report.fusions = decoded.fusions
    report.phases = phases
    return decoded, report, (None, None, None)


def _summarize(report: OptimizeReport, before: Graph, after: Graph, tgt: Target, decoded: Decoded,
               view: EGraphView | None, choice: Any, costs: list[float] | None) -> None:
    """Fill the report's summaries of a run (either engine's): the IO profiles of the graph given (``before``) and
    the graph returned (``after``), the run as data tables, and the fused-op counts (beside the egglog engine's
    missed fusions)."""
    report.profile_before, report.profile_after = profile(before, tgt), profile(after, tgt)
    report.data = OptimizationData.build((report.profile_before, report.profile_after), report.iterations, decoded,
                                         view, choice, costs)
    report.fusion.before, report.fusion.after = fused_op_counts(before), fused_op_counts(after)


def build_egraph(graph: Graph, ruleset: RuleSet, attention_block_max_tokens: int = 64) -> tuple[eb.EGraph, Encoding]:
    """A new egglog e-graph holding the schema, ``ruleset`` and ``graph``'s terms, not yet saturated.  egglog
    parses and runs the schema and the rules in a second thread while ``graph`` is encoded."""
    with ThreadPoolExecutor(1, thread_name_prefix="rlx-egglog-rules") as egglog:
        fresh = egglog.submit(egraph_from_program, rules_program(ruleset))
        encoding = encode_graph(graph, attention_block_max_tokens)
        egraph = fresh.result()
    encoding.load(egraph)
    return egraph, encoding


def rules_program(ruleset: RuleSet) -> str:
    """The schema and ``ruleset`` as one egglog program."""
    return schema_text() + "\n" + ruleset.text


def new_egraph(ruleset: RuleSet) -> eb.EGraph:
    """A new egglog e-graph holding the schema and ``ruleset``, no terms yet."""
    return egraph_from_program(rules_program(ruleset))


def egraph_from_program(program: str) -> eb.EGraph:
    """A new egglog e-graph that has run ``program`` (egglog lets go of the GIL while it parses and runs a
    program's text, not while it runs parsed commands)."""
    egraph = eb.EGraph()
    egraph.parse_and_run_program(program)
    return egraph


def blame(decoded: Decoded) -> Callable[[int], list[str]]:
    """``blame(node_id)``: the rules that built optimized node ``node_id``, then those that merged into its e-class."""
    return lambda node_id: list(dict.fromkeys(decoded.built_by.get(node_id, ()) + decoded.merged_by.get(node_id, ())))


def _extract(view: EGraphView, graph: Graph, target: Target, extraction: str, exact_gap: bool, deadline: Deadline,
             report: OptimizeReport, costs: list[float]) -> ex.Extraction:
    """Extract with ``extraction``; when the exact solver runs out of time, greedy (which
    starts from the input graph) gives the answer.  ``exact_gap`` also records the ILP optimum."""
    roots = [view.class_of_node[o] for o in graph.outputs]
    chosen = ex.greedy(view, roots, target, graph.positions(), costs, deadline)
    if extraction == "exact":  # greedy's choice is the solver's first incumbent
        try:
            chosen = ex.exact(view, roots, target, costs, deadline=deadline, start=chosen.choice)
        except DeadlineExceeded as exc:
            chosen.notes.insert(0, f"{exc}; greedy extraction was used")
    report.extracted_ns = chosen.cost_ns
    if exact_gap:
        try:
            best = ex.exact(view, roots, target, costs, deadline=deadline, start=chosen.choice)
            report.exact_ns, report.exact_optimal = best.cost_ns, best.optimal
        except DeadlineExceeded as exc:
            chosen.notes.append(f"{exc}, so no gap is reported")
    return chosen


def _stop_reason(saturation: str, detail: str, notes: list[str]) -> str:
    """``saturated``, or which limit stopped the run and what it cost, in words."""
    parts = [] if saturation == STOP_SATURATED else [detail]
    if notes and not parts and not notes[0].startswith("unsound"):
        notes = [f"{STOP_TIME}: {notes[0]}", *notes[1:]]
    return "; ".join(parts + notes) or STOP_SATURATED


def _with_regions(decoded: Decoded, target: Target, deadline: Deadline) -> Decoded:
    """Apply the ElementwiseRegion pass and carry provenance over.

    The pass keeps every node's id (a region takes its tail's), so each table keeps its entries but those of the
    nodes a region absorbed.  A region is built by the pass from its steps: it carries their builders and mergers,
    and its fusion replaces theirs (its tail's too: that node is the region now, whatever a rule made it).
    """
    graph, _, applied = apply_regions(decoded.graph, target, deadline)
    if not applied:
        return decoded
    absorbed = [m for r in applied for m in r.members if m != r.tail]

    def kept(table: dict[int, Any]) -> dict[int, Any]:
        out = dict(table)
        for m in absorbed:
            del out[m]
        return out

    built_by, merged_by = kept(decoded.built_by), kept(decoded.merged_by)
    members = {m for r in applied for m in r.members}
    fusions = [f for f in decoded.fusions if f.node not in members]
    for r in applied:
        built_by[r.tail] = tuple(dict.fromkeys(("pass:elementwise-region", *(n for m in r.members
                                                                            for n in decoded.built_by[m]))))
        merged_by[r.tail] = tuple(dict.fromkeys(n for m in r.members for n in decoded.merged_by[m]))
        fusions.append(Fusion(r.tail, "ElementwiseRegion", built_by[r.tail], tuple(decoded.originals[r.tail])))
    return Decoded(graph, kept(decoded.class_of), kept(decoded.originals), built_by, merged_by,
                   sorted(fusions, key=lambda f: f.node))


def _program_text(ruleset: RuleSet, encoding: Encoding) -> str:
    return "\n".join([schema_text(), ruleset.text, encoding.text, ruleset.schedule_text()])
