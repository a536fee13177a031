"""Encoding as rows loaded in bulk: same e-graph and same result as one global ``let`` per node."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from egglog import bindings as eb

from benchmarks.bench import PHASES, Row, scaling_table
from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.engines.egglog import encode
from rlx_egraph.engines.egglog.encode import LOAD_RULESET, ROW_PREFIX, VEC_TABLE, encode_graph
from rlx_egraph.engines.egglog.rules import STAGES, load_rules
from rlx_egraph.engines.egglog.saturate import saturate
from rlx_egraph.engines.egglog.schema import schema_text
from rlx_egraph.engines.egglog.view import build_view, view_tables
from rlx_egraph.ir.graph import attrs_equal
from rlx_egraph.optimize import build_egraph

# Extracted cost, nodes after, e-classes and e-nodes on target cpu, measured with the
# encoding of one global `let` per node (before the chunked encoding); the e-graph sizes (and
# synthetic's cost and nodes) re-measured with the two-result residual+norm rules (add-layer-norm,
# add-rms-norm); bert's re-measured with its word + position embeddings fused (embed-layer-norm-one-term);
# llama's and bert's costs with an Embedding that reads only the table rows it gathers.
PINNED = {
    "llama-2": (lambda: examples.llama(layers=2), 135731.86200000005, 62, 122, 200),
    "bert-1": (lambda: examples.bert(layers=1), 33020.159999999996, 26, 88, 131),
    "synthetic-1000": (lambda: examples.synthetic(1000), 644193.9800000022, 594, 1177, 2013),
}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_chunked_encoding_extracts_the_same_cost_and_graph_size(case):
    build, cost, nodes_after, eclasses, enodes = PINNED[case]
    og, rep = optimize_with_report(build(), "cpu")
    assert (rep.extracted_ns, len(og), rep.eclasses, rep.enodes) == (cost, nodes_after, eclasses, enodes)


def test_one_row_per_node_one_loading_rule_per_op_and_each_int_tuple_once():
    g = examples.synthetic(1000)
    encoding = encode_graph(g)
    ops = {n.op for n in g.nodes}
    assert sorted(encoding.rows) == sorted([ROW_PREFIX + op for op in ops] + [ROW_PREFIX + t for t in
                                                                                ("type", "param-order")])
    assert sum(len(encoding.rows[ROW_PREFIX + op]) for op in ops) == len(g)
    types = encoding.rows[ROW_PREFIX + "type"]  # node id, its shape's IntVec id, its dtype: one row per node
    assert [(row[0], row[2]) for row in types] == [(n.id, n.dtype) for n in g.nodes]
    assert len({row[1] for row in types}) == len({n.shape for n in g.nodes})
    assert encoding.rules.count("(rule (") == len(ops) + 2 and encoding.rules.count(f"(run {LOAD_RULESET} 1)") == 1
    tuples = {n.shape for n in g.nodes} | {v for n in g.nodes for v in n.attrs.values() if isinstance(v, tuple)}
    assert encoding.declarations.count(f"(set ({VEC_TABLE} ") == len(tuples)
    # the rows written as facts: the same program, runnable as-is
    assert re.search(r"^\(rlx-row-MatMul \d+ \d+ \d+\)$", encoding.text, re.M)
    assert encoding.text.count("\n(rlx-row-") == sum(map(len, encoding.rows.values()))


def test_a_deep_chain_loads_in_one_iteration_and_keeps_every_node_and_its_value():
    g = Graph()
    h = g.input("x", (4,))
    for _ in range(261):
        h = g.relu(g.neg(h))
    g.set_outputs([h])
    og, rep = optimize_with_report(g, "cpu", regions=False, verify=True)
    assert len(og) == len(g) == 523
    assert rep.eclasses == len(g) and rep.parity.ok and max(p.max_abs for p in rep.parity.nodes) == 0.0


def test_the_scaling_table_prints_time_per_node_and_peak_memory():
    row = Row("synthetic-1000", "synthetic", 1000, 1000, 570, 1101, 1768, "saturated", dict.fromkeys(PHASES, 0.25),
              2.5, 109.4, 1.0, 1.0, 0.0, {}, 1.0, None, None, cpu_seconds=2.25)
    header, line = scaling_table([row]).splitlines()[:2]
    assert header.split() == ["nodes", "e-nodes", "encode", "s", "saturate", "s", "extract", "s", "decode", "s",
                              "rest", "s", "total", "s", "us/node", "cpu", "s", "peak", "MB"]
    assert line.split() == ["1000", "1768", "0.250", "0.250", "0.250", "0.250", "1.500", "2.500", "2500", "2.250",
                            "109"]


def _view_of(graph: Graph, load_rows: bool) -> list[tuple]:
    """The e-nodes of ``graph``'s loaded (unsaturated) e-graph: rows through files, or the program as text."""
    encoding = encode_graph(graph)
    egraph = eb.EGraph()
    egraph.parse_and_run_program(schema_text() + "".join(f"(ruleset {s})" for s in STAGES))
    if load_rows:
        encoding.load(egraph)
    else:
        egraph.parse_and_run_program(encoding.text)
    view = build_view(egraph, graph, encoding.constants, load_rules([]))
    return [(n.op, n.children, repr(n.attrs), n.eclass, n.original) for n in view.nodes]


