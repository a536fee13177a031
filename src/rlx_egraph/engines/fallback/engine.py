"""The fallback engine: the ``.egg`` rules applied on the graph, each rewrite decided by cost.

docs/engines.md describes its stages and passes, the cost-neutral steps it takes, the lookahead (:mod:`.lookahead`)
and the blocks (:mod:`.blocks`).  A plan is the best match of a rule (its operand orders are one rule) at a root:
the new nodes, checked by the op registry, the uses they replace, and the change of predicted cost (the new nodes'
cost minus that of the nodes that die), per node the one extraction minimises (:func:`rlx_egraph.cost.enode.enode_ns`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...cost import Target, get_target
from ...cost.enode import EPS, LEAF_OPS, NodePrices
from ...ir.graph import Graph, GraphError, Node, check_node
from ...ir.provenance import Fusion, fold_projections
from ...ir.registry import REGISTRY, Kind
from ...ir.rewrite import GraphRewriter
from ...rules import (
    STAGES,
    Absent,
    Fact,
    Let,
    NoValue,
    OpTerm,
    Rule,
    RuleSet,
    SetValue,
    TensorList,
    Term,
    Union,
    Var,
    load_rules,
)
from ...rules import Pattern as NodePattern
from ...rules.signatures import constructor_args
from ..budget import Deadline, gc_paused
from .blocks import blocks
from .facts import ABSENT, Facts, compile_term
from .lookahead import ALONE, CHAIN_EPS, FOLLOW, NEVER, Chain, Lookahead, RegionRun, cut_out, matched_names
from .matcher import ArrayValue, Matcher, compile_matcher, plan_matcher
from .pattern import CompiledRules, CompileError, Unsupported, compile_rules

log = logging.getLogger(__name__)

STOP_DONE = "no rewrite lowers the cost"
STOP_ITERATIONS = "iteration limit"
STOP_TIME = "time limit"
NO_GAIN = "does not lower the cost"
KNOWN_FORM = "the node already has this form"
BANNED = "a later stage's chain pays more without it"
TYPE_TABLES = frozenset({"shape", "dtype"})  # tables the op registry already fills for every node


@dataclass(frozen=True)
class FallbackLimits:
    """Bounds on the fallback: passes per stage and wall time (the graph stays valid at any stop)."""

    max_iterations: int = 30
    max_seconds: float = 300.0


@dataclass
class RuleStats:
    """One rule: matches found, rewrites committed, plans rejected by reason."""

    matches: int = 0
    commits: int = 0
    chain_starts: int = 0  # plans that cost more by themselves, taken because the chain they start pays
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str, times: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + times


@dataclass
class FallbackStats:
    rules: dict[str, RuleStats] = field(default_factory=dict)
    unsupported: list[Unsupported] = field(default_factory=list)
    passes: dict[str, int] = field(default_factory=dict)
    stop_reason: str = STOP_DONE
    phases: dict[str, float] = field(default_factory=dict)
    cost_before_ns: float = 0.0
    cost_after_ns: float = 0.0
    nodes_before: int = 0
    nodes_after: int = 0
    chains_asked: int = 0  # chain starts asked about: costly steps, and neutral ones a paying step would destroy
    regions_run: int = 0  # fallback runs on regions it made for them (the rest were remembered)
    blocks: int = 0  # blocks optimized one by one (see .blocks); 0: the graph is one block
    block_kinds: int = 0  # distinct blocks among them (each optimized once)

    @property
    def commits(self) -> dict[str, int]:
        return {name: s.commits for name, s in self.rules.items() if s.commits}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class FallbackResult:
    """The optimized graph; where each of its nodes comes from, as the tables of the same names in
    :class:`~rlx_egraph.engines.egglog.decode.Decoded`: ``built_by``, the rules that built it or unioned a value into it
    (empty: an untouched input node), and ``originals``, the input-graph node ids of the same value (what parity
    compares); its fusions and the run's statistics."""

    graph: Graph
    built_by: dict[int, tuple[str, ...]]  # every node of ``graph``
    originals: dict[int, list[int]]  # every node of ``graph``
    fusions: list[Fusion]  # the nodes that are not in the input graph
    stats: FallbackStats
    relied_on: dict[int, tuple[str, ...]] = field(default_factory=dict)  # node -> writers of the helper rows read


def load(ruleset: RuleSet | Any = None) -> CompiledRules:
    """Compile the rules for the fallback; rule forms it cannot apply are listed (and logged) by name."""
    compiled = compile_rules(load_rules(ruleset))
    for p in compiled.patterns:
        try:
            compiled.plans[p.name] = plan_matcher(p, compiled.tables)
        except CompileError as exc:
            if all(u.rule != p.base for u in compiled.unsupported):
                compiled.unsupported.append(Unsupported(p.base, p.location, str(exc)))
    compiled.patterns = [p for p in compiled.patterns if p.name in compiled.plans]
    _log_unsupported(compiled)
    return compiled


def _log_unsupported(compiled: CompiledRules) -> None:
    for u in compiled.unsupported:
        log.warning("the fallback engine cannot apply rule %s", u)


# The rules :func:`run` compiled for the last few RuleSet objects (a RuleSet never changes: its operations return
# new ones), each kept with its RuleSet so that its id is not reused meanwhile.
_COMPILED: dict[int, tuple[RuleSet, CompiledRules]] = {}
_COMPILED_AT_MOST = 8


def _compiled(ruleset: RuleSet) -> CompiledRules:
    """:func:`load` of ``ruleset``, compiled once per RuleSet object; the rules it cannot apply are logged on every
    call, as when it is compiled."""
    known = _COMPILED.get(id(ruleset))
    if known is not None and known[0] is ruleset:
        _log_unsupported(known[1])
        return known[1]
    compiled = load(ruleset)
    if len(_COMPILED) >= _COMPILED_AT_MOST:
        del _COMPILED[next(iter(_COMPILED))]
    _COMPILED[id(ruleset)] = (ruleset, compiled)
    return compiled


