"""``python -m benchmarks.fallback_scaling``: nodes vs seconds of the fallback engine.

For each size it builds ``examples.synthetic(n)`` (not timed), runs the
fallback engine and prints the nodes before and after, the seconds per phase
(load = opening the graph and compiling the rules, one column per stage,
finish = the new Graph and provenance), the total, the microseconds per input
node (flat when the engine is linear), the CPU seconds, the peak
memory and the predicted cost before and after.  Every size runs in a freshly
spawned process, so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import resource
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from rlx_egraph import examples
from rlx_egraph.cli.main import format_table
from rlx_egraph.cost.targets import TARGETS
from rlx_egraph.engines.fallback.engine import FallbackLimits, load, run
from rlx_egraph.rules import STAGES

SIZES = (1_000, 10_000, 100_000, 1_000_000)
PHASES = ("load", "replay", *STAGES, "finish")


def measure(nodes: int, target: str) -> dict[str, float]:
    """One size, in the calling process."""
    compiled = load()
    graph = examples.synthetic(nodes)
    wall, cpu = time.perf_counter(), time.process_time()
    result = run(graph, compiled, target, FallbackLimits(max_seconds=math.inf))  # measure, never stop early
    row = {"nodes": float(len(graph)), "after": float(len(result.graph)),
           "total": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
           "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux reports KiB
           "before_ns": result.stats.cost_before_ns, "after_ns": result.stats.cost_after_ns,
           "commits": float(sum(result.stats.commits.values()))}
    row.update({p: result.stats.phases.get(p, 0.0) for p in PHASES})
    return row


def table(rows: Sequence[dict[str, float]]) -> str:
    header = ("nodes", "-> nodes", *(f"{p} s" for p in PHASES), "total s", "us/node", "cpu s", "peak MB", "commits",
              "before ns", "after ns")
    body = [(f"{r['nodes']:,.0f}", f"{r['after']:,.0f}", *(f"{r[p]:.2f}" for p in PHASES), f"{r['total']:.2f}",
             f"{r['total'] / r['nodes'] * 1e6:.0f}", f"{r['cpu']:.2f}", f"{r['peak_mb']:.0f}", f"{r['commits']:,.0f}",
             f"{r['before_ns']:,.0f}", f"{r['after_ns']:,.0f}") for r in rows]
    return format_table(header, body, ">" * len(header))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fallback_scaling", description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=list(SIZES),
                        help=f"node counts (default: {' '.join(map(str, SIZES))})")
    parser.add_argument("--target", default="cpu", choices=list(TARGETS))
    args = parser.parse_args(argv)
    rows = []
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        for n in args.sizes:
            row = pool.submit(measure, n, args.target).result()
            print(f"{n:,} nodes: {row['total']:.2f} s", file=sys.stderr, flush=True)
            rows.append(row)
    print(f"fallback engine on examples.synthetic(n), target {args.target}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
