"""Rule soundness: every rule checked on random instances of its query.

For each rule, :func:`check` draws random graphs on which its query can match
(:mod:`rlx_egraph.rules.instances`: each op term a node, each ``Op`` variable a
leaf, each attribute a random value, what guards pin down solved from them),
runs only that rule in egglog (egglog decides whether the guards hold: an
instance counts when the rule fired), and evaluates every e-node of every
e-class the rules built or merged into with the numpy kernels on two seeds and
in rounds of IEEE special values.  A rule is *sound* when every such e-node
computes its class's value within the dtype tolerance and is well-typed,
*unsound* with a counter-example otherwise, or *not checkable* with the reason.

Weight folds: a rule that builds a derived weight (an op of kind weight-prep,
such as a BatchNormalization's scale folded into a convolution's weight) is
judged with the parameters the derived weights read as stored weights: finite
values drawn once per instance, IEEE special values only in the data.  A fold
such as ``(x @ W + b) * g -> x @ (W * g) + b * g`` is exact in real arithmetic
but not under every special value of its parameters (``W * g`` underflows
where ``(x @ W) * g`` does not, ``inf * 0``); what makes it sound is that it is
only ever computed from a model's stored weights, and ``optimize`` checks each
fold on those (:func:`~rlx_egraph.kernels.parity.check_weight_folds`).  The
verdict says so (``weight_fold``).

Helper relations: a rule that only adds facts is checked through the rules
that read its relation: a reader's relation facts are unfolded into the query
of a producer (the least used one first), so the instance holds the whole
decomposed form and egglog runs the reader with its producers; a producer
(e.g. an operand order) with fewer instances than asked is then forced into the
instances of a reader that can unfold it, however deep (unless no other rule
adds rows to its tables and the reader has used its attempts already: forcing
would only draw the same instances again).  Tables that rules
fill with ``set`` (the shared-input chain) cannot be unfolded: such rules are
checked together with the rest of their file on instances made of k >= 2
copies of the chain's first query sharing its first argument (k matmuls of one
input); a facts-only rule there counts an instance when egglog reports it
matched.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
from egglog import bindings as eb

from ...ir.dtypes import PARITY_TOLERANCE, dtype, loosest
from ...ir.graph import Graph
from ...ir.ops.reference import run_node
from ...ir.registry import REGISTRY, Kind
from ...kernels.interpreter import random_value, special_rounds
from ...kernels.parity import ROUNDING_FACTOR, Reference, computed_from, precisions, tolerance_ratio, widened_graph
from ...rules import Insert, variables
from ...rules.instances import (
    NoInstance,
    Producers,
    Query,
    build_instance,
    choose_producers,
    fresh,
    helper_producers,
    prepare,
    queries,
    readers,
    reads_relation,
    set_tables,
    unfold,
    unions_nothing,
)
from .encode import encode_graph
from .rules import STAGES, VARIANT_MARK, Rule, RuleError, RuleSet, load_rules
from .saturate import SaturationLimits, saturate
from .schema import schema_text
from .view import EGraphView, build_view

SOUND, UNSOUND, NOT_CHECKABLE = "sound", "unsound", "not checkable"
SEEDS = 2  # seeds each instance is evaluated on
# What an additive mask passes through on its way from a leaf to the Softmax it masks.
_MASK_PATH = frozenset({"Add", "Where", "Expand", "Reshape"})
_DERIVED_WEIGHTS = frozenset(name for name, spec in REGISTRY.items() if spec.kind is Kind.WEIGHT_PREP)
_DECLARED_TABLE = re.compile(r"\s*\((?:relation|function)\s+([^\s()]+)")  # a table's declaration: its name
_LIMITS = SaturationLimits(max_iterations=12, max_enodes=20_000, max_seconds=20.0)


@dataclass(frozen=True)
class CounterExample:
    """An instance on which a rule is wrong: its leaves, the e-node, the largest error."""

    rule: str
    problem: str
    leaves: tuple[str, ...]  # "x0: f32[2, 3]" per leaf of the instance
    attrs: dict[str, Any]  # the wrong e-node's attributes
    max_abs: float = math.inf

    def __str__(self) -> str:
        return f"{self.problem}; instance {', '.join(self.leaves)}"

    def to_dict(self) -> dict:
        return {"problem": self.problem, "leaves": list(self.leaves),
                "attrs": {k: _jsonable(v) for k, v in self.attrs.items()},
                "max_abs": None if math.isinf(self.max_abs) else self.max_abs}


@dataclass
class RuleVerdict:
    """What the check found for one rule."""

    rule: str
    location: str
    status: str = NOT_CHECKABLE  # SOUND, UNSOUND or NOT_CHECKABLE
    instances: int = 0  # random instances on which the rule fired and was checked
    reason: str = ""  # why not checkable, or how a facts-only rule or a weight fold was checked
    counterexample: CounterExample | None = None
    weight_fold: bool = False  # builds derived weights: judged on stored (finite) parameters, see the module

    def to_dict(self) -> dict:
        return {"rule": self.rule, "location": self.location, "status": self.status, "instances": self.instances,
                "reason": self.reason, "weight_fold": self.weight_fold,
                "counterexample": self.counterexample.to_dict() if self.counterexample else None}

    def __str__(self) -> str:
        text = f"{self.status:<13}  {self.rule}  {self.location}  {self.instances} instance(s)"
        if self.counterexample:
            text += f"\n    counter-example: {self.counterexample}"
        elif self.reason:
            text += f"\n    {self.reason}"
        return text


@dataclass
class SoundnessReport:
    """One verdict per rule, in file order; ``ok`` when no rule is unsound."""

    verdicts: list[RuleVerdict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.status != UNSOUND for v in self.verdicts)

    def by_rule(self, name: str) -> RuleVerdict:
        return next(v for v in self.verdicts if v.rule == name)

    def unsound(self) -> list[str]:
        """The unsound rules as written (an unsound operand order names its rule once)."""
        return list(dict.fromkeys(v.rule.split(VARIANT_MARK)[0] for v in self.verdicts if v.status == UNSOUND))

    def to_dict(self) -> dict:
        return {"ok": self.ok, "rules": [v.to_dict() for v in self.verdicts]}

    def __str__(self) -> str:
        counts = {s: sum(v.status == s for v in self.verdicts) for s in (SOUND, UNSOUND, NOT_CHECKABLE)}
        lines = [str(v) for v in self.verdicts]
        lines.append(f"{len(self.verdicts)} rules: {counts[SOUND]} sound, {counts[UNSOUND]} unsound, "
                     f"{counts[NOT_CHECKABLE]} not checkable; instances checked per rule: "
                     + ", ".join(f"{v.rule} {v.instances}" for v in self.verdicts))
        return "\n".join(lines)


def check(rules: RuleSet | Any = None, instances: int = 3, attempts: int = 80, seed: int = 0) -> SoundnessReport:
    """Check every rule of ``rules`` (a RuleSet, rule files/folders, or None for the shipped rules).

    Each rule gets up to ``attempts`` random draws to find ``instances`` on which it fires, drawn by a
    generator keyed by ``seed`` and the rule's name: a rule gets the same instances whatever other rules are
    checked with it (those whose helper relations it reads take part in its instances).
    The same rules, ``instances``, ``attempts`` and ``seed`` give the same report.  Rules that add rows to helper
    relations the shipped files declare (and the set does not load) are checked through the shipped rules that
    read those relations, which join the run without being reported.
    """
    ruleset = load_rules(rules)
    reported = [r.name for r in ruleset.rules]
    borrowed = {d.name for d in ruleset.helpers if d.borrowed}
    if any(r.tables_written & borrowed for r in ruleset.rules):
        ruleset = ruleset + load_rules()
    targets = set(reported)
    producers = helper_producers(ruleset)
    shared = _Shared(ruleset, producers)
    verdicts = {r.name: RuleVerdict(r.name, r.location) for r in ruleset.rules}
    used_by: dict[str, set[str]] = {}  # facts-only rule -> readers whose instances ran it
    together: list[Rule] = []
    checked: list[str] = []
    for rule in ruleset.rules:
        if unions_nothing(rule) or rule.name not in targets:
            continue
        if set_tables(rule, producers):
            together.append(rule)
            continue
        checked.append(rule.name)
        _check_rule(ruleset, rule, shared, verdicts, used_by, instances, attempts, _rng(seed, rule.name))
    # rules that used all their attempts: forcing into them a producer that no other rule competes with would only
    # draw them again
    exhausted = {name for name in checked if verdicts[name].status != UNSOUND and verdicts[name].instances < instances}
    if together:
        _check_together(ruleset, together, shared, verdicts, instances, attempts, seed)
    read_by = readers(ruleset, producers)
    for rule in ruleset.rules:  # producers the readers' own instances left out or used too little
        if rule.name not in targets:
            continue
        for reader in read_by.get(rule.name, []):
            if verdicts[rule.name].instances >= instances:
                break
            if reader.name in exhausted and not _competes(rule, producers):
                continue
            _check_rule(ruleset, reader, shared, verdicts, used_by, instances, attempts,
                        _rng(seed, rule.name, reader.name), force=rule.name)
    for rule in ruleset.rules:
        v = verdicts[rule.name]
        if unions_nothing(rule) and v.status == NOT_CHECKABLE:
            through = sorted(used_by.get(rule.name, ()))
            if through and v.instances:
                v.status = SOUND
                v.reason = f"facts only: checked through the rules that read them ({', '.join(through)})"
            elif not v.reason:
                v.reason = "facts only, and no union rule that reads them fired on an instance"
        if folds := sorted(rule.builds & _DERIVED_WEIGHTS):
            v.weight_fold = True
            v.reason = v.reason or (f"weight fold: builds {', '.join(folds)} from parameters, judged with them as "
                                    "stored weights (finite; special values in the data only); optimize checks "
                                    "every fold on the model's stored weights")
    return SoundnessReport([verdicts[name] for name in reported])


def _competes(rule: Rule, producers: Producers) -> bool:
    """Whether another rule adds rows to a table ``rule`` adds rows to: only then does forcing ``rule`` into a
    reader's instances (unfolding it first) change what they are made of."""
    return any(rule.name in {p.name for p, _ in ps} and {p.name for p, _ in ps} != {rule.name}
               for ps in producers.values())


