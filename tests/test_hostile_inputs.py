"""Hostile graph JSON, weight stores, rule files and command lines at the command line's front door: each runs
``rlx-egraph`` in its own process, capped at 1.5 GB of address space and 30 s of CPU (tests/capped_runner.py).
Each must end in one ``error:`` line with exit code 2 well inside the caps, write nothing (the working folder
and the input's folder hold what they held), and read nothing outside the input's folder (a weight store named
outside it is a FIFO: reading it would never return)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
MEMORY_MB, SECONDS = 1536, 30


def linear(weights: str | None = None, shape: object = (2, 4), node_id: int = 0, dim: object = None) -> str:
    """A graph JSON of x @ w (+ its weight store's name)."""
    data: dict = {"format": "rlx-egraph-mir", "version": 1, "name": "g", "nodes": [
        {"id": node_id, "op": "Input", "attrs": {"name": "x", "shape": shape if dim is None else [dim, 4]}},
        {"id": node_id + 1, "op": "Param", "attrs": {"name": "w", "shape": [4, 3]}},
        {"id": node_id + 2, "op": "MatMul", "inputs": [node_id, node_id + 1]}], "outputs": [node_id + 2]}
    if weights is not None:
        data["weights"] = weights
    return json.dumps(data)


def npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def bomb() -> bytes:
    """An .npz whose member 'w' declares 40000 x 40000 f32 (6.4 GB) and inflates to 1 GB of zeros."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open("w.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False,
                                                      "shape": (40000, 40000)})
        chunk = bytes(1 << 24)
        for _ in range(64):
            member.write(chunk)
    return buffer.getvalue()


def region_chain(depth: int) -> str:
    chain = "[" * depth + "]" * depth
    return json.dumps({"format": "rlx-egraph-mir", "version": 1, "nodes": [
                           {"id": 0, "op": "Input", "attrs": {"name": "x", "shape": [4]}},
                                 {"id": 1, "op": "ElementwiseRegion", "inputs": [0], "attrs": {"chain": chain}}],
                       "outputs": [1]})


# case -> (files to write beside the graph (name -> text or bytes), the command's arguments after "rlx-egraph" with
# {graph}, {folder} and {work} filled in, what its error line says)
Files = dict[str, str | bytes | Callable[[], bytes]]
CASES: dict[str, tuple[Files, list[str], str]] = {
    "weights outside the folder": ({"g.json": linear("../outside.fifo")}, ["optimize", "{graph}"],
                                   "'weights' must name a .npz file beside the graph (a file name, no folder), got "
                                   "'../outside.fifo'"),
    "weights by absolute path": ({"g.json": linear("/dev/zero")}, ["optimize", "{graph}"],
                                 "'weights' must name a .npz file beside the graph"),
    "weights linked out": ({"g.json": linear("link.npz")}, ["optimize", "{graph}"],
                           "it links to a file outside the graph's folder"),
    "a .npy store": ({"g.json": linear("w.npy"), "w.npy": lambda: npz(w=np.ones((4, 3), np.float32))},
                     ["optimize", "{graph}"], "'weights' must name a .npz file beside the graph"),
    "string weights": ({"g.json": linear("w.npz"), "w.npz": lambda: npz(w=np.full((4, 3), "a"))},
                       ["optimize", "{graph}"], "array 'w' holds <U1 values; its Param is f32"),
    "complex weights": ({"g.json": linear("w.npz"), "w.npz": lambda: npz(w=np.ones((4, 3), np.complex64))},
                        ["optimize", "{graph}"], "array 'w' holds complex64 values; its Param is f32"),
    "zip bomb": ({"g.json": linear("w.npz"), "w.npz": bomb}, ["optimize", "{graph}"],
                 "array 'w' has shape [40000, 40000]; its Param has shape [4, 3]"),
    "not an npz": ({"g.json": linear("w.npz"), "w.npz": b"PK\x03\x04 garbage"}, ["optimize", "{graph}"],
                   "not an .npz archive"),
    "node id past 2**63": ({"g.json": linear(node_id=2**64)}, ["optimize", "{graph}"],
                           "'id' 18446744073709551616 is out of range (node ids are ints in [-2**62, 2**62))"),
    "dim in 3000 parentheses": ({"g.json": linear(dim="(" * 3000 + "b" + ")" * 3000)}, ["optimize", "{graph}"],
                                "is 6001 characters long (at most 4096)"),
    "region chain 100k deep": ({"g.json": region_chain(100_000)}, ["optimize", "{graph}"],
                               "node 1 (ElementwiseRegion): chain is nested too deeply to read"),
    "a string as a shape": ({"g.json": linear(shape="batch")}, ["optimize", "{graph}"],
                            "attribute shape='batch' must be a list, not a str (a shape of one dim is ['batch'])"),
    "empty file": ({"g.json": ""}, ["optimize", "{graph}"], "graph file is not valid JSON"),
    "JSON nested 50k deep": ({"g.json": "{\"nodes\": [" * 50_000}, ["optimize", "{graph}"],
                             "graph file is nested too deeply to read"),
    "output over its store": ({"g.json": linear()}, ["optimize", "{graph}", "-o", "{work}/g.npz"],
                              "'.npz' is the suffix of its weight store"),
    "--input-shape on JSON": ({"g.json": linear()}, ["optimize", "{graph}", "--input-shape", "x=-1,4"],
                              "--input-shape applies to ONNX models only"),
    "rule syntax": ({"g.json": linear(), "r.egg": "(rewrite (Relu ?x"}, ["optimize", "{graph}", "--rules",
                                                                        "{folder}/r.egg"], "r.egg:1: parse error"),
    "rule nested 100k deep": ({"g.json": linear(), "r.egg": "(rewrite " + "(Relu " * 100_000 + "?x" + ")" * 100_000
                               + ' ?x :name "deep")'}, ["rules", "check", "{folder}/r.egg"],
                              "r.egg:1: parentheses nest 100001 deep; a rule file may nest at most 200"),
    "rule panics when it runs": ({"g.json": linear(), "r.egg": '(rule ((= ?m (MatMul ?x ?w))) ((panic "no")) '
                                                               ':ruleset fuse :name "boom")'},
                                 ["optimize", "{graph}", "--rules", "{folder}/r.egg"],
                                 "r.egg:1: rule 'boom' failed at run time (stage fuse): it panicked: no"),
    "verify inputs naming no input": ({"g.json": linear(), "f.npz": lambda: npz(y=np.ones((2, 4), np.float32))},
                                      ["optimize", "{graph}", "--verify-inputs", "{folder}/f.npz"],
                                      "reference input(s) 'y' name no input of the graph"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_input_is_one_clear_error_within_the_caps(case: str, runner: subprocess.Popen,
                                                            tmp_path: Path) -> None:
    files, args, message = CASES[case]
    folder, work, logs = tmp_path / "in", tmp_path / "work", tmp_path / "logs"
    home = tmp_path / "home"  # also its user cache, config and data folders and its temporary folder
    for d in (folder, work, logs, home):
        d.mkdir()
    os.mkfifo(tmp_path / "outside.fifo")  # read by nobody: a read of it would block until the wall-time cap
    (folder / "link.npz").symlink_to(tmp_path / "outside.fifo")
    for name, content in files.items():
        content = content() if callable(content) else content
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    graph = folder / "g.json"
    before = sorted(os.listdir(folder))
    argv = [a.format(graph=graph, folder=folder, work=work) for a in args]
    runner.stdin.write(json.dumps({"args": argv, "cwd": str(work), "logs": str(logs), "home": str(home),
                                   "memory_mb": MEMORY_MB, "seconds": SECONDS}) + "\n")
    runner.stdin.flush()
    result = json.loads(runner.stdout.readline())
    lines = result["stderr"].splitlines()
    assert result["code"] == 2, result
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert result["max_rss_mb"] < 1024 and result["wall_seconds"] < SECONDS
    assert os.listdir(work) == [] and os.listdir(home) == [] and sorted(os.listdir(folder)) == before
