"""Graph and e-graph pictures (report/dot.py), progress per phase and logging (report/progress.py)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

from rlx_egraph import Graph, optimize_with_report
from rlx_egraph.engines.egglog.decode import Fusion
from rlx_egraph.engines.egglog.rules import load_rules
from rlx_egraph.report import progress
from rlx_egraph.report.dot import (
    FUSED_COLOR,
    Picture,
    RenderError,
    can_render,
    egraph_to_dot,
    report_egraph_to_dot,
    to_svg,
)


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
    """Real SVG with Graphviz's dot on the PATH (docs/report.md: apt-get install graphviz); else the error saying so."""
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


def test_the_library_logger_is_quiet_by_default_and_logs_each_phase_once(caplog: pytest.LogCaptureFixture) -> None:
    """INFO: one line per phase, with the time the report records for it (the regions pass used to be logged with
    the report's summaries in its time); DEBUG: one line per saturation iteration."""
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("rlx_egraph").handlers)
    caplog.set_level(logging.DEBUG)  # the root logger at DEBUG: what an application's basicConfig(DEBUG) does
    _, report = optimize_with_report(mlp(), verify=True)
    assert [r.name for r in caplog.records if r.name.startswith("egglog")] == []
    ours = [r for r in caplog.records if r.name == "rlx_egraph"]
    phases = [m for r in ours if r.levelno == logging.INFO
              and (m := re.fullmatch(r"optimize: (\w+) (\d+\.\d{3}) s(: .*)?", r.getMessage()))]
    assert [m.group(1) for m in phases] == list(report.phases) == \
        ["encode", "saturate", "extract", "decode", "regions", "report", "verify"]
    assert [float(m.group(2)) for m in phases] == [round(report.phases[m.group(1)], 3) for m in phases]
    assert phases[1].group(3) == f": {len(report.iterations)} iterations over 4 stages, " \
                                 f"{report.iterations[-1].enodes} e-nodes; saturated"
    assert phases[-1].group(3) == ": " + str(report).splitlines()[-2]  # the parity headline
    iterations = [r.getMessage() for r in ours if r.levelno == logging.DEBUG]
    assert len(iterations) == len(report.iterations) == 6
    assert 0 < report.iterations[2].match_limit < 10_000  # bounded: the room over the fuse stage's e-nodes per match
    assert iterations[2] == (f"optimize: saturate: fuse iteration (bounded, match limit "
                             f"{report.iterations[2].match_limit:,}) "
                             f"{report.iterations[2].seconds:.3f} s: 2 matches (matmul-bias x1, "
                             "shared-input-weight x1), 7 e-nodes after")
    first, last = ours[0].getMessage(), ours[-1].getMessage()
    shipped = load_rules(None)
    assert first == (f"optimize mlp: 6 nodes, target cpu, {len({r.base for r in shipped.rules})} rules from "
                     f"{len(shipped.sources)} files; values checked: requested (verify=True)")
    assert re.fullmatch(r"optimize mlp: 6 -> 4 nodes in \d+\.\d{3} s \(egglog engine; saturated\)", last)


def test_importing_the_package_logs_nothing_from_egglog() -> None:
    """egglog's loggers are set to WARNING before the package runs egglog at import."""
    code = "import logging; logging.basicConfig(level=logging.DEBUG); import rlx_egraph; print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout == "ok\n"
    assert [line for line in proc.stderr.splitlines() if "egglog" in line] == []


