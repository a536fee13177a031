"""The egglog program of a run: the schema and the rules as one text, and a new e-graph that has run it with a
graph's terms loaded (not yet saturated)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from egglog import bindings as eb

from ...ir.graph import Graph
from .encode import Encoding, encode_graph
from .rules import RuleSet
from .schema import schema_text


def build_egraph(graph: Graph, ruleset: RuleSet, attention_block_max_tokens: int = 64) -> tuple[eb.EGraph, Encoding]:
    """A new egglog e-graph holding the schema, ``ruleset`` and ``graph``'s terms, not yet saturated.  egglog
    parses and runs the schema and the rules in a second thread while ``graph`` is encoded."""
    with ThreadPoolExecutor(1, thread_name_prefix="rlx-egglog-rules") as egglog:
        fresh = egglog.submit(egraph_from_program, rules_program(ruleset))
        encoding = encode_graph(graph, attention_block_max_tokens)
        egraph = fresh.result()
    encoding.load(egraph)
    return egraph, encoding


def rules_program(ruleset: RuleSet) -> str:
    """The schema and ``ruleset`` as one egglog program."""
    return schema_text() + "\n" + ruleset.text


def egraph_from_program(program: str) -> eb.EGraph:
    """A new egglog e-graph that has run ``program`` (egglog lets go of the GIL while it parses and runs a
    program's text, not while it runs parsed commands)."""
    egraph = eb.EGraph()
    egraph.parse_and_run_program(program)
    return egraph
