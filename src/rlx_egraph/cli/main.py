"""``rlx-egraph``: demo, optimize, example, rules (list, check), program and calibrate subcommands.

Rules: ``--rules F.egg`` adds files or folders to the shipped rules,
``--only-rules F.egg`` uses them instead, ``--disable NAME`` switches a rule off.
Output: warnings go to stderr as ``warning: ...`` lines; ``-v`` adds the run's phases (INFO), ``-vv`` its
steps (DEBUG); ``-q`` shows errors only, with no progress display (docs/logging.md).

Every failure is one ``error: ...`` line on stderr (never a traceback) naming
the file, node, op or rule, and one of these exit codes:

Exit codes:
  0    success
  1    an unsound rule: the optimized graph failed the parity check, a rewrite was ill-typed, or rules check found one
  2    bad input: a missing or malformed graph, rule or data file, an unknown rule, bad arguments, an unrunnable op
  3    internal error: a bug in rlx-egraph (the line says "please report")
  130  interrupted (Ctrl-C)
  141  stdout closed early, as in ``| head`` (128 + SIGPIPE, as a shell reports it)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import json
import logging
import os
import signal
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from .. import __version__, examples
from ..cost import calibration as cal
from ..cost.targets import TARGETS, UnsupportedOp, get_target, onnxruntime_target
from ..engines.egglog import STAGES, dump_egglog_program
from ..engines.egglog.rules import RuleError, RuleSet
from ..engines.egglog.soundness import check
from ..engines.egglog.view import UnsoundRewrite
from ..errors import RlxError
from ..ir import Graph, GraphError
from ..ir.graph import graph_file_path, read_reference_inputs
from ..kernels.parity import ParityError, ParityInputError
from ..log import LOGGER
from ..optimize import FALLBACK_THRESHOLD, engine_by_size, optimize_with_report
from ..options import ENGINES, EXTRACTIONS, Options
from ..report import OptimizeReport
from ..report.progress import progress_set

EXIT_PARITY = 1
EXIT_INPUT = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
EXIT_CODES_HELP = "exit codes:\n" + (__doc__ or "").partition("Exit codes:\n")[2].replace("``", "")
STDOUT = "-"  # as -o: write the graph JSON to stdout


class UsageError(ValueError):
    """A subcommand was given options that do not fit together."""


class _Discard(io.TextIOBase):
    """Where ``-q`` sends the lines it leaves out."""

    def write(self, text: str) -> int:
        return len(text)


class _LevelFormatter(logging.Formatter):
    """``warning: ...``, ``info: ...``: a log record as one line in the CLI's style."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


@contextlib.contextmanager
def _output(args: argparse.Namespace) -> Iterator[None]:
    """Log the ``rlx_egraph`` logger to stderr at the level ``-v``/``-q`` pick, and with ``-q`` draw no progress;
    as before afterwards (main() may be called again in the same process)."""
    verbose, quiet = getattr(args, "verbose", 0), getattr(args, "quiet", False)
    level = logging.ERROR if quiet else logging.WARNING if not verbose else logging.INFO if verbose == 1 \
        else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LevelFormatter())
    previous = LOGGER.level
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
    try:
        with progress_set("off") if quiet else contextlib.nullcontext():
            yield
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(previous)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """Fixed-width columns; ``align`` holds one ``<`` or ``>`` per column (default ``<``)."""
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    marks = align.ljust(len(header), "<")
    return "\n".join("  ".join(f"{cell:{mark}{w}}" for cell, mark, w in zip(r, marks, widths, strict=True)).rstrip()
                     for r in [header, *rows])


def summarize(graph: Graph) -> str:
    """Node count, outputs and op counts (most common first) of ``graph``."""
    ops = sorted(graph.op_counts().items(), key=lambda kv: (-kv[1], kv[0]))
    return (f"graph {graph.name}: {len(graph)} nodes, {len(graph.outputs)} output(s)\n"
            f"ops: {', '.join(f'{op} {n}' for op, n in ops)}")


