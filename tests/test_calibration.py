"""Calibrations: fitting lines to samples, the JSON file, the per-machine cache, the onnxruntime target they
price, the fusion decisions that follow from them (calibration fixtures, never this machine's timing), the
measured latency in the report, and the cost package's layering."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import calibrations
from onnx_models import decode_step
from rlx_egraph import Graph, optimize_with_report
from rlx_egraph.cli.main import main
from rlx_egraph.cost import TARGETS, get_target
from rlx_egraph.cost import calibration as cal
from rlx_egraph.cost.calibration import Calibration, CalibrationError, OpRate, Sample, fit_rate
from rlx_egraph.cost.model import NodeCost, line_key, masked_rows, node_cost
from rlx_egraph.cost.profile import format_ns, profile
from rlx_egraph.cost.targets import ONNXRUNTIME_FUSED, onnxruntime_target
from rlx_egraph.frontends.onnx import calibrate as calibrate_module
from rlx_egraph.frontends.onnx.calibrate import (
    SIZES,
    CalibrationGraphError,
    Case,
    _cases,
    _model_graph,
    _session,
    calibrate,
    check_sample,
    streaming_cost,
)
from rlx_egraph.frontends.onnx.latency import BLOCK
from rlx_egraph.ir import REGISTRY
from rlx_egraph.onnx import export_model, import_model, measure_latency, measure_report, onnx_rules, price_export

SRC = Path(__file__).resolve().parents[1] / "src" / "rlx_egraph"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test reads and writes calibrations under its own cache directory only."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(cal.CACHE_ENV, str(cache))
    return cache


# --- fitting -------------------------------------------------------------------------------------


def test_fit_recovers_the_line_the_samples_lie_on() -> None:
    line = OpRate(1_500.0, 0.25, 0.01)
    samples = [Sample("MatMul", f"s{k}", 1, b, f, line.ns(1, b, f))
               for k, (b, f) in enumerate([(4_096, 65_536), (65_536, 2_097_152), (1 << 20, 1 << 28), (8_192, 0)])]
    fitted = fit_rate(samples)
    assert fitted.launch_ns == pytest.approx(1_500.0, rel=1e-9)
    assert fitted.ns_per_byte == pytest.approx(0.25, rel=1e-9)
    assert fitted.ns_per_flop == pytest.approx(0.01, rel=1e-9)


def test_fit_recovers_a_cost_per_row_and_per_matrix() -> None:
    """An attention whose samples pay per query row and per head beside their launch, bytes and FLOPs: the fit gives
    back all five terms, and a line fitted without the rows and matrices (the counts left at 0) misses a many-window
    shape that the samples do not reach by far more."""
    line = OpRate(4_000.0, 0.05, 0.002, 6.0, 900.0)
    shapes = [(2, 8, 2, 8), (2, 16, 4, 16), (2, 32, 4, 32), (1, 128, 8, 48), (1, 128, 12, 64), (2, 80, 4, 16)]

    def sample(b: int, s: int, h: int, d: int, counted: bool = True) -> Sample:
        traffic, flops, rows, matrices = 4 * 4 * b * s * h * d, 4 * b * h * s * s * d, b * h * s, b * h
        return Sample("MultiHeadAttention", f"{b}x{s}x{h}x{d}", 1, traffic, flops,
                      line.ns(1, traffic, flops, rows, matrices), "", rows if counted else 0,
                      matrices if counted else 0)

    fitted = fit_rate(sample(*shape) for shape in shapes)
    assert [getattr(fitted, term) for term in cal.TERMS] == pytest.approx([4_000.0, 0.05, 0.002, 6.0, 900.0],
                                                                          rel=1e-6)
    windows = sample(32, 16, 2, 16)  # a windowed vision model: 64 heads of 16 rows
    assert fitted.ns(*windows.counts) == pytest.approx(windows.ns, rel=1e-6)
    uncounted = fit_rate(sample(*shape, counted=False) for shape in shapes)
    assert uncounted.ns(*windows.counts[:3]) < 0.7 * windows.ns


def test_node_cost_counts_the_rows_and_matrices_a_kernel_loops_over() -> None:
    """Rows: a norm's or Softmax's rows, an attention's query rows in every head; matrices: a batched MatMul's
    products, one GEMM for a MatMul of a 2-D weight, one per batch and head of an attention."""
    g = Graph("counts")
    x, mask = g.input("x", (2, 80, 64)), g.input("mask", (2, 1, 1, 80))
    q4, k4 = g.input("q4", (2, 4, 80, 16)), g.input("k4", (2, 4, 16, 80))
    norm = g.layer_norm(x, g.param("g", (64,)), g.param("b", (64,)))
    nodes = {"LayerNorm": norm, "projection": g.matmul(norm, g.param("w", (64, 64))), "scores": g.matmul(q4, k4),
             "Softmax": g.softmax(g.matmul(q4, k4)),
             "MultiHeadAttention": g.multi_head_attention(x, x, x, mask, heads=4, scale=0.25),
             "KvCacheAttention": g.kv_cache_attention(
                 g.input("q1", (2, 4, 1, 16)), g.input("k1", (2, 4, 1, 16)), g.input("v1", (2, 4, 1, 16)),
                 g.input("pk", (2, 4, 80, 16)), g.input("pv", (2, 4, 80, 16)), g.input("m1", (2, 1, 1, 81)),
                 scale=0.25)}
    g.set_outputs([g.get(nid, index=0) if g.node(nid).parts else nid for nid in nodes.values()])
    counted = {}
    for name, nid in nodes.items():
        n = g.node(nid)
        cost = node_cost(n.spec, n.attrs, [g.node(i).type for i in n.inputs], n.type)
        counted[name] = (cost.rows, cost.matrices)
    assert counted == {"LayerNorm": (160, 0), "projection": (160, 1), "scores": (640, 8), "Softmax": (640, 0),
                       "MultiHeadAttention": (640, 8), "KvCacheAttention": (8, 8)}


def test_fit_keeps_terms_non_negative_and_leaves_absent_ones_at_zero() -> None:
    """A term no sample has gets 0; a line that would need a negative slope gets 0 there instead."""
    fitted = fit_rate([Sample("Add", "a", 1, 1_000, 0, 2_000.0), Sample("Add", "b", 1, 100_000, 0, 1_900.0)])
    assert fitted.ns_per_flop == 0.0 and fitted.ns_per_byte == 0.0
    assert 1_900.0 <= fitted.launch_ns <= 2_000.0
    with pytest.raises(ValueError, match="fit_rate needs at least one sample"):
        fit_rate([])
    with pytest.raises(ValueError, match=r"OpRate.launch_ns=-1.0 must be a finite number >= 0"):
        OpRate(-1.0, 0.0, 0.0)


def test_a_calibration_fits_one_line_per_op_and_one_per_kind() -> None:
    samples = [Sample("Add", "a", 1, 1_000, 0, 1_100.0), Sample("Add", "b", 1, 11_000, 0, 2_100.0),
               Sample("Sigmoid", "c", 1, 1_000, 0, 1_300.0), Sample("Sigmoid", "d", 1, 11_000, 0, 3_300.0)]
    c = Calibration.fitted("onnxruntime", samples, machine={}, command="c", threads=1, run_ns=0.0,
                           dispatch_ns=1.0, memory_bw=1.0, flops_per_ns=1.0)
    assert sorted(c.rates) == ["Add", "Sigmoid", "elementwise"]
    assert (c.rates["Add"].launch_ns, c.rates["Add"].ns_per_byte) == pytest.approx((1_000.0, 0.1))
    assert (c.rates["Sigmoid"].launch_ns, c.rates["Sigmoid"].ns_per_byte) == pytest.approx((1_100.0, 0.2))
    kind = c.rates["elementwise"]  # the median of its ops' lines, term by term
    assert (kind.launch_ns, kind.ns_per_byte, kind.ns_per_flop) == pytest.approx((1_050.0, 0.15, 0.0))
    assert [round(c.predicted_ns(s)) for s in samples] == [1_100, 2_100, 1_300, 3_300]


def test_the_lines_of_ops_that_compute_as_one_gemm_share_one_flop_rate() -> None:
    """MatMul and Gemm (FusedMatMulBiasAct without an epilogue) run on one GEMM kernel: samples that put them
    10% apart in FLOP rate (one by one, each line gets its own) fit one rate between the two, each keeping its own
    launch and byte terms; an op of another kernel (an attention) keeps a rate of its own."""
    sizes = [(4_096, 65_536), (65_536, 2_097_152), (1 << 20, 1 << 28), (1 << 18, 1 << 26)]
    lines = {"MatMul": OpRate(400.0, 0.01, 0.0080), "FusedMatMulBiasAct.none": OpRate(600.0, 0.02, 0.0088),
             "QkvAttention": OpRate(5_000.0, 0.1, 0.0095)}
    samples = [Sample(key, f"{key} {k}", 1, b, f, line.ns(1, b, f)) for key, line in lines.items()
               for k, (b, f) in enumerate(sizes)]
    assert fit_rate(s for s in samples if s.key == "MatMul").ns_per_flop == pytest.approx(0.0080)
    c = Calibration.fitted("onnxruntime", samples, machine={}, command="c", threads=1, run_ns=0.0,
                           dispatch_ns=1.0, memory_bw=1.0, flops_per_ns=1.0)
    shared = c.rates["MatMul"].ns_per_flop
    assert c.rates["FusedMatMulBiasAct.none"].ns_per_flop == shared and 0.0080 < shared < 0.0088
    assert c.rates["QkvAttention"].ns_per_flop == pytest.approx(0.0095)
    # the op measured per epilogue only gets a line through all its samples, for the epilogues none measured
    assert c.rates["FusedMatMulBiasAct"] == fit_rate(s for s in samples if s.key == "FusedMatMulBiasAct.none")
    assert cal.computes_as_gemm("FusedMatMulBiasAct.gelu") and not cal.computes_as_gemm("QkvAttention")


def test_a_fused_ops_samples_fit_the_line_of_its_cost_class() -> None:
    """onnxruntime runs a FusedConv as the Conv kernel it makes of Conv + activation: FusedConv's cost class is
    Conv, so its samples are fitted into Conv's line, which prices both; no line of its own is made (it would
    price nothing)."""
    conv, fused = OpRate(2_000.0, 0.05, 0.004), OpRate(2_000.0, 0.05, 0.004)
    sizes = [(8_192, 100_000), (65_536, 2_000_000), (1 << 20, 1 << 26)]
    samples = [Sample("Conv", f"c{k}", 1, b, f, conv.ns(1, b, f)) for k, (b, f) in enumerate(sizes[:2])]
    samples.append(Sample("FusedConv", "f", 1, *sizes[2], fused.ns(1, *sizes[2])))
    c = Calibration.fitted("onnxruntime", samples, machine={}, command="c", threads=1, run_ns=0.0,
                           dispatch_ns=1.0, memory_bw=1.0, flops_per_ns=1.0)
    assert "FusedConv" not in c.rates and REGISTRY["FusedConv"].cost_class == "Conv"
    assert [getattr(c.rates["Conv"], term) for term in cal.TERMS] == pytest.approx([2_000.0, 0.05, 0.004, 0, 0])
    assert [round(c.predicted_ns(s) / s.ns, 6) for s in samples if s.key == "Conv"] == [1.0, 1.0]


def _conv_graph() -> tuple[Graph, dict[str, int]]:
    """Over an image of 16 channels (a block's: no NCHW reads), a dense 3x3 convolution, a depthwise one (one input
    channel per group) as Conv and as FusedConv with a clip, a grouped one of two channels per group, a grouped one
    over one axis, and a 1x1 one of one group as Conv and as FusedConv with a clip; and two that read NCHW (fewer
    input channels than a block): a 7x7 stem of stride 2 over 3 colour channels as Conv, and a 1x1 expansion of 8
    channels as FusedConv with a clip."""
    g = Graph("convs")
    x = g.input("x", (1, 16, 6, 6))
    nodes = {"dense": g.conv(x, g.param("w", (16, 16, 3, 3)), pads=[1] * 4),
             "depthwise": g.conv(x, g.param("dw", (16, 1, 3, 3)), pads=[1] * 4, groups=16),
             "fused depthwise": g.fused_conv(x, g.param("fw", (16, 1, 3, 3)), g.param("fb", (16,)), pads=[1] * 4,
                                             groups=16, act="clip", clip_min=0.0, clip_max=6.0),
             "grouped": g.conv(x, g.param("gw", (16, 2, 3, 3)), pads=[1] * 4, groups=8),
             "1d": g.conv(g.input("s", (2, 8, 40)), g.param("sw", (8, 2, 3)), pads=[1, 1], groups=4),
             "pointwise": g.conv(x, g.param("pw", (32, 16, 1, 1))),
             "fused pointwise": g.fused_conv(x, g.param("fpw", (32, 16, 1, 1)), g.param("fpb", (32,)), act="clip",
                                             clip_min=0.0, clip_max=6.0),
             "stem": g.conv(g.input("image", (2, 3, 32, 32)), g.param("sw7", (16, 3, 7, 7)), pads=[3] * 4,
                            strides=[2, 2]),
             "fused expansion": g.fused_conv(g.input("x8", (2, 8, 16, 16)), g.param("ew", (48, 8, 1, 1)),
                                             g.param("eb", (48,)), act="clip", clip_min=0.0, clip_max=6.0)}
    g.set_outputs(list(nodes.values()))
    return g, nodes


def test_depthwise_pointwise_nchw_and_one_axis_convolutions_are_priced_by_lines_of_their_own() -> None:
    """onnxruntime runs a depthwise convolution, a 1x1 one, one that reads NCHW (fewer input channels than its
    block) and one over one axis on kernels of their own, each at its own rates: their samples (Conv's and
    FusedConv's, whose cost class is Conv) fit ``Conv.depthwise``, ``Conv.pointwise``, ``Conv.nchw`` and ``Conv.1d``,
    the dense 2-D ones ``Conv``, each recovered from samples on its line; a 2-D node of one input channel per group is
    priced by the depthwise line, a 2-D one of one group and fewer than 16 input channels (a stem over 3 colour
    channels, an expansion of 8, whatever its kernel) by the NCHW line, another 2-D 1x1 one of one group by the
    pointwise line, a 1-D one (of any groups) by the 1-D line, a dense one and one of two channels per group by
    Conv's."""
    lines = {"Conv": OpRate(2_000.0, 0.05, 0.004), "Conv.depthwise": OpRate(1_500.0, 0.2, 0.05, 3.0),
             "Conv.1d": OpRate(900.0, 0.02, 0.012), "Conv.pointwise": OpRate(400.0, 0.03, 0.006, 0.5),
             "Conv.nchw": OpRate(900.0, 0.08, 0.007, 0.6)}
    sizes = [(8_192, 100_000, 64), (65_536, 2_000_000, 512), (1 << 20, 1 << 26, 4_096), (1 << 18, 1 << 22, 8_192)]
    samples = []
    for key, line in lines.items():
        for k, (b, f, rows) in enumerate(sizes):
            name = key.replace("Conv", "FusedConv") if k % 2 else key  # FusedConv's samples, into Conv's lines
            samples.append(Sample(name, f"{name} {k}", 1, b, f, line.ns(1, b, f, rows), "Conv 1", rows))
    c = Calibration.fitted("onnxruntime", samples, machine={}, command="c", threads=1, run_ns=0.0,
                           dispatch_ns=1.0, memory_bw=1.0, flops_per_ns=1.0)
    assert not any(key.startswith("FusedConv") for key in c.rates)
    for key, line in lines.items():
        assert [getattr(c.rates[key], term) for term in cal.TERMS] == pytest.approx(
            [getattr(line, term) for term in cal.TERMS], rel=1e-6, abs=1e-9), key
    target = onnxruntime_target(c)
    g, nodes = _conv_graph()
    priced = {}
    for name, nid in nodes.items():
        n = g.node(nid)
        in_types = [g.node(i).type for i in n.inputs]
        key = line_key(n.spec, n.attrs, in_types)
        cost = node_cost(n.spec, n.attrs, in_types, n.type)
        priced[name] = (key, target.node_ns(n.spec, n.attrs, in_types, n.type)
                        == pytest.approx(lines[key.replace("FusedConv", "Conv")].ns(*cost_counts(cost))))
    assert priced == {"dense": ("Conv", True), "depthwise": ("Conv.depthwise", True),
                      "fused depthwise": ("FusedConv.depthwise", True), "grouped": ("Conv", True),
                      "1d": ("Conv.1d", True), "pointwise": ("Conv.pointwise", True),
                      "fused pointwise": ("FusedConv.pointwise", True), "stem": ("Conv.nchw", True),
                      "fused expansion": ("FusedConv.nchw", True)}
    assert set(profile(g, target).by_op) == {"Conv", "Conv.1d", "Conv.depthwise", "Conv.pointwise", "Conv.nchw",
                                             "FusedConv.depthwise", "FusedConv.pointwise", "FusedConv.nchw"}
    with pytest.raises(ValueError, match=r"rates name unknown op\(s\) or kind\(s\) \['Add.depthwise'\]"):
        calibrations.target({"Add.depthwise": OpRate(1.0, 0.0, 0.0)})


def test_a_calibration_without_an_nchw_line_prices_those_convolutions_by_convs() -> None:
    """A calibration made before convolutions that read NCHW were measured has no ``Conv.nchw`` line: a stem over 3
    colour channels (7x7, stride 2: 2 x 16 x 16 x 16 out, 2 x 16 x 256 x 147 multiply-adds) and a FusedConv
    expansion of 8 channels are priced by Conv's dense line, as before; with the line, by it."""
    dense, nchw = OpRate(2_000.0, 0.05, 0.004), OpRate(900.0, 0.08, 0.007, 0.6)
    g, nodes = _conv_graph()
    stem = g.node(nodes["stem"])
    in_types = [g.node(i).type for i in stem.inputs]
    cost = node_cost(stem.spec, stem.attrs, in_types, stem.type)
    assert cost_counts(cost) == (1, 4 * (2 * 3 * 32 * 32 + 16 * 3 * 49 + 2 * 16 * 16 * 16),
                                 2 * 2 * 16 * 256 * 147, 2 * 16 * 16, 0)
    for rates, line in (({"Conv": dense}, dense), ({"Conv": dense, "Conv.nchw": nchw}, nchw)):
        target = calibrations.target(rates)
        for name in ("stem", "fused expansion"):
            n = g.node(nodes[name])
            types = [g.node(i).type for i in n.inputs]
            assert target.node_ns(n.spec, n.attrs, types, n.type) == pytest.approx(
                line.ns(*cost_counts(node_cost(n.spec, n.attrs, types, n.type)))), name


def cost_counts(cost: NodeCost) -> tuple[int, ...]:
    """A node's counts in the order :data:`~rlx_egraph.cost.calibration.TERMS` multiplies them."""
    return cost.launches, cost.traffic_bytes, cost.flops, cost.rows, cost.matrices


def test_the_gemm_lines_share_a_byte_and_flop_rate_and_keep_their_own_launch_and_matrix_terms() -> None:
    """One GEMM kernel: MatMul (its per-head samples many matrices each), Gemm, and MatMul + BiasGelu (a second
    kernel over the output, its samples ran so) lie on lines with one rate per byte and per FLOP; the fit gives back
    each line's launch, MatMul's cost per matrix and BiasGelu's bytes on top of the shared rate."""
    shared = {"ns_per_byte": 0.01, "ns_per_flop": 0.008}
    lines = {"MatMul": OpRate(400.0, **shared, ns_per_matrix=250.0), "FusedMatMulBiasAct.none": OpRate(650.0, **shared),
             "FusedMatMulBiasAct.gelu": OpRate(1_300.0, 0.01 + 0.06, 0.008)}
    ran = {"MatMul": "MatMul 1", "FusedMatMulBiasAct.none": "Gemm 1, Reshape 1",
           "FusedMatMulBiasAct.gelu": "BiasGelu 1, MatMul 1"}
    sizes = [(4_096, 65_536, 1), (65_536, 2_097_152, 1), (1 << 20, 1 << 28, 1), (1 << 18, 1 << 26, 1),
             (1 << 16, 1 << 20, 64), (1 << 14, 1 << 18, 8)]
    samples = [Sample(key, f"{key} {k}", 1, b, f, line.ns(1, b, f, 0, m), ran[key], 0, m)
               for key, line in lines.items() for k, (b, f, m) in enumerate(sizes) if m == 1 or key == "MatMul"]
    fitted = cal.fit_gemm_rates({key: [s for s in samples if s.key == key] for key in lines})
    for key, line in lines.items():
        assert [getattr(fitted[key], term) for term in cal.TERMS] == pytest.approx(
            [getattr(line, term) for term in cal.TERMS], rel=1e-6, abs=1e-9), key


# --- the file and the cache -------------------------------------------------------------------------


def test_a_calibration_round_trips_through_json(tmp_path: Path) -> None:
    c = dataclasses.replace(calibrations.calibration(), samples=(Sample("Add", "Add [2x16, 64]", 1, 24_576, 2_048,
                                                                       1_180.0, "Add 1"),),
                            value_ns=570.0, value_ns_per_byte=0.004, stream_ns_per_byte=0.04, cache_bytes=1 << 25,
                            shape_ns=340.0, masked_row_ns=90.0)
    path = c.save(tmp_path / "sub" / "c.json")
    back = cal.read(path)
    assert back == c and back.source == str(path) and back.samples[0].ran == "Add 1"
    data = json.loads(path.read_text())
    assert data["format_version"] == cal.FORMAT_VERSION and (data["value_ns"], data["value_ns_per_byte"]) == (
        570.0, 0.004)
    # a file made before graph values and what ran were measured reads with none
    assert data["shape_ns"] == 340.0 and onnxruntime_target(back).shape_node_ns == 340.0
    assert data["masked_row_ns"] == 90.0 and onnxruntime_target(back).masked_row_ns == 90.0
    for key in ("value_ns", "value_ns_per_byte", "stream_ns_per_byte", "cache_bytes", "shape_ns", "masked_row_ns"):
        del data[key]
    for key in ("ran", "rows", "matrices"):
        del data["samples"][0][key]
    for line in data["rates"].values():
        del line["ns_per_row"], line["ns_per_matrix"]
    path.write_text(json.dumps(data))
    older = cal.read(path)
    assert (older.value_ns, older.value_ns_per_byte, older.stream_ns_per_byte, older.cache_bytes, older.shape_ns,
            older.masked_row_ns) == (0, 0, 0, 0, 0, 0)  # a file without masked rows prices them as open ones
    assert onnxruntime_target(older).shape_node_ns == older.dispatch_ns  # a file without it: a dispatch a node
    assert (older.samples[0].ran, older.samples[0].rows, older.samples[0].matrices) == ("", 0, 0)
    assert all(line.ns_per_row == line.ns_per_matrix == 0 for line in older.rates.values())


@pytest.mark.parametrize(("text", "message"), [
    ("{", "not JSON"),
    ('{"format_version": 0}', "format_version 0 is not 1; run rlx-egraph calibrate again"),
    ('{"format_version": 1, "target": "onnxruntime"}', "not a calibration (KeyError: 'machine')"),
])
def test_a_bad_calibration_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=re.escape(f"{path}: {message}")):
        cal.read(path)
    with pytest.raises(CalibrationError, match=re.escape(f"{tmp_path / 'none.json'}: No such file")):
        cal.read(tmp_path / "none.json")


