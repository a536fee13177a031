"""Convolutional forms from ONNX (tests/onnx_models.py): a Conv keeps its bias, BatchNormalization folds into the
convolution before it, and act(Conv + residual) is onnxruntime's FusedConv. Exact fused and exported op counts,
parity in onnxruntime, both engines, and fewer launches than onnxruntime's own ORT_ENABLE_ALL graph."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import calibrations
from onnx_models import F, OnnxBuilder, resnet_block
from rlx_egraph import Graph, GraphError
from rlx_egraph.frontends.onnx.compare import op_counts, session
from rlx_egraph.ir import Kind
from rlx_egraph.onnx import export_model, import_model
from rlx_egraph.optimize import optimize_with_report

IMAGE = (1, 8, 8, 8)


def computed(g: Graph) -> Counter[str]:
    """Ops of the nodes that compute (leaves and derived weights left out)."""
    return Counter(n.op for n in g.nodes if n.kind not in (Kind.LEAF, Kind.WEIGHT_PREP))


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def exported_ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node if n.op_type != "Identity")


def pixels(shape: tuple[int, ...] = IMAGE) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_an_onnx_conv_keeps_its_bias_inside() -> None:
    """Conv(x, W, b) with pads, strides and dilations imports as one Conv and exports as one Conv."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [1, 3, 9, 7])
    y = m.op("Conv", [x, m.weight("w", 4, 3, 3, 2), m.weight("b", 4, scale=0.1)], strides=[2, 1], dilations=[1, 2],
             pads=[1, 0, 1, 2])
    model = m.model({"y": y})
    g = import_model(model)
    assert computed(g) == {"Conv": 1}
    out, _ = optimize_with_report(g, target=calibrations.UNIFORM, verify=True)
    exported = export_model(out)
    assert exported_ops(exported) == {"Conv": 1}
    x_value = pixels((1, 3, 9, 7))
    np.testing.assert_allclose(run(exported, x_value), run(model, x_value), rtol=0, atol=1e-5)


def test_auto_pad_same_imports_as_explicit_pads() -> None:
    m = OnnxBuilder(17)
    x = m.input("x", F, [1, 2, 7, 7])
    model = m.model({"y": m.op("Conv", [x, m.weight("w", 2, 2, 4, 4)], strides=[2, 2], auto_pad="SAME_UPPER")})
    (conv,) = [n for n in import_model(model).nodes if n.op == "Conv"]
    assert conv.attrs["pads"] == (1, 1, 2, 2) and conv.shape == (1, 2, 4, 4)
    exported = export_model(import_model(model))
    np.testing.assert_allclose(run(exported, pixels((1, 2, 7, 7))), run(model, pixels((1, 2, 7, 7))), rtol=0,
                               atol=1e-5)


def test_a_bias_added_after_a_conv_is_put_back() -> None:
    """Conv2d + Add(Reshape(b, [O, 1, 1])): one Conv with bias, exported as one ONNX Conv (two launches -> one)."""
    g = Graph("conv-bias")
    x = g.input("x", IMAGE)
    y = g.add(g.conv2d(x, g.param("w", (6, 8, 3, 3)), padding=1), g.reshape(g.param("b", (6,)), shape=(6, 1, 1)))
    g.set_outputs([y])
    g.weights.update({"w": pixels((6, 8, 3, 3)), "b": pixels((6,))})
    for engine in ("egglog", "fallback"):
        out, report = optimize_with_report(g, target=calibrations.UNIFORM, engine=engine, verify=True)
        assert report.parity.ok and computed(out) == {"Conv": 1}
        (conv,) = [n for n in out.nodes if n.op == "Conv"]
        assert [out.node(i).name for i in conv.inputs] == ["x", "w", "b"]
        assert exported_ops(export_model(out)) == {"Conv": 1}


