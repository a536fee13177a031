"""The egglog program of a run: the schema and the rules as one text, and a new e-graph that has run it with a
graph's terms loaded (not yet saturated).

Running the program (egglog checks and compiles every rule) costs more than most runs' saturation.  A run that is
done with its e-graph gives it back (:func:`release_egraph`): egglog restores the state it had right after the
program ran (``push`` was taken there, ``pop`` returns to it), and the next :func:`build_egraph` of the same
rules starts from that instead of running the program again.  One e-graph is kept, for the last rules released.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from egglog import bindings as eb

from ...ir.graph import Graph
from .encode import Encoding, encode_graph
from .rules import RuleSet
from .schema import schema_text

_released: dict[str, eb.EGraph] = {}  # program -> an e-graph back at the state right after running it, pushed
_released_lock = threading.Lock()


def build_egraph(graph: Graph, ruleset: RuleSet, attention_block_max_tokens: int = 64) -> tuple[eb.EGraph, Encoding]:
    """An egglog e-graph holding the schema, ``ruleset`` and ``graph``'s terms, not yet saturated: the one
    released for these rules, else a new one (egglog parses and runs the schema and the rules in a second thread
    while ``graph`` is encoded)."""
    program = rules_program(ruleset)
    with _released_lock:
        egraph = _released.pop(program, None)
    if egraph is None:
        with ThreadPoolExecutor(1, thread_name_prefix="rlx-egglog-rules") as egglog:
            fresh = egglog.submit(egraph_from_program, program)
            encoding = encode_graph(graph, attention_block_max_tokens)
            egraph = fresh.result()
        egraph.run_program(eb.Push(1))
    else:
        encoding = encode_graph(graph, attention_block_max_tokens)
    encoding.load(egraph)
    return egraph, encoding


def release_egraph(egraph: eb.EGraph, ruleset: RuleSet) -> None:
    """Give back an e-graph of :func:`build_egraph` for ``ruleset`` that nothing reads again: it returns to the
    state right after the program ran (what the run added is freed) and is kept for the next run of these rules."""
    egraph.run_program(eb.Pop(eb.PanicSpan(), 1), eb.Push(1))
    with _released_lock:
        _released.clear()
        _released[rules_program(ruleset)] = egraph


def rules_program(ruleset: RuleSet) -> str:
    """The schema and ``ruleset`` as one egglog program."""
    return schema_text() + "\n" + ruleset.text


def egraph_from_program(program: str) -> eb.EGraph:
    """A new egglog e-graph that has run ``program`` (egglog lets go of the GIL while it parses and runs a
    program's text, not while it runs parsed commands)."""
    egraph = eb.EGraph()
    egraph.parse_and_run_program(program)
    return egraph
