"""Hostile ONNX models at the command line's front door: each is optimized by ``rlx-egraph optimize`` in its own
process, capped at 1.5 GB of address space and 30 s of CPU (tests/capped_runner.py).  Each must end in one
``error:`` line with exit code 2 well inside the caps, write nothing (the output is not made, the working folder
and the model's folder hold what they held), and read nothing outside the model's folder (an external-data
location outside it is a FIFO: reading it would never return)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hostile import check_one_clear_error
from onnx_models import MODELS, OnnxBuilder

F = TensorProto.FLOAT
HERE = Path(__file__).resolve().parent


def constant_model(node: onnx.NodeProto, extra: list[onnx.TensorProto] = ()) -> bytes:
    """A model adding the (all-constant) output of ``node`` to its input x."""
    graph = helper.make_graph([node, helper.make_node("Add", ["x", node.output[0]], ["y"], name="add")], "hostile",
                              [helper.make_tensor_value_info("x", F, [1])],
                              [helper.make_tensor_value_info("y", F, None)], list(extra))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def external(location: str) -> bytes:
    m = OnnxBuilder(17)
    x = m.input("x", F, [2, 4])
    w = onnx.TensorProto(name="w", data_type=F, dims=[4, 4])
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", location
    m.initializers.append(w)
    return m.model({"y": m.op("MatMul", [x, "w"])}).SerializeToString()


def loop(trips: int) -> bytes:
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_in", F, [1])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_out", F, [1])],
                             [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    node = helper.make_node("Loop", ["trips", "cond", "v0"], ["v"], body=body, name="spin")
    return constant_model(node, [ints("trips", trips), numpy_helper.from_array(np.array(True), "cond"),
                                 numpy_helper.from_array(np.zeros(1, np.float32), "v0")])


def no_opset() -> bytes:
    model = MODELS["gpt2"]()
    del model.opset_import[:]
    return model.SerializeToString()


def bad_initializer() -> bytes:
    model = MODELS["gpt2"]()
    model.graph.initializer[0].dims[0] += 1
    return model.SerializeToString()


def two_writers() -> bytes:
    model = MODELS["gpt2"]()
    model.graph.node[3].output[0] = model.graph.node[2].output[0]
    return model.SerializeToString()


def one_output_twice() -> bytes:
    """Relu and Neg of x both writing y, the model's output (without the check, the last writer won)."""
    x, y = helper.make_tensor_value_info("x", F, [4]), helper.make_tensor_value_info("y", F, [4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="first"),
                               helper.make_node("Neg", ["x"], ["y"], name="second")], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def relu(dims: list[int | str]) -> bytes:
    """Relu of one input of ``dims``."""
    x, y = helper.make_tensor_value_info("x", F, dims), helper.make_tensor_value_info("y", F, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def nested_graphs(depth: int) -> bytes:
    """A model whose graph holds a node whose attribute holds a graph ... ``depth`` deep, written as protobuf bytes
    (onnx's own builders stop at protobuf's nesting limit)."""
    def field(number: int, payload: bytes) -> bytes:  # a length-delimited field
        size, length = len(payload), b""
        while True:
            byte, size = size & 0x7F, size >> 7
            length += bytes([byte | (0x80 if size else 0)])
            if not size:
                break
        return bytes([number << 3 | 2]) + length + payload

    graph = field(2, b"leaf")  # GraphProto.name
    for _ in range(depth):
        # AttributeProto: name, type (field 20, a two-byte tag) GRAPH, g
        attribute = field(1, b"then_branch") + bytes([0xA0, 0x01, 5]) + field(6, graph)
        graph = field(1, field(4, b"If") + field(5, attribute)) + field(2, b"level")  # node(op_type, attribute), name
    opset = bytes([2 << 3, 17])  # OperatorSetIdProto.version 17
    return bytes([1 << 3, 9]) + field(8, opset) + field(7, graph)  # ir_version 9, opset_import, graph


# case -> (the model's bytes, what its error line says after "error: <path>: ")
CASES: dict[str, tuple[Callable[[], bytes], str]] = {
    "empty file": (lambda: b"", "not an ONNX model: the file is empty"),
    "not protobuf": (lambda: b"\xff" * 64, "not a readable ONNX model"),
    "truncated": (lambda: MODELS["gpt2"]().SerializeToString()[:300], "not a readable ONNX model"),
    "no opset_import": (no_opset, "not an ONNX model: it imports no opset of the default domain"),
    "no graph": (lambda: onnx.ModelProto(opset_import=[helper.make_opsetid("", 17)]).SerializeToString(),
                 "not an ONNX model: it has no graph"),
    "initializer dims": (bad_initializer, "its data does not match its dims and type"),
    "two writers": (two_writers, "already defines (a value has one producer)"),
    "two writers of the output": (one_output_twice, "Neg node 'second' writes 'y', which Relu node 'first' already "
                                                    "defines (a value has one producer)"),
    "ConstantOfShape 30000x30000": (
        lambda: constant_model(helper.make_node("ConstantOfShape", ["shape"], ["c"], name="big"),
                               [ints("shape", [30000, 30000])]),
        "ConstantOfShape node 'big': folding it would make 900,000,000 elements, more than the import's limit"),
    "Expand of a constant": (
        lambda: constant_model(helper.make_node("Expand", ["one", "shape"], ["c"], name="wide"),
                               [numpy_helper.from_array(np.ones(1, np.float32), "one"), ints("shape", [50000, 50000])]),
        "Expand node 'wide': folding it would make 2,500,000,000 elements"),
    "Range to 1e12": (
        lambda: constant_model(helper.make_node("Range", ["a", "b", "d"], ["c"], name="long"),
                               [numpy_helper.from_array(np.array(v, np.float32), n)
                                for n, v in (("a", 0.0), ("b", 2.0**40), ("d", 1.0))]),
        "Range node 'long': folding it would make 1,099,511,627,776 elements"),
    "Tile 1e6 x 1e6": (
        lambda: constant_model(helper.make_node("Tile", ["one", "reps"], ["c"], name="tiles"),
                               [numpy_helper.from_array(np.ones((1, 1), np.float32), "one"),
                                ints("reps", [10**6, 10**6])]),
        "Tile node 'tiles': folding it would make 1,000,000,000,000 elements"),
    "Loop 1e12 trips": (lambda: loop(10**12), "Loop node 'spin': every input is a constant, but it is not folded"),
    "complex weights cast to real": (
        lambda: constant_model(helper.make_node("Cast", ["z"], ["c"], name="real", to=F),
                               [numpy_helper.from_array(np.full(1, 1 + 2j, np.complex64), "z")]),
        "Cast node 'real': value 'z' holds complex values (complex64), which MIR has no dtype for"),
    "external data outside": (lambda: external("../outside.fifo"),
                              "initializer 'w': external data location '../outside.fifo' is not a file in the "
                              "model's folder"),
    "external data absolute": (lambda: external("/dev/zero"),
                               "initializer 'w': external data location '/dev/zero' is not a file in the model's "
                               "folder"),
    "external data symlink out": (lambda: external("inside.fifo"),
                                  "initializer 'w': external data location 'inside.fifo' is not a file in the model's "
                                  "folder"),
    "external data missing": (lambda: external("absent.bin"), "external data file 'absent.bin' is missing"),
    "nested parentheses": (lambda: relu(["(" * 3000 + "b" + ")" * 3000, 4]),
                           "dimension 0 has a dim_param of 6,001 characters, more than the 200"),
    "rank 100000": (lambda: relu([1] * 100000), "input 'x' has rank 100,000, more than the 64 dims"),
    "graphs nested 1000 deep": (lambda: nested_graphs(1000), "not a readable ONNX model"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_model_is_one_clear_error_within_the_caps(case: str, runner: subprocess.Popen,
                                                            tmp_path: Path) -> None:
    build, message = CASES[case]
    check_one_clear_error({"model.onnx": build}, ["optimize", "{folder}/model.onnx", "-o", "{work}/out.onnx"], message,
                          runner, tmp_path, link="inside.fifo", prefix="error: {folder}/model.onnx: ", silent=True)
