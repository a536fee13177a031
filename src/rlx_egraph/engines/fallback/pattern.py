"""The fallback's pattern form: a rule of the rule model flattened into steps a matcher runs on a graph.

A :class:`Pattern` is one direction of one operand order of a rule: a query
(node patterns, equalities, facts) and actions (build nodes, compute values,
union, set and insert rows).  Nested op terms are flattened: every op term gets
a variable, every value expression in an attribute position becomes a fresh
variable and an :class:`Equal`.  A rewrite whose two sides are one op with its
arguments permuted (``residual-layer-norm-commute``) is a :class:`Symmetry`:
the matcher tries the permuted argument order wherever it matches that op, as
the e-graph would hold both orders.  A rule the fallback cannot apply is an
:class:`Unsupported` entry naming the rule, its ``file:line`` and why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ...ir.registry import REGISTRY
from ...rules import (
    FACT_TABLES,
    Absent,
    Call,
    Fact,
    Let,
    Lit,
    Lookup,
    OpTerm,
    Panic,
    Rule,
    RuleSet,
    TensorList,
    Var,
)
from ...rules import Atom as ModelAtom
from ...rules import Build as BuildAction
from ...rules import Insert as InsertAction
from ...rules import Pattern as PatternAtom
from ...rules import SetValue as SetAction
from ...rules import Term as ModelTerm
from ...rules import Union as UnionAction
from ...rules.model import REWRITE_ROOT
from ...rules.signatures import constructor_args

# --- terms --------------------------------------------------------------------------------


@dataclass(frozen=True)
class V:
    """A variable."""

    name: str


@dataclass(frozen=True)
class L:
    """A literal: int, float, str, bool, None (unit) or :data:`ABSENT`."""

    value: Any


@dataclass(frozen=True)
class F:
    """A primitive or a table (function, relation) applied to terms."""

    name: str
    args: tuple[Term, ...]


Term = V | L | F


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
"""The value of ``(NoInput)``: an optional input that is not there."""


@dataclass(frozen=True)
class ListPat:
    """A variadic input: ``items`` then ``rest`` (a TensorList variable) or the end of the list."""

    items: tuple[str, ...]
    rest: str | None = None


Slot = V | L | ListPat  # an input slot: an Op variable, L(ABSENT), or a list


@dataclass(frozen=True)
class NodePat:
    """``out`` is a node of ``op`` with these inputs (in slot order) and attributes (declaration order)."""

    out: str
    op: str
    inputs: tuple[Slot, ...]
    attrs: tuple[V | L, ...]


@dataclass(frozen=True)
class Equal:
    """Two terms have one value (binds a variable side when the other side can be evaluated)."""

    left: Term
    right: Term


@dataclass(frozen=True)
class Holds:
    """A relation row exists, a table has a value, or a primitive check (``<``, ``!=``) has a value."""

    call: F


Atom = NodePat | Equal | Holds


@dataclass(frozen=True)
class Build:
    """A new node of ``op`` (or an identical existing one), bound to ``out``."""

    out: str
    op: str
    inputs: tuple[Slot, ...]
    attrs: tuple[Term, ...]


@dataclass(frozen=True)
class Compute:
    out: str
    expr: Term


@dataclass(frozen=True)
class Union:
    """``a`` and ``b`` are one value: the graph keeps one and replaces the other's uses."""

    a: str
    b: str


@dataclass(frozen=True)
class SetValue:
    table: str
    args: tuple[Term, ...]
    value: Term


@dataclass(frozen=True)
class Insert:
    relation: str
    args: tuple[Term, ...]


Action = Build | Compute | Union | SetValue | Insert

REWRITE, FACTS = "rewrite", "facts"


