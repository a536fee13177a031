"""Lookahead: the fallback run on the region around a step, to see whether the chain the step starts pays (the
questions are described in docs/engines.md); the whole graph then takes the region's result (the *transplant*).

A region keeps every value the rest of the graph reads as an output, and the non-leaf nodes its nodes read as
nodes of their own over fresh inputs, so each node is priced as in the whole graph; its nodes keep the whole graph's
levels (as ranks).  Regions are numbered canonically (Inputs and Params renamed by position, but for the names a
rule matches), so regions of the same structure (the layers of a model) are optimized once.  The blocks
(:mod:`.blocks`) are regions too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ...ir.graph import Graph, Node
from ...ir.registry import Kind
from ...ir.rewrite import GraphRewriter, node_key
from ...rules import Lit, Pattern, Rule

if TYPE_CHECKING:
    from .engine import RuleStats, _Engine, _Plan

# A chain (or a block's run) pays when it lowers the cost by more than this share of the input graph's (float sums
# differ in the last digits between the region as it is and with the step applied).
CHAIN_EPS = 1e-9
DEPTH = 5  # levels of readers below the replaced nodes the region takes in (MPT reads its scores 5 down)
HEIGHT = 4  # levels of inputs above those (an attention's packed projection is 4 above its matmuls)
NAMED_LEAVES = frozenset({"Input", "Param"})
# How a region runs with a step: FOLLOW, the step applied first and its chain followed (each next step that matches or
# replaces a node the chain made, or applies the first step's rule to a node sharing a reader with one); ALONE, only
# the chain's steps, and ``rest_ns`` is the cost once every paying step has followed them; NEVER, the nodes the step
# replaces are kept from the stage's rules, and the steps that match what it would destroy are followed as a chain.
FOLLOW, ALONE, NEVER = "follow", "alone", "never"


@dataclass(frozen=True)
class RegionRun:
    """A region after the fallback ran on it."""

    before_ns: float  # the region's cost as cut out
    cost_ns: float
    graph: Graph
    rules_of: Mapping[int, tuple[str, ...]]  # node of ``graph`` -> the rules that built it
    holders: Mapping[int, int]  # node as cut out -> the node of ``graph`` that holds its value
    rules: Mapping[str, RuleStats]  # rule -> its statistics on the region (the rules that did something)
    stop_reason: str  # why the fallback stopped on the region (a limit, or no rewrite pays)
    relied_of: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # node -> writers of helper rows read
    forms: Mapping[int, tuple[Node, ...]] = field(default_factory=dict)  # node of ``graph`` -> its forms
    rows: tuple[tuple[str, tuple, Any, tuple[str, ...]], ...] = ()  # its helper rows (see Facts.export)
    param_order: Mapping[int, int] = field(default_factory=dict)  # Param -> its param-order in the region
    rest_ns: float = math.inf  # a chain's own steps: the cost when every step that pays follows them


@dataclass(frozen=True)
class Chain:
    """A chain that pays: the region's result and how its ids map back to the whole graph's."""

    gain_ns: float
    run: RegionRun
    back: Mapping[int, int]  # region node (as cut out) -> the whole graph's node of the same value


class Lookahead:
    """Runs of the fallback on regions, remembered by the region's content (and the step applied)."""

    def __init__(self, optimized: Callable[[Graph, tuple[float, ...], str | None, _Plan | None, str, frozenset[int]],
                                           RegionRun],
                 names: frozenset[str] = frozenset()) -> None:
        self.optimized = optimized  # a region's run, as ``_Engine.run_region`` takes its arguments
        self.names = names  # names of leaves that rules match (see cut_out)
        self.runs: dict[tuple, RegionRun] = {}
        self.asked = 0  # chain starts asked about

    def chain(self, engine: _Engine, plan: _Plan, rival: _Plan | None = None) -> Chain | None:
        """The chain ``plan`` starts in ``engine``'s graph and stage, if it lowers the region's cost by more than the
        margin below the region run without it; with ``rival``, a step ``plan`` excludes, below the region (around
        both) run with ``rival`` and the chain that follows it."""
        region, local, back, margin = self._cut(engine, [plan] if rival is None else [plan, rival])
        step = _local_step(plan, dict(local), len(region))
        taken = self.run(region, engine.stage, step)
        if taken.cost_ns >= taken.before_ns - margin:  # not even below the region as it is
            return None
        other = None if rival is None else _local_step(rival, dict(local), len(region))
        gain = taken.cost_ns - self.run(region, engine.stage, other).cost_ns
        if gain >= -margin:
            return None
        alone = self.run(region, engine.stage, step, ALONE)
        return Chain(gain, alone if alone.rest_ns <= taken.cost_ns + margin else taken, back)

    def never(self, engine: _Engine, plan: _Plan) -> bool:
        """Whether the region around ``plan`` (a step that pays) ends cheaper by more than the margin when the rules
        of ``engine``'s stage keep the nodes ``plan`` replaces than when it runs as it is."""
        region, local, _, margin = self._cut(engine, [plan])
        never = self.run(region, engine.stage, _local_step(plan, local, len(region)), NEVER)
        return never.cost_ns < self.run(region, engine.stage, None).cost_ns - margin

    def _cut(self, engine: _Engine, plans: list[_Plan]) -> tuple[Region, dict[int, int], dict[int, int], float]:
        """Count a question about ``plans`` and cut their region out of ``engine``'s graph (its stage keeping the
        nodes ``engine.banned``; see :func:`_region`); with the margin a chain must gain there (:data:`CHAIN_EPS`)."""
        self.asked += 1
        return (*_region(engine.rw, engine.param_order, plans, self.names, engine.banned),
                CHAIN_EPS * engine.stats.cost_before_ns)

    def run(self, region: Region, stage: str | None, step: _Plan | None, how: str = FOLLOW) -> RegionRun:
        """``region`` optimized from ``stage`` on (None: as a whole run, see ``_Engine.replay``), with ``step``
        taken ``how`` (:data:`FOLLOW`, :data:`ALONE` or :data:`NEVER`), remembered."""
        key = (stage, region.content(), None if step is None else _step_key(step), how)
        known = self.runs.get(key)
        if known is None:
            known = self.runs[key] = self.optimized(region.graph(), region.levels, stage, step, how, region.kept)
        return known


