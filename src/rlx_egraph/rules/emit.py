"""The rule model written as egglog: the schema, each rule as written, and each rule as the egglog engine runs it.

As the engine runs it, a rule is instrumented with provenance: its actions
also add, for every op term they construct, a row ``(built-<Op> <the
constructor's arguments> "<base rule name>")`` and, for every union, a row
``(merged-by <class> "<base rule name>")``.  Rows of the helper relations a
set tracks (:attr:`.ruleset.RuleSet.tracked`) carry provenance too: a rule that
adds the row ``(<rel> args)`` sets
``(wrote-<rel> args)``, a set of rule names, to its own name and the names of
the rows its query read; a rule whose query reads helper rows sets
``(relied-on <class>)`` to their names for the class of every op term it
builds or unions, so a wrong value built on a wrong helper row names the rule
that wrote the row.  The tables are lowercase, so they are not counted as
e-nodes; the e-graph view reads them back.  A rewrite runs
as the rule ``(= ?rewrite-root lhs) conditions => (union ?rewrite-root rhs)``,
a birewrite as two such rules named ``<name>=>`` and ``<name><=``.  The text
is laid out as egglog prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..ir.registry import REGISTRY
from .model import (
    BIREWRITE,
    REWRITE,
    Action,
    Atom,
    Build,
    Fact,
    Insert,
    Let,
    Rule,
    SetValue,
    Union,
    action_terms,
)
from .signatures import LIST_CONS, LIST_NIL, NO_INPUT, constructor_args
from .tables import FACT_TABLES
from .terms import STRING, Call, Lit, OpTerm, Term, Var, children, quoted

MERGED_BY = "merged-by"  # (merged-by class rule): ``rule`` unioned something into ``class``
RULE_NAMES = "RuleNames"  # the sort of a set of rule names
RELIED_ON = "relied-on"  # (relied-on class) = names: the rules that wrote the helper rows a rule building it read
HELPER_PROVENANCE = (f"(sort {RULE_NAMES} (Set String))\n"
                     f"(function {RELIED_ON} (Op) {RULE_NAMES} :merge (set-union old new))")


def built_by_table(op: str) -> str:
    """The provenance relation of ``op``: its constructor's arguments, then the rule name."""
    return f"built-{op}"


def provenance_declaration(op: str | None) -> str:
    """The egglog declaration of ``op``'s provenance relation, or of ``merged-by`` for ``None``."""
    if op is None:
        return f"(relation {MERGED_BY} (Op String))"
    sorts = " ".join(a.sort for a in constructor_args(REGISTRY[op]))
    return f"(relation {built_by_table(op)} ({sorts} String))"


def wrote_table(relation: str) -> str:
    """The provenance function of helper relation ``relation``: its row -> the rules that wrote it (see above)."""
    return f"wrote-{relation}"


def wrote_declaration(relation: str, sorts: Iterable[str]) -> str:
    """The egglog declaration of ``relation``'s provenance function, for a relation of these column sorts."""
    return (f"(function {wrote_table(relation)} ({' '.join(sorts)}) {RULE_NAMES} "
            f":merge (set-union old new))")


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


def program_text(rule: Rule, relations: frozenset[str] = frozenset()) -> str:
    """The rule as the egglog engine runs it: each direction a ``rule`` command with provenance actions
    (``relations``: the helper relations, whose rows carry provenance)."""
    out = []
    for d in rule.directions:
        read = [a for a in d.query if isinstance(a, Fact) and a.value is None and a.table in relations]
        names = [Var(f"?rlx-wrote-{k}") for k in range(len(read))]
        query = (*d.query, *(Fact(wrote_table(a.table), a.args, v) for a, v in zip(read, names, strict=True)))
        actions = (*d.actions, *provenance(d.actions, rule.base),
                   *helper_provenance(d.actions, rule.base, names, relations))
        out.append(rule_command(d.name, rule.stage, query, actions))
    return "\n".join(out)


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


def helper_provenance(actions: tuple[Action, ...], base: str, read: list[Var], relations: frozenset[str]
                      ) -> list[Action]:
    """Actions recording which rules the helper rows a rule adds and the terms it builds rest on: ``read`` holds
    the names of the writers of each helper row its query read (see the module docstring)."""
    relied: Term | None = None
    for names in read:
        relied = names if relied is None else Call("set-union", (relied, names))
    mine = Call("set-of", (Lit(base, STRING),)) if relied is None else Call("set-insert", (relied, Lit(base, STRING)))
    out: dict[str, Action] = {}
    for action in actions:
        if isinstance(action, Insert) and action.table in relations:
            row = SetValue(wrote_table(action.table), action.args, mine)
            out.setdefault(str(row), row)
    if relied is not None:
        built = [a.left for a in actions if isinstance(a, Union)] + list(_op_terms(actions))
        for term in built:
            row = SetValue(RELIED_ON, (term,), relied)
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