@dataclass(frozen=True)
class Pattern:
    """One compiled rule direction; ``kind`` is ``rewrite`` (it unions terms into the graph) or ``facts`` (it
    only fills helper tables)."""

    name: str
    base: str
    stage: str
    location: str
    kind: str
    query: tuple[Atom, ...]
    actions: tuple[Action, ...]

    def tables_read(self) -> frozenset[str]:
        """The tables and functions the query calls (computed once: a Pattern never changes)."""
        return self._tables[0]

    def tables_written(self) -> frozenset[str]:
        """The tables the actions set or insert into (computed once)."""
        return self._tables[1]

    @cached_property
    def _tables(self) -> tuple[frozenset[str], frozenset[str]]:
        return (frozenset(t.name for a in self.query if not isinstance(a, NodePat) for t in calls(atom_terms(a))),
                frozenset(a.table if isinstance(a, SetValue) else a.relation for a in self.actions
                          if isinstance(a, SetValue | Insert)))


@dataclass(frozen=True)
class Symmetry:
    """``op``'s arguments may be permuted: argument i of the other form is argument ``perm[i]``."""

    name: str
    stage: str
    location: str
    op: str
    perm: tuple[int, ...]


@dataclass(frozen=True)
class Unsupported:
    """A rule the fallback cannot apply, and why."""

    rule: str
    location: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule} ({self.location}): {self.reason}"


@dataclass(frozen=True)
class TableDecl:
    """A table rules read or write: a relation (``output`` None) or a function with its merge."""

    name: str
    inputs: tuple[str, ...]
    output: str | None = None
    merge: Term | None = None
    builtin: bool = False  # a fact table (rlx_egraph.rules.FACT_TABLES): its meaning comes from the graph


@dataclass
class CompiledRules:
    patterns: list[Pattern] = field(default_factory=list)
    symmetries: list[Symmetry] = field(default_factory=list)
    tables: dict[str, TableDecl] = field(default_factory=dict)
    unsupported: list[Unsupported] = field(default_factory=list)
    plans: dict[str, Any] = field(default_factory=dict, repr=False)  # pattern name -> its matcher.MatcherPlan
    tracked: frozenset[str] = frozenset()  # helper relations whose rows keep the rules that wrote them


class CompileError(ValueError):
    """A rule form the fallback does not handle; becomes an :class:`Unsupported` entry."""


def compile_rules(ruleset: RuleSet) -> CompiledRules:
    """Compile every rule of ``ruleset`` (each direction of each operand order)."""
    out = CompiledRules(tracked=ruleset.tracked)
    for t in FACT_TABLES.values():
        out.tables[t.name] = TableDecl(t.name, t.inputs, t.output, None, builtin=True)
    for d in ruleset.helpers:
        out.tables[d.name] = TableDecl(d.name, d.inputs, d.output, None if d.merge is None else _value(d.merge))
    for rule in ruleset.rules:
        try:
            for d in rule.directions:
                perm = _permutation(d.query, d.actions)
                if perm is not None:
                    out.symmetries.append(Symmetry(rule.base, rule.stage, rule.location, *perm))
                else:
                    out.patterns.append(_pattern(rule, d.name, d.query, d.actions, out.tables))
        except CompileError as exc:
            if all(u.rule != rule.base for u in out.unsupported):  # one entry per rule as written
                out.unsupported.append(Unsupported(rule.base, rule.location, str(exc)))
    return out


def _permutation(query: tuple[ModelAtom, ...], actions: tuple[Any, ...]) -> tuple[str, tuple[int, ...]] | None:
    """(op, permutation) of a rewrite without conditions whose sides are one op over the same distinct
    variables, permuted."""
    if len(query) != 1 or len(actions) != 1 or not isinstance(lhs := query[0], PatternAtom) \
            or lhs.var != Var(REWRITE_ROOT) or not isinstance(rhs := actions[0], UnionAction):
        return None
    left, right = lhs.term, rhs.right
    if not (isinstance(left, OpTerm) and isinstance(right, OpTerm) and left.op == right.op
            and all(isinstance(a, Var) for a in (*left.args, *right.args))):
        return None
    names, other = [a.name for a in left.args], [a.name for a in right.args]  # type: ignore[union-attr]
    if len(set(names)) != len(names) or sorted(names) != sorted(other):
        return None
    perm = tuple(names.index(n) for n in other)
    return None if perm == tuple(range(len(perm))) else (left.op, perm)


