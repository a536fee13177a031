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
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from functools import partial
from typing import Any

from egglog import bindings as eb

from .checks import show
from .cost import Target, get_target, profile
from .cost.targets import unsupported_op
from .engines import fallback
from .engines.budget import Deadline, DeadlineExceeded, gc_paused
from .engines.egglog import extract as ex
from .engines.egglog.decode import Decoded, Fusion, decode
from .engines.egglog.encode import Encoding, dump_egglog_program
from .engines.egglog.program import build_egraph, release_egraph
from .engines.egglog.rules import RuleSet, default_rule_dir, load_rules
from .engines.egglog.saturate import STOP_SATURATED, STOP_TIME, IterationStats, SaturationLimits, egraph_size, saturate
from .engines.egglog.schema import schema_text
from .engines.egglog.view import EGraphView, build_view
from .engines.regions import Batch, ClippedRegion, Region, apply_batches, apply_regions, clip_regions
from .ir.graph import Graph
from .ir.registry import REGISTRY, Kind, snake_case
from .ir.specialize import Sentinels, specialize_graph
from .kernels.parity import check_parity, check_reference_inputs, check_weight_folds
from .options import Options, build_options, verification_choice
from .report import OptimizeReport
from .report.data import OptimizationData
from .report.fusion import (
    fused_op_counts,
    merge_misses,
    missed_fusions,
    region_prologues,
    scan_optimized,
)
from .report.optimize_report import Verification
from .report.progress import step, timed, tracked

log = logging.getLogger("rlx_egraph")

# What the report's e-graph tables and missed fusions are made from: the view, the choice, the e-node costs and
# the e-graph (all None for the fallback engine, or where the egglog run stopped before them).
EgglogTables = tuple[EGraphView | None, dict[int, int] | None, list[float] | None, eb.EGraph | None]

# Above this many nodes ``engine="auto"`` runs the fallback engine (why: docs/engines.md).
FALLBACK_THRESHOLD = 100_000
# The token bound of FusedAttentionBlock on a target that sets none (an i64 egglog compares with any product).
NO_TOKEN_BOUND = 2**62


def engine_by_size(engine: str, nodes: int) -> str:
    """The engine ``engine`` ("auto", "egglog" or "fallback") runs first on a graph of ``nodes`` nodes ("auto" may
    still fall back when a saturation stops at a limit)."""
    return "fallback" if engine == "fallback" or (engine == "auto" and nodes > FALLBACK_THRESHOLD) else "egglog"


# Whether optimize_with_report computes the report's summaries (the IO profiles, the data tables, the fused-op counts
# and the missed fusions): optimize() returns only the graph, so it turns them off for its call.
_SUMMARIES: ContextVar[bool] = ContextVar("rlx_egraph_report_summaries", default=True)


def optimize(graph: Graph, target: str | Target | None = None, rules: Any = None,
             verify: bool | Mapping[str, Any] | None = None, *, options: Options | None = None,
             **keywords: Any) -> Graph:
    """The cheapest equivalent graph under the target's cost model: :func:`optimize_with_report`'s graph, same
    options.  The report's summaries, which only the report shows, are not computed (at 100k nodes its two IO
    profiles alone take some 0.3 s)."""
    token = _SUMMARIES.set(False)
    try:
        return optimize_with_report(graph, target, rules, verify, options=options, **keywords)[0]
    finally:
        _SUMMARIES.reset(token)


