"""Terms of the rule model: what patterns, guards, facts and actions are made of.

A term is a variable (:class:`Var`), a literal (:class:`Lit`), an op term
(:class:`OpTerm`, a registered op's constructor applied to its inputs and
attributes), an absent optional input (:class:`Absent`), a tensor list
(:class:`TensorList`, a variadic input), a primitive call (:class:`Call`:
``+``, ``vec-get``, ``<``, ... see :mod:`.primitives`) or a table lookup
(:class:`Lookup`: a fact table such as ``shape``, or a helper relation or
function declared in a rule file).  Terms are immutable and hashable;
``str(term)`` is its egglog text.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

from .signatures import LIST_CONS, LIST_NIL, NO_INPUT

I64, F64, STRING, BOOL, UNIT = "i64", "f64", "String", "bool", "Unit"


@dataclass(frozen=True)
class Var:
    """A variable, named as written (``?x``)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Lit:
    """A literal of egglog sort ``sort`` (``i64``, ``f64``, ``String``, ``bool`` or ``Unit``, whose value is None).

    The sort is kept because Python equates ``1``, ``1.0`` and ``True``."""

    value: int | float | str | bool | None
    sort: str

    def __str__(self) -> str:
        if self.sort == BOOL:
            return "true" if self.value else "false"
        if self.sort == UNIT:
            return "()"
        if self.sort == STRING:
            return quoted(str(self.value))
        if self.sort == F64:
            return float_text(float(self.value))  # type: ignore[arg-type]
        return str(self.value)


@dataclass(frozen=True)
class OpTerm:
    """A registered op applied to its constructor arguments: inputs first, then attributes
    (:func:`.signatures.constructor_args`)."""

    op: str
    args: tuple[Term, ...]

    def __str__(self) -> str:
        return call_text(self.op, self.args)


@dataclass(frozen=True)
class Absent:
    """An optional input that is not there: egglog's ``(NoInput)``."""

    def __str__(self) -> str:
        return f"({NO_INPUT})"


@dataclass(frozen=True)
class TensorList:
    """A variadic input: ``items``, then ``rest`` (a term of the list's tail, usually a variable) or the end."""

    items: tuple[Term, ...]
    rest: Term | None = None

    def __str__(self) -> str:
        text = str(self.rest) if self.rest is not None else f"({LIST_NIL})"
        for item in reversed(self.items):
            text = f"({LIST_CONS} {item} {text})"
        return text


@dataclass(frozen=True)
class Call:
    """A primitive operation applied to terms (its meaning: :data:`.primitives.PRIMITIVES`)."""

    name: str
    args: tuple[Term, ...]

    def __str__(self) -> str:
        return call_text(self.name, self.args)


@dataclass(frozen=True)
class Lookup:
    """The value of a table at these arguments: a fact table (:data:`.tables.FACT_TABLES`) or a helper
    relation or function declared in a rule file."""

    table: str
    args: tuple[Term, ...]

    def __str__(self) -> str:
        return call_text(self.table, self.args)


Term = Var | Lit | OpTerm | Absent | TensorList | Call | Lookup


def call_text(name: str, args: tuple[Term, ...]) -> str:
    return f"({name}{''.join(' ' + str(a) for a in args)})"


def quoted(text: str) -> str:
    """``text`` as an egglog string literal (egglog reads back exactly ``text``)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def float_text(value: float) -> str:
    """An f64 literal as egglog writes it: positional digits, never an exponent, always a decimal point."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = repr(value)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text if "." in text else f"{text}.0"


def children(term: Term) -> tuple[Term, ...]:
    """The terms directly inside ``term``."""
    if isinstance(term, OpTerm | Call | Lookup):
        return term.args
    if isinstance(term, TensorList):
        return term.items if term.rest is None else (*term.items, term.rest)
    return ()


def subterms(term: Term) -> Iterator[Term]:
    """``term`` and every term inside it, outer ones first, left to right."""
    stack = [term]
    while stack:
        t = stack.pop()
        yield t
        stack.extend(reversed(children(t)))


def variables(term: Term) -> list[str]:
    """The variables ``term`` uses, once per use, left to right."""
    out: list[str] = []
    _add_variables(term, out)
    return out


def _add_variables(term: Term, out: list[str]) -> None:
    """Append the variables of ``term`` to ``out`` (recursion without :func:`subterms`' generator: the soundness
    checker renames rule queries apart hundreds of thousands of times)."""
    if isinstance(term, Var):
        out.append(term.name)
    elif isinstance(term, OpTerm | Call | Lookup):
        for arg in term.args:
            _add_variables(arg, out)
    elif isinstance(term, TensorList):
        for item in term.items:
            _add_variables(item, out)
        if term.rest is not None:
            _add_variables(term.rest, out)


def rename(term: Term, names: dict[str, Term]) -> Term:
    """``term`` with each variable named in ``names`` replaced by its term."""
    if isinstance(term, Var):
        return names.get(term.name, term)
    if isinstance(term, OpTerm):
        return OpTerm(term.op, tuple(rename(a, names) for a in term.args))
    if isinstance(term, Call):
        return Call(term.name, tuple(rename(a, names) for a in term.args))
    if isinstance(term, Lookup):
        return Lookup(term.table, tuple(rename(a, names) for a in term.args))
    if isinstance(term, TensorList):
        return TensorList(tuple(rename(a, names) for a in term.items),
                          None if term.rest is None else rename(term.rest, names))
    return term


def constructor_names(term: Term) -> list[str]:
    """The egglog constructors ``term`` applies, once per application, outer ones first: ops, ``NoInput``, and a
    tensor list's ``TCons`` cells and ``TNil`` end."""
    out: list[str] = []
    for t in subterms(term):
        if isinstance(t, OpTerm):
            out.append(t.op)
        elif isinstance(t, Absent):
            out.append(NO_INPUT)
        elif isinstance(t, TensorList):
            out += [LIST_CONS] * len(t.items) + ([LIST_NIL] if t.rest is None else [])
    return out
