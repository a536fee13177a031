"""Measure the ``onnxruntime`` cost target's figures on this machine.

    python -m rlx_egraph.frontends.onnx.measure_target

prints the per-launch cost, the memory bandwidth and the float32 matmul rate of
onnxruntime's CPU provider (default session options, so its own thread pool):

* dispatch: a chain of ``n`` Sigmoid nodes on a 1-element tensor, timed for two
  lengths; the slope is the cost of one more kernel (graph optimisations are off
  so that the chain stays as written).
* memory bandwidth: one Add of two 16 MiB float32 tensors: 48 MiB moved.
* FLOP rate: one 512 x 512 x 512 float32 MatMul.
* residual norms: a chain of 20 pre-norm layers (the norm of x + residual, the
  sum the next residual) as com.microsoft SkipLayerNormalization /
  SkipSimplifiedLayerNormalization against Add then LayerNormalization /
  SimplifiedLayerNormalization, per layer, at a tiny and a BERT-base size.
  Where the fused kernel is slower, the target leaves it unsupported
  (``cost/targets.ORT_SLOWER_THAN_UNFUSED``).

Each figure is the median of ``repeats`` timed runs after a warm-up run.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def _session(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]], output: str,
             optimize: bool = True) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "measure",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
                              [helper.make_value_info(output, onnx.TypeProto())])
    model = helper.make_model(graph, ir_version=10,
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])
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


def residual_norm_us(shape: tuple[int, ...], layers: int = 20, repeats: int = 100) -> dict[str, float]:
    """us per layer of a pre-norm chain, fused (Skip*Normalization with its sum output) and unfused."""
    width = shape[-1]
    forms = {
        "SkipLayerNormalization": lambda k, x: [helper.make_node(
            "SkipLayerNormalization", [x, f"r{k - 1}", "g", "b"], [f"y{k}", "", "", f"r{k}"], domain=MS)],
        "Add + LayerNormalization": lambda k, x: [
            helper.make_node("Add", [x, f"r{k - 1}"], [f"r{k}"]),
            helper.make_node("LayerNormalization", [f"r{k}", "g", "b"], [f"y{k}"], axis=-1)],
        "SkipSimplifiedLayerNormalization": lambda k, x: [helper.make_node(
            "SkipSimplifiedLayerNormalization", [x, f"r{k - 1}", "g"], [f"y{k}", "", "", f"r{k}"], domain=MS)],
        "Add + SimplifiedLayerNormalization": lambda k, x: [
            helper.make_node("Add", [x, f"r{k - 1}"], [f"r{k}"]),
            helper.make_node("SimplifiedLayerNormalization", [f"r{k}", "g"], [f"y{k}"], axis=-1)],
    }
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("x", "r0")}
    out = {}
    for name, layer in forms.items():
        nodes = [n for k in range(1, layers + 1) for n in layer(k, "x" if k == 1 else f"y{k - 1}")]
        nodes += [helper.make_node("Constant", [], [p], value=numpy_helper.from_array(np.full(width, v, np.float32)))
                  for p, v in (("g", 1.0), ("b", 0.0))]
        session = _session(nodes, {"x": shape, "r0": shape}, f"y{layers}", optimize=False)
        out[name] = _median_ns(session, feeds, repeats) / layers / 1e3
    return out


def main() -> None:
    print(f"onnxruntime {ort.__version__}, CPUExecutionProvider")
    print(f"dispatch_ns   {dispatch_ns():10.0f}  ns per kernel")
    print(f"memory_bw     {memory_bw():10.2f}  B/ns")
    print(f"flops_per_ns  {flops_per_ns():10.1f}  FLOP/ns")
    for shape in ((2, 16, 64), (2, 128, 768)):
        for name, us in residual_norm_us(shape).items():
            print(f"{name:36s} {us:10.2f}  us per layer at {list(shape)}")


if __name__ == "__main__":
    main()
