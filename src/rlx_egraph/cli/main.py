"""``rlx-egraph``: demo, optimize, example, rules (list, check) and program subcommands.

Rules: ``--rules F.egg`` adds files or folders to the shipped rules,
``--only-rules F.egg`` uses them instead, ``--disable NAME`` switches a rule off.

Every failure is one ``error: ...`` line on stderr (never a traceback) naming
the file, node, op or rule, and one of these exit codes:

Exit codes:
  0    success
  1    an unsound rule: the optimized graph failed the parity check, a rewrite was ill-typed, or rules check found one
  2    bad input: a missing or malformed graph or rule file, an unknown rule, bad arguments, an op the target cannot run
  3    internal error: a bug in rlx-egraph (the line says "please report")
  130  interrupted (Ctrl-C)
  141  stdout closed early, as in ``| head`` (128 + SIGPIPE, as a shell reports it)
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import signal
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from .. import __version__, examples
from ..cost.targets import TARGETS, UnsupportedOp
from ..egraph import STAGES, dump_egglog_program
from ..egraph.rules import RuleError, RuleSet
from ..egraph.view import UnsoundRewrite
from ..ir import Graph, GraphError
from ..ir.graph import graph_file_path
from ..kernels.parity import ParityError
from ..optimize import FALLBACK_THRESHOLD, engine_by_size, optimize_with_report
from ..options import ENGINES, EXTRACTIONS
from ..report import OptimizeReport

EXIT_PARITY = 1
EXIT_INPUT = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
EXIT_CODES_HELP = "exit codes:\n" + (__doc__ or "").partition("Exit codes:\n")[2].replace("``", "")
STDOUT = "-"  # as -o: write the graph JSON to stdout


class UsageError(ValueError):
    """A subcommand was given options that do not fit together."""


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


def _load_graph(path: str, input_shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    """A graph from JSON, or imported from an ``.onnx`` model with ``input_shapes``."""
    try:
        if Path(path).suffix != ".onnx":
            return Graph.load(path)
        from ..onnx import OnnxImportError, import_model

        try:
            return import_model(path, input_shapes)
        except OnnxImportError as exc:
            raise GraphError(exc.command_line_message()) from None  # its hint in this command line's terms
    except GraphError as exc:
        raise GraphError(f"{path}: {exc}") from None


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


def _optimize(graph: Graph, rules: RuleSet, args: argparse.Namespace, log: TextIO) -> tuple[Graph, OptimizeReport]:
    """Optimize with the common options and print the report to ``log`` (as JSON with ``--json``)."""
    new, report = optimize_with_report(graph, args.target, rules=rules, verify=args.verify,
                                       extraction=args.extraction, engine=args.engine)
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
    if args.output and args.output != STDOUT and Path(args.output).suffix != ".onnx":
        graph_file_path(args.output)  # a bad output name fails before the run, not after it
    rules = _ruleset(args)
    graph = _load_graph(args.input, dict(args.input_shape or []))
    if args.output and Path(args.output).suffix == ".onnx":
        from ..onnx import check_weights

        check_weights(graph)  # before the run, not after it
    log = sys.stderr if args.output == STDOUT or args.json else sys.stdout  # stdout then carries only JSON
    print("input " + summarize(graph), file=log)
    new, report = _optimize(graph, rules, args, sys.stdout if args.json else log)
    if args.report:
        print(f"fusion report: {report.fusion}", file=log)
    if args.report_json:
        Path(args.report_json).write_text(report.to_json())
        print(f"wrote report {args.report_json}", file=log)
    if args.output == STDOUT:
        print(new.to_json(indent=1))
    elif args.output and Path(args.output).suffix == ".onnx":
        import onnx

        from ..onnx import export_model

        onnx.save(export_model(new), args.output)
        print(f"wrote {args.output}", file=log)
    elif args.output:
        new.save(args.output)
        print(f"wrote {args.output}: {len(new)} nodes", file=log)
    elif not args.json:
        print()
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
    """Check the rules of FILES with the soundness checker (:mod:`..egraph.soundness`); exit 1 when one is unsound."""
    from ..egraph.soundness import check  # imported on use: only this subcommand needs it

    result = check(RuleSet.from_files(*args.files))
    print(json.dumps(result.to_dict(), indent=1) if args.json else result)
    return 0 if result.ok else EXIT_PARITY


def _program(args: argparse.Namespace) -> None:
    print(dump_egglog_program(_load_graph(args.input, dict(args.input_shape or [])), _ruleset(args)))


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=D1,D2,...")
    return name, shape


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="rlx-egraph", description="Optimize ML computation graphs by equality "
                                     "saturation with egglog.", epilog=EXIT_CODES_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rlx-egraph {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, parents: Sequence[argparse.ArgumentParser] = (), under: Any = sub,
                **kwargs: str) -> argparse.ArgumentParser:
        return under.add_parser(name, parents=list(parents), epilog=EXIT_CODES_HELP,
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
                             help="static shape of an ONNX input (binds its symbolic dims); repeatable")
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
    p.add_argument("--verify", action="store_true", help="check the result against the input with numpy")
    p.add_argument("--report-json", metavar="R.json", help="write the full report as JSON")
    p.add_argument("--report", action="store_true",
                   help="also print the fusion report: fused ops before/after and every missed fusion with why")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON on stdout, and nothing else there (other messages go to stderr)")
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
    p.set_defaults(run=_program)
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
        code = args.run(args) or 0
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away: stop quietly, and keep the exit-time flush from failing too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (ParityError, UnsoundRewrite) as exc:
        return _fail(str(exc), EXIT_PARITY)
    except (GraphError, RuleError, UnsupportedOp, UsageError, OSError) as exc:
        return _fail(_describe(exc), EXIT_INPUT)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except Exception as exc:  # a bug: one line, no traceback
        return _fail(f"internal error: {type(exc).__name__}: {exc} (please report)", EXIT_INTERNAL)
    return code


if __name__ == "__main__":
    sys.exit(main())
