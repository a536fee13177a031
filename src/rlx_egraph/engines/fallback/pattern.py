"""The rules as the fallback runs them: each direction of each operand order, flattened.

Each rule direction is flattened (:func:`rlx_egraph.rules.flat.flatten`): a
:class:`~rlx_egraph.rules.Rule` whose query and actions name every nested op
term.  A rule the fallback cannot apply is an :class:`Unsupported` entry
naming the rule, its ``file:line`` and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...rules import (
    FACT_TABLES,
    Declaration,
    Fact,
    FactTable,
    Insert,
    Let,
    Lookup,
    OpTerm,
    Rule,
    RuleSet,
    SetValue,
    Term,
    Var,
)
from ...rules.flat import FlatError, flatten


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
    tables: dict[str, Declaration | FactTable] = field(default_factory=dict)
    unsupported: list[Unsupported] = field(default_factory=list)
    plans: dict[str, Any] = field(default_factory=dict, repr=False)  # pattern name -> its matcher.MatcherPlan
    tracked: frozenset[str] = frozenset()  # helper relations whose rows keep the rules that wrote them
    orders: dict[str, frozenset[int]] = field(default_factory=dict)  # see order_columns


class CompileError(ValueError):
    """A rule form the fallback does not handle; becomes an :class:`Unsupported` entry."""


def compile_rules(ruleset: RuleSet) -> CompiledRules:
    """Compile every rule of ``ruleset`` (each direction of each operand order)."""
    out = CompiledRules(tracked=ruleset.tracked)
    out.tables.update(FACT_TABLES)
    out.tables.update((d.name, d) for d in ruleset.helpers)
    for rule in ruleset.rules:
        try:
            out.patterns.extend(_checked(flat, out.tables) for flat in flatten(rule))
        except (CompileError, FlatError) as exc:
            if all(u.rule != rule.base for u in out.unsupported):  # one entry per rule as written
                out.unsupported.append(Unsupported(rule.base, rule.location, str(exc)))
    out.orders = order_columns(out.patterns)
    return out


def order_columns(patterns: list[Rule]) -> dict[str, frozenset[int]]:
    """Per helper table, the columns (-1: the value) that hold a ``param-order``: written from one, or from
    such a column of another table.  A block's rows carry them over in the whole graph's numbering."""
    found: dict[str, set[int]] = {"param-order": {-1}}

    def is_order(term: Term, names: set[str]) -> bool:
        return (isinstance(term, Var) and term.name in names) or \
            (isinstance(term, Lookup) and -1 in found.get(term.table, ()))

    changed = True
    while changed:
        changed = False
        for p in patterns:
            names: set[str] = set()
            for atom in p.query:
                if isinstance(atom, Fact):
                    columns = found.get(atom.table, set())
                    names.update(t.name for c, t in [*enumerate(atom.args), (-1, atom.value)]
                                 if c in columns and isinstance(t, Var))
            for action in p.actions:
                if isinstance(action, Let) and is_order(action.term, names):
                    names.add(action.var)
                elif isinstance(action, SetValue | Insert):
                    terms = [*enumerate(action.args)] + ([(-1, action.value)] if isinstance(action, SetValue) else [])
                    more = {c for c, t in terms if is_order(t, names)} - found.get(action.table, set())
                    if more:
                        found.setdefault(action.table, set()).update(more)
                        changed = True
    return {table: frozenset(columns) for table, columns in found.items() if table != "param-order"}


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
    if built and not flat.unions:
        raise CompileError("it builds terms but unions none of them into the graph, so nothing would use them")
    for u in flat.unions:
        if str(u.left) in built and str(u.right) in built:
            raise CompileError(f"union of two new terms ({u.left}, {u.right}): the graph has no node to replace")
    return flat
