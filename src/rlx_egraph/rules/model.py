"""The rule model: a rule as data, parsed once from its ``.egg`` text.

A :class:`Rule` is a *query* (atoms that must all hold) and *actions* (what it
adds when they do).  Query atoms:

* :class:`Pattern`: an op term the e-graph holds, usually bound to a variable: ``(= ?e (Add ?x ?y))``
* :class:`Fact`: a row of a fact table or helper relation: ``(= (shape ?x) ?s)``, ``(ln-normed ?n ?x ?eps)``
* :class:`Guard`: a check over values: ``(> ?c 0.0)``, ``(= (vec-length ?s) 4)``

Actions (:data:`Action`): :class:`Let`, :class:`Union`, :class:`SetValue`,
:class:`Insert` (a relation row), :class:`Build` (a term on its own) and
:class:`Panic`.  A ``rewrite`` is the rule ``(= ?rewrite-root lhs) conditions
=> (union ?rewrite-root rhs)``; a ``birewrite`` also runs the other way.
``str()`` of an atom or action is its egglog text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..errors import RlxError
from .terms import Absent, Lookup, OpTerm, TensorList, Term, Var, call_text, quoted, rename, subterms, variables

# Saturation stages, run in this order; every rule belongs to one.
STAGES: tuple[str, ...] = ("simplify", "recognize", "fuse", "blocks")
STAGE_DOCS = {
    "simplify": "algebraic clean-ups (double negation, inverse transposes, x*1, ...)",
    "recognize": "export forms back to ops (x*sigmoid(x) -> Silu, erf-GELU, decomposed norms)",
    "fuse": "kernel fusions (matmul epilogues, residual norms, SwiGLU, shared-input matmuls, ...)",
    "blocks": "whole-block fusions built on fused ops (attention block, transformer layer)",
}
RULE, REWRITE, BIREWRITE = "rule", "rewrite", "birewrite"
REWRITE_ROOT = "?rewrite-root"  # the matched term of a rewrite, once it is written as a rule
VARIANT_MARK = "#"  # <name>#<k>: the k-th operand order of rule <name>


class RuleError(RlxError, ValueError):
    """A rule file is malformed, or a rule failed; the message starts with ``file:line``."""


PatternTerm = OpTerm | Absent | TensorList  # the constructor terms


@dataclass(frozen=True)
class Pattern:
    """The e-graph holds ``term``; ``var`` (usually a variable) names its e-class."""

    term: PatternTerm
    var: Term | None = None
    var_first: bool = True  # written (= var term) rather than (= term var)

    def __str__(self) -> str:
        if self.var is None:
            return str(self.term)
        return f"(= {self.var} {self.term})" if self.var_first else f"(= {self.term} {self.var})"


@dataclass(frozen=True)
class Fact:
    """A row of a fact table or helper relation holds; for a function, its value is ``value`` (None: any)."""

    table: str
    args: tuple[Term, ...]
    value: Term | None = None
    value_first: bool = False  # written (= value (table ...)) rather than (= (table ...) value)

    @property
    def lookup(self) -> Lookup:
        return Lookup(self.table, self.args)

    def __str__(self) -> str:
        if self.value is None:
            return str(self.lookup)
        return f"(= {self.value} {self.lookup})" if self.value_first else f"(= {self.lookup} {self.value})"


@dataclass(frozen=True)
class Guard:
    """A check over values: ``=`` (two terms have one value) or a primitive check (``<``, ``!=``, ...; any
    primitive holds where it has a value)."""

    name: str
    args: tuple[Term, ...]

    def __str__(self) -> str:
        return call_text(self.name, self.args)


Atom = Pattern | Fact | Guard


@dataclass(frozen=True)
class Let:
    """Bind ``var`` to ``term`` (a new term, or a value)."""

    var: str
    term: Term

    def __str__(self) -> str:
        return f"(let {self.var} {self.term})"


@dataclass(frozen=True)
class Union:
    """``left`` and ``right`` are one e-class."""

    left: Term
    right: Term

    def __str__(self) -> str:
        return f"(union {self.left} {self.right})"


@dataclass(frozen=True)
class SetValue:
    """Set a function's value at ``args`` (merged with the value it has, as its declaration says)."""

    table: str
    args: tuple[Term, ...]
    value: Term

    def __str__(self) -> str:
        return f"(set {call_text(self.table, self.args)} {self.value})"


