"""``python -m benchmarks.memory_plan``: arena size and planning time of the memory plan.

Each example model is compiled at several sizes, with and without the
optimizer (the graph as built has more and more varied buffers); the table
shows the arena
against its lower bound (fixed sections plus the largest total of aligned
scratch bytes live at one step) and against no reuse (every scratch buffer
on its own), the scratch section alone against its lower bound, and the
planning time (best of three) per node.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlx_egraph import examples
from rlx_egraph.cli.main import format_table
from rlx_egraph.compile import compile as compile_graph
from rlx_egraph.compile.plan import Plan, Section, plan_memory
from rlx_egraph.cost.targets import TARGETS
from rlx_egraph.ir.graph import Graph

# model -> (the size argument of its builder, the sizes benchmarked)
SIZES: dict[str, tuple[str, tuple[int, ...]]] = {
    "mlp": ("layers", (1, 8, 32, 64)),
    "llama": ("layers", (1, 8, 32, 64)),
    "bert": ("layers", (1, 8, 32, 64)),
    "gpt2": ("layers", (1, 8, 32, 64)),
    "conv_block": ("size", (16, 32, 64, 128)),
    "synthetic": ("nodes", (2_000, 20_000)),
}
REPEATS = 3


@dataclass(frozen=True)
class Row:
    case: str
    graph: str  # "optimized" or "as-built"
    nodes: int
    steps: int
    scratch_buffers: int
    arena: int
    lower_bound: int
    no_reuse: int
    scratch: int
    scratch_lower_bound: int
    plan_seconds: float

    @property
    def over_bound_pct(self) -> float:
        return 100.0 * (self.arena - self.lower_bound) / self.lower_bound

    @property
    def scratch_over_bound_pct(self) -> float:
        return 100.0 * (self.scratch - self.scratch_lower_bound) / self.scratch_lower_bound \
            if self.scratch_lower_bound else 0.0


def measure(name: str, graph: Graph, target: str, optimize: bool) -> Row:
    """Compile ``graph`` for ``target`` and time planning its result."""
    compiled = compile_graph(graph, target, optimize=optimize).graph
    seconds, plan = min((_timed(lambda: plan_memory(compiled, target)) for _ in range(REPEATS)), key=lambda t: t[0])
    return Row(name, "optimized" if optimize else "as-built", len(compiled), len(plan.steps),
               sum(b.section is Section.SCRATCH for b in plan.buffers),
               plan.arena_bytes, plan.lower_bound_bytes, plan.no_reuse_bytes, plan.scratch_bytes,
               plan.scratch_lower_bound_bytes, seconds)


def _timed(make: Callable[[], Plan]) -> tuple[float, Plan]:
    start = time.perf_counter()
    plan = make()
    return time.perf_counter() - start, plan


def cases(models: Sequence[str], quick: bool) -> list[tuple[str, Callable[[], Graph]]]:
    out = []
    for model in models:
        arg, sizes = SIZES[model]
        for size in sizes[:2] if quick else sizes:
            out.append((f"{model} {arg}={size}", lambda m=model, a=arg, s=size: getattr(examples, m)(**{a: s})))
    return out


def table(rows: Sequence[Row]) -> str:
    header = ("case", "graph", "nodes", "steps", "scratch bufs", "arena KiB", "lower KiB", "no reuse KiB", "over %",
              "scratch KiB", "scratch lower KiB", "scratch over %", "plan ms", "us/node")
    body = [(r.case, r.graph, str(r.nodes), str(r.steps), str(r.scratch_buffers), f"{r.arena / 1024:,.1f}",
             f"{r.lower_bound / 1024:,.1f}", f"{r.no_reuse / 1024:,.1f}", f"{r.over_bound_pct:.2f}",
             f"{r.scratch / 1024:,.1f}", f"{r.scratch_lower_bound / 1024:,.1f}", f"{r.scratch_over_bound_pct:.2f}",
             f"{r.plan_seconds * 1e3:.1f}", f"{r.plan_seconds * 1e6 / r.nodes:.0f}") for r in rows]
    return format_table(header, body, "<<" + ">" * (len(header) - 2))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_plan", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SIZES), help=f"default: {','.join(SIZES)}")
    parser.add_argument("--target", default="cpu", choices=list(TARGETS))
    parser.add_argument("--quick", action="store_true", help="the two smallest sizes of each model")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - SIZES.keys())
    if unknown or not models:
        parser.error(f"--models must be among {','.join(SIZES)}, got {args.models!r}")
    print(f"memory plans on {args.target}, alignment 64; over % = arena above its lower bound")
    print(table([measure(name, graph, args.target, optimize) for name, build in cases(models, args.quick)
                 for graph in [build()] for optimize in (True, False)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
