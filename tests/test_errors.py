"""Clear errors at the door: graph files and node records field by field, dims, and optimize options."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_egraph import Graph, GraphError, Options, examples, optimize, optimize_with_report
from rlx_egraph.cost import TARGETS
from rlx_egraph.engines.egglog.saturate import SaturationLimits
from rlx_egraph.ir.graph import MAX_DIM

# the options after target, rules, verify, engine, extraction; the saturation limits among them
KNOWN_AFTER_EXTRACTION = [f.name for f in dataclasses.fields(Options)][5:]


def tiny() -> dict[str, Any]:
    """x -> Relu, as a graph file's dict."""
    g = Graph("tiny")
    g.set_outputs([g.relu(g.input("x", (2, 3)))])
    return g.to_dict()


DELETE = object()


def changed(data: dict[str, Any], path: tuple[Any, ...], value: Any = DELETE) -> dict[str, Any]:
    """A copy of ``data`` with the field at ``path`` (keys and list indices) set to ``value`` or deleted."""
    data = copy.deepcopy(data)
    *parents, last = path
    target = data
    for key in parents:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return data


def with_change(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    return changed(tiny(), path, value)


def without(path: tuple[Any, ...]) -> dict[str, Any]:
    return changed(tiny(), path)


# --- graph files, field by field -------------------------------------------------------------------------------------

BAD_FILES: list[tuple[str, dict[str, Any], str]] = [
    ("op-list", with_change(("nodes", 1, "op"), ["Relu"]), "node 1: 'op' must be the name of an op, got ['Relu']"),
    ("op-missing", without(("nodes", 1, "op")), "node 1 has no 'op'"),
    ("id-missing", without(("nodes", 1, "id")), "node record 1 has no 'id'"),
    ("id-string", with_change(("nodes", 1, "id"), "1"),
     "node record 1: 'id' must be a node id (an int), got '1' (a string)"),
    ("id-float", with_change(("nodes", 1, "id"), 1.0), "node record 1: 'id' must be a node id (an int), got 1.0"),
    ("record-int", with_change(("nodes", 1), 5),
     "node record 1 must be an object with fields id, op, inputs, attrs, shape, dtype, got 5"),
    ("record-unknown-field", with_change(("nodes", 1, "input"), [0]),
     "node 1 (Relu): unknown field 'input' (a string); the fields are id, op, inputs, attrs, shape, dtype"),
    ("inputs-int", with_change(("nodes", 1, "inputs"), 5), "node 1 (Relu): 'inputs' must be a list of node ids, got 5"),
    ("inputs-string", with_change(("nodes", 1, "inputs"), "0"),
     "node 1 (Relu): 'inputs' must be a list of node ids, got '0' (a string)"),
    ("input-string", with_change(("nodes", 1, "inputs"), ["0"]),
     "node 1 (Relu): input 0 must be a node id (an int), got '0' (a string)"),
    ("input-null", with_change(("nodes", 1, "inputs"), [None]),
     "node 1 (Relu): input 0 must be a node id (an int), got None"),
    ("attrs-list", with_change(("nodes", 1, "attrs"), [1]),
     "node 1 (Relu): 'attrs' must be an object mapping attribute names to values, got [1]"),
    ("attrs-string", with_change(("nodes", 1, "attrs"), "ab"),
     "node 1 (Relu): 'attrs' must be an object mapping attribute names to values, got 'ab' (a string)"),
    ("shape-int", with_change(("nodes", 1, "shape"), 5), "node 1 (Relu): 'shape' must be a list of ints, got 5"),
    ("shape-strings", with_change(("nodes", 1, "shape"), ["2", "3"]),
     "node 1 (Relu): 'shape' must be a list of ints, got ['2', '3']"),
    ("dtype-int", with_change(("nodes", 1, "dtype"), 4), "node 1 (Relu): 'dtype' must be a string, got 4"),
    ("dtype-disagrees", with_change(("nodes", 1, "dtype"), "f16"),
     "node 1 (Relu): file says f16[2, 3], inferred f32[2, 3]"),
    ("leaf-shape-int", with_change(("nodes", 0, "attrs", "shape"), 5),
     "node 0 (Input): attribute shape=5 is not of type ints"),
    ("dim-2**64", with_change(("nodes", 0, "attrs", "shape"), [2**64]),
     "node 0 (Input): dimension 18446744073709551616 of shape [18446744073709551616] is out of range "
     "(dims are ints in [0, 2**31))"),
    ("array-attr", {**tiny(), "nodes": [{"id": 0, "op": "Constant", "attrs": {"value": {"array": [1], "dtype": "f99"},
                                                                              "dtype": "f32"}}], "outputs": [0]},
     "node 0 (Constant): malformed array attribute 'value': TypeError: data type 'f99' not understood"),
    ("outputs-int", with_change(("outputs",), 1), "outputs must be a list of node ids, got 1"),
    ("outputs-string", with_change(("outputs",), "1"), "outputs must be a list of node ids, got '1' (a string)"),
    ("outputs-null", with_change(("outputs",), [None]), "output 0 must be a node id (an int), got None"),
    ("outputs-name", with_change(("outputs",), ["x"]), "output 0 must be a node id (an int), got 'x' (a string)"),
    ("nodes-object", with_change(("nodes",), {}), "'nodes' must be a list of node records, got {}"),
    ("name-int", with_change(("name",), 5), "'name' must be a string, got 5"),
    ("version-true", with_change(("version",), True),
     "graph format version True is not supported (this library reads versions 1 and 2)"),
    ("unknown-top-field", with_change(("output",), [1]),
     "graph file: unknown field 'output' (a string); the fields are format, version, name, nodes, outputs, meta, "
     "weights"),
    ("nodes-missing", without(("nodes",)), "malformed graph file: missing field 'nodes'"),
]


@pytest.mark.parametrize(("data", "message"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_from_dict_names_the_bad_field(data: dict[str, Any], message: str) -> None:
    before = copy.deepcopy(data)
    with pytest.raises(GraphError) as info:
        Graph.from_dict(data)
    assert str(info.value) == message
    assert data == before  # inputs are never mutated


def test_a_string_input_is_not_taken_for_a_missing_node() -> None:
    records = [{"id": 0, "op": "Input", "attrs": {"name": "x", "shape": [2]}},
               {"id": 2, "op": "Relu", "inputs": ["0"]}]
    with pytest.raises(GraphError) as info:
        Graph.from_nodes(records, [2])
    assert str(info.value) == "node 2 (Relu): input 0 must be a node id (an int), got '0' (a string)"


def test_from_nodes_names_the_node_without_op() -> None:
    records = [{"id": 0, "op": "Input", "attrs": {"name": "x", "shape": [2]}}, {"id": 7, "inputs": [0]}]
    with pytest.raises(GraphError, match=r"^node 7 has no 'op'$"):
        Graph.from_nodes(records, [7])


def test_from_nodes_takes_no_file_fields() -> None:
    records = [{"id": 0, "op": "Input", "attrs": {"name": "x", "shape": [2]}, "shape": [2]}]
    with pytest.raises(GraphError, match=r"^node 0 \(Input\): unknown field 'shape' \(a string\); "
                                         r"the fields are id, op, inputs, attrs$"):
        Graph.from_nodes(records, [0])


def test_outputs_string_is_an_error_not_a_list() -> None:
    with pytest.raises(GraphError, match=r"^outputs must be a list of node ids, got '3' \(a string\)$"):
        Graph.from_dict(with_change(("outputs",), "3"))
    g = Graph.from_dict(tiny())
    with pytest.raises(GraphError, match=r"^outputs must be a list of node ids, got '1' \(a string\)$"):
        g.set_outputs("1")
    assert g.outputs == (1,)


def test_builders_and_add_node_refuse_string_ids() -> None:
    g = Graph.from_dict(tiny())
    before = g.to_json()
    with pytest.raises(GraphError) as info:
        g.relu("1")
    assert str(info.value) == "node 2 (Relu): input 0 must be a node id (an int), got '1' (a string)"
    with pytest.raises(GraphError, match=r"^node 2 \(Add\): 'inputs' must be a list of node ids, got 1$"):
        g.add_node("Add", 1)
    with pytest.raises(GraphError, match=r"^node id must be a node id \(an int\), got '5' \(a string\)$"):
        g.add_node("Relu", [1], node_id="5")
    with pytest.raises(GraphError, match=r"^node 2: 'op' must be the name of an op, got None$"):
        g.add_node(None, [1])
    assert g.to_json() == before


def test_deeply_nested_json_is_a_graph_error() -> None:
    with pytest.raises(GraphError, match=r"^graph file is nested too deeply to read$"):
        Graph.from_json("[" * 100_000 + "]" * 100_000)


def test_load_rejects_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_bytes(b'{"name": "\xff"}')
    with pytest.raises(GraphError, match=r"^graph file is not UTF-8 text \(invalid start byte at byte 10\)$"):
        Graph.load(path)


def test_load_reads_non_ascii_names(tmp_path: Path) -> None:
    g = Graph("größe")
    g.set_outputs([g.relu(g.input("wärme", (2,)))])
    path = tmp_path / "g.json"
    path.write_text(json.dumps(g.to_dict(), ensure_ascii=False), encoding="utf-8")
    assert Graph.load(path) == g and Graph.load(path).leaf("wärme").id == 0


# --- dims ------------------------------------------------------------------------------------------------------------


def test_dims_must_be_below_max_dim() -> None:
    assert MAX_DIM == 2**31
    g = Graph()
    assert g.node(g.input("x", (MAX_DIM - 1,))).shape == (MAX_DIM - 1,)
    with pytest.raises(GraphError, match=r"^node 1 \(Param\): dimension 2147483648 of shape \[2, 2147483648\] "
                                         r"is out of range \(dims are ints in \[0, 2\*\*31\)\)$"):
        g.param("w", (2, MAX_DIM))
    y = g.input("y", (1, 4))
    with pytest.raises(GraphError, match=r"^node 2 \(Expand\): dimension 4294967296 of shape \[4294967296, 4\]"):
        g.expand(y, shape=(2**32, 4))
    with pytest.raises(GraphError, match=r"^node 2 \(Input\): cannot convert float infinity to integer$"):
        g.input("z", (float("inf"),))
    assert len(g) == 2


# --- any JSON in any field: a GraphError or a graph, nothing else ----------------------------------------------------

def rich() -> dict[str, Any]:
    """A graph file with array, float, int and int-list attributes, for the fuzz test."""
    g = Graph("rich")
    x = g.input("x", (2, 4))
    c = g.constant(np.arange(8, dtype=np.float32).reshape(2, 4))
    h = g.reshape(g.narrow(g.mul(g.add(x, c), g.scalar(0.5)), axis=1, start=0, length=2), shape=(-1,))
    g.set_outputs([g.softmax(h, axis=-1)])
    return g.to_dict()


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key/index path inside a JSON value."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    return [p for key, child in items for p in [(*prefix, key), *paths(child, (*prefix, key))]]


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=3), max_leaves=8)
RICH = rich()


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([*paths(RICH), ("extra",), ("nodes", 3, "extra")]), JSON_VALUES)
def test_any_value_in_any_field_is_a_graph_error_or_a_graph(path: tuple[Any, ...], value: Any) -> None:
    data = changed(RICH, path, value)
    before = json.dumps(data, sort_keys=True)
    try:
        g = Graph.from_dict(data)
    except GraphError as exc:
        assert "\n" not in str(exc)
    else:
        assert Graph.from_dict(g.to_dict()) == g
    assert json.dumps(data, sort_keys=True) == before  # the input is not mutated