def _load_graph(path: str, args: argparse.Namespace) -> Graph:
    """A graph from JSON, or imported from an ``.onnx`` model with the ``--input-shape`` and ``--max-dim``
    bindings (which only an ONNX model takes)."""
    shapes, bounds = dict(args.input_shape or []), dict(args.max_dim or [])
    try:
        if Path(path).suffix != ".onnx":
            if shapes or bounds:
                raise UsageError(f"{'--input-shape' if shapes else '--max-dim'} applies to ONNX models only, and "
                                 f"{path} is a graph JSON (its dims are as the file gives them)")
            return Graph.load(path)
        from ..onnx import OnnxImportError, import_model

        try:
            return import_model(path, shapes, max_dims=bounds)
        except OnnxImportError as exc:
            raise GraphError(exc.command_line_message()) from None  # its hint in this command line's terms
    except GraphError as exc:
        message = str(exc)
        raise GraphError(message if message.startswith(f"{path}: ") else f"{path}: {message}") from None


def _ruleset(args: argparse.Namespace) -> RuleSet:
    """The rules chosen by ``--only-rules`` (else the shipped ones, with the ONNX forms for an ``.onnx``
    input), ``--rules`` and ``--disable``."""
    if args.only_rules:
        rules = RuleSet.from_files(*args.only_rules)
    elif Path(getattr(args, "input", "")).suffix == ".onnx":
        from ..onnx import onnx_rules

        rules = onnx_rules()
    else:
        rules = RuleSet.shipped()
    return rules.extend(*args.rules or ()).without(args.disable or ())


def _target(args: argparse.Namespace) -> Any:
    """The target ``--target`` names; ``onnxruntime`` priced by the calibration cached under ``--cache``."""
    cache = getattr(args, "cache", None)
    if args.target == "onnxruntime" and cache is not None:
        return onnxruntime_target(cal.load("onnxruntime", cache))
    return get_target(args.target)


def _optimize(graph: Graph, rules: RuleSet, args: argparse.Namespace, log: TextIO) -> tuple[Graph, OptimizeReport]:
    """Optimize with the common options and print the report to ``log`` (as JSON with ``--json``); with
    ``--measure``, the input and the result are measured in onnxruntime first."""
    verify = args.verify
    if getattr(args, "verify_inputs", None):
        if verify is False:
            raise UsageError("--verify-inputs gives the data of the parity check, which --no-verify switches off")
        verify = read_reference_inputs(args.verify_inputs, graph)
    options = Options(target=_target(args), rules=rules, verify=verify, extraction=args.extraction,
                      engine=args.engine)
    new, report = optimize_with_report(graph, options=options)
    if getattr(args, "measure", False):
        _needs_onnxruntime("--measure")
        from ..onnx import measure_report  # the onnx extra, needed by this flag only

        measure_report(report, graph, new, threads=args.threads)
    print(report.to_json() if args.json else report, file=log)
    return new, report


def _demo(args: argparse.Namespace) -> None:
    rules = _ruleset(args)
    graph = examples.llama(layers=args.layers)
    rules_text = "the shipped rewrite rules" if not (args.rules or args.only_rules) else "the given rewrite rules"
    cost_model = f"the '{args.target}' IO cost model (kernel launches, bytes moved, FLOPs)"
    stages = ", ".join(STAGES)
    if engine_by_size(args.engine, len(graph)) == "fallback":
        how = (f"has {rules_text} (stages {stages}) matched on it by the fallback engine, each rewrite taken when it "
               f"lowers the predicted time under {cost_model}")
    else:
        how = (f"is encoded into an egglog e-graph, saturated with {rules_text} (stages {stages}), and the cheapest "
               f"equivalent graph under {cost_model} is extracted and decoded back into a graph")
    print(textwrap.fill(
        f"rlx-egraph demo: a {args.layers}-layer Llama decoder, written in the primitive ops a PyTorch -> ONNX "
        f"export produces (decomposed RMSNorm and SiLU, separate q/k/v and gate/up projections), {how}"
        + (", then every node is checked against the input graph with numpy." if args.verify else "."), 100))
    print()
    print("input " + summarize(graph))
    print()
    new, _ = _optimize(graph, rules, args, sys.stdout)
    print()
    print(new)