def _rng(seed: int, *names: str) -> np.random.Generator:
    """A generator keyed by ``seed`` and rule names (not their positions: a rule draws the same instances
    alone or among others)."""
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v if isinstance(v, int | float | str | bool) else str(v)


# --- running and judging an instance ----------------------------------------------------------


@dataclass
class _Outcome:
    fired: set[str]  # union rules that merged something
    matched: set[str]  # rules as written (base names) that matched at all, facts-only ones included
    # (rules that built or merged the wrong e-node, rules that wrote the helper rows they read, counter-example)
    wrong: list[tuple[tuple[str, ...], tuple[str, ...], CounterExample]]


def _schema_commands() -> list[Any]:
    """The parsed egglog commands of the schema and the stages' rulesets (any e-graph runs them)."""
    return eb.EGraph().parse_program(schema_text() + "\n".join(f"(ruleset {s})" for s in STAGES))


def _declarations(ruleset: RuleSet, text: str) -> list[Any]:
    """The parsed declarations of ``ruleset``'s provenance and helper tables, in order, but for the tables that
    egglog ``text`` (the rules and the graph an instance runs) never applies: such a table would stay empty, and
    nothing reads an undeclared one differently (the view takes it for empty), so the instance runs and reads
    back the same without it (a table applied but not declared is an egglog error, not a silent change)."""
    out = []
    for source, command in ruleset.provenance + ruleset.declarations:
        table = _DECLARED_TABLE.match(source)
        if table is None or f"({table[1]} " in text or f"({table[1]})" in text:
            out.append(command)
    return out


