"""The fallback engine: the rules applied greedily on the graph, each rewrite decided by cost.

The saturation stages run in order, each to its fixpoint.  A pass of a stage

1. derives the helper facts: the rules that only fill tables run until they
   add no row (after the stage's first pass, only near what changed);
2. matches every rewrite rule at the nodes of its root op and, per root and
   rule (its operand orders are one rule), plans the best match: the right
   side's new nodes (built and checked by the op registry, reusing identical
   live nodes), the uses they replace, and the change of the graph's predicted
   cost, which is the new nodes' cost minus the cost of the nodes that die (a
   node another reader still needs stays alive and paid for);
3. commits the plans that lower the cost, most gain first; a plan whose nodes
   an earlier commit touched is matched again at its root first.

Passes repeat until none commits (or a limit); after the first pass of a
stage only the roots near what the last pass changed are matched.  Two kinds of
cost-neutral steps are committed, because chains of rules start with them: a
union of a node with a new term that reads it (``w = ConcatParams([w])``)
records a *form* of the node (see :mod:`.facts`) that later steps match; and a
rewrite that keeps the cost, does not grow the graph and reads from further
back than the node it replaces (``narrow-narrow``), a measure that only drops,
so passes still end.  The per-node cost is the one extraction minimises
(:func:`rlx_egraph.cost.enode.enode_ns`), so both engines decide with the same
cost function.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

from ...cost import Target, get_target
from ...cost.enode import EPS, enode_ns
from ...ir.graph import Graph, GraphError, Node, check_node
from ...ir.provenance import Fusion, fold_projections
from ...ir.registry import REGISTRY, Kind, ops_of_kind
from ...ir.rewrite import GraphRewriter, node_key
from ...rules import STAGES, NoValue, RuleSet, load_rules
from ..budget import Deadline, gc_paused
from .facts import Facts, compile_term
from .matcher import ArrayValue, Matcher, Near, compile_matcher, plan_matcher
from .pattern import (
    ABSENT,
    FACTS,
    Build,
    CompiledRules,
    CompileError,
    Compute,
    L,
    ListPat,
    SetValue,
    Union,
    Unsupported,
    V,
    compile_rules,
)

log = logging.getLogger(__name__)

STOP_DONE = "no rewrite lowers the cost"
STOP_ITERATIONS = "iteration limit"
STOP_TIME = "time limit"
NO_GAIN = "does not lower the cost"
KNOWN_FORM = "the node already has this form"
TYPE_TABLES = frozenset({"shape", "dtype"})  # tables the op registry already fills for every node
LEAF_OPS = ops_of_kind(Kind.LEAF)


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
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


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

    @property
    def commits(self) -> dict[str, int]:
        return {name: s.commits for name, s in self.rules.items() if s.commits}

    def to_dict(self) -> dict[str, Any]:
        return {
            "rules": {name: {"matches": s.matches, "commits": s.commits, "rejected": dict(s.rejected)}
                      for name, s in self.rules.items()},
            "unsupported": [{"rule": u.rule, "location": u.location, "reason": u.reason} for u in self.unsupported],
            "passes": dict(self.passes), "stop_reason": self.stop_reason, "phases": dict(self.phases),
            "cost_before_ns": self.cost_before_ns, "cost_after_ns": self.cost_after_ns,
            "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
        }


@dataclass
class FallbackResult:
    """The optimized graph; where each of its nodes comes from, as the tables of the same names in
    :class:`~rlx_egraph.engines.egglog.decode.Decoded`: ``built_by``, the rules that built it or unioned a value
    into it (empty: an untouched input node), and ``originals``, the input-graph node ids of the same value (what
    parity compares); its fusions and the run's statistics."""

    graph: Graph
    built_by: dict[int, tuple[str, ...]]  # every node of ``graph``
    originals: dict[int, list[int]]  # every node of ``graph``
    fusions: list[Fusion]  # the nodes that are not in the input graph
    stats: FallbackStats


