"""``python -m benchmarks.bench``: how the optimizer scales on the example models.

For each case (a model at a layer count, or the 20,000-node synthetic DAG) it
prints the graph and e-graph sizes, seconds per phase, the peak memory, the
predicted cost before and after, the fused ops, and the gap between greedy
extraction and the exact (ILP) optimum where the ILP is small enough to run.
Every case runs in a freshly spawned process, so its peak RSS is its own
(interpreter and libraries included) and no case warms another's caches.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import multiprocessing
import random
import resource
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, astuple, dataclass
from functools import partial
from pathlib import Path

from rlx_egraph import examples
from rlx_egraph.cli.main import format_table
from rlx_egraph.cost.targets import TARGETS
from rlx_egraph.engines.budget import gc_paused
from rlx_egraph.engines.egglog import extract
from rlx_egraph.engines.egglog.decode import Fusion
from rlx_egraph.engines.egglog.encode import encode_graph
from rlx_egraph.engines.egglog.program import build_egraph, egraph_from_program, rules_program
from rlx_egraph.engines.egglog.rules import RuleSet, load_rules
from rlx_egraph.engines.egglog.saturate import STOP_SATURATED, saturate
from rlx_egraph.engines.egglog.view import build_view, view_tables
from rlx_egraph.engines.fallback.engine import STOP_DONE
from rlx_egraph.ir import Graph
from rlx_egraph.ir.rewrite import node_key
from rlx_egraph.optimize import engine_by_size, optimize_with_report

# these measure the egglog engine itself (engine="auto" would fall back when a limit stops it)
egglog_engine = partial(optimize_with_report, engine="egglog")

MODELS = ("llama", "bert", "synthetic")
LAYERS = (1, 2, 8, 32, 64)
QUICK_LAYERS = (1, 2)
SYNTHETIC_NODES = 20_000
SCALING_NODES = (1_000, 10_000, 20_000, 50_000, 100_000)
PHASES = ("encode", "saturate", "extract", "decode")
ILP_TIME_LIMIT = inspect.signature(extract.exact).parameters["time_limit"].default


@dataclass(frozen=True)
class Case:
    """One benchmark case: ``model`` at ``size`` layers (nodes, for the synthetic DAG)."""

    model: str
    size: int

    @property
    def name(self) -> str:
        return f"{self.model}-{self.size}"

    def build(self) -> Graph:
        if self.model == "synthetic":
            return examples.synthetic(self.size)
        builder = examples.ALL[self.model]
        if "layers" not in inspect.signature(builder).parameters:  # the conv block has one size
            return builder()
        return builder(layers=self.size)

    def rules(self) -> RuleSet | None:
        """The rules to optimize it with (None: the shipped ones)."""
        return None


@dataclass(frozen=True)
class OnnxCase:
    """An ONNX model file, imported with its symbolic dims bound as ``python -m rlx_egraph.frontends.onnx.compare``
    binds them by default, and optimized with the ONNX rules."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.stem

    def build(self) -> Graph:
        import onnx

        from rlx_egraph.frontends.onnx.compare import DIMS, input_shapes
        from rlx_egraph.onnx import import_model

        model = onnx.load(str(self.path))
        return import_model(model, input_shapes(model, DIMS))

    def rules(self) -> RuleSet:
        from rlx_egraph.onnx import onnx_rules

        return onnx_rules()


@dataclass(frozen=True)
class Row:
    """What one case measured; ``exact_ns``/``ilp_seconds`` are None when the ILP was not run."""

    case: str
    model: str
    size: int
    nodes_before: int
    nodes_after: int
    eclasses: int
    enodes: int
    stop_reason: str
    phases: dict[str, float]
    total_seconds: float
    peak_rss_mb: float
    before_ns: float
    after_ns: float
    gain_pct: float
    fused_op_counts: dict[str, int]
    greedy_ns: float
    exact_ns: float | None
    ilp_seconds: float | None
    ilp_finished: bool = False
    cpu_seconds: float = 0.0  # the optimize run's CPU time (its process's, threads included)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def cases(models: Sequence[str], layers: Sequence[int]) -> list[Case]:
    """Cases in ``models`` order, layer counts in the given order; one synthetic case."""
    return [Case(m, SYNTHETIC_NODES) if m == "synthetic" else Case(m, n)
            for m in models for n in ((0,) if m == "synthetic" else layers)]


