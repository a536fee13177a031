"""Measure the ``onnxruntime`` cost target's figures on this machine.

    python -m rlx_egraph.frontends.onnx.measure_target

prints the per-launch cost, the memory bandwidth and the float32 matmul rate of
onnxruntime's CPU provider (default session options, so its own thread pool):

* dispatch: a chain of ``n`` Sigmoid nodes on a 1-element tensor, timed for two
  lengths; the slope is the cost of one more kernel (graph optimisations are off
  so that the chain stays as written).
* memory bandwidth: one Add of two 16 MiB float32 tensors: 48 MiB moved.
* FLOP rate: one 512 x 512 x 512 float32 MatMul.

Each figure is the median of ``repeats`` timed runs after a warm-up run.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def _session(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]], output: str,
             optimize: bool = True) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "measure",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
                              [helper.make_value_info(output, onnx.TypeProto())])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _median_ns(session: ort.InferenceSession, feeds: dict[str, np.ndarray], repeats: int) -> float:
    session.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        session.run(None, feeds)
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times)


def dispatch_ns(short: int = 10, long: int = 410, repeats: int = 200) -> float:
    """ns per extra kernel in a chain of tiny Sigmoid nodes."""

    def chain(n: int) -> float:
        nodes = [helper.make_node("Sigmoid", ["x" if k == 0 else f"t{k - 1}"], [f"t{k}"]) for k in range(n)]
        session = _session(nodes, {"x": (1,)}, f"t{n - 1}", optimize=False)
        return _median_ns(session, {"x": np.ones(1, np.float32)}, repeats)

    return (chain(long) - chain(short)) / (long - short)


def memory_bw(elements: int = 4 << 20, repeats: int = 30) -> float:
    """Bytes per ns of an Add of two float32 tensors (two reads and one write)."""
    session = _session([helper.make_node("Add", ["a", "b"], ["c"])], {"a": (elements,), "b": (elements,)}, "c")
    feeds = {n: np.ones(elements, np.float32) for n in ("a", "b")}
    return 3 * 4 * elements / _median_ns(session, feeds, repeats)


def flops_per_ns(n: int = 512, repeats: int = 30) -> float:
    """FLOP per ns of an n x n x n float32 MatMul."""
    session = _session([helper.make_node("MatMul", ["a", "b"], ["c"])], {"a": (n, n), "b": (n, n)}, "c")
    feeds = {k: np.random.default_rng(0).standard_normal((n, n)).astype(np.float32) for k in ("a", "b")}
    return 2 * n**3 / _median_ns(session, feeds, repeats)


def main() -> None:
    print(f"onnxruntime {ort.__version__}, CPUExecutionProvider")
    print(f"dispatch_ns   {dispatch_ns():10.0f}  ns per kernel")
    print(f"memory_bw     {memory_bw():10.2f}  B/ns")
    print(f"flops_per_ns  {flops_per_ns():10.1f}  FLOP/ns")


if __name__ == "__main__":
    main()