def _optimize_cmd(args: argparse.Namespace) -> None:
    if args.json and args.output == STDOUT:
        raise UsageError("--json and -o - both write to stdout; write the report with --report-json FILE instead")
    if args.ort_optimized and not (args.output and Path(args.output).suffix == ".onnx"):
        raise UsageError("--ort-optimized writes an ONNX model: give -o OUTPUT.onnx")
    if args.ort_optimized:
        _needs_onnxruntime("--ort-optimized")
    if args.output and args.output != STDOUT and Path(args.output).suffix != ".onnx":
        graph_file_path(args.output)  # a bad output name fails before the run, not after it
    rules = _ruleset(args)
    graph = _load_graph(args.input, args)
    if args.output and Path(args.output).suffix == ".onnx":
        from ..onnx import check_weights

        check_weights(graph)  # before the run, not after it
    log = sys.stderr if args.output == STDOUT or args.json else sys.stdout  # stdout then carries only JSON
    if args.quiet:
        log = _Discard()
    print("input " + summarize(graph), file=log)
    new, report = _optimize(graph, rules, args, sys.stdout if args.json else log)
    if args.report:
        print(f"fusion report: {report.fusion}", file=log)
    if args.report_json:
        Path(args.report_json).write_text(report.to_json())
        print(f"wrote report {args.report_json}", file=log)
    if args.html:
        Path(args.html).write_text(report.to_html(), encoding="utf-8")
        print(f"wrote HTML report {args.html}", file=log)
    if args.output == STDOUT:
        print(new.to_json(indent=1))
    elif args.output and Path(args.output).suffix == ".onnx":
        from ..onnx import export_model

        # weights beside the model (OUTPUT.data) when they pass 1 GB
        written = export_model(new, args.output, ort_optimized=args.ort_optimized)
        how = f" (onnxruntime's offline optimization: {len(written.graph.node)} nodes)" if args.ort_optimized else ""
        print(f"wrote {args.output}{how}", file=log)
    elif args.output:
        new.save(args.output)
        print(f"wrote {args.output}: {len(new)} nodes", file=log)
    elif not args.json:
        print(file=log)
        print(new)


def _example(args: argparse.Namespace) -> None:
    build = examples.ALL[args.name]
    kwargs = {}
    if args.layers is not None:
        if "layers" not in inspect.signature(build).parameters:
            raise UsageError(f"example {args.name!r} has no --layers option")
        kwargs["layers"] = args.layers
    graph = build(**kwargs)
    graph.save(args.output)
    print(f"wrote {args.output}: " + summarize(graph))


def _rules_list(args: argparse.Namespace) -> None:
    ruleset = RuleSet.from_files(*args.files) if args.files else RuleSet.shipped()
    if args.json:
        print(json.dumps(ruleset.list(), indent=1))
        return
    rules = sorted(ruleset.list(), key=lambda r: STAGES.index(r["stage"]))  # stable: file order within a stage
    print(format_table(("stage", "name", "location", "orders", "builds"),
                       [(r["stage"], r["name"], r["location"], str(r["operand_orders"]), " ".join(r["builds"]))
                        for r in rules], "<<<><"))
    print(f"{len(rules)} rules ({len(ruleset.rules)} with their generated operand orders) from "
          f"{len(ruleset.files)} files; stages run in order: {', '.join(STAGES)}")