def run_case(case: Case, target: str, exact_max_enodes: int) -> Row:
    """Optimize one case (call it in a fresh process); a second exact-gap run when the e-graph is small."""
    load_rules()  # parsing the rule files is a one-off cost, not this case's
    graph = case.build()
    start, cpu_start = time.perf_counter(), time.process_time()
    _, report = egglog_engine(graph, target)
    total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    exact_ns = ilp_seconds = None
    finished = False
    if report.enodes <= exact_max_enodes:
        _, gap_report = egglog_engine(graph, target, exact_gap=True)
        exact_ns, finished = gap_report.exact_ns, gap_report.exact_optimal
        ilp_seconds = gap_report.phases["extract"] - report.phases["extract"]
    assert report.profile_before is not None and report.profile_after is not None
    before, after = report.profile_before.ns, report.profile_after.ns
    return Row(case.name, case.model, case.size, report.nodes_before, report.nodes_after, report.eclasses,
               report.enodes, report.stop_reason, {p: report.phases[p] for p in PHASES}, total, peak_mb, before,
               after, 100.0 * (before - after) / before if before else 0.0, report.fused_op_counts,
               report.extracted_ns, exact_ns, ilp_seconds, finished, cpu)


def run(todo: Sequence[Case], target: str, exact_max_enodes: int) -> list[Row]:
    """Run the cases one after another, each in its own spawned process; progress goes to stderr."""
    rows = []
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        for k, case in enumerate(todo, 1):
            row = pool.submit(run_case, case, target, exact_max_enodes).result()
            print(f"[{k}/{len(todo)}] {case.name}: {row.total_seconds:.2f} s", file=sys.stderr)
            rows.append(row)
    return rows


def _gap(row: Row) -> str:
    if row.exact_ns is None:
        return "-"
    return f"{row.greedy_ns - row.exact_ns:,.0f}" if row.ilp_finished else "timeout"


def _short_fused(counts: dict[str, int]) -> str:
    return " ".join(f"{op.removeprefix('Fused')}:{n}" for op, n in counts.items())


def table(rows: Sequence[Row]) -> str:
    """The fixed-width results table."""
    header = ("case", "nodes", "-> nodes", "e-classes", "e-nodes", *(f"{p} s" for p in PHASES), "total s",
              "peak MB", "before ns", "after ns", "gain %", "gap ns", "fused ops")
    body = [(r.case, str(r.nodes_before), str(r.nodes_after), str(r.eclasses), str(r.enodes),
             *(f"{r.phases[p]:.3f}" for p in PHASES), f"{r.total_seconds:.3f}", f"{r.peak_rss_mb:.0f}",
             f"{r.before_ns:,.0f}", f"{r.after_ns:,.0f}", f"{r.gain_pct:.1f}", _gap(r), _short_fused(r.fused_op_counts))
            for r in rows]
    return format_table(header, body, "<" + ">" * (len(header) - 2) + "<")


def scaling_table(rows: Sequence[Row]) -> str:
    """Nodes, seconds per phase and for the rest of the run (the report: missed fusions, profiles), the whole run,
    microseconds per input node (the whole run), the run's CPU seconds (what a loaded machine does not inflate)
    and peak MB."""
    header = ("nodes", "e-nodes", *(f"{p} s" for p in PHASES), "rest s", "total s", "us/node", "cpu s", "peak MB")
    body = [(str(r.nodes_before), str(r.enodes), *(f"{r.phases[p]:.3f}" for p in PHASES),
             f"{r.total_seconds - sum(r.phases[p] for p in PHASES):.3f}", f"{r.total_seconds:.3f}",
             f"{1e6 * r.total_seconds / r.nodes_before:.0f}", f"{r.cpu_seconds:.3f}", f"{r.peak_rss_mb:.0f}")
            for r in rows]
    return format_table(header, body, ">" * len(header))


def _names(text: str) -> list[str]:
    names = [m for m in text.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"models must be among {', '.join(MODELS)} (got {text!r})")
    return names


