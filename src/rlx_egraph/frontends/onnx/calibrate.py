"""Calibrate the ``onnxruntime`` cost target on this machine: ``rlx-egraph calibrate --target onnxruntime``.

Every figure is a MIR graph exported by :func:`~.exporter.export_model` and timed in onnxruntime's CPU
provider (at :data:`LEVEL`, ``ORT_ENABLE_ALL``: onnxruntime's default, what a user's session runs a model at;
``threads`` intra-op threads), so a sample prices what the exporter writes for a node as onnxruntime runs it (a
FusedMatMulBiasAct as MatMul + BiasGelu, a FusedResidualLN as com.microsoft SkipLayerNormalization, a layout op
as its Slice, Transpose or Reshape, a convolution in onnxruntime's blocked layout).  Every sample's graph is
checked to hold every copy of its node, as onnxruntime runs it (:func:`check_sample`), and the sample records the
onnxruntime ops one copy ran as.

* run and dispatch: chains of 10 and 410 Sigmoid nodes on one float; the slope is the target-wide
  ``dispatch_ns``, the rest of the short chain's time the fixed cost of one run (``run_ns``).
* graph inputs and outputs: what one more value fed to and returned from a run costs, per value and per byte
  (:func:`value_costs`); ``run_ns`` is then the run less its chain's one input and one output.
* masked rows of scores: what a row of attention scores whose keys a mask masks costs beyond an open one
  (:func:`masked_rows`; every sample's mask is open).
* one node of an op at several sizes (:data:`SIZES`), from a toy layer's (2 x 8 tokens, width 16) and a tiny
  model's (2 x 16 tokens, width 64) to BERT-base's (128 tokens, width 768): a node that takes at least
  :data:`ALONE` times a run's fixed cost is timed alone, less that cost; a smaller one as the time of ``n``
  copies of the node less the time of one copy, over ``n - 1``.  A copy reads the previous copy's result
  where the types allow (a chain, as in a model), else its own inputs, and its result is then a graph output
  (else it would be dead code); every copy has its own weights.  Inputs and outputs are bound once
  (onnxruntime's IO binding), so an output costs what an intermediate does.  Each op's samples give it a cost
  line (launch, per byte, per FLOP, per row, per matrix: :func:`rlx_egraph.cost.calibration.fit_rate`); a
  FusedConv's samples are fitted into Conv's line, which prices both.

The fused ops measured are the ones the ``onnxruntime`` target runs (:data:`~rlx_egraph.cost.targets.
ONNXRUNTIME_FUSED`), each at every size; the primitives are the common ones of each kind, layouts included
(Reshape, Transpose, Narrow, Expand and Concat are dispatched by onnxruntime; an Identity of an intermediate is
removed when the session loads, and its samples measure that).  Each timing is the
median of its runs, by :func:`run_clock` (one thread: the calling thread's CPU time, so the machine's load
does not count); the two models of a difference run in turn; every sample is measured in ``passes`` passes
and the lowest kept.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from ...cost import calibration as cal
from ...cost.model import line_key, node_cost
from ...errors import RlxError
from ...ir.graph import Graph
from ...ir.registry import Kind
from .exporter import export_model

TARGET = "onnxruntime"
# (batch, sequence, heads, head width) per size: a toy layer's, a tiny model's, two between, BERT-base's, and two
# whose rows outnumber their width: a speech encoder's long sequence (2 x 80 tokens of width 64) and a windowed
# vision model's many short windows (32 windows of 16 tokens of width 32), where a kernel's cost per row and per
# head shows beside its bytes and FLOPs
SIZES = ((2, 8, 2, 8), (2, 16, 4, 16), (2, 32, 4, 32), (1, 128, 8, 48), (1, 128, 12, 64), (2, 80, 4, 16),
         (32, 16, 2, 16))
# The graph optimization level samples run at: onnxruntime's default, what a user's session runs a model at
LEVEL = "ORT_ENABLE_ALL"
ALONE = 40  # a node this many times a run's fixed cost is timed alone (the run's cost subtracted)
Build = Callable[[Graph, int | None, int], tuple[int, int]]  # (graph, previous copy's result, copy) -> (node, result)


@dataclass(frozen=True)
class Case:
    """One op at one size: ``build`` adds a copy of the node to a graph and returns (the node, the value the
    next copy may read)."""

    key: str
    label: str
    build: Build


class _Maker:
    """Names and values for a copy's inputs and weights."""

    def __init__(self, g: Graph, copy: int, seed: int) -> None:
        self.g, self.copy, self.rng = g, copy, np.random.default_rng(seed + copy)

    def input(self, shape: Sequence[int], name: str = "x", dtype: str = "f32") -> int:
        return self.g.input(f"{name}{self.copy}", shape, dtype)

    def param(self, shape: Sequence[int], name: str = "w", value: np.ndarray | None = None) -> int:
        pid = self.g.param(f"{name}{self.copy}", shape)
        data = value if value is not None else self.rng.standard_normal(shape) * 0.1
        self.g.weights[f"{name}{self.copy}"] = np.asarray(data, np.float32)
        return pid


