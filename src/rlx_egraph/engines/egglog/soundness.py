"""Rule soundness: every rule checked on random instances of its left side.

For each rule, :func:`check` builds random graphs that match its left side
(each constructor call a node, each ``Op`` variable an Input or Param leaf,
each attribute variable a random value of its sort; shapes, dtypes and values
that guards pin down are solved from the guards, the rest drawn until the
registry's shape rules and the guards accept them; an op with a registry
``sampler`` half the time takes its leaves' shapes and its attributes from a
sample whose dims are renamed to those of the inputs already built, so fused
ops such as FusedAttentionBlock can be built; ``?w = (Param ?n ?s ?dt)`` is a
leaf drawn with its reader, ``?s`` and ``?dt`` its shape and dtype), runs
only that rule in egglog (egglog decides whether the guards hold: an instance
counts when the rule fired), and
evaluates every e-node of every e-class the rules built or merged into with the
numpy kernels on two seeds.  A rule is *sound* when every such e-node computes
its class's value within the dtype tolerance and is well-typed, *unsound* with
a counter-example otherwise, or *not checkable* with the reason.

Helper relations: a rule that only adds facts is checked through the rules
that read its relation: a reader's relation facts are unfolded into the left
side of a producer (the least used one first), so the instance holds the
whole decomposed form and egglog runs the reader with its producers; a producer
(e.g. an operand order) with fewer instances than asked is then forced into the
instances of a reader that can unfold it, however deep.  Tables
that rules fill with ``set`` (the shared-input chain) cannot be unfolded: such
rules are checked together with the rest of their file on instances made of
k >= 2 copies of the chain's first left side sharing its first argument
(k matmuls of one input); a facts-only rule there counts an instance when egglog
reports it matched.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
from egglog import bindings as eb

from ...ir.dtypes import PARITY_TOLERANCE, dtype, loosest
from ...ir.graph import Graph, GraphError
from ...ir.ops.reference import run_node
from ...ir.registry import INDEX_DTYPE, REGISTRY, AttrType, Kind, ShapeError, TensorType
from ...kernels.interpreter import special_rounds
from ...kernels.parity import ROUNDING_FACTOR, Reference, computed_from, precisions, tolerance_ratio, widened_graph
from .encode import encode_graph
from .rules import STAGES, VARIANT_MARK, Rule, RuleSet, load_rules
from .saturate import SaturationLimits, saturate
from .schema import FACT_TABLES, LIST_CONS, LIST_NIL, NO_INPUT, constructor_args, schema_text
from .view import EGraphView, build_view

SOUND, UNSOUND, NOT_CHECKABLE = "sound", "unsound", "not checkable"
SEEDS = 2  # seeds each instance is evaluated on
_FLOATS = ("f32", "f32", "f16", "bf16")  # instance dtypes (f32 twice as likely)
_LIMITS = SaturationLimits(max_iterations=12, max_enodes=20_000, max_seconds=20.0)
_SPAN = eb.PanicSpan()
TERM_RETRIES = 60  # draws of one term before it gives up
DEGENERATE_RETRIES = 12  # draws of one term its op calls degenerate (OpSpec.degenerate) before one is kept
MAX_TERM_DRAWS = 600  # draws of all terms of one instance (retries of nested terms multiply)


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
    reason: str = ""  # why not checkable, or how a facts-only rule was checked
    counterexample: CounterExample | None = None

    def to_dict(self) -> dict:
        return {"rule": self.rule, "location": self.location, "status": self.status, "instances": self.instances,
                "reason": self.reason,
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


class _Unknown(Exception):
    """An expression depends on something not built or bound yet."""


class _Reject(Exception):
    """This random instance does not satisfy the left side: draw another."""


class _Degenerate(Exception):
    """This term's dims leave a parameter of its op without effect (``OpSpec.degenerate``): draw it again."""


def check(rules: RuleSet | Any = None, instances: int = 3, attempts: int = 80, seed: int = 0) -> SoundnessReport:
    """Check every rule of ``rules`` (a RuleSet, rule files/folders, or None for the shipped rules).

    Each rule gets up to ``attempts`` random draws to find ``instances`` on which it fires, drawn by a
    generator keyed by ``seed`` and the rule's name: a rule gets the same instances whatever other rules are
    checked with it (those whose helper relations it reads take part in its instances).
    The same rules, ``instances``, ``attempts`` and ``seed`` give the same report.
    """
    ruleset = load_rules(rules)
    producers = _producers(ruleset)
    verdicts = {r.name: RuleVerdict(r.name, r.location) for r in ruleset.rules}
    used_by: dict[str, set[str]] = {}  # facts-only rule -> readers whose instances ran it
    together: list[Rule] = []
    for rule in ruleset.rules:
        if _facts_only(rule):
            continue
        if _set_tables(rule, producers):
            together.append(rule)
            continue
        _check_rule(ruleset, rule, producers, verdicts, used_by, instances, attempts, _rng(seed, rule.name))
    if together:
        _check_together(ruleset, together, producers, verdicts, instances, attempts, seed)
    for rule in ruleset.rules:  # producers the readers' own instances left out or used too little
        for reader in _readers(ruleset, producers, rule):
            if verdicts[rule.name].instances >= instances:
                break
            _check_rule(ruleset, reader, producers, verdicts, used_by, instances, attempts,
                        _rng(seed, rule.name, reader.name), force=rule.name)
    for rule in ruleset.rules:
        v = verdicts[rule.name]
        if _facts_only(rule) and v.status == NOT_CHECKABLE:
            readers = sorted(used_by.get(rule.name, ()))
            if readers and v.instances:
                v.status = SOUND
                v.reason = f"facts only: checked through the rules that read them ({', '.join(readers)})"
            elif not v.reason:
                v.reason = "facts only, and no union rule that reads them fired on an instance"
    return SoundnessReport([verdicts[r.name] for r in ruleset.rules])