def _counts(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",") if n]
    except ValueError:
        counts = []
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError(f"layers must be comma-separated counts >= 0 (got {text!r})")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    """Parse options, run the cases, print the table (and write JSON).

    ``scaling [--nodes N,...]``: the synthetic DAG at each size, the time per phase and per node.
    ``exact [--models M,...] [--layers N] [--targets T,...]``: the ILP of exact extraction per case.
    ``engines [--nodes N,...] [--no-models] [--onnx FOLDER] [--repeat K]``: both engines side by side, their costs'
    agreement.
    ``overhead [--nodes N,...] [--repeat K]``: the egglog engine's work around saturation, and egglog's part of it.
    ``agreement [--graphs N] [--seed S] [--targets T,...]``: both engines' costs on seeded random small graphs.
    ``models [--models M,...] [--layers N,...] [--targets T,...] [--onnx FOLDER] [--only SUBSTR]``: both engines'
    costs on each example model and ONNX export, and how far apart they are.
    ``fingerprint [--models M,...] [--layers N,...] [--nodes N,...] [--targets T,...] [--engines E,...]``: a digest
    of each result, to check that a change leaves the results as they were.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["scaling"]:
        return _scaling(argv[1:])
    if argv[:1] == ["exact"]:
        return _exact(argv[1:])
    if argv[:1] == ["engines"]:
        return _engines(argv[1:])
    if argv[:1] == ["overhead"]:
        return _overhead(argv[1:])
    if argv[:1] == ["agreement"]:
        return _agreement(argv[1:])
    if argv[:1] == ["fingerprint"]:
        return _fingerprint(argv[1:])
    if argv[:1] == ["models"]:
        return _models(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=_names, default=list(MODELS), help=f"default: {','.join(MODELS)}")
    parser.add_argument("--layers", type=_counts, default=list(LAYERS), help=f"default: {','.join(map(str, LAYERS))}")
    parser.add_argument("--target", default="cpu", choices=list(TARGETS))
    parser.add_argument("--exact-max-enodes", type=int, default=3000,
                        help="run the ILP only on e-graphs up to this many e-nodes (default: 3000)")
    parser.add_argument("--json", metavar="OUT.json", help="write every row here")
    parser.add_argument("--quick", action="store_true", help="layers 1,2 only, no synthetic DAG")
    args = parser.parse_args(argv)
    models = [m for m in args.models if m != "synthetic"] if args.quick else args.models
    todo = cases(models, QUICK_LAYERS if args.quick else args.layers)
    print(textwrap.fill(f"rlx-egraph bench, target {args.target}: {len(todo)} cases, each in its own process. "
                        "peak MB = the process's max RSS; gap ns = greedy minus ILP optimum (ILP run when e-nodes <= "
                        f"{args.exact_max_enodes}, else '-'; 'timeout' = it hit its {ILP_TIME_LIMIT:.0f} s limit)",
                        120), flush=True)
    rows = run(todo, args.target, args.exact_max_enodes)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "exact_max_enodes": args.exact_max_enodes,
                                               "rows": [r.to_dict() for r in rows]}, indent=1))
        print(f"wrote {args.json}")
    return 0


def _sizes(command: str, description: str, argv: Sequence[str], repeat: bool = False) -> argparse.Namespace:
    """The options of a subcommand that runs the synthetic DAG at several sizes on one target (``repeat``: and
    how many runs per size)."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.bench {command}", description=description)
    parser.add_argument("--nodes", type=_counts, default=list(SCALING_NODES),
                        help=f"default: {','.join(map(str, SCALING_NODES))}")
    parser.add_argument("--target", default="cpu", choices=list(TARGETS))
    if repeat:
        parser.add_argument("--repeat", type=int, default=1,
                            help="runs per size, each in a fresh process; each measured column's seconds are the "
                                 "least of its runs, 'ours' and the ratios are computed from those (a shared "
                                 "machine only ever adds time)")
    args = parser.parse_args(argv)
    if repeat and args.repeat < 1:
        parser.error(f"--repeat must be at least 1, not {args.repeat}")
    return args


def _scaling(argv: Sequence[str]) -> int:
    args = _sizes("scaling", "time per phase and per node of the synthetic DAG, by size", argv)
    print(scaling_table(run([Case("synthetic", n) for n in args.nodes], args.target, exact_max_enodes=0)))
    return 0


ENGINE_NODES = (1_000, 10_000, 20_000, 50_000, 100_000, 1_000_000)
EGGLOG_MAX_NODES = 100_000  # the egglog engine is not run above this (at 1M it would need ~10 GB)
AGREEMENT_CASES = tuple(Case(m, n) for m, n in (("llama", 2), ("llama", 8), ("bert", 2), ("bert", 8), ("gpt2", 2),
                                                 ("gpt2", 8), ("mlp", 3), ("conv_block", 0)))
VERIFY_MAX_NODES = 20_000  # parity is checked on cases up to this size


@dataclass(frozen=True)
class EngineRun:
    """One engine's whole ``optimize_with_report`` run on one case (timed without the parity check)."""

    seconds: float
    cpu_seconds: float
    phases: dict[str, float]
    peak_mb: float
    after_ns: float
    parity: bool | None  # None: not checked (too large)
    stop_reason: str  # the report's: the engine ran to its end, or which limit stopped it

    @property
    def stopped_early(self) -> bool:
        return self.stop_reason not in (STOP_SATURATED, STOP_DONE)


