"""The rules as the fallback runs them: each direction of each operand order flattened, and the symmetries.

Each rule direction is flattened (:func:`rlx_egraph.rules.flat.flatten`): a
:class:`~rlx_egraph.rules.Rule` whose query and actions name every nested op
term.  A rewrite whose two sides are one op with its arguments permuted
(``residual-layer-norm-commute``) is a :class:`Symmetry`: the matcher tries the
permuted argument order wherever it matches that op, as the e-graph would hold
both orders.  A rule the fallback cannot apply is an :class:`Unsupported`
entry naming the rule, its ``file:line`` and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...rules import FACT_TABLES, Atom, Declaration, FactTable, Insert, Let, OpTerm, Rule, RuleSet, SetValue, Union, Var
from ...rules import Pattern as PatternAtom
from ...rules.flat import FlatError, flatten
from ...rules.model import REWRITE_ROOT


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


@dataclass
class CompiledRules:
    patterns: list[Rule] = field(default_factory=list)  # flat rule directions
    symmetries: list[Symmetry] = field(default_factory=list)
    tables: dict[str, Declaration | FactTable] = field(default_factory=dict)
    unsupported: list[Unsupported] = field(default_factory=list)
    plans: dict[str, Any] = field(default_factory=dict, repr=False)  # pattern name -> its matcher.MatcherPlan
    tracked: frozenset[str] = frozenset()  # helper relations whose rows keep the rules that wrote them


class CompileError(ValueError):
    """A rule form the fallback does not handle; becomes an :class:`Unsupported` entry."""


def compile_rules(ruleset: RuleSet) -> CompiledRules:
    """Compile every rule of ``ruleset`` (each direction of each operand order)."""
    out = CompiledRules(tracked=ruleset.tracked)
    out.tables.update(FACT_TABLES)
    out.tables.update((d.name, d) for d in ruleset.helpers)
    for rule in ruleset.rules:
        try:
            for d in rule.directions:
                perm = _permutation(d.query, d.actions)
                if perm is not None:
                    out.symmetries.append(Symmetry(rule.base, rule.stage, rule.location, *perm))
            out.patterns.extend(_checked(flat, out.tables) for flat, d in zip(flatten(rule), rule.directions,
                                                                              strict=True)
                                if _permutation(d.query, d.actions) is None)
        except (CompileError, FlatError) as exc:
            if all(u.rule != rule.base for u in out.unsupported):  # one entry per rule as written
                out.unsupported.append(Unsupported(rule.base, rule.location, str(exc)))
    return out


def _permutation(query: tuple[Atom, ...], actions: tuple[Any, ...]) -> tuple[str, tuple[int, ...]] | None:
    """(op, permutation) of a rewrite without conditions whose sides are one op over the same distinct
    variables, permuted."""
    if len(query) != 1 or len(actions) != 1 or not isinstance(lhs := query[0], PatternAtom) \
            or lhs.var != Var(REWRITE_ROOT) or not isinstance(rhs := actions[0], Union):
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


def _checked(flat: Rule, tables: dict[str, Declaration | FactTable]) -> Rule:
    """``flat``, if the fallback can apply it (else CompileError)."""
    for action in flat.actions:
        if isinstance(action, SetValue | Insert):
            decl = tables.get(action.table)
            function = isinstance(action, SetValue)
            if decl is None or (decl.output is not None) != function:
                raise CompileError(f"{'set of' if function else 'insert into'} {action.table!r}, which is not a "
                                   f"declared {'function' if function else 'relation'}")
    built = {a.var for a in flat.actions if isinstance(a, Let) and isinstance(a.term, OpTerm)}
    unions = flat.unions
    if built and not unions:
        raise CompileError("it builds terms but unions none of them into the graph, so nothing would use them")
    for u in unions:
        if str(u.left) in built and str(u.right) in built:
            raise CompileError(f"union of two new terms ({u.left}, {u.right}): the graph has no node to replace")
    return flat