# --- optimize options ------------------------------------------------------------------------------------------------

BAD_OPTIONS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"match_limit": -1}, ValueError, "match_limit must be an int in [0, 2**63), got -1"),
    ({"max_iterations": "5"}, TypeError, "max_iterations must be an int, got '5' (str)"),
    ({"max_iterations": 2.0}, TypeError, "max_iterations must be an int, got 2.0 (float)"),
    ({"max_enodes": True}, TypeError, "max_enodes must be an int, got True (bool)"),
    ({"max_seconds": "1"}, TypeError, "max_seconds must be a number, got '1' (str)"),
    ({"max_seconds": float("nan")}, ValueError, "max_seconds must be a number >= 0, got nan"),
    ({"max_seconds": -1}, ValueError, "max_seconds must be a number >= 0, got -1"),
    ({"match_limit": 2**63}, ValueError, "match_limit must be an int in [0, 2**63), got 9223372036854775808"),
    ({"rules": 123}, TypeError, "rules must be None, a rule file or folder (a str or Path) or a list of them, "
                                "got 123 (int)"),
    ({"rules": ["a.egg", 3]}, TypeError, "rules must be None, a rule file or folder (a str or Path) or a list of "
                                         "them, got ['a.egg', 3] (list)"),
    ({"seed": "x"}, TypeError, "seed must be an int, got 'x' (str)"),
    ({"seed": -1}, ValueError, "seed must be an int in [0, 2**63), got -1"),
    ({"attention_block_max_tokens": -64}, ValueError, "attention_block_max_tokens must be an int in [0, 2**63), "
                                                      "got -64"),
    ({"verify": "yes"}, TypeError, "verify must be True, False, None (check when rules from outside the shipped "
                                   "set are loaded) or a mapping of reference inputs (name -> array), got 'yes' (str)"),
    ({"regions": 1}, TypeError, "regions must be True or False, got 1 (int)"),
    ({"exact_gap": None}, TypeError, "exact_gap must be True or False, got None (NoneType)"),
    ({"engine": "egg"}, ValueError, "engine must be one of ('auto', 'egglog', 'fallback'), got 'egg'; "
                                    "did you mean 'egglog'?"),
    ({"engine": 1}, TypeError, "engine must be one of ('auto', 'egglog', 'fallback'), got 1 (int)"),
    ({"extraction": "ilp"}, ValueError, "extraction must be one of ('greedy', 'exact'), got 'ilp'"),
    ({"target": "cdua"}, ValueError, f"target must be one of {tuple(TARGETS)} or a cost.Target, got 'cdua'; "
                                     "did you mean 'cuda'?"),
    ({"max_iteration": 3}, TypeError, "unknown optimize option 'max_iteration'; did you mean 'max_iterations'?"),
    ({"colour": 3}, TypeError, "unknown optimize option 'colour' (known: target, rules, verify, engine, "
                               f"extraction, {', '.join(KNOWN_AFTER_EXTRACTION)})"),
]


