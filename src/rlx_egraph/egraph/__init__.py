"""The egglog bridge: encode a graph, saturate it with the .egg rules, extract
the cheapest graph under the IO cost model, decode it back."""

import importlib.util

if importlib.util.find_spec(f"{__name__}._solver") is None:  # a source checkout that was never installed
    raise ImportError(f"{__name__}._solver (Cython, the passes over the e-graph) is not built: install the package "
                      "first (`make .venv/.installed`, or `pip install -e .`)")

from .encode import dump_egglog_program, encode_graph
from .rules import STAGES, Rule, RuleError, RuleSet, load_rules

__all__ = ["STAGES", "Rule", "RuleError", "RuleSet", "dump_egglog_program", "encode_graph", "load_rules"]