@tracked("optimize")
@gc_paused()
def optimize_with_report(graph: Graph, target: str | Target | None = None, rules: Any = None,
                         verify: bool | Mapping[str, Any] | None = None, *, options: Options | None = None,
                         **keywords: Any) -> tuple[Graph, OptimizeReport]:
    """Optimize ``graph``; returns the new graph and an :class:`OptimizeReport`.

    ``options``: an :class:`~rlx_egraph.Options` (None: the defaults).  The keywords (``target``, ``rules``,
    ``verify`` and every other field of :class:`~rlx_egraph.Options` by name) change those options; ``target``,
    ``rules`` and ``verify`` may come second to fourth by position, and None there leaves the option as
    ``options`` has it.  Every option is checked first: TypeError or ValueError naming it.

    A graph made by a front end (``graph.meta["source"]``, e.g. ``"onnx"``) gets that front end's rules with the
    shipped ones when ``rules`` is None (:func:`default_rules`).  ``report.stop_reason`` says which limit, if any,
    stopped the run.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be an rlx_egraph.Graph, got {show(graph)}")
    given = {k: v for k, v in (("target", target), ("rules", rules), ("verify", verify)) if v is not None}
    opts = build_options(options, {**given, **keywords})
    verify, dim_hints, engine = opts.verify, opts.dim_hints, opts.engine
    feeds = dict(verify) if isinstance(verify, Mapping) else {}
    feed_sizes = check_reference_inputs(graph, feeds)  # before the run, not after it
    summaries = _SUMMARIES.get()
    sat_limits = opts.limits
    deadline = Deadline(sat_limits.max_seconds)  # the whole run's, up to the parity check: both engines share it
    tgt = get_target(opts.target)
    carried = graph.meta.get("dim_hints")
    hints = {**(carried if isinstance(carried, dict) else {}), **(dim_hints or {})}
    if hints:
        tgt = tgt.replace(dim_hints={**tgt.dim_hints, **hints})
    ruleset = load_rules(opts.rules if opts.rules is not None else default_rules(graph))
    attention_block_max_tokens = opts.attention_block_max_tokens
    if attention_block_max_tokens is None:
        attention_block_max_tokens = NO_TOKEN_BOUND if tgt.attention_block_max_tokens is None \
            else tgt.attention_block_max_tokens
    sentinels = Sentinels.choose(graph) if graph.symbols else None
    static, run_tgt = graph, tgt
    if sentinels is not None:
        static = specialize_graph(graph, sentinels.binding)
        run_tgt = tgt.priced_as(sentinels.price({s: tgt.hint(s) for s in graph.symbols}))
    checked, why_checked, user_rules = verification_choice(verify, ruleset)
    log.info("optimize %s: %s nodes, target %s, %d rules from %d files; values %s", graph.name, f"{len(graph):,}",
             tgt.name, len({r.base for r in ruleset.rules}), len(ruleset.sources),
             f"checked: {why_checked}" if checked else f"not checked: {why_checked}")
    if engine_by_size(engine, len(graph)) == "fallback":
        why = "requested" if engine == "fallback" else \
            f"auto: {len(graph):,} nodes is above the egglog engine's threshold of {FALLBACK_THRESHOLD:,}"
        new, report, tables = _optimize_fallback(static, run_tgt, ruleset, sat_limits, attention_block_max_tokens,
                                                 opts.regions, why, summaries, deadline)
    else:
        new, report, tables = _optimize_egglog(static, run_tgt, ruleset, sat_limits, opts.extraction,
                                               opts.exact_gap, attention_block_max_tokens, opts.regions, opts.strict,
                                               summaries, deadline)
        stopped = report.stop_reason != STOP_SATURATED and not report.stop_reason.startswith("unsound")
        if engine == "auto" and stopped and deadline.expired():
            report.engine_reason = (f"auto: the egglog engine stopped at a limit ({report.stop_reason}) with no time "
                                    "left for the fallback, so its result stands")
        elif engine == "auto" and stopped:
            why = (f"auto: the egglog engine stopped at a limit ({report.stop_reason}), so the fallback ran in the "
                   "time left")
            log.warning(why)
            new, report, tables = _optimize_fallback(static, run_tgt, ruleset, sat_limits,
                                                     attention_block_max_tokens, opts.regions, why, summaries, deadline)
        elif engine == "egglog":
            report.engine_reason = "requested"
    carry_node_names(graph, new)
    result, original, optimized = new.graph, graph, new.graph
    if sentinels is not None:  # back to symbols; priced and checked at the hints (or at the reference inputs')
        result = sentinels.restore(new.graph)
        sizes = {s: tgt.hint(s) for s in graph.symbols} | feed_sizes
        original, optimized = specialize_graph(graph, sizes), specialize_graph(result, sizes)
    if summaries:  # of the graphs as given and returned: a symbolic graph is priced at the hints
        with timed("report", report.phases) as outcome:
            _summarize(report, graph, result, tgt, new, *tables, static, ruleset)
            outcome.summary = report.fusion.summary_line() if report.engine == "egglog" else ""
        report.assumptions = [str(a) for a in graph.meta.get("assumptions", ())]
        if sentinels is not None and tables[1] is not None:
            report.hint_choices = hint_choices(tables[0], static, tgt, sentinels, tables[1])
    if tables[3] is not None:  # nothing reads the e-graph from here on: the next run of these rules starts from it
        release_egraph(tables[3], ruleset)
    suspects = {r.name: r.location for r in ruleset.rules if r.location.rpartition(":")[0] in user_rules}
    folds = check_weight_folds(original, optimized, new.originals, blame(new, suspects), opts.seed)
    report.verification = Verification(checked, why_checked, user_rules, weight_folds=folds)
    if checked:
        with timed("verify", report.phases) as outcome:
            report.parity = check_parity(original, optimized, new.originals, blame(new, suspects), opts.seed,
                                        feeds)
            if report.parity.sample is not None:
                report.verification = replace(report.verification, sample=str(report.parity.sample))
            outcome.summary = report.verification_lines()[-1]
    log.info("optimize %s: %s -> %s nodes in %.3f s (%s engine; %s)", graph.name, f"{len(graph):,}",
             f"{len(result):,}", sum(report.phases.values()), report.engine, report.stop_reason)
    return result, report


def hint_choices(view: EGraphView, static: Graph, tgt: Target, sentinels: Sentinels,
                 choice: dict[int, int]) -> list[str]:
    """The extraction's choices that depended on the hints a symbolic graph was priced at: each value the optimized
    graph computes with another op when every symbol is priced at 1 or at 16 times its hint (greedy extraction
    again at those prices), named by its input nodes."""
    symbols = tuple(sentinels.binding)
    hints = {s: tgt.hint(s) for s in symbols}
    roots = [view.class_of_node[o] for o in static.outputs]
    found: dict[int, list[str]] = {}
    for alt in ({s: 1 for s in symbols}, {s: 16 * hints[s] for s in symbols}):
        priced = tgt.priced_as(sentinels.price(alt))
        other = ex.greedy(view, roots, priced, static.positions(), ex.node_costs(view, priced),
                          earliest=ex.earliest_positions(static.nodes)).choice
        at = ", ".join(f"{s}={v}" for s, v in alt.items())
        for c, idx in choice.items():
            was, now = view.nodes[idx].op, view.nodes[other[c]].op if c in other else None
            if now is not None and was != now and Kind.FUSED in (REGISTRY[was].kind, REGISTRY[now].kind) \
                    and view.classes[c].originals:
                found.setdefault(c, []).append(f"{now} at {at}")
    return [f"{' = '.join(static.describe(o) for o in view.classes[c].originals)}: {view.nodes[choice[c]].op} at "
            f"the hints ({', '.join(f'{s}={v}' for s, v in hints.items())}), " + "; ".join(alts)
            for c, alts in sorted(found.items())]


def carry_node_names(source: Graph, decoded: Decoded) -> None:
    """Name each optimized node by the source names of the input nodes it computes (``meta["node_names"]``: one
    name, or the list of them for a node that replaces several): the nodes between the input nodes of its value
    and those of its inputs' values, so a fused node names every node it absorbed."""
    names = source.meta.get("node_names")
    if not isinstance(names, dict):
        decoded.graph.meta.pop("node_names", None)
        return
    carried: dict[str, str | list[str]] = {}
    for node in decoded.graph.nodes:
        if node.kind is Kind.LEAF:
            continue
        stops = {o for i in node.inputs for o in decoded.originals.get(i, ())}
        cone, stack = set(), [o for o in decoded.originals.get(node.id, ()) if o not in stops]
        while stack:
            o = stack.pop()
            if o in cone or source.node(o).kind is Kind.LEAF:
                continue
            cone.add(o)
            stack.extend(i for i in source.node(o).inputs if i not in stops)
        found = list(dict.fromkeys(n for o in sorted(cone) for n in source.source_names(o)))
        if found:
            carried[str(node.id)] = found[0] if len(found) == 1 else found
    decoded.graph.meta["node_names"] = carried


