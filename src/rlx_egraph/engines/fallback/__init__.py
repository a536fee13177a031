"""The fallback engine: the same ``.egg`` rules applied by a pattern matcher on the graph itself.

For graphs too large for equality saturation.  ``run(graph, rules, target)``
loads the rules egglog loads, compiles each into a pattern (a rule form it
cannot apply is reported by name), and rewrites the graph stage by stage,
committing a rewrite only when the cost model extraction uses says the graph's
predicted time drops.
"""

from .engine import FallbackLimits, FallbackResult, FallbackStats, RuleStats, load, run
from .pattern import CompiledRules, Unsupported

__all__ = ["CompiledRules", "FallbackLimits", "FallbackResult", "FallbackStats", "RuleStats", "Unsupported", "load",
           "run"]