def test_the_cache_is_per_machine_under_the_cache_directory(_own_cache: Path, tmp_path: Path) -> None:
    path = cal.cache_path("onnxruntime")
    assert path.parent == _own_cache / "calibration" and path.name.startswith("onnxruntime-")
    assert cal.cache_path("onnxruntime", tmp_path / "other").parent == tmp_path / "other" / "calibration"
    assert cal.machine("onnxruntime")["runtime"].startswith("onnxruntime ")
    assert cal.load("onnxruntime").source == "shipped with rlx-egraph"  # nothing cached yet
    assert get_target("onnxruntime") is TARGETS["onnxruntime"]
    mine = dataclasses.replace(calibrations.calibration(run_ns=1_234.0), machine=cal.machine("onnxruntime"))
    mine.save(path)
    assert cal.load("onnxruntime") == mine
    assert get_target("onnxruntime").run_ns == 1_234.0 and get_target("onnxruntime").calibration.endswith(
        f"({path}; made by: tests/calibrations.py)")
    assert TARGETS["onnxruntime"].run_ns == cal.shipped("onnxruntime").run_ns  # the preset stays the shipped one


def test_the_shipped_calibration_prices_every_declared_fused_op_by_its_own_or_its_cost_class_line() -> None:
    """A fused op the target runs has its own measured line, or names the line of an op exported as the same kernel
    (its cost class: QuickGelu is priced by Silu's, which is exported as QuickGelu)."""
    shipped = cal.shipped("onnxruntime")
    assert shipped.target == "onnxruntime" and shipped.command.startswith("rlx-egraph calibrate --target onnxruntime")
    assert sorted(op for op in ONNXRUNTIME_FUSED
                  if op not in shipped.rates and REGISTRY[op].cost_class not in shipped.rates) == []
    assert {"Reshape", "Transpose", "Narrow", "Expand", "Concat", "Identity", "MatMul", "LayerNorm"} <= set(
        shipped.rates)
    target = TARGETS["onnxruntime"]
    assert target.rates == shipped.rates and target.attention_block_max_tokens is None


