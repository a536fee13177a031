"""The rlx-egraph CLI (in-process through ``main(argv)``, and ``demo`` as a real process) and the bench script."""

from __future__ import annotations

import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import rlx_egraph
from benchmarks import bench
from rlx_egraph import Graph, RuleSet, dump_egglog_program, evaluate, examples
from rlx_egraph.cli import main as cli
from rlx_egraph.cli.main import (
    EXIT_BROKEN_PIPE,
    EXIT_CODES_HELP,
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_PARITY,
    main,
)
from rlx_egraph.engines.egglog import STAGES, load_rules

# llama(layers=1) optimizes 62 -> 34 nodes on cpu: these fused ops replace its norms, projections and attention.
LLAMA1_FUSED = Counter(FusedRmsNormMatMul=3, FusedMatMulAdd=2, FusedSwiGLU=1, CausalAttentionRoPE=1, ConcatParams=2)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def llama1(tmp_path: Path) -> Path:
    path = tmp_path / "llama1.json"
    examples.llama(layers=1).save(path)
    return path


# --- demo ------------------------------------------------------------------------------------------------------------


def test_demo_runs_as_a_process() -> None:
    proc = subprocess.run([sys.executable, "-m", "rlx_egraph.cli.main", "demo"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert out.startswith("rlx-egraph demo: a 2-layer Llama decoder")
    assert "input graph llama_L2_H64: 110 nodes, 1 output(s)\nops: Param 21, MatMul 15, Mul 14," in out
    assert "=== rlx-egraph optimize report (egglog engine, target cpu) ===" in out
    assert "graph: 110 nodes -> 62 nodes" in out
    assert "parity: ok on " in out
    assert "fused ops: CausalAttentionRoPE 0->2, FusedMatMulAdd 0->4, FusedRmsNormMatMul 0->5, FusedSwiGLU 0->2; " \
           "missed 0 (0 not extracted, 0 near, 0 in graph)" in out
    assert "graph llama_L2_H64: 62 nodes, outputs ['%61']" in out  # the optimized graph table
    table_ops = [line.split()[1:3] for line in out.splitlines() if line.startswith("  %")]
    assert sum("FusedRmsNormMatMul" in ops for ops in table_ops) == 5


def test_demo_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "demo", "--layers", "1", "--no-verify", "--target", "cuda")
    assert (code, err) == (0, "")
    assert "a 1-layer Llama decoder" in out
    assert "under the 'cuda' IO cost model" in out
    assert "target cuda" in out
    assert "graph: 62 nodes -> " in out
    assert "parity" not in out
    assert "numpy" not in out  # the header only promises a check when there is one


def test_demo_with_the_fallback_engine_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "demo", "--layers", "1", "--engine", "fallback")
    assert code == 0
    assert "matched on it by the fallback engine" in " ".join(out.split()) and "egglog e-graph" not in out
    assert "(fallback engine, target cpu)" in out and "parity: ok" in out


# --- optimize --------------------------------------------------------------------------------------------------------


def test_optimize_writes_an_optimized_graph_and_report(capsys: pytest.CaptureFixture[str], llama1: Path,
                                                       tmp_path: Path) -> None:
    out_path, report_path = tmp_path / "opt.json", tmp_path / "report.json"
    code, out, err = run_cli(capsys, "optimize", llama1, "-o", out_path, "--verify", "--report-json", report_path)
    assert (code, err) == (0, "")
    original, optimized = Graph.load(llama1), Graph.load(out_path)
    assert len(optimized) == 34 < len(original) == 62
    assert Counter({op: n for op, n in optimized.op_counts().items() if op in LLAMA1_FUSED}) == LLAMA1_FUSED
    assert not {"Pow", "ReduceMean", "Rsqrt", "Sigmoid", "RoPE"} & set(optimized.op_counts())
    np.testing.assert_allclose(evaluate(optimized)[0], evaluate(original)[0], rtol=1e-4, atol=1e-5)
    assert "input graph llama_L1_H64: 62 nodes" in out
    assert "graph: 62 nodes -> 34 nodes" in out
    assert "parity: ok on " in out
    assert out.endswith(f"wrote report {report_path}\nwrote {out_path}: 34 nodes\n")
    report = json.loads(report_path.read_text())
    assert (report["nodes_before"], report["nodes_after"], report["target"]) == (62, 34, "cpu")
    assert report["parity"]["ok"] is True
    assert report["fused_op_counts"]["FusedRmsNormMatMul"] == 3


def test_optimize_without_output_prints_the_graph(capsys: pytest.CaptureFixture[str], llama1: Path) -> None:
    code, out, _ = run_cli(capsys, "optimize", llama1)
    assert code == 0
    assert "graph llama_L1_H64: 34 nodes, outputs ['%33']" in out
    assert "parity" not in out  # --verify is off by default here
    assert "wrote" not in out