def _local_step(plan: _Plan, local: dict[int, int], size: int) -> _Plan:
    """``plan`` in the ids of a region of ``size`` nodes that ``local`` maps live ids into (its new nodes are
    numbered after the region's; ``local`` gains them)."""
    local.update((nid, size + k) for k, nid in enumerate(plan.new))
    return dataclasses.replace(
        plan, new={local[nid]: dataclasses.replace(n, id=local[nid], inputs=tuple(local[i] for i in n.inputs))
                   for nid, n in plan.new.items()},
        unions=[(local[old], local[rep]) for old, rep in plan.unions], dead={local[n] for n in plan.dead})


def _region(rw: GraphRewriter, param_order: Mapping[int, int], plans: list[_Plan], names: frozenset[str],
            kept: Collection[int] = ()) -> tuple[Region, dict[int, int], dict[int, int]]:
    """The region around ``plans``, the map of live ids to its ids, and the map back (its fresh inputs
    included).

    The levels are the whole graph's in order (a fresh input has the level of the value it stands for), as
    ranks: a cost-neutral step is taken when it reads from further back (see ``_Engine.shallower``), and the
    region, cut short above, must judge that as the whole graph does.  Ranks keep the layers of a model one
    region."""
    nodes, readers = rw.nodes_by_id, rw.readers
    seeds: set[int] = set()
    for plan in plans:
        seeds |= set(plan.dead) | {old for old, _ in plan.unions} | {rep for _, rep in plan.unions if rep in nodes}
        seeds |= {i for n in plan.new.values() for i in n.inputs if i in nodes}
    inner = set(seeds)
    frontier = seeds
    for _ in range(DEPTH):
        frontier = {r for n in frontier for r in readers[n]} - inner
        inner |= frontier
    frontier = set(inner)
    for _ in range(HEIGHT):  # and what those read, up to HEIGHT levels up: a later step may match from there
        frontier = {i for n in frontier for i in nodes[n].inputs if nodes[i].kind is not Kind.LEAF} - inner
        inner |= frontier
    region, local, back = cut_out(rw, param_order, inner, names, seeds)
    return dataclasses.replace(region, kept=frozenset(local[n] for n in kept if n in local)), local, back


@dataclass(frozen=True)
class Region:
    """Nodes cut out of the graph (see :func:`cut_out`), numbered canonically: node ``k`` has id ``k``."""

    fields: tuple[tuple, ...]  # per node, everything about it the fallback's result can depend on (id aside)
    sources: tuple[Node | None, ...]  # per node, the graph's node it copies (None: a fresh input)
    outputs: tuple[int, ...]
    levels: tuple[float, ...]  # each node's level in the whole graph, as a rank
    kept: frozenset[int] = frozenset()  # nodes the rules of the stage it runs from must not replace

    def __len__(self) -> int:
        return len(self.fields)

    @cached_property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes, made when first asked for (most regions are only looked up by :meth:`content`)."""
        out = []
        for k, ((op, inputs, name), shape, dtype, parts) in enumerate(self.fields):
            source = self.sources[k]
            if source is None:
                attrs = {"name": name, "shape": shape, "dtype": dtype}
            elif op in NAMED_LEAVES and name != source.attrs["name"]:
                attrs = {**source.attrs, "name": name}
            else:
                attrs = source.attrs
            out.append(Node(k, op, inputs, attrs, shape, dtype, parts))
        return tuple(out)

    def content(self) -> tuple:
        """Everything the fallback's result on the region depends on, hashable (names of leaves aside)."""
        return self.fields, self.outputs, self.levels, self.kept

    def graph(self) -> Graph:
        graph = Graph("region")
        for node in self.nodes:  # checked in the whole graph, with the same types here
            graph.add_checked(node)
        graph.set_outputs(list(self.outputs))
        return graph