def test_the_cache_is_the_largest_probe_that_pays_under_half_the_streaming_cost() -> None:
    """The weights-from-memory probe's figures: the cost per byte at the largest size, and where it is paid."""
    mib = 1 << 20
    # a 2-core Intel Xeon VM: sysfs lists 480 MiB, the weights leave the cache between 60 and 240 MiB
    assert streaming_cost({960 * mib: 0.06, 240 * mib: 0.05, 60 * mib: 0.01, 12 * mib: 0.0}) == (0.06, 60 * mib)
    assert streaming_cost({128 * mib: 0.04, 32 * mib: 0.03, 8 * mib: 0.02}) == (0.04, 0)  # never cheaper by half
    assert streaming_cost({128 * mib: 0.0, 32 * mib: 0.0}) == (0.0, 0)  # all in cache: nothing streams
    assert streaming_cost({32 * 4096: 0.05}) == (0.05, 0)  # one probe: no size to compare it with


def test_calibrate_writes_one_file_in_the_cache_only(tmp_path: Path) -> None:
    """A short calibration (the tiny model's size, one pass): every declared fused op gets its own line or its cost
    class's, every layout op its own; the one file written is this machine's cache entry.  No timing is asserted."""
    cache = tmp_path / "mine"
    result = calibrate(cache=cache, sizes=[SIZES[1]], passes=1, budget_s=0.0, stream=(64, 8))
    assert [p.relative_to(cache) for p in cache.rglob("*") if p.is_file()] == [
        cal.cache_path("onnxruntime", cache).relative_to(cache)]
    assert result.source == str(cal.cache_path("onnxruntime", cache))
    assert {"Reshape", "Transpose", "Narrow", "Expand", "Concat"} <= set(result.rates)
    assert sorted(op for op in ONNXRUNTIME_FUSED
                  if op not in result.rates and REGISTRY[op].cost_class not in result.rates) == []
    assert all(s.ns >= 0 for s in result.samples) and result.threads == 1 and result.value_ns > 0
    assert result.shape_ns > 0 and onnxruntime_target(result).shape_node_ns == result.shape_ns
    assert result.masked_row_ns >= 0 and onnxruntime_target(result).masked_row_ns == result.masked_row_ns
    # the probe chains have 8 and 2 copies of 64 x 64 weights: the cache is the shorter one's weights or none
    assert result.stream_ns_per_byte >= 0 and result.cache_bytes in (0, 2 * 4 * 64 * 64)
    ran = {s.label: s.ran for s in result.samples}
    assert ran["MatMul wide [2x16, 64]"] == "MatMul 1" and ran["FusedResidualLN [2x16, 64]"] == (
        "SkipLayerNormalization 1") and ran["Identity [2x16, 64]"] == ""
    with pytest.raises(ValueError, match="calibrate measures the 'onnxruntime' target only, not 'cpu'"):
        calibrate("cpu")