def default_rules(graph: Graph) -> RuleSet:
    """The rules a graph gets when the caller names none: the shipped ones, and for a graph a front end made
    (``graph.meta["source"]``) the rules of that front end too (``rules/<source>/``, e.g. ``rules/onnx/``: they rely
    on what its importer guarantees, such as the causal keep mask's form)."""
    source = graph.meta.get("source")
    folder = default_rule_dir() / source if isinstance(source, str) and source.isidentifier() else None
    return load_rules([default_rule_dir(), folder] if folder is not None and folder.is_dir() else None)


def _optimize_egglog(graph: Graph, tgt: Target, ruleset: RuleSet, sat_limits: SaturationLimits, extraction: str,
                     exact_gap: bool, attention_block_max_tokens: int, regions: bool, strict: bool,
                     missed: bool, deadline: Deadline) -> tuple[Decoded, OptimizeReport, EgglogTables]:
    """The egglog engine: encode, saturate, extract, decode, then the region passes (each timed in the report),
    all before ``deadline``;
    ``missed``: and the fusion patterns left in its graph (``report.fusion.missed``, merged with the e-graph's
    misses by :func:`_summarize`).  Also returns what the report's e-graph tables and missed fusions are made from
    (the view, the choice, the e-node costs and the e-graph; None where the run stopped before them)."""
    phases: dict[str, float] = {}
    report = OptimizeReport("egglog", f"auto: {len(graph):,} nodes is within the egglog engine's threshold of "
                            f"{FALLBACK_THRESHOLD:,}", tgt.name)

    with timed("encode", phases) as outcome:
        egraph, encoding = build_egraph(graph, ruleset, attention_block_max_tokens)
        outcome.summary = f"{len(graph):,} nodes"

    with timed("saturate", phases) as outcome:
        result = saturate(egraph, ruleset, sat_limits, deadline, on_iteration=_saturation_step)
        outcome.summary = (f"{len(result.history)} iterations over {len(result.stages)} stages, "
                           f"{result.history[-1].enodes if result.history else 0:,} e-nodes; {result.stop_reason}")

    notes: list[str] = []
    decoded = view = chosen = costs = None
    with timed("extract", phases) as outcome:
        try:
            view = build_view(egraph, graph, encoding.constants, ruleset, strict, deadline)
        except DeadlineExceeded as exc:
            notes.append(f"{exc}, so the input graph is returned unchanged")
            report.enodes = egraph_size(egraph)
            outcome.summary = notes[-1]
        else:
            report.eclasses, report.enodes = len(view.classes), view.num_enodes
            report.ill_typed = view.ill_typed
            if view.ill_typed:
                log.warning("%d ill-typed e-node(s) left out of extraction (report.ill_typed lists them); first: "
                            "%s", len(view.ill_typed), view.ill_typed[0].message)
            if view.merged:
                notes.append(f"{view.merged[0].message}; the input graph is returned unchanged")
                log.warning(notes[-1])
            else:
                costs = ex.node_costs(view, tgt)
                chosen = _extract(view, graph, tgt, extraction, exact_gap, deadline, report, costs)
                notes.extend(chosen.notes)
                report.extraction, report.extraction_moves = chosen.method, chosen.moves
                outcome.summary = (f"{report.eclasses:,} e-classes, {report.enodes:,} e-nodes; {chosen.method}: "
                                   f"{chosen.cost_ns:,.0f} ns of node costs, {chosen.moves} local-search moves")
    if chosen is not None:
        with timed("decode", phases) as outcome:
            decoded = decode(view, chosen.choice, graph)
            outcome.summary = f"{len(decoded.graph):,} nodes, {len(decoded.fusions)} built by rules"
        if missed:  # the patterns left in the graph, before regions hide their steps
            report.fusion.missed = scan_optimized(decoded.graph, decoded.originals, graph, ruleset)
        with timed("regions", phases) as outcome:  # the passes after either engine's decision
            before = len(decoded.graph)
            decoded, report.regions_clipped = _with_regions(decoded, tgt, regions, deadline)
            outcome.summary = f"{before:,} -> {len(decoded.graph):,} nodes"
    if decoded is None:
        decoded = Decoded(graph.copy(), {}, {n.id: [n.id] for n in graph.nodes},
                          {n.id: () for n in graph.nodes}, {n.id: () for n in graph.nodes})
    decoded.graph.adopt_store(graph)

    report.program_text = partial(_program_text, ruleset, encoding)
    report.terms_text = partial(dump_egglog_program, graph, ruleset, attention_block_max_tokens, form="terms")
    report.stop_reason = _stop_reason(result.stop_reason, result.detail, notes)
    report.iterations = result.history
    report.matches_per_rule = result.matches_per_rule
    report.nodes_before, report.nodes_after = len(graph), len(decoded.graph)
    report.fusions = decoded.fusions
    report.phases = phases
    return decoded, report, (view, chosen.choice if chosen is not None else None, costs, egraph)


