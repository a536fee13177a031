"""Every notebook in notebooks/ runs top to bottom in a fresh kernel, and is committed without outputs."""

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


def test_the_notebooks_are_found() -> None:
    assert {"01_eclass_stats.ipynb", "02_write_a_rule.ipynb", "04_real_model.ipynb"} <= {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebook_has_no_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    dirty = [k for k, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)]
    assert dirty == [], f"{path.name}: code cells {dirty} hold outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_from_a_fresh_kernel(path: Path, tmp_path: Path) -> None:
    """The kernel is the ``python3`` one of this interpreter (jupyter_client runs it with ``sys.executable``),
    importing rlx_egraph from where this test does; it runs in a scratch folder, so files the notebook
    writes do not land in the repository."""
    nb = nbformat.read(path, as_version=4)
    src = str(Path(rlx_egraph.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    env.pop("PYTEST_CURRENT_TEST", None)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count is not None for cell in code)
    errors = [out for cell in code for out in cell.outputs if out.output_type == "error"]
    assert errors == []
