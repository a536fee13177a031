"""Measure a graph's latency in onnxruntime, the way the ``onnxruntime`` target's calibration times its samples.

:func:`measure_latency` exports the graph (:func:`~.exporter.export_model`; parameters without a value get
seeded random ones), runs it in onnxruntime's CPU provider at ``ORT_ENABLE_ALL`` (:data:`~.calibrate.LEVEL`:
onnxruntime's default, at which the calibration measures its samples) with ``threads`` intra-op threads on
seeded inputs (:func:`~rlx_egraph.kernels.interpreter.random_value`), and reports the median of its runs (and
the fastest), timed by :func:`~.calibrate.run_clock` (one thread: the calling thread's CPU time, which the
machine's load does not change; more: wall-clock time).  :func:`measure_report` measures a report's input and
optimized graphs side by side (runs in turn) and records both in the report, which then prints them beside the
predictions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import onnxruntime as ort

from ...ir.graph import Graph
from ...ir.specialize import specialize_graph
from ...kernels.interpreter import random_value
from ...report import OptimizeReport
from ...report.optimize_report import Measured
from .calibrate import LEVEL, run_times, typical
from .exporter import export_model
from .pricing import price_export

BLOCK = 5  # runs of one graph in a row when graphs are timed in turn; the first pays for the others' caches


@dataclass(frozen=True)
class Latency:
    """A graph's measured latency: the median (``ns``) and the fastest of ``runs`` runs, in ns."""

    ns: float
    fastest_ns: float
    runs: int
    threads: int

    @property
    def how(self) -> str:
        clock = "thread CPU time" if self.threads == 1 else "wall-clock time"
        return (f"onnxruntime {metadata.version('onnxruntime')} CPU, {self.threads} thread(s), {LEVEL}, "
                f"median of {self.runs} runs by {clock}")


def _runnable(graph: Graph, threads: int,
              dims: Mapping[str, int] | None = None) -> tuple[ort.InferenceSession, dict[str, np.ndarray]]:
    """An onnxruntime session of ``graph`` exported (parameters lacking a value get seeded random ones), and
    seeded feeds for its inputs (its symbolic dims bound by ``dims``, which may name others too)."""
    if any(p.name not in graph.weights for p in graph.params):
        filled = graph.copy()
        filled.weights = {p.name: graph.weights.get(p.name, random_value(graph, p)) for p in graph.params}
        graph = filled
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVEL)
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(export_model(graph).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    fed = specialize_graph(graph, {s: n for s, n in (dims or {}).items() if s in graph.symbols}) if graph.symbols \
        else graph
    return session, {n.name: random_value(fed, n) for n in fed.inputs}


def measure_latencies(graphs: list[Graph], threads: int = 1, runs: int = 20, budget_s: float = 2.0,
                      warmup: int = 2, dims: Mapping[str, int] | None = None) -> list[Latency]:
    """The latency of each graph, runs in turn (:data:`BLOCK` runs of each in a row, the first not timed, then
    the next graph), ``runs`` timed runs at least and more while within ``budget_s`` seconds; a graph with
    symbolic dims runs at the sizes ``dims`` gives them."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {threads!r}")
    sessions = [_runnable(g, threads, dims) for g in graphs]
    times = run_times([lambda s=s, f=f: s.run(None, f) for s, f in sessions], budget_s, runs, threads,
                      max_runs=10 * runs, warmup=warmup, block=BLOCK)
    return [Latency(typical(t), float(min(t)), len(t), threads) for t in times]


def measure_latency(graph: Graph, threads: int = 1, runs: int = 20, budget_s: float = 2.0) -> Latency:
    """``graph``'s latency in onnxruntime (module docs)."""
    return measure_latencies([graph], threads, runs, budget_s)[0]


def measure_report(report: OptimizeReport, original: Graph, optimized: Graph, threads: int = 1, runs: int = 20,
                   budget_s: float = 2.0) -> Measured:
    """Measure ``original`` (the graph given to optimize) and ``optimized`` (the graph it returned) side by side
    and record the result as ``report.measured``, with each one's prediction as exported (:func:`~.pricing.
    price_export`, which the report prints beside the measurement); returns it."""
    before, after = measure_latencies([original, optimized], threads, runs, budget_s)
    priced = [price_export(g, p.target) if p is not None else None
              for g, p in ((original, report.profile_before), (optimized, report.profile_after))]
    report.measured = Measured(before.ns, after.ns, before.how, *(p.ns if p is not None else None for p in priced))
    return report.measured


__all__ = ["BLOCK", "LEVEL", "Latency", "measure_latencies", "measure_latency", "measure_report"]