def test_every_copy_of_every_sample_is_in_the_graph_onnxruntime_runs() -> None:
    """A sample of n copies is measured against one copy: each copy must be in the graph onnxruntime runs, also
    the copies whose result no later copy reads (a graph with only the last copy's result as output lost them
    to the export's dead-code removal, and the sample measured n - 1 missing nodes)."""
    ran = {}
    for case in _cases(SIZES[0]):
        ran[case.label] = check_sample(case.label, _session(_model_graph(case, 1)[0], 1),
                                       _session(_model_graph(case, 3)[0], 1), 3)
    assert ran["MatMul wide [2x8, 16]"] == {"MatMul": 1} and ran["Transpose [2x8, 16]"] == {"Transpose": 1}
    assert ran["Concat [2x8, 16]"] == {"Concat": 1} and ran["Narrow [2x8, 16]"] == {"Slice": 1}
    assert ran["FusedMatMulBiasAct gelu [2x8, 16]"] == {"MatMul": 1, "BiasGelu": 1}
    assert ran["EmbedLayerNorm [2x8, 16]"] == {"Cast": 1, "EmbedLayerNormalization": 1}
    assert ran["Identity [2x8, 16]"] == {}  # onnxruntime removes an Identity of an intermediate when it loads
    assert ran["Conv pointwise 1x1 image [2x8, 16]"] == {"Conv": 1}