def _saturation_step(it: IterationStats) -> None:
    """Show and log (DEBUG) one saturation iteration."""
    matches = sum(it.matches.values())
    step(f"{it.stage}: {matches:,} matches, {it.enodes:,} e-nodes")
    top = ", ".join(f"{rule} x{n}" for rule, n in sorted(it.matches.items(), key=lambda kv: (-kv[1], kv[0]))[:5])
    how = "plain" if it.match_limit is None else f"bounded, match limit {it.match_limit:,}"
    log.debug("optimize: saturate: %s iteration (%s) %.3f s: %s matches%s, %s e-nodes after", it.stage, how,
              it.seconds, f"{matches:,}", f" ({top})" if top else "", f"{it.enodes:,}")


def _optimize_fallback(graph: Graph, tgt: Target, ruleset: RuleSet, sat_limits: SaturationLimits,
                       attention_block_max_tokens: int, regions: bool, why: str, missed: bool,
                       deadline: Deadline) -> tuple[Decoded, OptimizeReport, EgglogTables]:
    """The fallback engine: the same rules matched on the graph itself (see :mod:`rlx_egraph.engines.fallback`).  It has
    no e-graph, so nothing for the report's e-graph tables (see :func:`_optimize_egglog`); ``missed``: the
    patterns left unfused in its graph."""
    limits = fallback.FallbackLimits(sat_limits.max_iterations, sat_limits.max_seconds)
    outer: dict[str, float] = {}
    with timed("fallback", outer) as outcome:
        result = fallback.run(graph, ruleset, tgt, limits, attention_block_max_tokens, deadline)
        stats = result.stats
        outcome.summary = (f"{sum(stats.commits.values()):,} rewrites committed in {sum(stats.passes.values())} "
                           f"passes; {stats.stop_reason}")
    for name, seconds in stats.phases.items():
        log.debug("optimize: fallback: %s %.3f s", name, seconds)
    if math.isinf(stats.cost_after_ns):
        held = {o for n in result.graph.nodes if not tgt.supports(n.op) for o in result.originals[n.id]}
        error = unsupported_op(tgt, ((n.id, n.op) for n in graph.nodes if n.id in held))
        if error is not None:
            raise error
    phases = dict(stats.phases)
    ids = result.built_by.keys()  # (dict.fromkeys and zip make the id-keyed tables in C: 600,000 ids at 1M)
    decoded = Decoded(result.graph, dict(zip(ids, ids, strict=True)), result.originals, result.built_by,
                      dict.fromkeys(ids, ()), result.fusions, result.relied_on)
    report = OptimizeReport("fallback", why, tgt.name)
    if missed:  # the patterns left in the graph, before regions hide their steps
        report.fusion.missed = scan_optimized(decoded.graph, decoded.originals, graph, ruleset)
    with timed("regions", phases) as outcome:
        before = len(decoded.graph)
        decoded, report.regions_clipped = _with_regions(decoded, tgt, regions, deadline)
        decoded.graph.adopt_store(graph)
        outcome.summary = f"{before:,} -> {len(decoded.graph):,} nodes"
    report.fallback = stats
    report.stop_reason = stats.stop_reason
    report.matches_per_rule = {name: s.matches for name, s in sorted(stats.rules.items())}
    report.nodes_before, report.nodes_after = len(graph), len(decoded.graph)
    report.fusions = decoded.fusions
    report.phases = phases
    return decoded, report, (None, None, None, None)


