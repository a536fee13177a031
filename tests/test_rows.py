"""egglog's frozen rows read as integers (``egraph/_rows.pyx``): the ids are the ones egglog prints, and the view
they build is the one the binding's ``Value`` objects spell out."""

from __future__ import annotations

from collections import Counter

import pytest
from egglog import bindings as eb

from rlx_egraph import examples
from rlx_egraph.egraph._rows import ClassNumbers, RuleRelation, value_id
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


def test_value_id_is_the_id_egglog_prints_for_every_cell(saturated) -> None:
    egraph, _, _ = saturated
    cells = [v for f in egraph.freeze().functions.values() for row in f.rows for v in (*row.inputs, row.output)]
    assert len(cells) > 3_000
    assert [str(v) for v in cells] == [f"Value({value_id(v)})" for v in cells]


def test_value_id_names_what_is_not_an_egglog_value() -> None:
    with pytest.raises(TypeError, match=r"^value_id takes an egglog Value, not int$"):
        value_id(3)


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
    """ENode and EClass are not tracked by the cycle collector (their fields never hold another e-node or e-class,
    so no cycle runs through them): a view's hundreds of thousands of them are not scanned at every collection."""
    import gc

    _, _, view = saturated
    assert view.nodes and view.classes
    assert not any(map(gc.is_tracked, view.nodes)) and not any(map(gc.is_tracked, view.classes))


def test_rule_relation_keys_by_ids_and_names_each_distinct_rule_list_once() -> None:
    egraph = eb.EGraph()
    egraph.parse_and_run_program('(relation Built (i64 i64 String))\n(Built 1 2 "b")\n(Built 1 2 "a")\n'
                                 '(Built 1 2 "b")\n(Built 3 2 "a")\n(Built 4 2 "b")\n(Built 4 2 "a")')
    rows = egraph.freeze().functions["Built"].rows
    asked = []

    def names_of(rules: tuple) -> tuple[str, ...]:
        asked.append(names := tuple(egraph.value_to_string(v) for v in rules))
        return names

    found = RuleRelation(rows, names_of, {})
    ints = {tuple(value_id(v) for v in row.inputs[:2]): egraph.value_to_i64(row.inputs[0]) for row in rows}
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