def _run_instance(graph: Graph, ruleset: RuleSet, seed: int, schema: list[Any]) -> _Outcome:
    """Saturate ``graph`` with ``ruleset`` on a new e-graph that ran ``schema`` (:func:`_schema_commands`) and
    check every e-node of every class the rules touched."""
    encoding = encode_graph(graph)
    egraph = eb.EGraph()
    egraph.run_program(*schema)
    egraph.run_program(*_declarations(ruleset, "\n".join([*(r.program_text for r in ruleset.rules), encoding.text])))
    egraph.run_program(*(c for r in ruleset.rules for c in r.program))
    egraph.run_program(*egraph.parse_program(encoding.text))
    leaves = tuple(f"{n.name}: {n.type}" for n in graph.nodes if n.kind is Kind.LEAF)
    try:
        matched = {name for name, n in saturate(egraph, ruleset, _LIMITS).matches_per_rule.items() if n}
    except RuleError as exc:  # a panic or a primitive without a value in its actions: the rules it names failed
        named = tuple(dict.fromkeys(r.base for r in ruleset.rules if f"rule {r.base!r} " in str(exc)
                                    or f"{r.base} ({r.location})" in str(exc)))
        return _Outcome(set(named), set(named), [(named, (), CounterExample(named[0] if named else "?", str(exc),
                                                                               leaves, {}))])
    view = build_view(egraph, graph, encoding.constants, ruleset, strict=False)
    fired = {name for c in view.classes for name in c.merged_by}
    wrong = [(m.rules, (), CounterExample(m.rules[0] if m.rules else "?", m.message, leaves, {}))
             for m in view.merged]
    wrong += [(t.rules, (), CounterExample(t.rules[0] if t.rules else "?", t.message, leaves, {}))
              for t in view.ill_typed]
    if not wrong:
        for param in _fold_operands(view, graph):  # a derived weight is only computed from stored weights
            graph.weights[param.name] = random_value(graph, param, seed)
        wrong = _compare_values(view, graph, leaves, seed)
    return _Outcome(fired, matched, wrong)