def run(graph: Graph, ruleset: RuleSet | Any = None, target: str | Target = "cpu",
        limits: FallbackLimits = FallbackLimits(), attention_block_max_tokens: int = 64,
        deadline: Deadline | None = None) -> FallbackResult:
    """Optimize ``graph`` with the fallback engine (``graph`` itself is never changed).

    ``deadline``: the run's end (default: ``limits.max_seconds`` from now), checked inside every pass (before
    each root matched and each plan committed, and by the lookahead's regions): past it the engine stops
    where it is, with a valid graph, and says ``time limit``."""
    start = time.perf_counter()
    deadline = Deadline(limits.max_seconds, start) if deadline is None else deadline
    compiled = ruleset if isinstance(ruleset, CompiledRules) else _compiled(load_rules(ruleset))
    tgt = get_target(target)

    # Engines reopened on each region (compiling the rules takes longer): one for the blocks (stage None), which
    # asks the lookahead too, as the whole graph does, and one for the lookahead's questions.
    regions: dict[bool, _Engine] = {}
    lookahead: Lookahead | None = None  # (the closure's cell: set below, emptied at the end so that no cycle is left)

    def optimized(region: Graph, levels: tuple[float, ...], stage: str | None, step: _Plan | None,
                  how: str, kept: frozenset[int]) -> RegionRun:
        block = stage is None
        if block not in regions:
            regions[block] = _Engine(region, compiled, tgt, limits, attention_block_max_tokens,
                                     lookahead if block else None, deadline)
        return regions[block].run_region(region, levels, stage, step, how, kept)

    with gc_paused():
        lookahead = Lookahead(optimized, matched_names(compiled.patterns))
        engine = _Engine(graph, compiled, tgt, limits, attention_block_max_tokens, lookahead, deadline)
        engine.stats.phases["load"] = time.perf_counter() - start
        engine.replay()
        engine.optimize(STAGES)
        result = engine.result(graph)
        # Freed (by reference counts) while the collector is still paused: its first pass after the pause
        # would otherwise scan the run's millions of objects just before they go.
        del engine
        regions.clear()
        lookahead = None
    return result


# --- plans -----------------------------------------------------------------------------------


@dataclass
class _Plan:
    matcher: Matcher
    root: Any
    new: dict[int, Node]  # provisional id -> checked node
    unions: list[tuple[int, int]]  # (replaced node, replacement: live or provisional id)
    writes: list[tuple[str, tuple, Any]]  # helper-table writes on commit
    delta: float
    found: tuple  # the match
    dead: set[int]  # live nodes the plan leaves dead
    forms: list[tuple[int, Node]] = field(default_factory=list)  # (live node, a new form of it)
    relied: tuple[str, ...] = ()  # the rules that wrote the helper rows the match read
    watch: set[int] = field(default_factory=set)  # any change to these (inputs, readers) makes it stale
    uses: set[int] = field(default_factory=set)  # these must stay alive
    destroys: set[int] = field(default_factory=set)  # nodes the plan replaces or leaves dead
    chained: bool = False  # a step of the chain a lookahead follows
    chain: Chain | None = None  # the region's result this plan stands for (see transplant)

    def settle(self, nodes: Mapping[int, Node]) -> _Plan:
        """Fill the sets commit needs (only for plans that pay).  A node read by a new node
        cannot die with the plan, so only its life matters; the inspected nodes, the
        replaced and dying ones and what they read can change the match or its gain."""
        self.destroys = self.dead | {old for old, _ in self.unions}
        kept = {i for n in self.new.values() for i in n.inputs}
        watch = {self.found[s] for s in self.matcher.shape_slots} | self.destroys
        for d in self.destroys:
            watch.update(nodes[d].inputs)
        if self.chain is not None:  # a transplant rewrites its whole region
            watch.update(self.chain.back.values())
        watch -= kept
        self.uses = {v for s in self.matcher.node_slots if isinstance(v := self.found[s], int)} | kept
        self.watch = {n for n in watch if n in nodes and nodes[n].kind is not Kind.LEAF}
        self.uses |= watch - self.watch
        return self


