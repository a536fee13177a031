"""Count the instructions of one ``optimize_with_report`` call under each of several source trees, outside the suite.

On a shared machine timings swing by 30% between identical runs, so a change of a few percent shows only in
instruction counts. Each tree's call runs under valgrind's callgrind, which counts only inside ``functools.reduce``
(``--toggle-collect=functools_reduce``): the call is made inside it, after the imports, the rules and the graph.
Two runs of the same code then agree to about a thousand instructions in 150 million, because hash randomisation is
off (``PYTHONHASHSEED=0``) and no compiled module is read (``PYTHONPYCACHEPREFIX`` is an empty folder; otherwise a
tree whose ``__pycache__`` is filled skips compiling what the call imports, and another tree pays for it). Needs
valgrind; two trees run at a time (one per core). A tree is a checkout's ``src`` folder with its compiled extension
modules built (``git worktree add`` then copy the ``.so`` files, or ``make``)::

    python scripts/count_instructions.py --nodes 20000 --engine fallback ../base/src src

Prints each tree's count and its ratio to the first's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# What each valgrind run executes: optimize_with_report on the synthetic DAG, the call alone inside functools.reduce.
_CALL = """
import functools, math, sys
from rlx_egraph import examples
from rlx_egraph.egraph.rules import load_rules
from rlx_egraph.optimize import optimize_with_report
rules, graph = load_rules(), examples.synthetic(int(sys.argv[1]))
functools.reduce(lambda _, __: optimize_with_report(graph, sys.argv[3], rules=rules, engine=sys.argv[2],
                                                    max_seconds=math.inf), [0], None)
"""


def count(tree: Path, nodes: int, engine: str, target: str) -> int:
    """Instructions of the call with ``tree`` first on the path (raises with valgrind's output when it fails)."""
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, PYTHONPATH=str(tree.resolve()), PYTHONHASHSEED="0",
                   PYTHONPYCACHEPREFIX=str(Path(folder, "pycache")))
        done = subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                               "--toggle-collect=functools_reduce", f"--callgrind-out-file={folder}/out",
                               sys.executable, "-c", _CALL, str(nodes), engine, target],
                              env=env, cwd=folder, capture_output=True, text=True)
    for line in done.stderr.splitlines():
        if "Collected :" in line and done.returncode == 0:
            return int(line.rsplit(":", 1)[1].replace(",", ""))
    raise RuntimeError(f"{tree}: the counted run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path, help="source folders (each holding rlx_egraph)")
    parser.add_argument("--nodes", type=int, default=20_000, help="synthetic DAG size (default 20000)")
    parser.add_argument("--engine", choices=("egglog", "fallback"), default="fallback")
    parser.add_argument("--target", default="cpu")
    args = parser.parse_args(argv)
    with ThreadPoolExecutor(2) as pool:
        counts = list(pool.map(lambda tree: count(tree, args.nodes, args.engine, args.target), args.trees))
    for tree, n in zip(args.trees, counts, strict=True):
        print(f"{n:>16,}  {n / counts[0]:.4f}  {tree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
