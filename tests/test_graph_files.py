"""Graph JSON and its weight store (.npz) from untrusted hands: what may be named, what is read, and the clear
error for each malformed file (the same files through the CLI, in capped subprocesses: test_hostile_graph_files.py)."""

from __future__ import annotations

import json
import re
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hostile import zip_bomb
from rlx_egraph import Graph, GraphError, evaluate
from rlx_egraph.ir.dims import MAX_NESTING, MAX_TERMS, parse


def linear(tmp_path: Path) -> tuple[Path, dict]:
    """A saved x[2, 4] @ w[4, 3] graph with w = 1 in its store; returns the JSON path and its data."""
    g = Graph("lin")
    g.set_outputs([g.matmul(g.input("x", (2, 4)), g.param("w", (4, 3)))])
    g.weights = {"w": np.ones((4, 3), np.float32)}
    g.save(tmp_path / "lin.json")
    return tmp_path / "lin.json", json.loads((tmp_path / "lin.json").read_text())


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


# --- which file a graph may name as its weight store --------------------------------------------------------


@pytest.mark.parametrize("store", ["../secret.npz", "/abs/secret.npz", "sub/secret.npz", "..\\secret.npz",
                                   "secret.npy", ".."])
def test_only_a_npz_beside_the_graph_may_be_named(tmp_path: Path, store: str) -> None:
    (tmp_path / "g").mkdir()
    path, data = linear(tmp_path / "g")
    np.savez(tmp_path / "secret.npz", w=np.full((4, 3), 7.0, np.float32))
    np.savez(tmp_path / "g" / "secret.npy", w=np.full((4, 3), 7.0, np.float32))
    with pytest.raises(GraphError, match=re.escape("'weights' must name a .npz file beside the graph (a file name, "
                                                   f"no folder), got {store!r}")):
        Graph.load(write(path, {**data, "weights": store}))


def test_a_store_linked_from_outside_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    path, data = linear(tmp_path / "g")
    np.savez(tmp_path / "secret.npz", w=np.full((4, 3), 7.0, np.float32))
    (tmp_path / "g" / "link.npz").symlink_to(tmp_path / "secret.npz")
    with pytest.raises(GraphError, match=r"weight store 'link\.npz' named by .*lin\.json: it links to a file "
                                         r"outside the graph's folder"):
        Graph.load(write(path, {**data, "weights": "link.npz"}))


# --- what is read from it -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("array", "problem"), [
    (np.array([["a"] * 3] * 4), r"array 'w' holds <U1 values; its Param is f32 \(a value is a real array of bool, "
                                r"int or float\)"),
    (np.full((4, 3), 1 + 2j, np.complex64), r"array 'w' holds complex64 values; its Param is f32"),
    (np.array([None] * 12, object).reshape(4, 3), r"array 'w' holds object values"),
    (np.ones((5, 3), np.float32), r"array 'w' has shape \[5, 3\]; its Param has shape \[4, 3\]"),
    (np.ones((12,), np.float32), r"array 'w' has shape \[12\]; its Param has shape \[4, 3\]"),
])
def test_a_stored_array_must_fit_its_param(tmp_path: Path, array: np.ndarray, problem: str) -> None:
    path, data = linear(tmp_path)
    np.savez(tmp_path / "bad.npz", w=array)
    with pytest.raises(GraphError, match=rf"weight store 'bad\.npz' named by .*lin\.json: {problem}"):
        Graph.load(write(path, {**data, "weights": "bad.npz"}))


def test_not_an_npz_archive_is_named(tmp_path: Path) -> None:
    path, data = linear(tmp_path)
    np.save(tmp_path / "w.npy", np.ones((4, 3), np.float32))
    (tmp_path / "w.npz").write_bytes((tmp_path / "w.npy").read_bytes())  # an .npy renamed
    with pytest.raises(GraphError, match=r"weight store 'w\.npz' named by .*: not an \.npz archive"):
        Graph.load(write(path, {**data, "weights": "w.npz"}))
    (tmp_path / "w.npz").write_bytes(b"PK\x03\x04" + bytes(40))  # a broken zip
    with pytest.raises(GraphError, match=r"weight store 'w\.npz' named by .*: "):
        Graph.load(write(path, {**data, "weights": "w.npz"}))


