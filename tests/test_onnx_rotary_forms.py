"""Rotary embeddings beyond rotate-half over the whole head, in the forms transformers' models export them, built
with onnx.helper: part of the head rotated and the rest passed through (GPT-NeoX, Phi, StableLM), and GPT-J's
interleaved pairs (strided slices stacked back), on split heads [B, H, S, D] and on [B, S, H, D].  Each is one
RotaryEmbedding in both engines, exported as RotaryEmbedding (opset 23) with ``rotary_embedding_dim`` and
``interleaved``, and runs in onnxruntime with the original's values."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnx_models import F, OnnxBuilder
from rlx_egraph import optimize
from rlx_egraph.onnx import export_model, import_model
from test_onnx_rules import ENGINES, inputs_of, onnx_ops, optimized

B, H, S, D, R = 2, 3, 5, 8, 4  # R of the D channels rotated
END = 2**62


def tables(m: OnnxBuilder, width: int, interleaved: bool, heads_axis: int) -> tuple[str, str]:
    """cos and sin for ``width`` channels, [1, 1, S, width] (heads on axis 1) or [1, S, 1, width] (on axis 2): each
    angle twice, as the two halves (rotate-half) or as neighbours (interleaved)."""
    angles = np.arange(S)[:, None] * np.linspace(0.1, 1.0, width // 2)[None, :]
    both = np.repeat(angles, 2, axis=-1) if interleaved else np.concatenate([angles, angles], axis=-1)
    shape = (1, 1, S, width) if heads_axis == 1 else (1, S, 1, width)
    return tuple(m.init(f"{f.__name__}{len(m.initializers)}", f(both).reshape(shape).astype(np.float32))
                 for f in (np.cos, np.sin))


def rotate_half(m: OnnxBuilder, x: str, width: int) -> str:
    halves = m.op("Slice", [x, m.ints(0), m.ints(width // 2), m.ints(-1)]), \
        m.op("Slice", [x, m.ints(width // 2), m.ints(END), m.ints(-1)])
    return m.op("Concat", [m.op("Neg", [halves[1]]), halves[0]], axis=-1)


def rotate_every_two(m: OnnxBuilder, x: str, width: int) -> str:
    """GPT-J: stack(-x[..., 1::2], x[..., ::2], dim=-1).flatten(-2), as TorchScript writes it."""
    even, odd = (m.op("Slice", [x, m.ints(k), m.ints(END), m.ints(-1), m.ints(2)]) for k in (0, 1))
    stacked = m.op("Concat", [m.op("Unsqueeze", [m.op("Neg", [odd]), m.ints(-1)]),
                              m.op("Unsqueeze", [even, m.ints(-1)])], axis=-1)
    return m.op("Reshape", [stacked, m.ints(0, 0, 0, width)])


def rope(m: OnnxBuilder, x: str, width: int, interleaved: bool, heads_axis: int) -> str:
    """x * cos + rotate(x) * sin over the first ``width`` channels, the others concatenated after."""
    part = x if width == D else m.op("Slice", [x, m.ints(0), m.ints(width), m.ints(-1)])
    cos, sin = tables(m, width, interleaved, heads_axis)
    rotated = (rotate_every_two if interleaved else rotate_half)(m, part, width)
    y = m.op("Add", [m.op("Mul", [part, cos]), m.op("Mul", [rotated, sin])])
    return y if width == D else m.op("Concat", [y, m.op("Slice", [x, m.ints(width), m.ints(END), m.ints(-1)])],
                                     axis=-1)


# (rotated channels, interleaved, heads' axis): GPT-NeoX's partial rotate-half on split heads, GPT-J's partial
# interleaved rotation before the heads are transposed, and interleaved over the whole head
FORMS = [(R, False, 1), (R, True, 2), (D, True, 1)]


def rotary_model() -> onnx.ModelProto:
    m = OnnxBuilder(17)
    outputs = {}
    for k, (width, interleaved, heads_axis) in enumerate(FORMS):
        x = m.input(f"x{k}", F, [B, H, S, D] if heads_axis == 1 else [B, S, H, D])
        outputs[f"y{k}"] = rope(m, x, width, interleaved, heads_axis)
    return m.model(outputs)


@pytest.mark.parametrize("engine", ENGINES)
def test_partial_and_interleaved_rope_are_one_rotary_embedding_each(engine: str) -> None:
    model = rotary_model()
    exported, mir, fired = optimized(model, engine)
    assert {op: mir[op] for op in ("RotaryEmbedding", "Concat", "Neg", "Narrow", "Mul", "Add")} == \
        {"RotaryEmbedding": 3, "Concat": 0, "Neg": 0, "Narrow": 0, "Mul": 0, "Add": 0}
    assert {"rope-rotate-half", "rope-interleaved", "rope-partial"} <= fired
    ops = onnx_ops(exported)
    assert (ops["RotaryEmbedding"], ops["Concat"], ops["Slice"], ops["Neg"]) == (3, 0, 0, 0)
    attrs = [{a.name: helper.get_attribute_value(a) for a in n.attribute}
             for n in exported.graph.node if n.op_type == "RotaryEmbedding"]
    assert attrs == [{"rotary_embedding_dim": R}, {"interleaved": 1, "num_heads": H, "rotary_embedding_dim": R},
                     {"interleaved": 1}]
    inputs = inputs_of(model)
    for k in range(len(FORMS)):
        np.testing.assert_allclose(run(exported, inputs, f"y{k}"), run(model, inputs, f"y{k}"), rtol=0, atol=1e-5)


def run(model: onnx.ModelProto, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run([output], inputs)[0]


# --- GPT-J's tables computed at run time (dynamic axes) -------------------------------------------------------------

MAX_POSITIONS = 24


def gptj_rope_model(exporter: str, step: bool) -> onnx.ModelProto:
    """GPT-J's partial interleaved rotary of q and k [batch, S, H, D] with dynamic axes, as each exporter writes it:
    the sin-cos table [N, R] gathered at the positions (Range over the sequence; a decoding step's at the cache's
    length ``past_sequence``, S = 1), split into sin and cos, each repeated pairwise (repeat_interleave: TorchScript
    Tile of [1, S, 1, R/2, 1] by 2 on the last axis, dynamo Expand), the first R channels rotated by
    rotate_every_two and the rest concatenated after them."""
    m = OnnxBuilder(17 if exporter == "torchscript" else 18)
    seq = 1 if step else "sequence"
    q, k = (m.input(name, F, ["batch", seq, H, D]) for name in ("q", "k"))
    if step:
        past = m.input("past_key", F, ["batch", H, "past_sequence", D])
        start = m.op("Gather", [m.op("Shape", [past]), m.const(2, np.int64)], axis=0)
        limit = m.op("Add", [start, m.const(1, np.int64)])
    else:
        start, limit = m.const(0, np.int64), m.op("Gather", [m.op("Shape", [q]), m.const(1, np.int64)], axis=0)
    positions = m.op("Unsqueeze", [m.op("Range", [start, limit, m.const(1, np.int64)]), m.ints(0)])  # [1, S]
    angles = np.arange(MAX_POSITIONS)[:, None] * np.linspace(0.1, 1.0, R // 2)[None, :]
    table = m.init("embed_positions", np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype(np.float32))
    sincos = m.op("GatherND", [table, m.op("Unsqueeze", [positions, m.ints(-1)])]) if exporter == "dynamo" else \
        m.op("Gather", [table, positions], axis=0)  # [1, S, R]

    def pairwise(half: str) -> str:  # repeat_interleave(t[:, :, None, :], 2, 3): [1, S, 1, R]
        column = m.op("Unsqueeze", [half, m.ints(2, 4)])  # [1, S, 1, R/2, 1]
        b, s = m.dims(half, 0, 1)
        if exporter == "dynamo":
            column = m.op("Expand", [column, m.op("Concat", [b, s, m.ints(1, R // 2, 2)], axis=0)])
        else:
            column = m.op("Tile", [column, m.ints(1, 1, 1, 1, 2)])
        return m.op("Reshape", [column, m.op("Concat", [b, s, m.ints(1, R)], axis=0)])

    sin, cos = (pairwise(m.op("Slice", [sincos, m.ints(start), m.ints(start + R // 2), m.ints(-1)]))
                for start in (0, R // 2))

    def rotate(x: str) -> str:
        part = m.op("Slice", [x, m.ints(0), m.ints(R), m.ints(-1)])
        y = m.op("Add", [m.op("Mul", [part, cos]), m.op("Mul", [rotate_every_two(m, part, R), sin])])
        return m.op("Concat", [y, m.op("Slice", [x, m.ints(R), m.ints(END), m.ints(-1)])], axis=-1)

    return m.model({"q_rotated": rotate(q), "k_rotated": rotate(k)})


@pytest.mark.parametrize("step", [False, True], ids=["prefill", "decode"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_interleaved_rope_with_tables_computed_at_run_time(exporter: str, step: bool) -> None:
    model = gptj_rope_model(exporter, step)
    graph = import_model(model)
    assert graph.symbols == (("batch", "past_sequence") if step else ("batch", "sequence"))
    opt = optimize(graph, target="onnxruntime")
    assert {op: opt.op_counts()[op] for op in ("RotaryEmbedding", "Concat", "Neg", "Narrow", "OnnxOp")} == \
        {"RotaryEmbedding": 2, "Concat": 0, "Neg": 0, "Narrow": 2, "OnnxOp": 0}  # the Narrows cut sin and cos
    exported = export_model(opt)
    ops = onnx_ops(exported)
    assert (ops["RotaryEmbedding"], ops["Mul"], ops["Add"], ops["Neg"], ops["Tile"]) == (2, 0, 0, 0, 0)
    attrs = [{a.name: helper.get_attribute_value(a) for a in n.attribute}
             for n in exported.graph.node if n.op_type == "RotaryEmbedding"]
    # on [B, S, H * D] with num_heads; a decoding step's one position read as [B, H, S, D] (the same caches)
    assert attrs == [{"interleaved": 1, "rotary_embedding_dim": R, **({} if step else {"num_heads": H})}] * 2
    assert [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in exported.graph.input] == \
        [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input]
    rng = np.random.default_rng(0)
    for batch, length in ((1, 7), (2, 5), (3, 17)):
        shapes = {"q": (batch, 1 if step else length, H, D), "k": (batch, 1 if step else length, H, D),
                  "past_key": (batch, H, length, D)}
        inputs = {i.name: rng.standard_normal(shapes[i.name]).astype(np.float32) for i in model.graph.input}
        for name in ("q_rotated", "k_rotated"):
            np.testing.assert_allclose(run(exported, inputs, name), run(model, inputs, name), rtol=0, atol=1e-5)
