"""Hostile command-line options (outputs, shapes, reference inputs), each in a capped process (tests/hostile.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from hostile import Cases, check_one_clear_error, linear, npz

CASES: Cases = {
    "output over its store": ({"g.json": linear()}, ["optimize", "{graph}", "-o", "{work}/g.npz"],
                              "'.npz' is the suffix of its weight store"),
    "--input-shape on JSON": ({"g.json": linear()}, ["optimize", "{graph}", "--input-shape", "x=-1,4"],
                              "--input-shape applies to ONNX models only"),
    "verify inputs naming no input": ({"g.json": linear(), "f.npz": lambda: npz(y=np.ones((2, 4), np.float32))},
                                      ["optimize", "{graph}", "--verify-inputs", "{folder}/f.npz"],
                                      "reference input(s) 'y' name no input of the graph"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_input_is_one_clear_error_within_the_caps(case: str, runner: subprocess.Popen,
                                                            tmp_path: Path) -> None:
    check_one_clear_error(*CASES[case], runner, tmp_path)
