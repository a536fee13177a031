"""Flat rules: a rule's query and actions with every nested op term named by a variable.

An engine that matches rules on a graph, node by node, reads a rule in this
form (:func:`flatten`): one :class:`Rule` per direction (a birewrite has two),
whose

* query :class:`Pattern` atoms are ``(= ?v (Op a1 a2 ...))`` with each input a
  variable, :class:`Absent` or a :class:`TensorList` of variables, and each
  attribute a variable or a literal; a nested op term gets a fresh variable
  ``?$k`` and its own Pattern atom, written before its arguments' (top-down);
* :class:`Fact` and :class:`Guard` atoms are over value terms only (an op
  term inside one is named first, by its own Pattern);
* actions are :class:`Let` (an op term over variables, or a value),
  :class:`Union` of two variables, :class:`SetValue` and :class:`Insert` over
  value terms.

``(Neg (Scalar 0.0 ?dt))`` is read as the Scalar -0.0 leaf it stands for (see
:func:`negative_zero`).  A rule with a form a graph cannot hold raises
:class:`FlatError` naming why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from ..ir.graph import Node
from ..ir.registry import REGISTRY
from .model import Atom, Build, Fact, Guard, Insert, Let, Panic, Pattern, Rule, SetValue, Union, equation
from .signatures import constructor_args
from .terms import Absent, Call, Lit, Lookup, OpTerm, TensorList, Term, Var


class FlatError(ValueError):
    """A rule form a node-by-node matcher cannot run, and why."""


def negative_zero(term: OpTerm) -> OpTerm:
    """``(Neg (Scalar 0.0 ?dt))`` as the Scalar -0.0 it stands for: egglog's f64 equates -0.0 with 0.0, so the
    encoder writes a Scalar -0.0 leaf as that term, and rules name it so; on the graph it is the leaf."""
    inner = term.args[0] if term.op == "Neg" and len(term.args) == 1 else None
    if isinstance(inner, OpTerm) and inner.op == "Scalar" and isinstance(lit := inner.args[0], Lit) \
            and lit.sort == "f64" and lit.value == 0.0 and math.copysign(1.0, lit.value) > 0:  # type: ignore[arg-type]
        return OpTerm("Scalar", (Lit(-0.0, "f64"), *inner.args[1:]))
    return term


def is_negative_zero_scalar(node: Node) -> bool:
    """A Scalar -0.0 node: the term ``(Neg (Scalar 0.0 dtype))`` in egglog (see :func:`negative_zero`)."""
    return node.op == "Scalar" and node.attrs["value"] == 0.0 and math.copysign(1.0, node.attrs["value"]) < 0


def op_inputs(term: OpTerm) -> list[Term]:
    """The input arguments of an op term (its constructor's inputs come first)."""
    spec = constructor_args(REGISTRY[term.op])
    return [a for a, arg in zip(term.args, spec, strict=True) if arg.is_input]


def input_vars(term: OpTerm) -> list[str]:
    """The variables a flat op term's inputs name directly: each plain variable, then each list's items."""
    ins = op_inputs(term)
    out = [a.name for a in ins if isinstance(a, Var)]
    return out + [i.name for a in ins if isinstance(a, TensorList) for i in a.items if isinstance(i, Var)]


def flatten(rule: Rule) -> list[Rule]:
    """``rule`` flattened, once per direction (named as egglog names it, of kind ``rule``)."""
    out = []
    for d in rule.directions:
        flat = _Flattener()
        for atom in d.query:
            flat.atom(atom)
        for action in d.actions:
            flat.action(action)
        out.append(replace(rule, name=d.name, kind="rule", query=tuple(flat.query), actions=tuple(flat.actions)))
    return out


class _Flattener:
    def __init__(self) -> None:
        self.count = 0
        self.query: list[Atom] = []
        self.actions: list[Let | Union | SetValue | Insert] = []

    def fresh(self) -> Var:
        self.count += 1
        return Var(f"?${self.count}")

    def atom(self, atom: Atom) -> None:
        if isinstance(atom, Pattern):
            if not isinstance(atom.term, OpTerm):
                raise FlatError(f"{atom.term} can only appear as an argument of an op")
            if isinstance(atom.var, Var):
                self.node(atom.term, atom.var)
            elif isinstance(atom.var, OpTerm):
                self.node(atom.var, self.nested(atom.term))
            else:
                out = self.nested(atom.term)
                if atom.var is not None:
                    self.query.append(equation(out, self.value(atom.var)))
        elif isinstance(atom, Fact):
            value = None if atom.value is None else self.value(atom.value)
            self.query.append(Fact(atom.table, tuple(map(self.value, atom.args)), value))
        else:
            self.query.append(Guard(atom.name, tuple(map(self.value, atom.args))))

    def node(self, term: OpTerm, out: Var) -> None:
        at = len(self.query)
        flat = self.arguments(negative_zero(term), self.nested, self.attr)
        self.query.insert(at, Pattern(flat, out))  # before its arguments': read top-down

    def nested(self, term: OpTerm) -> Var:
        out = self.fresh()
        self.node(term, out)
        return out

    def attr(self, term: Term) -> Term:
        value = self.value(term)
        if isinstance(value, Var | Lit | Absent):
            return value
        var = self.fresh()
        self.query.append(equation(var, value))
        return var

    def value(self, term: Term) -> Term:
        """A value term of the query: op terms named, the rest as written."""
        if isinstance(term, OpTerm):
            return self.nested(term)
        if isinstance(term, Call | Lookup):
            return type(term)(term.name if isinstance(term, Call) else term.table, tuple(map(self.value, term.args)))
        if isinstance(term, TensorList):
            raise FlatError(f"{term} where a value is expected")
        return term

    def arguments(self, term: OpTerm, op_term: Callable[[OpTerm], Var], attr: Callable[[Term], Term]) -> OpTerm:
        """``term`` with its op-term inputs named by ``op_term`` and its attributes' terms by ``attr``."""
        args: list[Term] = []
        for arg, sub in zip(constructor_args(REGISTRY[term.op]), term.args, strict=True):
            if not arg.is_input:
                args.append(attr(sub))
            elif isinstance(sub, TensorList):
                rest = None if sub.rest is None else self.input(sub.rest, op_term)
                args.append(TensorList(tuple(self.input(i, op_term) for i in sub.items), rest))
            elif isinstance(sub, Absent):
                args.append(sub)
            else:
                args.append(self.input(sub, op_term))
        return OpTerm(term.op, tuple(args))

    def input(self, term: Term, op_term: Callable[[OpTerm], Var]) -> Var:
        if isinstance(term, Var):
            return term
        if isinstance(term, OpTerm):
            return op_term(term)
        if op_term == self.build:
            raise FlatError("an Op-valued table lookup in a new term is not supported")
        var = self.fresh()  # a lookup whose value is a node
        self.query.append(equation(var, self.value(term)))
        return var

    # --- actions -------------------------------------------------------------------------

    def action(self, action: object) -> None:
        if isinstance(action, Let):
            if isinstance(action.term, OpTerm):
                self.build(action.term, Var(action.var))
            else:
                self.actions.append(Let(action.var, self.new_value(action.term)))
        elif isinstance(action, Union):
            self.actions.append(Union(self.var_of(action.left), self.var_of(action.right)))
        elif isinstance(action, SetValue):
            self.actions.append(SetValue(action.table, tuple(map(self.new_value, action.args)),
                                         self.new_value(action.value)))
        elif isinstance(action, Insert):
            self.actions.append(Insert(action.table, tuple(map(self.new_value, action.args))))
        elif isinstance(action, Build) and isinstance(action.term, OpTerm):
            self.build(action.term)
        elif isinstance(action, Panic):
            raise FlatError("panic actions are not supported")
        else:
            raise FlatError(f"the action {action} is not supported")

    def build(self, term: OpTerm, out: Var | None = None) -> Var:
        var = out or self.fresh()
        flat = self.arguments(negative_zero(term), self.build, self.new_value)
        self.actions.append(Let(var.name, flat))
        return var

    def new_value(self, term: Term) -> Term:
        """A value term of the actions: op terms built, the rest as written."""
        if isinstance(term, OpTerm):
            return self.build(term)
        if isinstance(term, Call | Lookup):
            name = term.name if isinstance(term, Call) else term.table
            return type(term)(name, tuple(map(self.new_value, term.args)))
        if isinstance(term, TensorList):
            raise FlatError(f"{term} where a value is expected")
        return term

    def var_of(self, term: Term) -> Var:
        if isinstance(term, Var):
            return term
        if isinstance(term, OpTerm):
            return self.build(term)
        raise FlatError("union takes variables or op terms")