def test_optimize_with_an_unsound_rule_fails_parity(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    graph, rule = tmp_path / "mlp.json", tmp_path / "unsound.egg"
    examples.mlp().save(graph)
    rule.write_text('(rewrite (Relu ?x) ?x :ruleset simplify :name "drop-relu")\n')
    code, _, err = run_cli(capsys, "optimize", graph, "--only-rules", rule, "--verify", "-o", tmp_path / "never.json")
    assert code == EXIT_PARITY
    assert err.startswith("error: parity failure: node ")
    assert err.rstrip().endswith(f"built by rule(s): drop-relu ({rule}:1)")
    assert not (tmp_path / "never.json").exists()


def test_optimize_to_stdout_writes_only_the_graph_json(capsys: pytest.CaptureFixture[str], llama1: Path,
                                                     tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    code, out, err = run_cli(capsys, "optimize", llama1, "-o", "-", "--verify", "--report-json", report_path)
    assert code == 0
    optimized = Graph.from_json(out)
    assert len(optimized) == 34
    assert out == optimized.to_json(indent=1) + "\n"
    assert err.startswith("input graph llama_L1_H64: 62 nodes, 1 output(s)\n")
    assert "graph: 62 nodes -> 34 nodes" in err and "parity: ok on " in err
    assert err.endswith(f"wrote report {report_path}\n")
    assert json.loads(report_path.read_text())["nodes_after"] == 34


EXP_LOG = ';; exp(log(x)) = x for x > 0\n(rewrite (Exp (Log ?x)) ?x :ruleset simplify :name "exp-log")\n'


@pytest.fixture
def exp_log(tmp_path: Path) -> tuple[Path, Path]:
    """A graph relu(exp(log(sigmoid(x)))) * (x * sigmoid(x)) (7 nodes), and a rule file with exp-log."""
    g = Graph()
    x = g.input("x", (4, 8))
    s = g.sigmoid(x)
    g.set_outputs([g.mul(g.relu(g.exp(g.log(s))), g.mul(x, s))])
    graph, rule = tmp_path / "g.json", tmp_path / "mine.egg"
    g.save(graph)
    rule.write_text(EXP_LOG)
    return graph, rule


def test_optimize_rules_are_added_to_the_shipped_ones(capsys: pytest.CaptureFixture[str],
                                                      exp_log: tuple[Path, Path]) -> None:
    graph, rule = exp_log
    code, out, err = run_cli(capsys, "optimize", graph, "--rules", rule, "--json")
    assert (code, err.splitlines()[0]) == (0, "input graph graph: 7 nodes, 1 output(s)")
    report = json.loads(out)  # stdout holds only the report
    assert set(report["matches_per_rule"]) == {"exp-log", "silu-mul-sigmoid", "swiglu"}  # base names of the orders
    assert (report["nodes_after"], report["fused_op_counts"]) == (3, {"ElementwiseRegion": 1, "SwiGLU": 1})


def test_optimize_only_rules_replaces_the_shipped_ones(capsys: pytest.CaptureFixture[str],
                                                       exp_log: tuple[Path, Path]) -> None:
    graph, rule = exp_log
    code, out, _ = run_cli(capsys, "optimize", graph, "--only-rules", rule, "--json")
    assert code == 0
    report = json.loads(out)
    assert list(report["matches_per_rule"]) == ["exp-log"]
    assert (report["nodes_after"], report["fused_op_counts"]) == (5, {})  # x, Sigmoid, Relu, Mul, Mul


def test_optimize_disable_switches_rules_off(capsys: pytest.CaptureFixture[str], exp_log: tuple[Path, Path]) -> None:
    graph, rule = exp_log
    code, out, _ = run_cli(capsys, "optimize", graph, "--rules", rule, "--disable", "exp-log", "--disable",
                           "silu-mul-sigmoid", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["matches_per_rule"] == {}
    assert (report["nodes_after"], report["fused_op_counts"]) == (5, {"ElementwiseRegion": 1})
    code, out, err = run_cli(capsys, "optimize", graph, "--disable", "silu-mul-sigmod")
    assert (code, out) == (EXIT_INPUT, "")
    assert err == "error: no rule named 'silu-mul-sigmod' to disable; close names: silu-mul-sigmoid\n"


def test_optimize_exact_extraction(capsys: pytest.CaptureFixture[str], llama1: Path) -> None:
    code, out, err = run_cli(capsys, "optimize", llama1, "--extraction", "exact", "--json")
    assert (code, err.splitlines()[0]) == (0, "input graph llama_L1_H64: 62 nodes, 1 output(s)")
    report = json.loads(out)
    assert (report["nodes_before"], report["nodes_after"]) == (62, 34)
    assert report["extraction"] == "exact"


@pytest.mark.parametrize("engine", ["egglog", "fallback"])
def test_optimize_runs_the_engine_asked_for(capsys: pytest.CaptureFixture[str], llama1: Path, engine: str) -> None:
    code, out, _ = run_cli(capsys, "optimize", llama1, "--engine", engine, "--json")
    report = json.loads(out)
    assert (code, report["engine"], report["engine_reason"]) == (0, engine, "requested")
    assert (report["nodes_before"], report["nodes_after"]) == (62, 34)


@pytest.mark.parametrize("engine", ["auto", "egglog", "fallback"])
def test_a_graph_with_an_op_its_target_does_not_run_exits_2_naming_the_node(capsys: pytest.CaptureFixture[str],
                                                                            tmp_path: Path, engine: str) -> None:
    g = Graph()
    cat = g.exp(g.input("cat", (4, 16)))
    g.set_outputs([g.swiglu(g.narrow(cat, start=0, length=8), g.narrow(cat, start=8, length=8))])  # not on ORT
    g.save(tmp_path / "swiglu.json")
    code, out, err = run_cli(capsys, "optimize", tmp_path / "swiglu.json", "--target", "onnxruntime",
                             "--engine", engine)
    assert code == EXIT_INPUT
    assert err.splitlines()[-1] == ("error: node 4 (SwiGLU): target onnxruntime does not run SwiGLU, and no rule "
                                    "gives a way to compute its value with ops it runs")
    assert "Traceback" not in err and "Traceback" not in out


def test_optimize_json_and_graph_on_stdout_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                            llama1: Path) -> None:
    code, out, err = run_cli(capsys, "optimize", llama1, "--json", "-o", "-")
    assert (code, out) == (EXIT_INPUT, "")
    assert err == ("error: --json and -o - both write to stdout; write the report with --report-json FILE "
                   "instead\n")


# --- error paths -----------------------------------------------------------------------------------------------------


def test_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    codes = {0: "success", EXIT_PARITY: "an unsound rule", EXIT_INPUT: "bad input", EXIT_INTERNAL: "internal error",
             EXIT_INTERRUPTED: "interrupted", EXIT_BROKEN_PIPE: "stdout closed early"}
    assert (EXIT_PARITY, EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE) == (1, 2, 3, 130, 141)
    for argv in (["--help"], ["optimize", "--help"]):
        code, out, _ = run_cli(capsys, *argv)
        assert code == 0
        assert out.endswith("\n" + EXIT_CODES_HELP)
        listed = [line.split(maxsplit=1) for line in out.split("exit codes:\n")[1].splitlines()]
        assert [int(number) for number, _ in listed] == list(codes)
        assert all(text.startswith(codes[int(number)]) for number, text in listed)
    assert EXIT_CODES_HELP.replace("exit codes:", "Exit codes:").replace("| head", "``| head``") in cli.__doc__


def _file(nodes: list[dict[str, object]], outputs: object = (1,)) -> dict[str, object]:
    return {"format": "rlx-egraph-mir", "version": 1, "nodes": nodes,
            "outputs": list(outputs) if isinstance(outputs, tuple) else outputs}


X = {"id": 0, "op": "Input", "inputs": [], "attrs": {"name": "x", "shape": [2, 3]}}


def _relu(**fields: object) -> dict[str, object]:
    return {"id": 1, "op": "Relu", "inputs": [0], "attrs": {}, **fields}


# Malformed graph files: each is one error line with exit code 2, never a traceback.
BAD_GRAPH_FILES: list[tuple[str, bytes, str]] = [
    ("op-list", json.dumps(_file([X, _relu(op=["Relu"])])).encode(),
     "node 1: 'op' must be the name of an op, got ['Relu']"),
    ("inputs-int", json.dumps(_file([X, _relu(inputs=5)])).encode(),
     "node 1 (Relu): 'inputs' must be a list of node ids, got 5"),
    ("attrs-list", json.dumps(_file([X, _relu(attrs=[1])])).encode(),
     "node 1 (Relu): 'attrs' must be an object mapping attribute names to values, got [1]"),
    ("attrs-string", json.dumps(_file([X, _relu(attrs="ab")])).encode(),
     "node 1 (Relu): 'attrs' must be an object mapping attribute names to values, got 'ab' (a string)"),
    ("outputs-int", json.dumps(_file([X, _relu()], 1)).encode(), "outputs must be a list of node ids, got 1"),
    ("outputs-null", json.dumps(_file([X, _relu()], [None])).encode(),
     "output 0 must be a node id (an int), got None"),
    ("outputs-name", json.dumps(_file([X, _relu()], ["x"])).encode(),
     "output 0 must be a node id (an int), got 'x' (a string)"),
    ("outputs-string", json.dumps(_file([X, _relu()], "1")).encode(),
     "outputs must be a list of node ids, got '1' (a string)"),
    ("shape-int", json.dumps(_file([X, _relu(shape=5)])).encode(),
     "node 1 (Relu): 'shape' must be a list of ints, got 5"),
    ("input-string", json.dumps(_file([X, _relu(inputs=["0"])])).encode(),
     "node 1 (Relu): input 0 must be a node id (an int), got '0' (a string)"),
    ("no-op", json.dumps(_file([X, {"id": 1, "inputs": [0]}])).encode(), "node 1 has no 'op'"),
    ("dim-2**64", json.dumps(_file([{**X, "attrs": {"name": "x", "shape": [2**64]}}], [0])).encode(),
     "node 0 (Input): dimension 18446744073709551616 of shape [18446744073709551616] is out of range "
     "(dims are ints in [0, 2**31))"),
    ("deeply-nested", b"[" * 100_000 + b"]" * 100_000, "graph file is nested too deeply to read"),
    ("not-utf8", b'{"format": "rlx-egraph-mir", "name": "\xe9"}',
     "graph file is not UTF-8 text (invalid continuation byte at byte 38)"),
]


@pytest.mark.parametrize(("content", "message"), [c[1:] for c in BAD_GRAPH_FILES], ids=[c[0] for c in BAD_GRAPH_FILES])
@pytest.mark.parametrize("command", ["optimize", "program"])
def test_malformed_graph_file_is_one_error_line_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          command: str, content: bytes, message: str) -> None:
    path = tmp_path / "g.json"
    path.write_bytes(content)
    code, out, err = run_cli(capsys, command, path, *(["-o", tmp_path / "out.json"] if command == "optimize" else []))
    assert (code, out) == (EXIT_INPUT, "")
    assert err == f"error: {path}: {message}\n"
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("command", ["optimize", "rules", "program"])
def test_rule_file_that_is_not_utf8_is_one_error_line_naming_it(capsys: pytest.CaptureFixture[str], llama1: Path,
                                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                command: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("latin1.egg").write_bytes(b';; caf\xe9\n(rewrite (Neg (Neg ?x)) ?x :ruleset simplify :name "nn")\n')
    args = ["list", "latin1.egg"] if command == "rules" else [llama1, "--rules", "latin1.egg"]
    code, _, err = run_cli(capsys, command, *args)
    assert code == EXIT_INPUT
    assert err == ("error: latin1.egg:1: not UTF-8 text (invalid continuation byte 0xe9 at byte 6, column 7); "
                   "rule files must be UTF-8\n")


def test_non_ascii_names_are_valid_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    g = Graph("größe")
    x, w = g.input("x_é", (2, 4)), g.param("权重", (4, 4))
    g.set_outputs([g.relu(g.matmul(x, w))])
    path, out_path = tmp_path / "g.json", tmp_path / "out.json"
    g.save(path)
    code, _, err = run_cli(capsys, "optimize", path, "--verify", "-o", out_path)
    assert (code, err) == (0, "")
    optimized = Graph.load(out_path)
    assert [n.name for n in optimized.inputs + optimized.params] == ["x_é", "权重"]


@pytest.mark.parametrize(("raised", "expected_code", "line"), [
    (RuntimeError("egglog said:\n  something broke"), EXIT_INTERNAL,
     "error: internal error: RuntimeError: egglog said: something broke (please report)"),
    (RecursionError("maximum recursion depth exceeded"), EXIT_INTERNAL,
     "error: internal error: RecursionError: maximum recursion depth exceeded (please report)"),
    (cli.UnsoundRewrite("e-class 7 holds Relu f32[2] and Narrow f32[1]"), EXIT_PARITY,
     "error: e-class 7 holds Relu f32[2] and Narrow f32[1]"),
    (KeyboardInterrupt(), EXIT_INTERRUPTED, "error: interrupted"),
], ids=["internal", "recursion", "unsound", "interrupted"])
def test_failure_inside_optimize_is_one_error_line(capsys: pytest.CaptureFixture[str], llama1: Path,
                                                   monkeypatch: pytest.MonkeyPatch, raised: BaseException,
                                                   expected_code: int, line: str) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(cli, "optimize_with_report", fail)
    code, _, err = run_cli(capsys, "optimize", llama1)
    assert code == expected_code
    assert err == line + "\n"


def _graph_text(version: int) -> str:
    data = examples.mlp(layers=1).to_dict()
    data["version"] = version
    return json.dumps(data)


@pytest.mark.parametrize(("text", "message"), [
    (None, "No such file or directory"),
    ('{"format": "rlx-egraph-mir", ', "graph file is not valid JSON"),
    ('{"format": "something-else", "version": 1}', "not an rlx-egraph graph: expected format 'rlx-egraph-mir'"),
    (_graph_text(99), "graph format version 99 is not supported (this library reads versions 1 and 2)"),
    ('{"format": "rlx-egraph-mir", "version": 1, "outputs": [0], "nodes": [{"id": 0, "op": "Relu", "inputs": [7]}]}',
     "node 0 (Relu): input 0 refers to node 7, which is not in the graph"),
], ids=["missing", "not-json", "wrong-format", "wrong-version", "dangling-input"])
@pytest.mark.parametrize("command", ["optimize", "program"])
def test_bad_graph_files_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str,
                                text: str | None, message: str) -> None:
    path = tmp_path / "in.json"
    if text is not None:
        path.write_text(text)
    code, out, err = run_cli(capsys, command, path)
    assert code == EXIT_INPUT
    assert out == ""
    assert err.startswith(f"error: {path}: ")
    assert message in err
    assert err.count("\n") == 1  # one line, no traceback


BAD_RULES = [
    (';; a comment\n(rewrite (Relu ?x) (Neg ?x) :ruleset simplify :name "fine")\n'
     '(rewrite (Relu ?x) (Neg ?x)) :ruleset simplify :name "oops")\n', "bad.egg:3: parse error: unexpected `)`"),
    ('\n(rewrite (Relu ?x) (Neg ?x) :name "no-stage")\n',
     "bad.egg:2: rule no-stage needs ':ruleset' set to one of simplify, recognize, fuse, blocks"),
    ('(rewrite (Relu ?x) (Neg ?x) :ruleset fuse :name "fine")\n'
     '(rewrite (Relu ?x 1) (Neg ?x) :ruleset fuse :name "arity")\n',
     "bad.egg:2: rule 'arity': wrong arity: Relu takes 1 argument (x), got 2 in (Relu ?x 1)"),
]


@pytest.mark.parametrize(("text", "message"), BAD_RULES, ids=["syntax", "no-stage", "arity"])
@pytest.mark.parametrize("command", ["optimize", "rules", "program"])
def test_bad_rule_files_exit_2_with_file_and_line(capsys: pytest.CaptureFixture[str], llama1: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch, command: str, text: str,
                                                   message: str) -> None:
    monkeypatch.chdir(tmp_path)  # rule locations are shown relative to the working directory
    Path("bad.egg").write_text(text)
    args = ["list", "bad.egg"] if command == "rules" else [llama1, "--rules", "bad.egg"]
    code, _, err = run_cli(capsys, command, *args)
    assert code == EXIT_INPUT
    assert err.startswith(f"error: {message}")
    assert err.count("\n") == 1


def test_missing_rule_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "rules", "list", tmp_path / "none.egg")
    assert code == EXIT_INPUT
    assert err == f"error: {tmp_path / 'none.egg'}: no such rule file or folder\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["optimize"], "the following arguments are required: INPUT.json"),
    (["example", "resnet", "-o", "x.json"], "argument NAME: invalid choice: 'resnet'"),
    (["demo", "--layers", "-1"], "argument --layers: -1 is negative"),
    (["demo", "--target", "tpu"], "argument --target: invalid choice: 'tpu'"),
    ([], "the following arguments are required: COMMAND"),
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    assert message in err


