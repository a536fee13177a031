"""Rules type-checked by egglog against the schema, errors explained in the words of a rule file.

Two e-graphs hold the schema, the stages and every provenance relation: one
runs each rule as written (egglog finds unknown constructors, arities, sorts
and unbound variables: ``file:line: rule 'name': problem``), the other each
operand order as the egglog engine runs it, so a rule whose provenance cannot
be recorded fails at load rather than in a run.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from egglog import bindings as eb

from ..ir.registry import REGISTRY
from .emit import HELPER_PROVENANCE, provenance_declaration, schema_text, wrote_declaration
from .model import RULE, STAGES, Declaration, Rule, RuleError
from .parse import egglog_detail
from .signatures import LIST_CONS, LIST_NIL, NO_INPUT, constructor_args
from .tables import FACT_TABLES


class Checker:
    """The two e-graphs of one load."""

    def __init__(self) -> None:
        self.written, self.instrumented = _egraph(), _egraph()

    def declare(self, declaration: Declaration, command: Any) -> None:
        """Declare a helper relation or function (egglog's parsed command) in both."""
        _run(self.written, command, declaration.file, declaration.line, None, False)
        self.instrumented.run_program(command)
        if declaration.output is None:  # a relation: its rows' provenance (see .emit)
            self.instrumented.run_program(*self.instrumented.parse_program(
                wrote_declaration(declaration.name, declaration.inputs)))

    def check(self, rule: Rule) -> None:
        """Type-check a rule as written (``rule.command``)."""
        _run(self.written, rule.command, rule.file, rule.line, rule.name, rule.kind == RULE)

    def check_program(self, rule: Rule) -> None:
        """Run one operand order as the engine runs it (``rule.program``)."""
        try:
            self.instrumented.run_program(*rule.program)
        except eb.EggSmolError as exc:
            raise RuleError(f"{rule.location}: rule {rule.base!r} cannot record provenance (only unions of Op terms "
                            f"can be recorded): {egglog_detail(exc)[1]}") from None


def _egraph() -> eb.EGraph:
    """An e-graph with the schema, the stages and every provenance relation declared."""
    egraph = eb.EGraph()
    decls = [f"(ruleset {s})" for s in STAGES] + [provenance_declaration(op) for op in [None, *REGISTRY]]
    egraph.run_program(*egraph.parse_program(schema_text() + "\n".join([*decls, HELPER_PROVENANCE])))
    return egraph


def _run(egraph: eb.EGraph, command: Any, file: str, line: int, name: str | None, is_rule: bool) -> None:
    """Run (type-check) one command; an egglog error becomes ``file:line: rule 'name': problem``."""
    try:
        egraph.run_program(command)
    except eb.EggSmolError as exc:
        error_line, detail = egglog_detail(exc)
        raise RuleError(f"{file}:{error_line or line}: {f'rule {name!r}: ' if name else ''}"
                        f"{explain(detail, is_rule)}") from None


def explain(detail: str, is_rule: bool) -> str:
    """egglog's type-check message in the words of a rule file: which problem, and what was expected."""
    if m := re.fullmatch(r"Unbound function (\S+)", detail):
        known = [NO_INPUT, LIST_NIL, LIST_CONS, *REGISTRY, *FACT_TABLES]
        close = difflib.get_close_matches(m.group(1), known, n=1)
        return f"unknown constructor {m.group(1)!r}" + (f"; did you mean {close[0]!r}?" if close else "")
    if m := re.fullmatch(r"Arity mismatch, expected (\d+) args: \((\S+)(.*)\)", detail, re.S):
        op, given = m.group(2), len(m.group(3).split())  # egglog shows the call with its arguments as written
        args = f" ({', '.join(a.name for a in constructor_args(REGISTRY[op]))})" if op in REGISTRY else ""
        takes = f"{m.group(1)} argument{'' if m.group(1) == '1' else 's'}"
        return f"wrong arity: {op} takes {takes}{args}, got {given} in {detail.partition(': ')[2]}"
    if m := re.fullmatch(r"Expect expression (.+) to have type (\S+), but get type (\S+)", detail, re.S):
        return f"wrong type: {m.group(1)} has sort {m.group(3)} where sort {m.group(2)} is expected"
    if m := re.fullmatch(r"Unbound symbol (\S+)", detail):
        side = "its query" if is_rule else "the left side"
        return f"variable {m.group(1)} is used but {side} does not bind it"
    return detail