def _cases(size: tuple[int, int, int, int]) -> list[Case]:
    """Every measured op at one size."""
    b, s, h, d = size
    e = h * d
    tag = f"[{b}x{s}, {e}]"

    def case(key: str, build: Callable[[_Maker, int | None], int | tuple[int, int]], label: str = "") -> Case:
        def run(g: Graph, prev: int | None, copy: int) -> tuple[int, int]:
            out = build(_Maker(g, copy, 0), prev)
            return out if isinstance(out, tuple) else (out, out)

        return Case(key, f"{key}{label} {tag}", run)

    def chain(m: _Maker, prev: int | None, shape: Sequence[int]) -> int:
        return prev if prev is not None else m.input(shape)

    def multi(node: int, g: Graph) -> tuple[int, int]:
        return node, g.get(node, index=0)

    def heads_merged(m: _Maker, node: int) -> tuple[int, int]:
        """``node`` [B, S, heads, D] and its heads merged, [B, S, heads * D] (a view), for the next copy to read."""
        return node, m.g.reshape(node, shape=(b, s, e))

    x3, w3 = (b, s, e), (e,)
    mask = (b, 1, 1, s)
    c, side = e // 4, max(s // 4, 4)  # a 3x3 convolution's channels and image side at this size

    def conv(m: _Maker, prev: int | None, form: str = "dense", kernel: int = 3, **fused: object) -> int:
        """A ``kernel`` x ``kernel`` convolution (``dense``), one per channel of a 6 times wider image
        (``depthwise``: 3x3 as in MobileNet, 7x7 as in ConvNeXt), or a 1x1 one of 6 times the channels
        (``pointwise``).  Chained, so that onnxruntime's blocked layout (ORT_ENABLE_ALL) is entered and left once,
        as in a model."""
        out = c if form == "dense" else 6 * c
        groups = out if form == "depthwise" else 1
        size = 1 if form == "pointwise" else kernel
        x, w = chain(m, prev, (1, out, side, side)), m.param((out, out // groups, size, size))
        pads = [size // 2] * 4
        bias = m.param((out,), "bias")
        if not fused:
            return m.g.conv(x, w, bias, pads=pads, groups=groups)
        return m.g.fused_conv(x, w, bias, pads=pads, groups=groups, **fused)

    def conv1d(m: _Maker, prev: int | None) -> int:
        """A convolution over one axis (kernel 3) of ``e // 2`` channels and ``4 s`` steps, as a speech model's
        feature extractor runs them; chained."""
        x = chain(m, prev, (b, e // 2, 4 * s))
        return m.g.conv(x, m.param((e // 2, e // 2, 3)), m.param((e // 2,), "bias"), pads=[1, 1])

    def pointwise_image(m: _Maker, prev: int | None) -> int:
        """A 1x1 convolution of ``e`` channels over ``b`` images of one pixel, chained: its weights outweigh its
        image, as in a small image network's last blocks (MobileNetV2's at 32 x 32 pixels)."""
        x = chain(m, prev, (b, e, 1, 1))
        return m.g.conv(x, m.param((e, e, 1, 1)), m.param((e,), "bias"))

    def stem(m: _Maker, prev: int | None, kernel: int) -> int:
        """A ``kernel`` x ``kernel`` convolution of stride 2 over ``b`` images of 3 colour channels, ``2 side`` pixels
        a side, into 16 or more channels: an image network's stem (3x3 as MobileNet's, 7x7 as ResNet's), which reads
        its NCHW input as it is (fewer channels than a block); each copy its own image."""
        out = 16 * max(e // 64, 1)
        return m.g.conv(m.input((b, 3, 2 * side, 2 * side)), m.param((out, 3, kernel, kernel)),
                        m.param((out,), "bias"), pads=[kernel // 2] * 4, strides=[2, 2])

    def expansion(m: _Maker, prev: int | None) -> int:
        """A 1x1 convolution of 8 channels into 48 over ``b`` images ``side`` pixels a side: MobileNetV2's first
        expansion, which reads NCHW (fewer channels than a block); each copy its own image."""
        return m.g.conv(m.input((b, 8, side, side)), m.param((48, 8, 1, 1)), m.param((48,), "bias"))

    def rotary(m: _Maker, prev: int | None) -> int:
        angles = np.arange(s)[:, None] * (1e4 ** (-np.arange(d // 2) * 2 / d))[None, :]
        tables = [np.concatenate([f(angles)] * 2, axis=-1) for f in (np.cos, np.sin)]
        return m.g.rotary_embedding(chain(m, prev, (b, h, s, d)), m.param((s, d), "cos", tables[0]),
                                    m.param((s, d), "sin", tables[1]))

    def gqa(m: _Maker, prev: int | None) -> tuple[int, int]:
        """A decoding step after ``s`` cached tokens; RoPE inside where the kernel rotates the head width."""
        angles = s * (1e4 ** (-np.arange(d // 2) * 2 / d))
        tables = [m.param((1, 1, 1, d), name, np.concatenate([f(angles)] * 2).reshape(1, 1, 1, d))
                  for name, f in (("cos", np.cos), ("sin", np.sin))] if d % 16 == 0 else []
        return multi(m.g.group_query_attention(
            chain(m, prev, (b, 1, e)), m.input((b, 1, e), "k"), m.input((b, 1, e), "v"),
            m.input((b, h, s, d), "past_k"), m.input((b, h, s, d), "past_v"), m.input((b, 1, 1, s + 1), "mask"),
            *tables, heads=h, kv_heads=h, scale=d**-0.5), m.g)

    def embed(m: _Maker, prev: int | None) -> int:
        ids = m.g.input(f"ids{m.copy}", (b, s), "i64")
        return m.g.embed_layer_norm(m.param((512, e), "table"), ids, m.param((s, e), "pos"), m.param(w3, "g"),
                                    m.param(w3, "b"),
                                    m.param((1, e), "seg", np.tile(m.rng.standard_normal(e) * 0.1, (1, 1))))

    return [
        case("Add", lambda m, p: m.g.add(chain(m, p, x3), m.input(x3, "y"))),
        case("Mul", lambda m, p: m.g.mul(chain(m, p, x3), m.g.scalar(0.5))),
        case("Sigmoid", lambda m, p: m.g.sigmoid(chain(m, p, x3))),
        case("Erf", lambda m, p: m.g.erf(chain(m, p, x3))),
        case("Sub", lambda m, p: m.g.sub(chain(m, p, x3), m.input((b, s, 1), "y"))),
        case("Div", lambda m, p: m.g.div(chain(m, p, x3), m.g.scalar(1.5))),
        case("Pow", lambda m, p: m.g.pow(chain(m, p, x3), m.g.scalar(2.0))),
        case("Sqrt", lambda m, p: m.g.sqrt(m.g.abs(chain(m, p, x3)) if p is None else p)),
        case("Tanh", lambda m, p: m.g.tanh(chain(m, p, x3))),
        case("Where", lambda m, p: m.g.where(m.input(x3, "c", "bool"), chain(m, p, x3), m.g.scalar(-1e4))),
        case("Silu", lambda m, p: m.g.silu(chain(m, p, x3))),
        case("Gelu", lambda m, p: m.g.gelu(chain(m, p, x3))),
        case("Identity", lambda m, p: m.g.identity(chain(m, p, x3))),
        case("Softmax", lambda m, p: m.g.softmax(chain(m, p, (b, h, s, s)))),
        case("ReduceMean", lambda m, p: m.g.reduce_mean(m.input(x3), axes=(-1,), keepdims=True)),
        case("LayerNorm", lambda m, p: m.g.layer_norm(chain(m, p, x3), m.param(w3, "g"), m.param(w3, "b"))),
        case("RmsNorm", lambda m, p: m.g.rms_norm(chain(m, p, x3), m.param(w3, "g"))),
        case("MatMul", lambda m, p: m.g.matmul(chain(m, p, x3), m.param((e, e))), " square"),
        case("MatMul", lambda m, p: m.g.matmul(m.input(x3), m.param((e, 4 * e))), " wide"),
        case("MatMul", lambda m, p: m.g.matmul(m.input((b, h, s, d), "q"), m.input((b, h, d, s), "k")), " heads"),
        case("MatMulBT", lambda m, p: m.g.matmul_bt(chain(m, p, x3), m.param((e, e)))),
        case("Reshape", lambda m, p: m.g.reshape(m.input(x3), shape=(b * s, e))),
        case("Transpose", lambda m, p: m.g.transpose(m.input((b, s, h, d)), perm=(0, 2, 1, 3))),
        case("Narrow", lambda m, p: m.g.narrow(m.input((b, s, 3 * e)), axis=-1, start=e, length=e)),
        case("Expand", lambda m, p: m.g.expand(m.input(mask), shape=(b, h, s, s))),
        case("Concat", lambda m, p: m.g.concat([m.input(x3, n) for n in "qkv"], axis=-1)),
        case("FusedMatMulAdd", lambda m, p: m.g.fused_matmul_add(chain(m, p, x3), m.param((e, e)), m.input(x3, "d"))),
        case("FusedMatMulATAdd", lambda m, p: m.g.fused_matmul_at_add(m.input((e, b * s)), m.param((e, e)),
                                                                      m.param((e,), "bias"))),
        case("FusedMatMulBTAdd", lambda m, p: m.g.fused_matmul_bt_add(chain(m, p, x3), m.param((e, e)),
                                                                      m.param((e,), "bias"))),
        case("FusedMatMulBiasAct", lambda m, p: m.g.fused_matmul_bias_act(chain(m, p, x3), m.param((e, e)),
                                                                          m.param((e,), "bias")), " none"),
        case("FusedMatMulBiasAct", lambda m, p: m.g.fused_matmul_bias_act(m.input(x3), m.param((e, 4 * e)),
                                                                          m.param((4 * e,), "bias"), act="gelu"),
             " gelu"),
        case("FusedResidualLN", lambda m, p: m.g.fused_residual_ln(chain(m, p, x3), m.input(x3, "r"),
                                                                   m.param(w3, "g"), m.param(w3, "b"))),
        case("FusedAddLayerNorm", lambda m, p: multi(m.g.fused_add_layer_norm(
            chain(m, p, x3), m.input(x3, "r"), m.param(w3, "g"), m.param(w3, "b")), m.g)),
        case("FusedResidualRmsNorm", lambda m, p: m.g.fused_residual_rms_norm(chain(m, p, x3), m.input(x3, "r"),
                                                                              m.param(w3, "g"))),
        case("FusedAddRmsNorm", lambda m, p: multi(m.g.fused_add_rms_norm(
            chain(m, p, x3), m.input(x3, "r"), m.param(w3, "g")), m.g)),
        case("QkvAttention", lambda m, p: m.g.qkv_attention(
            m.input(x3), m.param((e, 3 * e)), m.param((3 * e,), "bias"), m.input(mask, "mask"), heads=h,
            scale=d**-0.5), " masked"),
        case("QkvAttention", lambda m, p: m.g.qkv_attention(
            m.input(x3), m.param((e, 3 * e)), m.param((3 * e,), "bias"), heads=h, scale=d**-0.5, causal=True),
             " causal"),
        case("FusedAttentionBlock", lambda m, p: m.g.fused_attention_block(
            chain(m, p, x3), m.param((e, 3 * e)), m.param((e, e), "o"), m.input((b, s), "mask"),
            m.param((3 * e,), "bias"), m.param((e,), "ob"), heads=h, scale=d**-0.5)),
        case("CausalAttention", lambda m, p: m.g.causal_attention(
            chain(m, p, (b, h, s, d)), m.input((b, h, s, d), "k"), m.input((b, h, s, d), "v"), scale=d**-0.5)),
        case("BiasedAttention", lambda m, p: m.g.biased_attention(
            chain(m, p, (b, h, s, d)), m.input((b, h, s, d), "k"), m.input((b, h, s, d), "v"), m.input(mask, "mask"),
            scale=d**-0.5)),
        case("BiasedAttention", lambda m, p: m.g.biased_attention(
            chain(m, p, (b, h, 1, d)), m.input((b, h, s + 1, d), "k"), m.input((b, h, s + 1, d), "v"),
            m.input((b, 1, 1, s + 1), "mask"), scale=d**-0.5), " one query"),
        case("BiasedAttention", lambda m, p: m.g.biased_attention(
            chain(m, p, (b, h // 2, 2, d)), m.input((b, h // 2, s + 1, d), "k"), m.input((b, h // 2, s + 1, d), "v"),
            m.input((b, 1, 1, s + 1), "mask"), scale=d**-0.5), " grouped query"),
        case("MultiHeadAttention", lambda m, p: heads_merged(m, m.g.multi_head_attention(
            chain(m, p, x3), m.input(x3, "k"), m.input(x3, "v"), m.input(mask, "mask"), heads=h, scale=d**-0.5)),
             " masked"),
        case("Relu", lambda m, p: m.g.relu(chain(m, p, x3))),
        case("Conv", conv),
        case("Conv", lambda m, p: conv(m, p, "depthwise"), " depthwise"),
        case("Conv", lambda m, p: conv(m, p, "depthwise", 7), " depthwise 7x7"),
        case("Conv", lambda m, p: conv(m, p, "pointwise"), " pointwise"),
        case("Conv", conv1d, " 1d"),
        case("Conv", pointwise_image, " pointwise 1x1 image"),
        case("Conv", lambda m, p: stem(m, p, 3), " nchw stem"),
        case("Conv", lambda m, p: stem(m, p, 7), " nchw stem 7x7"),
        case("Conv", expansion, " nchw 1x1"),
        case("FusedConv", lambda m, p: conv(m, p, act="relu"), " relu"),
        case("FusedConv", lambda m, p: conv(m, p, "depthwise", act="clip", clip_min=0.0, clip_max=6.0),
             " depthwise clip"),
        case("FusedConv", lambda m, p: conv(m, p, "pointwise", act="clip", clip_min=0.0, clip_max=6.0),
             " pointwise clip"),
        case("KvCacheAttention", lambda m, p: multi(m.g.kv_cache_attention(
            chain(m, p, (b, h, 1, d)), m.input((b, h, 1, d), "k"), m.input((b, h, 1, d), "v"),
            m.input((b, h, s, d), "past_k"), m.input((b, h, s, d), "past_v"), m.input((b, 1, 1, s + 1), "mask"),
            scale=d**-0.5), m.g), " decoding step"),
        case("GroupQueryAttention", gqa, " decoding step"),
        case("RotaryEmbedding", rotary),
        case("EmbedLayerNorm", embed),
    ]


def _model_graph(case: Case, copies: int) -> tuple[Graph, int]:
    """A graph of ``copies`` copies of ``case``'s node; returns it and the last copy's node.  Every copy's result
    that no later copy reads is an output, so that no copy is dead code the export or onnxruntime would drop."""
    g = Graph(case.key)
    prev, node, results = None, -1, []
    for copy in range(copies):
        node, prev = case.build(g, prev, copy)
        results.append(prev)
    g.set_outputs([r for r in results if r == prev or not g.users(r)])
    return g, node


class CalibrationGraphError(RlxError, RuntimeError):
    """A sample whose graph, as onnxruntime runs it, is not the copies of the ops its export writes."""


@dataclass(frozen=True)
class Runnable:
    """A session of an exported sample graph, its inputs and outputs bound once (onnxruntime's IO binding: a run
    copies nothing in or out, so an output costs what an intermediate costs), and the ops of the graph exported
    (``written``) and as onnxruntime runs it after its own graph optimizations (``ran``)."""

    session: ort.InferenceSession
    binding: ort.IOBinding
    written: Counter[str]
    ran: Counter[str]
    feeds: dict[str, np.ndarray]

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)


def _ops(model: onnx.ModelProto) -> Counter[str]:
    """The op types of ``model``'s nodes, less Constant nodes (initializers to onnxruntime) and the Identity nodes
    that only name a graph output."""
    outputs = {o.name for o in model.graph.output}
    return Counter(n.op_type for n in model.graph.node
                   if n.op_type != "Constant" and not (n.op_type == "Identity" and set(n.output) <= outputs))


def _options(threads: int) -> ort.SessionOptions:
    """A session's options: :data:`LEVEL`, ``threads`` intra-op threads, warnings left out."""
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVEL)
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return options


def _session(graph: Graph, threads: int) -> Runnable:
    """``graph`` exported, in an onnxruntime session at :data:`LEVEL` with ``threads`` threads, inputs bound to
    seeded values and every output bound."""
    model = export_model(graph)
    options = _options(threads)
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = str(Path(tmp) / "ran.onnx")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        ran = _ops(onnx.load(options.optimized_model_filepath))
    rng = np.random.default_rng(0)
    binding, feeds = session.io_binding(), {}
    for node in graph.inputs:
        if node.dtype.startswith("i"):
            value = rng.integers(0, 8, node.shape).astype(np.int64)
        elif node.dtype == "bool":
            value = rng.random(node.shape) < 0.5
        elif "mask" in node.name:
            value = np.ones(node.shape, np.float32)
        else:
            value = rng.standard_normal(node.shape).astype(np.float32)
        feeds[node.name] = value
        binding.bind_ortvalue_input(node.name, ort.OrtValue.ortvalue_from_numpy(value))
    for output in session.get_outputs():
        binding.bind_output(output.name)
    return Runnable(session, binding, _ops(model), ran, feeds)


def check_sample(label: str, one: Runnable, many: Runnable | None = None, copies: int = 1) -> Counter[str]:
    """The onnxruntime ops one copy of sample ``label``'s node runs as: what ``many`` (``copies`` copies) runs beyond
    ``one`` (one copy), over ``copies - 1``; without ``many``, what ``one`` runs.  CalibrationGraphError unless the
    export writes every copy's ops (no copy is dead code), onnxruntime runs each copy as the same ops, and those are
    at least one node (none only where the export writes nothing but Identity nodes, which onnxruntime removes).
    The ops run may differ from the ops written where onnxruntime rewrites them when it loads the graph (MatMul +
    Add into Gemm), as it does in a model."""
    written, ran = (one.written, one.ran) if many is None else (
        _per_copy(label, many.written, one.written, copies, "the export writes"),
        _per_copy(label, many.ran, one.ran, copies, "onnxruntime runs"))
    if not written:
        raise CalibrationGraphError(f"sample {label}: the export writes no node for it")
    if not ran and set(written) != {"Identity"}:
        raise CalibrationGraphError(f"sample {label}: onnxruntime runs none of the {_histogram(written)} the export "
                                    "writes; the sample would not measure what it claims")
    return ran


def _per_copy(label: str, many: Counter[str], one: Counter[str], copies: int, what: str) -> Counter[str]:
    """The ops ``copies`` copies (``many``) add to one copy (``one``), over ``copies - 1``; CalibrationGraphError
    unless they are ``copies - 1`` times the same ops."""
    added = many - one
    if one - many or any(n % (copies - 1) for n in added.values()):
        raise CalibrationGraphError(f"sample {label}: for {copies} copies {what} {_histogram(many)} against one "
                                    f"copy's {_histogram(one)}, not {copies - 1} more copies of the same ops")
    return Counter({op: n // (copies - 1) for op, n in added.items()})


def _histogram(ops: Counter[str]) -> str:
    return "[" + ", ".join(f"{op} {n}" for op, n in sorted(ops.items())) + "]" if ops else "no node"


def timed(runnable: Runnable, budget_s: float, threads: int, min_runs: int = 25) -> float:
    """The typical ns of a run of ``runnable`` (:func:`run_times`)."""
    return typical(run_times([runnable.run], budget_s, min_runs, threads)[0])


def timed_pair(first: Runnable, second: Runnable, budget_s: float, threads: int,
               min_runs: int = 25) -> tuple[float, float]:
    """The typical ns of a run of each of two runnables, runs in turn (so a change of load hits both)."""
    a, b = run_times([first.run, second.run], budget_s, min_runs, threads)
    return typical(a), typical(b)


def run_times(runs: list[Callable[[], object]], budget_s: float, min_runs: int, threads: int,
              max_runs: int = 2000, warmup: int = 1, block: int = 1) -> list[list[int]]:
    """The ns of each call of each of ``runs`` (one run of a model each), by :func:`run_clock` for ``threads``
    threads, called in turn until ``budget_s`` seconds (at least ``min_runs`` calls each) after ``warmup`` calls
    of each.  Each round starts one run later (on a loaded machine the first run of a round is the slowest).
    With ``block`` > 1 each turn calls a run ``block`` times in a row and times all but the first, which pays
    for the caches the other runs filled (a model run repeatedly by itself does not)."""
    times: list[list[int]] = [[] for _ in runs]
    clock = run_clock(threads)
    for run in runs:
        for _ in range(warmup):
            run()
    deadline = time.perf_counter() + budget_s
    round_ = 0
    while len(times[0]) < max_runs and (len(times[0]) < min_runs or time.perf_counter() < deadline):
        first = round_ % len(runs)
        for k in [*range(first, len(runs)), *range(first)]:
            if block > 1:
                runs[k]()
            for _ in range(max(block - 1, 1)):
                start = clock()
                runs[k]()
                times[k].append(clock() - start)
        round_ += 1
    return times


def run_clock(threads: int) -> Callable[[], int]:
    """The clock a run is timed by: with one thread onnxruntime runs the graph on the calling thread, so that
    thread's CPU time (which leaves out the time other processes held the core: the figures do not depend on the
    machine's load); with more, wall-clock time."""
    return time.thread_time_ns if threads == 1 else time.perf_counter_ns


def typical(times: list[int]) -> float:
    """The figure a sample or a model takes from its runs: their median."""
    return float(statistics.median(times))


def measure_case(case: Case, threads: int, budget_s: float, run_ns: float) -> cal.Sample:
    """One sample of ``case``'s node: a model of one copy less the fixed cost of a bound run (``run_ns``) when that
    is at least :data:`ALONE` times ``run_ns``; else (n copies - 1 copy) / (n - 1), so that the run's cost and its
    noise cancel, with n (3 to 32) such that the copies take some 20 times ``run_ns``.  Either way the graph
    onnxruntime runs is checked to hold the ops the sample claims (:func:`check_sample`); the sample records them."""
    one, node = _model_graph(case, 1)
    first = _session(one, threads)
    alone = timed(first, budget_s, threads) - run_ns
    if alone >= ALONE * run_ns:
        ns, ran = alone, check_sample(case.label, first)
    else:  # enough copies that they take some 20 runs' fixed cost together
        copies = min(max(math.ceil(20 * run_ns / max(alone, 100.0)), 3), 32)
        many = _session(_model_graph(case, copies)[0], threads)
        ran = check_sample(case.label, first, many, copies)
        t_one, t_many = timed_pair(first, many, budget_s, threads)
        ns = max((t_many - t_one) / (copies - 1), 0.0)
    n = one.node(node)
    spec, in_types = n.spec, [one.node(i).type for i in n.inputs]
    cost = node_cost(spec, n.attrs, in_types, n.type, spec.kind is Kind.LAYOUT)
    return cal.Sample(line_key(spec, n.attrs, in_types), case.label, cost.launches, cost.traffic_bytes, cost.flops, ns,
                      ", ".join(f"{op} {k}" for op, k in sorted(ran.items())), cost.rows, cost.matrices)


def run_and_dispatch(threads: int, budget_s: float, short: int = 10, long: int = 410) -> tuple[float, float, float]:
    """(run_ns, dispatch_ns, bound_run_ns): from chains of ``short`` and ``long`` Sigmoid nodes on one float, run
    as a model is (``InferenceSession.run``: ``run_ns``, the fixed cost of a model's run) and as the samples are
    (inputs and outputs bound: ``bound_run_ns``)."""
    chains = []
    for n in (short, long):
        g = Graph("chain")
        x = g.input("x", (1,))
        for _ in range(n):
            x = g.sigmoid(x)
        g.set_outputs([x])
        chains.append(_session(g, threads))
    runs = [*(lambda c=c: c.session.run(None, c.feeds) for c in chains), chains[0].run]
    t_short, t_long, t_bound = map(typical, run_times(runs, budget_s, 25, threads))
    dispatch = (t_long - t_short) / (long - short)
    return max(t_short - short * dispatch, 0.0), dispatch, max(t_bound - short * dispatch, 0.0)


def shape_nodes(threads: int, budget_s: float, short: int = 3, long: int = 103) -> float:
    """What one node of a run-time shape computation costs (``shape_ns``): chains of ``short`` and ``long`` rounds of
    the nodes a dynamic export writes for a Reshape or Expand target of a symbolic dim (Shape, Concat, Slice on
    its few int64 elements, then Expand to it), on a one-float input of symbolic length; the slope per node."""
    def chain(rounds: int) -> onnx.ModelProto:
        ints = [onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value])
                for name, value in (("zero", 0), ("one", 1))]
        nodes, x = [], "x"
        for k in range(rounds):
            nodes += [onnx.helper.make_node("Shape", [x], [f"shape{k}"]),
                      onnx.helper.make_node("Concat", [f"shape{k}", "one"], [f"dims{k}"], axis=0),
                      onnx.helper.make_node("Slice", [f"dims{k}", "zero", "one"], [f"dim{k}"]),
                      onnx.helper.make_node("Expand", [x, f"dim{k}"], [f"x{k}"])]
            x = f"x{k}"
        graph = onnx.helper.make_graph(
            nodes, "shape_nodes", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"])],
            [onnx.helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, ["n"])], ints)
        return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)],
                                      ir_version=min(onnx.IR_VERSION, 9))

    feeds = {"x": np.ones(1, np.float32)}
    sessions = [ort.InferenceSession(chain(n).SerializeToString(), _options(threads),
                                     providers=["CPUExecutionProvider"]) for n in (short, long)]
    t_short, t_long = map(typical, run_times([lambda s=s: s.run(None, feeds) for s in sessions], budget_s, 25,
                                             threads))
    return max(t_long - t_short, 0.0) / (4 * (long - short))


def masked_rows(threads: int, budget_s: float, size: tuple[int, int, int, int] = (2, 16, 4, 16),
                copies: int = 8) -> float:
    """What a row of attention scores costs beyond its line when a mask masks keys of it (``masked_row_ns``): a
    chain of ``copies`` MultiHeadAttention nodes at ``size`` (batch, sequence, heads, head width) with a mask
    [B, 1, S, S] each, run with open masks (zeros, as the samples' masks are open) and with the last key of every
    row masked (the float32 minimum, as a causal or padding mask writes it); the difference over the rows masked."""
    b, s, h, d = size

    def build(g: Graph, prev: int | None, copy: int) -> tuple[int, int]:
        m = _Maker(g, copy, 0)
        x = prev if prev is not None else m.input((b, s, h * d))
        node = g.multi_head_attention(x, m.input((b, s, h * d), "k"), m.input((b, s, h * d), "v"),
                                      m.input((b, 1, s, s), "mask"), heads=h, scale=d**-0.5)
        return node, g.reshape(node, shape=(b, s, h * d))

    graph, _ = _model_graph(Case("MultiHeadAttention", "masked rows", build), copies)
    masks = {"open": np.zeros((b, 1, s, s), np.float32), "masked": np.zeros((b, 1, s, s), np.float32)}
    masks["masked"][..., -1] = np.finfo(np.float32).min
    runs = {}
    for label, mask in masks.items():
        runs[label] = _session(graph, threads)
        for name in runs[label].feeds:
            if name.startswith("mask"):
                runs[label].feeds[name] = mask
                runs[label].binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(mask))
    t_open, t_masked = map(typical, run_times([runs["open"].run, runs["masked"].run], budget_s, 25, threads))
    return max(t_masked - t_open, 0.0) / (copies * b * s * h)


def value_costs(threads: int, budget_s: float, values: int = 16, floats: int = 16_384) -> tuple[float, float]:
    """(value_ns, value_ns_per_byte): what one graph input or output adds to a model's run
    (``InferenceSession.run``: the value crosses the call, an output is returned as a new array).  From ``values``
    Sigmoid nodes on one input each, each an output, against a chain of as many on one input to one output, of 1 and
    of ``floats`` floats: the difference is ``values - 1`` more inputs and as many more outputs."""
    ns = []
    for size in (1, floats):
        sessions = []
        for separate in (False, True):
            g = Graph("values")
            xs = [g.input(f"x{k}", (size,)) for k in range(values if separate else 1)]
            ys = [g.sigmoid(x) for x in xs] if separate else [xs[0]]
            for _ in range(0 if separate else values):
                ys = [g.sigmoid(ys[0])]
            g.set_outputs(ys)
            sessions.append(_session(g, threads))
        t_one, t_many = map(typical, run_times([lambda r=r: r.session.run(None, r.feeds) for r in sessions],
                                               budget_s, 25, threads))
        ns.append(max((t_many - t_one) / (2 * (values - 1)), 0.0))
    per_byte = max(ns[1] - ns[0], 0.0) / (4 * (floats - 1))
    return ns[0] - 4 * per_byte, per_byte


def cache_bytes() -> int:
    """The size of the last-level cache that sysfs lists for CPU 0 (Linux); 0 when it cannot be read.  On a
    virtual machine or a many-core part this is the whole socket's cache, shared with other cores and tenants:
    it bounds how many copies :func:`weights_from_memory` needs, not where the weights leave the cache."""
    sizes = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, size = (index / "level").read_text().strip(), (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes[int(level)] = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return sizes[max(sizes)] if sizes else 0


STREAM_WIDTH = 1024  # the probe's MatMuls: [1, 1024] @ [1024, 1024], 4 MiB of weights each
STREAM_COPIES = (32, 256)  # fewest and most copies of the longest probe chain (128 MiB to 1 GiB of weights)


def stream_copies(width: int = STREAM_WIDTH) -> int:
    """How many copies the longest chain of :func:`weights_from_memory` has: weights twice the last-level cache
    sysfs lists (:func:`cache_bytes`), within :data:`STREAM_COPIES`."""
    least, most = STREAM_COPIES
    return min(max(math.ceil(2 * cache_bytes() / (4 * width * width)), least), most)


def weights_from_memory(threads: int, budget_s: float, line: cal.OpRate, width: int = STREAM_WIDTH,
                        copies: int | None = None) -> tuple[float, int]:
    """(``stream_ns_per_byte``, ``cache_bytes``): what a weight byte read from memory costs beyond what ``line``
    (MatMul's, fitted to samples whose weights sit in cache) prices, and how many weight bytes a run reads
    before it pays that.  Measured on decoding steps' chains of MatMuls [1, width] @ [width, width], each copy
    with weights of its own: a chain of ``copies`` (default :func:`stream_copies`), and chains a quarter as
    long, and a quarter of that, down to 2 copies.  Each is timed as (the chain - one copy) / (copies - 1) less
    the line's price of a copy, over a copy's weight bytes; the longest chain's figure is the cost per byte,
    and the cache is the weights of the longest chain that pays less than half of it (0 if none does)."""
    def build(g: Graph, prev: int | None, copy: int) -> tuple[int, int]:
        m = _Maker(g, copy, 0)
        node = g.matmul(prev if prev is not None else m.input((1, width)), m.param((width, width)))
        return node, node

    copies = copies or stream_copies(width)
    rungs = [copies]
    while rungs[-1] // 4 >= 2:
        rungs.append(rungs[-1] // 4)
    per_byte = {}
    for n in rungs:
        case = Case("MatMul", f"MatMul weights from memory [1, {width}] x {n}", build)
        one, node = _model_graph(case, 1)
        t_one, t_many = timed_pair(_session(one, threads), _session(_model_graph(case, n)[0], threads), budget_s,
                                   threads)
        probe = one.node(node)
        cost = node_cost(probe.spec, probe.attrs, [one.node(i).type for i in probe.inputs], probe.type)
        price = line.ns(cost.launches, cost.traffic_bytes, cost.flops, cost.rows, cost.matrices)
        per_byte[n] = max((t_many - t_one) / (n - 1) - price, 0.0) / (4 * width * width)
    return streaming_cost({n * 4 * width * width: ns for n, ns in per_byte.items()})


def streaming_cost(per_byte: Mapping[int, float]) -> tuple[float, int]:
    """(``stream_ns_per_byte``, ``cache_bytes``) from what a weight byte costs (ns, beyond MatMul's line) at each
    probed weight size (bytes): the cost at the largest size, and the largest size that pays less than half of
    it (0 if none)."""
    stream = per_byte[max(per_byte)]
    return stream, max((size for size, ns in per_byte.items() if ns < stream / 2), default=0)


def calibrate(target: str = TARGET, threads: int = 1, cache: str | Path | None = None, save: bool = True,
              budget_s: float = 0.3, passes: int = 3, sizes: Iterable[tuple[int, int, int, int]] = SIZES,
              progress: Callable[[str], None] | None = None, command: str = "",
              stream: tuple[int, int | None] = (STREAM_WIDTH, None)) -> cal.Calibration:
    """Measure ``target`` (only ``onnxruntime``) on this machine with ``threads`` intra-op threads and, when
    ``save``, cache the result (:func:`rlx_egraph.cost.calibration.cache_path`; ``cache`` is the cache
    directory); returns the calibration.  ``budget_s``: seconds of timed runs per sample and pass; ``passes``:
    how many times every sample is measured (the fastest kept: a burst of load on a shared machine passes);
    ``stream``: the width and number of copies (None: :func:`stream_copies`) of the longest MatMul chain that
    measures weights read from memory (:func:`weights_from_memory`)."""
    if target != TARGET:
        raise ValueError(f"calibrate measures the {TARGET!r} target only, not {target!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {threads!r}")
    say = progress or (lambda line: None)
    cases = [case for size in sizes for case in _cases(size)]
    best: dict[int, cal.Sample] = {}
    probes: list[tuple[float, ...]] = []  # per pass: run, dispatch, bound run, value, value per byte, shape node,
    # masked row
    for done in range(passes):  # the probes too are measured once per pass and the lowest kept
        probes.append((*run_and_dispatch(threads, budget_s), *value_costs(threads, budget_s),
                       shape_nodes(threads, budget_s), masked_rows(threads, budget_s)))
        run_ns, dispatch_ns, bound_run_ns, value_ns, value_ns_per_byte, shape_ns, masked_row_ns = map(
            min, zip(*probes, strict=True))
        say(f"pass {done + 1}/{passes}  run {run_ns:,.0f} ns ({bound_run_ns:,.0f} ns bound), dispatch "
            f"{dispatch_ns:,.0f} ns per node ({shape_ns:,.0f} ns a shape node), graph input or output "
            f"{value_ns:,.0f} ns + {value_ns_per_byte:.4f} ns per byte, a masked row of scores {masked_row_ns:,.0f} ns")
        for k, case in enumerate(cases):
            sample = measure_case(case, threads, budget_s, bound_run_ns)
            if k not in best or sample.ns < best[k].ns:
                best[k] = sample
            say(f"pass {done + 1}/{passes}  {sample.label:48s} {best[k].ns / 1e3:10.2f} us")
    samples = [best[k] for k in range(len(cases))]
    run_ns = max(run_ns - 2 * value_ns, 0.0)  # the chains' one input and one output are priced as values
    memory_bw = 1 / max(cal.fit_rate(s for s in samples if s.key == "Add").ns_per_byte, 1e-6)
    flops_per_ns = 1 / max(cal.fit_rate(s for s in samples if s.key == "MatMul").ns_per_flop, 1e-6)
    result = cal.Calibration.fitted(target, samples, machine=cal.machine(target),
                                    command=command or f"rlx-egraph calibrate --target {target} --threads {threads}",
                                    threads=threads, run_ns=run_ns, dispatch_ns=dispatch_ns, memory_bw=memory_bw,
                                    flops_per_ns=flops_per_ns, value_ns=value_ns,
                                    value_ns_per_byte=value_ns_per_byte, shape_ns=shape_ns,
                                    masked_row_ns=masked_row_ns)
    stream_ns, cached = min(weights_from_memory(threads, budget_s, result.rates["MatMul"], *stream)
                            for _ in range(passes))
    say(f"weights from memory: {stream_ns:.4f} ns per byte beyond MatMul's line, past {cached:,} B in cache")
    result = dataclasses.replace(result, stream_ns_per_byte=stream_ns, cache_bytes=cached)
    if save:
        path = result.save(cal.cache_path(target, cache))
        result = cal.read(path)
    return result


__all__ = ["SIZES", "TARGET", "CalibrationGraphError", "Case", "Runnable", "cache_bytes", "calibrate", "check_sample",
           "masked_rows", "measure_case", "run_and_dispatch", "run_clock", "shape_nodes", "stream_copies",
           "streaming_cost", "value_costs", "weights_from_memory", "run_times", "typical"]