class _Engine:
    def __init__(self, graph: Graph, compiled: CompiledRules, target: Target, limits: FallbackLimits,
                 attention_block_max_tokens: int, lookahead: Lookahead | None = None,
                 deadline: Deadline | None = None) -> None:
        self.target, self.limits, self.lookahead, self.compiled = target, limits, lookahead, compiled
        # the whole run's end, shared by the lookahead's region engines
        self.deadline = Deadline(limits.max_seconds) if deadline is None else deadline
        self.rw = GraphRewriter(graph)
        self.param_order: dict[int, int] = {}
        self.facts = Facts(self.rw, compiled.tables, self.param_order, attention_block_max_tokens, compiled.tracked)
        self.nodes = self.rw.nodes_by_id
        self.prices = NodePrices(target)
        self.checks: dict[tuple, list] = {}  # see checked()
        self.chain_rule = ""  # in a lookahead's region: the rule of the chain's first step
        self.banned: set[int] = set()  # nodes the rules of this stage must not replace (see Lookahead.never)
        self.matchers: dict[str, list[Matcher]] = {stage: [] for stage in STAGES}
        for p in compiled.patterns:
            self.matchers[p.stage].append(compile_matcher(p, self.facts, compiled.plans.get(p.name)))
        self.programs = {m.pattern.name: _compile_actions(m, self.facts) for ms in self.matchers.values()
                         for m in ms}
        # per pattern: the helper-relation rows its query reads (see relied)
        self.rows_of = {m.pattern.name: _compile_reads(m, self.facts) for ms in self.matchers.values() for m in ms}
        self.fact_groups = {stage: _fact_order([m for m in ms if m.pattern.facts_only])
                            for stage, ms in self.matchers.items()}
        # per stage: the ops the rules of the stages after it match (a step that makes one may open a later match),
        # and the tables they read
        later = {stage: [p for p in compiled.patterns if STAGES.index(p.stage) > k] for k, stage in enumerate(STAGES)}
        self.later_ops = {stage: frozenset(atom.term.op for p in rules for atom in p.query
                                           if isinstance(atom, NodePattern)) for stage, rules in later.items()}
        self.later_tables = {stage: frozenset(t for p in rules for t in p.tables_read)
                             for stage, rules in later.items()}
        self.start(graph)

    def start(self, graph: Graph) -> None:
        """Per-graph state, fresh (the rewriter is open on ``graph``)."""
        params = (n.id for n in graph.nodes if n.op == "Param")
        self.param_order.clear()
        self.param_order.update((nid, k) for k, nid in enumerate(params))
        self.stats = FallbackStats(rules={p.base: RuleStats() for p in self.compiled.patterns},
                                   unsupported=list(self.compiled.unsupported), nodes_before=len(graph))
        self.costs: dict[int, tuple[Node, float]] = {}
        self.rules_of: dict[int, list[str]] = {}
        self.relied_of: dict[int, tuple[str, ...]] = {}  # node -> the rules that wrote the helper rows its rules read
        self.chain: set[int] | None = None  # in a lookahead's region: the nodes of the chain being followed
        self.alone = False  # in such a region: only the chain's steps are taken
        self.stage = STAGES[0]
        self.stats.cost_before_ns = self.dag_ns()

    def reopen(self, graph: Graph, levels: Sequence[float] | None = None) -> None:
        """Start over on ``graph`` with the rules compiled for this engine (their tables are reused); ``levels``:
        see :meth:`GraphRewriter.reopen`."""
        self.rw.reopen(graph, levels)
        self.facts.clear()
        self.start(graph)

    def run_region(self, region: Graph, levels: Sequence[float], stage: str | None, step: _Plan | None,
                   how: str = FOLLOW, kept: frozenset[int] = frozenset()) -> RegionRun:
        """A lookahead's run: ``region`` optimized from ``stage`` on, with ``step`` (in the region's ids) taken
        ``how`` (see :data:`.FOLLOW`) and ``kept`` kept from the rules of ``stage``; stage None: a block, optimized
        as a whole run would."""
        self.reopen(region, levels)
        self.banned = set(kept)
        if stage is None:
            self.optimize(STAGES)
        else:
            later = STAGES.index(stage)
            for earlier in STAGES[:later + 1]:  # the helper rows the whole graph has by now
                self.derive(self.fact_groups[earlier])
            if how == NEVER:
                self.banned |= {old for old, _ in step.unions}
                self.chain = step.dead | self.banned
            elif step is not None:
                self.rw.touched, first = set(), self.rw.next_id
                self.apply(step)
                changed, self.rw.touched = self.rw.touched, set()
                self.forget(changed)
                self.chain = {n for n in changed if n >= first and n in self.nodes}
                self.chain_rule = step.matcher.pattern.base
                self.alone = how == ALONE
            self.optimize(STAGES[later:])
        holders = {n.id: h for n in region.nodes if (h := self.rw.find(n.id)) in self.nodes}
        run = RegionRun(self.stats.cost_before_ns, self.dag_ns(), self.rw.finish(),
                        {n: tuple(r) for n, r in self.rules_of.items()}, holders,
                        {r: dataclasses.replace(s, rejected=dict(s.rejected)) for r, s in self.stats.rules.items()
                         if s != RuleStats()},  # copies: an alone run goes on
                        self.stats.stop_reason, dict(self.relied_of),
                        {n: tuple(forms.values()) for n, forms in self.facts.forms.items()},
                        tuple(self.facts.export()), dict(self.param_order))
        if not self.alone:
            return run
        self.chain, self.alone = None, False  # then every step that pays, from the chain's own steps
        self.optimize(STAGES[STAGES.index(stage):])
        return dataclasses.replace(run, rest_ns=self.dag_ns())

    # --- the loop ----------------------------------------------------------------------

    def replay(self) -> None:
        """Optimize the graph block by block (docs/engines.md, Blocks; the lookahead remembers each kind's run), unless
        no two blocks look alike (the same ops and shapes in order)."""
        pieces = blocks(self.rw) if self.lookahead is not None else []
        nodes = self.nodes
        looks: set[tuple] = set()
        for block in pieces:  # up to the first block that looks like one before
            look = tuple([(nodes[n].op, nodes[n].shape) for n in block])
            if look in looks:
                break
            looks.add(look)
        else:  # no two blocks alike (nor one block alone): nothing to replay
            return
        t0 = time.perf_counter()
        margin = CHAIN_EPS * self.stats.cost_before_ns
        for block in pieces:
            if self.out_of_time():
                break
            alive = {n for n in block if n in nodes}  # (a block before may have taken a projection of its tuple)
            region, _, back = cut_out(self.rw, self.param_order, alive, self.lookahead.names)
            run = self.lookahead.run(region, None, None)
            if run.stop_reason != STOP_DONE and self.stats.stop_reason == STOP_DONE:
                self.stats.stop_reason = run.stop_reason
            transplanted = run.cost_ns < run.before_ns - margin
            if transplanted:
                made = self.transplant(run, back)
                self.carry_rows(run, made, back)
            for rule, stats in run.rules.items():  # its kind's stats, once per block of that kind
                mine = self.stats.rules[rule]
                mine.matches += stats.matches
                for reason, rejected in stats.rejected.items():
                    mine.reject(reason, rejected)
                if transplanted:
                    mine.commits += stats.commits
                    mine.chain_starts += stats.chain_starts
            self.stats.blocks += 1
        self.stats.phases["replay"] = time.perf_counter() - t0

    def out_of_time(self) -> bool:
        """Whether the run's deadline has passed (then the stop reason says so)."""
        if self.deadline.expired():
            self.stats.stop_reason = STOP_TIME
            return True
        return False

    def optimize(self, stages: Sequence[str]) -> None:
        """Run ``stages`` in order, each to its fixpoint."""
        for stage in stages:
            self.stage = stage
            matchers = self.matchers[stage]
            if not matchers:
                continue
            t0 = time.perf_counter()
            derive = self.fact_groups[stage]
            rewrites = [m for m in matchers if not m.pattern.facts_only]
            passes = 0
            while passes < self.limits.max_iterations and not self.out_of_time():
                passes += 1
                self.derive(derive)
                entries = self.collect(rewrites)
                forms = [e for e in entries if e[-1].forms]
                if not (forms and self.commit(forms)) and not self.commit(entries):
                    break
            else:  # out of passes (or of time: out_of_time says so)
                if passes == self.limits.max_iterations:
                    self.stats.stop_reason = STOP_ITERATIONS
            self.stats.passes[stage] = self.stats.passes.get(stage, 0) + passes
            self.banned.clear()
            self.stats.phases[stage] = self.stats.phases.get(stage, 0.0) + time.perf_counter() - t0
            if self.stats.stop_reason == STOP_TIME:
                break

    def matches(self, matcher: Matcher, root: Any) -> list[tuple]:
        found = matcher.run(root)
        self.stats.rules[matcher.pattern.base].matches += len(found)
        return found

    def derive(self, groups: list[list[Matcher]]) -> None:
        """Run the fact rules, each group (tables that feed each other) to its fixpoint."""
        for group in groups:
            recursive = len(group) > 1 or bool(group[0].pattern.tables_read & group[0].pattern.tables_written)
            for _ in range(self.limits.max_iterations):
                self.facts.changed = False
                if self.out_of_time():  # the rows so far stay: a rule reads only rows that hold
                    return
                for m in group:
                    for root in m.roots():
                        for env in self.matches(m, root):
                            self.write_facts(m.pattern, list(env))
                if not (recursive and self.facts.changed):
                    break

    def collect(self, matchers: list[Matcher]) -> list[tuple[float, float, int, Any, _Plan]]:
        """The best plan of each rule (as written: its operand orders are one rule) at each root, most gain first; of
        equal gains, the root nearest the inputs (by level, which a region cut out of the graph keeps: a block
        decides as the whole graph does), then the rule first in file order."""
        best: dict[tuple[str, Any], tuple[float, float, int, Any, _Plan]] = {}
        for k, m in enumerate(matchers):
            for root in m.roots():
                if self.out_of_time():  # what is collected so far is committed (each commit checks again)
                    return sorted(best.values(), key=lambda e: e[:4])
                plan = self.best_plan(m, root)
                key = (m.pattern.base, root)
                if plan is not None and (key not in best or plan.delta < best[key][-1].delta):
                    level = self.rw.level(root) if isinstance(root, int) else 0.0
                    best[key] = (round(plan.delta, 6), level, k, root, plan)  # (gains equal to the last digits tie)
        return self.contested(sorted(best.values(), key=lambda e: e[:4]))

    def contested(self, entries: list[tuple[float, float, int, Any, _Plan]]
                  ) -> list[tuple[float, float, int, Any, _Plan]]:
        """``entries`` with each paying plan that the lookahead says beats its rival (a plan before it that would
        destroy it) moved first, by itself (docs/engines.md, Lookahead, says which plans are asked)."""
        if self.chain is not None:  # in a lookahead's region: no questions
            return entries
        later = self.later_ops[self.stage]
        rivals: dict[int, _Plan] = {}  # node -> the first plan that destroys it
        moved = False
        for k, (_, level, rank, root, plan) in enumerate(entries):
            threatened = sorted((plan.watch | plan.uses) & rivals.keys())
            rival = rivals[threatened[0]] if threatened else None
            if plan.chain is None and rival is not None and not rival.destroys >= plan.destroys \
                    and any(n.op in later for n in plan.new.values()) \
                    and self.chain_start(dataclasses.replace(plan), rival) is not None:
                entries[k] = (-math.inf, level, rank, root, plan)  # the plan, not the copy asked: no transplant
                moved = True
            for n in plan.destroys:
                rivals.setdefault(n, plan)
        return sorted(entries, key=lambda e: e[:4]) if moved else entries

    def best_plan(self, matcher: Matcher, root: Any) -> _Plan | None:
        """The match at ``root`` that lowers the cost most, a cost-neutral or costly one worth the gain of the chain
        it starts (see :meth:`chain_start`); in a region that follows a chain alone, only the chain's steps."""
        stats = self.stats.rules[matcher.pattern.base]
        best: _Plan | None = None
        costly: list[_Plan] = []  # plans that cost more by themselves
        for env in self.matches(matcher, root):
            plan = self.plan(matcher, root, env)
            if isinstance(plan, str):
                stats.reject(plan)
            elif self.alone:
                if self.chain_start(plan) is not None and (best is None or plan.delta < best.delta):
                    best = plan
            elif plan.delta >= -EPS and not (plan.delta <= EPS and (plan.forms or self.shallower(plan))):
                costly.append(plan)
            elif best is None or plan.delta < best.delta:
                best = plan
        if best is None and costly:
            best = self.chain_start(min(costly, key=lambda p: p.delta))
            if best is not None:
                costly.remove(best)
        elif best is not None and best.delta > -EPS and not best.forms and self.chain is None:
            best = self.chain_start(best) or best  # a cost-neutral step: worth the chain it starts, if one pays
        elif best is not None and self.kept_for_later(best):
            stats.reject(BANNED)
            best = None
        for _ in costly:
            stats.reject(NO_GAIN)
        return best.settle(self.nodes) if best is not None else None

    def kept_for_later(self, plan: _Plan) -> bool:
        """Whether this stage keeps the nodes ``plan`` (a step that pays) replaces for a later stage's rule (see
        :meth:`.Lookahead.never`); then it does."""
        olds = {old for old, _ in plan.unions}
        if self.lookahead is None or not any(self.later_tables[self.stage] & self.facts.tables_naming(n)
                                             for n in plan.dead | olds) or not self.lookahead.never(self, plan):
            return False
        self.banned |= olds
        return True

    def chain_start(self, plan: _Plan, rival: _Plan | None = None) -> _Plan | None:
        """``plan`` with the gain of the chain it starts, if that chain pays (in a lookahead's region: ``plan``, if it
        is the chain's next step; see docs/engines.md, Lookahead).  Only for plans that replace nodes outright
        (each replaced node dies, and so does every matched node the new nodes do not read), make no forms and
        write no rows."""
        if (not plan.unions or plan.forms or plan.writes or not math.isfinite(plan.delta)
                or any(old not in plan.dead for old, _ in plan.unions)):
            return None
        inspected = {v for s in plan.matcher.node_slots if isinstance(v := plan.found[s], int)}
        if self.chain is not None:
            near = inspected | plan.dead
            if plan.matcher.pattern.base == self.chain_rule:  # the first step again, on a sibling
                near |= {i for n in near for r in self.rw.readers[n] for i in self.nodes[r].inputs}
            if self.chain.isdisjoint(near):
                return None
            plan.chained = True
            return plan
        read = {i for n in plan.new.values() for i in n.inputs}
        if self.lookahead is None or any(n not in plan.dead and self.nodes[n].kind is not Kind.LEAF
                                         and not any(self.reads(i, n, plan.new) for i in read) for n in inspected):
            return None  # the new nodes compute again a matched node that stays alive: a chain cannot undo that
        chain = self.lookahead.chain(self, plan, rival)
        if chain is None:
            return None
        plan.delta, plan.chain = chain.gain_ns, chain
        return plan

    def commit(self, entries: list[tuple[float, float, int, Any, _Plan]]) -> int:
        """Commit plans in order (see :meth:`collect`), each matched again at its root first when an earlier commit
        touched its nodes."""
        touched: set[int] = set()
        died: set[int] = set()
        self.rw.touched = set()
        done = 0
        for plan in (e[-1] for e in entries):
            if self.out_of_time():
                break
            if self.known_forms(plan.unions, plan.forms):  # an earlier plan of this batch added them
                continue
            if plan.watch & touched or plan.uses & died:  # an earlier commit changed what the plan relies on
                fresh = self.best_plan(plan.matcher, plan.root) if plan.matcher.alive(plan.root) else None
                if fresh is None:
                    continue
                plan = fresh
            first = self.rw.next_id  # the nodes this commit makes are numbered from here
            if plan.chain is not None:
                self.transplant(plan.chain.run, plan.chain.back)
                for rule, stats in plan.chain.run.rules.items():  # (replay counts a block's itself)
                    self.stats.rules[rule].commits += stats.commits
                self.stats.rules[plan.matcher.pattern.base].chain_starts += 1
            else:
                self.apply(plan)
            done += 1
            changed, self.rw.touched = self.rw.touched, set()
            if plan.chained and self.chain is not None:
                self.chain |= {n for n in changed if n >= first}
            touched |= changed
            died |= self.forget(changed)
        return done

    def forget(self, changed: set[int]) -> set[int]:
        """Move the helper rows and forms of the nodes a commit replaced to their replacements; the nodes among
        ``changed`` that died."""
        died = set()
        for nid in changed:
            if nid not in self.nodes:
                died.add(nid)
                if self.rw.find(nid) != nid:
                    self.facts.replaced(nid)
        return died

    # --- planning and applying ---------------------------------------------------------------

    def plan(self, matcher: Matcher, root: Any, found: tuple) -> _Plan | str:
        """The rewrite one match asks for, or why it cannot be made."""
        pattern, env = matcher.pattern, list(found)
        slots, rw, nodes = matcher.slots, self.rw, self.nodes
        new: dict[int, Node] = {}
        checks: dict[int, list] = {}  # new node -> its check's remembered outcome (see checked)
        unions: list[tuple[int, int]] = []
        writes: list[tuple[str, tuple, Any]] = []

        def lookup(i: int) -> Node | None:
            return new.get(i) or nodes.get(i)

        for kind, compiled in self.programs[pattern.name]:
            try:
                if kind == BUILD:
                    nid = rw.next_id + len(new)
                    op, attr_terms, input_terms, out = compiled
                    inputs = _inputs(op, input_terms, env, slots, pattern.base)
                    attrs = {name: _plain(ev(env)) for name, ev in attr_terms}
                    node, check = self.checked(nid, op, inputs, attrs, lookup)
                    same = rw.existing(node) if not any(i in new for i in node.inputs) else None
                    if same is None:
                        new[nid] = node
                        if check is not None:
                            checks[nid] = check
                    env[out] = nid if same is None else same
                elif kind == COMPUTE:
                    env[compiled[0]] = compiled[1](env)
                elif kind == UNION:
                    unions.append((env[compiled[0]], env[compiled[1]]))
                else:
                    table, args, value = _write(compiled, env)
                    if table in TYPE_TABLES and args[0] in new:
                        built = getattr(new[args[0]], table)
                        if built != value:
                            return f"ill-typed: the rule sets {table} {value} for a new {new[args[0]].op}, " \
                                   f"the op registry infers {built}"
                    elif table not in TYPE_TABLES:
                        writes.append((table, args, value))
            except GraphError as exc:
                return f"ill-typed: {exc}"
            except NoValue:
                return "an action has no value"
        oriented = self.orient(unions, new)
        if isinstance(oriented, str):
            return oriented
        merges, forms = oriented
        if self.known_forms(merges, forms):
            return KNOWN_FORM
        if not self.banned.isdisjoint(old for old, _ in merges):
            return BANNED
        for _, form in forms:
            del new[form.id]
        delta, dead = self.delta(new, merges, checks)
        if math.isnan(delta):  # replaces an op the target does not run by another one: no gain to speak of
            return NO_GAIN
        return _Plan(matcher, root, new, merges, writes, delta, found, dead, forms,
                     relied=self.relied(pattern.name, found))

    def checked(self, nid: int, op: str, inputs: list[int], attrs: dict[str, Any],
                lookup: Callable[[int], Node | None]) -> tuple[Node, list | None]:
        """:func:`check_node` of a planned node, its outcome remembered per (op, attributes, input
        ops and types): the checks are pure functions of these (leaves and failures are not remembered).
        Returns the node and that remembered outcome, ``[attrs, shape, dtype, parts, ns]`` (None when nothing is
        remembered); ``ns``, the node's cost, is a function of the same key, filled in by :meth:`delta` when first
        needed."""
        ins = [lookup(i) if type(i) is int else None for i in inputs]
        key: tuple | None = None
        if None not in ins and op not in LEAF_OPS:
            try:
                key = (op, tuple(attrs.items()), tuple([(n.op, n.shape, n.dtype, n.parts) for n in ins]))  # type: ignore[union-attr]
                hit = self.checks.get(key)
            except TypeError:  # unhashable attributes (arrays)
                key = hit = None
            if hit is not None:
                return Node(nid, op, tuple(inputs), dict(hit[0]), hit[1], hit[2], hit[3]), hit
        node = check_node(nid, op, inputs, attrs, lookup, self.rw.leaf_names)
        if key is None:
            return node, None
        hit = self.checks[key] = [dict(node.attrs), node.shape, node.dtype, node.parts, None]
        return node, hit

    def known_forms(self, merges: list[tuple[int, int]], forms: list[tuple[int, Node]]) -> bool:
        """Whether a rewrite only records forms its nodes already have."""
        return bool(forms) and not merges and all(self.facts.has_form(old, f) for old, f in forms)

    def shallower(self, plan: _Plan) -> bool:
        """Whether a plan of unchanged cost leaves the graph no larger and each replacement reads
        from further back than the node it replaces (narrow-narrow): a measure that only drops."""
        if not plan.unions or len(plan.new) > len(plan.dead):
            return False
        level, nodes = self.rw.level, self.nodes
        return all(self.reach(rep, plan.new) < max((level(i) for i in nodes[old].inputs), default=-math.inf)
                   for old, rep in plan.unions)

    def reach(self, nid: int, new: Mapping[int, Node]) -> float:
        """How far back node ``nid`` reads: a live node's level, a planned node's highest input's.  (A method, not
        a recursive closure: such a closure is a reference cycle, which kept each plan and the rewriter alive for
        the garbage collector.)"""
        node = new.get(nid)
        if node is None:
            return self.rw.level(nid)
        return max((self.reach(i, new) for i in node.inputs), default=-math.inf)

    def orient(self, unions: list[tuple[Any, Any]], new: Mapping[int, Node]
               ) -> tuple[list[tuple[int, int]], list[tuple[int, Node]]] | str:
        """Which node each union replaces, and by what, and the new forms of live nodes (a new
        node over live inputs that reads the node it is unioned with); a reason string when it cannot."""
        rw, nodes = self.rw, self.nodes
        merges: list[tuple[int, int]] = []
        forms: list[tuple[int, Node]] = []
        replaced: dict[int, int] = {}
        for a, b in unions:
            if a is ABSENT or b is ABSENT:
                return "a union with (NoInput)"
            if a == b:
                continue
            if a in new and b in new:
                return "a union of two new terms"
            if a in new or b in new:
                old, rep = (b, a) if a in new else (a, b)
            elif rw.depends_on(a, b):
                old, rep = a, b
            elif rw.depends_on(b, a):
                old, rep = b, a
            else:  # unrelated nodes: keep the lower one
                old, rep = (a, b) if (rw.level(a), a) > (rw.level(b), b) else (b, a)
            if replaced.get(old, rep) != rep:
                return f"two unions replace node {old}"
            was, now = nodes[old], new.get(rep) or nodes[rep]
            if (was.shape, was.dtype) != (now.shape, now.dtype):
                return f"ill-typed: a union of node {old} ({was.op}, {was.type}) with a {now.op} of type {now.type}"
            if rep in new and old in now.inputs and not any(i in new for i in now.inputs):
                forms.append((old, now))
                continue
            if self.reads(rep, old, new):
                return f"the new {now.op} would read node {old}, which it replaces (a cycle)"
            replaced[old] = rep
            merges.append((old, rep))
        if any(form.id in n.inputs for _, form in forms for n in new.values()) or any(
                rep == form.id for _, rep in merges for _, form in forms):
            return "a new node reads a form recorded for a live node"
        return merges, forms

    def reads(self, nid: int, old: int, new: Mapping[int, Node]) -> bool:
        """Whether ``nid`` (live, or new in a plan) reads node ``old``."""
        stack = [nid]
        while stack:
            n = stack.pop()
            if n in new:
                stack.extend(new[n].inputs)
            elif self.rw.depends_on(n, old):
                return True
        return False

    def delta(self, new: Mapping[int, Node], merges: list[tuple[int, int]],
              checks: Mapping[int, list]) -> tuple[float, set[int]]:
        """Predicted cost change of a plan, and the live nodes it leaves dead.  ``checks``: the new nodes' remembered
        checks (see :meth:`checked`), which remember their costs too."""
        use_count, nodes = self.rw.use_count, self.nodes
        extra: dict[int, int] = {}  # uses the plan adds to live nodes
        for n in new.values():
            for i in dict.fromkeys(n.inputs):
                if i not in new:
                    extra[i] = extra.get(i, 0) + 1
        olds = {old for old, _ in merges}
        for old, rep in merges:
            if rep not in new:
                extra[rep] = extra.get(rep, 0) + use_count(old)
        removed: dict[int, int] = {}  # uses the dying nodes take away
        dead = {old for old in olds if not extra.get(old, 0) and nodes[old].op != "Input"}
        stack = list(dead)
        while stack:
            for i in dict.fromkeys(nodes[stack.pop()].inputs):
                gone = removed[i] = removed.get(i, 0) + 1
                if i in dead or nodes[i].op == "Input":
                    continue
                if (0 if i in olds else use_count(i)) + extra.get(i, 0) == gone:
                    dead.add(i)
                    stack.append(i)
        lookup = (lambda i: new.get(i) or nodes[i]) if new else nodes.__getitem__
        created: list[float] = []
        for nid, n in new.items():
            check = checks.get(nid)
            if check is None:
                created.append(self.node_ns(n, lookup))
            else:  # a function of what the check's outcome is remembered by
                if check[4] is None:
                    check[4] = self.node_ns(n, lookup)
                created.append(check[4])
        return sum(created) - sum([self.cost(d) for d in dead]), dead  # sum: compensated, as everywhere costs are added

    def apply(self, plan: _Plan) -> None:
        """Make ``plan``: its new nodes (the types it checked: no re-check), unions, forms and helper rows."""
        rule = plan.matcher.pattern.base
        real: dict[int, int] = {}  # the plan's provisional ids -> live ids
        for nid, node in plan.new.items():
            inputs, first_new = tuple(real.get(i, i) for i in node.inputs), self.rw.next_id
            made = real[nid] = self.rw.insert(node.op, inputs, **node.attrs) if node.kind is Kind.LEAF else \
                self.rw.insert_checked(node, inputs)
            if made >= first_new:  # not a node the graph had
                self.credit(made, (rule,), plan.relied)
        for old, rep in plan.unions:
            self.rw.replace_all_uses(old, real.get(rep, rep))
            self.credit(real.get(rep, rep), (rule,), plan.relied, old)
        for old, form in plan.forms:
            self.add_form(old, form)
        for table, args, value in plan.writes:
            self.facts.set_moved(table, args, value, (rule, *plan.relied), lambda v: real.get(v, v))
        self.rw.eliminate_dead_code([old for old, _ in plan.unions])
        self.stats.rules[rule].commits += 1

    def add_form(self, nid: int, form: Node) -> None:
        self.facts.add_form(nid, form)
        self.rw.touched.update((nid, *self.rw.readers.get(nid, ())))  # their matches may now go through the form

    def credit(self, nid: int, rules: Sequence[str], relied: Sequence[str] = (), old: int | None = None) -> None:
        """Provenance: node ``nid`` holds its value by ``rules`` too, and, when it replaced node ``old``, by the rules
        that made ``old``; ``relied``: the writers of the helper rows they read (``old``'s are kept too)."""
        known = self.rules_of.setdefault(nid, [])
        known.extend(r for r in (*rules, *self.rules_of.get(old, ())) if r not in known)
        writers = (*self.relied_of.get(nid, ()), *relied, *self.relied_of.get(old, ()))
        if writers:
            self.relied_of[nid] = tuple(dict.fromkeys(writers))

    def transplant(self, run: RegionRun, back: Mapping[int, int]) -> dict[int, int]:
        """Replace the region a lookahead cut out (``back``: its ids to the live ones) by its optimized form ``run``
        (a chain's steps and all, or a block's; see :meth:`GraphRewriter.splice`), in the graph and in its
        provenance.  Returns the live id of each node of the region's result."""
        made, new, replaced = self.rw.splice(run.graph, back, run.holders)
        for nid in new:
            self.credit(made[nid], run.rules_of.get(nid, ()), run.relied_of.get(nid, ()))
        for old, rep, now in replaced:
            self.credit(rep, run.rules_of.get(now, ()), run.relied_of.get(now, ()), old)
        for nid, forms in run.forms.items():  # the forms the region's nodes gained
            for form in forms:
                if nid in made and all(i in made for i in form.inputs):
                    self.add_form(made[nid], dataclasses.replace(form, inputs=tuple(made[i] for i in form.inputs)))
        return made

    def carry_rows(self, run: RegionRun, made: Mapping[int, int], back: Mapping[int, int]) -> None:
        """Take in the helper rows a block's run derived, in the whole graph's node ids and param orders
        (docs/engines.md, Blocks); a row naming a node the block built and dropped again is left out."""
        orders = {k: self.param_order[back[p]] for p, k in run.param_order.items()}
        for table, args, value, writers in run.rows:
            columns = self.compiled.orders.get(table, ())
            try:
                self.facts.set_moved(table, tuple(orders[a] if c in columns else a for c, a in enumerate(args)),
                                     orders[value] if -1 in columns else value, writers,
                                     lambda v: made[v] if v in made else back[v])
            except KeyError:  # it names a node the block built and dropped again
                continue

    def write_facts(self, pattern: Rule, env: list) -> None:
        """Apply a facts rule's actions to one match."""
        writers = (pattern.base, *self.relied(pattern.name, env))
        try:
            for kind, compiled in self.programs[pattern.name]:
                if kind == COMPUTE:
                    env[compiled[0]] = compiled[1](env)
                else:
                    self.facts.set(*_write(compiled, env), writers)
        except NoValue:
            return

    def relied(self, name: str, env: Sequence[Any]) -> tuple[str, ...]:
        """The rules that wrote the helper-relation rows a match of pattern ``name`` read."""
        reads = self.rows_of[name]
        if not reads:
            return ()
        names: dict[str, None] = {}
        for table, args in reads:
            try:
                names.update(dict.fromkeys(self.facts.wrote(table, tuple(a(env) for a in args))))
            except NoValue:
                continue
        return tuple(names)

    # --- costs -----------------------------------------------------------------------------

    def node_ns(self, node: Node, lookup: Callable[[int], Node]) -> float:
        """:func:`enode_ns` of a node (see :meth:`NodePrices.graph_node_ns`)."""
        return self.prices.graph_node_ns(node, [lookup(i) for i in node.inputs])

    def cost(self, nid: int) -> float:
        """A live node's cost, remembered while the node record stays the same (not rewired)."""
        node = self.nodes[nid]
        known = self.costs.get(nid)
        if known is None or known[0] is not node:
            known = self.costs[nid] = (node, self.prices.graph_node_ns(node, [self.nodes[i] for i in node.inputs]))
        return known[1]

    def dag_ns(self) -> float:
        """Predicted ns of the live graph: node costs plus the outputs read back."""
        total = sum(self.cost(nid) for nid in self.nodes)
        readback = sum(self.nodes[o].type.nbytes for o in dict.fromkeys(self.rw.outputs))
        return total + readback / self.target.readback_bw if math.isfinite(total) else total

    # --- the result ---------------------------------------------------------------------------

    def result(self, graph: Graph) -> FallbackResult:
        t0 = time.perf_counter()
        self.stats.cost_after_ns = self.dag_ns()
        if self.lookahead is not None:
            self.stats.chains_asked = self.lookahead.asked
            self.stats.regions_run = sum(stage is not None for stage, *_ in self.lookahead.runs)
            self.stats.block_kinds = len(self.lookahead.runs) - self.stats.regions_run
        out = self.rw.finish()
        originals: dict[int, list[int]] = {n.id: [] for n in out.nodes}
        ids = list(graph.nodes_by_id)  # in graph order
        for nid, holder in zip(ids, self.rw.holders(ids), strict=True):
            if (same := originals.get(holder)) is not None:
                same.append(nid)
        names: dict[tuple[str, ...], tuple[str, ...]] = {}  # each distinct tuple of rules once, shared by its nodes
        built_by = dict.fromkeys(originals, ())  # untouched nodes (the rest are in rules_of)
        for nid, rules in self.rules_of.items():
            if nid in built_by:
                built_by[nid] = names.setdefault(key := tuple(rules), key)
        fusions = fold_projections(out, [Fusion(n.id, n.op, built_by[n.id], tuple(originals[n.id]))
                                         for n in out.nodes if n.id not in graph])
        self.stats.nodes_after = len(out)
        self.stats.phases["finish"] = time.perf_counter() - t0
        rank = {p.base: k for k, p in reversed(list(enumerate(self.compiled.patterns)))}  # rule-file order
        relied = {nid: tuple(sorted(names, key=lambda r: rank.get(r, len(rank))))
                  for nid, names in self.relied_of.items() if nid in built_by}
        return FallbackResult(out, built_by, originals, fusions, self.stats, relied)