def _value(term: ModelTerm) -> Term:
    """A value term (no op terms)."""
    if isinstance(term, Var):
        return V(term.name)
    if isinstance(term, Lit):
        return L(term.value)
    if isinstance(term, Absent):
        return L(ABSENT)
    if isinstance(term, Call | Lookup):
        return F(term.name if isinstance(term, Call) else term.table, tuple(map(_value, term.args)))
    raise CompileError(f"{term} where a value is expected")


def negative_zero(term: OpTerm) -> OpTerm:
    """``(Neg (Scalar 0.0 ?dt))`` as the Scalar -0.0 it stands for: egglog's f64 equates -0.0 with 0.0, so the
    encoder writes a Scalar -0.0 leaf as that term, and rules name it so; on the graph it is the leaf."""
    inner = term.args[0] if term.op == "Neg" and len(term.args) == 1 else None
    if isinstance(inner, OpTerm) and inner.op == "Scalar" and isinstance(lit := inner.args[0], Lit) \
            and lit.sort == "f64" and lit.value == 0.0 and math.copysign(1.0, lit.value) > 0:  # type: ignore[arg-type]
        return OpTerm("Scalar", (Lit(-0.0, "f64"), *inner.args[1:]))
    return term


class _Flattener:
    """Flattens a rule's query and actions, naming every nested op term (``?$k``)."""

    def __init__(self, tables: dict[str, TableDecl]) -> None:
        self.tables = tables
        self.count = 0
        self.query: list[Atom] = []
        self.actions: list[Action] = []
        self.built: set[str] = set()

    def fresh(self) -> str:
        self.count += 1
        return f"?${self.count}"

    # --- query -------------------------------------------------------------------------------

    def atom(self, atom: ModelAtom) -> None:
        if isinstance(atom, PatternAtom):
            if not isinstance(atom.term, OpTerm):
                raise CompileError(f"{atom.term} can only appear as an argument of an op")
            if isinstance(atom.var, Var):
                self.node(atom.term, atom.var.name)
            elif isinstance(atom.var, OpTerm):
                out = self.nested(atom.term)
                self.node(atom.var, out)
            else:
                out = self.nested(atom.term)
                if atom.var is not None:
                    self.query.append(Equal(V(out), self.term(atom.var)))
        elif isinstance(atom, Fact):
            call = F(atom.table, tuple(map(self.term, atom.args)))
            self.query.append(Holds(call) if atom.value is None else Equal(call, self.term(atom.value)))
        elif atom.name == "=":
            left, right = (self.term(a) for a in atom.args)
            self.query.append(Equal(left, right))
        else:
            self.query.append(Holds(F(atom.name, tuple(map(self.term, atom.args)))))

    def node(self, term: OpTerm, out: str) -> None:
        term = negative_zero(term)
        at = len(self.query)
        inputs, attrs = self.arguments(term, self.nested, self.attr)
        self.query.insert(at, NodePat(out, term.op, inputs, attrs))  # before its arguments': read top-down

    def nested(self, term: OpTerm) -> str:
        out = self.fresh()
        self.node(term, out)
        return out

    def attr(self, term: ModelTerm) -> V | L:
        value = self.term(term)
        if isinstance(value, V | L):
            return value
        var = self.fresh()
        self.query.append(Equal(V(var), value))
        return V(var)

    def term(self, term: ModelTerm) -> Term:
        return V(self.nested(term)) if isinstance(term, OpTerm) else _value(term)

    def arguments(self, term: OpTerm, op_term: Any, attr: Any) -> tuple[tuple[Slot, ...], tuple]:
        """The input slots and attributes of an op term; ``op_term`` names a nested op term, ``attr`` an
        attribute's term."""
        inputs: list[Slot] = []
        attrs: list = []
        for arg, sub in zip(constructor_args(REGISTRY[term.op]), term.args, strict=True):
            if not arg.is_input:
                attrs.append(attr(sub))
            elif isinstance(sub, TensorList):
                items = tuple(self.input(i, op_term) for i in sub.items)
                rest = None if sub.rest is None else self.input(sub.rest, op_term)
                inputs.append(ListPat(items, rest))
            elif isinstance(sub, Absent):
                inputs.append(L(ABSENT))
            else:
                inputs.append(V(self.input(sub, op_term)))
        return tuple(inputs), tuple(attrs)

    def input(self, term: ModelTerm, op_term: Any) -> str:
        if isinstance(term, Var):
            return term.name
        if isinstance(term, OpTerm):
            return op_term(term)
        var = self.fresh()  # a lookup whose value is a node
        if op_term == self.build:
            raise CompileError("an Op-valued table lookup in a new term is not supported")
        self.query.append(Equal(V(var), self.term(term)))
        return var

    # --- actions -----------------------------------------------------------------------------

    def action(self, action: Any) -> None:
        if isinstance(action, Let):
            if isinstance(action.term, OpTerm):
                self.build(action.term, action.var)
            else:
                self.actions.append(Compute(action.var, self.value(action.term)))
        elif isinstance(action, UnionAction):
            self.actions.append(Union(self.var_of(action.left), self.var_of(action.right)))
        elif isinstance(action, SetAction | InsertAction):
            decl = self.tables.get(action.table)
            function = isinstance(action, SetAction)
            if decl is None or (decl.output is not None) != function:
                raise CompileError(f"{'set of' if function else 'insert into'} {action.table!r}, which is not a "
                                   f"declared {'function' if function else 'relation'}")
            args = tuple(map(self.value, action.args))
            self.actions.append(SetValue(action.table, args, self.value(action.value)) if isinstance(action, SetAction)
                                else Insert(action.table, args))
        elif isinstance(action, BuildAction) and isinstance(action.term, OpTerm):
            self.build(action.term)
        elif isinstance(action, Panic):
            raise CompileError("panic actions are not supported")
        else:
            raise CompileError(f"the action {action} is not supported")

    def build(self, term: OpTerm, out: str | None = None) -> str:
        var = out or self.fresh()
        inputs, attrs = self.arguments(negative_zero(term), self.build, self.value)
        self.actions.append(Build(var, term.op, inputs, attrs))
        self.built.add(var)
        return var

    def value(self, term: ModelTerm) -> Term:
        return V(self.build(term)) if isinstance(term, OpTerm) else _value(term)

    def var_of(self, term: ModelTerm) -> str:
        if isinstance(term, Var):
            return term.name
        if isinstance(term, OpTerm):
            return self.build(term)
        raise CompileError("union takes variables or op terms")


