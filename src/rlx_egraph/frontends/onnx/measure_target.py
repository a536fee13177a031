"""Measure the ``onnxruntime`` cost target's figures on the machine it runs on.

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
* attention over a packed QKV projection ([2, S, 64], 4 heads, an additive
  mask), one thread: com.microsoft Attention (what QkvAttention exports to)
  against the projection, Slice, Reshape and Transpose per head split, then
  opset-23 Attention or MatMul, Softmax, MatMul, then the head merge.

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


def attention_us(seq: int, heads: int = 4, head_dim: int = 16, repeats: int = 300) -> dict[str, float]:
    """us per attention block in its three exported forms (module docs), one onnxruntime thread."""
    batch, width = 2, heads * head_dim
    rng = np.random.default_rng(0)
    consts = {"w": rng.standard_normal((width, 3 * width)) * 0.1, "b": rng.standard_normal(3 * width) * 0.1,
              "mask": np.zeros((batch, 1, seq, seq)), "scale": np.array(head_dim**-0.5),
              "heads": np.array([batch, seq, heads, head_dim]), "merged": np.array([batch, seq, width]),
              "axis": np.array([-1]), **{f"at{j}": np.array([j * width]) for j in range(4)}}
    inits = [numpy_helper.from_array(v.astype(np.int64 if v.dtype.kind == "i" else np.float32), k)
             for k, v in consts.items()]
    split = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["qkv"])]
    for j, t in enumerate("qkv"):
        split += [helper.make_node("Slice", ["qkv", f"at{j}", f"at{j + 1}", "axis"], [f"{t}s"]),
                  helper.make_node("Reshape", [f"{t}s", "heads"], [f"{t}r"]),
                  helper.make_node("Transpose", [f"{t}r"], [t], perm=[0, 2, 1, 3])]
    merge = [helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ot", "merged"], ["y"])]
    unfused = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
               helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s1"]),
               helper.make_node("Add", ["s1", "mask"], ["s2"]), helper.make_node("Softmax", ["s2"], ["sm"], axis=-1),
               helper.make_node("MatMul", ["sm", "v"], ["o"])]
    forms = {
        "com.microsoft Attention": [helper.make_node("Attention", ["x", "w", "b", "", "", "mask"], ["y"], domain=MS,
                                                     num_heads=heads, scale=head_dim**-0.5)],
        "opset-23 Attention": [*split, helper.make_node("Attention", ["q", "k", "v", "mask"], ["o"],
                                                        scale=head_dim**-0.5), *merge],
        "MatMul, Softmax, MatMul": [*split, *unfused, *merge],
    }
    feeds = {"x": rng.standard_normal((batch, seq, width)).astype(np.float32)}
    out = {}
    for name, nodes in forms.items():
        graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                     (batch, seq, width))],
                                  [helper.make_value_info("y", onnx.TypeProto())], inits)
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 23),
                                                                       helper.make_opsetid(MS, 1)])
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        out[name] = _median_ns(session, feeds, repeats) / 1e3
    return out


def main() -> None:
    print(f"onnxruntime {ort.__version__}, CPUExecutionProvider")
    print(f"dispatch_ns   {dispatch_ns():10.0f}  ns per kernel")
    print(f"memory_bw     {memory_bw():10.2f}  B/ns")
    print(f"flops_per_ns  {flops_per_ns():10.1f}  FLOP/ns")
    for shape in ((2, 16, 64), (2, 128, 768)):
        for name, us in residual_norm_us(shape).items():
            print(f"{name:36s} {us:10.2f}  us per layer at {list(shape)}")
    for seq in (16, 65):
        for name, us in attention_us(seq).items():
            print(f"{name:36s} {us:10.2f}  us per attention at S = {seq}")


if __name__ == "__main__":
    main()