def test_the_convolutions_that_read_nchw_are_sampled_into_their_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibration samples convolutions that read NCHW: a stem of stride 2 over 3 colour channels (3x3 and 7x7)
    and a 1x1 expansion of 8 channels into 48, each copy with its own image; their samples key ``Conv.nchw``, and a
    stem runs as onnxruntime's NCHW-input Conv plus the ReorderOutput of its blocked output.  Timed with a fake
    clock (a run costs 1 us and 5 us more per image fed), a stem is 5 us: (10 copies - 1) / 9 at a bound run of 2 us."""
    def fake_run_times(runs: list, budget_s: float, min_runs: int, threads: int) -> list[list[int]]:
        return [[1_000 + 5_000 * len(run.__self__.feeds)] * min_runs for run in runs]

    monkeypatch.setattr(calibrate_module, "run_times", fake_run_times)
    cases = {case.label: case for case in _cases(SIZES[1])}
    stem = calibrate_module.measure_case(cases["Conv nchw stem [2x16, 64]"], 1, 0.0, 2_000.0)
    # 2 images of 3 x 8 x 8 into 16 channels of 4 x 4: 2 * 16 * 16 outputs of 27 multiply-adds each
    assert stem == Sample("Conv.nchw", "Conv nchw stem [2x16, 64]", 1, 4 * (2 * 3 * 64 + 16 * 27 + 16 + 2 * 16 * 16),
                          2 * 2 * 16 * 16 * 27, 5_000.0, "Conv 1, ReorderOutput 1", 2 * 16 * 4)
    keys = {label: calibrate_module.measure_case(cases[label], 1, 0.0, 2_000.0).key
            for label in ("Conv nchw stem 7x7 [2x16, 64]", "Conv nchw 1x1 [2x16, 64]")}
    assert keys == {"Conv nchw stem 7x7 [2x16, 64]": "Conv.nchw", "Conv nchw 1x1 [2x16, 64]": "Conv.nchw"}


def test_a_sample_whose_copies_are_dead_code_is_an_error() -> None:
    """Every copy hands on the first copy's result: the later copies read their own inputs, nothing reads them and
    they are no output, so the export drops them, and the check says so."""
    def dead(g: Graph, prev: int | None, copy: int) -> tuple[int, int]:
        node = g.transpose(g.input(f"x{copy}", (2, 3)), perm=(1, 0))
        return node, node if prev is None else prev

    case = Case("Transpose", "Transpose dead", dead)
    one, many = _session(_model_graph(case, 1)[0], 1), _session(_model_graph(case, 3)[0], 1)
    with pytest.raises(CalibrationGraphError, match=r"sample Transpose dead: the export writes no node for it"):
        check_sample(case.label, one, many, 3)


def test_weights_past_the_cache_are_priced_as_read_from_memory() -> None:
    """A decoding step reads every weight once: past the target's cache, each byte costs ``stream_ns_per_byte`` more
    (the breakdown's ``stream``).  An Embedding reads the rows it gathers, not its table: neither its traffic nor the
    weight bytes count the whole table."""
    g = Graph("decode-step")
    ids = g.input("ids", (1, 1), "i64")
    h = g.embedding(g.param("table", (50_000, 256)), ids)
    for k in range(4):
        h = g.matmul(h, g.param(f"w{k}", (256, 1024) if k % 2 == 0 else (1024, 256)))
    g.set_outputs([h])
    weights = 4 * (256 * 1024 + 1024 * 256 + 256 * 1024 + 1024 * 256)  # the four MatMuls' weights, not the table
    base = calibrations.target()
    near, far = base.replace(stream_ns_per_byte=0.05, cache_bytes=1 << 20), base.replace(stream_ns_per_byte=0.05,
                                                                                          cache_bytes=1 << 30)
    p_near, p_far = profile(g, near), profile(g, far)
    past = (weights - (1 << 20)) * 0.05
    assert p_near.weight_bytes == weights and p_near.breakdown()["stream"] == pytest.approx(past)
    assert p_far.breakdown()["stream"] == 0.0 and p_near.ns - p_far.ns == pytest.approx(past)
    embedding = next(n for n in g.nodes if n.op == "Embedding")
    cost = node_cost(embedding.spec, embedding.attrs, [g.node(i).type for i in embedding.inputs], embedding.type)
    assert cost.traffic_bytes == 1024 + 8 + 1024  # one row of 256 floats read, the id, the row written


def test_the_score_rows_a_mask_may_mask_are_priced_past_their_lines() -> None:
    """onnxruntime's softmax runs a row of scores whose keys a mask masks slower than an open one: every query row in
    every head of an attention exported as its Attention kernel with its mask input (MultiHeadAttention with a bias,
    BiasedAttention, KvCacheAttention), and every row of a Softmax of a mask's sum, costs ``masked_row_ns`` more (the
    breakdown's ``masked``); an attention without a mask or with a mask fixed when the session loads (a parameter),
    GroupQueryAttention (its mask exported as sequence lengths) and a Softmax of a product, none.  A calibration
    without the figure prices none."""
    b, s, h, d = 2, 16, 4, 16
    g = Graph("masked")
    x = g.input("x", (b, s, h * d))
    split = [g.input(name, (b, h, s, d)) for name in ("q", "k", "v")]
    step = [g.input(name, (b, h, 1, d)) for name in ("q1", "k1", "v1")]
    mask, step_mask = g.input("mask", (b, 1, s, s)), g.input("step_mask", (b, 1, 1, s + 1))
    nodes = {
        "mha masked": g.multi_head_attention(x, x, x, mask, heads=h, scale=d**-0.5),
        "mha open": g.multi_head_attention(x, x, x, heads=h, scale=d**-0.5),
        "mha fixed mask": g.multi_head_attention(x, x, x, g.param("open", (b, 1, s, s)), heads=h, scale=d**-0.5),
        "biased": g.biased_attention(*split, mask, scale=d**-0.5),
        "cached": g.kv_cache_attention(*step, split[1], split[2], step_mask, scale=d**-0.5),
        "gqa": g.group_query_attention(g.input("q2", (b, 1, h * d)), g.input("k2", (b, 1, h * d)),
                                       g.input("v2", (b, 1, h * d)), split[1], split[2], step_mask, heads=h,
                                       kv_heads=h, scale=d**-0.5),
        "softmax of a sum": g.softmax(g.add(g.matmul(split[0], g.transpose(split[1], perm=(0, 1, 3, 2))), mask)),
        "softmax of a product": g.softmax(g.matmul(split[0], g.transpose(split[1], perm=(0, 1, 3, 2)))),
    }
    g.set_outputs([g.get(n, index=0) if g.node(n).op in ("KvCacheAttention", "GroupQueryAttention") else n
                   for n in nodes.values()])
    counted = {name: masked_rows(g.node(n).spec, g.node(n).attrs, [g.node(i).op for i in g.node(n).inputs],
                                 g.node(n).type) for name, n in nodes.items()}
    assert counted == {"mha masked": b * s * h, "mha open": 0, "mha fixed mask": 0, "biased": b * h * s,
                       "cached": b * h, "gqa": 0,
                       "softmax of a sum": b * h * s, "softmax of a product": 0}
    base = calibrations.target()
    priced, unpriced = profile(g, base.replace(masked_row_ns=90.0)), profile(g, base)
    assert priced.masked_rows == 3 * 128 + 8 and priced.breakdown()["masked"] == 392 * 90.0
    assert unpriced.breakdown()["masked"] == 0.0 and priced.ns - unpriced.ns == pytest.approx(392 * 90.0)


def test_the_masked_rows_probe_is_the_difference_over_the_rows_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe runs its chain with open masks and with a key masked in every row, in that order, and takes the
    difference of the two runs' typical times over the rows masked: 8 copies of 2 x 16 queries in 4 heads."""
    rows = 8 * 2 * 16 * 4
    fed: list[np.ndarray] = []

    def fake_run_times(runs: list, budget_s: float, min_runs: int, threads: int) -> list[list[int]]:
        fed.extend(runs)
        return [[50_000] * min_runs, [50_000 + 84 * rows] * min_runs]

    monkeypatch.setattr(calibrate_module, "run_times", fake_run_times)
    assert calibrate_module.masked_rows(1, 0.0) == 84.0 and len(fed) == 2


# --- decisions follow the calibration at the model's shape ------------------------------------------------


def _residual_norm(shape: tuple[int, ...]) -> Graph:
    g = Graph("residual-norm")
    x, r = g.input("x", shape), g.input("r", shape)
    width = shape[-1]
    g.set_outputs([g.layer_norm(g.add(x, r), g.param("g", (width,)), g.param("b", (width,)))])
    rng = np.random.default_rng(0)
    g.weights = {p.name: rng.standard_normal(p.shape).astype(np.float32) for p in g.params}
    return g


# SkipLayerNormalization (FusedResidualLN, and FusedAddLayerNorm which also returns the sum): a cheaper launch
# than Add then LayerNormalization, but three times their cost per byte.
SKIP_CHEAP_LAUNCH = {"FusedResidualLN": OpRate(800.0, 0.3, 0.0), "FusedAddLayerNorm": OpRate(800.0, 0.3, 0.0),
                     "Add": OpRate(1_000.0, 0.1, 0.0), "LayerNorm": OpRate(1_000.0, 0.1, 0.0)}
SKIP_OPS = ("FusedResidualLN", "FusedAddLayerNorm")


@pytest.mark.parametrize(("shape", "fused"), [((1, 4, 16), True), ((1, 128, 768), False)])
def test_skip_layer_normalization_is_taken_where_the_calibration_says_it_is_faster(shape: tuple[int, ...],
                                                                                 fused: bool) -> None:
    """Fused at a tiny shape, where its cheaper launch wins; Add + LayerNormalization at BERT-base's, where the
    fused kernel's bytes cost more.  The export writes what was chosen."""
    target = calibrations.target(SKIP_CHEAP_LAUNCH)
    opt, report = optimize_with_report(_residual_norm(shape), target, verify=True)
    counts = opt.op_counts()
    assert (counts["FusedResidualLN"], counts["FusedAddLayerNorm"], counts["LayerNorm"]) == (
        (1, 0, 0) if fused else (0, 0, 1))
    written = {n.op_type for n in export_model(opt).graph.node}
    assert ("SkipLayerNormalization" in written) == fused and ("LayerNormalization" in written) != fused
    assert report.profile_after.ns <= report.profile_before.ns


def test_skip_layer_normalization_is_left_out_where_it_is_slower_at_every_size() -> None:
    target = calibrations.target({op: OpRate(5_000.0, 0.3, 0.0) for op in SKIP_OPS})
    for shape in ((1, 4, 16), (1, 128, 768)):
        counts = optimize_with_report(_residual_norm(shape), target)[0].op_counts()
        assert (counts["FusedResidualLN"], counts["FusedAddLayerNorm"], counts["LayerNorm"]) == (0, 0, 1)


def _projection(shape: tuple[int, ...], act: str) -> Graph:
    """x @ w + b [+ GELU], x [batch, tokens, width]: a layer's output projection or its FFN's first half."""
    g = Graph("projection")
    width = shape[-1]
    y = g.add(g.matmul(g.input("x", shape), g.param("w", (width, width))), g.param("b", (width,)))
    g.set_outputs([g.gelu(y) if act == "gelu" else y])
    rng = np.random.default_rng(0)
    g.weights = {p.name: (rng.standard_normal(p.shape) * 0.1).astype(np.float32) for p in g.params}
    return g


def test_each_epilogue_of_a_biased_matmul_is_priced_by_its_own_line() -> None:
    """FusedMatMulBiasAct is exported as Gemm without an epilogue and as MatMul + BiasGelu with a GELU: a line per
    epilogue (``FusedMatMulBiasAct.none``, ``.gelu``) prices each.  With Gemm cheaper than MatMul + Add and
    MatMul + BiasGelu dearer than Gemm + Gelu, the GELU projection is a Gemm then a Gelu."""
    target = calibrations.target({"FusedMatMulBiasAct.none": OpRate(500.0, 0.1, 0.01),
                                  "FusedMatMulBiasAct.gelu": OpRate(1e6, 0.1, 0.01)})
    for act in ("none", "gelu"):
        opt, _ = optimize_with_report(_projection((2, 16, 64), act), target, verify=True)
        assert [(n.op, n.attrs.get("act")) for n in opt.nodes if n.op in ("FusedMatMulBiasAct", "MatMul", "Add",
                                                                          "Gelu")] == (
            [("FusedMatMulBiasAct", "none")] + ([("Gelu", None)] if act == "gelu" else []))
    with pytest.raises(ValueError, match=r"rates name unknown op\(s\) or kind\(s\) \['Add.none'\]"):
        calibrations.target({"Add.none": OpRate(1.0, 0.0, 0.0)})


@pytest.mark.parametrize("shape", [(2, 16, 64), (1, 128, 768)])
def test_the_shipped_calibration_takes_gemm_for_a_biased_matmul_with_onnxruntime_parity(shape: tuple[int, ...]) -> None:
    """At a tiny model's and at BERT-base's shape onnxruntime runs a 3-D MatMul + bias Add as the Gemm it makes of
    it when the session loads (``benchmarks/fused_vs_parts.py``: 1.00 and 0.99 measured): priced with one GEMM FLOP
    rate, the shipped calibration takes the one-node Gemm, which runs in onnxruntime as the graph does."""
    g = _projection(shape, "none")
    opt, report = optimize_with_report(g, TARGETS["onnxruntime"])
    assert opt.op_counts()["FusedMatMulBiasAct"] == 1 and "MatMul" not in opt.op_counts()
    assert report.profile_after.ns < report.profile_before.ns
    written = export_model(opt)
    assert [n.op_type for n in written.graph.node if n.op_type not in ("Reshape", "Identity")] == ["Gemm"]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    want = (x @ g.weights["w"] + g.weights["b"]).astype(np.float32)
    got = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-4)