def _summarize(report: OptimizeReport, before: Graph, after: Graph, tgt: Target, decoded: Decoded,
               view: EGraphView | None, choice: Any, costs: list[float] | None, egraph: eb.EGraph | None,
               ran: Graph, ruleset: RuleSet) -> None:
    """Fill the report's summaries of a run (either engine's): the IO profiles of the graph given (``before``) and
    the graph returned (``after``), the run as data tables, the fused-op counts, and the egglog engine's missed
    fusions (found on the graph the run optimized, ``ran``)."""
    report.profile_before, report.profile_after = profile(before, tgt), profile(after, tgt)
    report.calibration = tgt.calibration
    report.data = OptimizationData.build((report.profile_before, report.profile_after), report.iterations, decoded,
                                         view, choice, costs)
    report.fusion.before, report.fusion.after = fused_op_counts(before), fused_op_counts(after)
    report.graphs, report.rules = (snapshot(before), snapshot(after)), ruleset.list()
    report.fusion.region_prologues = region_prologues(after)
    if choice is not None and egraph is not None:
        egraph_missed, report.fusion.near_misses_checked = missed_fusions(view, ran, choice, costs, ruleset, tgt,
                                                                          egraph)
        report.fusion.missed = merge_misses(egraph_missed, report.fusion.missed)