def run_engine(case: Case | OnnxCase, engine: str, target: str) -> EngineRun:
    """Optimize ``case`` with ``engine``; call it in a fresh process, so the peak RSS is this run's.  The timed
    run checks no parity; up to :data:`VERIFY_MAX_NODES` nodes a second, untimed run does (same graph, rules and
    options: the same result)."""
    rules = case.rules() or load_rules()
    graph = case.build()
    start, cpu_start = time.perf_counter(), time.process_time()
    _, report = optimize_with_report(graph, target, rules=rules, engine=engine, max_seconds=math.inf)  # to the end
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert report.profile_after is not None
    parity = None
    if len(graph) <= VERIFY_MAX_NODES:
        _, checked = optimize_with_report(graph, target, rules=rules, engine=engine, verify=True,
                                          max_seconds=math.inf)
        if checked.parity is None or checked.profile_after is None or \
                checked.profile_after.ns != report.profile_after.ns:
            raise RuntimeError(f"{case.name}: the run that checked parity gave another graph than the timed run")
        parity = checked.parity.ok
    return EngineRun(seconds, cpu, dict(report.phases), peak_mb, report.profile_after.ns, parity,
                     report.stop_reason)


def _least_run(runs: Sequence[EngineRun], what: str) -> EngineRun:
    """The quickest of ``runs`` (one case and engine, each in its own process), after checking that they all
    predict the same ns, stop for the same reason and pass or fail parity alike: the same graph, rules and options
    give the same result."""
    results = {(r.after_ns, r.stop_reason, r.parity) for r in runs}
    if len(results) > 1:
        raise RuntimeError(f"{what}: runs of the same case gave different results: {sorted(results)}")
    return min(runs, key=lambda r: r.seconds)


def _seconds_cells(runs: Sequence[EngineRun] | None, repeat: int) -> list[str]:
    """An engine's seconds on a case: its least, and with ``repeat`` > 1 its median ("-" when it did not run)."""
    if not runs:
        return ["-"] * (2 if repeat > 1 else 1)
    least = f"{min(r.seconds for r in runs):.2f}"
    return [least, f"{statistics.median(r.seconds for r in runs):.2f}"] if repeat > 1 else [least]


def engines_table(todo: Sequence[Case | OnnxCase], target: str, repeat: int = 1) -> str:
    """Both engines on each case, one spawned process per run: seconds without the parity check (the egglog
    engine's per phase), peak MB, predicted ns after, how far the fallback's cost is from the egglog engine's,
    parity, and the engine that ``engine="auto"`` picks by size.  With ``repeat`` > 1 each engine runs that many
    times per case, the engines alternating: the table gives the quickest run's figures, and each engine's median
    seconds beside its least."""
    kinds = ["least s", "median s"] if repeat > 1 else ["s"]  # the seconds columns of each engine
    rows = []
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        for case in todo:
            nodes = case.size if isinstance(case, Case) and case.model == "synthetic" else len(case.build())
            engines = [e for e in ("egglog", "fallback") if e == "fallback" or nodes <= EGGLOG_MAX_NODES]
            tries: dict[str, list[EngineRun]] = {e: [] for e in engines}
            for _ in range(repeat):
                for e in engines:
                    tries[e].append(pool.submit(run_engine, case, e, target).result())
                print(f"{case.name}: " + ", ".join(f"{e} {r[-1].seconds:.2f} s" for e, r in tries.items()),
                      file=sys.stderr, flush=True)
            runs = {e: _least_run(r, f"{case.name}, {e} engine") for e, r in tries.items()}
            eg, fb = runs.get("egglog"), runs["fallback"]
            parity = "/".join("-" if r.parity is None else "ok" if r.parity else "FAIL" for r in runs.values())
            stops = "/".join(r.stop_reason.split(":")[0] if r.stopped_early else "end" for r in runs.values())
            rows.append((
                case.name, f"{nodes:,}", *_seconds_cells(tries.get("egglog"), repeat),
                " / ".join(f"{eg.phases.get(p, 0.0):.2f}" for p in PHASES) if eg else "-",
                f"{eg.cpu_seconds:.2f}" if eg else "-", f"{eg.peak_mb:.0f}" if eg else "-",
                *_seconds_cells(tries["fallback"], repeat), f"{fb.cpu_seconds:.2f}", f"{fb.peak_mb:.0f}",
                f"{eg.after_ns:,.0f}" if eg else "-", f"{fb.after_ns:,.0f}",
                f"{100 * (fb.after_ns - eg.after_ns) / eg.after_ns:+.2f}" if eg else "-", parity, stops,
                engine_by_size("auto", nodes)))
    header = ("case", "nodes", *(f"egglog {k}" for k in kinds), "encode / saturate / extract / decode",
              "egglog cpu s", "egglog MB", *(f"fallback {k}" for k in kinds), "fallback cpu s", "fallback MB",
              "egglog ns", "fallback ns", "fallback vs egglog %", "parity", "stopped", "auto")
    return format_table(header, rows, "<" + ">" * (len(header) - 4) + "<<<")


