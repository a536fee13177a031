"""FusionReport: fused ops before and after, and every fusion that was missed, with why.

A miss is one of two kinds.

* ``not extracted``: a fused e-node is in the e-graph, in an e-class the optimized
  graph computes unfused, but extraction chose otherwise.  The reason is priced:
  the target has no kernel for it (``unsupported``), it would leave a producer alive
  for another consumer or a graph output (``another consumer``), or it is simply
  predicted slower (``more expensive``); both predicted DAG costs are given.
* ``near miss``: a fusion rule that matched except for one thing.  Each fusion rule
  (one that builds a fused op, or a recognize-stage rule that writes an export form back as its op) is
  relaxed from its query (``Rule.query``, the rule model) in three ways: drop one guard or pattern fact;
  give a variable its pattern uses twice a fresh name for its last use (``inputs not shared``); replace the pattern's
  root op of one tensor input by another op of the same kind and signature (an
  activation without an epilogue kernel).  The relaxed rules run once, alone, on the
  saturated e-graph (but those applying a constructor it has no e-node of: they cannot
  match), recording only their matched root (nothing is built), and a
  root the real rule does not match, computed unfused in the optimized graph, is a
  near miss naming the rule, its ``file:line``, what failed and the nodes.  One
  relaxation is one record listing every value it matched (a ReLU MLP's layers share
  one "no Relu epilogue" near miss, not one per layer).  This runs
  for graphs of at most :data:`NEAR_MISS_MAX_NODES` nodes.

Both need the e-graph.  A third kind needs only a graph, so it works for either engine and for
:meth:`FusionReport.scan` of any graph (an already-optimized or a foreign one):

* ``in graph``: a recognisable pattern still in the graph unfused (:func:`scan_graph`): a matmul, its
  bias Add and activation; matmuls of one input with 2-D weights of one row count; a SwiGLU over two
  projections.  A run's report merges these with the e-graph's misses at the same nodes.

Every miss names its pattern (``matmul_bias_act``, ``shared_input_matmul``, ``swiglu``, or the fused op's
name for the others) and its cause in the design's vocabulary (:class:`MissReason`), with a fix hint.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from egglog import bindings as eb

from ..cost import Target
from ..engines.egglog import extract as ex
from ..engines.egglog._solver import Log, Solver
from ..engines.regions import expand_regions
from ..errors import RlxError
from ..ir.graph import Graph, Node
from ..ir.ops.regions import ELEMENTWISE_REGION
from ..ir.registry import REGISTRY, Kind, snake_case
from ..rules import (
    Atom,
    Call,
    Fact,
    Guard,
    Lookup,
    OpTerm,
    Pattern,
    Rule,
    RuleSet,
    TensorList,
    Term,
    Var,
    atom_terms,
    atom_variables,
    load_rules,
    rename,
    rename_atom,
    variables,
)
from ..rules.signatures import constructor_args
from ..rules.terms import constructor_names

NEAR_MISS_MAX_NODES = 5000
NOT_EXTRACTED, NEAR_MISS, IN_GRAPH = "not extracted", "near miss", "in graph"
MATMUL_BIAS_ACT, SHARED_INPUT_MATMUL, SWIGLU = "matmul_bias_act", "shared_input_matmul", "swiglu"
EPILOGUE_ACTIVATIONS = frozenset({"Gelu", "Silu"})  # the activations FusedMatMulBiasAct's epilogue runs
_RELATION = "rlx-near-miss"  # (rlx-near-miss variant root): a relaxed rule's matched root
_RULESET = "rlx-near-miss-rules"
_ROOT = "?rlx-root"


class MissedFusions(RlxError, RuntimeError):
    """``FusionReport.raise_if_missed``: a fusion was missed (the message lists each one)."""


# Why a recognisable pattern was not collapsed (the design's names), each with the hint a user acts on.
_HINTS = {
    "MultiConsumer": "another reader (or a graph output) needs the unfused value, so the fusion would compute it "
                     "twice: read the fused value there too, or drop the extra output",
    "NonAddBiasConsumer": "FusedMatMulBiasAct needs a bias Add between the matmul and its activation: give the layer "
                          "a bias (zeros if it has none; Module.linear(bias=True))",
    "BiasRankTooHigh": "FusedMatMulBiasAct adds a bias of rank <= 1: reshape the rank-{rank} addend to [N] when it "
                       "is one row repeated (a [1, N] bias holds the same values)",
    "UnsupportedEpilogueActivation": "FusedMatMulBiasAct's epilogue runs Gelu and Silu only: {activation} stays a "
                                     "kernel of its own (an elementwise region where the target has region kernels)",
    "SharedMatmulCount": "{count} matmuls read this input with 2-D weights of one row count and stay separate: one "
                         "matmul over their concatenated weights computes them all (weights must be parameters; "
                         "optimize() merges them where the target prices it faster)",
    "SwigluGateBeforeUp": "the gate projection comes first and the rules in use fuse only [up | gate] halves: load "
                          "the shipped rule fused-swiglu-gate-first, or declare the up weight first",
    "SwigluNotSharedInput": "SwiGLU's gate and up projections read different tensors, so no one matmul computes "
                            "both: project one shared input",
    "NotFused": "the fusion was possible and not made: the detail says why (a target without its kernel, a cost "
                "predicted higher, a graph not optimized yet)",
}
MISS_REASONS = tuple(_HINTS)


@dataclass(frozen=True)
class MissReason:
    """Why a fusion was missed, in the design's vocabulary (:data:`MISS_REASONS`); ``rank``, ``count`` and
    ``activation`` carry the payload of BiasRankTooHigh, SharedMatmulCount and UnsupportedEpilogueActivation."""

    name: str
    rank: int | None = None
    count: int | None = None
    activation: str | None = None

    def __post_init__(self) -> None:
        if self.name not in _HINTS:
            raise ValueError(f"unknown miss reason {self.name!r} (known: {', '.join(MISS_REASONS)})")

    @property
    def hint(self) -> str:
        """The fix a user acts on."""
        return _HINTS[self.name].format(rank=self.rank, count=self.count, activation=self.activation)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "count": self.count, "activation": self.activation}

    def __str__(self) -> str:
        payload = [f"{k}={v}" for k, v in (("rank", self.rank), ("count", self.count)) if v is not None]
        payload += [self.activation] if self.activation is not None else []
        return f"{self.name}({', '.join(payload)})" if payload else self.name


NOT_FUSED = MissReason("NotFused")


@dataclass(frozen=True)
class MissedFusion:
    """One missed fusion: what, where (input-graph node ids), which rule, and why."""

    kind: str  # NOT_EXTRACTED, NEAR_MISS or IN_GRAPH
    op: str  # the fused op not taken / the one the rule builds
    rule: str  # "-" for a pattern found in the graph
    location: str  # the rule's file:line
    nodes: tuple[int, ...]  # input-graph nodes of the value(s) that stayed unfused (a near miss: all alike)
    reason: str  # unsupported | another consumer | more expensive | not taken | guard | pattern part |
    #              inputs not shared | other op | in graph
    detail: str  # the sentence a user acts on
    fused_ns: float | None = None  # predicted graph cost with the fusion (not extracted only)
    chosen_ns: float | None = None  # predicted graph cost of the extracted graph
    pattern: str = ""  # matmul_bias_act, shared_input_matmul, swiglu, or the fused op's (pattern_of)
    cause: MissReason = NOT_FUSED
    places: int = 1  # the places it stands for (a near miss lists every value one relaxation matched)
    labels: tuple[str, ...] = ()  # how messages name ``nodes`` (an imported model's node names: Graph.describe)

    @property
    def hint(self) -> str:
        return self.cause.hint

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "op": self.op, "rule": self.rule, "location": self.location,
                "nodes": list(self.nodes), "labels": list(self.labels), "reason": self.reason, "detail": self.detail,
                "fused_ns": self.fused_ns, "chosen_ns": self.chosen_ns, "pattern": self.pattern,
                "cause": self.cause.to_dict(), "hint": self.hint, "places": self.places}

    def __str__(self) -> str:
        where = ", ".join(self.labels) if self.labels else "node(s) " + (", ".join(map(str, self.nodes)) or "-")
        rule = f" [rule {self.rule} at {self.location}]" if self.rule != "-" else ""
        return f"{self.kind}: {self.op} at {where} ({self.reason}): {self.detail}{rule}; {self.pattern} " \
               f"{self.cause}: {self.hint}"


def pattern_of(op: str) -> str:
    """The pattern name of the fusion that builds ``op``: its snake-case name without ``fused_``, SwiGLU and
    FusedSwiGLU both ``swiglu`` (``FusedMatMulBiasAct`` -> ``matmul_bias_act``)."""
    return snake_case(op).removeprefix("fused_")


@dataclass
class FusionReport:
    """Fused ops per op before and after, and the missed fusions (``missed``)."""

    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    missed: list[MissedFusion] = field(default_factory=list)
    near_misses_checked: bool = False  # False: the graph was over NEAR_MISS_MAX_NODES (or not built)
    region_prologues: int = 0  # regions (after) that read their input 0 through a prologue

    @classmethod
    def scan(cls, graph: Graph, rules: RuleSet | None = None) -> FusionReport:
        """The report of ``graph`` as it is (an already-optimized or a foreign graph): its fused ops, and the
        recognisable patterns it still holds unfused (:func:`scan_graph`; node ids of ``graph``, a step inside
        a region named by the region).  ``rules`` (default: the shipped rules) decide whether a gate-first
        SwiGLU can fuse."""
        counts = fused_op_counts(graph)
        return cls(dict(counts), dict(counts), scan_graph(graph, rules), region_prologues=region_prologues(graph))

    @property
    def missed_per_pattern(self) -> dict[str, int]:
        """Places missed per pattern (a near miss counts every value it lists)."""
        counts: Counter[str] = Counter()
        for m in self.missed:
            counts[m.pattern] += m.places
        return dict(sorted(counts.items()))

    def missed_count(self, pattern: str) -> int:
        """Places where ``pattern`` (``matmul_bias_act``, ``shared_input_matmul``, ``swiglu``, ...) was missed."""
        return self.missed_per_pattern.get(pattern, 0)

    def summary_line(self) -> str:
        ops = sorted(self.before.keys() | self.after.keys())
        counts = ", ".join(f"{op} {self.before.get(op, 0)}->{self.after.get(op, 0)}" for op in ops) or "none"
        kinds = Counter(m.kind for m in self.missed)
        near = f"{kinds[NEAR_MISS]} near" if self.near_misses_checked else "near misses not checked"
        per = "; " + ", ".join(f"{p} {n}" for p, n in self.missed_per_pattern.items()) if self.missed else ""
        return f"fused ops: {counts}; missed {len(self.missed)} ({kinds[NOT_EXTRACTED]} not extracted, {near}, " \
               f"{kinds[IN_GRAPH]} in graph{per})"

    def raise_if_missed(self) -> None:
        """The strict check: raise :class:`MissedFusions` listing every miss."""
        if self.missed:
            raise MissedFusions(f"{len(self.missed)} missed fusion(s):\n" + "\n".join(map(str, self.missed)))

    def to_dict(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after, "region_prologues": self.region_prologues,
                "near_misses_checked": self.near_misses_checked,
                "missed": [m.to_dict() for m in self.missed], "missed_per_pattern": self.missed_per_pattern,
                "summary": self.summary_line()}

    def __str__(self) -> str:
        return "\n".join([self.summary_line(), *(f"  {m}" for m in self.missed)])


def region_prologues(graph: Graph) -> int:
    """The ElementwiseRegions of ``graph`` that read their input 0 through a prologue."""
    return sum(1 for n in graph.nodes if n.op == ELEMENTWISE_REGION and n.attrs["prologue"] != "none")


def fused_op_counts(graph: Graph) -> dict[str, int]:
    """Nodes of fused ops (kind ``fused``: not views, not derived weights) per op."""
    return dict(sorted((op, n) for op, n in graph.op_counts().items() if REGISTRY[op].kind is Kind.FUSED))


class _Context:
    """What the miss analysis reads: the view, the extraction, the costs, the rules."""

    def __init__(self, view: Any, graph: Graph, choice: dict[int, int], costs: list[float], rules: RuleSet) -> None:
        self.view, self.graph, self.choice, self.costs, self.rules = view, graph, choice, costs, rules
        self.roots = [view.class_of_node[o] for o in graph.outputs]
        self.reach = self.reachable(choice, self.roots)
        self.stage = {r.name: r.stage for r in rules.rules}

    def reachable(self, choice: dict[int, int], start: Iterable[int]) -> set[int]:
        seen: set[int] = set()
        stack = list(start)
        while stack:
            c = stack.pop()
            if c not in seen and c in choice:
                seen.add(c)
                stack.extend(self.view.nodes[choice[c]].children)
        return seen

    def unfused(self, c: int) -> bool:
        """Whether the optimized graph computes class ``c`` without a fusion."""
        n = self.view.nodes[self.choice[c]]
        return n.spec.kind is not Kind.FUSED and not any(self.stage.get(r) in ("fuse", "blocks") for r in n.built_by)

    def location(self, name: str) -> str:
        return self.rules.by_name(name).location if name in self.stage else "-"

    def describe(self, c: int) -> str:
        originals = self.view.classes[c].originals
        if originals:
            return " = ".join(self.graph.describe(o) for o in originals)
        return f"e-class {c} ({self.view.nodes[self.choice[c]].op})" if c in self.choice else f"e-class {c}"


def missed_fusions(view: Any, graph: Graph, choice: dict[int, int], costs: list[float], rules: RuleSet,
                   target: Target, egraph: eb.EGraph | None) -> tuple[list[MissedFusion], bool]:
    """The misses of one run; near misses only when ``egraph`` is given and the graph is small enough."""
    ctx = _Context(view, graph, choice, costs, rules)
    missed = _not_extracted(ctx, target)
    checked = egraph is not None and len(graph) <= NEAR_MISS_MAX_NODES
    if checked:  # a class whose fused alternative the cost model rejected would reject a near miss too
        explained = {n for m in missed if m.reason != "unsupported" for n in m.nodes}
        missed += _near_misses(ctx, egraph, explained)
    if graph.meta.get("node_names"):  # an imported model's nodes: named as its author knows them
        missed = [replace(m, labels=tuple(graph.describe(n) for n in m.nodes)) for m in missed]
    return missed, checked


def _not_extracted(ctx: _Context, target: Target) -> list[MissedFusion]:
    """Each fused alternative of an unfused class, priced by switching to it on reference counts (the
    extraction's own incremental DAG cost: the time is proportional to what the switch changes)."""
    view, choice, costs = ctx.view, ctx.choice, ctx.costs
    complete = {**ex._best_tree_choice(view, costs)[0], **choice}
    chosen_ns = ex.dag_cost(view, choice, ctx.roots, costs)
    solver = Solver(view, costs, complete, ctx.roots, [0.0] * len(view.classes))
    out = []
    for c in sorted(ctx.reach):
        if not ctx.unfused(c):
            continue
        best: dict[str, tuple[float, int]] = {}  # per fused op, its cheapest e-node in the class
        for idx in view.classes[c].nodes:
            f = view.nodes[idx]
            if f.spec.kind is Kind.FUSED and all(ch in complete for ch in f.children):
                log = Log()
                cost = chosen_ns + solver.switch(c, idx, log)
                solver.undo(log)
                best[f.op] = min(best.get(f.op, (cost, idx)), (cost, idx))
        for fused_ns, idx in best.values():
            f = view.nodes[idx]
            rule = f.built_by[0] if f.built_by else "-"
            log = Log()
            solver.switch(c, idx, log)
            # What the fused node would replace but stays needed: classes its switch let go of that are
            # still live and that the fused node does not read itself.
            reads = {d for d in log.refs if d >= 0}
            alive = sorted({~d for d in log.refs if d < 0 and solver.needed(~d) > 0} - reads - {c})
            alive = [k for k in alive if view.nodes[choice[k]].spec.kind is not Kind.LEAF]
            if costs[idx] == float("inf"):
                reason, detail = "unsupported", f"target {target.name} does not run {f.op} (unsupported op)"
            elif alive:
                reason, detail = "another consumer", "; ".join(_kept_alive(ctx, solver, k) for k in alive) + \
                    f", so fusing would compute it twice: {fused_ns:,.0f} ns fused vs {chosen_ns:,.0f} ns unfused"
            elif fused_ns > chosen_ns:
                reason, detail = "more expensive", f"predicted slower on {target.name}: {fused_ns:,.0f} ns with " \
                    f"{f.op} vs {chosen_ns:,.0f} ns without"
            else:
                reason, detail = "not taken", f"predicted {fused_ns:,.0f} ns with {f.op} vs {chosen_ns:,.0f} ns " \
                    "without, yet greedy extraction did not take it; try extraction='exact'"
            solver.undo(log)
            cause = MissReason("MultiConsumer") if reason == "another consumer" else NOT_FUSED
            out.append(MissedFusion(NOT_EXTRACTED, f.op, rule, ctx.location(rule), tuple(view.classes[c].originals),
                                    reason, f"{ctx.describe(c)}: {detail}", fused_ns, chosen_ns, pattern_of(f.op),
                                    cause))
    return out


def _kept_alive(ctx: _Context, solver: Solver, k: int) -> str:
    """Why class ``k`` stays needed with the fused node in place: the graph outputs it, or other live
    chosen nodes read it."""
    if k in ctx.roots:
        return f"{ctx.describe(k)} is a graph output"
    readers = sorted({pc for p in ctx.view.parents()[k] if solver.needed(pc := ctx.view.nodes[p].eclass) > 0
                      and solver.chosen(pc) == p})
    return f"{ctx.describe(k)} is also read by " + ", ".join(ctx.describe(p) for p in readers)


@dataclass(frozen=True)
class _Variant:
    rule: Rule
    facts: tuple[str, ...]
    reason: str
    detail: str
    root_op: str  # the op at the root of the rule's pattern (a class chosen as it stayed unrewritten)
    reads: frozenset[str]  # the constructors its query applies: it matches nothing while one of them has no e-node
    other: str = ""  # the op an "other op" relaxation put at the root

    def cause(self, op: str) -> MissReason:
        """The cause of a near miss of this relaxation of a rule building ``op``."""
        if self.reason == "other op" and op == "FusedMatMulBiasAct":
            return MissReason("UnsupportedEpilogueActivation", activation=self.other)
        if self.reason == "inputs not shared" and pattern_of(op) == SWIGLU:
            return MissReason("SwigluNotSharedInput")
        return NOT_FUSED


def _near_misses(ctx: _Context, egraph: eb.EGraph, explained: set[int]) -> list[MissedFusion]:
    """One record per relaxed rule that matched where the rule did not: every such value, left out those
    in ``explained`` (input-graph nodes whose miss is already priced)."""
    fusion_rules = [r for r in ctx.rules.rules if _made_op(r) is not None]
    variants: list[_Variant] = []
    real: dict[str, int] = {}
    for rule in fusion_rules:
        relaxed = _variants(rule)
        if relaxed:
            real[rule.name] = len(variants)
            variants.extend(relaxed)
    empty = _empty_constructors(egraph)
    egraph.run_program(*egraph.parse_program(f"(relation {_RELATION} (i64 Op))\n(ruleset {_RULESET})"))
    for k, v in enumerate(variants):
        if v.reads & empty:  # it cannot match: declaring it would cost its compilation for nothing
            continue
        text = f"(rule ({' '.join(v.facts)}) (({_RELATION} {k} {_ROOT})) :ruleset {_RULESET} :name \"{_RELATION}-{k}\")"
        try:
            egraph.run_program(*egraph.parse_program(text))
        except eb.EggSmolError:  # a relaxation that leaves a variable unbound, or a sort mismatch
            continue
    egraph.run_program(*egraph.parse_program(f"(run {_RULESET} 1)"))
    hits: dict[int, set[int]] = {}
    for row in egraph.freeze().functions[_RELATION].rows:
        c = ctx.view.class_of_value(row.inputs[1])
        if c is not None:
            hits.setdefault(egraph.value_to_i64(row.inputs[0]), set()).add(c)
    out, seen = [], set()
    for k, v in enumerate(variants):
        if not v.reason:
            continue
        classes = []
        for c in sorted(hits.get(k, set()) - hits.get(real[v.rule.name], set())):
            if c not in ctx.reach or (v.rule.base, c) in seen or explained & set(ctx.view.classes[c].originals):
                continue
            chosen = ctx.view.nodes[ctx.choice[c]].op
            # made by another rule: an op the rule builds, other than its root's (a layout rule rooted at a Reshape
            # builds Reshapes too: its root left as it was is its miss)
            if not (ctx.unfused(c) or chosen == v.root_op) or (chosen in v.rule.builds and chosen != v.root_op):
                continue
            seen.add((v.rule.base, c))
            classes.append(c)
        if not classes:
            continue
        op = _made_op(v.rule)
        where = [ctx.describe(c) for c in classes]
        who = where[0] + " matches" if len(where) == 1 else f"{', '.join(where[:-1])} and {where[-1]} match"
        out.append(MissedFusion(NEAR_MISS, op, v.rule.name, v.rule.location,
                                tuple(o for c in classes for o in ctx.view.classes[c].originals), v.reason,
                                f"{who} rule {v.rule.name} except that {v.detail}", pattern=pattern_of(op),
                                cause=v.cause(op), places=len(classes)))
    return out


def _empty_constructors(egraph: eb.EGraph) -> set[str]:
    """The functions of ``egraph`` without a row: a query applying one of them matches nothing."""
    (sizes,) = egraph.run_program(*egraph.parse_program("(print-size)"))
    assert isinstance(sizes, eb.PrintAllFunctionsSize)
    return {name for name, size in sizes.sizes if size == 0}


@lru_cache(maxsize=1024)
def _variants(rule: Rule) -> tuple[_Variant, ...]:
    """The rule as a near-miss query, then its relaxations; none when its query does not start with an op pattern
    (a pure function of the rule: computed once per rule)."""
    parsed = _pattern(rule)
    if parsed is None:
        return ()
    pattern, others = parsed
    # the relaxations keeping the most facts first: of those that match, the report names the one closest to the
    # rule (a part whose dropping takes the rest of the query with it matches wherever the root does)
    relaxed = sorted(_relaxations(rule, pattern, others), key=lambda v: -len(v.facts))
    return (_variant(rule, pattern, others, "", "", pattern.op), *relaxed)


def _variant(rule: Rule, root: OpTerm, atoms: Sequence[Atom], reason: str, detail: str, root_op: str,
             other: str = "") -> _Variant:
    """The query ``root`` bound to ``?rlx-root``, then ``atoms``, as a relaxation of ``rule``."""
    reads = frozenset(n for term in (root, *(t for a in atoms for t in atom_terms(a))) for n in constructor_names(term))
    return _Variant(rule, (f"(= {_ROOT} {root})", *map(str, atoms)), reason, detail, root_op, reads, other)


def _made_op(rule: Rule) -> str | None:
    """The op whose miss a near miss of ``rule`` reports: the fused op it builds, else the op a recognize-stage
    rule recognises (an export form written back as Gelu, LayerNorm, Clip, ...); None for other rules."""
    built = sorted(op for op in rule.builds if op in REGISTRY)
    fused = [op for op in built if REGISTRY[op].kind is Kind.FUSED]
    if fused:
        return fused[0]
    return built[0] if built and rule.stage == "recognize" else None


def _pattern(rule: Rule) -> tuple[OpTerm, list[Atom]] | None:
    """The rule's root pattern, its matched root renamed ``?rlx-root``, and its other atoms; None when its query
    does not start with an op pattern bound to a variable (``(= ?e (Op ...))``)."""
    first, *others = rule.query
    if not (isinstance(first, Pattern) and isinstance(first.term, OpTerm) and isinstance(first.var, Var)
            and first.var_first):
        return None
    root = {first.var.name: Var(_ROOT)}
    pattern = rename(first.term, root)
    assert isinstance(pattern, OpTerm)
    return pattern, [rename_atom(a, root) for a in others]


def _binds_op(atom: Atom) -> bool:
    """Whether ``atom`` binds a variable to an op pattern (``(= ?e (Op ...))``)."""
    return isinstance(atom, Pattern) and atom.var is not None and isinstance(atom.term, OpTerm)


def _relaxations(rule: Rule, pattern: OpTerm, others: list[Atom]) -> list[_Variant]:
    out = []
    root_alone = not any(isinstance(a, OpTerm) for a in pattern.args)
    for k, atom in enumerate(others):
        binds = _binds_op(atom)
        kept = _joined(pattern, [f for j, f in enumerate(others) if j != k])
        if (binds or _is_relation(atom)) and root_alone and not any(_binds_op(f) or _is_relation(f) for f in kept):
            continue  # without that part (or helper relation) the rule would match its root op anywhere
        if _is_relation(atom) and set(atom_variables(atom)) - set(variables(pattern)) - {
                v for f in kept for v in atom_variables(f)} and not any(_binds_op(f) for f in kept):
            # the relation is what finds the form's input (ln-normed ?n ?x ?eps): not one clause of it, unless
            # other parts of the form still hold without it (attn-scores under Softmax(scores + mask))
            continue
        out.append(_variant(rule, pattern, kept, "pattern part" if binds else "guard",
                            f"{'its part' if binds else 'the guard'} {atom} does not hold", pattern.op))
    uses = Counter(variables(pattern))
    for name in sorted(v for v, n in uses.items() if n > 1 and v != _ROOT):
        relaxed = _rename_last_use(pattern, name, f"{name}-unshared")
        assert isinstance(relaxed, OpTerm)
        out.append(_variant(rule, relaxed, others, "inputs not shared",
                            f"the uses of {name} in {pattern} are different tensors, not one shared input",
                            pattern.op))
    spec = REGISTRY[pattern.op]
    if len(spec.inputs) == 1 and not spec.variadic:
        sorts = [a.sort for a in constructor_args(spec)]
        for other in sorted(REGISTRY):
            o = REGISTRY[other]
            if other != spec.name and o.kind is spec.kind and [a.sort for a in constructor_args(o)] == sorts:
                out.append(_variant(rule, OpTerm(other, pattern.args), others, "other op",
                                    f"it is {other} where the rule needs {spec.name} (no {other} epilogue)",
                                    pattern.op, other))
    return out


_COMPARISONS = frozenset({"<", ">", "<=", ">=", "!=", "="})


def _joined(pattern: OpTerm, atoms: list[Atom]) -> list[Atom]:
    """The ``atoms`` still joined to the root ``pattern``: an op pattern or relation sharing a variable with what
    is bound, an equation or check whose variables are bound (but for one an equation defines).  An atom left over
    would be matched on its own, against every e-node, a cross product (dropping the QKV projection of
    attention-block leaves guards on its input alone): it is about the dropped part, so it goes with it."""
    bound, left, changed = {_ROOT, *variables(pattern)}, list(atoms), True
    while changed:
        changed = False
        for atom in list(left):
            names = set(atom_variables(atom))
            defined = {t.name for t in atom_terms(atom) if isinstance(t, Var)} if _is_equation(atom) else set()
            if (names & bound if _binds_op(atom) or _is_relation(atom) else
                    len(names - bound) <= 1 and names - bound <= defined):
                bound |= names
                left.remove(atom)
                changed = True
    return [f for f in atoms if f not in left]


def _is_equation(atom: Atom) -> bool:
    """Whether ``atom`` is written as an equation ``(= a b)``: a bound pattern, a table's value, an ``=`` check."""
    return (isinstance(atom, Pattern) and atom.var is not None) or (isinstance(atom, Fact) and atom.value is not None) \
        or (isinstance(atom, Guard) and atom.name == "=")


def _is_relation(atom: Atom) -> bool:
    """Whether ``atom`` is a lookup on its own (``(split-qk ?q ?k)``, a bare op pattern), which binds its
    variables."""
    return (isinstance(atom, Pattern) and atom.var is None) or (isinstance(atom, Fact) and atom.value is None) \
        or (isinstance(atom, Guard) and atom.name not in _COMPARISONS)


def _rename_last_use(term: Term, name: str, new: str) -> Term:
    """``term`` with the last use of variable ``name`` renamed ``new``."""
    uses = variables(term).count(name)
    return _renamed(term, name, new, uses, [0])


def _renamed(term: Term, name: str, new: str, last: int, seen: list[int]) -> Term:
    """:func:`_rename_last_use`, ``seen[0]`` counting the uses passed so far, left to right.  (A function, not a
    recursive closure: such a closure is a reference cycle, left to the garbage collector.)"""
    if isinstance(term, Var):
        if term.name != name:
            return term
        seen[0] += 1
        return Var(new) if seen[0] == last else term
    if isinstance(term, OpTerm):
        return OpTerm(term.op, tuple(_renamed(a, name, new, last, seen) for a in term.args))
    if isinstance(term, TensorList):
        items = tuple(_renamed(a, name, new, last, seen) for a in term.items)
        return TensorList(items, None if term.rest is None else _renamed(term.rest, name, new, last, seen))
    if isinstance(term, Call):
        return Call(term.name, tuple(_renamed(a, name, new, last, seen) for a in term.args))
    if isinstance(term, Lookup):
        return Lookup(term.table, tuple(_renamed(a, name, new, last, seen) for a in term.args))
    return term


# --- patterns left in a graph (the design's scan) ----------------------------------------------------------------

Names = Callable[[int], str]


def scan_graph(graph: Graph, rules: RuleSet | None = None) -> list[MissedFusion]:
    """The recognisable patterns ``graph`` holds unfused, as IN_GRAPH misses on ``graph``'s node ids, each node named
    as :meth:`Graph.describe` names it (a step inside a region by its region).  ``rules`` (default: the shipped
    rules) decide whether a gate-first SwiGLU can fuse."""
    expanded, origin = expand_regions(graph)

    def name(i: int) -> str:
        return graph.describe(origin[i])

    return _scan(expanded, _gate_first_fuses(rules), lambda i: (origin[i],), name)


def scan_optimized(graph: Graph, originals: Mapping[int, Sequence[int]], input_graph: Graph,
                   rules: RuleSet) -> list[MissedFusion]:
    """:func:`scan_graph` of a run's optimized ``graph``, on input-graph node ids (``originals``: optimized id ->
    the input-graph nodes of its value), each node named by the input-graph node it computes (as
    :meth:`Graph.describe` names it: by its ONNX name where it has one)."""
    expanded, origin = expand_regions(graph)

    def nodes_of(i: int) -> tuple[int, ...]:
        return tuple(originals.get(origin[i], ()))

    def name(i: int) -> str:
        op, was = expanded.node(i).op, nodes_of(i)
        if not was:
            return f"a new {op}"
        first = input_graph.describe(was[0])
        return first if input_graph.node(was[0]).op == op else f"{op} computing {first}"

    return _scan(expanded, _gate_first_fuses(rules), nodes_of, name)


def merge_misses(egraph: list[MissedFusion], scanned: list[MissedFusion]) -> list[MissedFusion]:
    """The e-graph's misses, then the scan's that none of them covers (same pattern, a node in common).  A near miss
    the scan explains more precisely (a failed guard that is BiasRankTooHigh) takes the scan's cause."""
    out, covered = [], set()
    for m in egraph:
        hits = [k for k, f in enumerate(scanned) if f.pattern == m.pattern and set(f.nodes) & set(m.nodes)]
        covered.update(hits)
        precise = [scanned[k].cause for k in hits if scanned[k].cause != NOT_FUSED]
        if m.kind == NEAR_MISS and m.cause == NOT_FUSED and precise:
            m = dataclasses.replace(m, cause=precise[0])
        out.append(m)
    return out + [f for k, f in enumerate(scanned) if k not in covered]


def _gate_first_fuses(rules: RuleSet | None) -> bool:
    """Whether ``rules`` fuse a SwiGLU whose concatenated halves are [gate | up] (the shipped rules do)."""
    rules = load_rules(rules)
    return any(r.base == "fused-swiglu-gate-first" for r in rules.rules)


def _activation(graph: Graph, i: int) -> Node | None:
    """The one reader of node ``i`` when it is an activation (a one-input elementwise op but Cast and Identity)
    and ``i`` is no graph output."""
    reader = _one_reader(graph, i)
    return reader if reader is not None and reader.kind is Kind.ELEMENTWISE and len(reader.inputs) == 1 \
        and reader.op not in ("Cast", "Identity") else None


def _one_reader(graph: Graph, i: int) -> Node | None:
    """The one node reading node ``i`` when it has one use (it is no graph output)."""
    readers = graph.users(i)
    return graph.node(readers[0]) if len(readers) == 1 and i not in graph.outputs else None


def _swiglu_gate(graph: Graph, act: Node) -> bool:
    """Whether ``act`` is the Silu of a SwiGLU's gate (its one reader a Mul): the swiglu scan's, not a linear's."""
    reader = _one_reader(graph, act.id)
    return act.op == "Silu" and reader is not None and reader.op == "Mul"


def _projection(node: Node) -> bool:
    """A matmul of an input by a 2-D weight: MatMul, or FusedMatMulBiasAct without an activation."""
    return node.op == "MatMul" or (node.op == "FusedMatMulBiasAct" and node.attrs["act"] == "none")


def _scan(graph: Graph, gate_first_fuses: bool, nodes_of: Callable[[int], tuple[int, ...]],
          name: Names) -> list[MissedFusion]:
    """The design's three scans over ``graph`` (regions expanded), as IN_GRAPH misses."""
    found: list[tuple[str, str, MissReason, tuple[int, ...], str]] = []
    found += _scan_matmul_bias_act(graph, name)
    found += _scan_shared_matmul(graph, name)
    found += _scan_swiglu(graph, gate_first_fuses, name)
    out = []
    for pattern, op, cause, nodes, detail in found:
        originals = tuple(dict.fromkeys(o for n in nodes for o in nodes_of(n)))
        out.append(MissedFusion(IN_GRAPH, op, "-", "-", originals, IN_GRAPH, detail, pattern=pattern, cause=cause))
    return out


def _scan_matmul_bias_act(g: Graph, name: Names) -> list[tuple[str, str, MissReason, tuple[int, ...], str]]:
    """MatMul -> bias Add -> Gelu/Silu that is not one FusedMatMulBiasAct."""
    out = []

    def miss(cause: MissReason, nodes: tuple[int, ...], detail: str) -> None:
        out.append((MATMUL_BIAS_ACT, "FusedMatMulBiasAct", cause, nodes, detail))

    for n in g.nodes:
        if n.op not in ("MatMul", "FusedMatMulBiasAct", "FusedMatMulAdd"):
            continue
        act = _activation(g, n.id)
        if n.op == "MatMul":
            readers = g.users(n.id)
            adds = [r for r in readers if g.node(r).op == "Add"]
            if len(readers) + (n.id in g.outputs) > 1:
                if adds:
                    also = ", ".join(name(r) for r in readers if r not in adds)
                    extra = f", {also}" if also else ""
                    output = " and is a graph output" if n.id in g.outputs else ""
                    miss(MissReason("MultiConsumer"), (n.id, *adds), f"{name(n.id)} is read by "
                         f"{', '.join(name(a) for a in adds)}{extra}{output}: it fuses into its bias Add only as "
                         "that Add's one input")
                continue
            if not readers:
                continue
            reader = g.node(readers[0])
            if reader.op == "Add" and reader.inputs[0] != reader.inputs[1]:
                addend = g.node(reader.inputs[1] if reader.inputs[0] == n.id else reader.inputs[0])
                after = _activation(g, reader.id)
                chain = (n.id, reader.id, *([after.id] if after else []))
                if addend.type.rank > 1:
                    if after is not None and after.op in EPILOGUE_ACTIVATIONS:
                        miss(MissReason("BiasRankTooHigh", rank=addend.type.rank), chain,
                             f"{name(reader.id)} adds {name(addend.id)}, of rank {addend.type.rank}, to "
                             f"{name(n.id)} before {name(after.id)}")
                    continue
                fusable = chain if after is None or after.op in EPILOGUE_ACTIVATIONS else chain[:2]
                miss(NOT_FUSED, fusable, f"{', '.join(map(name, fusable))} stay separate kernels")
                if after is not None and after.op not in EPILOGUE_ACTIVATIONS:
                    miss(MissReason("UnsupportedEpilogueActivation", activation=after.op), chain,
                         f"{name(after.id)} reads the biased {name(n.id)}")
            elif act is not None and act.op in EPILOGUE_ACTIVATIONS and not _swiglu_gate(g, act):
                miss(MissReason("NonAddBiasConsumer"), (n.id, act.id), f"{name(act.id)} reads {name(n.id)} "
                     "with no bias Add between them")
        elif n.op == "FusedMatMulBiasAct" and n.attrs["act"] == "none" and act is not None:
            if act.op in EPILOGUE_ACTIVATIONS:
                miss(NOT_FUSED, (n.id, act.id), f"{name(act.id)} reads {name(n.id)} without being its epilogue")
            else:
                miss(MissReason("UnsupportedEpilogueActivation", activation=act.op), (n.id, act.id),
                     f"{name(act.id)} reads {name(n.id)}")
        elif n.op == "FusedMatMulAdd" and act is not None and act.op in EPILOGUE_ACTIVATIONS:
            addend = g.node(n.inputs[2])
            if addend.type.rank > 1:
                miss(MissReason("BiasRankTooHigh", rank=addend.type.rank), (n.id, act.id),
                     f"{name(n.id)} adds {name(addend.id)}, of rank {addend.type.rank}, before {name(act.id)}, "
                     "which stays a kernel of its own")
    return out


def _scan_shared_matmul(g: Graph, name: Names) -> list[tuple[str, str, MissReason, tuple[int, ...], str]]:
    """Two or more projections of one input with 2-D weights of one row count, left separate."""
    groups: dict[tuple[int, str, Any], list[int]] = {}
    for n in g.nodes:
        weight = g.node(n.inputs[1]) if _projection(n) else None
        if weight is not None and weight.type.rank == 2:
            groups.setdefault((n.inputs[0], n.op, weight.shape[0]), []).append(n.id)
    out = []
    for (x, _, rows), members in groups.items():
        if len(members) >= 2:
            cause = NOT_FUSED if len(members) == 2 else MissReason("SharedMatmulCount", count=len(members))
            computed = [g.node(m).inputs[1] for m in members
                        if g.node(g.node(m).inputs[1]).op not in ("Param", "ConcatParams")]
            why = f" (the weight {', '.join(map(name, computed))} is no parameter: only parameters are concatenated " \
                  "at load time)" if computed else ""
            out.append((SHARED_INPUT_MATMUL, "MatMul", cause, tuple(members),
                        f"{', '.join(map(name, members))} read {name(x)} with 2-D weights of {rows} rows and stay "
                        f"{len(members)} matmuls{why}"))
    return out


def _scan_swiglu(g: Graph, gate_first_fuses: bool,
                 name: Names) -> list[tuple[str, str, MissReason, tuple[int, ...], str]]:
    """Silu(gate) * up (or SwiGLU(gate, up)) over two projections, not one FusedSwiGLU."""
    out = []
    for n in g.nodes:
        if n.op == "SwiGLU":
            gate, up = (g.node(i) for i in n.inputs)
        elif n.op == "Mul":
            a, b = (g.node(i) for i in n.inputs)
            if b.op == "Silu":
                gate, up = g.node(b.inputs[0]), a
            elif a.op == "Silu":
                gate, up = g.node(a.inputs[0]), b
            else:
                continue
            if gate.shape != up.shape:
                continue
        else:
            continue
        if _projection(gate) and _projection(up):
            what, gate_first = "two matmuls of", g.positions()[gate.id] < g.positions()[up.id]
        elif _halves(g, gate, up):
            what, gate_first = "the halves of", gate.attrs["start"] == 0
        else:
            continue
        nodes = (n.id, gate.id, up.id)
        if gate.inputs[0] != up.inputs[0]:
            cause, detail = MissReason("SwigluNotSharedInput"), \
                f"gate {name(gate.id)} reads {name(gate.inputs[0])}, up {name(up.id)} reads {name(up.inputs[0])}"
        elif gate_first and not gate_first_fuses:
            cause, detail = MissReason("SwigluGateBeforeUp"), \
                f"gate {name(gate.id)} comes before up {name(up.id)} ({what} {name(gate.inputs[0])})"
        else:
            cause, detail = NOT_FUSED, f"gate {name(gate.id)} and up {name(up.id)} stay {what} " \
                                       f"{name(gate.inputs[0])} under {name(n.id)}"
        out.append((SWIGLU, "FusedSwiGLU", cause, nodes, detail))
    return out


def _halves(g: Graph, gate: Node, up: Node) -> bool:
    """Whether ``gate`` and ``up`` are Narrows of the last axis into halves of equal width (of one tensor or two),
    as a concatenated projection is split: [up | gate] or [gate | up]."""
    if gate.op != "Narrow" or up.op != "Narrow" or gate.attrs["axis"] != -1 or up.attrs["axis"] != -1:
        return False
    width = gate.attrs["length"]
    return up.attrs["length"] == width and {gate.attrs["start"], up.attrs["start"]} == {0, width} \
        and g.node(gate.inputs[0]).shape[-1] == g.node(up.inputs[0]).shape[-1] == 2 * width
