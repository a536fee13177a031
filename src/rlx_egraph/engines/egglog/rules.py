"""The egglog engine's side of the rule model (:mod:`rlx_egraph.rules`).

The engine runs :attr:`RuleSet.text` (each rule's operand orders, instrumented
with provenance by :mod:`rlx_egraph.rules.emit`), reports matches under
egglog's names for them (:func:`egglog_rule_bases`), and turns a rule that
fails while saturation applies it into a :class:`RuleError` naming the rule
(:func:`runtime_error`).
"""

from __future__ import annotations

import re

from ...rules.emit import MERGED_BY, RELIED_ON, built_by_table, provenance_declaration
from ...rules.model import STAGE_DOCS, STAGES, VARIANT_MARK, Panic, Rule, RuleError, SetValue
from ...rules.parse import ALLOWED_COMMANDS
from ...rules.ruleset import SHIPPED_RULES_DIR, RuleSet, Source, default_rule_dir, load_rules, rule_files
from ...rules.variants import MAX_VARIANTS


def egglog_rule_bases(rules: RuleSet) -> dict[str, str]:
    """The base rule name of every rule egglog runs, by egglog's name for it (operand orders, rewrite directions)."""
    return {name: r.base for r in rules.rules for name in r.egglog_names}


def runtime_error(rules: RuleSet, stage: str, message: str) -> RuleError:
    """The RuleError for egglog's error ``message`` while it ran ``stage``: the rule that failed, by what it does.

    egglog names no rule: a ``panic`` is found by its message, a primitive that
    failed in an action (an i64 overflow, a division by zero) by the expression
    egglog shows, a function whose values could not be merged by the rules
    that set it.  Operand orders of one rule are one suspect.
    """
    detail = message.strip().removeprefix("Panic:").strip()
    staged = [r for r in rules.rules if r.stage == stage]
    if m := re.search(r"In \d+:\d+(?:-\d+(?::\d+)?)?(?: of [^:]+)?: (.*): call of primitive (\S+) failed",
                      detail, re.S):
        expr, what = m.group(1), f"the primitive {m.group(2)!r} has no value at {m.group(1)} in its actions"
        suspects = [r for r in staged if any(expr in str(a) for a in r.actions)]
    elif panics := [r for r in staged if any(isinstance(a, Panic) and a.message == detail for a in r.actions)]:
        suspects, what = panics, f"it panicked: {detail}"
    else:
        tables = [r for r in staged if any(isinstance(a, SetValue) and re.search(rf"\b{re.escape(a.table)}\b", detail)
                                           for a in r.actions)]
        suspects, what = tables, detail
    written = list(dict.fromkeys((r.base, r.location) for r in suspects))
    if len(written) == 1:
        (name, location), = written
        return RuleError(f"{location}: rule {name!r} failed at run time (stage {stage}): {what}")
    named = ", ".join(f"{name} ({location})" for name, location in written)
    return RuleError(f"a rule of stage {stage} failed at run time"
                     + (f" (one of {named})" if written else "") + f": {what}")


__all__ = ["ALLOWED_COMMANDS", "MAX_VARIANTS", "MERGED_BY", "RELIED_ON", "SHIPPED_RULES_DIR", "STAGES", "STAGE_DOCS",
           "VARIANT_MARK", "Rule", "RuleError", "RuleSet", "Source", "built_by_table", "default_rule_dir",
           "egglog_rule_bases", "load_rules", "provenance_declaration", "rule_files", "runtime_error"]