def test_closed_stdout_exits_quietly() -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: like `rlx-egraph rules list | head` after head exits
    try:
        proc = subprocess.run([sys.executable, "-m", "rlx_egraph.cli.main", "rules", "list"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (EXIT_BROKEN_PIPE, "")


# --- example, rules, program ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "expected"), [
    (["llama", "--layers", "1"], examples.llama(layers=1)),
    (["bert"], examples.bert()),
    (["conv_block"], examples.conv_block()),
    (["mlp", "--layers", "0"], examples.mlp(layers=0)),
])
def test_example_saves_the_model(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str],
                                 expected: Graph) -> None:
    path = tmp_path / "model.json"
    code, out, err = run_cli(capsys, "example", *argv, "-o", path)
    assert (code, err) == (0, "")
    assert Graph.load(path) == expected
    assert out.startswith(f"wrote {path}: graph {expected.name}: {len(expected)} nodes, 1 output(s)\nops: ")


def test_example_rejects_layers_for_a_model_without_layers(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "example", "conv_block", "--layers", "2", "-o", tmp_path / "c.json")
    assert code == EXIT_INPUT
    assert err == "error: example 'conv_block' has no --layers option\n"
    assert not (tmp_path / "c.json").exists()


def test_rules_lists_every_shipped_rule_in_stage_order(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "rules", "list")
    assert code == 0
    shipped = load_rules()
    lines = out.splitlines()
    assert lines[0].split() == ["stage", "name", "location", "orders", "builds"]
    written = [r for r in shipped.rules if r.name == r.base]
    assert lines[-1] == (f"{len(written)} rules ({len(shipped.rules)} with their generated operand orders) from "
                         f"{len(shipped.files)} files; stages run in order: simplify, recognize, fuse, blocks")
    rows = [line.split() for line in lines[1:-1]]
    assert sorted((r[0], r[1], r[2]) for r in rows) == sorted((r.stage, r.name, r.location) for r in written)
    assert sum(int(r[3]) for r in rows) == len(shipped.rules)
    stage_index = [STAGES.index(r[0]) for r in rows]
    assert stage_index == sorted(stage_index)
    rms = shipped.by_name("rms-norm-matmul")
    assert any(r[1] == "rms-norm-matmul" and r[2] == rms.location and "FusedRmsNormMatMul" in r[3:] for r in rows)