def test_the_shipped_calibration_takes_the_cached_attention_for_a_toy_grouped_query_step() -> None:
    """A GQA decoding step as sdpa writes it (the query grouped per key head) at hidden 16, 4 heads over 2 key heads,
    after 7 cached tokens: the shipped calibration takes KvCacheAttention (one Attention with past) over
    BiasedAttention on the grouped query with its two cache Concats, which onnxruntime runs 1.06 to 1.09 times
    slower (the two timed in turn, one thread); the export computes what the step does."""
    model = decode_step(7, heads=4, kv_heads=2, rope=True, concat_axis=-2, hidden=16, grouped_query=True)
    opt, _ = optimize_with_report(import_model(model), TARGETS["onnxruntime"], rules=onnx_rules())
    counts = opt.op_counts()
    assert (counts["KvCacheAttention"], counts.get("BiasedAttention", 0), counts.get("Concat", 0)) == (1, 0, 0)
    rng = np.random.default_rng(0)
    inputs = {"hidden_states": rng.standard_normal((2, 1, 16)).astype(np.float32),
              "attention_mask": np.ones((2, 8), np.int64),
              **{f"past_key_values.0.{kv}": rng.standard_normal((2, 2, 7, 4)).astype(np.float32)
                 for kv in ("key", "value")}}
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
                 for m in (model, export_model(opt)))
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