def _compile_reads(matcher: Matcher, facts: Facts) -> list[tuple[str, list[Callable[[list], Any]]]]:
    """The helper-relation rows the matcher's query reads: per row its relation and its columns' evaluators over
    the match's slots."""
    return [(atom.table, [compile_term(a, matcher.slots, facts) for a in atom.args])
            for atom in matcher.pattern.query if isinstance(atom, Fact) and atom.value is None
            and atom.table in facts.writers]


BUILD, COMPUTE, UNION, WRITE = range(4)  # kinds of compiled actions


def _compile_actions(matcher: Matcher, facts: Facts) -> list[tuple[int, Any]]:
    """Each action of the matcher's (flat) rule, by kind, with its compiled parts (evaluators over the match's
    slots)."""
    slots = matcher.slots
    out: list[tuple[int, Any]] = []
    for action in matcher.pattern.actions:
        if isinstance(action, Let) and isinstance(term := action.term, OpTerm):
            args = list(zip(constructor_args(REGISTRY[term.op]), term.args, strict=True))
            out.append((BUILD, (term.op, [(arg.name, compile_term(t, slots, facts)) for arg, t in args
                                          if not arg.is_input],
                                [t for arg, t in args if arg.is_input], slots[action.var])))
        elif isinstance(action, Let):
            out.append((COMPUTE, (slots[action.var], compile_term(action.term, slots, facts))))
        elif isinstance(action, Union):
            out.append((UNION, (slots[action.left.name], slots[action.right.name])))  # type: ignore[union-attr]
        else:  # SetValue, Insert
            value = compile_term(action.value, slots, facts) if isinstance(action, SetValue) else None
            out.append((WRITE, (action.table, [compile_term(a, slots, facts) for a in action.args], value)))
    return out