def _engines(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench engines",
                                     description="both engines side by side: the example models, then the "
                                                 "synthetic DAG by size")
    parser.add_argument("--nodes", type=_counts,
                        help=f"synthetic sizes (default: {','.join(map(str, ENGINE_NODES))}; none with --onnx)")
    parser.add_argument("--no-models", action="store_true", help="not the example models")
    parser.add_argument("--onnx", type=Path, metavar="FOLDER",
                        help="also every .onnx model in FOLDER (extra onnx; imported and optimized as the "
                             "onnxruntime comparison does)")
    parser.add_argument("--target", default="cpu", choices=list(TARGETS))
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per case and engine, the engines alternating (default 1): the table gives the "
                             "quickest run's figures and each engine's median seconds")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, not {args.repeat}")
    todo: list[Case | OnnxCase] = [] if args.no_models else list(AGREEMENT_CASES)
    todo += [OnnxCase(p) for p in sorted(args.onnx.glob("*.onnx"))] if args.onnx else []
    todo += [Case("synthetic", n) for n in args.nodes or ([] if args.onnx else ENGINE_NODES)]
    print(f"both engines, whole optimize_with_report runs with no time limit, target {args.target}; seconds exclude "
          f"the parity check, which runs up to {VERIFY_MAX_NODES:,} nodes (egglog/fallback); the egglog engine runs "
          f"up to {EGGLOG_MAX_NODES:,} nodes; 'stopped': 'end', or the limit that stopped the engine"
          + (f"; each engine ran {args.repeat} times per case, alternating: figures of its quickest run, and its "
             "median seconds" if args.repeat > 1 else ""), flush=True)
    print(engines_table(todo, args.target, args.repeat))
    return 0


def exact_row(model: str, layers: int, target: str) -> tuple[str, ...]:
    """Saturate ``model`` at ``layers``, extract greedily, then solve the ILP from greedy's choice: its size,
    seconds, whether it proved optimality, its cost and greedy's (the FusionReport is not built)."""
    graph, rules, tgt = examples.ALL[model](layers=layers), load_rules(), TARGETS[target]
    egraph, encoding = build_egraph(graph, rules)
    saturate(egraph, rules)
    view = build_view(egraph, graph, encoding.constants, rules)
    roots = [view.class_of_node[o] for o in graph.outputs]
    greedy = extract.greedy(view, roots, tgt, graph.positions())
    ilp = extract.exact(view, roots, tgt, start=greedy.choice)
    return (f"{model}-{layers}", target, str(view.num_enodes), str(ilp.ilp["variables"]), str(ilp.ilp["constraints"]),
            str(ilp.ilp["cuts"]), str(ilp.ilp["rounds"]), f"{ilp.seconds:.2f}", "yes" if ilp.optimal else "no",
            f"{ilp.cost_ns:,.3f}", f"{greedy.cost_ns:,.3f}", f"{greedy.cost_ns - ilp.cost_ns:,.3f}")


@dataclass(frozen=True)
class Overhead:
    """One fresh process's measurements of the egglog engine's work around saturation (see :func:`overhead_row`)."""

    saturation: float  # the second run of the engine on the graph
    around: float  # its encode + extract + decode
    first_saturation: float  # the process's first run, on the same graph
    first_around: float
    load: float  # egglog's part of "around" (timed again, after both runs)
    read: float

    @property
    def ours(self) -> float:
        return self.around - self.load - self.read

    @property
    def first_ours(self) -> float:
        return self.first_around - self.load - self.read

    @property
    def ratio(self) -> float:
        """ours / saturation"""
        return self.ours / self.saturation

    @property
    def first_ratio(self) -> float:
        return self.first_ours / self.first_saturation


