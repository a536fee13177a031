"""Every notebook in notebooks/ runs top to bottom in a fresh kernel, draws every chart, writes nothing into the
folder it runs in, and is committed without outputs; a long run shows its progress in the cell."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import rlx_egraph

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 120  # seconds; the whole set runs in well under a minute
# charts (PNG from matplotlib's inline backend) each notebook draws
CHARTS = {"01_eclass_stats.ipynb": 4, "02_write_a_rule.ipynb": 0, "03_why_not_fused.ipynb": 1,
          "04_real_model.ipynb": 0}


def execute(nb: nbformat.NotebookNode, folder: Path) -> list[nbformat.NotebookNode]:
    """Run ``nb`` in a fresh ``python3`` kernel of this interpreter (jupyter_client starts it with
    ``sys.executable``), importing rlx_egraph from where this test does, in ``folder``; its code cells."""
    src = str(Path(rlx_egraph.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    env.pop("PYTEST_CURRENT_TEST", None)
    env.pop("RLX_EGRAPH_PROGRESS", None)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}})
    client.execute(env=env)
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def test_the_notebooks_are_found() -> None:
    assert {p.name for p in NOTEBOOKS} == set(CHARTS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebook_has_no_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    dirty = [k for k, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)]
    assert dirty == [], f"{path.name}: code cells {dirty} hold outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_draws_its_charts_and_writes_nothing_here(path: Path, tmp_path: Path) -> None:
    code = execute(nbformat.read(path, as_version=4), tmp_path)
    assert code and all(cell.execution_count is not None for cell in code)
    errors = [out for cell in code for out in cell.outputs if out.output_type == "error"]
    assert errors == []
    images = [cell for cell in code for out in cell.outputs if "image/png" in out.get("data", {})]
    assert len(images) == CHARTS[path.name]
    showing = [cell for cell in code if "plt.show()" in cell.source]
    assert all(any("image/png" in out.get("data", {}) for out in cell.outputs) for cell in showing)
    assert sorted(tmp_path.iterdir()) == []  # files go to a temporary folder of their own
    reports = [out for cell in code for out in cell.outputs if 'class="rlx-report"' in out.get("data", {}).get(
        "text/html", "")]
    assert len(reports) == {"01_eclass_stats.ipynb": 1, "02_write_a_rule.ipynb": 1, "03_why_not_fused.ipynb": 0,
                            "04_real_model.ipynb": 1}[path.name]
    assert all(out["data"]["text/html"].count('class="graph"') == 2 for out in reports)  # both graphs drawn


def test_a_long_run_shows_its_phases_in_the_cell(tmp_path: Path) -> None:
    """In a real kernel the progress display is chosen by itself (``auto``: Jupyter) and left showing the phases."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from rlx_egraph import examples, optimize_with_report\n"
        "from rlx_egraph.report.progress import progress_mode, set_progress\n"
        "set_progress('auto', after=0.0)\n"
        "print(progress_mode())\n"
        "_ = optimize_with_report(examples.mlp(), verify=True)")])
    (cell,) = execute(nb, tmp_path)
    assert cell.outputs[0]["text"] == "jupyter\n"
    shown = [out for out in cell.outputs if out.output_type == "display_data"]
    assert len(shown) == 1  # one block, updated in place
    final = shown[0]["data"]["text/html"]
    assert "rlx-egraph optimize: done in " in final
    assert [phase for phase in ("encode", "saturate", "extract", "decode", "regions", "report", "verify")
            if f"<td>{phase}</td>" in final] == ["encode", "saturate", "extract", "decode", "regions", "report",
                                                 "verify"]
