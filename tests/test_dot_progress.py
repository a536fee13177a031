"""Graph and e-graph pictures (report/dot.py), progress per phase and logging (report/progress.py)."""

from __future__ import annotations

import logging
import re
import time

import pytest

from rlx_egraph import Graph, optimize_with_report
from rlx_egraph.egraph.decode import Fusion
from rlx_egraph.report import progress
from rlx_egraph.report.dot import FUSED_COLOR, Picture, RenderError, can_render, egraph_to_dot, to_svg


def mlp() -> Graph:
    g = Graph("mlp")
    x = g.input("x", (4, 64))
    w, b = g.param("w", (64, 64)), g.param("b", (64,))
    g.set_outputs([g.gelu(g.add(g.matmul(x, w), b))])
    return g


FUSED_LINE = (f'  n3 [label="%3 FusedMatMulBiasAct\\nf32[4, 64]", tooltip="%3 FusedMatMulBiasAct(act=gelu)\\nf32[4, 64]'
              f'\\nbuilt by: matmul-bias-gelu\\nreplaces input node(s): %5", fillcolor="{FUSED_COLOR}", '
              'peripheries="2"];')


def test_to_dot_highlights_fused_nodes_with_their_provenance() -> None:
    opt, report = optimize_with_report(mlp())
    dot = opt.to_dot(report)
    lines = dot.splitlines()
    assert lines[0] == 'digraph "mlp" {' and lines[-1] == "}"
    assert FUSED_LINE in lines
    assert '  n0 [label="%0 Input\\nx\\nf32[4, 64]", tooltip="%0 Input(name=x, shape=[4, 64], dtype=f32)\\n' \
           'f32[4, 64]", fillcolor="#e0e0e0", shape="ellipse"];' in lines
    assert [line for line in lines if "->" in line] == ["  n0 -> n3;", "  n1 -> n3;", "  n2 -> n3;"]
    # the same provenance as the fusions list or a mapping; without it, no tooltip names rules
    assert opt.to_dot(report.fusions) == dot == opt.to_dot({f.node: f for f in report.fusions})
    bare = opt.to_dot()
    assert "built by" not in bare and f'fillcolor="{FUSED_COLOR}", peripheries="2"' in bare


def test_to_dot_escapes_quotes_and_backslashes_and_refuses_bad_provenance() -> None:
    g = Graph('a"b\\c')
    g.set_outputs([g.relu(g.input("x", (2,)))])
    assert g.to_dot().splitlines()[0] == 'digraph "a\\"b\\\\c" {'
    with pytest.raises(TypeError, match=r"^provenance must be an OptimizeReport, a mapping node id -> Fusion "
                                        r"or Fusions, not int$"):
        g.to_dot(3)
    with pytest.raises(TypeError, match=r"^provenance holds str 'x', not a Fusion$"):
        g.to_dot(["x"])
    assert g.to_dot([Fusion(1, "Relu", ("r",), (1,))]).count("built by: r") == 1


def test_egraph_picture_comes_from_egglogs_serializer() -> None:
    dot = egraph_to_dot(mlp())
    assert dot == egraph_to_dot(mlp())  # deterministic
    assert dot.count("subgraph cluster_") == 6  # x, w, b, matmul, add (+ its fused form), gelu (+ its fused form)
    enodes = re.findall(r'^    "[^"]+" \[label="(\w+)', dot, re.MULTILINE)
    assert sorted(enodes) == sorted(["Input", "Param", "Param", "MatMul", "Add", "FusedMatMulBiasAct", "Gelu",
                                     "FusedMatMulBiasAct"])
    assert 'label="FusedMatMulBiasAct\\n\\"gelu\\"", fillcolor="#f4a259", tooltip="built by: matmul-bias-gelu"' in dot
    assert 'label="Param\\n\\"w\\", [64, 64], \\"f32\\"", tooltip="from the input graph"' in dot
    assert "merged-by" not in dot and "built-" not in dot  # fact tables are left out


def test_svg_rendering_says_what_to_install_without_graphviz(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    assert not can_render()
    with pytest.raises(RenderError, match=r"^rendering SVG needs the Graphviz 'dot' program on the PATH "):
        to_svg("digraph { a }")
    picture = Picture("digraph { a }")
    assert picture._repr_svg_() is None and repr(picture) == "digraph { a }"


def test_svg_is_rendered_where_graphviz_is_installed_else_the_documented_error() -> None:
    """Real SVG with Graphviz's dot on the PATH (README: apt-get install graphviz); else the error saying so."""
    opt, report = optimize_with_report(mlp())
    dot = opt.to_dot(report)
    if not can_render():  # a machine without Graphviz: the message names what to install
        with pytest.raises(RenderError, match=r"^rendering SVG needs the (graphviz Python package|Graphviz 'dot' "
                                              r"program).*apt-get install graphviz"):
            to_svg(dot)
        assert Picture(dot)._repr_svg_() is None
        return
    svg = to_svg(dot)
    assert svg.startswith("<?xml") and "<svg " in svg and svg.rstrip().endswith("</svg>")
    assert sorted(re.findall(r"<title>([^<]+)</title>", svg)) == ["mlp", "n0", "n0&#45;&gt;n3", "n1", "n1&#45;&gt;n3",
                                                                  "n2", "n2&#45;&gt;n3", "n3"]
    assert svg.count('class="node"') == 4 and svg.count('class="edge"') == 3
    assert f'fill="{FUSED_COLOR}"' in svg and ">%3 FusedMatMulBiasAct</text>" in svg
    assert Picture(dot)._repr_svg_() == svg
    with pytest.raises(RenderError, match=r"^Graphviz 'dot' refused the DOT text: .*syntax error"):
        to_svg("digraph { a -> }")


def test_the_library_logger_is_quiet_by_default_and_logs_each_phase(caplog: pytest.LogCaptureFixture) -> None:
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("rlx_egraph").handlers)
    caplog.set_level(logging.DEBUG)  # the root logger at DEBUG: what an application's basicConfig(DEBUG) does
    optimize_with_report(mlp(), verify=True)
    assert [r.name for r in caplog.records if r.name.startswith("egglog")] == []
    phases = [re.fullmatch(r"optimize: (\w+) took \d+\.\d{3} s", r.getMessage()) for r in caplog.records
              if r.name == "rlx_egraph"]
    assert [m.group(1) for m in phases if m] == ["encode", "saturate", "extract", "decode", "regions", "verify"]


def test_progress_is_off_in_tests_and_closes_when_the_run_fails() -> None:
    assert not progress.interactive()
    assert not progress.PhaseProgress("optimize").show
    with pytest.raises(ValueError, match="boom"), progress.tracking("t", show=True) as run:
        progress.phase("encode")
        raise ValueError("boom")
    assert run.current is None and [name for name, _ in run.done] == ["encode"] and not run.drawing
    progress.phase("outside")  # no tracked run: nothing happens


def test_a_long_run_draws_its_phase_and_the_finished_ones() -> None:
    run = progress.PhaseProgress("optimize", show=True, show_after=0.0)
    run.phase("encode")
    deadline = time.monotonic() + 5
    while not run.drawing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert run.drawing and run.text() == "rlx-egraph optimize: encode..."
    run.phase("saturate")
    assert re.fullmatch(r"rlx-egraph optimize: saturate\.\.\.  \(encode \d+\.\d\d s\)", run.text())
    run.close()
    assert not run.drawing and [name for name, _ in run.done] == ["encode", "saturate"]