@pytest.mark.long
def test_a_zip_bomb_is_never_inflated(tmp_path: Path) -> None:
    path, data = linear(tmp_path)
    (tmp_path / "huge.npz").write_bytes(zip_bomb((40_000, 40_000)))  # declares 6.4 GB, holds 1 GB of zeros
    with pytest.raises(GraphError, match=r"array 'w' has shape \[40000, 40000\]; its Param has shape \[4, 3\]"):
        Graph.load(write(path, {**data, "weights": "huge.npz"}))
    # a header that tells the truth about the Param but data that goes on: only the Param's 48 bytes are read
    (tmp_path / "long.npz").write_bytes(zip_bomb((4, 3)))
    t0 = time.perf_counter()
    g = Graph.load(write(path, {**data, "weights": "long.npz"}))
    assert time.perf_counter() - t0 < 2.0
    np.testing.assert_array_equal(g.weights["w"], np.zeros((4, 3), np.float32))
    # an array that names no Param of the graph is not read at all: the first bomb with its member renamed (a zip
    # stores member names uncompressed, in the member's header and in the central directory; the data's CRC is of
    # the data alone), rather than another GB of zeros compressed again
    huge = (tmp_path / "huge.npz").read_bytes()
    assert huge.count(b"w.npy") == 2
    (tmp_path / "other.npz").write_bytes(huge.replace(b"w.npy", b"o.npy"))
    with zipfile.ZipFile(tmp_path / "other.npz") as z:
        assert [(i.filename, i.file_size) for i in z.infolist()] == [("o.npy", (1 << 30) + 128)]
    assert Graph.load(write(path, {**data, "weights": "other.npz"})).weights == {}