def _rng(seed: int, *names: str) -> np.random.Generator:
    """A generator keyed by ``seed`` and rule names (not their positions: a rule draws the same instances
    alone or among others)."""
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


# --- parsed rules ----------------------------------------------------------------------


def _facts_only(rule: Rule) -> bool:
    """A rule whose actions add facts but union nothing."""
    if type(rule.command).__name__ != "RuleCommand":
        return False
    return not any(type(a).__name__ == "Union" for a in rule.command.rule.head)


def _producers(ruleset: RuleSet) -> dict[str, list[tuple[Rule, Any]]]:
    """Helper table -> (rule, head action) for every rule action that adds a row to it."""
    out: dict[str, list[tuple[Rule, Any]]] = {}
    for rule in ruleset.rules:
        if type(rule.command).__name__ != "RuleCommand":
            continue
        for action in rule.command.rule.head:
            kind = type(action).__name__
            if kind == "Expr_" and type(action.expr).__name__ == "Call" and action.expr.name not in REGISTRY:
                out.setdefault(action.expr.name, []).append((rule, action))
            elif kind == "Set" and action.lhs not in FACT_TABLES:
                out.setdefault(action.lhs, []).append((rule, action))
    return out


def _readers(ruleset: RuleSet, producers: dict[str, list[tuple[Rule, Any]]], rule: Rule) -> list[Rule]:
    """The union rules whose left side, unfolded, can hold the left side of the facts-only ``rule``
    (not those that read tables filled with ``set``: they are checked together)."""
    if not _facts_only(rule) or _set_tables(rule, producers):
        return []

    def fills(r: Rule) -> set[str]:
        return {t for t, ps in producers.items() if any(p.name == r.name for p, _ in ps)}

    tables, seen, out = fills(rule), {rule.name}, []
    changed = True
    while changed:
        changed = False
        for r in ruleset.rules:
            reads = {c.name for body in _bodies(r) for f in body for e in _fact_exprs(f) for c in _calls(e)}
            if r.name in seen or not reads & tables or _set_tables(r, producers):
                continue
            seen.add(r.name)
            changed = True
            if _facts_only(r):
                tables |= fills(r)
            else:
                out.append(r)
    return out


def _calls(expr: Any) -> Iterable[Any]:
    if type(expr).__name__ == "Call":
        yield expr
        for a in expr.args:
            yield from _calls(a)


def _fact_exprs(fact: Any) -> list[Any]:
    return [fact.left, fact.right] if type(fact).__name__ == "Eq" else [fact.expr]


def _set_tables(rule: Rule, producers: dict[str, list[tuple[Rule, Any]]]) -> set[str]:
    """Tables filled with ``set`` by rules that ``rule`` reads (or, for a facts-only rule, fills)."""
    body = rule.command.rule.body if type(rule.command).__name__ == "RuleCommand" else rule.command.rewrite.conditions
    set_filled = {t for t, ps in producers.items() if any(type(a).__name__ == "Set" for _, a in ps)}
    return {c.name for f in body for e in _fact_exprs(f) for c in _calls(e) if c.name in set_filled}


def _bodies(rule: Rule) -> list[list[Any]]:
    """The facts of each direction of ``rule`` (a rewrite's root is ``?rewrite-root``)."""
    return [list(p.rule.body) for p in rule.program]


def _literals(rule_facts: list[Any]) -> dict[str, list[Any]]:
    """Literals of the left side by sort, to draw attribute values from (a guard ``?c ~ 1.414`` needs 1.414)."""
    out: dict[str, list[Any]] = {"i64": [], "f64": [], "String": []}
    stack = [e for f in rule_facts for e in _fact_exprs(f)]
    while stack:
        e = stack.pop()
        kind = type(e).__name__
        if kind == "Call":
            stack.extend(e.args)
        elif kind == "Lit":
            lit = type(e.value).__name__
            sort = {"Int": "i64", "Float": "f64", "String": "String"}.get(lit)
            if sort:
                out[sort].append(e.value.value)
    return out


def _rename(expr: Any, subst: dict[str, Any]) -> Any:
    kind = type(expr).__name__
    if kind == "Var":
        return subst.get(expr.name, expr)
    if kind == "Call":
        return eb.Call(_SPAN, expr.name, [_rename(a, subst) for a in expr.args])
    return expr


