"""Operand orders: a rule over commutative ops, once per order of their operands.

Operands of commutative ops (``OpSpec.commutative``: Add, Mul, ...) match in
either order: a rule is generated once per distinct operand order of the
commutative op terms in its query (a rule's query, a rewrite's left side and
conditions, both sides of a birewrite), at most :data:`MAX_VARIANTS`.  The
order as written comes first and keeps the rule's name; the others are named
``<name>#2``, ``<name>#3``, ... in the order of :func:`operand_orders`, with
:attr:`Rule.order` 2, 3, ...  The orders are distinct as egglog text:
``(Mul ?x ?x)`` has one.
"""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import product
from typing import Any

from ..ir.registry import REGISTRY
from .model import BIREWRITE, REWRITE, VARIANT_MARK, Atom, Fact, Guard, Pattern, Rule, RuleError, Union
from .terms import Call, Lookup, OpTerm, TensorList, Term

MAX_VARIANTS = 256  # operand orders one rule may be loaded in


def variant_name(base: str, k: int) -> str:
    """The name of the ``k``-th (from 1) operand order of rule ``base``: the first keeps the base name."""
    return base if k == 1 else f"{base}{VARIANT_MARK}{k}"


def commutative(op: str) -> bool:
    return op in REGISTRY and REGISTRY[op].commutative


def operand_orders(rule: Rule) -> list[Rule]:
    """``rule`` (as written) once per distinct operand order of the commutative op terms in its query."""
    try:
        if rule.kind in (REWRITE, BIREWRITE):
            both = rule.kind == BIREWRITE  # a birewrite's right side is a query too
            sides = [rule.lhs, rule.rhs] if both else [rule.lhs]
            out = []
            for parts in _product([_term_orders(t) for t in sides] + [_atom_orders(a) for a in rule.conditions]):
                lhs, rhs = parts[0], parts[1] if both else rule.rhs
                root = rule.query[0]
                assert isinstance(root, Pattern)
                query = (replace(root, term=lhs), *parts[len(sides):])
                out.append((query, (Union(rule.actions[0].left, rhs),)))  # type: ignore[union-attr]
        else:
            out = [(query, rule.actions) for query in _product([_atom_orders(a) for a in rule.query])]
    except _TooManyOrders:
        ops = ", ".join(sorted(op for op in rule.reads if commutative(op)))
        raise RuleError(f"{rule.location}: rule {rule.base!r} matches in more than {MAX_VARIANTS} operand orders "
                        f"of its commutative ops ({ops}); split it into smaller rules joined by a helper "
                        f"relation") from None
    return [replace(rule, name=variant_name(rule.base, k), query=tuple(q), actions=a, order=k)
            for k, (q, a) in enumerate(out, start=1)]


class _TooManyOrders(Exception):
    """A query has more than :data:`MAX_VARIANTS` operand orders."""


def _atom_orders(atom: Atom) -> list[Atom]:
    """An atom in every operand order: an equation's sides combined, a fact's call in its orders."""
    if isinstance(atom, Pattern):
        if atom.var is None:
            return [replace(atom, term=t) for t in _term_orders(atom.term)]
        sides = (atom.var, atom.term) if atom.var_first else (atom.term, atom.var)
        pairs = _product([_term_orders(s) for s in sides])
        return [replace(atom, var=v, term=t) if atom.var_first else replace(atom, term=v, var=t) for v, t in pairs]
    if isinstance(atom, Fact):
        if atom.value is None:
            return [Fact(t.table, t.args) for t in _term_orders(atom.lookup)]  # type: ignore[union-attr]
        sides = (atom.value, atom.lookup) if atom.value_first else (atom.lookup, atom.value)
        pairs = _product([_term_orders(s) for s in sides])
        return [Fact(look.table, look.args, value, atom.value_first)  # type: ignore[union-attr]
                for value, look in (pairs if atom.value_first else [(b, a) for a, b in pairs])]
    if atom.name == "=":  # an equation
        return [Guard("=", pair) for pair in _product([_term_orders(s) for s in atom.args])]
    return [Guard(t.name, t.args) for t in _term_orders(Call(atom.name, atom.args))]  # type: ignore[union-attr]


def _term_orders(term: Term) -> list[Term]:
    """A term in every operand order of its commutative op terms: as written first, each distinct one once."""
    if isinstance(term, OpTerm):
        arg_orders = _product([_term_orders(a) for a in term.args])
        out = [OpTerm(term.op, args) for args in arg_orders]
        if commutative(term.op):
            out += [OpTerm(term.op, args[::-1]) for args in arg_orders]
        return _distinct(out)
    if isinstance(term, Call):
        return _distinct([Call(term.name, args) for args in _product([_term_orders(a) for a in term.args])])
    if isinstance(term, Lookup):
        return _distinct([Lookup(term.table, args) for args in _product([_term_orders(a) for a in term.args])])
    if isinstance(term, TensorList):
        return [TensorList(items, rest) for items, rest in _list_orders(term.items, term.rest)]
    return [term]


def _list_orders(items: tuple[Term, ...], rest: Term | None) -> list[tuple[tuple[Term, ...], Term | None]]:
    """A tensor list's cells in every order, as its nested TCons cells: the first item's orders with the tail's."""
    if not items:
        return [((), r) for r in (_term_orders(rest) if rest is not None else [None])]
    combos = _product([_term_orders(items[0]), _list_orders(items[1:], rest)])
    return _distinct([((head, *tail), tail_rest) for head, (tail, tail_rest) in combos],
                     key=lambda c: str(TensorList(*c)))


def _product(choices: list[list[Any]]) -> list[tuple[Any, ...]]:
    """Every combination of one item per list; too many is refused before any is built.

    Combinations of distinct items are distinct, so a query with a part of
    more than :data:`MAX_VARIANTS` orders has more than that many itself.
    """
    if math.prod(map(len, choices)) > MAX_VARIANTS:
        raise _TooManyOrders
    return list(product(*choices))


def _distinct(variants: list[Any], key: Any = str) -> list[Any]:
    """``variants`` without repeats (same egglog text), in order; more than :data:`MAX_VARIANTS` is refused."""
    seen: dict[str, Any] = {}
    for variant in variants:
        seen.setdefault(key(variant), variant)
    out = list(seen.values())
    if len(out) > MAX_VARIANTS:
        raise _TooManyOrders
    return out