def load(ruleset: RuleSet | Any = None) -> CompiledRules:
    """Compile the rules for the fallback; rule forms it cannot apply are listed (and logged) by name."""
    compiled = compile_rules(load_rules(ruleset))
    kept = []
    for p in compiled.patterns:
        try:
            compiled.plans[p.name] = plan_matcher(p, compiled.tables)
        except CompileError as exc:
            if all(u.rule != p.base for u in compiled.unsupported):
                compiled.unsupported.append(Unsupported(p.base, p.location, str(exc)))
            continue
        kept.append(p)
    compiled.patterns = kept
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
    each root matched and each plan committed): past it the engine stops where it is, with a valid graph, and
    says ``time limit``."""
    start = time.perf_counter()
    deadline = Deadline(limits.max_seconds, start) if deadline is None else deadline
    compiled = ruleset if isinstance(ruleset, CompiledRules) else _compiled(load_rules(ruleset))
    results = []
    banned: frozenset[tuple] = frozenset()
    with gc_paused():
        for eager in (False, True, True):
            engine = _Engine(graph, compiled, get_target(target), limits, attention_block_max_tokens, deadline, eager,
                             banned)
            engine.stats.phases["load"] = time.perf_counter() - start
            engine.optimize()
            results.append(engine.result(graph))
            dead_ends = frozenset(key for step, key in engine.costly.items() if step not in engine.paid)
            del engine  # freed while the collector is still paused (it would scan the run's objects just before)
            if results[0].stats.stop_reason == STOP_TIME or (eager and not dead_ends):
                break
            banned |= dead_ends
    return min(results, key=lambda r: r.stats.cost_after_ns)


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
    watch: set[int] = field(default_factory=set)  # any change to these (inputs, readers) makes it stale
    uses: set[int] = field(default_factory=set)  # these must stay alive
    enabling: bool = False  # does not pay by itself: taken by an eager run (see _Engine.enabling)

    def settle(self, nodes: Mapping[int, Node]) -> _Plan:
        """Fill the sets commit needs.  A node read by a new node cannot die with the plan, so only its life
        matters; the inspected nodes, the replaced and dying ones and what they read can change the match or its
        gain."""
        found = self.found
        destroys = self.dead | {old for old, _ in self.unions}
        kept = {i for n in self.new.values() for i in n.inputs}
        watch = {found[s] for s in self.matcher.shape_slots} | destroys
        for d in destroys:
            watch.update(nodes[d].inputs)
        watch -= kept
        self.uses = {v for s in self.matcher.node_slots if isinstance(v := found[s], int)} | kept
        self.watch = {n for n in watch if n in nodes and nodes[n].kind is not Kind.LEAF}
        self.uses |= watch - self.watch
        return self

    def stale(self, touched: set[int], died: set[int]) -> bool:
        return bool(self.watch & touched or self.uses & died)


class _Engine:
    def __init__(self, graph: Graph, compiled: CompiledRules, target: Target, limits: FallbackLimits,
                 attention_block_max_tokens: int, deadline: Deadline, eager: bool = False,
                 banned: frozenset[tuple] = frozenset()) -> None:
        self.target, self.limits, self.compiled, self.deadline = target, limits, compiled, deadline
        self.eager, self.banned = eager, banned
        self.removed: set[tuple | None] = set()  # the terms eager steps removed
        self.step_of: dict[int, int] = {}  # node -> the eager step (or the step continuing a chain) that made it
        self.after: list[set[int]] = []  # per such step: the steps whose nodes it matched
        self.paid: set[int] = set()  # steps a paying step continued
        self.costly: dict[int, tuple] = {}  # eager steps that cost more by themselves -> their ban_key
        self.rw = GraphRewriter(graph)
        self.facts = Facts(self.rw, compiled.tables, attention_block_max_tokens)
        self.facts.reset([n.id for n in graph.nodes if n.op == "Param"])
        self.nodes = self.rw.nodes_by_id
        self.stats = FallbackStats(unsupported=list(compiled.unsupported), nodes_before=len(graph))
        for p in compiled.patterns:
            self.stats.rules.setdefault(p.base, RuleStats())
        self.costs: dict[int, tuple[Node, float]] = {}
        self.signatures: dict[int, tuple[str, ...]] = {}  # node -> its inputs' ops (with its forms')
        self.rules_of: dict[int, list[str]] = {}
        self.matchers: dict[str, list[Matcher]] = {stage: [] for stage in STAGES}
        for p in compiled.patterns:
            self.matchers[p.stage].append(compile_matcher(p, self.facts, compiled.plans.get(p.name)))
        self.programs = {m.pattern.name: _compile_actions(m, self.facts) for ms in self.matchers.values()
                         for m in ms}
        self.signature_costs: dict[tuple, float] = {}
        self.checks: dict[tuple, list] = {}  # see checked()
        self.stats.cost_before_ns = self.dag_ns()

    # --- the loop ----------------------------------------------------------------------

    def out_of_time(self) -> bool:
        """Whether the run's deadline has passed (then the stop reason says so)."""
        if self.deadline.expired():
            self.stats.stop_reason = STOP_TIME
            return True
        return False

    def optimize(self) -> None:
        """Run the stages in order, each to its fixpoint: the first pass at every root, the next ones near what
        the pass before changed."""
        for stage in STAGES:
            matchers = self.matchers[stage]
            if not matchers:
                continue
            t0 = time.perf_counter()
            facts = [m for m in matchers if m.pattern.kind == FACTS]
            rewrites = [m for m in matchers if m.pattern.kind != FACTS]
            passes = 0
            near: set[int] | None = None  # None: match at every root; else only near these nodes
            while True:
                if passes >= self.limits.max_iterations:
                    self.stats.stop_reason = STOP_ITERATIONS
                    break
                if self.out_of_time():
                    break
                passes += 1
                self.facts.fresh = set()
                self.derive(facts, near)
                if near is not None:
                    near |= self.facts.fresh
                done, touched = self.commit(self.collect(rewrites, None if near is None else
                                                         Near.of(self.rw, near)))
                if not done:
                    break
                near = {t for t in touched if t in self.nodes and self.nodes[t].kind is not Kind.LEAF}
            self.stats.passes[stage] = passes
            self.stats.phases[stage] = time.perf_counter() - t0
            if self.stats.stop_reason == STOP_TIME:
                break

    def matches(self, matcher: Matcher, root: Any) -> list[tuple]:
        found = matcher.run(root)
        self.stats.rules[matcher.pattern.base].matches += len(found)
        return found

    def derive(self, matchers: list[Matcher], near: set[int] | None) -> None:
        """Run the fact rules, then again those that read a table the last round added rows to (only near those
        rows), until none adds a row; with ``near``, the first round only at roots near those nodes."""
        at = None if near is None else Near.of(self.rw, near)
        signed: dict[Any, tuple[list, list, set]] = {}  # see roots (rules only add rows: the graph stays)
        todo = matchers
        for _ in range(self.limits.max_iterations):
            self.facts.changed = set()
            before = set(self.facts.fresh)
            for m in todo:
                program = self.programs[m.pattern.name]
                for root in self.roots(m, at, signed):
                    if self.out_of_time():  # the rows so far stay: a rule reads only rows that hold
                        return
                    for env in self.matches(m, root):
                        self.write_facts(program, list(env))
            todo = [m for m in matchers if m.pattern.tables_read & self.facts.changed]
            if not todo:
                break
            at = Near.of(self.rw, self.facts.fresh - before)  # the next round: near the new rows

    def collect(self, matchers: list[Matcher], near: Near | None) -> list[_Plan]:
        """The best plan of each rule (as written: its operand orders are one rule) at each root, most gain
        first; of two that gain the same, the one rooted nearer the inputs."""
        best: dict[tuple[str, Any], tuple[float, int, Any, _Plan]] = {}
        signed: dict[Any, tuple[list, list, set]] = {}  # see roots
        for k, m in enumerate(matchers):
            for root in self.roots(m, near, signed):
                if self.out_of_time():  # what is collected so far is committed (each commit checks again)
                    break
                plan = self.best_plan(m, root)
                key = (m.pattern.base, root)
                if plan is not None and (key not in best or plan.delta < best[key][0]):
                    best[key] = (plan.delta, k, root, plan)
        level, eager = self.rw.level, self.eager
        return [e[3] for e in sorted(best.values(), key=lambda e: (
            eager and e[0] < -EPS, float(f"{e[0]:.9g}"), (-1 if eager else 1) * level(e[2]) if type(e[2]) is int else 0,
            *e[1:3]))]

    def roots(self, matcher: Matcher, near: Near | None, signed: dict[Any, tuple[list, list, set]]) -> list[Any]:
        """The matcher's candidate roots (see :meth:`Matcher.candidates`) whose inputs' ops fit it.  ``signed``:
        candidate lists with their roots' input ops, shared by the matchers of one root op while the graph does not
        change (every root of an op, or the roots near changes that the operand orders of a rule share)."""
        if matcher.root_op is None:
            return matcher.candidates(near)
        if not self.rw.has_op(matcher.root_op):
            return []
        if near is None:  # every root of the op
            key: Any = matcher.root_op
            known = signed.get(key)
            roots = matcher.roots() if known is None else known[0]
        else:
            roots = matcher.candidates(near)
            key = id(roots)  # the list stays alive in ``signed``
            known = signed.get(key)
        if known is None:
            ops = [self.input_ops(root) for root in roots]
            known = signed[key] = (roots, ops, set(ops))
        _, ops, distinct = known
        fitting = {o for o in distinct if matcher.fits(o)}  # few distinct signatures: test each once
        return list(compress(roots, map(fitting.__contains__, ops)))

    def input_ops(self, nid: int) -> tuple[str | frozenset[str], ...]:
        """The ops of a node's inputs (with their forms' ops, as a set, where they have forms)."""
        ops = self.signatures.get(nid)
        if ops is None:
            nodes, forms = self.nodes, self.facts.forms
            ops = self.signatures[nid] = tuple(
                frozenset((nodes[i].op, *(f.op for f in forms[i].values()))) if i in forms else nodes[i].op
                for i in nodes[nid].inputs)
        return ops

    def best_plan(self, matcher: Matcher, root: Any) -> _Plan | None:
        stats = self.stats.rules[matcher.pattern.base]
        best: _Plan | None = None
        for env in self.matches(matcher, root):
            plan = self.plan(matcher, root, env)
            if isinstance(plan, str):
                stats.reject(plan)
            elif plan.delta >= -EPS and not (plan.delta <= EPS and (plan.forms or self.shallower(plan))) \
                    and not self.enabling(plan):
                stats.reject(NO_GAIN)
            elif best is None or plan.delta < best.delta:
                best = plan
        return best.settle(self.nodes) if best is not None else None

    def enabling(self, plan: _Plan) -> bool:
        """In an eager run, whether a step that does not pay by itself is taken: it replaces its nodes outright
        (each dies) and builds no term that such a step removed (so that two of them never undo each other)."""
        plan.enabling = self.eager and bool(plan.unions) and not plan.forms and not plan.writes \
            and math.isfinite(plan.delta) and all(old in plan.dead for old, _ in plan.unions) \
            and self.removed.isdisjoint(map(node_key, plan.new.values())) and self.ban_key(plan) not in self.banned
        return plan.enabling

    def ban_key(self, plan: _Plan) -> tuple:
        """What names an eager step across runs: its rule and the terms it replaces."""
        return plan.matcher.pattern.base, tuple(self.rw.key(old) for old, _ in plan.unions)

    def follow(self, plan: _Plan, key: tuple | None) -> None:
        """Chains of eager steps: a step that matched nodes an eager step made continues that step's chain; a step
        that pays pays off every chain it continues."""
        nodes = {v for k in plan.matcher.node_slots if isinstance(v := plan.found[k], int)} | {
            old for old, _ in plan.unions}
        before = {self.step_of[n] for n in nodes if n in self.step_of}
        if plan.delta < -EPS:
            while before:
                step = before.pop()
                if step not in self.paid:
                    self.paid.add(step)
                    before |= self.after[step]
        elif plan.enabling or before:
            step = len(self.after)
            self.after.append(before)
            if key is not None and plan.delta > EPS:
                self.costly[step] = key
            self.step_of.update((n, step) for n in self.rw.touched if n in self.nodes)

    def commit(self, plans: list[_Plan]) -> tuple[int, set[int]]:
        """Commit plans, most gain first; a plan an earlier commit made stale is matched again at its root."""
        touched: set[int] = set()
        died: set[int] = set()
        self.rw.touched = set()
        done = 0
        for plan in plans:
            if self.out_of_time():
                break
            if self.known_forms(plan.unions, plan.forms):  # an earlier plan of this batch added them
                continue
            if plan.stale(touched, died):
                fresh = self.best_plan(plan.matcher, plan.root) if plan.matcher.alive(plan.root) else None
                if fresh is None:
                    continue
                plan = fresh
            key = self.ban_key(plan) if plan.enabling else None
            if plan.enabling:
                self.removed.update(self.rw.key(old) for old, _ in plan.unions)
            self.rw.touched = set()
            self.apply(plan)
            if self.eager:
                self.follow(plan, key)
            done += 1
            changed, self.rw.touched = self.rw.touched, set()
            touched |= changed
            for nid in changed:
                self.signatures.pop(nid, None)
                if nid not in self.nodes:
                    died.add(nid)
                    if self.rw.find(nid) != nid:
                        self.facts.replaced(nid)
        return done, touched

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

        for action, compiled in self.programs[pattern.name]:
            try:
                if isinstance(action, Build):
                    nid = rw.next_id + len(new)
                    attr_terms, input_slots = compiled
                    inputs = [env[k] for k in input_slots] if input_slots is not None else None
                    if inputs is None or ABSENT in inputs:
                        inputs = _inputs(action, env, slots, pattern.base)
                    attrs = {name: _plain(ev(env)) for name, ev in attr_terms}
                    node, check = self.checked(nid, action.op, inputs, attrs, lookup)
                    same = rw.existing(node) if not any(i in new for i in node.inputs) else None
                    if same is None:
                        new[nid] = node
                        if check is not None:
                            checks[nid] = check
                    env[slots[action.out]] = nid if same is None else same
                elif isinstance(action, Compute):
                    env[compiled[0]] = compiled[1](env)
                elif isinstance(action, Union):
                    unions.append((env[slots[action.a]], env[slots[action.b]]))
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
        for _, form in forms:
            del new[form.id]
        delta, dead = self.delta(new, merges, checks)
        if math.isnan(delta):  # replaces an op the target does not run by another one: no gain to speak of
            return NO_GAIN
        return _Plan(matcher, root, new, merges, writes, delta, found, dead, forms)

    def checked(self, nid: int, op: str, inputs: list[int], attrs: dict[str, Any],
                lookup: Callable[[int], Node | None]) -> tuple[Node, list | None]:
        """:func:`check_node` of a planned node, its outcome remembered per (op, attributes, input ops and types):
        the checks are pure functions of these (leaves and failures are not remembered).  Returns the node and that
        remembered outcome, ``[attrs, shape, dtype, parts, ns]`` (None when nothing is remembered); ``ns``, the
        node's cost, is a function of the same key, filled in by :meth:`delta` when first needed."""
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
        """Whether a plan of unchanged cost leaves the graph no larger and each replacement reads from further back
        than the node it replaces (narrow-narrow): a measure that only drops."""
        if not plan.unions or len(plan.new) > len(plan.dead):
            return False
        level, nodes = self.rw.level, self.nodes
        return all(self.reach(rep, plan.new) < max((level(i) for i in nodes[old].inputs), default=-math.inf)
                   for old, rep in plan.unions)

    def reach(self, nid: int, new: Mapping[int, Node]) -> float:
        """How far back node ``nid`` reads: a live node's level, a planned node's highest input's."""
        node = new.get(nid)
        if node is None:
            return self.rw.level(nid)
        return max((self.reach(i, new) for i in node.inputs), default=-math.inf)

    def orient(self, unions: list[tuple[Any, Any]], new: Mapping[int, Node]
               ) -> tuple[list[tuple[int, int]], list[tuple[int, Node]]] | str:
        """Which node each union replaces, and by what, and the new forms of live nodes (a new node over live
        inputs that reads the node it is unioned with); a reason string when it cannot."""
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
        costs, cost = self.costs, self.cost
        freed = [known[1] if (known := costs.get(d)) is not None and known[0] is nodes[d] else cost(d) for d in dead]
        return sum(created) - sum(freed), dead  # sum: compensated, as everywhere costs are added

    def apply(self, plan: _Plan) -> None:
        rw = self.rw
        rules = (plan.matcher.pattern.base,)
        real: dict[int, int] = {}
        for nid, node in plan.new.items():  # the types the plan checked: no re-check
            first_new = rw.next_id
            made = real[nid] = rw.insert(node.op, tuple(real.get(i, i) for i in node.inputs), **node.attrs) \
                if node.kind is Kind.LEAF else rw.insert_checked(node, tuple(real.get(i, i) for i in node.inputs))
            if made >= first_new:
                self.rules_of[made] = list(rules)
        olds = []
        for old, rep in plan.unions:
            rep = real.get(rep, rep)
            rw.replace_all_uses(old, rep)
            known = self.rules_of.setdefault(rep, [])  # provenance: the rule, then how ``old`` was made
            known.extend(r for r in (*rules, *self.rules_of.get(old, ())) if r not in known)
            olds.append(old)
        for old, form in plan.forms:
            self.facts.add_form(old, form)
            rw.touched.update((old, *rw.readers.get(old, ())))  # their matches may now go through the form
        for table, args, value in plan.writes:
            decl = self.facts.decls[table]
            self.facts.set(table, tuple(_renamed(a, sort, real) for a, sort in zip(args, decl.inputs, strict=True)),
                           _renamed(value, decl.output, real))
        rw.eliminate_dead_code(olds)
        self.stats.rules[plan.matcher.pattern.base].commits += 1

    def write_facts(self, program: list[tuple[Any, Any]], env: list) -> None:
        """Apply a facts rule's actions to one match."""
        try:
            for action, compiled in program:
                if isinstance(action, Compute):
                    env[compiled[0]] = compiled[1](env)
                else:
                    self.facts.set(*_write(compiled, env))
        except NoValue:
            return

    # --- costs -----------------------------------------------------------------------------

    def node_ns(self, node: Node, lookup: Callable[[int], Node]) -> float:
        """:func:`enode_ns` of a node, remembered per (op, attributes, input and output types).  A leaf launches
        nothing, so its type alone decides (its name is not part of the key)."""
        if not node.inputs:
            key: tuple | None = (node.op, node.shape, node.dtype)
            cost = self.signature_costs.get(key)
            if cost is None:
                cost = self.signature_costs[key] = enode_ns(self.target, node.spec, node.attrs, [], node.type, False)
            return cost
        ins = [lookup(i) for i in node.inputs]
        reads_intermediate = not LEAF_OPS.issuperset([i.op for i in ins])
        key = (node.op, tuple(node.attrs.values()) if node.attrs else (), tuple([(i.shape, i.dtype) for i in ins]),
               node.shape, node.dtype, reads_intermediate)
        try:
            cost = self.signature_costs.get(key)
        except TypeError:  # unhashable attributes
            key, cost = None, None
        if cost is None:
            cost = enode_ns(self.target, node.spec, node.attrs, [i.type for i in ins], node.type, reads_intermediate)
            if key is not None:
                self.signature_costs[key] = cost
        return cost

    def cost(self, nid: int) -> float:
        """A live node's cost, remembered while the node record stays the same (not rewired)."""
        node = self.nodes[nid]
        known = self.costs.get(nid)
        if known is None or known[0] is not node:
            known = self.costs[nid] = (node, self.node_ns(node, self.nodes.__getitem__))
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
        return FallbackResult(out, built_by, originals, fusions, self.stats)