def snapshot(graph: Graph) -> Graph:
    """A graph of the same nodes, outputs and source node names, which later changes to ``graph`` do not reach
    (nodes are immutable)."""
    copy = Graph.from_checked(graph.name, list(graph.nodes))
    copy.set_outputs(graph.outputs)
    if "node_names" in graph.meta:
        copy.meta["node_names"] = dict(graph.meta["node_names"])
    return copy


def blame(decoded: Decoded, suspects: Mapping[str, str] | None = None) -> Callable[[int], list[str]]:
    """``blame(node_id)``: the rules that built optimized node ``node_id``, then those that merged into its e-class,
    then those that wrote the helper-relation rows they read; the ``suspects`` among them (rules from outside the
    shipped set: name -> ``file:line``) first, with their location: a parity failure of a node a shipped rule built
    over a user rule's value, or on a user rule's helper row, names the user rule first."""
    suspects = suspects or {}

    def rules(node_id: int) -> list[str]:
        named = dict.fromkeys(decoded.built_by.get(node_id, ()) + decoded.merged_by.get(node_id, ())
                              + decoded.relied_on.get(node_id, ()))
        return [f"{r} ({suspects[r]})" for r in named if r in suspects] + [r for r in named if r not in suspects]

    return rules



def _extract(view: EGraphView, graph: Graph, target: Target, extraction: str, exact_gap: bool, deadline: Deadline,
             report: OptimizeReport, costs: list[float]) -> ex.Extraction:
    """Extract with ``extraction``; when the exact solver runs out of time, greedy (which
    starts from the input graph) gives the answer.  ``exact_gap`` also records the ILP optimum."""
    roots = [view.class_of_node[o] for o in graph.outputs]
    chosen = ex.greedy(view, roots, target, graph.positions(), costs, deadline,
                       earliest=ex.earliest_positions(graph.nodes))
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


def _with_regions(decoded: Decoded, target: Target, form: bool,
                  deadline: Deadline | None = None) -> tuple[Decoded, list[ClippedRegion]]:
    """Clip the regions over ``target``'s limits, then (``form``) apply the region passes (transform and
    elementwise regions, then batches; past ``deadline`` the region passes apply what they found by then), and
    carry provenance over; returns the regions clipped.

    Every pass keeps every node's id (a region takes its tail's, a clipped region's last piece the region's, a
    batch's lane the lane's), so each table keeps its entries but those of the nodes a region absorbed.  A region
    is built by its pass from its steps: it carries their builders and mergers, and its fusion replaces theirs (its
    tail's too: that node is the region now, whatever a rule made it).
    """
    if target.region_kernels:
        graph, clipped = clip_regions(decoded.graph, target.region_max_steps, target.region_max_inputs)
        if clipped:
            decoded = _clipped(decoded, graph, clipped)
    else:
        clipped = []
    if not form:
        return decoded, clipped
    graph, _, applied = apply_regions(decoded.graph, target, deadline)
    if applied:
        decoded = _regioned(decoded, graph, applied)
    graph, batches = apply_batches(decoded.graph, target)
    if batches:
        decoded = _batched(decoded, graph, batches)
    return decoded, clipped


def _pass_name(op: str) -> str:
    """The builder a region pass records: ``pass:elementwise-region``, ``pass:transform-region``, ..."""
    return "pass:" + snake_case(op).replace("_", "-")


