"""Matching a pattern's query on the graph (docs/engines.md, "The fallback engine").

The atoms run in an order where each one can run with what the atoms before it bound (:func:`schedule`); a
node pattern checked top-down also matches the node's forms (:attr:`Facts.forms`); a query without a node
pattern is rooted at a row of a helper relation, one row per run.  Each step is a closure that extends the
variable slots and calls the next one, so a failed candidate costs a few attribute reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import numpy as np

from ...ir.graph import Node
from ...ir.registry import REGISTRY
from ...rules import (
    FACT_TABLES,
    Absent,
    Atom,
    Call,
    Fact,
    Guard,
    Let,
    Lit,
    Lookup,
    NoValue,
    Rule,
    TensorList,
    Term,
    Var,
    atom_terms,
    atom_variables,
    subterms,
    variables,
)
from ...rules import Pattern as NodePat
from ...rules.flat import input_vars, is_negative_zero_scalar
from ...rules.primitives import same_value
from ...rules.signatures import ConstructorArg, constructor_args, node_arg
from .facts import ABSENT, Facts, Tables, compile_term
from .pattern import CompileError

Step = Callable[[list], None]


class ArrayValue:
    """An array attribute as a pattern value: equal by content."""

    __slots__ = ("array", "key")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.key = (array.dtype.str, array.shape, array.tobytes())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ArrayValue) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


@dataclass
class Matcher:
    """A compiled query: ``run(root)`` gives the matches at ``root`` (each a tuple of the slots)
    (a node of the root pattern's op, or a row, the arguments tuple, of the root helper relation)."""

    pattern: Rule  # flat (see rlx_egraph.rules.flat)
    slots: dict[str, int]
    node_slots: tuple[int, ...]  # slots that hold node ids
    shape_slots: tuple[int, ...]  # slots of the nodes whose op and inputs the match inspects
    run: Callable[[Any], list[tuple]]
    roots: Callable[[], list[Any]]  # every root
    alive: Callable[[Any], bool]  # whether a root still exists


@dataclass(frozen=True)
class MatcherPlan:
    """What compiling a pattern's query decides before any graph is seen (see :func:`plan_matcher`); an engine
    binds it to its graph with :func:`compile_matcher`, so engines of one rule set share it."""

    slots: dict[str, int]
    order: list[tuple[str, Atom]]  # the atoms in the order they run, each with its step kind
    known: list[set[str]]  # per atom of ``order``: the variables bound before it
    node_slots: tuple[int, ...]
    shape_slots: tuple[int, ...]


def plan_matcher(pattern: Rule, tables: Tables) -> MatcherPlan:
    """Order ``pattern``'s query and work out what matching it needs (CompileError when some atom can never
    run)."""
    names = [name for atom in pattern.query for name in sorted(_vars(atom))]
    names += [action.var for action in pattern.actions if isinstance(action, Let)]  # what the actions compute
    slots = {name: k for k, name in enumerate(dict.fromkeys(names))}
    order = schedule(pattern, tables)
    known = [set().union(*(_vars(atom) for _, atom in order[:k])) for k in range(len(order))]
    return MatcherPlan(slots, order, known, tuple(slots[v] for v in _node_vars(pattern, tables)),
                       tuple(dict.fromkeys(slots[_out(a)] for a in pattern.query if isinstance(a, NodePat))))


def compile_matcher(pattern: Rule, facts: Facts,
                    plan: MatcherPlan | None = None) -> Matcher:
    """Compile ``pattern``'s query on the graph of ``facts`` (CompileError when some atom can never run);
    ``plan``: its :func:`plan_matcher`, made once for all engines (default: made here)."""
    if plan is None:
        plan = plan_matcher(pattern, facts.decls)
    slots, order = plan.slots, plan.order
    found: list[tuple] = []  # the current run's matches
    pinned: list[Any] = [None]  # the current run's root (see _lookup_step)

    def emit(env: list) -> None:
        found.append(tuple(env))

    chain: Step = emit
    for k in reversed(range(len(order))):
        kind, atom = order[k]
        chain = _step(kind, atom, plan.known[k], slots, chain, facts, pinned if k == 0 else None)
    first = order[0][1]
    width = len(slots)
    root_slot: int | None
    if isinstance(first, NodePat):
        root_slot, alive = slots[_out(first)], facts.rw.nodes_by_id.__contains__
        roots = partial(facts.rw.nodes_of, first.term.op)
    else:
        rows = facts.rows[first.table]  # type: ignore[union-attr]
        root_slot, alive, roots = None, rows.__contains__, partial(list, rows)

    def run(root: Any) -> list[tuple]:
        env: list[Any] = [None] * width
        if root_slot is not None:
            env[root_slot] = root
        pinned[0] = root
        try:
            chain(env)
            return found.copy()
        finally:
            found.clear()

    return Matcher(pattern, slots, plan.node_slots, plan.shape_slots, run, roots, alive)


def _out(atom: NodePat) -> str:
    """The variable a flat node pattern binds its node to."""
    assert isinstance(atom.var, Var)
    return atom.var.name


def _terms(atom: Fact | Guard) -> tuple[Term, ...]:
    """What a fact or guard asks: its two sides (an equation: a fact with a value, an ``=`` guard) or the one
    call that must have a value (a fact's lookup, a guard's primitive check)."""
    if isinstance(atom, Guard) and atom.name != "=":
        return (Call(atom.name, atom.args),)
    return atom_terms(atom)


def _lookups(atom: Atom) -> list[Lookup]:
    """The table lookups in an atom."""
    return [t for term in atom_terms(atom) for t in subterms(term) if isinstance(t, Lookup)]


@cache
def _vars(part: Term | Atom) -> frozenset[str]:
    """The variables of a term or an atom (remembered: planning asks for them again and again)."""
    return frozenset(atom_variables(part) if isinstance(part, NodePat | Fact | Guard) else variables(part))


# --- ordering ------------------------------------------------------------------------------


def _node_vars(pattern: Rule, tables: Tables) -> list[str]:
    """Variables that hold node ids: op patterns' nodes and inputs, and Op columns of tables."""
    out: dict[str, None] = {}
    for atom in pattern.query:
        if isinstance(atom, NodePat):
            out.update(dict.fromkeys([_out(atom), *input_vars(atom.term)]))
        for t in _lookups(atom):  # (every table is known: see schedule)
            out.update(dict.fromkeys(a.name for a, sort in zip(t.args, tables[t.table].inputs, strict=False)
                                     if isinstance(a, Var) and sort == "Op"))
    return list(out)


def schedule(pattern: Rule, tables: Tables) -> list[tuple[str, Atom]]:
    """Order the query's atoms: the first node pattern (or helper fact) is the root; then,
    at each step, the cheapest atom that can run with the variables bound so far.
    Raises CompileError when the query cannot run on a graph."""
    for t in (t for atom in pattern.query for t in _lookups(atom)):
        if t.table not in tables:
            raise CompileError(f"table {t.table!r} has no meaning on a graph in the fallback")
    pending = list(pattern.query)
    root = next((a for a in pending if isinstance(a, NodePat)), None) or next(
        (a for a in pending if isinstance(a, Fact) and a.value is None and _helper_call(a.lookup, tables)), None)
    if root is None:
        raise CompileError("the query has no node pattern and no helper-table fact to start from")
    pending.remove(root)
    order = [("top" if isinstance(root, NodePat) else "lookup", root)]
    bound = _vars(root)
    while pending:
        ready = [(choice[0], k, choice[1]) for k, atom in enumerate(pending)
                 if (choice := _readiness(atom, bound, tables)) is not None]  # (priority, position, step kind)
        best = min(ready, default=None)
        if best is None:
            missing = sorted(set().union(*(_vars(a) for a in pending)) - bound)
            raise CompileError(f"no fact binds variable(s) {', '.join(missing)} before they are needed")
        atom = pending.pop(best[1])
        order.append((best[2], atom))
        bound |= _vars(atom)
    return order


def _readiness(atom: Atom, bound: set[str], tables: Tables) -> tuple[int, str] | None:
    """(priority, step kind) when ``atom`` can run now; lower priority runs first."""
    if isinstance(atom, NodePat):
        if _out(atom) in bound:
            return 1, "top"
        if any(i in bound for i in input_vars(atom.term)):
            return 4, "join"
        return None
    terms = _terms(atom)
    if not any(_vars(t) - bound for t in terms):
        return 0, "check"
    if _binding(terms, bound) is not None:
        return 2, "bind"
    found = _lookup(terms, bound, tables)
    if found is None:
        return None
    call, other = found
    return (5 if other is None and all(_vars(a) - bound for a in call.args) else 3), "lookup"


def _binding(terms: tuple[Term, ...], bound: set[str]) -> tuple[Var, Term] | None:
    """(variable, term) when an equation's one side is an unbound variable and the other can be computed."""
    if len(terms) == 2:
        for target, source in (terms, terms[::-1]):
            if isinstance(target, Var) and target.name not in bound and not _vars(source) - bound:
                return target, source
    return None


def _lookup(terms: tuple[Term, ...], bound: set[str], tables: Tables) -> tuple[Lookup, Term | None] | None:
    """The helper-table call whose rows can run ``terms`` now, and the term its value must equal (None: any)."""
    for call, other in [(terms[0], None)] if len(terms) == 1 else [terms, terms[::-1]]:
        if _lookup_ready(call, bound, tables) and (other is None or isinstance(other, Var) or not _vars(other) - bound):
            return call, other  # type: ignore[return-value]
    return None


def _lookup_ready(call: Term, bound: set[str], tables: Tables) -> bool:
    """A helper-table call whose every argument is known or a lone variable (which its rows bind)."""
    return _helper_call(call, tables) and all(isinstance(a, Var) or not _vars(a) - bound
                                              for a in call.args)  # type: ignore[union-attr]


def _helper_call(term: Term, tables: Tables) -> bool:
    return isinstance(term, Lookup) and term.table in tables and term.table not in FACT_TABLES


# --- steps ---------------------------------------------------------------------------------


def _step(kind: str, atom: Atom, known: set[str], slots: dict[str, int], nxt: Step, facts: Facts,
          pinned: list[Any] | None = None) -> Step:
    """The step of one atom (``pinned``: see :func:`_lookup_step`)."""
    if isinstance(atom, NodePat):
        return _node_step(kind, atom, known, slots, nxt, facts)
    terms = _terms(atom)
    if kind == "check":
        return _check_step(terms, slots, nxt, facts)
    if kind == "bind":
        target, source = _binding(terms, known)  # type: ignore[misc]
        return _value_step(compile_term(source, slots, facts), slots[target.name], nxt)
    return _lookup_step(terms, known, slots, nxt, facts, pinned)


def _check_step(terms: tuple[Term, ...], slots: dict[str, int], nxt: Step, facts: Facts) -> Step:
    """An equation holds where its sides are equal; a call, where it has a value (a check: where it is true)."""
    if len(terms) == 1:
        return _value_step(compile_term(terms[0], slots, facts), None, nxt)
    left, right = (compile_term(t, slots, facts) for t in terms)

    def equal(env: list) -> None:
        try:
            a, b = left(env), right(env)
        except NoValue:
            return
        if a == b or same_value(a, b):  # egglog's equality: NaN equals NaN
            nxt(env)
    return equal


def _value_step(ev: Callable[[list], Any], out: int | None, nxt: Step) -> Step:
    """Go on where ``ev`` has a value, put in slot ``out`` (None: only its having one matters)."""
    def value(env: list) -> None:
        try:
            found = ev(env)
        except NoValue:
            return
        if out is not None:
            env[out] = found
        nxt(env)
    return value


def _lookup_step(terms: tuple[Term, ...], known: set[str], slots: dict[str, int], nxt: Step, facts: Facts,
                 pinned: list[Any] | None = None) -> Step:
    """Rows of a helper table: known columns select rows, the others bind variables.  With
    ``pinned`` (the query's root) only the row ``pinned[0]`` is considered."""
    call, other = _lookup(terms, known, facts.decls)  # type: ignore[misc]
    name = call.table
    selectors: list[tuple[int, Callable[[list], Any]]] = []
    checks: list[tuple[int, None, int, int]] = []  # on a row's (*args, value), column -1 the value (see _fit)
    seen = set(known)
    for column, arg in enumerate(call.args):
        if not _vars(arg) - known:
            selectors.append((column, compile_term(arg, slots, facts)))
        else:
            assert isinstance(arg, Var)
            checks.append((column, None, *_variable(arg.name, seen, slots)))
    value_check = None
    if isinstance(other, Var) and other.name not in known:
        checks.append((-1, None, *_variable(other.name, seen, slots)))
    elif other is not None:
        value_check = compile_term(other, slots, facts)

    def lookup(env: list) -> None:
        try:
            bound = tuple((c, ev(env)) for c, ev in selectors)
            expected = value_check(env) if value_check is not None else None
        except NoValue:
            return
        for args, value in facts.lookup(name, bound, None if pinned is None else pinned[0]):
            if (value_check is None or value == expected) and _fit(checks, (*args, value), None, env):
                nxt(env)
    return lookup


def _variable(name: str, seen: set[str], slots: dict[str, int]) -> tuple[int, int]:
    """The check of a variable (see :func:`_fit`): bind its slot where first seen (now seen), else compare."""
    kind = EQ if name in seen else BIND
    seen.add(name)
    return kind, slots[name]


BIND, EQ, LIT, ZERO, LIST = range(5)  # how :func:`_fit` checks a value; ZERO: a float zero literal, its sign too


def _unifier(atom: NodePat, known: set[str], slots: dict[str, int]) -> Callable[[Node, list], bool]:
    """A check that a node's arguments fit the pattern's (binding new variables)."""
    seen = set(known) | {_out(atom)}
    checks: list[tuple[int, ConstructorArg | None, int, Any]] = []  # (position, how to read, check kind, argument)
    for position, (arg, pat) in enumerate(zip(constructor_args(REGISTRY[atom.term.op]), atom.term.args,
                                              strict=True)):
        read = None if arg.is_input and not (arg.optional or arg.variadic) else arg  # None: a plain input
        if isinstance(pat, Var):
            checks.append((position, read, *_variable(pat.name, seen, slots)))
        elif isinstance(pat, Absent):
            checks.append((position, read, LIT, ABSENT))
        elif isinstance(pat, Lit) and pat.value.__class__ is float and pat.value == 0.0:
            checks.append((position, read, ZERO, math.copysign(1.0, pat.value)))  # 0.0 == -0.0, 1 / 0.0 != 1 / -0.0
        elif isinstance(pat, Lit):
            checks.append((position, read, LIT, pat.value))
        else:
            assert isinstance(pat, TensorList) and all(isinstance(item, Var) for item in pat.items)
            names = [item.name for item in pat.items]  # type: ignore[union-attr]
            names += [pat.rest.name] if isinstance(pat.rest, Var) else []  # the rest: the items after them, a tuple
            items = [(k, None, *_variable(name, seen, slots)) for k, name in enumerate(names)]
            checks.append((position, read, LIST, (len(pat.items), pat.rest is not None, items)))
    # egglog holds a Scalar -0.0 leaf as (Neg (Scalar 0.0 dt)): a Scalar pattern whose value is a variable does not
    # match it there, so not here either
    any_scalar = atom.term.op == "Scalar" and isinstance(atom.term.args[0], Var)

    def unify(node: Node, env: list) -> bool:
        return not (any_scalar and is_negative_zero_scalar(node)) and _fit(checks, node.inputs, node, env)
    return unify


def _fit(checks: list[tuple[int, ConstructorArg | None, int, Any]], values: tuple, node: Node | None,
         env: list) -> bool:
    """Whether ``values`` (a node's inputs, a list's items, a helper row's columns) pass ``checks``, binding new
    variables: each check reads the value at its position, or with a constructor argument reads it from ``node``."""
    for position, read, kind, arg in checks:
        if read is None:
            value = values[position]
        else:
            value = node_arg(node, position, read, ABSENT)
            if value.__class__ is np.ndarray:
                value = ArrayValue(value)
        if kind == BIND:
            env[arg] = value
        elif kind == EQ:
            if env[arg] != value:
                return False
        elif kind == LIT:
            if value != arg:
                return False
        elif kind == ZERO:
            if value != 0 or math.copysign(1.0, value) != arg:
                return False
        else:
            count, rest, items = arg
            if len(value) < count or (not rest and len(value) != count) or \
                    not _fit(items, (*value[:count], tuple(value[count:])) if rest else value, None, env):
                return False
    return True


def _node_step(kind: str, atom: NodePat, known: set[str], slots: dict[str, int], nxt: Step, facts: Facts) -> Step:
    """A node pattern checked top-down on its known node (and its forms), or joined from a known input's readers."""
    op, out = atom.term.op, slots[_out(atom)]
    nodes, readers, forms = facts.rw.nodes_by_id, facts.rw.readers, facts.forms
    unify = _unifier(atom, known, slots)

    if kind == "top":
        def top(env: list) -> None:
            node = nodes.get(env[out])
            if node is None:
                return
            if node.op == op and unify(node, env):
                nxt(env)
            known = forms.get(env[out])
            if known:
                for form in known.values():
                    if form.op == op and unify(form, env):
                        nxt(env)
        return top

    anchor = next(slots[v] for v in input_vars(atom.term) if v in known)

    def join(env: list) -> None:
        users = readers.get(env[anchor])
        if not users:
            return
        for u in list(users):
            node = nodes[u]
            if node.op == op:
                env[out] = u
                if unify(node, env):
                    nxt(env)
    return join


__all__ = ["ArrayValue", "Matcher", "MatcherPlan", "compile_matcher", "plan_matcher", "schedule"]