def _compile_actions(matcher: Matcher, facts: Facts) -> list[tuple[Any, Any]]:
    """Each action of the matcher's rule with its compiled parts (evaluators over the match's slots)."""
    slots = matcher.slots
    out: list[tuple[Any, Any]] = []
    for action in matcher.pattern.actions:
        compiled: Any = None
        if isinstance(action, Build):
            names = [a.name for a in REGISTRY[action.op].attrs]
            # the attributes' evaluators, and the inputs' slots when each input is one variable (most rules)
            compiled = ([(n, compile_term(t, slots, facts)) for n, t in zip(names, action.attrs, strict=True)],
                        tuple(slots[s.name] for s in action.inputs) if all(isinstance(s, V) for s in action.inputs)
                        else None)
        elif isinstance(action, Compute):
            compiled = (slots[action.out], compile_term(action.expr, slots, facts))
        elif isinstance(action, SetValue):
            value = None if action.value is None else compile_term(action.value, slots, facts)
            compiled = (action.table, [compile_term(a, slots, facts) for a in action.args], value)
        out.append((action, compiled))
    return out


def _write(compiled: tuple, env: list) -> tuple[str, tuple, Any]:
    table, args, value = compiled
    return table, tuple(f(env) for f in args), None if value is None else value(env)


def _inputs(action: Build, env: list, slots: Mapping[str, int], rule: str) -> list[int]:
    inputs: list[int] = []
    absent = False
    for s in action.inputs:
        values: list[Any]
        if isinstance(s, V):
            values = [env[slots[s.name]]]
        elif isinstance(s, L):
            values = [ABSENT]
        else:
            assert isinstance(s, ListPat)
            values = [env[slots[i]] for i in s.items] + list(env[slots[s.rest]] if s.rest else ())
        for v in values:
            if v is ABSENT:
                absent = True
            elif absent:
                raise GraphError(f"rule {rule}: a {action.op} input follows an absent (NoInput) one")
            else:
                inputs.append(v)
    return inputs


def _renamed(value: Any, sort: str | None, real: Mapping[int, int]) -> Any:
    """A planned value with the plan's provisional node ids replaced by the inserted ones."""
    if sort == "Op":
        return real.get(value, value)
    if sort == "TensorList":
        return tuple(real.get(v, v) for v in value)
    return value


def _plain(value: Any) -> Any:
    return value.array if isinstance(value, ArrayValue) else value


__all__ = ["FallbackLimits", "FallbackResult", "FallbackStats", "RuleStats", "load", "run"]
