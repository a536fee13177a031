"""The fallback's pattern form: egglog rules compiled to plain data.

A :class:`Pattern` is one rule: a query (node patterns, equalities, facts) and
actions (build nodes, compute values, union, set and insert facts).  Nested
terms are flattened: every constructor gets a variable, every primitive
expression in an attribute position becomes a fresh variable plus an
:class:`Equal`.  A rewrite whose two sides are one op with its arguments
permuted (``residual-layer-norm-commute``) is a :class:`Symmetry`: the matcher
tries the permuted argument order wherever it matches that op, as the e-graph
would hold both orders.  A rule the fallback cannot apply is an
:class:`Unsupported` entry naming the rule, its ``file:line`` and why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from egglog import bindings as eb

from ...ir.registry import REGISTRY
from ..egglog.rules import Rule, RuleSet
from ..egglog.schema import FACT_TABLES, LIST_CONS, LIST_NIL, NO_INPUT, constructor_args

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


# --- query atoms --------------------------------------------------------------------------


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
    """A relation row exists, a table has a value, or a primitive check (``<``, ``!=``) passes."""

    call: F


Atom = NodePat | Equal | Holds

# --- actions -------------------------------------------------------------------------------


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

# --- rules ---------------------------------------------------------------------------------

REWRITE, FACTS = "rewrite", "facts"


@dataclass(frozen=True)
class Pattern:
    """One compiled rule (one operand order of the rule ``base`` as written).  ``kind`` is
    ``rewrite`` (it unions terms into the graph) or ``facts`` (it only fills helper tables)."""

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
        return (frozenset(name for atom in self.query for name in _called(atom)),
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
    builtin: bool = False


@dataclass
class CompiledRules:
    patterns: list[Pattern] = field(default_factory=list)
    symmetries: list[Symmetry] = field(default_factory=list)
    tables: dict[str, TableDecl] = field(default_factory=dict)
    unsupported: list[Unsupported] = field(default_factory=list)
    # pattern name -> its fallback.matcher.MatcherPlan, made once when the rules are loaded (every engine binds it)
    plans: dict[str, Any] = field(default_factory=dict, repr=False)


class CompileError(ValueError):
    """A rule form the fallback does not handle; becomes an :class:`Unsupported` entry."""


# --- compiling ------------------------------------------------------------------------------

_CONSTRUCTORS = frozenset(REGISTRY) | {NO_INPUT, LIST_NIL, LIST_CONS}


def compile_rules(ruleset: RuleSet, primitives: Iterable[str]) -> CompiledRules:
    """Compile every rule of ``ruleset``; ``primitives`` are the primitive names the evaluator knows."""
    out = CompiledRules()
    for command in eb.EGraph().parse_program("\n".join(FACT_TABLES.values())):
        decl = _table_decl(command, builtin=True)
        out.tables[decl.name] = decl
    for _, command in ruleset.declarations:
        decl = _table_decl(command, builtin=False)
        out.tables[decl.name] = decl
    known = set(primitives)
    for rule in ruleset.rules:
        try:
            compiled = _compile(rule, out.tables, known)
        except CompileError as exc:
            if all(u.rule != rule.base for u in out.unsupported):  # one entry per rule as written
                out.unsupported.append(Unsupported(rule.base, rule.location, str(exc)))
            continue
        for item in compiled:
            (out.symmetries if isinstance(item, Symmetry) else out.patterns).append(item)
    return out


def _table_decl(command: Any, builtin: bool) -> TableDecl:
    if isinstance(command, eb.Relation):
        return TableDecl(command.name, tuple(command.inputs), builtin=builtin)
    merge = _term(command.merge, {}, []) if command.merge is not None else None
    return TableDecl(command.name, tuple(command.schema.input), command.schema.output, merge, builtin)


def _compile(rule: Rule, tables: dict[str, TableDecl], primitives: set[str]) -> list[Pattern | Symmetry]:
    command = rule.command
    if isinstance(command, eb.RewriteCommand | eb.BiRewriteCommand):
        rw = command.rewrite
        pairs = [(rw.lhs, rw.rhs)] + ([(rw.rhs, rw.lhs)] if isinstance(command, eb.BiRewriteCommand) else [])
        out: list[Pattern | Symmetry] = []
        for lhs, rhs in pairs:
            perm = _permutation(lhs, rhs) if not rw.conditions else None
            if perm is not None:
                out.append(Symmetry(rule.base, rule.stage, rule.location, lhs.name, perm))
                continue
            root = eb.Var(rw.span, "?$root")
            body = [eb.Eq(rw.span, root, lhs), *rw.conditions]
            out.append(_pattern(rule, body, [eb.Union(rw.span, root, rhs)], tables, primitives))
        return out
    return [_pattern(rule, command.rule.body, command.rule.head, tables, primitives)]


def _permutation(lhs: Any, rhs: Any) -> tuple[int, ...] | None:
    """The argument permutation when both sides are one op over the same distinct variables."""
    if not (isinstance(lhs, eb.Call) and isinstance(rhs, eb.Call) and lhs.name == rhs.name
            and lhs.name in REGISTRY):
        return None
    names = [a.name if isinstance(a, eb.Var) else None for a in lhs.args]
    other = [a.name if isinstance(a, eb.Var) else None for a in rhs.args]
    if None in names or None in other or len(set(names)) != len(names) or sorted(names) != sorted(other):
        return None
    perm = tuple(names.index(n) for n in other)
    return None if perm == tuple(range(len(perm))) else perm


class _Flattener:
    """Turns egglog syntax into atoms/actions, naming every nested constructor."""

    def __init__(self, tables: dict[str, TableDecl], primitives: set[str]) -> None:
        self.tables, self.primitives = tables, primitives
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"?${self.count}"

    # query side
    def fact(self, fact: Any, atoms: list[Atom]) -> None:
        if isinstance(fact, eb.Eq):
            left, right = fact.left, fact.right
            if _is_cons(right) and not _is_cons(left):
                left, right = right, left
            if _is_cons(left):
                if isinstance(right, eb.Var):
                    self.node(left, right.name, atoms)
                elif _is_cons(right):
                    var = self.fresh()
                    self.node(left, var, atoms)
                    self.node(right, var, atoms)
                else:
                    var = self.fresh()
                    self.node(left, var, atoms)
                    atoms.append(Equal(V(var), self.term(right, atoms)))
                return
            atoms.append(Equal(self.term(left, atoms), self.term(right, atoms)))
        elif isinstance(fact, eb.Fact):
            expr = fact.expr
            if _is_cons(expr):
                self.node(expr, self.fresh(), atoms)
            elif isinstance(expr, eb.Call):
                atoms.append(Holds(self.call(expr, atoms)))
            else:
                raise CompileError(f"a fact must be a call, got {type(expr).__name__}")
        else:
            raise CompileError(f"query facts of kind {type(fact).__name__} are not supported")

    def node(self, call: Any, out: str, atoms: list[Atom]) -> None:
        if call.name in (NO_INPUT, LIST_NIL, LIST_CONS):
            raise CompileError(f"({call.name}) can only appear as an argument of an op")
        call = negative_zero(call)
        below: list[Atom] = []  # what the arguments need, after this node: patterns read top-down
        inputs, attrs = self.arguments(call, lambda c: self.nested_node(c, below),
                                       lambda e: self.attr(e, below), lambda e: self.op_value(e, below))
        atoms.append(NodePat(out, call.name, inputs, attrs))
        atoms.extend(below)

    def nested_node(self, call: Any, atoms: list[Atom]) -> str:
        var = self.fresh()
        self.node(call, var, atoms)
        return var

    def attr(self, expr: Any, atoms: list[Atom]) -> V | L:
        term = self.term(expr, atoms)
        if isinstance(term, V | L):
            return term
        var = self.fresh()
        atoms.append(Equal(V(var), term))
        return V(var)

    def op_value(self, expr: Any, atoms: list[Atom]) -> str:
        """An Op-valued non-constructor (a table lookup) in an input slot."""
        var = self.fresh()
        atoms.append(Equal(V(var), self.term(expr, atoms)))
        return var

    def arguments(self, call: Any, on_cons: Any, on_attr: Any, on_other: Any) -> tuple[tuple, tuple]:
        spec = REGISTRY[call.name]
        args = constructor_args(spec)
        if len(args) != len(call.args):
            raise CompileError(f"{call.name} takes {len(args)} arguments, got {len(call.args)}")
        inputs: list[Slot] = []
        attrs: list = []
        for arg, expr in zip(args, call.args, strict=True):
            if not arg.is_input:
                attrs.append(on_attr(expr))
            elif arg.variadic:
                inputs.append(self.list_pattern(expr, on_cons, on_other))
            elif isinstance(expr, eb.Call) and expr.name == NO_INPUT:
                inputs.append(L(ABSENT))
            else:
                inputs.append(V(self.input_var(expr, on_cons, on_other)))
        return tuple(inputs), tuple(attrs)

    def input_var(self, expr: Any, on_cons: Any, on_other: Any) -> str:
        if isinstance(expr, eb.Var):
            return expr.name
        if _is_cons(expr):
            return on_cons(expr)
        return on_other(expr)

    def list_pattern(self, expr: Any, on_cons: Any, on_other: Any) -> ListPat:
        items: list[str] = []
        while isinstance(expr, eb.Call) and expr.name == LIST_CONS:
            items.append(self.input_var(expr.args[0], on_cons, on_other))
            expr = expr.args[1]
        if isinstance(expr, eb.Call) and expr.name == LIST_NIL:
            return ListPat(tuple(items))
        if isinstance(expr, eb.Var):
            return ListPat(tuple(items), expr.name)
        raise CompileError("a TensorList argument must be TCons/TNil terms or a variable")

    def term(self, expr: Any, atoms: list[Atom]) -> Term:
        return _term(expr, self.tables, atoms, self, self.primitives)

    def call(self, expr: Any, atoms: list[Atom]) -> F:
        term = self.term(expr, atoms)
        assert isinstance(term, F)
        return term


def _term(expr: Any, tables: dict[str, TableDecl], atoms: list, flattener: _Flattener | None = None,
          primitives: set[str] | None = None) -> Term:
    """A term without constructors (nested constructors become node patterns via ``flattener``)."""
    if isinstance(expr, eb.Var):
        return V(expr.name)
    if isinstance(expr, eb.Lit):
        return L(_literal(expr.value))
    if isinstance(expr, eb.Call):
        if expr.name == NO_INPUT:
            return L(ABSENT)
        if _is_cons(expr):
            if flattener is None:
                raise CompileError(f"constructor {expr.name} where a value is expected")
            return V(flattener.nested_node(expr, atoms))
        if expr.name in (LIST_NIL, LIST_CONS):
            raise CompileError("TensorList terms are only supported as a variadic op argument")
        if primitives is not None and expr.name not in tables and expr.name not in primitives:
            raise CompileError(f"primitive {expr.name!r} is not supported by the fallback")
        return F(expr.name, tuple(_term(a, tables, atoms, flattener, primitives) for a in expr.args))
    raise CompileError(f"expression of kind {type(expr).__name__} is not supported")


def negative_zero(call: Any) -> Any:
    """``(Neg (Scalar 0.0 ?dt))`` as the Scalar -0.0 it stands for: egglog's f64 equates -0.0 with 0.0, so the
    encoder writes a Scalar -0.0 leaf as that term (``egraph/encode.py``), and rules name it so; on the graph the
    fallback matches, it is the leaf.  Any other call as it is."""
    if call.name != "Neg" or len(call.args) != 1:
        return call
    inner = call.args[0]
    if not (isinstance(inner, eb.Call) and inner.name == "Scalar" and isinstance(inner.args[0], eb.Lit)
            and type(inner.args[0].value).__name__ == "Float" and inner.args[0].value.value == 0.0
            and math.copysign(1.0, inner.args[0].value.value) > 0):
        return call
    return eb.Call(call.span, "Scalar", [eb.Lit(inner.args[0].span, eb.Float(-0.0)), *inner.args[1:]])


def _literal(value: Any) -> Any:
    if isinstance(value, eb.Unit):
        return None
    return value.value


def _is_cons(expr: Any) -> bool:
    return isinstance(expr, eb.Call) and expr.name in _CONSTRUCTORS and expr.name not in (LIST_NIL, LIST_CONS)


def _pattern(rule: Rule, body: list, head: list, tables: dict[str, TableDecl], primitives: set[str]) -> Pattern:
    flat = _Flattener(tables, primitives)
    query: list[Atom] = []
    for fact in body:
        flat.fact(fact, query)
    compiled = _Actions(flat)
    for action in head:
        compiled.add(action)
    actions, built = compiled.actions, compiled.built
    unions = [a for a in actions if isinstance(a, Union)]
    if built and not unions:
        raise CompileError("it builds terms but unions none of them into the graph, so nothing would use them")
    for u in unions:
        if u.a in built and u.b in built:
            raise CompileError(f"union of two new terms ({u.a}, {u.b}): the graph has no node to replace")
    kind = REWRITE if unions else FACTS
    return Pattern(rule.name, rule.base, rule.stage, rule.location, kind, tuple(query), tuple(actions))


class _Actions:
    """Turns a rule's actions into :class:`Action` records (``actions``), naming every new term; ``built``: the
    variables of the new terms.  (Methods, not mutually recursive closures: such closures are a reference cycle,
    left to the garbage collector.)"""

    def __init__(self, flat: _Flattener) -> None:
        self.flat = flat
        self.actions: list[Action] = []
        self.built: set[str] = set()

    def add(self, action: Any) -> None:
        flat, actions = self.flat, self.actions
        if isinstance(action, eb.Let):
            if _is_cons(action.rhs):
                self.build(action.rhs, action.lhs)
            else:
                actions.append(Compute(action.lhs, self.value(action.rhs)))
        elif isinstance(action, eb.Union):
            actions.append(Union(self.var_of(action.lhs), self.var_of(action.rhs)))
        elif isinstance(action, eb.Set):
            if action.lhs not in flat.tables or flat.tables[action.lhs].output is None:
                raise CompileError(f"set of {action.lhs!r}, which is not a declared function")
            actions.append(SetValue(action.lhs, tuple(self.value(a) for a in action.args), self.value(action.rhs)))
        elif isinstance(action, eb.Expr_) and isinstance(action.expr, eb.Call) and action.expr.name in flat.tables \
                and flat.tables[action.expr.name].output is None:
            actions.append(Insert(action.expr.name, tuple(self.value(a) for a in action.expr.args)))
        elif isinstance(action, eb.Expr_) and _is_cons(action.expr):
            self.build(action.expr)
        elif isinstance(action, eb.Expr_):
            raise CompileError("an action expression must insert into a declared relation or build a term")
        else:
            kind = type(action).__name__
            detail = {"Change": "delete/subsume", "Panic": "panic"}.get(kind, kind)
            raise CompileError(f"{detail} actions are not supported")

    def build(self, call: Any, out: str | None = None) -> str:
        var = out or self.flat.fresh()
        call = negative_zero(call)
        inputs, attrs = self.flat.arguments(call, self.build, self.value,
                                            lambda e: _fail("an Op-valued table lookup in a new term"))
        self.actions.append(Build(var, call.name, inputs, attrs))
        self.built.add(var)
        return var

    def value(self, expr: Any) -> Term:
        if _is_cons(expr):
            return V(self.build(expr))
        return _term(expr, self.flat.tables, [], None, self.flat.primitives)

    def var_of(self, expr: Any) -> str:
        if isinstance(expr, eb.Var):
            return expr.name
        if _is_cons(expr):
            return self.build(expr)
        raise CompileError("union takes variables or constructor terms")


def _fail(what: str) -> str:
    raise CompileError(f"{what} is not supported")


def _called(atom: Atom) -> Iterator[str]:
    terms: list[Any] = []
    if isinstance(atom, Equal):
        terms = [atom.left, atom.right]
    elif isinstance(atom, Holds):
        terms = [atom.call]
    while terms:
        t = terms.pop()
        if isinstance(t, F):
            yield t.name
            terms.extend(t.args)


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


__all__ = ["ABSENT", "REWRITE", "FACTS", "Atom", "Action", "Build", "CompileError", "CompiledRules", "Compute",
           "Equal", "F", "Holds", "Insert", "L", "ListPat", "NodePat", "Pattern", "SetValue", "Symmetry",
           "TableDecl", "Term", "Union", "Unsupported", "V", "compile_rules", "slot_vars", "term_vars"]