def _rename_fact(fact: Any, subst: dict[str, Any]) -> Any:
    if type(fact).__name__ == "Eq":
        return eb.Eq(_SPAN, _rename(fact.left, subst), _rename(fact.right, subst))
    return eb.Fact(_rename(fact.expr, subst))


def _vars(expr: Any) -> set[str]:
    kind = type(expr).__name__
    if kind == "Var":
        return {expr.name}
    if kind == "Call":
        return set().union(*map(_vars, expr.args)) if expr.args else set()
    return set()


def _fresh(facts: list[Any], tag: str, keep: set[str] = frozenset()) -> list[Any]:
    """``facts`` with every variable not in ``keep`` renamed apart (suffix ``tag``)."""
    names = {v for f in facts for e in _fact_exprs(f) for v in _vars(e)} - set(keep)
    subst = {v: eb.Var(_SPAN, f"{v}#{tag}") for v in names}
    return [_rename_fact(f, subst) for f in facts]


def _unfold(facts: list[Any], producers: dict[str, list[tuple[Rule, Any]]], counts: dict[str, int],
            used: set[str], depth: int = 0) -> list[Any]:
    """Replace each helper-relation fact by the left side of a producer of that row (the least used one)."""
    out: list[Any] = []
    for f in facts:
        expr = f.expr if type(f).__name__ == "Fact" else None
        if expr is None or type(expr).__name__ != "Call" or expr.name not in producers:
            out.append(f)
            continue
        if depth > 8:
            raise _Reject(f"helper relation {expr.name} nests too deep")
        options = producers[expr.name]  # the least used so far first, so every producer gets its turn
        rule, action = min(options, key=lambda o: (counts.get(o[0].name, 0), options.index(o)))
        counts[rule.name] = counts.get(rule.name, 0) + 1
        used.add(rule.name)
        tag = f"{depth}.{len(out)}.{len(used)}"
        body = _fresh([*list(rule.command.rule.body), eb.Fact(action.expr)], tag)
        *body, head = body
        subst: dict[str, Any] = {}
        for produced, read in zip(head.expr.args, expr.args, strict=True):
            if type(produced).__name__ == "Var" and produced.name not in subst:
                subst[produced.name] = read
            else:
                out.append(eb.Eq(_SPAN, _rename(produced, subst), read))
        out.extend(_unfold([_rename_fact(b, subst) for b in body], producers, counts, used, depth + 1))
    return out


# --- building an instance ------------------------------------------------------------------


def _merge_defs(facts: list[Any]) -> list[Any]:
    """Unify two definitions of one variable by the same constructor (a join two unfoldings share)."""
    while True:
        defs: dict[str, Any] = {}
        for k, f in enumerate(facts):
            if type(f).__name__ != "Eq" or type(f.left).__name__ != "Var" or not _is_op_call(f.right):
                continue
            if f.left.name not in defs:
                defs[f.left.name] = f.right
                continue
            subst: dict[str, Any] = {}
            if _unify(defs[f.left.name], f.right, subst):
                facts = [_rename_fact(g, subst) for j, g in enumerate(facts) if j != k]
                break
        else:
            return facts


def _unify(a: Any, b: Any, subst: dict[str, Any]) -> bool:
    """Extend ``subst`` (variables of ``b`` -> parts of ``a``) so ``b`` reads as ``a``; False if it cannot."""
    if type(b).__name__ == "Var":
        if b.name in subst:
            return str(subst[b.name]) == str(a)
        subst[b.name] = a
        return True
    if type(a).__name__ == "Call" and type(b).__name__ == "Call":
        return a.name == b.name and len(a.args) == len(b.args) and all(
            _unify(x, y, subst) for x, y in zip(a.args, b.args, strict=True))
    return str(a) == str(b)


# The primitives a guard may call, as the instances' values evaluate them.
_PRIMITIVES: dict[str, Callable[..., Any]] = {
    "vec-of": lambda *v: tuple(v), "vec-empty": lambda: (), "vec-length": len,
    "vec-get": lambda v, i: v[i], "vec-set": lambda v, i, x: (*v[:i], x, *v[i + 1:]),
    "+": lambda a, b: a + b, "-": lambda a, b=None: -a if b is None else a - b,
    "*": lambda a, b: a * b, "/": lambda a, b: a / b if isinstance(a, float) else a // b,
    "abs": abs, "max": max, "min": min, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "!=": lambda a, b: a != b,
    "=": lambda a, b: a == b}


