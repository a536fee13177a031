"""``python -m benchmarks.limits``: how far the e-graph grows, and what stops it.

Two tables, each case in its own spawned process (so peak MB is its own):

* shared-input matmuls: ``k`` matmuls of one input (plain, and linear layers
  with biases) for k in 8, 16, 32, 64: e-nodes, iterations, seconds, and the
  ops of the result (one wide matmul over one concatenation when it pays);
* limits: a sum of products over ``width`` inputs under user rules for the
  associativity and commutativity of Add and Mul, which never saturate, with
  ``max_enodes`` / ``max_seconds``: seconds, the largest e-graph after any
  iteration, peak MB and the stop reason.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from rlx_egraph.cli.main import format_table
from rlx_egraph.engines.egglog.rules import default_rule_dir
from rlx_egraph.ir import Graph
from rlx_egraph.optimize import optimize_with_report

# these measure the egglog engine itself (engine="auto" would fall back when a limit stops it)
egglog_engine = partial(optimize_with_report, engine="egglog")

SHARED_KS = (8, 16, 32, 64)
LIMIT_CASES: tuple[dict[str, Any], ...] = ({"max_enodes": 20_000}, {"max_seconds": 5.0}, {})

AC_RULES = """\
;; Associativity and commutativity of Add and Mul: they never saturate.
(rewrite (Add ?a ?b) (Add ?b ?a) :ruleset simplify :name "add-comm")
(rewrite (Add (Add ?a ?b) ?c) (Add ?a (Add ?b ?c)) :ruleset simplify :name "add-assoc")
(rewrite (Mul ?a ?b) (Mul ?b ?a) :ruleset simplify :name "mul-comm")
(rewrite (Mul (Mul ?a ?b) ?c) (Mul ?a (Mul ?b ?c)) :ruleset simplify :name "mul-assoc")
"""


def shared_input(k: int, bias: bool = False, rows: int = 16, width: int = 64, cols: int = 64) -> Graph:
    """``k`` matmuls of one input ``[rows, width]`` by ``[width, cols]`` weights (plus ``[cols]`` biases)."""
    g = Graph(f"shared_input_k{k}{'_bias' if bias else ''}")
    x = g.input("x", (rows, width))
    outs = []
    for i in range(k):
        y = g.matmul(x, g.param(f"w{i}", (width, cols)))
        outs.append(g.add(y, g.param(f"b{i}", (cols,))) if bias else y)
    g.set_outputs(outs)
    return g


def sum_of_products(width: int = 32, shape: tuple[int, ...] = (4, 8)) -> Graph:
    """``sum_i x_i * x_(i+1 mod width)`` over ``width`` inputs: a wide elementwise graph."""
    g = Graph(f"sum_of_products_{width}")
    xs = [g.input(f"x{i}", shape) for i in range(width)]
    total = g.mul(xs[0], xs[1])
    for i in range(1, width):
        total = g.add(total, g.mul(xs[i], xs[(i + 1) % width]))
    g.set_outputs([total])
    return g


def assoc_comm_rules(directory: Path) -> list[Path]:
    """The shipped rules plus :data:`AC_RULES` written to ``directory``."""
    path = directory / "assoc_comm.egg"
    path.write_text(AC_RULES)
    return [default_rule_dir(), path]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def shared_row(k: int, bias: bool) -> list[str]:
    """One row of the shared-input table (call it in a fresh process)."""
    start = time.perf_counter()
    og, rep = egglog_engine(shared_input(k, bias))
    ops = {op: n for op, n in sorted(og.op_counts().items()) if op not in ("Input", "Param")}
    return [str(k), "yes" if bias else "no", f"{rep.enodes:,}", str(len(rep.iterations)),
            f"{time.perf_counter() - start:.2f}", f"{_peak_mb():.0f}", " ".join(f"{o}:{n}" for o, n in ops.items())]


def limit_row(width: int, limits: dict[str, Any]) -> list[str]:
    """One row of the limits table (call it in a fresh process)."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        _, rep = egglog_engine(sum_of_products(width), rules=assoc_comm_rules(Path(tmp)), **limits)
        seconds = time.perf_counter() - start
    largest = max((it.enodes for it in rep.iterations), default=0)
    asked = ", ".join(f"{k}={v:,}" for k, v in limits.items()) or "defaults"
    return [asked, f"{seconds:.2f}", f"{largest:,}", f"{_peak_mb():.0f}", rep.stop_reason]


def _run(jobs: Sequence[tuple[Any, ...]]) -> list[list[str]]:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        return [pool.submit(*job).result() for job in jobs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limits", description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default=",".join(map(str, SHARED_KS)), help="matmuls per input (default: 8,16,32,64)")
    parser.add_argument("--width", type=int, default=32, help="inputs of the sum of products (default: 32)")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",") if k]
    shared = _run([(shared_row, k, bias) for k in ks for bias in (False, True)])
    print(format_table(("k", "bias", "e-nodes", "iterations", "seconds", "peak MB", "ops"), shared, "<<>>>><"))
    print()
    limited = _run([(limit_row, args.width, limits) for limits in LIMIT_CASES])
    print(format_table(("limits", "seconds", "largest e-graph", "peak MB", "stop reason"), limited, "<>>><"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