def _write(compiled: tuple, env: list) -> tuple[str, tuple, Any]:
    table, args, value = compiled
    return table, tuple(f(env) for f in args), True if value is None else value(env)


def _inputs(op: str, terms: list[Term], env: list, slots: Mapping[str, int], rule: str) -> list[int]:
    """The inputs of a new ``op`` node, from its flat input terms."""
    inputs: list[int] = []
    absent = False
    for s in terms:
        if isinstance(s, TensorList):
            values = [env[slots[i.name]] for i in s.items]  # type: ignore[union-attr]
            values += list(env[slots[s.rest.name]] if isinstance(s.rest, Var) else ())
        else:
            values = [ABSENT if isinstance(s, Absent) else env[slots[s.name]]]  # type: ignore[union-attr]
        for v in values:
            if v is ABSENT:
                absent = True
            elif absent:
                raise GraphError(f"rule {rule}: a {op} input follows an absent (NoInput) one")
            else:
                inputs.append(v)
    return inputs


def _plain(value: Any) -> Any:
    return value.array if isinstance(value, ArrayValue) else value


def _fact_order(matchers: list[Matcher]) -> list[list[Matcher]]:
    """Fact rules grouped so that a group only reads tables earlier groups (or itself) write: the strongly
    connected components of 'writes a table the other reads', writers first (a rule that feeds another reaches
    more rules than it, so ordering by how many a rule reaches is a topological order)."""
    reach: list[set[int]] = []  # per rule: itself and the rules it feeds, directly or not
    for k in range(len(matchers)):
        seen, todo = {k}, [k]
        while todo:
            written = matchers[todo.pop()].pattern.tables_written
            more = [j for j, o in enumerate(matchers) if j not in seen and written & o.pattern.tables_read]
            seen.update(more)
            todo += more
        reach.append(seen)
    component = [min(j for j in reach[k] if k in reach[j]) for k in range(len(matchers))]
    firsts = sorted(set(component), key=lambda c: (-len(reach[c]), c))
    return [[m for m, c in zip(matchers, component, strict=True) if c == first] for first in firsts]


__all__ = ["FallbackLimits", "FallbackResult", "FallbackStats", "RuleStats", "load", "run"]