class _Builder:
    """Random graph for a list of facts: term definitions become nodes, guards are solved or checked."""

    def __init__(self, facts: list[Any], rng: np.random.Generator, literals: dict[str, list[Any]]) -> None:
        self.rng, self.literals = rng, literals
        self.graph = Graph("instance")
        self.dtype = _FLOATS[int(rng.integers(len(_FLOATS)))]
        self.env: dict[str, Any] = {}  # var -> node id (Op), list of node ids (TensorList) or value
        self.leaf_shape: dict[str, tuple[int, ...]] = {}
        self.leaf_dtype: dict[str, str] = {}
        self.defs: dict[str, Any] = {}
        self.guards: list[Any] = []
        self.sorts: dict[str, str] = {}
        facts = _merge_defs(facts)
        for f in facts:
            if type(f).__name__ == "Eq" and type(f.left).__name__ == "Var" and _is_op_call(f.right) \
                    and f.left.name not in self.defs:
                self.defs[f.left.name] = f.right
            elif type(f).__name__ == "Eq" and type(f.right).__name__ == "Var" and _is_op_call(f.left) \
                    and f.right.name not in self.defs:
                self.defs[f.right.name] = f.left
            else:
                self.guards.append(f)
            for e in _fact_exprs(f):
                self._sort_vars(e)
        for v in self.defs:
            self.sorts[v] = "Op"
        self.draws = 0  # term draws of this instance (at most MAX_TERM_DRAWS)
        self.leaf_op: dict[str, str] = {}  # var defined as an Input/Param term -> that op
        self.leaf_name: dict[str, Any] = {}  # such a var -> its name argument (a literal or a variable)
        self._leaf_defs()
        self.targets = {e.args[0].name for g in self.guards for e in _fact_exprs(g)
                        if type(e).__name__ == "Call" and e.name in ("shape", "dtype")
                        and type(e.args[0]).__name__ == "Var"}
        self.targets |= {e.name for g in self.guards if type(g).__name__ == "Eq"
                         for e in (g.left, g.right) if type(e).__name__ == "Var"}
        self.names = itertools.count()

    def _leaf_defs(self) -> None:
        """Make ``?w = (Param ?n ?s ?dt)`` (or Input) a leaf drawn with the term that reads it: ``?s`` and
        ``?dt`` stand for ``(shape ?w)`` and ``(dtype ?w)`` everywhere; a literal or reused one becomes a guard."""
        subst: dict[str, Any] = {}
        pinned: list[Any] = []
        for var, expr in list(self.defs.items()):
            if REGISTRY[expr.name].kind is not Kind.LEAF or "name" not in REGISTRY[expr.name].attr_names:
                continue
            del self.defs[var]
            self.leaf_op[var] = expr.name
            for arg, a in zip(constructor_args(REGISTRY[expr.name]), expr.args, strict=True):
                if arg.name == "name":
                    self.leaf_name[var] = a
                    continue
                of_leaf = eb.Call(_SPAN, arg.name, [eb.Var(_SPAN, var)])
                if type(a).__name__ == "Var" and a.name not in subst and a.name not in self.defs:
                    subst[a.name] = of_leaf
                else:
                    pinned.append(eb.Eq(_SPAN, of_leaf, a))
        if not self.leaf_op:
            return
        self.guards = [_rename_fact(g, subst) for g in [*self.guards, *pinned]]
        self.defs = {v: _rename(e, subst) for v, e in self.defs.items()}

    def _sort_vars(self, expr: Any) -> None:
        if type(expr).__name__ != "Call":
            return
        if expr.name in REGISTRY:
            sorts = [a.sort for a in constructor_args(REGISTRY[expr.name])]
        elif expr.name == LIST_CONS:
            sorts = ["Op", "TensorList"]
        elif expr.name in ("shape", "dtype", "param-order"):
            sorts = ["Op"]
        else:
            sorts = []
        for a, sort in zip(expr.args, sorts, strict=False):
            if type(a).__name__ == "Var":
                self.sorts.setdefault(a.name, sort)
        for a in expr.args:
            self._sort_vars(a)

    # -- evaluation of guard expressions --

    def value(self, expr: Any) -> Any:
        kind = type(expr).__name__
        if kind == "Lit":
            return expr.value.value if type(expr.value).__name__ != "Unit" else None
        if kind == "Var":
            if expr.name not in self.env:
                raise _Unknown(expr.name)
            return self.env[expr.name]
        args = expr.args
        name = expr.name
        if name in ("shape", "dtype") and type(args[0]).__name__ == "Var" and args[0].name not in self.env:
            table = self.leaf_shape if name == "shape" else self.leaf_dtype
            if args[0].name in table:  # a leaf not built yet whose type is drawn or solved
                return table[args[0].name]
        if name in ("shape", "dtype", "param-order"):
            node = self.graph.node(self.value(args[0]))
            if name == "shape":
                return node.shape
            if name == "dtype":
                return node.dtype
            if node.op != "Param":
                raise _Reject("param-order of a non-Param")
            return [n.id for n in self.graph.params].index(node.id)
        if name == "attention-block-max-tokens":
            return 64
        if name == "inverse-perms":
            p, q = (tuple(self.value(a)) for a in args)
            return len(p) == len(q) and all(q[p[i]] == i for i in range(len(p)))
        vals = [self.value(a) for a in args]
        if name not in _PRIMITIVES:
            raise _Reject(f"cannot evaluate {name}")
        try:
            return _PRIMITIVES[name](*vals)
        except (IndexError, ZeroDivisionError, TypeError) as exc:
            raise _Reject(f"{name}: {exc}") from None

    def _known(self, expr: Any) -> tuple[bool, Any]:
        try:
            return True, self.value(expr)
        except _Unknown:
            return False, None

    def _assign(self, expr: Any, value: Any) -> bool:
        """Make ``expr`` (a free variable, or the shape/dtype of an unbuilt leaf) equal ``value``."""
        kind = type(expr).__name__
        if kind == "Var" and expr.name not in self.env and expr.name not in self.defs:
            if self.sorts.get(expr.name) == "Op":
                return False
            self.env[expr.name] = value
            return True
        if kind == "Call" and expr.name in ("shape", "dtype") and type(expr.args[0]).__name__ == "Var":
            var = expr.args[0].name
            table = self.leaf_shape if expr.name == "shape" else self.leaf_dtype
            if var not in self.env and var not in table:
                table[var] = tuple(value) if expr.name == "shape" else value
                return True
        return False

    def solve_guards(self, final: bool = False) -> bool:
        progress = False
        for g in self.guards:
            if type(g).__name__ == "Eq":
                (lk, lv), (rk, rv) = self._known(g.left), self._known(g.right)
                if lk and rk:
                    if _tuple(lv) != _tuple(rv):
                        raise _Reject(f"guard {g} does not hold")
                elif lk:
                    progress |= self._assign(g.right, lv)
                elif rk:
                    progress |= self._assign(g.left, rv)
            else:
                progress |= self._solve_fact(g.expr)
                ok, holds = self._known(g.expr)
                if ok and holds is False:
                    raise _Reject(f"guard {g} does not hold")
        return progress

    def _solve_fact(self, expr: Any) -> bool:
        """Solve the guards that pin a free variable: ``(< (abs (- ?c L)) eps)`` and ``(inverse-perms ?p ?q)``."""
        args = expr.args
        if expr.name == "<" and type(args[0]).__name__ == "Call" and args[0].name == "abs" \
                and type(args[0].args[0]).__name__ == "Call" and args[0].args[0].name == "-":
            var, target = args[0].args[0].args
            known, value = self._known(target)
            return known and self._assign(var, value)
        if expr.name == "inverse-perms":
            known, p = self._known(args[0])
            return known and self._assign(args[1], tuple(sorted(range(len(p)), key=p.__getitem__)))
        return False

    # -- building terms --

    def build(self) -> Graph:
        pending = list(self.defs)
        while pending:
            self.solve_guards()
            ready = [v for v in pending if self._ready(self.defs[v], strict=True)]
            if not ready:
                ready = [v for v in pending if self._ready(self.defs[v], strict=False)][:1]
            if not ready:
                raise _Reject("the term definitions are cyclic")
            for v in ready:
                self.env[v] = self.term(self.defs[v])
                pending.remove(v)
        self.solve_guards(final=True)
        users = {i for n in self.graph.nodes for i in n.inputs}
        self.graph.set_outputs([n.id for n in self.graph.nodes if n.id not in users and n.kind is not Kind.LEAF])
        if not self.graph.outputs:
            raise _Reject("the left side computes nothing")
        return self.graph

    def _ready(self, expr: Any, strict: bool) -> bool:
        """All defined children built; with ``strict``, no leaf or attribute waits for a guard either."""
        kind = type(expr).__name__
        if kind == "Var":
            name = expr.name
            if name in self.env:
                return True
            if name in self.defs:
                return False
            return not (strict and name in self.targets)
        if kind == "Call":
            return all(self._ready(a, strict) for a in expr.args)
        return True

    def term(self, expr: Any) -> int:
        """Build a constructor call (its undefined leaves and free attributes drawn until it is valid)."""
        if type(expr).__name__ == "Var":
            return self.leaf(expr.name, None)
        spec = REGISTRY[expr.name]
        args = constructor_args(spec)
        degenerate = 0  # draws rejected as degenerate: past DEGENERATE_RETRIES the rule may need one (a literal)
        for _ in range(TERM_RETRIES):
            self.draws += 1
            if self.draws > MAX_TERM_DRAWS:  # nested retries multiply: a deep pattern gives up, not hangs
                raise _Reject(f"no instance within {MAX_TERM_DRAWS} term draws")
            saved = dict(self.env), dict(self.leaf_shape), dict(self.leaf_dtype)
            try:
                return self._try_term(expr, spec, args, degenerate < DEGENERATE_RETRIES)
            except _Degenerate as exc:
                degenerate += 1
                last = exc
                self.env, self.leaf_shape, self.leaf_dtype = saved
            except (ShapeError, GraphError, _Unknown, _Reject) as exc:
                last = exc
                self.env, self.leaf_shape, self.leaf_dtype = saved
        raise _Reject(f"no valid {expr.name}: {last}")

    def _try_term(self, expr: Any, spec: Any, args: list[Any], informative: bool = False) -> int:
        """One draw of ``expr``'s term; ``informative``: refuse dims its op calls degenerate (_Degenerate)."""
        free_leaves: list[str] = []
        drawn: dict[str, Any] = {}
        inputs: list[Any] = []  # node id, or (var, type) of a leaf to create
        attrs: dict[str, Any] = {}
        kinds = {a.name: a for a in spec.attrs}
        named: list[tuple[str, Any]] = []  # (input name, item) of the non-variadic inputs
        for arg, a in zip(args, expr.args, strict=True):
            if arg.is_input:
                for item in self._input_items(a, arg.variadic):
                    if isinstance(item, str) and item not in self.env:
                        free_leaves.append(item)
                    inputs.append(item)
                    if not arg.variadic:
                        named.append((arg.name, item))
        types: dict[str, TensorType] = {}
        free_leaves = [v for v in dict.fromkeys(free_leaves) if v not in self.env]  # not built by a nested term
        sampled, sampled_attrs = self._sampled(spec, named) if spec.sampler and self.rng.random() < 0.5 else ({}, {})
        for arg, a in zip(args, expr.args, strict=True):
            if not arg.is_input and arg.name in sampled_attrs and type(a).__name__ == "Var" and a.name not in self.env:
                drawn.setdefault(a.name, sampled_attrs[arg.name])
        for var in free_leaves:  # each drawn shape goes through the guards to the next leaves
            self.leaf_shape.setdefault(var, sampled[var] if var in sampled else self._draw_shape())
            self.solve_guards()
        index_leaves = {item for name, item in named if name in spec.index_inputs}  # integer ids
        for var in dict.fromkeys(free_leaves):
            types[var] = TensorType(self.leaf_shape[var], INDEX_DTYPE if var in index_leaves
                                    else self.leaf_dtype.get(var, self.dtype))
        in_types = [types[i] if isinstance(i, str) and i in types else self.graph.node(self._id(i)).type
                    for i in inputs]
        for arg, a in zip(args, expr.args, strict=True):
            if not arg.is_input:
                attrs[arg.name] = self._attr(a, kinds[arg.name], drawn, in_types)
        canonical, _ = spec.resolve(attrs, in_types)
        if informative and spec.degenerate is not None and (why := spec.degenerate(canonical, in_types)):
            raise _Degenerate(why)
        if spec.kind is Kind.WEIGHT_PREP and any(isinstance(i, int) and self.graph.node(i).op != "Param"
                                                 for i in inputs):
            raise ShapeError("weight preparation reads parameters only")
        for var, t in types.items():
            self.env[var] = self._leaf_node(var, t, param=spec.kind is Kind.WEIGHT_PREP or
                                            (spec.kind is Kind.MATMUL and self.rng.random() < 0.3))
        self.env.update(drawn)
        self.solve_guards()  # a guard the drawn attributes or leaves break: draw this term again
        return self.graph.add_node(spec.name, [self._id(i) for i in inputs], **attrs)

    def _sampled(self, spec: Any, named: list[tuple[str, Any]]) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
        """Shapes of the free leaves among ``named`` inputs and attribute values from the op's registry sampler,
        the sample's dims renamed to those of the inputs already built; nothing when they do not fit."""
        shapes, attrs = spec.sampler(self.rng)
        dims: dict[int, int] = {}
        free: dict[str, tuple[int, ...]] = {}
        for name, item in named:
            sample = shapes.get(name)
            if isinstance(item, str) and item not in self.env and item not in self.leaf_shape:
                if sample is not None:
                    free[item] = tuple(sample)
                continue
            actual = self.leaf_shape[item] if isinstance(item, str) and item not in self.env \
                else self.graph.node(self._id(item)).shape
            if sample is None or len(sample) != len(actual) \
                    or any(dims.setdefault(d, a) != a for d, a in zip(sample, actual, strict=True)):
                return {}, {}
        return {v: tuple(dims.get(d, d) for d in shape) for v, shape in free.items()}, attrs

    def _id(self, item: Any) -> int:
        return self.env[item] if isinstance(item, str) else item

    def _input_items(self, expr: Any, variadic: bool) -> list[Any]:
        kind = type(expr).__name__
        if kind == "Var":
            if variadic:  # a TensorList variable: a random tail of 0 to 2 leaves
                if expr.name not in self.env:
                    self.env[expr.name] = [f"{expr.name}[{k}]" for k in range(int(self.rng.integers(3)))]
                return list(self.env[expr.name])
            return [expr.name]
        if expr.name == NO_INPUT:
            return []
        if expr.name == LIST_NIL:
            return []
        if expr.name == LIST_CONS:
            return self._input_items(expr.args[0], False) + self._input_items(expr.args[1], True)
        return [self.term(expr)]

    def _attr(self, expr: Any, attr: Any, drawn: dict[str, Any], in_types: list[TensorType]) -> Any:
        if type(expr).__name__ == "Var" and expr.name not in self.env:
            if expr.name not in drawn:
                drawn[expr.name] = self._draw_attr(attr, in_types[0].rank if in_types else 0)
            value = drawn[expr.name]
        else:
            value = self.value(expr)
        return _attr_value(value, attr.type)

    def _draw_attr(self, attr: Any, rank: int) -> Any:
        """A random value for ``attr`` of a node whose first input has rank ``rank``."""
        rng, t = self.rng, attr.type
        if attr.name == "name":
            return f"v{next(self.names)}"
        if t is AttrType.DTYPE:
            return self.dtype
        if attr.choices and rng.random() < 0.7:
            return attr.choices[int(rng.integers(len(attr.choices)))]
        if t is AttrType.INT:
            dims = [d for n in self.graph.nodes for d in n.shape]
            pool = [-1, -1, -2, 0, 1, 2, *self.literals["i64"], *dims]
            return int(pool[int(rng.integers(len(pool)))])
        if t is AttrType.FLOAT:
            pool = self.literals["f64"]
            if pool and rng.random() < 0.5:
                return float(pool[int(rng.integers(len(pool)))])
            return float(10.0 ** rng.uniform(-3.0, 0.0)) if rng.random() < 0.5 else float(rng.uniform(0.1, 2.0))
        if t is AttrType.BOOL:
            return bool(rng.integers(2))
        if t is AttrType.INTS:
            return self._draw_perm(rank) if rng.random() < 0.5 else self._draw_shape()
        if t is AttrType.STR:
            pool = self.literals["String"] or [attr.default]
            return pool[int(rng.integers(len(pool)))]
        raise _Reject(f"no random value for attribute {attr.name} ({t.value})")

    def _draw_perm(self, rank: int) -> tuple[int, ...]:
        """A permutation of ``rank`` axes; half the time from rank 3 on one that is not its own inverse (a
        rule that takes a perm for its inverse is right on the others)."""
        perm = tuple(int(a) for a in self.rng.permutation(rank))
        if rank >= 3 and self.rng.random() < 0.5:
            while all(perm[p] == k for k, p in enumerate(perm)):
                perm = tuple(int(a) for a in self.rng.permutation(rank))
        return perm

    def _draw_shape(self) -> tuple[int, ...]:
        """A random shape: often one of (a suffix of) a shape already built, so joins and broadcasts meet."""
        rng = self.rng
        built = [n.shape for n in self.graph.nodes if n.shape]
        if built and rng.random() < 0.6:
            shape = built[int(rng.integers(len(built)))]
            return shape[int(rng.integers(len(shape))):] if rng.random() < 0.3 else shape
        return tuple(int(d) for d in rng.integers(1, 5, size=(1, 2, 2, 3, 3, 4)[int(rng.integers(6))]))

    def leaf(self, var: str, param: bool | None) -> int:
        if var not in self.env:
            t = TensorType(self.leaf_shape.get(var) or self._draw_shape(), self.leaf_dtype.get(var, self.dtype))
            self.env[var] = self._leaf_node(var, t, bool(param))
        return self.env[var]

    def _leaf_node(self, var: str, t: TensorType, param: bool) -> int:
        param = self.leaf_op[var] == "Param" if var in self.leaf_op else param
        name = f"{'w' if param else 'x'}{next(self.names)}"
        given = self.leaf_name.get(var)
        if given is not None and type(given).__name__ == "Lit":
            name = given.value.value
        node = self.graph.param(name, t.shape, t.dtype) if param else self.graph.input(name, t.shape, t.dtype)
        if given is not None and type(given).__name__ == "Var":
            self.env.setdefault(given.name, name)
        return node


