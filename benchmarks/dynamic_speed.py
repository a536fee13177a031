"""``python -m benchmarks.dynamic_speed CORPUS/tiny``: seconds to import, optimize and export a dynamic export.

For each export picked (by default the 2-layer prefill exports of BERT and Llama, eager and sdpa, by both
exporters, with dynamic axes) it runs ``import_model`` (symbols kept), ``optimize(target="onnxruntime",
dim_hints=...)`` at the export's hint sizes and ``export_model``, ``--repeat`` times in this process, and prints
per export the wall seconds of each step and of the optimizer's phases (its INFO log lines: encode, saturate,
extract, decode, regions), the median over the repeats, with the first run (which also parses the rules and
fills the process's caches) apart.  The target: the whole under 1 s.  Run from the repository root with the
project installed; the machine's load is printed with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import onnx

from rlx_egraph import optimize
from rlx_egraph.log import LOGGER
from rlx_egraph.onnx import export_model, import_model

DEFAULT = ("bert_dynamo18_eager", "bert_dynamo18_sdpa", "bert_torchscript17_eager", "bert_torchscript17_sdpa",
           "llama_dynamo18_eager", "llama_dynamo18_sdpa", "llama_torchscript17_eager", "llama_torchscript17_sdpa")
TARGET = 1.0
STEPS = ("import", "optimize", "export")


class PhaseTimes(logging.Handler):
    """The optimizer's phases and their seconds, from its INFO lines (``optimize: <phase> <seconds> s``)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.phases: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if record.msg.startswith("%s: %s %.3f s") and isinstance(args, tuple) and args[0] == "optimize":
            self.phases[args[1]] = self.phases.get(args[1], 0.0) + float(args[2])


@contextlib.contextmanager
def phase_log() -> Iterator[PhaseTimes]:
    handler, level = PhaseTimes(), LOGGER.level
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)


def once(path: Path, hints: dict[str, int]) -> dict[str, float]:
    """Seconds of each step and optimizer phase of one import, optimize and export of ``path``."""
    proto = onnx.load(str(path))
    out: dict[str, float] = {}
    with phase_log() as log:
        t0, cpu = time.perf_counter(), time.process_time()
        graph = import_model(proto)
        t1 = time.perf_counter()
        optimized = optimize(graph, target="onnxruntime", dim_hints=hints or None)
        t2 = time.perf_counter()
        export_model(optimized)
        t3 = time.perf_counter()
    out |= {"import": t1 - t0, "optimize": t2 - t1, "export": t3 - t2, "total": t3 - t0,
            "cpu": time.process_time() - cpu}
    out |= {f"  {name}": seconds for name, seconds in log.phases.items()}
    return out | {"  other": out["optimize"] - sum(log.phases.values())}  # the sentinels, the graph rebuilt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dynamic_speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a folder with a corpus.json (tiny)")
    parser.add_argument("--only", default=",".join(DEFAULT),
                        help="comma-separated file name prefixes: the dynamic prefill exports picked")
    parser.add_argument("--repeat", type=int, default=5, help="runs per export (default 5)")
    args = parser.parse_args(argv)
    manifest = args.folder / "corpus.json"
    if not manifest.is_file():
        parser.error(f"{args.folder}: no corpus.json (made by scripts/export_hf_models.py)")
    only = [s for s in args.only.split(",") if s]
    entries = [e for e in json.loads(manifest.read_text())["exports"] if e["axes"] == "dynamic"
               and e["kind"] == "prefill" and any(e["file"].startswith(f"{s}_") for s in only)]
    load = os.getloadavg()[0]
    lines = [f"import + optimize + export, seconds (wall), {os.cpu_count()} cores, load {load:.1f}; "
             f"median of {args.repeat - 1} runs after the first, target < {TARGET:g} s", ""]
    misses = 0
    for entry in entries:
        runs = [once(args.folder / entry["file"], entry["hints"]) for _ in range(args.repeat)]
        first, rest = runs[0], runs[1:] or runs
        median = {k: statistics.median(r.get(k, 0.0) for r in rest) for k in rest[0]}
        misses += median["total"] >= TARGET
        lines.append(f"{entry['file']}: {median['total']:.3f} s ({'under' if median['total'] < TARGET else 'OVER'} "
                     f"{TARGET:g} s; CPU {median['cpu']:.3f} s; first run {first['total']:.3f} s)")
        lines += [f"  {k.strip():<10} {v:.3f}" if not k.startswith("  ") else f"    {k.strip():<8} {v:.3f}"
                  for k, v in median.items() if k not in ("total", "cpu")]
    lines.append(f"\n{len(entries) - misses} of {len(entries)} exports under {TARGET:g} s")
    with contextlib.suppress(BrokenPipeError):
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
