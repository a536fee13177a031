"""Host sync points: the ops whose value the host reads back count in the IO profile, and a profile can be asked
for the outputs the host actually reads."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_egraph import Graph, GraphError, evaluate, optimize_with_report
from rlx_egraph.cost import TARGETS, profile
from rlx_egraph.ir import Kind, op_spec


def loss_scaled_by_its_item() -> Graph:
    """``loss = mean((x @ w) ** 2)``; ``loss.item()`` read on the host, then the activations scaled by it."""
    g = Graph("item")
    x, w = g.input("x", (8, 32)), g.param("w", (32, 32))
    h = g.matmul(x, w)
    loss = g.mean_all(g.mul(h, h))
    g.set_outputs([g.mul(h, g.item(loss))])
    return g


def spectrum_and_peaks() -> Graph:
    """A [64, 256] spectrum and the indices of its peaks above a threshold (a dynamic-shape output)."""
    g = Graph("peaks")
    x = g.input("x", (64, 256))
    spectrum = g.exp(g.neg(g.mul(x, x)))
    peaks = g.non_zero(g.greater(spectrum, g.scalar(0.99)), count=32)
    g.set_outputs([spectrum, peaks])
    return g


def branch_on_a_norm() -> Graph:
    """Control that depends on a value: the host reads whether the norm is above 1 and goes on with one branch."""
    g = Graph("cond")
    x = g.input("x", (16, 16))
    big = g.greater(g.sum_all(g.mul(x, x)), g.scalar(1.0))
    g.set_outputs([g.relu(g.cond(big, g.tanh(x), g.neg(x)))])
    return g


@pytest.mark.parametrize("build, op", [(loss_scaled_by_its_item, "Item"), (spectrum_and_peaks, "NonZero"),
                                       (branch_on_a_norm, "Cond")])
def test_each_host_read_is_one_sync_point_priced_on_every_target(build, op: str) -> None:
    """design: IO cost model profile_graph_io and host_sync_op_kinds (a node of a host-sync kind adds a sync point;
    a sync costs roundtrip_ns, plus host_thunk_penalty_ns in the gate)."""
    g = build()
    assert op_spec(op).kind is Kind.HOST_SYNC
    for name, target in TARGETS.items():
        p = profile(g, name)
        assert p.sync_points == 1, name
        assert p.breakdown()["sync"] == target.roundtrip_ns + target.host_thunk_penalty_ns
        assert p.by_kind["host-sync"].nodes == 1 and p.by_kind["host-sync"].cost.syncs == 1
    assert profile(g, "cuda").breakdown()["sync"] == 120_000.0  # 20 us roundtrip + 100 us host-thunk penalty


def test_a_profile_for_the_outputs_the_host_reads() -> None:
    """design: IO cost model profile_graph_io_outputs ("peaks-only vs spectrum readback") and
    tests::peaks_fusion_saves_readback."""
    g = spectrum_and_peaks()
    spectrum, peaks = g.outputs
    both, only_peaks = profile(g, "wgpu"), profile(g, "wgpu", outputs=[peaks])
    assert (both.readback_bytes, only_peaks.readback_bytes) == (64 * 256 * 4 + 2 * 32 * 8, 2 * 32 * 8)
    assert (only_peaks.launches, only_peaks.sync_points, only_peaks.traffic_bytes) == (
        both.launches, both.sync_points, both.traffic_bytes)  # the same graph runs; the host reads less
    assert both.ns - only_peaks.ns == pytest.approx(64 * 256 * 4 / TARGETS["wgpu"].readback_bw)
    assert profile(g, "wgpu", outputs=[spectrum, spectrum]).readback_bytes == 64 * 256 * 4  # read once
    assert profile(g, "wgpu", outputs=[]).readback_bytes == 0
    with pytest.raises(GraphError, match=r"^no node 99 in graph 'peaks'$"):
        profile(g, "wgpu", outputs=[99])


def test_the_optimizer_keeps_every_sync_and_both_engines_price_it_alike() -> None:
    """design: IO cost model profile_graph_io (sync points are part of the profile every fusion is gated on)."""
    g = loss_scaled_by_its_item()
    runs = {engine: optimize_with_report(g, "cuda", engine=engine, verify=True) for engine in ("egglog", "fallback")}
    for opt, report in runs.values():
        assert opt.op_counts()["Item"] == 1
        assert report.profile_before.sync_points == report.profile_after.sync_points == 1
        assert report.parity.ok
    assert runs["egglog"][1].profile_after.ns == runs["fallback"][1].profile_after.ns
    assert "1 syncs" in str(runs["egglog"][1].profile_after)


def test_host_sync_values() -> None:
    """design: IO cost model host_sync_op_kinds (the ops computed on the host); their values as numpy gives them."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32) * 0.1
    spectrum, peaks = evaluate(spectrum_and_peaks(), {"x": x})
    found = np.array(np.nonzero(spectrum > 0.99))
    assert found.shape[1] > 32  # more peaks than the graph holds: the first 32 in row-major order
    np.testing.assert_array_equal(peaks, found[:, :32])
    (out,) = evaluate(branch_on_a_norm(), {"x": x[:16, :16]})
    np.testing.assert_array_equal(out, np.maximum(np.tanh(x[:16, :16]), 0))  # the norm is above 1