def _rules_check(args: argparse.Namespace) -> int:
    """Check the rules of FILES with the soundness checker (:mod:`..engines.egglog.soundness`); exit 1 when one is
    unsound."""
    result = check(RuleSet.from_files(*args.files))
    print(json.dumps(result.to_dict(), indent=1) if args.json else result)
    return 0 if result.ok else EXIT_PARITY


def _needs_onnxruntime(what: str) -> None:
    """UsageError unless onnx and onnxruntime (the ``onnx`` extra) are installed."""
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        raise UsageError(f"{what} runs onnxruntime: install the onnx extra (pip install 'rlx-egraph[onnx]')")


def _calibrate(args: argparse.Namespace) -> None:
    """Measure the target's figures on this machine and cache them (``frontends/onnx/calibrate.py``)."""
    _needs_onnxruntime("calibrate")
    from ..frontends.onnx.calibrate import calibrate  # the onnx extra, needed by this subcommand only

    command = f"rlx-egraph calibrate --target {args.target} --threads {args.threads}"
    result = calibrate(args.target, threads=args.threads, cache=args.cache, progress=print, command=command)
    rows = [(key, f"{r.launch_ns:,.0f}", f"{1 / r.ns_per_byte:,.1f}" if r.ns_per_byte else "-",
             f"{1 / r.ns_per_flop:,.1f}" if r.ns_per_flop else "-", f"{r.ns_per_row:,.1f}" if r.ns_per_row else "-",
             f"{r.ns_per_matrix:,.0f}" if r.ns_per_matrix else "-") for key, r in sorted(result.rates.items())]
    print(format_table(("op or kind", "launch ns", "B/ns", "FLOP/ns", "ns/row", "ns/matrix"), rows, "<>>>>>"))
    print(f"run {result.run_ns:,.0f} ns, dispatch {result.dispatch_ns:,.0f} ns (a run-time shape node "
          f"{result.shape_ns:,.0f} ns), memory {result.memory_bw:,.1f} B/ns, "
          f"matmul {result.flops_per_ns:,.1f} FLOP/ns, weights from memory {result.stream_ns_per_byte:.4f} ns/B past "
          f"{result.cache_bytes:,} B")
    print(f"wrote {result.source}")


def _program(args: argparse.Namespace) -> None:
    print(dump_egglog_program(_load_graph(args.input, args), _ruleset(args),
                              form="terms" if args.terms else "rows"))


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _input_shape(text: str) -> tuple[str, tuple[str, ...]]:
    """``NAME=D1,D2,...``: each D a number, a symbol name, or ``symbol=hint`` (read by the importer, which names a
    bad one)."""
    name, sep, dims = text.partition("=")
    shape = tuple(d.strip() for d in dims.split(","))
    if not sep or not name.strip() or not all(shape):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=D1,D2,... (each D a number, a symbol name, or "
                                         "symbol=hint)")
    return name.strip(), shape