@pytest.mark.parametrize(("options", "error", "message"), BAD_OPTIONS,
                         ids=[",".join(f"{k}={v!r}" for k, v in c[0].items()) for c in BAD_OPTIONS])
def test_optimize_rejects_bad_options_naming_them(options: dict[str, Any], error: type[Exception],
                                                  message: str) -> None:
    """The same error from the keywords of optimize, from Options and from Options.replace."""
    for attempt in (lambda: optimize_with_report(examples.mlp(layers=1), **options), lambda: Options(**options),
                    lambda: Options(engine="fallback").replace(**options)):
        with pytest.raises(error) as info:
            attempt()
        assert type(info.value) is error
        assert str(info.value) == message


def test_options_reject_no_target_and_a_positional_value() -> None:
    """None is no target (by keyword or position to optimize it leaves the options' target); Options takes keywords
    only, and optimize's ``options`` only an Options."""
    with pytest.raises(TypeError) as info:
        Options(target=None)
    assert str(info.value) == f"target must be one of {tuple(TARGETS)} or a cost.Target, got None (NoneType)"
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 2 were given"):
        Options("cuda")  # type: ignore[misc]
    with pytest.raises(TypeError) as info:
        optimize(examples.mlp(layers=1), options={"engine": "fallback"})  # type: ignore[arg-type]
    assert str(info.value) == "options must be an rlx_egraph.Options, got {'engine': 'fallback'} (dict)"


