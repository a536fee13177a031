"""The e-graph explorer: egglog's visualizer fed the run's e-graph from report.data, with op names for e-classes
and the chosen e-nodes marked; its standalone page as headless Chromium shows it (driven by Playwright, with the
system's Chromium: ``apt-get install -y chromium``, which ``.ci/run`` installs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.report.explorer import COMPUTED, NOT_COMPUTED, ExplorerError

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def mlp() -> Graph:
    g = Graph("mlp")
    x = g.input("x", (4, 64))
    g.set_outputs([g.gelu(g.add(g.matmul(x, g.param("w", (64, 64))), g.param("b", (64,))))])
    return g


def test_the_explorer_names_eclasses_by_op_and_marks_the_chosen_enodes() -> None:
    _, report = optimize_with_report(mlp())
    data = report.explore().data
    assert set(data) == {"nodes", "class_data", "root_eclasses"}
    classes = {node["eclass"] for node in data["nodes"].values()}
    assert classes == {"Input-3", "Param-4", "Param-1", "MatMul-0", "Add-2", "FusedMatMulBiasAct-5"}
    assert data["root_eclasses"] == ["FusedMatMulBiasAct-5"]  # the output's
    labels = sorted(node["op"] for node in data["nodes"].values() if node["eclass"] == "FusedMatMulBiasAct-5")
    assert labels == ["Gelu(approximate=none)", "★ FusedMatMulBiasAct(act=gelu)"]
    assert sum(node["op"].startswith("★ ") for node in data["nodes"].values()) == 4  # x, w, b and the fused node
    assert data["class_data"]["FusedMatMulBiasAct-5"] == {"type": COMPUTED, "value": "f32[4, 64]", "input nodes": "%5"}
    assert data["class_data"]["Add-2"]["type"] == NOT_COMPUTED
    fused = next(n for n in data["nodes"].values() if n["op"] == "★ FusedMatMulBiasAct(act=gelu)")
    assert [data["nodes"][c]["eclass"] for c in fused["children"]] == ["Input-3", "Param-4", "Param-1"]
    assert len(data["nodes"]) == report.enodes == 8
    widget = report.explore().widget()  # egglog's own visualizer widget, given this e-graph
    assert type(widget).__module__ == "egglog.visualizer_widget" and json.loads(widget.egraphs[0]) == data


def test_the_explorer_says_why_it_cannot_show_a_run() -> None:
    _, report = optimize_with_report(mlp(), engine="fallback")
    with pytest.raises(ExplorerError, match=r"^no e-graph to explore: the fallback engine ran"):
        report.explore()
    _, report = optimize_with_report(examples.llama(layers=1))
    with pytest.raises(ExplorerError, match=r"^the e-graph has 108 e-nodes, over the 50 the explorer lays out at once"):
        report.explore(max_enodes=50)


def test_chromium_shows_the_explorer_page(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "the explorer's browser test needs Chromium: apt-get install -y chromium"
    _, report = optimize_with_report(examples.llama(layers=1))
    explorer = report.explore()
    page_path = tmp_path / "egraph.html"
    explorer.save(page_path)
    text = page_path.read_text(encoding="utf-8")
    assert "esm.sh" not in text and "<link" not in text  # egglog's script and style are inline
    classes = {node["eclass"] for node in explorer.data["nodes"].values()}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(page_path.as_uri())
            page.wait_for_selector(".react-flow__node", timeout=60_000)
            page.wait_for_function(f"document.querySelectorAll('.react-flow__node').length >= "
                                   f"{len(explorer.data['nodes']) + len(classes)}", timeout=60_000)
            drawn = page.locator(".react-flow__node").count()
            labels = page.locator(".react-flow__node").all_inner_texts()
            page.screenshot(path=str(tmp_path / "egraph.png"))
        finally:
            browser.close()
    assert errors == []
    assert drawn == len(explorer.data["nodes"]) + len(classes) == 108 + 68
    assert sum(label.startswith("★ ") for label in labels) == len(report.data.choices) == 34
    assert any(label.startswith("★ FusedRmsNormMatMul(") for label in labels)
    assert (tmp_path / "egraph.png").stat().st_size > 20_000