BLOCKS = {
    # name: (resnet_block arguments, imported ops, optimized ops, exported ops)
    "identity-relu": ({}, {"Conv": 2, "BatchNorm": 2, "Relu": 2, "Add": 1}, {"FusedConv": 2},
                      {"FusedConv": 2}),
    "downsample-relu": ({"out_channels": 16, "stride": 2}, {"Conv": 3, "BatchNorm": 3, "Relu": 2, "Add": 1},
                        {"FusedConv": 2, "Conv": 1}, {"FusedConv": 2, "Conv": 1}),
    "identity-relu6": ({"act": "Clip"}, {"Conv": 2, "BatchNorm": 2, "Clip": 2, "Add": 1}, {"FusedConv": 2},
                       {"FusedConv": 2}),
}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_a_resnet_block_is_folded_and_fused_with_parity(name: str, tmp_path: Path) -> None:
    """Every BatchNormalization folds into its Conv, act(conv) and act(conv + shortcut) are FusedConv; both engines
    give the same graph; the export matches the original in onnxruntime and has fewer launches than onnxruntime's
    own ORT_ENABLE_ALL graph of the original."""
    kwargs, imported, optimized, exported_counts = BLOCKS[name]
    model = resnet_block(**kwargs)
    g = import_model(model)
    assert computed(g) == imported
    outputs, exports = {}, {}
    for engine in ("egglog", "fallback"):
        out, report = optimize_with_report(g, target=calibrations.UNIFORM, engine=engine, verify=True)
        assert report.parity.ok
        assert computed(out) == optimized, engine
        folded = Counter(n.op for n in out.nodes if n.kind is Kind.WEIGHT_PREP)
        assert folded == {"BnFoldWeight": imported["BatchNorm"], "BnFoldBias": imported["BatchNorm"]}
        assert report.verification.weight_folds == imported["BatchNorm"]  # each fold checked on the stored weights
        exports[engine] = export_model(out)
        assert exported_ops(exports[engine]) == exported_counts
        assert all(n.domain == "com.microsoft" for n in exports[engine].graph.node if n.op_type == "FusedConv")
        outputs[engine] = run(exports[engine], pixels())
        np.testing.assert_allclose(outputs[engine], run(model, pixels()), rtol=0, atol=1e-4)
    np.testing.assert_allclose(outputs["fallback"], outputs["egglog"], rtol=0, atol=1e-6)
    session(model, "ORT_ENABLE_ALL", tmp_path / "ort.onnx")
    assert op_counts(exports["egglog"])[1] < op_counts(onnx.load(tmp_path / "ort.onnx"))[1]


def test_a_zero_pad_before_a_conv_becomes_the_convs_own_padding() -> None:
    """TF-style "same" padding (MobileNet's TorchScript export): Pad(x) -> Conv -> Clip(0, 6) is one FusedConv with
    the pads inside, exported without the Pad, with onnxruntime parity; a reflect Pad stays."""
    def model(mode: str) -> onnx.ModelProto:
        m = OnnxBuilder(17)
        x = m.input("x", F, [1, 4, 7, 7])
        padded = m.op("Pad", [x, m.ints(0, 0, 0, 1, 0, 0, 1, 1)], mode=mode)
        y = m.op("Conv", [padded, m.weight("w", 4, 1, 3, 3), m.weight("b", 4, scale=0.1)], group=4, strides=[2, 2])
        return m.model({"y": m.op("Clip", [y, m.const(0.0), m.const(6.0)])})

    for mode, exported_counts in (("constant", {"FusedConv": 1}), ("reflect", {"Pad": 1, "FusedConv": 1})):
        original = model(mode)
        out, _ = optimize_with_report(import_model(original), target=calibrations.UNIFORM, verify=True)
        exported = export_model(out)
        assert exported_ops(exported) == exported_counts
        (conv,) = [n for n in exported.graph.node if n.op_type == "FusedConv"]
        pads = next(list(a.ints) for a in conv.attribute if a.name == "pads")
        assert pads == ([0, 1, 1, 1] if mode == "constant" else [0, 0, 0, 0])
        x = pixels((1, 4, 7, 7))
        np.testing.assert_allclose(run(exported, x), run(original, x), rtol=0, atol=1e-5)


def channels_layer_norm_model(channels: int = 8, side: int = 4) -> onnx.ModelProto:
    """LayerNorm over the channels of an NCHW image as the exporters write it (Transpose to NHWC,
    LayerNormalization over the last axis, Transpose back): a stem, one block (depthwise Conv, the NHWC
    LayerNorm and MLP, back to NCHW, + the block's input) and a downsampling LayerNorm + Conv after the sum."""
    m = OnnxBuilder(17)
    x = m.input("pixel_values", F, [2, 3, 4 * side, 4 * side])
    to_nhwc, to_nchw = [0, 2, 3, 1], [0, 3, 1, 2]

    def ln(t: str, prefix: str) -> str:
        return m.op("LayerNormalization", [t, m.weight(f"{prefix}.g", channels, scale=1.0),
                                           m.weight(f"{prefix}.b", channels, scale=0.1)], axis=-1, epsilon=1e-6)

    stem = m.op("Conv", [x, m.weight("stem.w", channels, 3, 4, 4), m.weight("stem.b", channels, scale=0.1)],
                strides=[4, 4])
    h = m.op("Transpose", [ln(m.op("Transpose", [stem], perm=to_nhwc), "stem.ln")], perm=to_nchw)
    d = m.op("Conv", [h, m.weight("dw.w", channels, 1, 3, 3), m.weight("dw.b", channels, scale=0.1)],
             group=channels, pads=[1, 1, 1, 1])
    t = ln(m.op("Transpose", [d], perm=to_nhwc), "block.ln")
    t = m.linear(m.op("Relu", [m.linear(t, "fc1", channels, 2 * channels)]), "fc2", 2 * channels, channels)
    h = m.op("Add", [h, m.op("Transpose", [t], perm=to_nchw)])
    down = m.op("Transpose", [ln(m.op("Transpose", [h], perm=to_nhwc), "down.ln")], perm=to_nchw)
    y = m.op("Conv", [down, m.weight("down.w", 2 * channels, channels, 2, 2)], strides=[2, 2])
    return m.model({"last_hidden_state": y})