def _pattern(rule: Rule, name: str, query: Iterable[ModelAtom], actions: Iterable[Any],
             tables: dict[str, TableDecl]) -> Pattern:
    flat = _Flattener(tables)
    for atom in query:
        flat.atom(atom)
    for action in actions:
        flat.action(action)
    unions = [a for a in flat.actions if isinstance(a, Union)]
    if flat.built and not unions:
        raise CompileError("it builds terms but unions none of them into the graph, so nothing would use them")
    for u in unions:
        if u.a in flat.built and u.b in flat.built:
            raise CompileError(f"union of two new terms ({u.a}, {u.b}): the graph has no node to replace")
    return Pattern(name, rule.base, rule.stage, rule.location, REWRITE if unions else FACTS, tuple(flat.query),
                   tuple(flat.actions))


def atom_terms(atom: Atom) -> list[Term]:
    if isinstance(atom, Equal):
        return [atom.left, atom.right]
    return [atom.call] if isinstance(atom, Holds) else []


def calls(terms: Iterable[Term]) -> list[F]:
    """The calls among ``terms`` and inside them."""
    out, stack = [], list(terms)
    while stack:
        t = stack.pop()
        if isinstance(t, F):
            out.append(t)
            stack.extend(t.args)
    return out


def slot_vars(slots: Iterable[Slot]) -> list[str]:
    """The variables input slots name directly: each plain variable, then each list pattern's items (not its rest)."""
    out = [s.name for s in slots if isinstance(s, V)]
    out += [i for s in slots if isinstance(s, ListPat) for i in s.items]
    return out


def term_vars(term: Term) -> set[str]:
    """Variables a term reads."""
    if isinstance(term, V):
        return {term.name}
    if isinstance(term, F):
        return set().union(*(term_vars(a) for a in term.args)) if term.args else set()
    return set()