def overhead_row(nodes: int, target: str) -> Overhead:
    """The synthetic DAG at ``nodes`` (call it in a fresh process): the egglog engine's saturation and the work
    around it (encode + extract + decode; the regions pass after either engine's decision is not counted), and
    the two parts of that work done by egglog, not by our Python: loading (in encode: parsing and running the
    schema and the rules, then reading the encoded rows from their files; writing the files is ours) and reading
    the saturated rows back through the binding (in extract: freezing the e-graph, converting the rows' values to
    Python and releasing them), timed again one after the other on an e-graph built and saturated the same way.
    The engine runs some of its own work while egglog loads (it encodes the graph while egglog parses the rules,
    and writes a file while egglog reads the one before): "around" minus "load" and "read" is our work that
    egglog's does not hide.

    The engine runs twice on the graph, and "load" and "read" are timed after both: the second run's terms and
    egglog's are measured in the same state of the process.  The first run also pays the process's one-off
    costs (memory it maps and touches for the first time, cold caches), which the later timings of egglog's
    part do not: its "ours" holds them too.

    Each run's result is released before the next timing starts, so that none is timed beside a result still held
    (at 100k nodes a result holds some 200 MB of Python objects, and building the next view beside them took a
    third longer)."""
    ruleset = load_rules()
    graph = examples.synthetic(nodes)
    runs = []
    for _ in range(2):
        phases = egglog_engine(graph, target, max_seconds=math.inf)[1].phases  # the result is released here
        saturation = phases["saturate"]
        runs.append((saturation, sum(phases[p] for p in PHASES) - saturation))
    with gc_paused(), tempfile.TemporaryDirectory() as folder:  # as in the engine's run
        encoding, rules_text = encode_graph(graph), rules_program(ruleset)
        start = time.perf_counter()
        egraph = egraph_from_program(rules_text)
        load = time.perf_counter() - start
        program = encoding.write_rows(Path(folder))  # our part of loading: writing the rows' files
        start = time.perf_counter()
        egraph.parse_and_run_program(program)
        load += time.perf_counter() - start
        saturate(egraph, ruleset)
        start = time.perf_counter()
        functions = egraph.freeze().functions
        for name in view_tables():
            for row in functions[name].rows if name in functions else ():
                row.inputs, row.output, row.subsumed  # noqa: B018 -- each read converts the row's values to Python
        del functions
        read = time.perf_counter() - start
    (first_saturation, first_around), (saturation, around) = runs
    return Overhead(saturation, around, first_saturation, first_around, load, read)


def _overhead(argv: Sequence[str]) -> int:
    args = _sizes("overhead", "the egglog engine's work around saturation, and egglog's part of it", argv,
                  repeat=True)
    print(textwrap.fill("egglog engine on the synthetic DAG: 'around' = encode + extract + decode; of it, 'load' "
                        "(egglog parsing and running the schema and the rules, reading the encoded rows from the "
                        "files we wrote, and running the loading rules) and 'read' (freezing the saturated e-graph, "
                        "reading the rows the view decodes through egglog's Python binding, and releasing them) are "
                        "spent in egglog; 'ours' is the rest: our work that egglog's does not hide (the graph is "
                        "encoded while egglog parses the rules, a rows file written while egglog reads the one "
                        "before). Ratios are to the saturation's seconds. Each fresh process runs the engine twice "
                        "on the graph, then times egglog's part: the columns are the second run's, timed in the "
                        "same state of the process as egglog's part; 'first run' is the process's first, which "
                        "also pays its one-off costs (memory mapped and touched for the first time, cold caches) "
                        "that the later timing of egglog's part does not, so its 'ours' holds those too."
                        + (f" Each measured column is the least of {args.repeat} runs per size, 'ours' and the "
                           "ratios computed from those; 'paired' is the median of each run's own ratio "
                           "(its terms timed in one process, seconds apart)." if args.repeat > 1 else ""),
                        120), flush=True)
    header = ("nodes", "saturate s", "around s", "load s", "read s", "ours s", "around/sat", "load+read/sat",
              "ours/sat", "paired ours/sat", "first run: saturate s", "around s", "ours/sat", "paired ours/sat")
    rows = []
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        for n in args.nodes:
            runs: list[Overhead] = []
            for _ in range(args.repeat):
                runs.append(run := pool.submit(overhead_row, n, args.target).result())
                print(f"{n:,} nodes: saturate {run.saturation:.3f} s, around it {run.around:.3f} s, ours/sat "
                      f"{run.ratio:.2f}; first run: saturate {run.first_saturation:.3f} s, around "
                      f"it {run.first_around:.3f} s, ours/sat {run.first_ratio:.2f}",
                      file=sys.stderr, flush=True)
            least = Overhead(*(min(column) for column in zip(*(astuple(r) for r in runs), strict=True)))
            # each term its least: a noisy "read" must not make "ours" look small
            saturation, around, ours = least.saturation, least.around, least.ours
            rows.append((f"{n:,}", f"{saturation:.3f}", f"{around:.3f}", f"{least.load:.3f}", f"{least.read:.3f}",
                         f"{ours:.3f}", f"{around / saturation:.1f}", f"{(least.load + least.read) / saturation:.1f}",
                         f"{least.ratio:.1f}", f"{statistics.median(r.ratio for r in runs):.2f}",
                         f"{least.first_saturation:.3f}", f"{least.first_around:.3f}",
                         f"{least.first_ratio:.1f}", f"{statistics.median(r.first_ratio for r in runs):.2f}"))
    print(format_table(header, rows, ">" * len(header)))
    return 0