def _regioned(decoded: Decoded, graph: Graph, applied: list[Region]) -> Decoded:
    """``decoded``'s tables for ``graph``, where ``applied`` regions replaced their members."""
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
        built_by[r.tail] = tuple(dict.fromkeys((_pass_name(r.kind), *(n for m in r.members
                                                                     for n in decoded.built_by[m]))))
        merged_by[r.tail] = tuple(dict.fromkeys(n for m in r.members for n in decoded.merged_by[m]))
        fusions.append(Fusion(r.tail, r.kind, built_by[r.tail], tuple(decoded.originals[r.tail])))
    relied = _relied(decoded, {r.tail: r.members for r in applied}, absorbed)
    return Decoded(graph, kept(decoded.class_of), kept(decoded.originals), built_by, merged_by,
                   sorted(fusions, key=lambda f: f.node), relied)


def _batched(decoded: Decoded, graph: Graph, batches: list[Batch]) -> Decoded:
    """``decoded``'s tables for ``graph``, where each batch runs its lanes: the batch and its Narrows are new, and
    each lane (a Reshape view of the batch now) keeps its value's originals; all are built by the batch pass."""
    originals, built_by, merged_by = dict(decoded.originals), dict(decoded.built_by), dict(decoded.merged_by)
    lanes = {m for b in batches for m in b.lanes}
    fusions = [f for f in decoded.fusions if f.node not in lanes]
    for b in batches:
        builders = tuple(dict.fromkeys((_pass_name(graph.node(b.node).op),
                                        *(n for m in b.lanes for n in decoded.built_by[m]))))
        for new in (b.node, *b.narrows):
            originals[new], built_by[new], merged_by[new] = [], builders, ()
        for m in b.lanes:
            built_by[m] = builders
            fusions.append(Fusion(m, graph.node(m).op, builders, tuple(originals[m])))
        fusions.append(Fusion(b.node, graph.node(b.node).op, builders,
                              tuple(o for m in b.lanes for o in originals[m])))
    relied = _relied(decoded, {new: b.lanes for b in batches for new in (b.node, *b.narrows)})
    return Decoded(graph, decoded.class_of, originals, built_by, merged_by, sorted(fusions, key=lambda f: f.node),
                   relied)


def _clipped(decoded: Decoded, graph: Graph, clipped: list[ClippedRegion]) -> Decoded:
    """``decoded``'s tables for ``graph``, where ``clipped`` regions were regrouped: each piece is built by
    ``pass:clip-region`` (and by the rules that built the region), the last holds the region's value."""
    originals, built_by, merged_by = dict(decoded.originals), dict(decoded.built_by), dict(decoded.merged_by)
    pieces = {p for c in clipped for p in c.pieces}
    fusions = [f for f in decoded.fusions if f.node not in pieces]
    for c in clipped:
        builders = tuple(dict.fromkeys(("pass:clip-region", *decoded.built_by[c.node])))
        for p in c.pieces:
            built_by[p] = builders
            if p != c.node:
                originals[p], merged_by[p] = [], ()
            fusions.append(Fusion(p, graph.node(p).op, builders, tuple(originals[p])))
    relied = _relied(decoded, {p: (c.node,) for c in clipped for p in c.pieces})
    return Decoded(graph, decoded.class_of, originals, built_by, merged_by, sorted(fusions, key=lambda f: f.node),
                   relied)


def _relied(decoded: Decoded, made: dict[int, Sequence[int]], absorbed: Sequence[int] = ()
            ) -> dict[int, tuple[str, ...]]:
    """``decoded.relied_on`` after a pass: each node of ``made`` relies on what the nodes it was made from relied on;
    ``absorbed`` nodes are gone."""
    gone = set(absorbed)
    relied = {n: r for n, r in decoded.relied_on.items() if n not in gone}
    for node, sources in made.items():
        names = tuple(dict.fromkeys(r for m in sources for r in decoded.relied_on.get(m, ())))
        if names:
            relied[node] = names
        else:
            relied.pop(node, None)
    return relied


def _program_text(ruleset: RuleSet, encoding: Encoding) -> str:
    return "\n".join([schema_text(), ruleset.text, encoding.text, ruleset.schedule_text()])