def cut_out(rw: GraphRewriter, param_order: Mapping[int, int], inner: set[int], names: frozenset[str],
            seeds: set[int] = frozenset()) -> tuple[Region, dict[int, int], dict[int, int]]:
    """The nodes ``inner`` (leaves aside, with the producers and projections of the tuples they touch) as a
    region, the map of live ids to its ids, and the map back (its fresh inputs included); see
    :func:`_region`.  Leaves among ``seeds`` are taken in too.  Inputs and Params are renamed by position
    (layers alike are one region), but for ``names``, which rules match (a Param name a pattern spells out)."""
    nodes, readers = rw.nodes_by_id, rw.readers
    inner = {n for n in inner if nodes[n].kind is not Kind.LEAF}
    while True:  # a tuple value is only read by its projections: keep producers and projections together
        edge: set[int] = set()  # values the region reads from outside
        pulled: set[int] = set()
        for n in inner:
            node = nodes[n]
            edge.update(node.inputs)
            if node.dtype == "tuple":
                pulled.update(readers[n])
        edge -= inner
        pulled.update(i for i in edge if nodes[i].dtype == "tuple")
        if pulled <= inner:
            break
        inner |= pulled
    leaves = {i for i in edge | seeds if nodes[i].kind is Kind.LEAF}
    boundary = edge - leaves  # computed outside: kept as nodes reading fresh inputs
    leaves |= {i for b in boundary for i in nodes[b].inputs if nodes[i].kind is Kind.LEAF}

    level, key, order = rw.levels, rw.keys, param_order.get
    cut: list[Node | None] = []  # per region node, the node it copies (None: a fresh input)
    fields: list[tuple] = []  # see _fields: computed as each node is cut, from the rewriter's keys
    local: dict[int, int] = {}
    back: dict[int, int] = {}
    fresh: dict[int, int] = {}

    def fresh_input(n: int) -> int:
        if n not in fresh:
            k = fresh[n] = len(cut)
            back[k] = n
            cut.append(None)
            fields.append((("Input", (), f"v{k}"), nodes[n].shape, nodes[n].dtype, ()))
        return fresh[n]

    # leaves first, then by level, Params in graph order, id
    for _, _, _, n in sorted([(n not in leaves, level[n], order(n, -1), n) for n in leaves | boundary | inner]):
        node = nodes[n]
        if n in boundary and any(nodes[i].dtype == "tuple" for i in node.inputs):  # a projection: an input itself
            local[n] = fresh_input(n)
            continue
        ins = tuple([local[i] if i in local else fresh_input(i) for i in node.inputs])  # (fresh: a boundary's)
        k = local[n] = len(cut)
        if node.op in NAMED_LEAVES:
            name = node.attrs["name"]
            head: tuple = (node.op, (), name if name in names else f"v{k}")
        else:
            own = key[n]
            head = (own[0], ins, own[2])  # node_key of the cut node
        cut.append(node)
        fields.append((head, node.shape, node.dtype, node.parts))
    outputs = set(rw.outputs) & (inner | boundary)
    outputs |= {n for n in inner | boundary if not inner.issuperset(readers[n])}
    back.update(zip(local.values(), local.keys(), strict=True))
    whole = [level[back[k]] for k in range(len(cut))]
    rank = {w: float(k) for k, w in enumerate(sorted(set(whole)))}
    return Region(tuple(fields), tuple(cut), tuple(sorted(local[n] for n in outputs)),
                  tuple(rank[w] for w in whole)), local, back


def matched_names(patterns: Iterable[Rule]) -> frozenset[str]:
    """The names of Inputs and Params that (flat) rules match (string literals among their attributes)."""
    return frozenset(a.value for p in patterns for atom in p.query
                     if isinstance(atom, Pattern) and atom.term.op in NAMED_LEAVES  # type: ignore[union-attr]
                     for a in atom.term.args if isinstance(a, Lit) and isinstance(a.value, str))


def _fields(node: Node) -> tuple:
    """Everything about a node that the fallback's result can depend on (its id aside), hashable."""
    return node_key(node) or (node.op, node.inputs, node.attrs["name"]), node.shape, node.dtype, node.parts


def _step_key(step: _Plan) -> tuple:
    return tuple((nid, _fields(n)) for nid, n in step.new.items()), tuple(step.unions)