def _exact(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench exact",
                                     description="the ILP of exact extraction, warm-started from greedy, per case")
    parser.add_argument("--models", type=lambda t: t.split(","), default=["llama", "bert", "gpt2", "mlp"])
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--targets", type=lambda t: t.split(","), default=["cpu", "cuda", "onnxruntime"])
    args = parser.parse_args(argv)
    header = ("case", "target", "e-nodes", "variables", "constraints", "need rows", "LP rounds", "ILP s", "optimal",
              "ILP ns", "greedy ns", "gap ns")
    rows = []
    for model in args.models:
        for target in args.targets:
            rows.append(exact_row(model, args.layers, target))
            print(f"{rows[-1][0]} {target}: {rows[-1][7]} s", file=sys.stderr, flush=True)
    print(format_table(header, rows, "<<" + ">" * (len(header) - 2)))
    return 0


def agreement_rows(graphs: int, seed: int, targets: Sequence[str]) -> list[tuple[int, str, float, float, str]]:
    """Graph ``k`` of ``graphs`` (the plans :func:`examples.random_plan` draws from ``random.Random(seed)``) on
    ``targets[k % len(targets)]``, optimized by both engines with the elementwise-regions pass off (it runs after
    either engine's decision): (k, target, egglog ns, fallback ns, plan)."""
    rng = random.Random(seed)
    rows = []
    for k in range(graphs):
        plan = examples.random_plan(rng)
        target, graph = targets[k % len(targets)], examples.random_graph(plan)
        eg, fb = (optimize_with_report(graph, target, engine=e, regions=False)[1].profile_after.ns
                  for e in ("egglog", "fallback"))
        rows.append((k, target, eg, fb, " ".join(step for step, _, _ in plan)))
    return rows