def test_rules_with_a_user_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("mine.egg").write_text(';; my rule\n(rewrite (Neg (Relu ?x)) (Neg (Relu ?x)) :ruleset fuse :name "mine")\n')
    code, out, _ = run_cli(capsys, "rules", "list", "mine.egg")
    assert code == 0
    assert out.splitlines()[1].split() == ["fuse", "mine", "mine.egg:2", "1", "Neg", "Relu"]
    assert out.splitlines()[-1].startswith("1 rules (1 with their generated operand orders) from 1 files")


def test_rules_list_json_gives_one_record_per_rule(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_cli(capsys, "rules", "list", "--json")
    assert code == 0
    assert json.loads(out) == RuleSet.shipped().list()
    monkeypatch.chdir(tmp_path)
    Path("mine.egg").write_text(EXP_LOG)
    code, out, _ = run_cli(capsys, "rules", "list", "mine.egg", "--json")
    assert (code, json.loads(out)) == (0, [{"name": "exp-log", "stage": "simplify", "file": "mine.egg", "line": 2,
                                            "location": "mine.egg:2", "reads": ["Exp", "Log"], "builds": [],
                                            "operand_orders": 1}])


def test_rules_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "rules")
    assert (code, out) == (EXIT_INPUT, "")
    assert err.endswith("error: the following arguments are required: list|check\n")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--version")
    assert (code, out) == (0, f"rlx-egraph {rlx_egraph.__version__}\n")
    assert rlx_egraph.__version__ == importlib.metadata.version("rlx-egraph")


