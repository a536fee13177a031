"""How well a calibration's lines fit its samples, and how they predict sizes left out of the fit:
``python benchmarks/calibration_fit.py``.

For each line of the calibration (this machine's, else the shipped one; ``--file`` another), its five terms
(launch, per byte, per FLOP, per row, per matrix) and each of its samples' predicted / measured.  With
``--hold-out TAG...`` (a size as the sample labels write it, ``"2x80, 64"``), the lines are fitted again without the
samples of those sizes, once with the samples' rows and matrices and once without (the counts a line had before
rows and matrices were counted), and each held-out sample of ``--ops`` is priced by both fits: how far the lines
extend to shapes they were not fitted to.

    python benchmarks/calibration_fit.py --hold-out "2x80, 64" "32x16, 32" --ops QkvAttention LayerNorm Softmax

Needs no runtime: it reads the calibration file.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterable

from rlx_egraph.cost import calibration as cal


def refit(samples: Iterable[cal.Sample], counted: bool) -> cal.Calibration:
    """Lines fitted to ``samples`` (without their rows and matrices unless ``counted``)."""
    samples = [s if counted else dataclasses.replace(s, rows=0, matrices=0) for s in samples]
    return cal.Calibration.fitted("onnxruntime", samples, machine={}, command="", threads=1, run_ns=0.0,
                                  dispatch_ns=1.0, memory_bw=1.0, flops_per_ns=1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", help="a calibration file (default: this machine's, else the shipped one)")
    parser.add_argument("--hold-out", nargs="+", default=[], metavar="TAG", help="sizes left out of a second fit")
    parser.add_argument("--ops", nargs="+", default=[], help="ops whose held-out samples are priced (default: all)")
    args = parser.parse_args(argv)
    calibration = cal.read(args.file) if args.file else cal.load("onnxruntime")
    print(f"{calibration.describe()}\n")
    fitted = refit(calibration.samples, True)
    print(f"{'line':28s} {'launch ns':>9s} {'ns/byte':>8s} {'ns/FLOP':>8s} {'ns/row':>7s} {'ns/matrix':>9s}  "
          "predicted / measured per sample")
    for key in sorted(k for k in calibration.rates if any(s.key == k or cal._line_of(s.key) == k
                                                          for s in calibration.samples)):
        r = calibration.rates[key]
        ratios = [calibration.rates[key].ns(*s.counts) / s.ns for s in calibration.samples
                  if cal._line_of(s.key) == key and s.ns > 0]
        print(f"{key:28s} {r.launch_ns:9.0f} {r.ns_per_byte:8.4f} {r.ns_per_flop:8.5f} {r.ns_per_row:7.2f} "
              f"{r.ns_per_matrix:9.1f}  " + " ".join(f"{x:.2f}" for x in ratios))
    if fitted.rates != {k: v for k, v in calibration.rates.items() if k in fitted.rates}:
        print("\n(the file's lines differ from the lines this version fits to its samples)")
    if not args.hold_out:
        return 0
    held = tuple(f"[{tag}]" for tag in args.hold_out)
    train = [s for s in calibration.samples if not s.label.endswith(held)]
    fits = {counted: refit(train, counted) for counted in (False, True)}
    print(f"\nfitted without the samples of {', '.join(args.hold_out)}: predicted / measured")
    print(f"{'sample':52s} {'without rows, matrices':>22s} {'with':>6s}")
    for s in calibration.samples:
        if s.label.endswith(held) and s.ns > 0 and (not args.ops or s.key.partition('.')[0] in args.ops):
            line = cal._line_of(s.key)
            print(f"{s.label:52s} {fits[False].rates[line].ns(*s.counts[:3]) / s.ns:22.2f} "
                  f"{fits[True].rates[line].ns(*s.counts) / s.ns:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
