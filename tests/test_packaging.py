"""The wheel: built by hatchling with the Cython hook, it carries the compiled modules and the rules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _copy_tracked(destination: Path) -> None:
    """The files git tracks, as they are in the working tree (nothing built)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, destination / name)


def test_a_checkout_that_was_never_built_says_how_to_build_it(tmp_path: Path) -> None:
    _copy_tracked(tmp_path)
    run = subprocess.run([sys.executable, "-c", "import rlx_egraph"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "src")})
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "ImportError: rlx_egraph.egraph's Cython modules (_rows, egglog's rows read as integers; _solver, the passes "
        "over the e-graph) are not built: install the package first (`make .venv/.installed`, or `pip install -e .`)")


def test_a_build_without_a_working_compiler_says_what_it_needs(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from hatchling.builders.wheel import WheelBuilder

    source = tmp_path / "src-copy"
    _copy_tracked(source)
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    monkeypatch.setenv("CC", "false")
    with pytest.raises(RuntimeError, match=r"^rlx-egraph compiles two Cython modules \(egglog's rows read as "
                                           r"integers, the passes over the e-graph\) and needs a C\+\+ compiler "
                                           r"and the Python headers for them"):
        list(WheelBuilder(str(source)).build(directory=str(tmp_path / "dist"), versions=["standard"]))


def test_the_wheel_carries_the_compiled_module_and_the_shipped_rules(tmp_path: Path) -> None:
    from hatchling.builders.wheel import WheelBuilder

    source = tmp_path / "src-copy"  # a clean copy: the hook compiles in place
    _copy_tracked(source)
    (wheel,) = WheelBuilder(str(source)).build(directory=str(tmp_path / "dist"), versions=["standard"])
    names = zipfile.ZipFile(wheel).namelist()
    compiled = sorted(n.split("/")[-1].split(".")[0] for n in names if n.endswith((".so", ".pyd")))
    assert compiled == ["_rows", "_solver"], names
    assert all(n.startswith("rlx_egraph/egraph/") for n in names if n.endswith((".so", ".pyd")))
    assert "rlx_egraph/shipped_rules/norms.egg" in names
    assert not any(n.endswith((".cpp", ".c")) for n in names)
    assert "-py3-none-any" not in Path(wheel).name  # a platform wheel, since it holds compiled code