def test_program_prints_the_egglog_program(capsys: pytest.CaptureFixture[str], llama1: Path) -> None:
    code, out, _ = run_cli(capsys, "program", llama1)
    assert code == 0
    assert out == dump_egglog_program(Graph.load(llama1)) + "\n"
    assert "(run-schedule" in out


# --- bench -----------------------------------------------------------------------------------------------------------


def test_onnx_output_of_a_graph_without_weights_fails_before_the_run(capsys: pytest.CaptureFixture[str], llama1: Path,
                                                                     tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "optimize", llama1, "-o", tmp_path / "out.onnx")
    assert code == EXIT_INPUT and out == "" and not (tmp_path / "out.onnx").exists()
    assert err.startswith("error: export needs every parameter's value in graph.weights; missing: ['embed_tokens")
    assert err.count("\n") == 1  # one line: no report, so no run


def test_ort_optimized_writes_onnxruntimes_offline_graph(capsys: pytest.CaptureFixture[str], llama1: Path,
                                                         tmp_path: Path) -> None:
    """--ort-optimized saves what onnxruntime's ORT_ENABLE_ALL session makes of the export; without -o X.onnx it
    is one usage error line before the run."""
    import onnx

    from onnx_models import resnet_block
    from rlx_egraph.frontends.onnx.compare import session

    model = tmp_path / "block.onnx"
    onnx.save(resnet_block(), str(model))
    code, out, _ = run_cli(capsys, "optimize", model, "--target", "onnxruntime", "-o", tmp_path / "ours.onnx",
                           "--ort-optimized")
    assert code == 0 and out.splitlines()[-1].startswith(f"wrote {tmp_path / 'ours.onnx'} (onnxruntime's offline "
                                                         "optimization: ")
    assert run_cli(capsys, "optimize", model, "--target", "onnxruntime", "-o", tmp_path / "plain.onnx")[0] == 0
    session(tmp_path / "plain.onnx", "ORT_ENABLE_ALL", tmp_path / "session.onnx")
    saved, expected = (onnx.load(str(tmp_path / name)).graph.node for name in ("ours.onnx", "session.onnx"))
    assert [(n.domain, n.op_type) for n in saved] == [(n.domain, n.op_type) for n in expected]
    code, out, err = run_cli(capsys, "optimize", llama1, "--ort-optimized")
    assert (code, out, err) == (EXIT_INPUT, "", "error: --ort-optimized writes an ONNX model: give -o OUTPUT.onnx\n")