def test_rows_through_files_and_as_facts_load_the_same_terms():
    """Lists (a shared suffix), an absent optional input, bools, int tuples, arrays, -0.0 and names."""
    g = Graph()
    a, b = g.input("a \t", (2, 4)), g.param('b"\\', (2, 4))
    cat = g.add_node("Concat", [a, b, a], axis=0)
    cat2 = g.add_node("Concat", [b, a], axis=0)
    norm = g.add_node("RmsNorm", [cat, g.param("gamma", (4,))], eps=1e-6)
    mean = g.add_node("ReduceMean", [norm], axes=(-1,), keepdims=True)
    c = g.constant(np.arange(8, dtype=np.float32).reshape(2, 4))
    g.set_outputs([mean, g.max(cat2, g.scalar(-0.0)), g.add(b, c)])
    view = _view_of(g, load_rows=True)
    assert view == _view_of(g, load_rows=False)
    assert [n[0] for n in view].count("Concat") == 2 and len(view) == len(g) + 2  # -0.0: Neg and its +0.0
    concat = {n[4]: n for n in view if n[0] == "Concat"}
    classes = {n[4]: n[3] for n in view if n[4] is not None}
    assert concat[cat][1] == (classes[a], classes[b], classes[a]) and concat[cat2][1] == (classes[b], classes[a])
    assert next(n for n in view if n[0] == "RmsNorm")[1] == (classes[cat], classes[norm - 1])  # no beta


def test_rows_split_over_files_load_the_same_terms(monkeypatch, tmp_path):
    """A relation of more rows than a file holds is written over several files, read in order."""
    monkeypatch.setattr(encode, "ROWS_PER_FILE", 3)
    g = examples.llama(layers=1)
    rows = encode_graph(g).rows
    program = encode_graph(g).write_rows(tmp_path)
    assert max(map(len, rows.values())) > 3
    for relation, its_rows in rows.items():
        files = re.findall(rf'^\(input {re.escape(relation)} "(.*)"\)$', program, re.M)
        assert len(files) == -(-len(its_rows) // 3)  # ceil
        assert [line.split("\t")[0] for f in files for line in Path(f).read_text().splitlines()] == \
            [str(row[0]) for row in its_rows]
    assert _view_of(g, load_rows=True) == _view_of(g, load_rows=False)


def _originals_by_definition(view, graph: Graph) -> dict[int, int]:
    """The reference: per input-graph node in order, the first e-node of its class with its op, its inputs'
    classes as children and equal attributes that no earlier node took."""
    taken: dict[int, int] = {}
    for gnode in graph.nodes:
        children = tuple(view.class_of_node[i] for i in gnode.inputs)
        for i in view.classes[view.class_of_node[gnode.id]].nodes:
            n = view.nodes[i]
            if i not in taken and n.op == gnode.op and n.children == children and attrs_equal(n.attrs, gnode.attrs):
                taken[i] = gnode.id
                break
    return taken


@pytest.mark.parametrize("name", ["llama", "bert", "duplicates"])
def test_the_view_tags_each_input_node_s_e_node_as_defined(name: str):
    """Saturated, so classes hold rule-made e-nodes beside the input graph's; two identical nodes share one
    e-node, which the first of them gets."""
    if name == "duplicates":
        graph = Graph()
        x = graph.input("x", (2, 4))
        first, second = graph.relu(x), graph.relu(x)
        perm = graph.add_node("Transpose", [x], perm=(1, 0))
        ones = graph.add(graph.constant(np.ones((2, 4))), graph.constant(np.ones((2, 4))))  # arrays: equal by value
        graph.set_outputs([graph.add(first, second), perm, graph.add(graph.scalar(2.0), graph.scalar(2.0)), ones])
    else:
        graph = examples.ALL[name](layers=1)
    rules = load_rules()
    egraph, encoding = build_egraph(graph, rules)
    saturate(egraph, rules)
    view = build_view(egraph, graph, encoding.constants, rules)
    tagged = {n.index: n.original for n in view.nodes if n.original is not None}
    assert tagged == _originals_by_definition(view, graph)
    if name == "duplicates":
        # not 2 (the second Relu), 5 (the second array of ones) nor 9 (the second 2.0)
        assert sorted(tagged.values()) == [0, 1, 3, 4, 6, 7, 8, 10]
    else:
        assert any(len(view.classes[n.eclass].nodes) > 1 for n in view.nodes if n.original is not None)


def test_view_tables_lists_every_egglog_function_the_view_reads():
    """The overhead bench times reading ``view_tables()``: it must be what ``build_view`` reads."""
    g = examples.llama(1)
    ruleset = load_rules()
    egraph, encoding = build_egraph(g, ruleset)
    saturate(egraph, ruleset)
    read: set[str] = set()

    class Recording(dict):
        def __getitem__(self, name):
            read.add(name)
            return super().__getitem__(name)

        def get(self, name, default=None):
            read.add(name)
            return super().get(name, default)

        def __contains__(self, name):
            read.add(name)
            return super().__contains__(name)

    functions = Recording(egraph.freeze().functions)

    class Frozen:
        """The e-graph, its frozen functions recorded as they are read."""

        def freeze(self):
            return self

        def __getattr__(self, name):
            return functions if name == "functions" else getattr(egraph, name)

    build_view(Frozen(), g, encoding.constants, ruleset)
    assert read == set(view_tables())