def test_progress_mode_is_chosen_from_the_setting_the_environment_and_the_session(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert progress.progress_mode() == "off"  # auto, under pytest
    monkeypatch.setenv(progress.ENV_MODE, "lines")
    assert progress.progress_mode() == "lines"
    with progress.progress_set("terminal"):
        assert progress.progress_mode() == "terminal"
    assert progress.progress_mode() == "lines"
    monkeypatch.setenv(progress.ENV_MODE, "loud")
    with pytest.raises(ValueError, match=r"^RLX_EGRAPH_PROGRESS must be one of auto, terminal, jupyter, lines, off, "
                                         r"got 'loud'$"):
        progress.progress_mode()
    with pytest.raises(ValueError, match=r"^progress mode must be one of auto, terminal, jupyter, lines, off, got "
                                         r"'on'$"):
        progress.set_progress("on")
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    monkeypatch.delenv(progress.ENV_MODE)
    assert progress.progress_mode() == "lines"  # stderr is captured here: not a terminal, not Jupyter


def test_progress_closes_when_the_run_fails_and_does_nothing_outside_a_run() -> None:
    with pytest.raises(ValueError, match="boom"), progress.tracking("t", mode="lines") as run:
        progress.phase("encode")
        raise ValueError("boom")
    assert run.current is None and [name for name, _ in run.done] == ["encode"] and not run.drawing
    progress.phase("outside")  # no tracked run: nothing happens
    progress.step("outside")


def test_a_long_run_prints_plain_lines(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)
    times: dict[str, float] = {}
    with progress.progress_set("lines", after=0.0), progress.tracking("optimize") as run:
        with progress.timed("encode", times):
            pass
        with progress.timed("saturate", times):
            progress.step("fuse: 12 matches")
    lines = capsys.readouterr().err.splitlines()
    assert [re.sub(r"\d+\.\d+ s", "T", line) for line in lines] == [
        "rlx-egraph optimize: encode...",
        "rlx-egraph optimize: saturate...  (encode T)",
        "rlx-egraph optimize: saturate running for T (fuse: 12 matches)",
        "rlx-egraph optimize: done in T (encode T, saturate T)"]
    assert list(times) == ["encode", "saturate"] and not run.drawing


def test_a_short_run_draws_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.progress_set("lines", after=60.0), progress.tracking("optimize") as run:
        progress.phase("encode")
    assert capsys.readouterr().err == "" and [name for name, _ in run.done] == ["encode"]


def test_a_long_run_draws_its_phases_in_a_terminal() -> None:
    run = progress.PhaseProgress("optimize", mode="terminal", after=0.0)
    run.phase("encode")
    assert run.drawing and run.text() == "rlx-egraph optimize: encode..."
    run.phase("saturate")
    run.step("fuse: 12 matches")
    assert re.fullmatch(r"rlx-egraph optimize: saturate \(fuse: 12 matches\)\.\.\.  \(encode \d+\.\d\d s\)", run.text())
    tasks = run._view.progress.tasks
    assert [(t.description, t.finished, t.fields["detail"]) for t in tasks] == [
        ("optimize: encode", True, ""), ("optimize: saturate", False, "fuse: 12 matches")]
    run.close()
    assert not run.drawing and [name for name, _ in run.done] == ["encode", "saturate"]
    assert not run._view.progress.live.is_started


def test_a_long_run_draws_an_html_block_in_jupyter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The block is displayed once and updated in place (IPython's display handle); tests/test_notebooks.py runs it
    in a real kernel."""
    import IPython.display

    shown: list[str] = []

    class Handle:
        def update(self, obj: IPython.display.HTML) -> None:
            shown.append(obj.data)

    def display(obj: IPython.display.HTML, display_id: bool) -> Handle:
        assert display_id is True
        shown.append(obj.data)
        return Handle()

    monkeypatch.setattr(IPython.display, "display", display)
    run = progress.PhaseProgress("optimize", mode="jupyter", after=0.0)
    run.phase("encode")
    run.phase("saturate")
    run.close()
    assert len(shown) == 3
    assert "rlx-egraph optimize: running for" in shown[0] and "<td>encode</td>" in shown[0]
    final = re.sub(r"\d+\.\d+ s", "T", shown[-1])
    assert "rlx-egraph optimize: done in T" in final
    assert "<tr><td>✓</td><td>encode</td><td>T</td><td></td></tr><tr><td>✓</td><td>saturate</td><td>T</td>" in final


def test_the_egraph_picture_of_a_run_marks_the_chosen_enodes() -> None:
    """Drawn from report.data (no second saturation): ★ and a thick border on the e-nodes extraction chose."""
    _, report = optimize_with_report(mlp())
    dot = report_egraph_to_dot(report)
    chosen = re.findall(r'\[label="★ (\w+)[^"]*", (?:fillcolor="[^"]+", )?penwidth="2.5"', dot)
    assert sorted(chosen) == ["FusedMatMulBiasAct", "Input", "Param", "Param"] and len(report.data.choices) == 4
    assert 'label="FusedMatMulBiasAct-5 f32[4, 64]\\ninput nodes %5"' in dot
    assert f'e2 [label="★ FusedMatMulBiasAct(act=gelu)\\n4,262 ns", fillcolor="{FUSED_COLOR}", penwidth="2.5", ' \
           'tooltip="built by: matmul-bias-gelu"];' in dot
    assert dot.count("subgraph cluster_") == report.eclasses == 6
    _, fallback = optimize_with_report(mlp(), engine="fallback")
    with pytest.raises(ValueError, match=r"^the report has no e-graph tables \(the fallback engine ran"):
        report_egraph_to_dot(fallback)


def test_a_picture_without_graphviz_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    shown = Picture("digraph { a }")._repr_html_()
    assert shown.startswith("<div class=\"rlx-picture\"><p><b>this picture needs Graphviz&#x27;s &#x27;dot&#x27; "
                            "program, which is not on the PATH (apt-get install graphviz, brew install graphviz or "
                            "conda install graphviz); report.to_html() draws graphs without it</b></p>")
    assert "<pre>digraph { a }</pre>" in shown
