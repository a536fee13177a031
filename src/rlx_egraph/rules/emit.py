"""The rule model written as egglog: the schema, each rule as written, and each rule as the egglog engine runs it.

As the engine runs it, a rule is instrumented with provenance: its actions
also add, for every op term they construct, a row ``(built-<Op> <the
constructor's arguments> "<base rule name>")`` and, for every union, a row
``(merged-by <class> "<base rule name>")``.  The tables are lowercase, so they
are not counted as e-nodes; the e-graph view reads them back.  A rewrite runs
as the rule ``(= ?rewrite-root lhs) conditions => (union ?rewrite-root rhs)``,
a birewrite as two such rules named ``<name>=>`` and ``<name><=``.  The text
is laid out as egglog prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..ir.registry import REGISTRY
from .model import BIREWRITE, REWRITE, Action, Atom, Build, Insert, Let, Rule, SetValue, Union, action_terms
from .signatures import LIST_CONS, LIST_NIL, NO_INPUT, constructor_args
from .tables import FACT_TABLES
from .terms import STRING, Lit, OpTerm, Term, children, quoted

MERGED_BY = "merged-by"  # (merged-by class rule): ``rule`` unioned something into ``class``


def built_by_table(op: str) -> str:
    """The provenance relation of ``op``: its constructor's arguments, then the rule name."""
    return f"built-{op}"


def provenance_declaration(op: str | None) -> str:
    """The egglog declaration of ``op``'s provenance relation, or of ``merged-by`` for ``None``."""
    if op is None:
        return f"(relation {MERGED_BY} (Op String))"
    sorts = " ".join(a.sort for a in constructor_args(REGISTRY[op]))
    return f"(relation {built_by_table(op)} ({sorts} String))"


def schema_text() -> str:
    """The egglog declarations rules are written against: sorts, the Op datatype (one constructor per registered
    op), tensor lists and the fact tables."""
    lines = [
        ";; generated from the rlx_egraph op registry",
        "(sort IntVec (Vec i64))",
        "(datatype Op",
        f"  ({NO_INPUT})",
    ]
    variadic = [spec for spec in REGISTRY.values() if spec.variadic]
    for spec in REGISTRY.values():
        if not spec.variadic:
            sorts = " ".join(a.sort for a in constructor_args(spec))
            lines.append(f"  ({spec.name}{' ' + sorts if sorts else ''})")
    lines.append(")")
    # Variadic ops take a TensorList, which itself holds Ops: declared after both sorts exist.
    lines.append(f"(datatype TensorList ({LIST_NIL}) ({LIST_CONS} Op TensorList))")
    for spec in variadic:
        sorts = " ".join(a.sort for a in constructor_args(spec))
        lines.append(f"(constructor {spec.name} ({sorts}) Op)")
    lines.extend(table.declaration for table in FACT_TABLES.values())
    return "\n".join(lines) + "\n"


def rule_command(name: str, stage: str, query: Iterable[Atom], actions: Iterable[Action]) -> str:
    """An egglog ``rule`` command."""
    return (f"(rule ({_lines(query)})\n      ({_lines(actions)})\n"
            f"        :ruleset {stage} :name {quoted(name)})")


def _lines(items: Iterable[Atom | Action]) -> str:
    return "\n       ".join(map(str, items))


def rule_text(rule: Rule) -> str:
    """The rule as written (this operand order): a ``rule``, ``rewrite`` or ``birewrite`` command."""
    if rule.kind not in (REWRITE, BIREWRITE):
        return rule_command(rule.name, rule.stage, rule.query, rule.actions)
    when = f" :when ({' '.join(map(str, rule.conditions))})" if rule.conditions else ""
    return f"({rule.kind} {rule.lhs} {rule.rhs}{when} :ruleset {rule.stage} :name {quoted(rule.name)})"


def program_text(rule: Rule) -> str:
    """The rule as the egglog engine runs it: each direction a ``rule`` command with provenance actions."""
    return "\n".join(rule_command(d.name, rule.stage, d.query, (*d.actions, *provenance(d.actions, rule.base)))
                     for d in rule.directions)


def provenance(actions: tuple[Action, ...], base: str) -> list[Action]:
    """Actions recording that rule ``base`` built each op term of ``actions`` and merged each union."""
    name = Lit(base, STRING)
    out: dict[str, Action] = {}
    for term in _op_terms(actions):
        row = Insert(built_by_table(term.op), (*term.args, name))
        out.setdefault(str(row), row)
    for action in actions:
        if isinstance(action, Union):
            row = Insert(MERGED_BY, (action.left, name))
            out.setdefault(str(row), row)
    return list(out.values())


def _op_terms(actions: tuple[Action, ...]) -> Iterator[OpTerm]:
    """Every op term the actions construct, inner ones first (a ``set``'s arguments before its value)."""
    for action in actions:
        if isinstance(action, Let | Union | SetValue | Insert | Build):
            for term in action_terms(action):
                yield from _post_order(term)


def _post_order(term: Term) -> Iterator[OpTerm]:
    for child in children(term):
        yield from _post_order(child)
    if isinstance(term, OpTerm) and term.op in REGISTRY:
        yield term