@dataclass(frozen=True)
class Insert:
    """Add the row ``args`` to a relation."""

    table: str
    args: tuple[Term, ...]

    def __str__(self) -> str:
        return call_text(self.table, self.args)


@dataclass(frozen=True)
class Build:
    """Build ``term`` on its own (no union: nothing reads it unless another action or rule does)."""

    term: PatternTerm

    def __str__(self) -> str:
        return str(self.term)


@dataclass(frozen=True)
class Panic:
    """Stop the run with ``message``: the optimizer raises a RuleError naming the rule."""

    message: str

    def __str__(self) -> str:
        return f"(panic {quoted(self.message)})"


Action = Let | Union | SetValue | Insert | Build | Panic


def equation(left: Term, right: Term) -> Atom:
    """The query atom ``(= left right)``: a Pattern when a side is an op term (or another constructor term), a Fact
    when a side is a table lookup, else a Guard."""
    constructor = OpTerm | Absent | TensorList
    if isinstance(right, constructor):
        return Pattern(right, left, var_first=True)
    if isinstance(left, constructor):
        return Pattern(left, right, var_first=False)
    if isinstance(left, Lookup):
        return Fact(left.table, left.args, right)
    if isinstance(right, Lookup):
        return Fact(right.table, right.args, left, value_first=True)
    return Guard("=", (left, right))


def atom_terms(atom: Atom) -> tuple[Term, ...]:
    """The terms an atom is made of, as written left to right."""
    if isinstance(atom, Pattern):
        if atom.var is None:
            return (atom.term,)
        return (atom.var, atom.term) if atom.var_first else (atom.term, atom.var)
    if isinstance(atom, Fact):
        if atom.value is None:
            return (atom.lookup,)
        return (atom.value, atom.lookup) if atom.value_first else (atom.lookup, atom.value)
    return atom.args


def action_terms(action: Action) -> tuple[Term, ...]:
    """The terms an action is made of (a ``set``'s arguments, then its value)."""
    if isinstance(action, Let):
        return (action.term,)
    if isinstance(action, Union):
        return (action.left, action.right)
    if isinstance(action, SetValue):
        return (*action.args, action.value)
    if isinstance(action, Insert):
        return action.args
    if isinstance(action, Build):
        return (action.term,)
    return ()


def rename_atom(atom: Atom, names: dict[str, Term]) -> Atom:
    """``atom`` with each variable named in ``names`` replaced by its term."""
    if isinstance(atom, Pattern):
        term = rename(atom.term, names)
        return Pattern(term, None if atom.var is None else rename(atom.var, names), atom.var_first)  # type: ignore
    if isinstance(atom, Fact):
        return Fact(atom.table, tuple(rename(a, names) for a in atom.args),
                    None if atom.value is None else rename(atom.value, names), atom.value_first)
    return Guard(atom.name, tuple(rename(a, names) for a in atom.args))


def atom_variables(atom: Atom) -> list[str]:
    """The variables an atom uses, once per use, as written left to right."""
    return [v for term in atom_terms(atom) for v in variables(term)]


def tables_of(terms: tuple[Term, ...]) -> list[str]:
    """The tables the terms look up."""
    return [t.table for term in terms for t in subterms(term) if isinstance(t, Lookup)]