def _agreement(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench agreement",
                                     description="both engines' predicted costs on seeded random small graphs")
    parser.add_argument("--graphs", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--targets", type=lambda t: t.split(","), default=["cpu", "metal", "wgpu"])
    args = parser.parse_args(argv)
    rows = agreement_rows(args.graphs, args.seed, args.targets)
    apart = [r for r in rows if not math.isclose(r[2], r[3], rel_tol=1e-9)]
    print(f"{len(rows) - len(apart)} of {len(rows)} random graphs (seed {args.seed}, targets "
          f"{','.join(args.targets)} in turn, regions off): the fallback's predicted cost equals the egglog engine's")
    if apart:
        print(format_table(("graph", "target", "egglog ns", "fallback ns", "fallback vs egglog %", "steps"),
                           [(str(k), t, f"{e:,.1f}", f"{f:,.1f}", f"{100 * (f - e) / e:+.2f}", steps)
                            for k, t, e, f, steps in apart], ">>>>><"))
    return 0


def result_digest(graph: Graph, fusions: Sequence[Fusion]) -> str:
    """A digest of an optimized graph and its fusions: node ids, ops, inputs, attributes (arrays by content, as
    :func:`~rlx_egraph.ir.rewrite.node_key` keys them), types and outputs, then each fusion's node, op, rules and the
    input nodes it replaces.  Equal results give equal digests."""
    digest = hashlib.sha1()
    for n in graph.nodes:
        digest.update(repr((n.id, node_key(n) or (n.op, n.attrs["name"]), n.shape, n.dtype, n.parts)).encode())
    digest.update(repr(graph.outputs).encode())
    digest.update(repr(sorted((f.node, f.op, f.rules, f.replaces) for f in fusions)).encode())
    return digest.hexdigest()[:16]


def fingerprint_rows(todo: Sequence[Case], targets: Sequence[str], engines: Sequence[str]
                     ) -> list[tuple[str, str, str, str, str, str]]:
    """Per case, target and engine: the predicted ns, the nodes after and :func:`result_digest` (in this process:
    a result does not depend on the process)."""
    rows = []
    for case in todo:
        graph = case.build()
        for target in targets:
            for engine in engines:
                out, report = optimize_with_report(graph, target, engine=engine, max_seconds=math.inf)
                assert report.profile_after is not None
                rows.append((case.name, target, engine, f"{report.profile_after.ns:.4f}", f"{len(out):,}",
                             result_digest(out, report.fusions)))
    return rows


def _among(what: str, known: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, each one of ``known``."""
    choices = list(known)

    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        if not names or set(names) - set(choices):
            raise argparse.ArgumentTypeError(f"{what} must be among {', '.join(choices)} (got {text!r})")
        return names
    return parse


def _fingerprint(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench fingerprint",
                                     description="a digest of each result, to check that a change leaves the "
                                                 "results as they were (run before and after, and diff)")
    parser.add_argument("--models", type=_among("models", examples.ALL), default=list(examples.ALL))
    parser.add_argument("--layers", type=_counts, default=[1, 2, 4])
    parser.add_argument("--nodes", type=_counts, default=[3_000, 12_000], help="synthetic DAG sizes")
    parser.add_argument("--targets", type=_among("targets", TARGETS), default=["cpu", "cuda", "onnxruntime"])
    parser.add_argument("--engines", type=_among("engines", ("egglog", "fallback")), default=["egglog", "fallback"])
    args = parser.parse_args(argv)
    todo = [c for m in args.models for c in ([Case(m, 0)] if m == "conv_block" else [Case(m, n) for n in args.layers])]
    todo += [Case("synthetic", n) for n in args.nodes]
    print(format_table(("case", "target", "engine", "predicted ns", "nodes after", "digest"),
                       fingerprint_rows(todo, args.targets, args.engines), "<<<>><"))
    return 0


AGREEMENT_TOLERANCE_PCT = 2.0  # the fallback's cost is within this of the egglog engine's


def model_agreement_rows(todo: Sequence[Case | OnnxCase], targets: Sequence[str]
                         ) -> list[tuple[str, str, int, float, float]]:
    """Per case and target: (case, target, nodes, egglog ns, fallback ns), each engine run to its end (in this
    process: the costs do not depend on the process)."""
    rows = []
    for case in todo:
        graph, rules = case.build(), case.rules() or load_rules()
        for target in targets:
            eg, fb = (optimize_with_report(graph, target, rules=rules, engine=e, max_seconds=math.inf)[1]
                      for e in ("egglog", "fallback"))
            assert eg.profile_after is not None and fb.profile_after is not None
            rows.append((case.name, target, len(graph), eg.profile_after.ns, fb.profile_after.ns))
            print(f"{case.name} {target}: {100 * (fb.profile_after.ns / eg.profile_after.ns - 1):+.2f} %",
                  file=sys.stderr, flush=True)
    return rows


def _models(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench models",
                                     description="both engines' predicted costs on the example models and ONNX "
                                                 "exports, and how far the fallback's is from the egglog engine's")
    parser.add_argument("--models", type=_among("models", [m for m in examples.ALL if m != "synthetic"]),
                        default=[m for m in examples.ALL if m != "synthetic"])
    parser.add_argument("--layers", type=_counts, default=[1, 2, 6, 16])
    parser.add_argument("--targets", type=_among("targets", TARGETS), default=list(TARGETS))
    parser.add_argument("--onnx", type=Path, metavar="FOLDER", help="also every .onnx model in FOLDER (extra onnx)")
    parser.add_argument("--only", default="", metavar="SUBSTR", help="only the ONNX models whose name holds SUBSTR")
    parser.add_argument("--no-models", action="store_true", help="not the example models")
    args = parser.parse_args(argv)
    todo: list[Case | OnnxCase] = [] if args.no_models else [
        c for m in args.models for c in ([Case(m, 0)] if m == "conv_block" else [Case(m, n) for n in args.layers])]
    if args.onnx:
        todo += [OnnxCase(p) for p in sorted(args.onnx.glob("*.onnx")) if args.only in p.stem]
    rows = model_agreement_rows(todo, args.targets)
    apart = [abs(100 * (f / e - 1)) for *_, e, f in rows]
    print(f"fallback vs egglog engine, predicted ns after a whole run of each (no time limit): {len(rows)} cases, "
          f"{sum(a <= AGREEMENT_TOLERANCE_PCT for a in apart)} within {AGREEMENT_TOLERANCE_PCT:g} %, worst "
          f"{max(apart, default=0.0):.2f} %")
    print(format_table(("case", "target", "nodes", "egglog ns", "fallback ns", "fallback vs egglog %"),
                       [(c, t, f"{n:,}", f"{e:,.0f}", f"{f:,.0f}", f"{100 * (f / e - 1):+.2f}")
                        for c, t, n, e, f in rows], "<<>>>>"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
