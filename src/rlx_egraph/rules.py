"""Rules: load, combine and check them (``rlx_egraph.rules.check(ruleset)``).

The shipped ``.egg`` files are in the repository's ``rules/`` folder; the wheel ships them as the package data
folder ``rlx_egraph/shipped_rules`` (see :func:`default_rule_dir`), so this module's name is free.
"""

from .egraph.rules import Rule, RuleError, RuleSet, default_rule_dir, load_rules
from .egraph.soundness import RuleVerdict, SoundnessReport, check

__all__ = ["Rule", "RuleError", "RuleSet", "RuleVerdict", "SoundnessReport", "check", "default_rule_dir",
           "load_rules"]
