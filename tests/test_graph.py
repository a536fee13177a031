"""The Graph API: builders, queries, printing, equality, JSON I/O and validation."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_egraph import Graph, GraphError, evaluate
from rlx_egraph.ir.graph import FORMAT, FORMAT_VERSION, Node

Record = dict[str, Any]


def small_graph(eps: float = 1e-5, swap: bool = False, outputs: tuple[str, ...] = ("ln",)) -> Graph:
    """x, y -> Add -> LayerNorm(gamma, beta); knobs make structurally different variants."""
    g = Graph("small")
    ids = {"x": g.input("x", (2, 3)), "y": g.input("y", (2, 3))}
    gamma, beta = g.param("gamma", (3,)), g.param("beta", (3,))
    ids["sum"] = g.add(ids["y"], ids["x"]) if swap else g.add(ids["x"], ids["y"])
    ids["ln"] = g.layer_norm(ids["sum"], gamma, beta, eps=eps)
    g.set_outputs([ids[k] for k in outputs])
    return g


# --- building and queries -----------------------------------------------------------


def test_builders_return_consecutive_int_ids() -> None:
    g = Graph()
    ids = [g.input("x", (4, 8)), g.param("w", (8, 5)), g.scalar(2.0), g.constant(np.ones(5, np.float32))]
    ids.append(g.matmul(ids[0], ids[1]))
    ids.append(g.mul(ids[4], ids[2]))
    ids.append(g.add(ids[5], ids[3]))
    assert ids == list(range(7))
    assert all(type(i) is int for i in ids)
    assert [n.op for n in g.nodes] == ["Input", "Param", "Scalar", "Constant", "MatMul", "Mul", "Add"]
    assert g.node(6).shape == (4, 5) and g.node(6).dtype == "f32"
    assert g.node(4).inputs == (0, 1)
    assert len(g) == 7 and 6 in g and 7 not in g
    assert g.op_counts()["Input"] == 1 and sum(g.op_counts().values()) == 7
    assert [n.name for n in g.inputs] == ["x"] and [n.name for n in g.params] == ["w"]
    assert g.leaf("w").id == 1


def test_nodes_are_topological() -> None:
    g = small_graph()
    position = {n.id: k for k, n in enumerate(g.nodes)}
    assert isinstance(g.nodes, tuple) and len(position) == 6
    for n in g.nodes:
        assert all(position[i] < position[n.id] for i in n.inputs), n


def test_a_node_is_frozen_and_its_constructor_takes_its_fields_in_order() -> None:
    """Node writes its own __init__ (faster than the frozen dataclass's): its parameters must stay its fields."""
    import dataclasses
    import inspect

    assert list(inspect.signature(Node).parameters) == [f.name for f in dataclasses.fields(Node)]
    node = Node(3, "Add", (1, 2), {}, (4, 5), "f32")
    assert (node.id, node.op, node.inputs, node.attrs, node.shape, node.dtype, node.parts) == \
        (3, "Add", (1, 2), {}, (4, 5), "f32", ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.op = "Mul"  # type: ignore[misc]
    moved = dataclasses.replace(node, id=7, inputs=(2, 1))
    assert (moved.id, moved.inputs, moved.op, str(moved.type)) == (7, (2, 1), "Add", "f32[4, 5]")


def test_users_and_use_count() -> None:
    g = Graph()
    x = g.input("x", (3,))
    sq = g.mul(x, x)  # reads x twice: x has one user
    neg = g.neg(x)
    total = g.add(sq, neg)
    g.set_outputs([total, sq, sq])
    assert g.users(x) == [sq, neg]
    assert g.use_count(x) == 2
    assert g.users(sq) == [total]
    assert g.use_count(sq) == 3  # one consumer plus two output slots
    assert g.users(total) == [] and g.use_count(total) == 1
    with pytest.raises(GraphError, match="no node 99"):
        g.users(99)


def test_str_shows_id_op_attrs_inputs_and_type() -> None:
    g = small_graph(outputs=("ln", "sum"))
    lines = str(g).splitlines()
    assert lines[0] == "graph small: 6 nodes, outputs ['%5', '%4'] (* marks outputs)"
    assert re.fullmatch(r"\s*id\s+op\s+attrs\s+inputs\s+type", lines[1])
    assert re.fullmatch(r"\s*%0\s+Input\s+name=x, shape=\[2, 3\], dtype=f32\s+f32\[2, 3\]", lines[2])
    assert re.fullmatch(r"\s*%4 \*\s+Add\s+%0, %1\s+f32\[2, 3\]", lines[6])
    assert re.fullmatch(r"\s*%5 \*\s+LayerNorm\s+axis=-1, eps=1e-05\s+%4, %2, %3\s+f32\[2, 3\]", lines[7])
    assert len(lines) == 8


@pytest.mark.parametrize(
    ("other", "equal"),
    [
        (small_graph(), True),
        (small_graph(eps=1e-6), False),  # different attribute
        (small_graph(swap=True), False),  # different inputs
        (small_graph(outputs=("sum",)), False),  # different outputs
        (small_graph(outputs=("ln", "sum")), False),
    ],
    ids=["same", "attr", "inputs", "outputs", "extra-output"],
)
def test_structural_equality(other: Graph, equal: bool) -> None:
    assert (small_graph() == other) is equal
    assert (other == small_graph()) is equal


def test_equality_compares_constant_arrays_by_value_and_dtype() -> None:
    def const_graph(value: np.ndarray, dtype: str | None = None) -> Graph:
        g = Graph()
        g.set_outputs([g.constant(value, dtype)])
        return g

    base = np.arange(4, dtype=np.float32)
    assert const_graph(base) == const_graph(base.copy())
    assert const_graph(base) != const_graph(base + 1)
    assert const_graph(base) != const_graph(base, "f16")


# --- JSON -------------------------------------------------------------------------


def every_leaf_graph() -> Graph:
    """A graph holding every leaf kind, several dtypes and tuple/JSON/array attributes."""
    g = Graph("leaves")
    x = g.input("x", (2, 3))
    ids = g.input("ids", (2, 3), dtype="i64")
    cond = g.input("cond", (2, 3), dtype="bool")
    w16 = g.param("w16", (3, 2), dtype="f16")
    wb = g.param("wbf", (3,), dtype="bf16")
    table = g.constant(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(6, 2))
    offsets = g.constant(np.array([[1, -2, 3]], dtype=np.int64))
    flags = g.constant(np.array([True, False, True]))
    half = g.scalar(0.5)
    emb = g.embedding(table, ids)
    shifted = g.add(ids, offsets)
    picked = g.where(cond, x, g.mul(x, half))
    gated = g.where(flags, picked, g.cast(wb, dtype="f32"))
    proj = g.matmul(g.cast(gated, dtype="f16"), w16)
    summed = g.reduce_sum(g.transpose(g.cast(proj, dtype="f32"), perm=(1, 0)), axes=(0,), keepdims=True)
    region = g.elementwise_region([x, half], chain=json.dumps([["Mul", {}, [0, 1]], ["Relu", {}, [-1]]]))
    flat = g.reshape(emb, shape=(-1, 2))
    g.set_outputs([summed, region, flat, shifted])
    return g


def test_every_leaf_graph_has_the_advertised_contents() -> None:
    g = every_leaf_graph()
    assert {"Input", "Param", "Constant", "Scalar"} <= set(g.op_counts())
    assert {n.dtype for n in g.nodes} == {"f32", "i64", "bool", "f16", "bf16"}
    assert g.node(g.outputs[2]).attrs["shape"] == (6, 2)


def test_json_round_trip_is_exact(tmp_path: Path) -> None:
    g = every_leaf_graph()
    text = g.to_json()
    back = Graph.from_json(text)
    assert back == g
    assert back.name == "leaves"
    assert back.to_json() == text
    path = tmp_path / "g.json"
    g.save(path)
    loaded = Graph.load(path)
    assert loaded == g
    for a, b in zip(g.nodes, loaded.nodes, strict=True):
        for key, value in a.attrs.items():
            assert type(b.attrs[key]) is type(value), (a, key)
            if isinstance(value, np.ndarray):
                assert b.attrs[key].dtype == value.dtype and np.array_equal(b.attrs[key], value)
    for want, got in zip(evaluate(g, seed=5), evaluate(loaded, seed=5), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_copy_is_equal_and_independent() -> None:
    g = small_graph()
    c = g.copy()
    assert c == g
    c.relu(c.outputs[0])
    assert len(c) == len(g) + 1 and c != g


# --- from_nodes ---------------------------------------------------------------------


def leaf(nid: int, name: str, shape: tuple[int, ...], dtype: str = "f32", op: str = "Input") -> Record:
    return {"id": nid, "op": op, "inputs": [], "attrs": {"name": name, "shape": list(shape), "dtype": dtype}}


def rec(nid: int, op: str, inputs: list[int], **attrs: Any) -> Record:
    return {"id": nid, "op": op, "inputs": inputs, "attrs": attrs}


def test_from_nodes_sorts_records_topologically() -> None:
    records = [
        rec(3, "LayerNorm", [2, 4, 5], eps=1e-5),
        rec(2, "Add", [0, 1]),
        leaf(5, "beta", (3,), op="Param"),
        leaf(1, "y", (2, 3)),
        leaf(4, "gamma", (3,), op="Param"),
        leaf(0, "x", (2, 3)),
    ]
    g = Graph.from_nodes(records, [3])
    assert [n.id for n in g.nodes] == [0, 1, 2, 4, 5, 3]
    seen: set[int] = set()
    for n in g.nodes:
        assert set(n.inputs) <= seen
        seen.add(n.id)
    assert g.node(3).shape == (2, 3) and g.outputs == (3,)
    # Records of a builder-made graph, given in reverse, come back as the same nodes.
    built = small_graph()
    records = [{"id": n.id, "op": n.op, "inputs": list(n.inputs), "attrs": n.attrs} for n in built.nodes]
    back = Graph.from_nodes(reversed(records), built.outputs)
    assert {n.id: n for n in back.nodes} == {n.id: n for n in built.nodes}
    assert Graph.from_nodes(records, built.outputs, name="small") == built


# Leaves every error case builds on: 0 x f32[4, 8], 1 y f32[4, 8], 2 h f16[4, 8], 3 w Param f32[4, 8].
BASE = [leaf(0, "x", (4, 8)), leaf(1, "y", (4, 8)), leaf(2, "h", (4, 8), "f16"), leaf(3, "w", (4, 8), op="Param")]

# (label, bad node id 4: op, inputs, attrs, message fragment after "node 4 (<op>): ")
BAD_NODES: list[tuple[str, str, list[int], dict[str, Any], str]] = [
    ("dangling-input", "Relu", [7], {}, "input 0 refers to node 7, which is not in the graph"),
    ("arity-low", "Add", [0], {}, "takes 2 input(s) (a, b), got 1"),
    ("arity-high", "Relu", [0, 1], {}, "takes 1 input(s) (x), got 2"),
    ("matmul-shapes", "MatMul", [0, 1], {}, "MatMul contracts 8 with 4: shapes [4, 8] and [4, 8] do not match"),
    ("dtype-mismatch", "Add", [0, 2], {}, "Add operands have different dtypes ['f32', 'f16']"),
    ("unknown-attr", "Relu", [0], {"alpha": 0.1}, "unknown attribute(s) ['alpha']; Relu takes []"),
    ("missing-attr", "Transpose", [0], {}, "missing attribute 'perm'"),
    ("axis-range", "Softmax", [0], {"axis": 2}, "axis 2 is out of range for rank 2"),
    ("axis-range-neg", "Softmax", [0], {"axis": -3}, "axis -3 is out of range for rank 2"),
    ("eps-zero", "LayerNorm", [0, 3, 3], {"eps": 0.0}, "attribute eps=0.0 must be a finite number > 0"),
    ("eps-negative", "RmsNorm", [0, 3], {"eps": -1e-6}, "attribute eps=-1e-06 must be a finite number > 0"),
    ("eps-nan", "LayerNorm", [0, 3, 3], {"eps": float("nan")}, "attribute eps=nan must be finite"),
    ("attr-type", "Narrow", [0], {"start": 1.5, "length": 1}, "attribute start=1.5 is not of type int"),
    ("narrow-past-end", "Narrow", [0], {"axis": 1, "start": 5, "length": 4},
     "Narrow [5, 9) runs past the end of axis -1 (size 8)"),
    ("perm", "Transpose", [0], {"perm": (0, 0)}, "perm [0, 0] is not a permutation of the 2 axes"),
    ("perm-rank", "Transpose", [0], {"perm": (1, 0, 2)}, "perm [1, 0, 2] is not a permutation of the 2 axes"),
    ("reshape-count", "Reshape", [0], {"shape": (5, 6)}, "cannot reshape [4, 8] (32 elements) to [5, 6]"),
    ("reshape-two-wildcards", "Reshape", [0], {"shape": (-1, -1)},
     "reshape target [-1, -1] may hold positive dims and at most one -1"),
    ("duplicate-input-name", "Input", [], {"name": "x", "shape": (2,)}, "name 'x' is already used by node 0"),
    ("duplicate-param-name", "Param", [], {"name": "w", "shape": (2,)}, "name 'w' is already used by node 3"),
    ("param-named-like-input", "Param", [], {"name": "y", "shape": (2,)}, "name 'y' is already used by node 1"),
    ("concat-params-input", "ConcatParams", [3, 0], {"axis": 0}, "inputs must be parameters, node 0 is Input"),
    ("bad-dtype", "Input", [], {"name": "z", "shape": (2,), "dtype": "f64"},
     "attribute dtype='f64' is not a dtype (f32, f16, bf16, i64, i32, bool)"),
    ("bad-choice", "Gelu", [0], {"approximate": "fast"},
     "attribute approximate='fast' must be one of ['none', 'tanh']"),
]


@pytest.mark.parametrize(("op", "inputs", "attrs", "problem"), [c[1:] for c in BAD_NODES],
                         ids=[c[0] for c in BAD_NODES])
def test_from_nodes_rejects_bad_node(op: str, inputs: list[int], attrs: dict[str, Any], problem: str) -> None:
    records = [*BASE, rec(4, op, inputs, **attrs)]
    with pytest.raises(GraphError) as info:
        Graph.from_nodes(records, [4])
    assert str(info.value) == f"node 4 ({op}): {problem}"


@pytest.mark.parametrize(("op", "inputs", "attrs", "problem"), [c[1:] for c in BAD_NODES],
                         ids=[c[0] for c in BAD_NODES])
def test_failed_add_leaves_graph_unchanged(op: str, inputs: list[int], attrs: dict[str, Any], problem: str) -> None:
    g = Graph.from_nodes(BASE, [0])
    before = g.to_json()
    last = g.nodes[-1]
    users = {n.id: g.users(n.id) for n in g.nodes}
    with pytest.raises(GraphError) as info:
        g.add_node(op, inputs, **attrs)
    assert str(info.value) == f"node 4 ({op}): {problem}"
    assert len(g) == 4 and g.nodes[-1] == last
    assert {n.id: g.users(n.id) for n in g.nodes} == users
    assert g.to_json() == before
    assert g.relu(0) == 4  # the id of the failed node is free again


def test_builder_with_wrong_arguments_names_node_and_op() -> None:
    g = Graph.from_nodes(BASE, [0])
    with pytest.raises(GraphError, match=r"^node 4 \(Add\): missing a required argument: 'b'$"):
        g.add(0)
    with pytest.raises(GraphError, match=r"^node 4 \(Softmax\): got an unexpected keyword argument 'dim'$"):
        g.softmax(0, dim=1)
    assert len(g) == 4


def test_unknown_op_is_rejected_and_leaves_graph_unchanged() -> None:
    with pytest.raises(GraphError, match=r"^node 4: unknown op 'Frobnicate'$"):
        Graph.from_nodes([*BASE, rec(4, "Frobnicate", [0])], [4])
    g = Graph.from_nodes(BASE, [0])
    with pytest.raises(GraphError, match=r"^node 4: unknown op 'Frobnicate'$"):
        g.add_node("Frobnicate", [0])
    assert len(g) == 4 and g.users(0) == []


def test_from_nodes_rejects_a_cycle() -> None:
    records = [*BASE, rec(4, "Add", [0, 5]), rec(5, "Relu", [4])]
    with pytest.raises(GraphError, match=r"^node 5 \(Relu\): the graph has a cycle through nodes 4 -> 5 -> 4$"):
        Graph.from_nodes(records, [5])


def test_from_nodes_rejects_a_self_loop_and_duplicate_ids() -> None:
    with pytest.raises(GraphError, match=r"^node 4 \(Relu\): the graph has a cycle through nodes 4 -> 4$"):
        Graph.from_nodes([*BASE, rec(4, "Relu", [4])], [4])
    with pytest.raises(GraphError, match=r"^node 0: id 0 is used twice$"):
        Graph.from_nodes([*BASE, rec(0, "Relu", [1])], [0])


def test_from_nodes_rejects_dangling_input_before_building() -> None:
    records = [rec(4, "Relu", [9]), *BASE]
    with pytest.raises(GraphError, match=r"^node 4 \(Relu\): input 0 refers to node 9, which is not in the graph$"):
        Graph.from_nodes(records, [4])


def test_set_outputs_rejects_missing_node() -> None:
    with pytest.raises(GraphError, match="output refers to node 12, which is not in the graph"):
        Graph.from_nodes(BASE, [0, 12])


# --- malformed files ----------------------------------------------------------------


def file_text(**changes: Any) -> str:
    data = small_graph().to_dict()
    data.update(changes)
    return json.dumps(data)


def test_load_rejects_malformed_json() -> None:
    with pytest.raises(GraphError, match=r"^graph file is not valid JSON: Expecting"):
        Graph.from_json(file_text()[:-3])


def test_load_rejects_wrong_format_and_version() -> None:
    with pytest.raises(GraphError, match=rf"^graph format version 3 is not supported \(this library reads versions 1 "
                                         rf"and {FORMAT_VERSION}\)$"):
        Graph.from_json(file_text(version=3))
    with pytest.raises(GraphError, match=f"^not an rlx-egraph graph: expected format '{FORMAT}'$"):
        Graph.from_json(file_text(format="onnx"))
    with pytest.raises(GraphError, match=r"^not an rlx-egraph graph"):
        Graph.from_json("[1, 2]")


def test_load_rejects_missing_fields() -> None:
    data = small_graph().to_dict()
    del data["outputs"]
    with pytest.raises(GraphError, match=r"^malformed graph file: missing field 'outputs'$"):
        Graph.from_dict(data)


def test_load_rejects_shape_or_dtype_disagreeing_with_inference() -> None:
    data = small_graph().to_dict()
    data["nodes"][4]["shape"] = [3, 2]
    with pytest.raises(GraphError, match=r"^node 4 \(Add\): file says f32\[3, 2\], inferred f32\[2, 3\]$"):
        Graph.from_dict(data)
    data = small_graph().to_dict()
    data["nodes"][5]["dtype"] = "f16"
    with pytest.raises(GraphError, match=r"^node 5 \(LayerNorm\): file says f16\[2, 3\], inferred f32\[2, 3\]$"):
        Graph.from_dict(data)


def test_load_rejects_bad_node_in_file_naming_it() -> None:
    data = small_graph().to_dict()
    data["nodes"][5]["attrs"]["eps"] = -1.0
    with pytest.raises(GraphError, match=r"^node 5 \(LayerNorm\): attribute eps=-1.0 must be a finite number > 0$"):
        Graph.from_dict(data)


def test_symbols_are_remembered_and_follow_every_added_node():
    g = Graph()
    g.input("x", (4, 8))
    assert g.symbols == () and g.symbols is g.symbols  # computed once
    y = g.input("y", ("batch", 8))
    assert g.symbols == ("batch",)
    g.input("z", ("seq", 8))
    assert g.symbols == ("batch", "seq")
    g.set_outputs([y])
    assert g.symbols == ("batch", "seq") and g.copy().symbols == ("batch", "seq")
    r = g.node(g.reshape(y, shape=("batch", 2, 4)))
    assert list(r.dim_tuples()) == [r.shape, r.attrs["shape"]] and len(r.attrs["shape"]) == 3  # shape, then target
    assert list(r.dims()) == [d for dims in r.dim_tuples() for d in dims]


def test_leaves_of_one_type_share_a_remembered_resolve_yet_each_keeps_and_checks_its_own_name() -> None:
    g = Graph()
    first, second = g.param("w1", (8, 5)), g.param("w2", (8, 5))  # the second is a remembered resolve
    assert [g.node(n).attrs for n in (first, second)] == [
        {"name": "w1", "shape": (8, 5), "dtype": "f32"}, {"name": "w2", "shape": (8, 5), "dtype": "f32"}]
    assert list(g.node(second).attrs) == ["name", "shape", "dtype"]  # canonical order, as resolved
    with pytest.raises(GraphError, match=r"^node 2 \(Param\): attribute name=3 is not of type str$"):
        g.add_node("Param", name=3, shape=(8, 5), dtype="f32")
    with pytest.raises(GraphError, match=r"^node 2 \(Param\): name 'w1' is already used by node 0$"):
        g.param("w1", (8, 5))
    with pytest.raises(GraphError, match=r"^node 2 \(Scalar\): unknown attribute\(s\) \['name'\]"):
        g.add_node("Scalar", value=1.0, dtype="f32", name="w3")
    assert len(g) == 2


def test_a_remembered_resolve_tells_negative_zero_from_zero() -> None:
    g = Graph()
    plus, minus, again = g.scalar(0.0), g.scalar(-0.0), g.scalar(0.0)  # 0.0 == -0.0, yet 1 / -0.0 is -inf
    assert [math.copysign(1.0, g.node(n).attrs["value"]) for n in (plus, minus, again)] == [1.0, -1.0, 1.0]


def test_add_checked_appends_a_checked_node_as_it_is_and_names_what_is_wrong() -> None:
    src = Graph()
    x = src.input("x", (2, 3))
    y = src.relu(x)
    dst = Graph()
    with pytest.raises(GraphError, match=r"node 1 \(Relu\): input 0 is not in the graph"):
        dst.add_checked(src.node(y))
    assert [dst.add_checked(src.node(i)) for i in (x, y)] == [x, y]
    assert dst.node(y) is src.node(y) and dst.users(x) == [y] and len(dst) == 2
    with pytest.raises(GraphError, match=r"node 1 \(Relu\): id 1 is already used"):
        dst.add_checked(src.node(y))


def test_users_follow_nodes_added_after_the_first_ask() -> None:
    g = Graph()
    x = g.input("x", (3,))
    a = g.relu(x)
    assert g.users(x) == [a]  # the readers are counted now, then kept up to date
    b = g.mul(x, a)
    assert g.users(x) == [a, b] and g.users(a) == [b] and g.users(b) == []


def test_positions_and_nodes_by_id_follow_nodes_added_after_the_first_ask() -> None:
    g = Graph()
    x = g.input("x", (3,))
    a = g.add_node("Relu", [x], node_id=10)
    assert g.positions() == {x: 0, a: 1} and dict(g.nodes_by_id) == {x: g.node(x), a: g.node(a)}
    b = g.add_node("Exp", [a], node_id=4)  # ids need not follow places
    assert g.positions() == {x: 0, a: 1, b: 2} and g.nodes_by_id[b] is g.node(b)
    assert Graph.from_checked("copy", list(g.nodes)).positions() == g.positions()


def test_from_checked_holds_the_nodes_in_order_and_names_a_reused_id_or_leaf_name() -> None:
    src = Graph("src")
    x = src.input("x", (2, 3))
    w = src.param("w", (2, 3))
    y = src.add(x, w)
    nodes = list(src.nodes)
    g = Graph.from_checked("dst", nodes)
    assert g.name == "dst" and g.nodes == src.nodes and g.users(x) == [y] and g.leaf("w").id == w
    assert g.add_node("Relu", [y]) == y + 1  # new ids follow the highest
    with pytest.raises(GraphError, match=r"node 1 \(Param\): id 1 is already used"):
        Graph.from_checked("dst", [*nodes, nodes[1]])
    clash = Node(7, "Param", (), {"name": "x"}, (4,), "f32")
    with pytest.raises(GraphError, match=r"node 7 \(Param\): name 'x' is already used by node 0"):
        Graph.from_checked("dst", [*nodes, clash])
