"""onnxruntime's transformer optimizer as a worker for ``benchmarks/corpus.py`` (run under ``--ort-python``).

The optimizer needs sympy, which onnxruntime does not install, so the corpus comparison starts this script in
an environment that has both.  Each line on stdin is one JSON job: ``input`` (an .onnx path), ``model_type``,
``num_heads``, ``hidden_size``, ``external`` (write the weights beside the output) and ``outputs`` (opt_level
-> output path).  Each job gets one JSON line on stdout: opt_level -> null when the output was written, else
the optimizer's error in one line.  What the optimizer logs goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys

from onnxruntime.transformers.optimizer import optimize_model


def run(job: dict) -> dict[str, str | None]:
    """Every level of one job."""
    results: dict[str, str | None] = {}
    for level, out in job["outputs"].items():
        try:
            with contextlib.redirect_stdout(sys.stderr):
                model = optimize_model(job["input"], model_type=job["model_type"], num_heads=job["num_heads"],
                                       hidden_size=job["hidden_size"], opt_level=int(level))
                model.save_model_to_file(out, use_external_data_format=job["external"])
            results[level] = None
        except Exception as exc:  # the optimizer's failure is a result, reported by the comparison
            lines = [line for line in str(exc).splitlines() if line.strip()]
            results[level] = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
    return results


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