def _is_op_call(expr: Any) -> bool:
    return type(expr).__name__ == "Call" and expr.name in REGISTRY


def _tuple(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _attr_value(value: Any, kind: AttrType) -> Any:
    if kind is AttrType.INTS:
        return tuple(value)
    if kind is AttrType.FLOAT:
        return float(value)
    return value


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v if isinstance(v, int | float | str | bool) else str(v)


# --- running and judging an instance ----------------------------------------------------------


@dataclass
class _Outcome:
    fired: set[str]  # union rules that merged something
    matched: set[str]  # rules as written (base names) that matched at all, facts-only ones included
    wrong: list[tuple[tuple[str, ...], CounterExample]]  # (blamed rules, counter-example)


def _run_instance(graph: Graph, ruleset: RuleSet, seed: int) -> _Outcome:
    """Saturate ``graph`` with ``ruleset`` and check every e-node of every class the rules touched."""
    encoding = encode_graph(graph)
    egraph = eb.EGraph()
    egraph.run_program(*egraph.parse_program(schema_text() + "\n".join(f"(ruleset {s})" for s in STAGES)))
    egraph.run_program(*ruleset.commands())
    egraph.run_program(*egraph.parse_program(encoding.text))
    matched = {name for name, n in saturate(egraph, ruleset, _LIMITS).matches_per_rule.items() if n}
    view = build_view(egraph, graph, encoding.constants, ruleset, strict=False)
    fired = {name for c in view.classes for name in c.merged_by}
    leaves = tuple(f"{n.name}: {n.type}" for n in graph.nodes if n.kind is Kind.LEAF)
    wrong = [(m.rules, CounterExample(m.rules[0] if m.rules else "?", m.message, leaves, {}))
             for m in view.merged]
    wrong += [(t.rules, CounterExample(t.rules[0] if t.rules else "?", t.message, leaves, {}))
              for t in view.ill_typed]
    if not wrong:
        wrong = _compare_values(view, graph, leaves, seed)
    return _Outcome(fired, matched, wrong)


def _compare_values(view: EGraphView, graph: Graph, leaves: tuple[str, ...],
                    seed: int) -> list[tuple[tuple[str, ...], CounterExample]]:
    """Every e-node of every class a rule touched against its class's value, on SEEDS seeds and then on the
    first again in special rounds with IEEE special values (-0.0, +-inf, NaN, subnormals, +-max) at a share of
    every float leaf, as many rounds as put every kind in every leaf of more than one element.

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
    rtol, atol = PARITY_TOLERANCE[loosest(n.dtype for n in graph.nodes if not n.parts) or "f32"]
    precision, wide = precisions(graph), widened_graph(graph)
    everything = {n.id for n in graph.nodes}
    out = []
    rounds = special_rounds(n.type.numel for n in graph.nodes if n.op in ("Input", "Param")
                            and dtype(n.dtype).is_float)
    for s, special in [*((s, 0) for s in range(seed, seed + SEEDS)), *((seed, k) for k in range(1, rounds + 1))]:
        ref = Reference.build(graph, wide, s, precision, everything, special=special)
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
                    how = ("a zero of the other sign" if max_abs == 0.0 else
                           f"up to {max_abs:.3g} ({ratio:.3g} x the {rtol}/{atol} tolerance plus rounding)")
                    problem = (f"a {n.op} e-node differs from its e-class's value (computed by "
                               f"{_describe_class(cls, graph)}) by {how} on seed {s}"
                               + (" with IEEE special values (-0.0, +-inf, NaN, subnormals, +-max) in its leaves "
                                  f"(round {special})" if special else "") + f"; built or merged by {', '.join(rules)}")
                    out.append((rules, CounterExample(rules[0] if rules else "?", problem, leaves,
                                                      dict(n.attrs), max_abs)))
        if out:
            break
    return out


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


def _check_rule(ruleset: RuleSet, rule: Rule, producers: dict[str, list[tuple[Rule, Any]]],
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
        bodies = _bodies(rule)
        body = bodies[attempt % len(bodies)]
        used: set[str] = set()
        try:
            facts = _unfold(body, producers, counts, used)
            graph = _Builder(facts, rng, _literals(facts)).build()
        except _Reject as exc:
            reasons[str(exc)] = reasons.get(str(exc), 0) + 1
            continue
        subset = replace(ruleset, rules=[r for r in ruleset.rules if r.name == rule.name or r.name in used])
        if not _judge(_run_instance(graph, subset, attempt), {rule.name}, verdicts, ruleset):
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


def _judge(outcome: _Outcome, checked: set[str], verdicts: dict[str, RuleVerdict], ruleset: RuleSet) -> bool:
    """Record what one instance showed for the rules in ``checked`` (operand orders by their own names);
    False when none of them fired.  Provenance names base rules: each is mapped back to the orders checked."""
    base_of = {r.name: r.base for r in ruleset.rules}

    def orders(bases: set[str]) -> set[str]:
        named = {name for name in checked if base_of.get(name) in bases}
        return named or {b for b in bases if b in verdicts}

    fired = orders(outcome.fired)
    for rules, example in outcome.wrong:
        for name in orders(set(rules or ())):
            if verdicts[name].status != UNSOUND:
                verdicts[name].status = UNSOUND
                verdicts[name].counterexample = example
        fired |= orders(set(rules or ()))
    for name in fired:
        verdicts[name].instances += 1
        if verdicts[name].status != UNSOUND:
            verdicts[name].status = SOUND
    return bool(fired)


def _check_together(ruleset: RuleSet, together: list[Rule], producers: dict[str, list[tuple[Rule, Any]]],
                    verdicts: dict[str, RuleVerdict], instances: int, attempts: int, seed: int) -> None:
    """Rules that read tables filled with ``set``: k copies of the chain's first left side, whole files run."""
    files = {r.file for r in together}
    subset = replace(ruleset, rules=[r for r in ruleset.rules if r.file in files])
    roots = [r for r in subset.rules if _facts_only(r) and not _set_tables(r, producers)
             and not any(type(f).__name__ == "Fact" and type(f.expr).__name__ == "Call" and f.expr.name in producers
                         for f in r.command.rule.body)
             and any(r.name in {p.name for p, _ in ps} for ps in producers.values())]
    rng = _rng(seed, *(r.name for r in together))
    reasons: dict[str, int] = {}
    for attempt in range(attempts):
        if not roots or all(verdicts[r.name].instances >= instances for r in together):
            break
        root = roots[attempt % len(roots)]
        (head,) = [a for a in root.command.rule.head if type(a).__name__ == "Expr_"]
        shared = _vars(head.expr.args[0])
        k = int(rng.integers(2, 4))
        facts = [f for c in range(k) for f in _fresh(list(root.command.rule.body), f"c{c}", shared)]
        try:
            graph = _Builder(facts, rng, _literals(facts)).build()
        except _Reject as exc:
            reasons[str(exc)] = reasons.get(str(exc), 0) + 1
            continue
        outcome = _run_instance(graph, subset, attempt)
        if _judge(outcome, {r.name for r in together}, verdicts, ruleset):
            for r in subset.rules:
                if _facts_only(r) and r.base in outcome.matched:
                    verdicts[r.name].instances += 1
                    verdicts[r.name].status = SOUND
    for r in subset.rules:
        v = verdicts[r.name]
        if _facts_only(r) and v.status == SOUND:
            v.reason = "facts only: checked with the rules of its file on instances of k matmuls of one input"
        elif v.status == NOT_CHECKABLE and r in together and not v.reason:
            v.reason = (f"reads tables rules fill with set; no instance of k copies of "
                        f"{', '.join(x.name for x in roots) or 'a chain start'} made it fire")