@dataclass(frozen=True)
class Direction:
    """One way a rule runs in egglog: its egglog name, query and actions (a birewrite has two)."""

    name: str
    query: tuple[Atom, ...]
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class Rule:
    """One rule: where it is, which stage runs it, what it matches and what it adds.

    It is one operand order (:attr:`order`, 1 as written) of the rule as
    written, named :attr:`base`, which provenance and match counts use; the
    other orders are named ``<base>#2``, ``<base>#3``, ...  ``command`` and
    ``program`` are egglog's parsed commands of this order as written and as
    the egglog engine runs it (instrumented with provenance).
    """

    name: str
    base: str
    stage: str
    file: str
    line: int
    source: str  # the rule as written in its file
    reads: frozenset[str]  # the constructors its query applies
    builds: frozenset[str]  # the constructors its actions apply (a birewrite: both sides)
    command: Any = field(repr=False, compare=False)
    program: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    new_enodes: int = 0  # at most this many e-nodes per match: the constructor applications it builds
    kind: str = RULE  # RULE, REWRITE or BIREWRITE, as written
    query: tuple[Atom, ...] = ()  # a rewrite's: (= ?rewrite-root lhs), then its conditions
    actions: tuple[Action, ...] = ()  # a rewrite's: (union ?rewrite-root rhs)
    order: int = 1  # which operand order of the rule as written (1: as written)
    program_text: str = field(default="", repr=False, compare=False)  # the egglog text of ``program``

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def lhs(self) -> PatternTerm:
        """A rewrite's left side."""
        self._rewrite_only("lhs")
        first = self.query[0]
        assert isinstance(first, Pattern)
        return first.term

    @property
    def rhs(self) -> Term:
        """A rewrite's right side."""
        self._rewrite_only("rhs")
        union = self.actions[0]
        assert isinstance(union, Union)
        return union.right

    @property
    def conditions(self) -> tuple[Atom, ...]:
        """A rewrite's ``:when`` conditions."""
        self._rewrite_only("conditions")
        return self.query[1:]

    def _rewrite_only(self, what: str) -> None:
        if self.kind == RULE:
            raise AttributeError(f"rule {self.name!r} is a rule, not a rewrite: it has no {what}")

    @property
    def directions(self) -> tuple[Direction, ...]:
        """How it runs in egglog: a rewrite and a rule run one way, a birewrite both (``name=>``, ``name<=``)."""
        if self.kind != BIREWRITE:
            return (Direction(self.name, self.query, self.actions),)
        root = Var(REWRITE_ROOT)
        back = (Pattern(self.rhs, root), *self.conditions), (Union(root, self.lhs),)  # type: ignore[arg-type]
        return Direction(f"{self.name}=>", self.query, self.actions), Direction(f"{self.name}<=", *back)

    @property
    def egglog_names(self) -> tuple[str, ...]:
        """egglog's names for it (its match counts are reported under these)."""
        return tuple(d.name for d in self.directions)

    @property
    def unions(self) -> tuple[Union, ...]:
        return tuple(a for a in self.actions if isinstance(a, Union))

    @property
    def panics(self) -> bool:
        """Whether an action is a ``panic``: the rule stops the run wherever it matches."""
        return any(isinstance(a, Panic) for a in self.actions)

    @property
    def facts_only(self) -> bool:
        """A rule whose actions add facts (relation rows, function values, terms) but union nothing (and do not
        panic)."""
        return self.kind == RULE and not self.unions and not self.panics

    @cached_property
    def tables_read(self) -> frozenset[str]:
        """The fact tables and helper relations its query reads."""
        return frozenset(name for atom in self.query for name in tables_of(atom_terms(atom)))

    @cached_property
    def tables_written(self) -> frozenset[str]:
        """The fact tables and helper relations its actions add rows to."""
        return frozenset(a.table for a in self.actions if isinstance(a, SetValue | Insert))

    @property
    def variables(self) -> tuple[str, ...]:
        """Its variables in order of first use: the query's, then those its actions bind with ``let``."""
        names = [v for atom in self.query for term in atom_terms(atom) for v in variables(term)]
        names += [a.var for a in self.actions if isinstance(a, Let)]
        return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Declaration:
    """A helper relation or function declared in a rule file (``output`` None: a relation)."""

    name: str
    inputs: tuple[str, ...]
    output: str | None
    merge: Term | None  # a function's :merge expression over ``old`` and ``new``; None: :no-merge
    file: str
    line: int
    source: str  # as written
    borrowed: bool = False  # declared by a shipped file that the set does not load (see RuleSet)

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"