def test_exact_extraction_json_is_all_that_reaches_stdout(tmp_path: Path) -> None:
    """HiGHS writes a banner to the process's stdout when a process makes its first solver: not into --json."""
    path = tmp_path / "llama.json"
    examples.llama(1).save(path)
    proc = subprocess.run([sys.executable, "-m", "rlx_egraph.cli.main", "optimize", str(path), "--extraction", "exact",
                           "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["extraction"] == "exact"
    assert "HiGHS" not in proc.stderr


def test_exact_extraction_runs_in_a_process_without_stdout() -> None:
    """Keeping HiGHS's banner out of stdout must not need a stdout (a daemon has no descriptor 1)."""
    code = ("import os, sys; os.close(1)\n"
            "from rlx_egraph import examples, optimize_with_report\n"
            "_, report = optimize_with_report(examples.llama(1), extraction='exact')\n"
            "sys.stderr.write(report.extraction)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert (proc.returncode, proc.stderr) == (0, "exact")


@pytest.fixture
def one_bench_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's runs in one spawned process, reused, rather than a new one per run (what the figures and
    assertions of these tests read is the same; a new process per run only makes each peak RSS that run's own, and
    test_bench_engines_prints_both_engines_their_agreement_and_parity keeps it): a spawned process imports the
    package (and onnxruntime) again, a second of the suite's time per run."""

    def one_process(workers: int, mp_context: object, max_tasks_per_child: int | None = None) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(workers, mp_context=mp_context)

    monkeypatch.setattr(bench, "ProcessPoolExecutor", one_process)


def test_bench_cases_keep_the_given_order() -> None:
    names = [c.name for c in bench.cases(["bert", "synthetic", "llama"], [8, 1])]
    assert names == ["bert-8", "bert-1", "synthetic-20000", "llama-8", "llama-1"]


def test_bench_engines_prints_both_engines_their_agreement_and_parity(capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_egraph.cost import profile
    from rlx_egraph.optimize import optimize_with_report

    assert bench.main(["engines", "--no-models", "--nodes", "1000"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("case "))
    assert header.split()[:3] == ["case", "nodes", "egglog"] and header.split()[-3:] == ["parity", "stopped", "auto"]
    row = next(line for line in out if line.startswith("synthetic-1000 ")).split()
    assert row[1] == "1,000" and row[-3:] == ["ok/ok", "end/end", "egglog"]
    g = examples.synthetic(1000)
    costs = [profile(optimize_with_report(g, engine=e)[0]).ns for e in ("egglog", "fallback")]
    assert row[-6:-3] == [f"{costs[0]:,.0f}", f"{costs[1]:,.0f}", f"{100 * (costs[1] - costs[0]) / costs[0]:+.2f}"]


@pytest.mark.usefixtures("one_bench_process")
def test_bench_engines_repeat_gives_each_engines_least_and_median_seconds(capsys: pytest.CaptureFixture[str]
                                                                          ) -> None:
    assert bench.main(["engines", "--no-models", "--nodes", "1000", "--repeat", "2"]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    header = next(line for line in out if line.startswith("case "))
    assert header.split()[2:6] == ["egglog", "least", "s", "egglog"]  # then "median s"
    assert "fallback least s  fallback median s" in header
    row = next(line for line in out if line.startswith("synthetic-1000 ")).split()
    eg_least, eg_median = float(row[2]), float(row[3])
    fb_least, fb_median = float(row[-10]), float(row[-9])
    assert 0 < eg_least <= eg_median and 0 < fb_least <= fb_median
    progress = [line for line in captured.err.splitlines() if line.startswith("synthetic-1000: ")]
    assert len(progress) == 2  # one line per round of both engines
    ran = [float(part.split()[1]) for line in progress for part in line.split(": ")[1].split(", ")
           if part.startswith("fallback ")]
    assert fb_least == min(ran) and fb_median == pytest.approx(sum(ran) / 2, abs=0.006)
    assert row[-3:] == ["ok/ok", "end/end", "egglog"]


def test_bench_engines_rejects_a_repeat_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["engines", "--no-models", "--nodes", "1000", "--repeat", "0"])
    assert "--repeat must be at least 1, not 0" in capsys.readouterr().err


def test_runs_of_one_case_that_disagree_are_an_error() -> None:
    runs = [bench.EngineRun(1.0, 1.0, {}, 100.0, ns, True, "saturated") for ns in (10.0, 10.0, 11.0)]
    with pytest.raises(RuntimeError, match="llama-2, fallback engine: runs of the same case gave different results"):
        bench._least_run(runs, "llama-2, fallback engine")
    assert bench._least_run(runs[:2], "x") is runs[0]
    failed = bench.EngineRun(0.5, 0.5, {}, 100.0, 10.0, False, "saturated")  # the same cost, but parity failed
    with pytest.raises(RuntimeError, match="runs of the same case gave different results"):
        bench._least_run([runs[0], failed], "llama-2, egglog engine")


@pytest.mark.long
@pytest.mark.usefixtures("one_bench_process")
def test_bench_engines_runs_the_onnx_models_of_a_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import onnx

    from onnx_models import MODELS

    for name, build in MODELS.items():
        onnx.save(build(), tmp_path / f"{name}.onnx")
    assert bench.main(["engines", "--onnx", str(tmp_path), "--no-models"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in out[2:]}
    assert sorted(rows) == sorted(MODELS)  # no example model, no synthetic DAG
    for name, row in rows.items():
        assert row[1] == f"{len(bench.OnnxCase(tmp_path / f'{name}.onnx').build()):,}"
        assert row[-6] == row[-5]  # the same predicted ns: the engines agree on these exports
        assert float(row[-11]) > 0 and float(row[-8]) > 0  # CPU seconds of the timed runs (no parity check)
        assert row[-4:] == ["+0.00", "ok/ok", "end/end", "egglog"]


def test_bench_overhead_splits_the_work_around_saturation(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["overhead", "--nodes", "1000"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.lstrip().startswith("nodes "))
    assert header.split() == ["nodes", "saturate", "s", "around", "s", "load", "s", "read", "s", "ours", "s",
                              "around/sat", "load+read/sat", "ours/sat", "paired", "ours/sat", "first", "run:",
                              "saturate", "s", "around", "s", "ours/sat", "paired", "ours/sat"]
    row = out[out.index(header) + 1].split()
    assert row[0] == "1,000"
    saturation, around, load, read, ours = map(float, row[1:6])
    assert saturation > 0 and load > 0 and read > 0
    assert ours == pytest.approx(around - load - read, abs=0.002)  # each printed to 0.001
    around_ratio, egglog_ratio, ours_ratio, paired = map(float, row[6:10])
    # each ratio to one decimal, from the unrounded seconds (printed to 0.001); "ours" may be near or below 0 at 1k,
    # where egglog's part, timed apart after the runs, can take as long as all the time around saturation
    slack = 0.05 + 0.002 / saturation
    assert around_ratio == pytest.approx(around / saturation, abs=slack)
    assert egglog_ratio == pytest.approx((load + read) / saturation, abs=slack)
    assert ours_ratio == pytest.approx(ours / saturation, abs=slack)
    # the columns add up (three roundings to 0.1): around = egglog's part + ours, though ours can be at or below 0
    assert around_ratio == pytest.approx(egglog_ratio + ours_ratio, abs=0.151) and egglog_ratio > 0
    # one run: its own ratio, from the unrounded seconds (those printed are rounded to 0.001)
    assert paired == pytest.approx(ours / saturation, abs=0.005 + 0.002 / saturation)
    # the process's first run, with egglog's part as timed after both runs
    first_saturation, first_around, first_ratio, first_paired = map(float, row[10:14])
    assert first_saturation > 0 and first_around > 0
    first_ours = first_around - load - read
    assert first_ratio == pytest.approx(first_ours / first_saturation, abs=0.05 + 0.004 / first_saturation)
    assert first_paired == pytest.approx(first_ours / first_saturation, abs=0.005 + 0.004 / first_saturation)


def test_bench_overhead_repeated_keeps_each_columns_least(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["overhead", "--nodes", "1000", "--repeat", "2"]) == 0
    captured = capsys.readouterr()
    runs = [line.split() for line in captured.err.splitlines() if line.startswith("1,000 nodes:")]
    assert len(runs) == 2
    assert "least of 2 runs" in " ".join(captured.out.split())
    header = next(line for line in captured.out.splitlines() if line.lstrip().startswith("nodes "))
    row = captured.out.splitlines()[captured.out.splitlines().index(header) + 1].split()
    saturation, around, load, read, ours = map(float, row[1:6])
    # each stderr line: "<n> nodes: saturate S s, around it A s, ours/sat R; first run: saturate S s, around it A s,
    # ours/sat R"
    assert saturation == pytest.approx(min(float(r[3]) for r in runs), abs=0.001)  # the least
    assert around == pytest.approx(min(float(r[7]) for r in runs), abs=0.001)  # the least
    assert ours == pytest.approx(around - load - read, abs=0.002)  # from the least of each
    assert float(row[9]) == pytest.approx(statistics.median(float(r[10].rstrip(";")) for r in runs), abs=0.011)
    assert float(row[10]) == pytest.approx(min(float(r[14]) for r in runs), abs=0.001)  # the first runs' least
    assert float(row[11]) == pytest.approx(min(float(r[18]) for r in runs), abs=0.001)
    assert float(row[13]) == pytest.approx(statistics.median(float(r[-1]) for r in runs), abs=0.011)
    with pytest.raises(SystemExit):
        bench.main(["overhead", "--nodes", "1000", "--repeat", "0"])
    assert "--repeat must be at least 1, not 0" in capsys.readouterr().err


@pytest.mark.long
def test_bench_fingerprint_digests_each_result_the_same_way_twice(capsys: pytest.CaptureFixture[str]) -> None:
    """One row per case, target and engine, with the predicted ns and node count of that run; a second invocation
    prints the same; the digest follows the graph and the fusions, not the run."""
    from rlx_egraph.optimize import optimize_with_report

    argv = ["fingerprint", "--models", "mlp,conv_block", "--layers", "1", "--nodes", "1000", "--targets", "cpu,cuda"]
    assert bench.main(argv) == 0
    first = capsys.readouterr().out
    assert bench.main(argv) == 0
    assert capsys.readouterr().out == first
    rows = [line.split() for line in first.splitlines()[1:]]  # after the header
    assert [r[:3] for r in rows] == [[c, t, e] for c in ("mlp-1", "conv_block-0", "synthetic-1000")
                                     for t in ("cpu", "cuda") for e in ("egglog", "fallback")]
    out, report = optimize_with_report(examples.mlp(layers=1), "cuda", engine="fallback")
    assert rows[3][3:] == [f"{report.profile_after.ns:.4f}", f"{len(out):,}", bench.result_digest(out, report.fusions)]
    assert bench.result_digest(out, report.fusions[1:]) != rows[3][5]  # a fusion fewer
    assert bench.result_digest(examples.mlp(layers=1), report.fusions) != rows[3][5]  # another graph
    with pytest.raises(SystemExit):
        bench.main(["fingerprint", "--engines", "egglog,greedy"])
    assert "engines must be among egglog, fallback (got 'egglog,greedy')" in capsys.readouterr().err


@pytest.mark.long
def test_bench_agreement_lists_the_random_graphs_the_engines_price_apart(capsys: pytest.CaptureFixture[str]) -> None:
    """Each listed graph is priced again here, and the count in the first line adds up.  The first 62 graphs list
    one: graph 61 on metal, with the shared pair ``Add(x@w1, x@w2)``, where the fallback's choice is cheaper than
    the egglog engine's greedy extraction."""
    import random

    from rlx_egraph.optimize import optimize_with_report

    assert bench.main(["agreement", "--graphs", "62", "--targets", "cpu,metal"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out[2:]]
    assert rows and out[0].startswith(f"{62 - len(rows)} of 62 random graphs (seed 0, targets cpu,metal in turn")
    rng = random.Random(0)
    plans = [examples.random_plan(rng) for _ in range(62)]
    for row in rows:
        k, target = int(row[0]), row[1]
        assert target == ("cpu", "metal")[k % 2] and row[5:] == [step for step, _, _ in plans[k]]
        eg, fb = (optimize_with_report(examples.random_graph(plans[k]), target, engine=e, regions=False)[1]
                  .profile_after.ns for e in ("egglog", "fallback"))
        assert row[2:5] == [f"{eg:,.1f}", f"{fb:,.1f}", f"{100 * (fb - eg) / eg:+.2f}"]
        assert "shared_pair" in row[5:]


@pytest.mark.usefixtures("one_bench_process")
def test_bench_quick_rows_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    # llama-1 has 108 e-nodes and llama-2 200: the ILP runs on the first only.
    code = bench.main(["--quick", "--models", "llama,synthetic", "--exact-max-enodes", "150", "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0
    data = json.loads(path.read_text())
    rows = data["rows"]
    assert [r["case"] for r in rows] == ["llama-1", "llama-2"]  # --quick drops synthetic and uses layers 1, 2
    one, two = rows
    assert (one["nodes_before"], one["nodes_after"], one["enodes"]) == (62, 34, 108)
    assert (two["nodes_before"], two["nodes_after"], two["enodes"]) == (110, 62, 200)
    assert Counter(one["fused_op_counts"]) == LLAMA1_FUSED - Counter(ConcatParams=2)  # fused ops: no views, weights
    assert one["ilp_finished"] is True
    assert one["exact_ns"] == pytest.approx(one["greedy_ns"])
    assert (two["exact_ns"], two["ilp_seconds"], two["ilp_finished"]) == (None, None, False)
    for r in rows:
        assert set(r["phases"]) == {"encode", "saturate", "extract", "decode"}
        assert r["total_seconds"] >= sum(r["phases"].values())
        assert r["peak_rss_mb"] > 20 and r["cpu_seconds"] > 0
        assert r["gain_pct"] == pytest.approx(100 * (r["before_ns"] - r["after_ns"]) / r["before_ns"])
    table = out.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("case "))
    assert table[header].split()[-3:] == ["ns", "fused", "ops"]
    assert table[header + 1].split()[:5] == ["llama-1", "62", "34", "68", "108"]
    gap = 14  # case, 2 node counts, 2 e-graph sizes, 4 phases, total, peak, before, after, gain, then gap
    assert table[header + 1].split()[gap] == "0"  # greedy found the optimum
    assert table[header + 2].split()[:5] == ["llama-2", "110", "62", "122", "200"]
    assert table[header + 2].split()[gap] == "-"
    assert "RmsNormMatMul:3" in table[header + 1]
    assert err.splitlines() == [f"[1/2] llama-1: {one['total_seconds']:.2f} s",
                                f"[2/2] llama-2: {two['total_seconds']:.2f} s"]


def test_bench_rejects_unknown_models() -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--models", "llama,gpt9"])
    assert exc.value.code == 2


def test_bench_models_prints_both_engines_costs_per_case_and_target(capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_egraph.optimize import optimize_with_report

    assert bench.main(["models", "--models", "mlp", "--layers", "1", "--targets", "metal"]) == 0
    out = capsys.readouterr().out.splitlines()
    [row] = [line.split() for line in out[2:]]
    graph = examples.mlp(layers=1)
    eg, fb = (optimize_with_report(graph, "metal", engine=e)[1].profile_after.ns for e in ("egglog", "fallback"))
    assert row == ["mlp-1", "metal", f"{len(graph):,}", f"{eg:,.0f}", f"{fb:,.0f}", f"{100 * (fb / eg - 1):+.2f}"]
    apart = abs(100 * (fb / eg - 1))
    assert out[0].endswith(f"1 cases, {int(apart <= 2)} within 2 %, worst {apart:.2f} %")