def test_a_channels_layer_norm_layout_pair_cancels_across_the_residual_sum(tmp_path: Path) -> None:
    """Transpose(block input + Transpose(mlp, to NCHW), to NHWC) is the NHWC block input + mlp: the pair around
    the residual sum cancels, and the stem's LayerNorm output in NHWC is the sum's other operand (6 Transposes ->
    4), with onnxruntime parity in both engines and fewer launches than onnxruntime's own ORT_ENABLE_ALL graph."""
    model = channels_layer_norm_model()
    x_value = pixels((2, 3, 16, 16))
    want = run(model, x_value)
    for engine in ("egglog", "fallback"):
        exported = export_model(optimize_with_report(import_model(model), target="onnxruntime", engine=engine)[0])
        ops = exported_ops(exported)
        assert ops["Transpose"] == 4, (engine, ops)
        # the stem's norm and the residual sum may run as one SkipLayerNormalization where the cost model takes it
        assert ops["LayerNormalization"] + ops["SkipLayerNormalization"] == 3 and ops["Conv"] + ops["FusedConv"] == 3
        np.testing.assert_allclose(run(exported, x_value), want, rtol=0, atol=1e-4 * float(np.abs(want).max()))
    session(model, "ORT_ENABLE_ALL", tmp_path / "ort.onnx")
    assert op_counts(exported)[1] < op_counts(onnx.load(tmp_path / "ort.onnx"))[1]


def inverted_residual(channels: int = 8, expand: int = 6) -> onnx.ModelProto:
    """MobileNetV2's inverted residual block as its exports write it: a pointwise expansion + ReLU6 (Clip 0, 6), a
    depthwise 3 x 3 + ReLU6, a pointwise projection, + the block's input."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [1, channels, 8, 8])
    wide = channels * expand

    def relu6(t: str) -> str:
        return m.op("Clip", [t, m.const(0.0), m.const(6.0)])

    h = relu6(m.op("Conv", [x, m.weight("expand_w", wide, channels, 1, 1), m.weight("expand_b", wide, scale=0.1)]))
    h = relu6(m.op("Conv", [h, m.weight("dw_w", wide, 1, 3, 3), m.weight("dw_b", wide, scale=0.1)], pads=[1, 1, 1, 1],
                   group=wide))
    h = m.op("Conv", [h, m.weight("project_w", channels, wide, 1, 1), m.weight("project_b", channels, scale=0.1)])
    return m.model({"y": m.op("Add", [h, x])})


def test_an_inverted_residual_block_is_three_fused_convs_on_onnxruntime() -> None:
    """On the onnxruntime target (its shipped calibration), each ReLU6 and the residual sum join their convolution:
    onnxruntime runs a FusedConv as the one convolution kernel it makes of Conv + Clip at load, so a pointwise
    convolution with a wide filter fuses too.  Both engines, parity in onnxruntime."""
    model = inverted_residual(16)  # 16 -> 96 -> 16 channels: the projection's sum stayed an Add on the own line
    g = import_model(model)
    assert computed(g) == {"Conv": 3, "Clip": 2, "Add": 1}
    for engine in ("egglog", "fallback"):
        out, report = optimize_with_report(g, target="onnxruntime", engine=engine, verify=True)
        assert report.parity.ok and computed(out) == {"FusedConv": 3}, engine
        exported = export_model(out)
        assert exported_ops(exported) == {"FusedConv": 3}
        acts = sorted(next((a.s.decode() for a in n.attribute if a.name == "activation"), "")
                      for n in exported.graph.node if n.op_type == "FusedConv")
        assert acts == ["", "Clip", "Clip"]
        x = pixels((1, 16, 8, 8))
        np.testing.assert_allclose(run(exported, x), run(model, x), rtol=0, atol=1e-4)


def convnext_block(channels: int = 8) -> onnx.ModelProto:
    """ConvNeXt's block as its TorchScript export writes it: a depthwise 7 x 7 Conv, Transpose to NHWC, LayerNorm,
    Linear (MatMul + Add) to 4C, erf GELU, Linear back to C, the layer scale (Mul by gamma [C]), Transpose to NCHW,
    + the block's input."""
    m = OnnxBuilder(17)
    x = m.input("x", F, [1, channels, 7, 7])
    h = m.op("Conv", [x, m.weight("dw.w", channels, 1, 7, 7), m.weight("dw.b", channels, scale=0.1)],
             pads=[3, 3, 3, 3], group=channels)
    h = m.op("LayerNormalization", [m.op("Transpose", [h], perm=[0, 2, 3, 1]), m.weight("ln.g", channels, scale=1.0),
                                    m.weight("ln.b", channels, scale=0.1)], axis=-1, epsilon=1e-6)
    h = m.linear(h, "fc1", channels, 4 * channels)
    erf = m.op("Erf", [m.op("Div", [h, m.const(1.4142135381698608)])])
    h = m.op("Mul", [m.op("Mul", [h, m.op("Add", [erf, m.const(1.0)])]), m.const(0.5)])
    h = m.op("Mul", [m.weight("gamma", channels, scale=0.1), m.linear(h, "fc2", 4 * channels, channels)])
    return m.model({"y": m.op("Add", [x, m.op("Transpose", [h], perm=[0, 3, 1, 2])])})