def test_options_and_keywords_make_the_same_run() -> None:
    """``options=Options(...)`` and the keywords are one run; keywords given beside ``options`` change those
    options, and None for target, rules or verify leaves them as ``options`` has them."""
    g = examples.mlp(layers=1)
    cuda_fallback = Options(target="cuda", engine="fallback", regions=False)
    by_options, report = optimize_with_report(g, options=cuda_fallback)
    assert (report.target, report.engine) == ("cuda", "fallback")
    assert optimize(g, "cuda", engine="fallback", regions=False) == by_options
    assert optimize(g, None, None, None, options=cuda_fallback) == by_options
    _, report = optimize_with_report(g, "cpu", options=cuda_fallback, engine="egglog")
    assert (report.target, report.engine) == ("cpu", "egglog")
    assert cuda_fallback.replace(target="cpu") == Options(target="cpu", engine="fallback", regions=False)
    assert cuda_fallback.limits == SaturationLimits()
    assert Options(max_seconds=5, match_limit=7).limits == SaturationLimits(max_seconds=5, match_limit=7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cuda_fallback.engine = "egglog"  # type: ignore[misc]


def test_optimize_rejects_a_graph_that_is_not_a_graph() -> None:
    data = tiny()
    with pytest.raises(TypeError, match=r"^graph must be an rlx_egraph.Graph, got \{'format': 'rlx-egraph-mir', "):
        optimize(data)  # type: ignore[arg-type]


def test_good_edge_options_are_accepted() -> None:
    g = examples.mlp(layers=1)
    _, report = optimize_with_report(g, TARGETS["cuda"], rules=[], max_seconds=float("inf"), max_iterations=0,
                                       match_limit=0, seed=0, attention_block_max_tokens=0)
    assert (report.target, report.matches_per_rule) == ("cuda", {})  # no rules: nothing matched


def test_a_graph_with_a_nan_constant_equals_its_copy() -> None:
    g = Graph()
    g.set_outputs([g.add(g.input("x", (2,)), g.constant(np.array([np.nan, 1.0], np.float32)))])
    assert g.copy() == g
    other = Graph()
    other.set_outputs([other.add(other.input("x", (2,)), other.constant(np.array([np.nan, 2.0], np.float32)))])
    assert other != g
