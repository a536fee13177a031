"""Encoding in chunks of rules (issue 8): same e-graph and same result as one global ``let`` per node."""

from __future__ import annotations

import re

import pytest

from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.egraph.encode import CHUNK, encode_graph

# Extracted cost, nodes after, e-classes and e-nodes on target cpu, measured with the
# encoding of one global `let` per node (before the chunked encoding); the e-graph sizes (and
# synthetic's cost and nodes) re-measured with the two-result residual+norm rules (add-layer-norm,
# add-rms-norm).
PINNED = {
    "llama-2": (lambda: examples.llama(layers=2), 136960.66200000004, 62, 122, 200),
    "bert-1": (lambda: examples.bert(layers=1), 41293.44, 28, 88, 130),
    "synthetic-1000": (lambda: examples.synthetic(1000), 644193.9800000022, 594, 1177, 2013),
}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_chunked_encoding_extracts_the_same_cost_and_graph_size(case):
    build, cost, nodes_after, eclasses, enodes = PINNED[case]
    og, rep = optimize_with_report(build(), "cpu")
    assert (rep.extracted_ns, len(og), rep.eclasses, rep.enodes) == (cost, nodes_after, eclasses, enodes)


def test_one_rule_per_chunk_and_a_global_only_for_nodes_read_by_a_later_chunk():
    g = examples.synthetic(1000)
    text = encode_graph(g).text
    chunks = -(-len(g) // CHUNK)
    assert text.count("(rule ()") == chunks and text.count("(run rlx-graph-") == chunks
    chunk_of = {n.id: k // CHUNK for k, n in enumerate(g.nodes)}
    read_later = {i for n in g.nodes for i in n.inputs if chunk_of[i] != chunk_of[n.id]}
    assert 0 < len(read_later) < len(g) // 10
    assert set(map(int, re.findall(r"\(let \$n(\d+) \(rlx-node \1\)\)", text))) == read_later
    assert text.count("(let $n") == len(read_later)
    assert text.count("(set (rlx-node ") == len(g)


def test_a_chain_across_chunks_keeps_every_node_and_its_value():
    g = Graph()
    h = g.input("x", (4,))
    for _ in range(2 * CHUNK + 5):
        h = g.relu(g.neg(h))
    g.set_outputs([h])
    og, rep = optimize_with_report(g, "cpu", regions=False, verify=True)
    assert len(og) == len(g) == 4 * CHUNK + 11
    assert rep.eclasses == len(g) and rep.parity.ok and max(p.max_abs for p in rep.parity.nodes) == 0.0


def test_the_scaling_table_prints_time_per_node_and_peak_memory():
    from rlx_egraph.bench import PHASES, Row, scaling_table

    row = Row("synthetic-1000", "synthetic", 1000, 1000, 570, 1101, 1768, "saturated", dict.fromkeys(PHASES, 0.25),
              2.5, 109.4, 1.0, 1.0, 0.0, {}, 1.0, None, None)
    header, line = scaling_table([row]).splitlines()[:2]
    assert header.split() == ["nodes", "e-nodes", "encode", "s", "saturate", "s", "extract", "s", "decode", "s",
                              "rest", "s", "total", "s", "us/node", "peak", "MB"]
    assert line.split() == ["1000", "1768", "0.250", "0.250", "0.250", "0.250", "1.500", "2.500", "2500", "109"]
