"""egglog's frozen rows read into the view (``egraph/_rows.py``): through the binding's public ``Value`` objects
(hashed and compared, never looked inside), the view holds what those objects spell out."""

from __future__ import annotations

from collections import Counter

import pytest
from egglog import bindings as eb

from rlx_egraph import accelerated, examples
from rlx_egraph.egraph._rows import ClassNumbers, ListCells, RuleRelation, read_enodes
from rlx_egraph.egraph.encode import is_negative_zero_scalar
from rlx_egraph.egraph.rules import load_rules
from rlx_egraph.egraph.saturate import saturate
from rlx_egraph.egraph.schema import LIST_CONS, NO_INPUT, constructor_args
from rlx_egraph.egraph.view import build_view
from rlx_egraph.ir.registry import REGISTRY
from rlx_egraph.optimize import build_egraph


@pytest.fixture(scope="module", params=["llama", "synthetic"])
def saturated(request: pytest.FixtureRequest):
    graph = examples.llama(2) if request.param == "llama" else examples.synthetic(1200, seed=5)
    rules = load_rules()
    egraph, encoding = build_egraph(graph, rules)
    saturate(egraph, rules)
    return egraph, graph, build_view(egraph, graph, encoding.constants, rules)


def test_the_view_holds_the_enodes_the_binding_values_spell_out(saturated) -> None:
    """Every live row of every op table, decoded with the binding's Value objects as dict keys (list cells
    followed, absent inputs left out), is an e-node of the view, and nothing else is."""
    egraph, graph, view = saturated
    functions = egraph.freeze().functions
    cells = {}
    for row in functions[LIST_CONS].rows:
        cells.setdefault(row.output, (row.inputs[0], row.inputs[1]))
    absent = {row.output for row in functions[NO_INPUT].rows}
    assert absent and any(REGISTRY[op].variadic for op in functions if op in REGISTRY and functions[op].rows)

    def items(value):
        while value in cells:
            head, value = cells[value]
            yield head

    spelled = Counter()
    for op, spec in REGISTRY.items():
        for row in functions[op].rows if op in functions else ():
            if row.subsumed:
                continue
            children = []
            for arg, value in zip(constructor_args(spec), row.inputs, strict=True):
                if arg.variadic:
                    children += [view.class_of_value(v) for v in items(value)]
                elif arg.is_input and value not in absent:
                    children.append(view.class_of_value(value))
            spelled[op, tuple(children), view.class_of_value(row.output)] += 1
    negative_zeros = Counter(("Scalar", (), view.class_of_node[g.id]) for g in graph.nodes
                             if g.op == "Scalar" and is_negative_zero_scalar(g))  # leaves the view adds (see encode)
    assert view.dropped == 0
    assert Counter((n.op, n.children, n.eclass) for n in view.nodes) == spelled + negative_zeros


def test_the_views_enodes_and_classes_are_left_out_of_the_cycle_collector(saturated) -> None:
    """Compiled, ENode and EClass are not tracked by the cycle collector (their fields never hold another e-node or
    e-class, so no cycle runs through them): a view's hundreds of thousands of them are not scanned at every
    collection."""
    import gc

    _, _, view = saturated
    assert view.nodes and view.classes
    tracked = {gc.is_tracked(x) for x in (*view.nodes, *view.classes)}
    assert tracked == {not accelerated()}  # the pure-Python path's plain objects are tracked