def _fold_operands(view: EGraphView, graph: Graph) -> list[Any]:
    """The parameters of ``graph`` that derived weights (weight-prep e-nodes) read, directly or through other
    derived weights."""
    found: dict[int, Any] = {}
    for n in view.nodes:
        if n.spec.kind is Kind.WEIGHT_PREP:
            for c in n.children:
                found.update((o, graph.node(o)) for o in view.classes[c].originals if graph.node(o).op == "Param")
    return list(found.values())


def _compare_values(view: EGraphView, graph: Graph, leaves: tuple[str, ...],
                    seed: int) -> list[tuple[tuple[str, ...], tuple[str, ...], CounterExample]]:
    """Every e-node of every class a rule touched against its class's value, on SEEDS seeds and then on the
    first again in special rounds with IEEE special values (-0.0, +-inf, NaN, subnormals, +-max) at a share of
    every float leaf, as many rounds as put every kind in every leaf of more than one element; where a leaf masks
    scores (:func:`_left_padded_masks`), once more with its first keys masked.

    The reach is the parity verifier's: the dtype tolerance plus ROUNDING_FACTOR
    times the input graph's own rounding error where the class holds an input-graph
    node (a fused kernel need not repeat the rounding of every unfused step); its
    excuses (decisions within reach of their boundary, what an overflow made
    inexact) and its judgement of zeros' signs.  On the special run magnitudes are
    the largest among what a value is computed from, and an e-node that computes
    its class's value with another op is not judged where it reads non-finite or
    near-largest values (see ``kernels/parity.py``).
    """
    touched = [c for c in view.classes if c.merged_by or any(view.nodes[i].built_by for i in c.nodes)]
    if not touched:  # no rule built or merged anything: no e-node to judge, no value to compute
        return []
    rtol, atol = PARITY_TOLERANCE[loosest(n.dtype for n in graph.nodes if not n.parts) or "f32"]
    precision, wide = precisions(graph), widened_graph(graph)
    everything = {n.id for n in graph.nodes}
    out = []
    rounds = special_rounds(n.type.numel for n in graph.nodes if n.op in ("Input", "Param")
                            and dtype(n.dtype).is_float)
    padded = _left_padded_masks(graph, seed)
    runs = [*((s, 0, {}) for s in range(seed, seed + SEEDS)), *([(seed, 0, padded)] if padded else []),
            *((seed, k, {}) for k in range(1, rounds + 1))]
    for s, special, feeds in runs:
        ref = Reference.build(graph, wide, s, precision, everything, feeds, special=special)
        node_values = ref.values
        values = _class_values(view, graph, node_values)
        largest = max(ref.magnitudes().values(), default=0.0) if special else 0.0
        for cls in touched:
            if cls.id not in values or isinstance(values[cls.id], tuple):  # a multi-result node: its Gets' classes
                continue
            value = values[cls.id]
            first = cls.originals[0] if cls.originals else None

            scale = (ref.magnitudes()[first] if first is not None else largest) if special else None
            rounding = ref.rounding.get(first, 0.0) if first is not None else 0.0

            def reach(r: np.ndarray = value, scale: float | None = scale, rounding: Any = rounding) -> np.ndarray:
                bound = atol + rtol * (np.abs(r.astype(np.float64)) if scale is None else scale)
                return bound + ROUNDING_FACTOR * rounding

            excused = ref.excused.get(first) if first is not None else None
            signless = partial(ref.sign_free, first) if first is not None else (lambda: True)
            for i in cls.nodes:  # input-graph e-nodes too: a rule may have merged two of them
                n = view.nodes[i]
                if n.original is not None:
                    got = node_values[n.original]
                elif n.op in ("Input", "Param") or any(c not in values for c in n.children):
                    continue
                else:
                    got = _run_enode(view, n, values)
                max_abs, ratio = tolerance_ratio(got, value, reach, excused, signless)
                if ratio > 1.0 and special and n.original is None and n.spec.kind is not Kind.LEAF \
                        and (first is None or graph.node(first).op != n.op):
                    args, types = [values[c] for c in n.children], [view.classes[c].type for c in n.children]
                    wide_reads = computed_from(n.spec, n.attrs, args, [t.dtype for t in types],
                                               view.classes[n.eclass].type, got)
                    if wide_reads is not None:
                        max_abs, ratio = tolerance_ratio(got, value, reach, wide_reads if excused is None
                                                         else excused | wide_reads, signless)
                if ratio > 1.0:
                    rules = tuple(dict.fromkeys(n.built_by + cls.merged_by))
                    writers = view.relied_on.get(cls.id, ())
                    how = ("a zero of the other sign" if max_abs == 0.0 else
                           f"up to {max_abs:.3g} ({ratio:.3g} x the {rtol}/{atol} tolerance plus rounding)")
                    problem = (f"a {n.op} e-node differs from its e-class's value (computed by "
                               f"{_describe_class(cls, graph)}) by {how} on seed {s}"
                               + (" with IEEE special values (-0.0, +-inf, NaN, subnormals, +-max) in its leaves "
                                  f"(round {special})" if special else "")
                               + (f" with the first keys of mask(s) {', '.join(feeds)} masked (the dtype's lowest: "
                                  "rows whose kept keys are all masked)" if feeds else "")
                               + f"; built or merged by {', '.join(rules)}"
                               + (f" on helper-relation rows written by {', '.join(writers)}" if writers else ""))
                    out.append((rules, writers, CounterExample(rules[0] if rules else "?", problem, leaves,
                                                               dict(n.attrs), max_abs)))
        if out:
            break
    return out


