"""The HTML report (report.to_html(), rlx-egraph optimize --html): its content, its layout, and the page as a real
headless Chromium renders it.

The browser test needs Debian's ``chromium`` (``apt-get install -y chromium``; ``.ci/run`` installs it): it fails,
saying so, where no Chromium is on the PATH.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.cli.main import main
from rlx_egraph.ir.dot import FUSED_COLOR
from rlx_egraph.report import OptimizeReport, html
from rlx_egraph.report.html import computed_originals
from rlx_egraph.report.layout import layered_layout

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")


@pytest.fixture(scope="module")
def llama_run() -> tuple[Graph, OptimizeReport]:
    return optimize_with_report(examples.llama(layers=2), verify=True)


def residual_miss() -> Graph:
    """A residual Add that is also an output: FusedResidualLN is not extracted (another consumer)."""
    g = Graph("residual")
    x, r = g.input("x", (4, 64)), g.input("r", (4, 64))
    a = g.add(g.matmul(x, g.param("w", (64, 64))), r)
    g.set_outputs([g.layer_norm(a, g.param("g", (64,)), g.param("be", (64,))), a])
    return g


def node_count(svg: str) -> int:
    return len(re.findall(r'<g class="node[ "]', svg))


def svg_of(page: str, which: str) -> str:
    match = re.search(rf'<svg[^>]* class="graph" id="rlx-{which}".*?</svg>', page, re.DOTALL)
    assert match, which
    return match.group(0)


def test_the_page_draws_both_graphs_and_links_fused_nodes_to_what_they_compute(llama_run) -> None:
    opt, report = llama_run
    page = report.to_html()
    before, after = svg_of(page, "before"), svg_of(page, "after")
    assert node_count(before) == 110 and node_count(after) == 62 == len(opt)
    assert before.count('<path class="edge"') == sum(len(set(n.inputs)) for n in examples.llama(layers=2).nodes)
    fused = re.findall(r'<g class="node fused[^"]*" id="rlx-after-n(\d+)" data-node="\d+" data-computes="([\d ]*)"',
                       after)
    assert len(fused) == sum(report.fused_op_counts.values()) == 13
    computes = computed_originals(report)
    assert {int(n): [int(o) for o in ids.split()] for n, ids in fused} == \
        {n: ids for n, ids in computes.items() if opt.node(n).op != "Narrow" and opt.node(n).op != "ConcatParams"}
    # the attention layer's input nodes: the RMSNorm and the q/k/v matmuls in the fused norm-matmul, each
    # projection's value in its Narrow, the RoPEs in the fused attention
    assert computes[8] == [3, 4, 5, 6, 7, 8, 9, 11, 13, 17, 21] and computes[9] == [13]
    assert computes[18] == [24, 25, 26] and computes[22] == [30, 31] and computes[7] == []
    assert computes[27] == [32, 33, 34, 35, 36, 37, 38, 40, 42, 44] and computes[28] == [45, 46, 47]
    held = {o for f in report.fusions for o in f.replaces}
    on_the_way = Counter(o for ids in computes.values() for o in ids if o not in held)
    assert set(on_the_way.values()) == {1}  # each input node no longer held is computed by one optimized node
    # an input node a fused node computes is marked, and points back to it
    assert re.search(r'<g class="node replaced" id="rlx-before-n42" data-node="42" data-computes="27" '
                     r'data-fusion="27"><a href="#rlx-fusion-27">', before)
    rows = re.findall(r'<tr id="rlx-fusion-(\d+)">(.*?)</tr>', page)
    assert [int(n) for n, _ in rows] == [f.node for f in report.fusions] and len(rows) == 23
    row = dict(rows)["28"]
    assert '<a href="#rlx-rule-fused-swiglu-gate-first">fused-swiglu-gate-first</a>' in row
    assert ('<a href="#rlx-before-n45">%45</a>, <a href="#rlx-before-n46">%46</a>, '
            '<a href="#rlx-before-n47"><b>%47</b>') in row
    assert '<tr id="rlx-rule-fused-swiglu-gate-first"><td><code>fused-swiglu-gate-first</code></td><td>fuse</td>' \
           '<td><code>' in page


def test_the_page_has_the_cost_charts_the_egraph_and_the_verification(llama_run) -> None:
    _, report = llama_run
    page = report.to_html()
    for title in ("predicted time per op kind (cpu, ns)", "predicted time by term of the cost model (ns)", "counts",
                  "nodes per op kind", "e-graph growth", "rule matches (summed over iterations)", "e-nodes per op"):
        assert f'aria-label="{title}"' in page, title
    growth = re.search(r'aria-label="e-graph growth">(.*?)</svg>', page).group(1)
    assert growth.count('<rect class="bar"') == len(report.iterations) == 16
    assert '<b>110 → 62</b><span>nodes</span>' in page and '<b class="ok">ok</b><span>values (parity)</span>' in page
    assert "<b>122</b><span>e-classes</span>" in page and "<b>200</b><span>e-nodes</span>" in page
    assert "<h3>The largest e-classes</h3>" in page and "★ <code>" in page
    assert "values checked: requested (verify=True); every optimized node against the value it replaces" in page
    assert "<h3>The closest calls</h3>" in page
    # head-split records the q, k, v splits; x-power-pow-2 the square inside each RmsNorm
    assert re.search(r"<h2>Rules \(20 of \d+ fired\)</h2>", page)


def test_the_page_needs_nothing_from_outside(llama_run) -> None:
    page = llama_run[1].to_html()
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) == {"http://www.w3.org/2000/svg"}
    assert "<link" not in page and "src=" not in page and "@import" not in page and "url(http" not in page
    assert page == llama_run[1].to_html()  # deterministic


def test_missed_fusions_are_listed_with_why() -> None:
    _, report = optimize_with_report(residual_miss())
    page = report.to_html()
    assert "<h2>Missed fusions (1)</h2>" in page
    miss = report.fusion.missed[0]
    assert f"<td><b>another consumer</b>: {miss.detail}</td>" in page.replace("&#x27;", "'")
    assert f'<a href="#rlx-before-n{miss.nodes[0]}">%{miss.nodes[0]}</a>' in page
    assert f"{miss.chosen_ns:,.0f} ns chosen, {miss.fused_ns:,.0f} ns with it" in page


def test_fallback_runs_large_graphs_and_reports_without_summaries(monkeypatch: pytest.MonkeyPatch) -> None:
    _, report = optimize_with_report(examples.mlp(), engine="fallback")
    page = report.to_html()
    assert "The fallback engine matched the rules on the graph itself: no e-graph." in page
    assert node_count(svg_of(page, "after")) == report.nodes_after
    monkeypatch.setattr(html, "MAX_DRAWN_NODES", 10)
    page = report.to_html()
    assert page.count("Not drawn: ") == 2 and 'class="graph"' not in page
    assert "This report has no graphs" in OptimizeReport("egglog", "", "cpu").to_html()


def test_notebook_blocks_have_ids_of_their_own(llama_run) -> None:
    first, second = llama_run[1]._repr_html_(), llama_run[1]._repr_html_()
    ids = [re.search(r'<div class="rlx-report" id="(rlx\d+)">', block).group(1) for block in (first, second)]
    assert ids[0] != ids[1]
    assert first.startswith("<style>") and f'document.getElementById("{ids[0]}")' in first
    assert f'id="{ids[0]}-after"' in first and f'id="{ids[1]}-after"' in second


def test_the_layout_keeps_ranks_apart_and_boxes_from_overlapping() -> None:
    graph = examples.llama(layers=2)
    sizes = {n.id: (40.0 + 7 * len(n.op), 30.0) for n in graph.nodes}
    layout = layered_layout([n.id for n in graph.nodes], {n.id: n.inputs for n in graph.nodes}, sizes)
    assert layout == layered_layout([n.id for n in graph.nodes], {n.id: n.inputs for n in graph.nodes}, sizes)
    for n in graph.nodes:  # every edge goes down
        assert all(layout.ranks[i] < layout.ranks[n.id] for i in n.inputs)
    by_rank: dict[int, list[int]] = {}
    for nid, r in layout.ranks.items():
        by_rank.setdefault(r, []).append(nid)
    for members in by_rank.values():
        boxes = sorted((layout.positions[m][0] - sizes[m][0] / 2, layout.positions[m][0] + sizes[m][0] / 2)
                       for m in members)
        assert all(a[1] < b[0] for a, b in itertools.pairwise(boxes))
        assert len({layout.positions[m][1] for m in members}) == 1
    # a weight sits just above the node that reads it, not on the top rank
    w = graph.leaf("layers.1.mlp.down_proj.weight").id
    reader = graph.users(w)[0]
    assert layout.ranks[w] == layout.ranks[reader] - 1 > 0
    assert 0 < layout.width < 2000 and layout.height > 0
    for (source, target), points in layout.edges.items():
        assert points[0][1] < points[-1][1] and len(points) == layout.ranks[target] - layout.ranks[source] + 1


def test_cli_writes_the_html_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph, page = tmp_path / "llama.json", tmp_path / "report.html"
    examples.llama(layers=1).save(graph)
    assert main(["optimize", str(graph), "-o", str(tmp_path / "opt.json"), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert out.endswith(f"wrote HTML report {page}\nwrote {tmp_path / 'opt.json'}: 34 nodes\n")
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<title>rlx-egraph optimize report: llama_L1_H64</title>" in text
    assert node_count(svg_of(text, "before")) == 62 and node_count(svg_of(text, "after")) == 34


def chromium() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    assert found is not None, "the HTML report's browser test needs Chromium: apt-get install -y chromium"
    return found


def run_chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                          capture_output=True, timeout=120, check=True)


def test_chromium_renders_the_graphs_and_the_tables(llama_run, tmp_path: Path) -> None:
    """The page as a real browser shows it: its script ran and measured both pictures, the tables are there, and
    the screenshot is a page of boxes in the report's colours, not a blank one."""
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(llama_run[1].to_html(), encoding="utf-8")
    dom = run_chromium(page, tmp_path / "profile-dom", "--dump-dom").stdout.decode()
    drawn = re.search(r'data-drawn="before:(\d+):(\d+) after:(\d+):(\d+)"', dom)
    assert drawn, "the page's script did not run"
    before_nodes, before_width, after_nodes, after_width = map(int, drawn.groups())
    assert (before_nodes, after_nodes) == (110, 62) and before_width > 300 and after_width > 300
    assert 'class="rlx-report scripted"' in dom
    headers = re.findall(r"<th>([^<]+)</th>", dom)
    assert Counter(headers)["optimized node"] == 2 and "input-graph nodes it computes" in headers
    assert len(re.findall(r'<tr id="rlx-fusion-\d+">', dom)) == 23

    shot = tmp_path / "report.png"
    run_chromium(page, tmp_path / "profile-shot", "--window-size=1400,1000", f"--screenshot={shot}")
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    assert pixels.shape[0] == 1400 * 1000
    white = np.all(pixels > 245, axis=1).mean()
    assert 0.4 < white < 0.97, white  # mostly page, not blank
    fused = np.array([int(FUSED_COLOR[k:k + 2], 16) for k in (1, 3, 5)])
    assert np.sum(np.all(np.abs(pixels - fused) <= 6, axis=1)) > 2000  # the fused nodes' boxes are on screen
    assert len(np.unique(pixels // 16, axis=0)) > 40
