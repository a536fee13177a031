"""``.egg`` text -> the rule model.

egglog's own parser reads the text; this module turns its syntax objects into
the model (:mod:`.model`, :mod:`.terms`), and is the only code that looks at
them.  It refuses, with ``file:line``, what a rule file may not hold: commands
other than ``rule``, ``rewrite``, ``birewrite``, ``relation`` and ``function``;
a rule without a stage (``:ruleset``) or a ``:name``; actions that remove terms
(``delete``, ``subsume``, ``:subsume``).  Type errors (unknown constructors,
arities, sorts, unbound variables) are egglog's to find: see :mod:`.typecheck`.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from egglog import bindings as eb

from ..ir.registry import REGISTRY
from .model import (
    BIREWRITE,
    REWRITE,
    REWRITE_ROOT,
    RULE,
    STAGES,
    VARIANT_MARK,
    Action,
    Atom,
    Build,
    Declaration,
    Fact,
    Guard,
    Insert,
    Let,
    Panic,
    Pattern,
    Rule,
    RuleError,
    SetValue,
    Union,
    action_terms,
    atom_terms,
    equation,
)
from .primitives import PRIMITIVES
from .signatures import LIST_CONS, LIST_NIL, NO_INPUT
from .terms import (
    BOOL,
    F64,
    I64,
    STRING,
    UNIT,
    Absent,
    Call,
    Lit,
    Lookup,
    OpTerm,
    TensorList,
    Term,
    Var,
    constructor_names,
)

ALLOWED_COMMANDS = "rewrite, birewrite, rule and relation"
MAX_NESTING = 200  # parentheses a rule file may nest (egglog's parser and the model's walks recurse)
REMOVALS_REFUSED = ("rules may only add terms and facts (union, let, set, relation facts); the extractor already "
                    "picks the cheapest term of each e-class")


@dataclass(frozen=True)
class ParsedFile:
    """One rule file as data: its declarations (each with egglog's command, to type-check) and its rules as
    written (``Rule.command`` egglog's command), in file order."""

    file: str
    declarations: tuple[tuple[Declaration, Any], ...]
    rules: tuple[Rule, ...]


class Reader:
    """egglog's parser (one per thread: it is not shared)."""

    def __init__(self) -> None:
        self._egraph = eb.EGraph()

    def read(self, text: str, file: str | None = None) -> list[Any]:
        """egglog's commands for ``text``; a syntax error is a RuleError ``file:line: ...``."""
        try:
            return self._egraph.parse_program(text, filename=file)
        except eb.EggSmolError as exc:
            raise RuleError(egglog_error(file or "<text>", exc)) from None


@lru_cache(maxsize=64)
def parse_file(file: str, text: str) -> ParsedFile:
    """The model of rule file ``file`` (the name messages show) holding ``text``; cached by content."""
    depth, offset = _deepest(text)
    if depth > MAX_NESTING:
        raise RuleError(f"{file}:{line_of(text, offset)}: parentheses nest {depth} deep; a rule file may nest at most "
                        f"{MAX_NESTING}")
    commands = Reader().read(text, file)
    declarations: list[tuple[Declaration, Any]] = []
    rules: list[Rule] = []
    for k, command in enumerate(commands):
        if isinstance(command, eb.Relation | eb.FunctionCommand):
            declarations.append((_declaration(command, file, text), command))
        elif isinstance(command, eb.RewriteCommand | eb.BiRewriteCommand | eb.RuleCommand):
            rules.append(_rule(command, file, text))
        else:
            start = _command_starts(commands, text)[k]
            keyword = re.match(r"\(\s*([^\s()]+)", text[start:])
            raise RuleError(f"{file}:{line_of(text, start)}: '{keyword.group(1) if keyword else 'this command'}' "
                            f"does not belong in a rule file, which holds only {ALLOWED_COMMANDS} commands; "
                            f"the optimizer declares and runs the stages {', '.join(STAGES)}")
    return ParsedFile(file, tuple(declarations), tuple(rules))


def _declaration(command: Any, file: str, text: str) -> Declaration:
    span = command.span
    source, line = text[span.i:span.j], line_of(text, span.i)
    if isinstance(command, eb.Relation):
        return Declaration(command.name, tuple(command.inputs), None, None, file, line, source)
    merge = _term(command.merge) if command.merge is not None else None
    return Declaration(command.name, tuple(command.schema.input), command.schema.output, merge, file, line, source)


def _rule(command: Any, file: str, text: str) -> Rule:
    if isinstance(command, eb.RuleCommand):
        r = command.rule
        kind, stage, name, span = RULE, r.ruleset, r.name, r.span
    else:
        rw = command.rewrite
        kind = BIREWRITE if isinstance(command, eb.BiRewriteCommand) else REWRITE
        stage, name, span = command.name, rw.name, rw.span
    line = line_of(text, span.i)
    if stage not in STAGES:
        raise RuleError(f"{file}:{line}: rule {name or '(unnamed)'} needs ':ruleset' set to one of "
                        f"{', '.join(STAGES)} (got {stage or 'none'!r})")
    if not name or name.startswith("("):
        raise RuleError(f"{file}:{line}: every rule needs a ':name \"...\"'")
    if VARIANT_MARK in name:
        raise RuleError(f"{file}:{line}: rule name {name!r} contains {VARIANT_MARK!r}, which names the operand-order "
                        f"variants the loader generates ({name.split(VARIANT_MARK)[0]}{VARIANT_MARK}2, ...)")
    where = f"{file}:{line}: rule {name!r}"
    if kind == RULE:
        _refuse_removals(command.rule.head, name, file, text)
        if not isinstance(r.eval_mode, eb.Seminaive) or r.no_decomp or r.include_subsumed:
            raise RuleError(f"{where}: egglog's rule evaluation options are not supported")
        query = tuple(_atom(f, where) for f in r.body)
        actions = tuple(_action(a, where) for a in r.head)
        reads = [n for atom in query for t in atom_terms(atom) for n in constructor_names(t)]
        built = [n for action in actions for t in action_terms(action) for n in constructor_names(t)]
        builds, new_enodes = frozenset(built), len(built)
    else:
        if isinstance(command, eb.RewriteCommand) and command.subsume:
            raise RuleError(f"{where}: ':subsume' is not supported: {REMOVALS_REFUSED}")
        lhs, rhs = _term(rw.lhs), _term(rw.rhs)
        for side, term in [("left", lhs)] + ([("right", rhs)] if kind == BIREWRITE else []):
            if not isinstance(term, OpTerm):
                raise RuleError(f"{where}: the {side} side of a {kind} must be an op term, got {term}")
        conditions = tuple(_atom(f, where) for f in rw.conditions)
        root = Var(REWRITE_ROOT)
        query, actions = (Pattern(lhs, root), *conditions), (Union(root, rhs),)  # type: ignore[arg-type]
        reads = constructor_names(lhs) + [n for atom in conditions for t in atom_terms(atom)
                                          for n in constructor_names(t)]
        new_enodes = len(constructor_names(rhs))
        builds = frozenset(constructor_names(rhs))
        if kind == BIREWRITE:
            builds |= frozenset(reads)
            new_enodes = max(new_enodes, len(constructor_names(lhs)))
    return Rule(name, name, stage, file, line, text[span.i:span.j], frozenset(reads), builds, command,
                new_enodes=new_enodes, kind=kind, query=query, actions=actions)


def _refuse_removals(head: list[Any], name: str, file: str, text: str) -> None:
    """Rules only add to the e-graph: ``delete`` and ``subsume`` are refused."""
    for action in head:
        if isinstance(action, eb.Change):
            verb = "delete" if isinstance(action.change, eb.Delete) else "subsume"
            raise RuleError(f"{file}:{line_of(text, action.span.i)}: rule {name!r}: '{verb}' is not supported: "
                            f"{REMOVALS_REFUSED}")


def _term(expr: Any) -> Term:
    if isinstance(expr, eb.Var):
        return Var(expr.name)
    if isinstance(expr, eb.Lit):
        return _literal(expr.value)
    assert isinstance(expr, eb.Call), expr
    name, args = expr.name, tuple(_term(a) for a in expr.args)
    if name == NO_INPUT and not args:
        return Absent()
    if name == LIST_NIL and not args:
        return TensorList(())
    if name == LIST_CONS and len(args) == 2:
        head, tail = args
        return TensorList((head, *tail.items), tail.rest) if isinstance(tail, TensorList) else TensorList((head,), tail)
    if name in REGISTRY:
        return OpTerm(name, args)
    if name in PRIMITIVES:
        return Call(name, args)
    return Lookup(name, args)  # a fact table or a declared helper (an unknown name is egglog's type error)


def _literal(value: Any) -> Lit:
    if isinstance(value, eb.Bool):
        return Lit(value.value, BOOL)
    if isinstance(value, eb.Int):
        return Lit(value.value, I64)
    if isinstance(value, eb.Float):
        return Lit(value.value, F64)
    if isinstance(value, eb.String):
        return Lit(value.value, STRING)
    assert isinstance(value, eb.Unit), value
    return Lit(None, UNIT)


def _atom(fact: Any, where: str) -> Atom:
    """A query fact: an op term (:class:`Pattern`), a table row (:class:`Fact`) or a check (:class:`Guard`)."""
    if isinstance(fact, eb.Eq):
        return equation(_term(fact.left), _term(fact.right))
    term = _term(fact.expr)
    if isinstance(term, OpTerm | Absent | TensorList):
        return Pattern(term)
    if isinstance(term, Lookup):
        return Fact(term.table, term.args)
    if isinstance(term, Call):
        return Guard(term.name, term.args)
    raise RuleError(f"{where}: the query fact {term} is neither a call nor an equation")


def _action(action: Any, where: str) -> Action:
    if isinstance(action, eb.Let):
        return Let(action.lhs, _term(action.rhs))
    if isinstance(action, eb.Union):
        return Union(_term(action.lhs), _term(action.rhs))
    if isinstance(action, eb.Set):
        return SetValue(action.lhs, tuple(_term(a) for a in action.args), _term(action.rhs))
    if isinstance(action, eb.Panic):
        return Panic(action.msg)
    assert isinstance(action, eb.Expr_), action
    term = _term(action.expr)
    if isinstance(term, Lookup):
        return Insert(term.table, term.args)
    if isinstance(term, OpTerm | Absent | TensorList):
        return Build(term)
    raise RuleError(f"{where}: the action {term} neither adds a relation row nor builds a term")


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _command_starts(commands: list[Any], text: str) -> list[int]:
    """The offset of the top-level form each command was parsed from.

    A command's form is the one around its (possibly nested) span; a command
    without a span (``push``) comes from the form after the previous command's.
    """
    forms = _form_starts(text)
    out: list[int] = []
    k = -1
    for command in commands:
        span = _span_of(command)
        k = bisect.bisect_right(forms, span.i) - 1 if span is not None else min(k + 1, len(forms) - 1)
        out.append(forms[k])
    return out


def _form_starts(text: str) -> list[int]:
    """Offsets of the top-level parenthesised forms of egglog source (comments and strings skipped)."""
    return _scan(text)[0]


def _deepest(text: str) -> tuple[int, int]:
    """How deep the parentheses of egglog source nest, and the offset where they first do."""
    return _scan(text)[1:]


def _scan(text: str) -> tuple[list[int], int, int]:
    """The top-level forms' offsets, the deepest nesting and where it is (comments and strings skipped)."""
    starts: list[int] = []
    deepest, where = 0, 0
    depth, i = 0, 0
    while i < len(text):
        ch = text[i]
        if ch == ";":
            i = text.find("\n", i)
            if i < 0:
                break
        elif ch == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "(":
            if depth == 0:
                starts.append(i)
            depth += 1
            if depth > deepest:
                deepest, where = depth, i
        elif ch == ")":
            depth -= 1
        i += 1
    return starts, deepest, where


def _span_of(node: Any) -> Any:
    """The first source span in a parsed command (its own, or a nested part's)."""
    span = getattr(node, "span", None)
    if isinstance(span, eb.EgglogSpan):
        return span
    for part in ("rule", "rewrite", "action", "schedule", "command"):
        if hasattr(node, part):
            return _span_of(getattr(node, part))
    return None


def egglog_error(file: str, exc: Exception, fallback_line: int | None = None) -> str:
    """``file:line: message`` from egglog's ``In L:C-C of file: ...`` errors."""
    line, detail = egglog_detail(exc)
    return f"{file}:{line or fallback_line or 1}: {detail}"


def egglog_detail(exc: Exception) -> tuple[int | None, str]:
    """The line (when egglog names one) and the message of an egglog error (``In L:C-C of file: ...``, or
    ``In L:C-C: ...`` for text read without a file name)."""
    text = str(exc)
    m = re.search(r"In (\d+):\d+(?:-\d+(?::\d+)?)?(?: of [^:]+)?:(.*)", text, re.S)
    if not m:
        return None, text.strip()
    lines = [line.strip() for line in m.group(2).splitlines() if line.strip()]
    return int(m.group(1)), lines[-1] if len(lines) > 1 else (lines[0] if lines else text.strip())