def _attention_block(batch: int, seq: int) -> Graph:
    heads, hd = 4, 8
    h = heads * hd
    g = Graph()
    hidden, mask = g.input("hidden", (batch, seq, h)), g.input("attention_mask", (batch, seq))
    qkv = g.add(g.matmul(hidden, g.param("qkv_w", (h, 3 * h))), g.param("qkv_b", (3 * h,)))
    q, k, v = (g.narrow(qkv, axis=2, start=s, length=h) for s in (0, h, 2 * h))
    attn = g.attention(q, k, v, mask, heads=heads, mask="custom")
    g.set_outputs([g.add(g.matmul(attn, g.param("out_w", (h, h))), g.param("out_b", (h,)))])
    return g


@pytest.mark.parametrize(("block", "fused"), [(OpRate(1_000.0, 0.0, 0.001), True), (OpRate(1e7, 0.1, 0.01), False)])
def test_the_attention_block_follows_its_measured_cost_at_any_token_count(block: OpRate, fused: bool) -> None:
    """On onnxruntime no token bound guards FusedAttentionBlock: at 16 x 128 tokens (past the seed's 64) it is
    taken when its line is cheaper than its parts', and left out when dearer."""
    target = calibrations.target({"FusedAttentionBlock": block})
    opt, _ = optimize_with_report(_attention_block(16, 128), target)
    assert opt.op_counts().get("FusedAttentionBlock", 0) == int(fused)


