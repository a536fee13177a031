"""The egglog program in term form: one readable term per node that a person can re-run in egglog."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from egglog import bindings as eb

from rlx_egraph import Graph, dump_egglog_program, examples, optimize_with_report
from rlx_egraph.cli.main import main


def linear_gelu() -> Graph:
    g = Graph("linear")
    x, w, b = g.input("x", (4, 64)), g.param("w", (64, 64)), g.param("b", (64,))
    g.set_outputs([g.gelu(g.add(g.matmul(x, w), b))])
    return g


def every_argument_kind() -> Graph:
    """A variadic Concat, an absent optional input, a constant array, a Scalar -0.0, a multi-result node,
    Transposes that undo each other and a bool attribute."""
    g = Graph("kinds")
    x, r, w = g.input("x", (4, 8)), g.input("r", (4, 8)), g.param("w", (8,))
    both = g.fused_add_rms_norm(x, r, w)
    norm, total = g.get(both, index=0), g.get(both, index=1)
    t = g.transpose(g.transpose(total, perm=(1, 0)), perm=(1, 0))
    c = g.constant(np.arange(8, dtype=np.float32).reshape(1, 8))
    cat = g.concat([norm, t, g.mul(c, g.scalar(-0.0))], axis=0)
    g.set_outputs([g.fused_swiglu(cat, gate_first=True), g.rms_norm(x, w)])
    return g


def run(program: str) -> tuple[eb.EGraph, list]:
    egraph = eb.EGraph()
    return egraph, egraph.parse_and_run_program(program)


def op_rows(egraph: eb.EGraph) -> dict[str, int]:
    """Rows per constructor and fact table, leaving out the row form's loading tables and the term form's
    globals."""
    return {name: len(f.rows) for name, f in egraph.freeze().functions.items() if not name.startswith(("rlx-", "$"))}


def test_the_term_form_reads_one_line_per_node_and_reruns_to_the_fused_term() -> None:
    """design: egglog optimizer::dump_egglog_program and graph_to_egglog (one ``(let n<id> ...)`` per node over
    its inputs' names, the saturation, then ``(extract n<output>)``: a program a person reruns in egglog)."""
    program = dump_egglog_program(linear_gelu(), form="terms")
    graph_part = program[program.index(";; the graph"):program.index("(set (attention-block-max-tokens)")]
    assert graph_part.splitlines()[1:] == [
        '(let $n0 (Input "x" (vec-of 4 64) "f32")) (set (shape $n0) (vec-of 4 64)) (set (dtype $n0) "f32")',
        '(let $n1 (Param "w" (vec-of 64 64) "f32")) (set (shape $n1) (vec-of 64 64)) (set (dtype $n1) "f32") '
        '(set (param-order $n1) 0)',
        '(let $n2 (Param "b" (vec-of 64) "f32")) (set (shape $n2) (vec-of 64)) (set (dtype $n2) "f32") '
        '(set (param-order $n2) 1)',
        '(let $n3 (MatMul $n0 $n1)) (set (shape $n3) (vec-of 4 64)) (set (dtype $n3) "f32")',
        '(let $n4 (Add $n3 $n2)) (set (shape $n4) (vec-of 4 64)) (set (dtype $n4) "f32")',
        '(let $n5 (Gelu $n4 "none")) (set (shape $n5) (vec-of 4 64)) (set (dtype $n5) "f32")']
    assert program.endswith("(extract $n5)")
    _, outputs = run(program + '\n(check (= $n5 (FusedMatMulBiasAct $n0 $n1 $n2 "gelu")))')
    best = next(o for o in outputs if type(o).__name__ == "ExtractBest")
    assert best.termdag.to_string(best.term) == ('(FusedMatMulBiasAct (Input "x" (vec-of 4 64) "f32") (Param "w" '
                                                 '(vec-of 64 64) "f32") (Param "b" (vec-of 64) "f32") "gelu")')


@pytest.mark.parametrize("build", [every_argument_kind, lambda: examples.llama(layers=1)], ids=["kinds", "llama"])
def test_the_term_form_builds_the_egraph_the_row_form_builds(build) -> None:
    """design: egglog optimizer::dump_egglog_program (the program the optimizer runs, as text)."""
    g = build()
    rows, _ = run(dump_egglog_program(g))
    terms, _ = run(dump_egglog_program(g, form="terms"))
    assert op_rows(terms) == op_rows(rows)
    if build is every_argument_kind:
        assert {"Neg", "Scalar", "TCons", "NoInput", "Constant", "Get", "FusedAddRmsNorm"} <= op_rows(terms).keys()


def test_the_report_and_the_cli_give_the_term_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """design: OptimizeReport::egglog_program and dump_egglog_program."""
    g = linear_gelu()
    _, report = optimize_with_report(g)
    assert report.egglog_terms == dump_egglog_program(g, form="terms")
    assert "(rlx-node" in report.egglog_program and "(rlx-node" not in report.egglog_terms
    path = tmp_path / "g.json"
    g.save(path)
    assert main(["program", str(path), "--terms"]) == 0
    assert capsys.readouterr().out == dump_egglog_program(g, form="terms") + "\n"
    with pytest.raises(ValueError, match=r"form must be one of \['rows', 'terms'\], got 'tree'"):
        dump_egglog_program(g, form="tree")