# ConvNeXt's block exported for onnxruntime: the layer scale folded into the second Gemm (its Mul gone), 8 launches
# as exported when priced by one set of figures for every op (calibrations.UNIFORM): the GELU projection is
# MatMul + BiasGelu
EXPORTED_CONVNEXT_BLOCK = {"Conv": 1, "Transpose": 2, "LayerNormalization": 1, "Reshape": 2, "MatMul": 1,
                           "BiasGelu": 1, "Gemm": 1, "Add": 1}


def test_a_layer_scale_folds_into_the_linear_before_it(tmp_path: Path) -> None:
    """ConvNeXt's gamma * (x @ W + b), with W, b and gamma stored weights, is x @ (W * gamma) + b * gamma: the Mul
    is gone, the derived weights computed once in float64 and checked on the stored weights when optimizing.  Both
    engines, parity in onnxruntime, fewer launches than onnxruntime's own ORT_ENABLE_ALL graph of the original.
    Priced by one set of figures for every op (``calibrations.UNIFORM``): the fold, not the shipped calibration's
    near tie at this toy size, is under test."""
    model = convnext_block()
    g = import_model(model)
    assert computed(g)["Mul"] == 3  # the GELU's two and the layer scale
    x = pixels((1, 8, 7, 7))
    for engine in ("egglog", "fallback"):
        out, report = optimize_with_report(g, target=calibrations.UNIFORM, engine=engine)
        assert Counter(n.op for n in out.nodes if n.kind is Kind.WEIGHT_PREP) == {"WeightScale": 2}, engine
        assert report.verification.weight_folds == 1
        exported = export_model(out)
        assert exported_ops(exported) == EXPORTED_CONVNEXT_BLOCK, engine
        np.testing.assert_allclose(run(exported, x), run(model, x), rtol=0, atol=1e-4)
    session(model, "ORT_ENABLE_ALL", tmp_path / "ort.onnx")
    assert op_counts(exported)[1] < op_counts(onnx.load(tmp_path / "ort.onnx"))[1]


def test_the_ort_optimized_export_is_onnxruntimes_offline_graph(tmp_path: Path) -> None:
    """export_model(ort_optimized=True) saves the graph onnxruntime's CPU session makes of the export (what its
    ORT_ENABLE_ALL session saves), returns it, and runs like the original; it needs a path."""
    model = inverted_residual()
    out, _ = optimize_with_report(import_model(model), target="onnxruntime")
    path = tmp_path / "ours.onnx"
    saved = export_model(out, path, ort_optimized=True)
    assert saved == onnx.load(str(path))
    session(export_model(out), "ORT_ENABLE_ALL", tmp_path / "session.onnx")
    signature = [(n.domain, n.op_type, list(n.attribute)) for n in onnx.load(str(tmp_path / "session.onnx")).graph.node]
    assert [(n.domain, n.op_type, list(n.attribute)) for n in saved.graph.node] == signature
    np.testing.assert_allclose(run(saved, pixels()), run(model, pixels()), rtol=0, atol=1e-4)
    with pytest.raises(GraphError, match=r"export_model\(ort_optimized=True\) needs the path"):
        export_model(out, ort_optimized=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours.onnx", "session.onnx"]  # nothing else written