def _left_padded_masks(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Values for the float Inputs of ``graph`` added to scores on their way to a Softmax (masks, position
    biases): seed ``seed``'s, with the first half of the last axis (at least one element) the dtype's lowest, as
    a left-padded batch's mask.  With a causal mask the first queries then keep only masked keys: rows the other
    runs never draw, where a fill that ties with the mask decides the weights."""
    feeds = {}
    for leaf in graph.inputs:
        if not _masks_scores(graph, leaf.id):
            continue
        value = random_value(graph, leaf, seed)
        if value.ndim and value.dtype in (np.float16, np.float32, np.float64):
            value = value.copy()
            value[..., :max(1, value.shape[-1] // 2)] = np.finfo(value.dtype).min
            feeds[leaf.name] = value
    return feeds


def _masks_scores(graph: Graph, leaf: int) -> bool:
    """Whether ``leaf`` reaches a Softmax through an Add and only the ops of _MASK_PATH."""
    stack, seen = [(leaf, False)], set()
    while stack:
        nid, added = stack.pop()
        for user in graph.users(nid):
            op = graph.node(user).op
            if op == "Softmax" and added:
                return True
            if op in _MASK_PATH and (user, added or op == "Add") not in seen:
                seen.add((user, added or op == "Add"))
                stack.append((user, added or op == "Add"))
    return False


def _describe_class(cls: Any, graph: Graph) -> str:
    if cls.originals:
        return ", ".join(f"node {o} {graph.node(o).op}" for o in cls.originals)
    return "another e-node of the class"


def _run_enode(view: EGraphView, n: Any, values: dict[int, np.ndarray]) -> np.ndarray:
    types = [view.classes[c].type for c in n.children]
    return run_node(n.spec, n.attrs, [values[c] for c in n.children], [t.dtype for t in types],
                    view.classes[n.eclass].type)


def _class_values(view: EGraphView, graph: Graph, node_values: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Each class's value: its input-graph node's, else that of its first computable e-node."""
    values = {c.id: node_values[c.originals[0]] for c in view.classes if c.originals}
    changed = True
    while changed:
        changed = False
        for cls in view.classes:
            if cls.id in values:
                continue
            for i in cls.nodes:
                n = view.nodes[i]
                if n.op not in ("Input", "Param") and all(c in values for c in n.children):
                    values[cls.id] = _run_enode(view, n, values)
                    changed = True
                    break
    return values


# --- per rule ----------------------------------------------------------------------------------


class _Shared:
    """What every instance of one check reuses: the helper tables' producers, the parsed schema, each rule's base
    name and those of the shipped rules (see :func:`_judge`), and rules' queries with their helper relations unfolded
    (:func:`~rlx_egraph.rules.instances.unfold`) and prepared for drawing instances: once per query and choice
    of producers, however many draws use them."""

    def __init__(self, ruleset: RuleSet, producers: Producers) -> None:
        self.producers, self.schema = producers, _schema_commands()
        self.base_of = {r.name: r.base for r in ruleset.rules}
        self.shipped = _shipped_bases(ruleset)
        self._prepared: dict[tuple[str, int, tuple[int, ...]], Query] = {}

    def query(self, rule: Rule, attempt: int, counts: dict[str, float], used: set[str]) -> Query:
        """The query of ``rule``'s direction for ``attempt``, each helper relation unfolded by its least used
        producer (``counts`` updated, ``used`` filled); NoInstance when they nest too deep."""
        directions = queries(rule)
        index = attempt % len(directions)
        choices = tuple(choose_producers(directions[index], self.producers, counts, used))
        key = (rule.name, index, choices)
        if key not in self._prepared:
            self._prepared[key] = prepare(unfold(list(directions[index]), self.producers, iter(choices)))
        return self._prepared[key]


def _check_rule(ruleset: RuleSet, rule: Rule, shared: _Shared,
                verdicts: dict[str, RuleVerdict], used_by: dict[str, set[str]], instances: int, attempts: int,
                rng: np.random.Generator, force: str | None = None) -> None:
    """Draw instances of ``rule`` until it (or the producer ``force``, unfolded wherever it may be) has
    ``instances`` of them."""
    verdict = verdicts[rule.name]
    reasons: dict[str, int] = {}
    counts: dict[str, float] = {force: -math.inf} if force else {}  # the least used producer is unfolded first
    for attempt in range(attempts):
        if verdicts[force or rule.name].instances >= instances:
            break
        used: set[str] = set()
        try:
            graph = build_instance(shared.query(rule, attempt, counts, used), rng)
        except NoInstance as exc:
            reasons[str(exc)] = reasons.get(str(exc), 0) + 1
            continue
        subset = replace(ruleset, rules=[r for r in ruleset.rules if r.name == rule.name or r.name in used])
        if not _judge(_run_instance(graph, subset, attempt, shared.schema), {rule.name}, verdicts, shared):
            reasons["egglog did not fire the rule on the instance"] = reasons.get(
                "egglog did not fire the rule on the instance", 0) + 1
            continue
        for name in used:
            used_by.setdefault(name, set()).add(rule.name)
            verdicts[name].instances += 1
        if verdict.status == UNSOUND:
            return
    if verdict.status == NOT_CHECKABLE and verdict.instances:
        verdict.status = SOUND
    elif verdict.status == NOT_CHECKABLE:
        common = max(reasons, key=reasons.__getitem__) if reasons else "no attempt"
        verdict.reason = f"no random instance made it fire in {attempts} attempts (most often: {common})"


def _judge(outcome: _Outcome, checked: set[str], verdicts: dict[str, RuleVerdict], shared: _Shared) -> bool:
    """Record what one instance showed for the rules in ``checked`` (operand orders by their own names);
    False when none of them fired.  Provenance names base rules: each is mapped back to the orders checked.

    A wrong e-node is the fault of the rules that built or merged it, but where all of those are shipped rules and
    it rests on helper-relation rows that rules from outside the shipped set wrote: then of those writers (a wrong
    row a user rule added makes a shipped reader build a wrong value)."""
    base_of, shipped = shared.base_of, shared.shipped

    def orders(bases: set[str]) -> set[str]:
        named = {name for name in checked if base_of.get(name) in bases}
        return named or {b for b in bases if b in verdicts}

    fired = orders(outcome.fired)
    for rules, writers, example in outcome.wrong:
        suspects = [w for w in writers if w not in shipped]
        culprits = set(suspects if suspects and all(r in shipped for r in rules) else rules or ())
        if culprits != set(rules or ()):
            example = replace(example, rule=next(w for w in writers if w in culprits))
        for name in orders(culprits):
            if verdicts[name].status != UNSOUND:
                verdicts[name].status = UNSOUND
                verdicts[name].counterexample = example
        fired |= orders(culprits)
    for name in fired:
        verdicts[name].instances += 1
        if verdicts[name].status != UNSOUND:
            verdicts[name].status = SOUND
    return bool(fired)


def _shipped_bases(ruleset: RuleSet) -> frozenset[str]:
    """The base names of the rules of ``ruleset`` loaded from the shipped rule files."""
    outside = set(ruleset.outside_shipped())
    return frozenset(r.base for r in ruleset.rules if r.file not in outside)


def _check_together(ruleset: RuleSet, together: list[Rule], shared: _Shared,
                    verdicts: dict[str, RuleVerdict], instances: int, attempts: int, seed: int) -> None:
    """Rules that read tables filled with ``set``: k copies of the chain's first left side, whole files run."""
    producers = shared.producers
    files = {r.file for r in together}
    subset = replace(ruleset, rules=[r for r in ruleset.rules if r.file in files])
    roots = [r for r in subset.rules if unions_nothing(r) and not set_tables(r, producers)
             and not reads_relation(r, producers)
             and any(r.name in {p.name for p, _ in ps} for ps in producers.values())]
    rng = _rng(seed, *(r.name for r in together))
    reasons: dict[str, int] = {}
    for attempt in range(attempts):
        if not roots or all(verdicts[r.name].instances >= instances for r in together):
            break
        root = roots[attempt % len(roots)]
        head = next(a for a in root.actions if isinstance(a, Insert))
        first_input = set(variables(head.args[0]))
        k = int(rng.integers(2, 4))
        try:
            copies = [a for c in range(k) for a in fresh(list(root.query), f"c{c}", first_input)]
            graph = build_instance(prepare(copies), rng)
        except NoInstance as exc:
            reasons[str(exc)] = reasons.get(str(exc), 0) + 1
            continue
        outcome = _run_instance(graph, subset, attempt, shared.schema)
        if _judge(outcome, {r.name for r in together}, verdicts, shared):
            for r in subset.rules:
                if unions_nothing(r) and r.base in outcome.matched:
                    verdicts[r.name].instances += 1
                    verdicts[r.name].status = SOUND
    for r in subset.rules:
        v = verdicts[r.name]
        if unions_nothing(r) and v.status == SOUND:
            v.reason = "facts only: checked with the rules of its file on instances of k matmuls of one input"
        elif v.status == NOT_CHECKABLE and r in together and not v.reason:
            v.reason = (f"reads tables rules fill with set; no instance of k copies of "
                        f"{', '.join(x.name for x in roots) or 'a chain start'} made it fire")
