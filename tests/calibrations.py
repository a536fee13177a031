"""Calibration fixtures: ``onnxruntime`` targets priced by made-up lines, so that tests assert the cost model's
decisions without timing this machine."""

from __future__ import annotations

from collections.abc import Mapping

from rlx_egraph.cost.calibration import Calibration, OpRate
from rlx_egraph.cost.targets import Target, onnxruntime_target

# Lines every fixture shares: one launch of a kernel costs 1 us, bytes move at 10 B/ns, matmuls run 100 FLOP/ns.
BASE = {kind: OpRate(1_000.0, 0.1, 0.0) for kind in ("elementwise", "reduction", "norm", "layout", "attention")} | {
    "matmul": OpRate(1_000.0, 0.1, 0.01), "fused": OpRate(1_000.0, 0.1, 0.01)}


def calibration(rates: Mapping[str, OpRate] | None = None, run_ns: float = 5_000.0) -> Calibration:
    """A calibration with :data:`BASE` lines and ``rates`` over them."""
    return Calibration("onnxruntime", {"cpu": "fixture"}, "tests/calibrations.py", 1, run_ns, 1_000.0, 10.0,
                       100.0, {**BASE, **(rates or {})}, (), "fixture")


def target(rates: Mapping[str, OpRate] | None = None, run_ns: float = 5_000.0) -> Target:
    """The onnxruntime target priced by :func:`calibration`."""
    return onnxruntime_target(calibration(rates, run_ns))


def uniform() -> Target:
    """An onnxruntime target with one set of figures for every op (500 ns a launch, 5 B/ns, 17 FLOP/ns, no run
    cost), a Reshape free (a view) and no SkipLayerNormalization kernel (FusedResidualLN and FusedAddLayerNorm
    unsupported): the target the tests of the rules and the engines assert their decisions and search counts
    on, fixed whatever a calibration measures."""
    target = onnxruntime_target(Calibration("onnxruntime", {"cpu": "fixture"}, "tests/calibrations.py", 1, 0.0,
                                            500.0, 5.0, 17.0, {"Reshape": OpRate(0.0, 0.0, 0.0)}, (), "fixture"))
    return target.replace(unsupported=target.unsupported | {"FusedResidualLN", "FusedAddLayerNorm"})


UNIFORM = uniform()
