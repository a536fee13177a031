"""The egglog bridge: encode a graph, saturate it with the .egg rules, extract
the cheapest graph under the IO cost model, decode it back."""

# The rule model first: its package also names the soundness checker, which imports this package's modules.
from .. import rules as _rules  # noqa: F401  (isort: skip)
from .encode import dump_egglog_program, encode_graph
from .rules import STAGES, Rule, RuleError, RuleSet, load_rules

__all__ = ["STAGES", "Rule", "RuleError", "RuleSet", "dump_egglog_program", "encode_graph", "load_rules"]