def test_a_truncated_array_is_named(tmp_path: Path) -> None:
    path, data = linear(tmp_path)
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z, z.open("w.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (4, 3)})
        f.write(bytes(20))
    with pytest.raises(GraphError, match=r"array 'w' is truncated: 20 of 48 bytes"):
        Graph.load(write(path, {**data, "weights": "short.npz"}))


def test_stored_weights_of_every_kind_round_trip(tmp_path: Path) -> None:
    g = Graph("kinds")
    x = g.input("x", (3,), "bf16")
    w, k, m = g.param("w", (3,), "bf16"), g.param("k", (3,), "i64"), g.param("m", (3,), "bool")
    g.set_outputs([g.add(x, w), g.add(k, k), g.relu(g.cast(m, dtype="f32"))])
    g.weights = {"w": np.array([1.5, -2.0, 0.25], np.float32), "k": np.array([1, 2, 3]),
                 "m": np.array([True, False, True])}
    g.save(tmp_path / "kinds.json")
    back = Graph.load(tmp_path / "kinds.json")
    for name, value in g.weights.items():
        assert back.weights[name].dtype == value.dtype
        np.testing.assert_array_equal(back.weights[name], value)
    assert [o.tolist() for o in evaluate(back, {"x": np.zeros(3, np.float32)})] == [
        [1.5, -2.0, 0.25], [2, 4, 6], [1.0, 0.0, 1.0]]


# --- where a graph may be saved ------------------------------------------------------------------------------


def test_saving_a_graph_as_its_own_weight_store_is_refused(tmp_path: Path) -> None:
    path, _ = linear(tmp_path)
    before = (tmp_path / "lin.npz").read_bytes()
    g = Graph.load(path)
    with pytest.raises(GraphError, match=r"lin\.npz: a graph is saved as JSON; '\.npz' is the suffix of its weight "
                                         r"store, written beside it \(save the graph as NAME\.json\)"):
        g.save(tmp_path / "lin.npz")
    assert (tmp_path / "lin.npz").read_bytes() == before
    np.testing.assert_array_equal(Graph.load(path).weights["w"], np.ones((4, 3), np.float32))


# --- malformed graph records ----------------------------------------------------------------------------------


@pytest.mark.parametrize("big", [2**62, 2**63, 2**64, -(2**62) - 1])
def test_node_ids_past_64_bits_are_refused(big: int) -> None:
    records = [{"id": big, "op": "Input", "attrs": {"name": "x", "shape": [2], "dtype": "f32"}},
               {"id": 1, "op": "Relu", "inputs": [big]}]
    with pytest.raises(GraphError, match=rf"node record 0: 'id' {big} is out of range \(node ids are ints in "
                                         r"\[-2\*\*62, 2\*\*62\)\)"):
        Graph.from_dict({"format": "rlx-egraph-mir", "version": 1, "nodes": records, "outputs": [1]})
    with pytest.raises(GraphError, match=r"node id .* is out of range"):
        Graph().add_node("Input", node_id=big, name="x", shape=(2,))


def test_a_string_is_not_a_shape() -> None:
    g = Graph()
    with pytest.raises(GraphError, match=r"node 0 \(Input\): attribute shape='seq' must be a list, not a str \(a "
                                         r"shape of one dim is \['seq'\]\)"):
        g.input("x", "seq")
    with pytest.raises(GraphError, match=r"attribute shape='batch' must be a list, not a str"):
        Graph.from_dict({"format": "rlx-egraph-mir", "version": 2, "outputs": [0], "nodes": [
            {"id": 0, "op": "Input", "attrs": {"name": "x", "shape": "batch", "dtype": "f32"}}]})
    x = g.input("x", ("seq", 4))
    with pytest.raises(GraphError, match=r"attribute perm='10' must be a list, not a str"):
        g.transpose(x, perm="10")
    assert g.node(x).shape == (parse("seq"), 4)


def test_deeply_nested_dims_and_region_chains_are_clear_errors() -> None:
    deep = "(" * 3000 + "b" + ")" * 3000
    with pytest.raises(GraphError, match=r"node 0 \(Input\): attribute shape=\('\(\(\(.*\.\.\..*, 4\): dim "
                                         r"'\(\(\(.*'\.\.\. is 6001 characters long \(at most 4096\)"):
        Graph().input("x", (deep, 4))
    nested = "(" * (MAX_NESTING + 1) + "b" + ")" * (MAX_NESTING + 1)
    with pytest.raises(GraphError, match=rf"parentheses nest deeper than {MAX_NESTING}"):
        Graph().input("x", (nested, 4))
    g = Graph()
    x = g.input("x", (4,))
    with pytest.raises(GraphError, match=r"node 1 \(ElementwiseRegion\): chain is nested too deeply to read"):
        g.add_node("ElementwiseRegion", [x], chain="[" * 100_000 + "]" * 100_000)


def test_a_dim_expression_is_bounded_and_read_in_linear_time() -> None:
    product = "*".join(["(a+b+c+d+e+f)"] * 12)  # 167 bytes, 6,188 terms multiplied out
    t0 = time.perf_counter()
    with pytest.raises(GraphError, match=rf"a dim expression of 126 terms is too large \(at most {MAX_TERMS}\)"):
        Graph().input("x", (product, 4))
    assert time.perf_counter() - t0 < 1.0
    # the largest product of sums within the bound, written out as its sum of 64 terms, parses back to itself
    within = parse("(a+1)*(b+1)*(c+1)*(d+1)*(e+1)*(f+1)")
    assert len(within.terms) == MAX_TERMS and parse(str(within)) == within
    long_sum = "+".join(["a*b"] * 300 + ["c"] * 300)  # 3,000 characters: one add per term, no re-sorting
    t0 = time.perf_counter()
    assert str(parse(long_sum)) == "300*a*b+300*c"
    assert time.perf_counter() - t0 < 0.5
    with pytest.raises(GraphError, match=r"degree 17 is too large \(at most 16\)"):
        Graph().input("x", ("*".join("a" * 17),))