def test_rule_relation_keys_by_values_and_names_each_distinct_rule_list_once() -> None:
    egraph = eb.EGraph()
    egraph.parse_and_run_program('(relation Built (i64 i64 String))\n(Built 1 2 "b")\n(Built 1 2 "a")\n'
                                 '(Built 1 2 "b")\n(Built 3 2 "a")\n(Built 4 2 "b")\n(Built 4 2 "a")')
    rows = egraph.freeze().functions["Built"].rows
    asked = []

    def names_of(rules: tuple) -> tuple[str, ...]:
        asked.append(names := tuple(egraph.value_to_string(v) for v in rules))
        return names

    found = RuleRelation(rows, names_of, {})
    ints = {tuple(row.inputs[:2]): egraph.value_to_i64(row.inputs[0]) for row in rows}
    assert len(found) == 3 and [key for key, _ in found.items()] == list(dict.fromkeys(ints))  # first-seen order
    in_rows = {k: tuple(dict.fromkeys(egraph.value_to_string(row.inputs[2]) for row in rows
                                      if egraph.value_to_i64(row.inputs[0]) == k)) for k in (1, 3, 4)}
    assert {ints[key]: names for key, names in found.items()} == in_rows
    assert sorted(in_rows[1]) == sorted(in_rows[4]) == ["a", "b"] and in_rows[3] == ("a",)
    assert sorted(asked) == sorted(set(in_rows.values()))  # each distinct rule list named once


def test_class_numbers_read_every_i64_key_as_egglog_converts_it() -> None:
    """The node table's keys, small, large and negative (egglog keeps a small i64 in its value id and interns the
    others), come out as the binding's conversion gives them, each with its row's class (none numbered yet)."""
    egraph = eb.EGraph()
    keys = [0, 1, 7, 2**31 - 2, 2**31 - 1, 2**31, 2**40, -1, -(2**31)]
    egraph.parse_and_run_program("(datatype Probe (Leaf i64))\n(function key (i64) Probe :no-merge)\n"
                                 + "\n".join(f"(set (key {k}) (Leaf {k}))" for k in keys))
    read = ClassNumbers().of_keys(egraph.freeze().functions["key"].rows, egraph.value_to_i64)
    assert sorted(read) == sorted(keys)
    assert set(read.values()) == {-1}


class _Row:
    """A frozen row as the binding shapes it (inputs, output, subsumed), its cells any hashable objects."""

    def __init__(self, inputs: list, output: object, subsumed: bool = False) -> None:
        self.inputs, self.output, self.subsumed = inputs, output, subsumed


class _Deadline:
    def check(self, what: str) -> None:
        pass


def test_the_reader_asks_a_cell_only_for_its_hash_and_equality() -> None:
    """Cells that are plain strings (no egglog object layout to read) decode as the binding's Values would: list
    cells followed, absent inputs left out, equal attribute cells sharing one dict, classes numbered children
    first, built-by names by the row's whole key, subsumed rows skipped."""
    lists = ListCells([_Row(["x", "nil"], "l1"), _Row(["y", "l1"], "l2"), _Row(["z", "nil"], "l2")])  # l2: first wins
    classes = ClassNumbers(["none"])
    built = RuleRelation([_Row(["a", "3", "l2", "r1", "fuse-b"], None), _Row(["a", "3", "l2", "r1", "fuse-a"], None)],
                         lambda rules: tuple(sorted(rules)), {})
    nodes: list = []
    eclasses: list = []
    converted: list = []

    def convert(value: object, kind: str) -> object:
        converted.append(value)
        return f"{kind}:{value}"

    rows = [_Row(["a", "3", "l2", "r1"], "out1"), _Row(["b", "3", "l1", "r1"], "out2"),
            _Row(["gone", "3", "l1", "r1"], "out3", subsumed=True), _Row(["none", "4", "nil", "r1"], "out1")]
    read_enodes("Op", rows, [(0, False), (2, True)], [(1, "axis", "int", {})], classes, lists, convert, built, nodes,
                eclasses, _Deadline())
    assert [(n.index, n.op, n.children, n.attrs, n.eclass, n.built_by) for n in nodes] == [
        (0, "Op", (0, 1, 2), {"axis": "int:3"}, 3, ("fuse-a", "fuse-b")),  # a, then l2's items y, x; output
        (1, "Op", (4, 2), {"axis": "int:3"}, 5, ()),
        (2, "Op", (), {"axis": "int:4"}, 3, ()),  # "none" is absent, "nil" a list of no items
    ]
    assert nodes[0].attrs is nodes[1].attrs and converted == ["3", "4"]
    assert eclasses == [3, 5, 3] and classes.count == 6 and classes.of("out2") == 5
    assert classes.of("gone") == classes.of("none") == -1  # never seen; absent