def _max_dim(text: str) -> tuple[str, int]:
    """``SYMBOL=N``: the largest value symbol SYMBOL takes."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier() or not value.strip().isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not SYMBOL=N (a symbol name and an int >= 1)")
    return name.strip(), int(value)


def _verbosity(parser: argparse.ArgumentParser, default: Any) -> None:
    """``-v`` (repeatable) and ``-q``: what the run shows on stderr besides its results."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="count", default=default,
                       help="also log each phase with its time (-vv: each step, such as a saturation iteration)")
    group.add_argument("-q", "--quiet", action="store_true", default=default,
                       help="errors only: no progress display, no warnings, no lines about what was read or written")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="rlx-egraph", description="Optimize ML computation graphs by equality "
                                     "saturation with egglog.", epilog=EXIT_CODES_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rlx-egraph {__version__}")
    _verbosity(parser, argparse.SUPPRESS)  # before the command or (below) after it
    parser.set_defaults(verbose=0, quiet=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    verbosity = argparse.ArgumentParser(add_help=False)
    _verbosity(verbosity, argparse.SUPPRESS)

    def command(name: str, parents: Sequence[argparse.ArgumentParser] = (), under: Any = sub,
                **kwargs: str) -> argparse.ArgumentParser:
        return under.add_parser(name, parents=[*parents, verbosity], epilog=EXIT_CODES_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)

    rules = argparse.ArgumentParser(add_help=False)
    rules.add_argument("--rules", nargs="+", action="extend", metavar="FILE_OR_DIR",
                       help="rule files or folders to add to the shipped rules/")
    rules.add_argument("--only-rules", nargs="+", action="extend", metavar="FILE_OR_DIR",
                       help="rule files or folders to use instead of the shipped rules/")
    rules.add_argument("--disable", action="append", metavar="NAME", help="switch off the rule NAME; repeatable")
    graph_input = argparse.ArgumentParser(add_help=False)
    graph_input.add_argument("input", metavar="INPUT.json", help="a graph (.json) or an ONNX model (.onnx)")
    graph_input.add_argument("--input-shape", action="append", type=_input_shape, metavar="NAME=D1,D2,...",
                             help="the dims of an ONNX input: each a number (fixes it), a symbol name (keeps it "
                                  "symbolic), or symbol=hint (symbolic, priced at hint); repeatable")
    graph_input.add_argument("--max-dim", action="append", type=_max_dim, metavar="SYMBOL=N",
                             help="the largest value of a symbolic dim of an ONNX model (decides the shape steps "
                                  "that hold only up to N; stated in the report); repeatable")
    target = argparse.ArgumentParser(add_help=False)
    target.add_argument("--target", default="cpu", choices=list(TARGETS), help="cost model (default: cpu)")
    target.add_argument("--extraction", default="greedy", choices=EXTRACTIONS,
                        help="greedy (default) or exact (an integer program, HiGHS through highspy)")
    target.add_argument("--engine", default="auto", choices=ENGINES,
                        help="egglog (saturate and extract), fallback (the same rules matched on the graph), or "
                             f"auto (default: the fallback above {FALLBACK_THRESHOLD:,} nodes or when egglog stops "
                             "at a limit)")

    p = command("demo", [target, rules], help="optimize the example Llama decoder and show what happened")
    p.add_argument("--layers", type=_non_negative, default=2, help="decoder layers (default: 2)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="check the result against the input with numpy (default: on)")
    p.set_defaults(run=_demo, json=False)

    p = command("optimize", [graph_input, target, rules], help="optimize a graph saved as JSON or an ONNX model")
    p.add_argument("-o", "--output", metavar="OUTPUT.json",
                   help=f"write the optimized graph here, as ONNX when it ends in .onnx ('{STDOUT}': its JSON to "
                        "stdout and the report to stderr; default: print the report and the graph table)")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                   help="check the result against the input with numpy (default: when rules from outside the "
                        "shipped set are loaded)")
    p.add_argument("--verify-inputs", metavar="FEEDS.npz",
                   help="check the result on these values of the graph's inputs (arrays by input name, as "
                        "numpy.savez writes them; the other inputs are drawn at random); implies --verify")
    p.add_argument("--report-json", metavar="R.json", help="write the full report as JSON")
    p.add_argument("--html", metavar="REPORT.html",
                   help="write the report as one self-contained HTML page: both graphs drawn, fusions, missed "
                        "fusions, cost charts, e-graph statistics")
    p.add_argument("--report", action="store_true",
                   help="also print the fusion report: fused ops before/after and every missed fusion with why")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON on stdout, and nothing else there (other messages go to stderr)")
    p.add_argument("--measure", action="store_true",
                   help="also run the input and the result in onnxruntime and print the measured latency beside the "
                        "predicted one (needs the onnx extra)")
    p.add_argument("--ort-optimized", action="store_true",
                   help="with -o OUTPUT.onnx: write the graph onnxruntime's CPU session makes of the export "
                        "(its offline optimization, ORT_ENABLE_ALL; faster to load and, on convolutional models, "
                        "to run; specific to this machine's instruction set; needs onnxruntime)")
    p.add_argument("--threads", type=_positive, default=1, help="onnxruntime threads for --measure (default: 1)")
    p.add_argument("--cache", metavar="DIR", help="read the onnxruntime target's calibration from DIR (default: "
                   f"${cal.CACHE_ENV}, else the user cache directory)")
    p.set_defaults(run=_optimize_cmd)

    p = command("example", help="save an example model graph as JSON")
    p.add_argument("name", choices=list(examples.ALL), metavar="NAME", help=f"one of {', '.join(examples.ALL)}")
    p.add_argument("--layers", type=_non_negative, help="number of layers (models that have layers)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.json")
    p.set_defaults(run=_example)

    p = command("rules", help="list or check rewrite rules")
    rules_sub = p.add_subparsers(dest="rules_command", required=True, metavar="list|check")
    p = command("list", under=rules_sub, help="list the rules of FILES (default: the shipped rules)")
    p.add_argument("files", nargs="*", metavar="FILE_OR_DIR", help="rule files or folders (default: rules/)")
    p.add_argument("--json", action="store_true", help="one JSON record per rule")
    p.set_defaults(run=_rules_list)
    p = command("check", under=rules_sub, help="check that the rules of FILES are sound (exit 1 if one is not)")
    p.add_argument("files", nargs="+", metavar="FILE.egg", help="rule files or folders")
    p.add_argument("--json", action="store_true", help="the result as JSON")
    p.set_defaults(run=_rules_check)

    p = command("program", [graph_input, rules], help="print the whole egglog program for a graph")
    p.add_argument("--terms", action="store_true",
                   help="write the graph as one readable term per node ($n<id>; for small graphs), not as rows")
    p.set_defaults(run=_program)

    p = command("calibrate", help="measure a target's cost figures on this machine and cache them")
    p.add_argument("--target", default="onnxruntime", choices=["onnxruntime"], help="the target (onnxruntime)")
    p.add_argument("--threads", type=_positive, default=1, help="onnxruntime intra-op threads (default: 1)")
    p.add_argument("--cache", metavar="DIR", help=f"cache directory (default: ${cal.CACHE_ENV}, else the user "
                   "cache directory)")
    p.set_defaults(run=_calibrate)
    return parser


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def _fail(message: str, code: int) -> int:
    """Print ``message`` as one ``error:`` line on stderr; returns ``code``."""
    print("error: " + " ".join(message.split()), file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit code (see the module docstring)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return int(exc.code or 0)
    try:
        with _output(args):
            code = args.run(args) or 0
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away: stop quietly, and keep the exit-time flush from failing too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except ParityInputError as exc:  # the check could not run on its data: no wrong rule
        return _fail(str(exc), EXIT_INPUT)
    except (ParityError, UnsoundRewrite) as exc:
        return _fail(str(exc), EXIT_PARITY)
    except (GraphError, RuleError, UnsupportedOp, UsageError, OSError, cal.CalibrationError) as exc:
        return _fail(_describe(exc), EXIT_INPUT)
    except ImportError as exc:  # an optional dependency missing: its message names the extra to install
        if not isinstance(exc, RlxError):
            return _fail(f"internal error: {type(exc).__name__}: {exc} (please report)", EXIT_INTERNAL)
        return _fail(str(exc), EXIT_INPUT)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except MemoryError:
        return _fail("out of memory: the run needs more memory than this process may take (try smaller input "
                     "sizes, or --no-verify)", EXIT_INPUT)
    except Exception as exc:  # a bug: one line, no traceback
        return _fail(f"internal error: {type(exc).__name__}: {exc} (please report)", EXIT_INTERNAL)
    return code


if __name__ == "__main__":
    sys.exit(main())