def test_the_token_bound_stays_a_user_override_and_the_unmeasured_presets_keep_the_seeds() -> None:
    cheap = calibrations.target({"FusedAttentionBlock": OpRate(1_000.0, 0.0, 0.001)})
    assert "FusedAttentionBlock" not in optimize_with_report(_attention_block(1, 4), cheap,
                                                             attention_block_max_tokens=3)[0].op_counts()
    assert {name: t.attention_block_max_tokens for name, t in TARGETS.items()} == {
        "cpu": 64, "cuda": 64, "metal": 64, "wgpu": 64, "onnxruntime": None}
    assert optimize_with_report(_attention_block(16, 128), "cpu")[0].op_counts().get("FusedAttentionBlock", 0) == 0
    with pytest.raises(TypeError, match=r"attention_block_max_tokens must be an int, got '8' \(str\)"):
        optimize_with_report(_attention_block(1, 4), cheap, attention_block_max_tokens="8")


# --- measured latency in the report ------------------------------------------------------------------------


def test_the_report_prints_the_measured_latency_beside_the_prediction() -> None:
    """Timing values are not asserted: only that both graphs were run and reported with the ratio."""
    g = _residual_norm((2, 16, 64))
    opt, report = optimize_with_report(g, calibrations.target())
    measured = measure_report(report, g, opt, runs=3, budget_s=0.0)
    assert report.measured is measured and measured.before_ns > 0 and measured.after_ns > 0
    line = next(line for line in str(report).splitlines() if line.startswith("measured: "))
    assert re.fullmatch(r"measured: before [\d.]+ (ns|us|ms) \(predicted [\d.]+ (ns|us|ms), [\d.]+x\), after "
                        r"[\d.]+ (ns|us|ms) \(predicted [\d.]+ (ns|us|ms), [\d.]+x\); onnxruntime [\d.]+ CPU, 1 "
                        r"thread\(s\), ORT_ENABLE_ALL, median of \d+ runs by thread CPU time", line), line
    assert "priced by: onnxruntime calibration of fixture (fixture; made by: tests/calibrations.py)" in str(report)
    # the predictions beside the measurement are the exports' prices (static shapes: the profiles, no shape nodes)
    assert measured.predicted_before_ns == pytest.approx(price_export(g, calibrations.target()).ns)
    assert measured.predicted_after_ns == pytest.approx(price_export(opt, calibrations.target()).ns)
    assert measured.predicted_after_ns == pytest.approx(report.profile_after.ns)
    assert f"(predicted {format_ns(measured.predicted_after_ns)}, " in line
    assert report.to_dict()["measured"] == {"before_ns": measured.before_ns, "after_ns": measured.after_ns,
                                            "how": measured.how, "predicted_before_ns": measured.predicted_before_ns,
                                            "predicted_after_ns": measured.predicted_after_ns}
    latency = measure_latency(g, runs=2, budget_s=0.0)  # one block: its first run untimed, the others timed
    assert latency.runs == BLOCK - 1 and 0 < latency.fastest_ns <= latency.ns


def test_cli_measure_prints_predicted_and_measured(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    g = _residual_norm((2, 16, 64))
    g.save(tmp_path / "g.json")
    mine = dataclasses.replace(calibrations.calibration(), machine=cal.machine("onnxruntime"))
    mine.save(cal.cache_path("onnxruntime", tmp_path / "c"))
    assert main(["optimize", str(tmp_path / "g.json"), "--target", "onnxruntime", "--measure", "--cache",
                 str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    path = cal.cache_path("onnxruntime", tmp_path / "c")
    assert (f"priced by: onnxruntime calibration of {cal.machine('onnxruntime')['cpu']} ({path}; made by: "
            "tests/calibrations.py)") in out
    assert re.search(r"^measured: before .* by thread CPU time$", out, re.MULTILINE)
    (tmp_path / "bad").mkdir()
    cal.cache_path("onnxruntime", tmp_path / "bad").parent.mkdir(parents=True)
    cal.cache_path("onnxruntime", tmp_path / "bad").write_text("{")
    assert main(["optimize", str(tmp_path / "g.json"), "--target", "onnxruntime", "--cache",
                 str(tmp_path / "bad")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {cal.cache_path('onnxruntime', tmp_path / 'bad')}: not JSON")


# --- layering -------------------------------------------------------------------------------------------------


def test_the_cost_package_imports_no_front_end() -> None:
    """cost/ prices what targets declare; the ONNX front end maps MIR ops to ONNX and measures: never the other
    way round."""
    imported = set()
    for path in (SRC / "cost").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                imported.add("." * node.level + (node.module or ""))
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    assert not {name for name in imported if "frontends" in name or name.startswith(("onnx", "rlx_egraph.onnx"))}
    assert "..ir.registry" in imported  # the check sees the package's own imports


def test_cli_calibrate_and_measure_without_onnxruntime_say_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    g = _residual_norm((2, 4, 8))
    g.save(tmp_path / "g.json")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert main(["calibrate"]) == 2
    assert capsys.readouterr().err == ("error: calibrate runs onnxruntime: install the onnx extra (pip install "
                                       "'rlx-egraph[onnx]')\n")
    assert main(["optimize", str(tmp_path / "g.json"), "--measure"]) == 2
    assert capsys.readouterr().err.endswith("error: --measure runs onnxruntime: install the onnx extra (pip "
                                            "install 'rlx-egraph[onnx]')\n")
