"""Hostile graph JSON and weight stores at the command line's front door, each in a capped process
(tests/hostile.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hostile import Cases, check_one_clear_error, linear, npz, zip_bomb


def region_chain(depth: int) -> str:
    chain = "[" * depth + "]" * depth
    return json.dumps({"format": "rlx-egraph-mir", "version": 1, "nodes": [
                           {"id": 0, "op": "Input", "attrs": {"name": "x", "shape": [4]}},
                                 {"id": 1, "op": "ElementwiseRegion", "inputs": [0], "attrs": {"chain": chain}}],
                       "outputs": [1]})


CASES: Cases = {
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
    "zip bomb": ({"g.json": linear("w.npz"), "w.npz": lambda: zip_bomb((40000, 40000))}, ["optimize", "{graph}"],
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
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_input_is_one_clear_error_within_the_caps(case: str, runner: subprocess.Popen,
                                                            tmp_path: Path) -> None:
    check_one_clear_error(*CASES[case], runner, tmp_path)
