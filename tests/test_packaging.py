"""Packaging: the build hook compiles the accelerators when a C compiler works and falls back to pure Python when
none does; a wheel and an sdist install outside the checkout, without a compiler, and run the demo; the compiled
modules expose what their sources define (the sources are their stubs)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from rlx_egraph import _accelerators, accelerated

ROOT = Path(__file__).resolve().parents[1]
NO_COMPILER = {"CC": "false", "CXX": "false"}  # a compiler that always fails
COMPILED_NAMES = sorted([m.rpartition(".")[2] for m in _accelerators.MODULES] + ["_cython_utility"])


def _copy_tracked(destination: Path) -> None:
    """The files git tracks, as they are in the working tree (nothing built)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, destination / name)


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", _accelerators.PURE_VARIABLE)}
    return {**env, **changes}


def test_a_checkout_that_was_never_built_runs_the_pure_python_path(tmp_path: Path) -> None:
    _copy_tracked(tmp_path)
    run = subprocess.run([sys.executable, "-c", "import rlx_egraph; print(rlx_egraph.accelerated())"],
                         cwd=tmp_path, capture_output=True, text=True, env=_env(PYTHONPATH=str(tmp_path / "src")))
    assert (run.returncode, run.stdout, run.stderr) == (0, "False\n", "")


def test_the_pure_variable_selects_the_sources_where_the_extensions_are_built() -> None:
    if not accelerated():
        pytest.fail("this suite runs on an install whose accelerators compiled (make test builds them)")
    script = ("import rlx_egraph, rlx_egraph.engines.egglog._solver as s; "
              "print(rlx_egraph.accelerated(), s.__file__.endswith('.py'))")
    for value, expected in (("1", "False True"), ("0", "True False"), ("", "True False")):
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env=_env(**{_accelerators.PURE_VARIABLE: value}))
        assert run.stdout.strip() == expected, (value, run.stderr)


def _build_wheel(source: Path, dist: Path, **env: str) -> tuple[Path, str]:
    """``pip wheel`` of ``source`` into ``dist``: the wheel, and what the build printed (``-v``)."""
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                          "--wheel-dir", str(dist), "-v"], capture_output=True, text=True, env=_env(**env))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (wheel,) = dist.glob("rlx_egraph-*.whl")
    return wheel, run.stdout + run.stderr


@pytest.fixture(scope="module")
def sdist_and_pure_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The sdist of a clean copy of the checkout, and the wheel pip builds from it without a compiler, in an isolated
    build environment (the sdist's build requirements installed from the index, as ``pip install`` of the sdist
    does): the sdist, the wheel and what the build printed (``-v``).  Built once for the two tests that read them."""
    from hatchling.builders.sdist import SdistBuilder

    folder = tmp_path_factory.mktemp("sdist")
    source = folder / "src-copy"  # a clean copy: nothing built in place
    _copy_tracked(source)
    (sdist,) = [Path(p) for p in SdistBuilder(str(source)).build(directory=str(folder / "sdist"))]
    # no byte-compiling of the build requirements pip installs: most of the isolated environment's time
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", str(sdist), "--no-deps", "--wheel-dir",
                          str(folder / "dist"), "-v"], capture_output=True, text=True,
                         env=_env(PIP_COMPILE="0", **NO_COMPILER))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (wheel,) = (folder / "dist").glob("rlx_egraph-*.whl")
    return sdist, wheel, run.stdout + run.stderr


@pytest.mark.long
def test_a_build_without_a_working_compiler_makes_a_pure_python_wheel_and_says_so(
        sdist_and_pure_wheel: tuple[Path, Path, str]) -> None:
    sdist, wheel, printed = sdist_and_pure_wheel
    assert "rlx-egraph: no working C compiler (" in printed
    assert "building the pure-Python package, which gives the same results more slowly" in printed
    assert wheel.name.endswith("-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith((".so", ".pyd", ".c"))]
    assert {f"rlx_egraph/engines/egglog/{m}.py" for m in COMPILED_NAMES if m != "_cython_utility"} <= set(names)
    assert "rlx_egraph/_cython_shim.py" in names and "rlx_egraph/shipped_rules/norms.egg" in names
    # the benchmark scripts stay in the repository (benchmarks/), out of the wheel built from an sdist that has them
    with tarfile.open(sdist) as archive:
        assert any(m.name.split("/")[1:2] == ["benchmarks"] for m in archive.getmembers())
    assert not [n for n in names if n.startswith("benchmarks/") or "bench" in n.rpartition("/")[2]], names


def test_a_build_that_requires_the_accelerators_fails_without_a_compiler(tmp_path: Path) -> None:
    source = tmp_path / "src-copy"
    _copy_tracked(source)
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                          "--wheel-dir", str(tmp_path / "dist")], capture_output=True, text=True,
                         env=_env(RLX_EGRAPH_REQUIRE_COMPILED="1", **NO_COMPILER))
    assert run.returncode != 0
    assert ("RuntimeError: rlx-egraph: RLX_EGRAPH_REQUIRE_COMPILED is set and the accelerated modules did not "
            "compile (a C compiler and the Python headers are needed)") in run.stdout + run.stderr


def _venv(folder: Path) -> Path:
    """A clean venv without pip of its own (the suite's pip installs into it: ``pip --python``): its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return folder / ("Scripts" if os.name == "nt" else "bin")


def _demo(bin_dir: Path, cwd: Path) -> str:
    """``rlx-egraph demo``'s output, less its timings line."""
    run = subprocess.run([str(bin_dir / "rlx-egraph"), "demo"], cwd=cwd, capture_output=True, text=True, env=_env())
    assert run.returncode == 0, run.stderr
    return "\n".join(line for line in run.stdout.splitlines() if not line.startswith("time: "))


@pytest.mark.long
def test_the_wheel_and_the_sdist_install_without_a_compiler_outside_the_checkout_and_run_the_demo(
        tmp_path: Path, sdist_and_pure_wheel: tuple[Path, Path, str]) -> None:
    """CI's install check: ``pip wheel .`` (compiled here), installed with no compiler into a clean venv outside the
    checkout, runs the demo on the compiled path; the sdist, built with no compiler (as ``pip install`` of it builds:
    the wheel :func:`sdist_and_pure_wheel` made), installs the pure-Python package there, whose demo prints the same
    report and graph."""
    source = tmp_path / "src-copy"  # a clean copy: nothing built in place
    _copy_tracked(source)
    wheel, _ = _build_wheel(source, tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    compiled = sorted(n.split("/")[-1].split(".")[0] for n in names if n.endswith((".so", ".pyd")))
    assert compiled == COMPILED_NAMES, names
    assert all(n.startswith("rlx_egraph/engines/egglog/") for n in names if n.endswith((".so", ".pyd")))
    assert "rlx_egraph/shipped_rules/norms.egg" in names and not [n for n in names if n.endswith((".c", ".cpp"))]
    assert "-py3-none-any" not in wheel.name  # a platform wheel, since it holds compiled code

    work = tmp_path / "elsewhere"  # outside the checkout and its copy: the installed package is what runs
    work.mkdir()
    bin_dir = _venv(tmp_path / "venv")
    pip = [sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "--quiet",
           "--disable-pip-version-check"]
    # no byte-compiling of what pip installs (the dependencies): two thirds of the install's time; the demos
    # compile what they import
    no_compiler = _env(PIP_COMPILE="0", **NO_COMPILER)
    run = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, env=no_compiler)
    assert run.returncode == 0, run.stderr
    check = [str(bin_dir / "python"), "-c", "import rlx_egraph; print(rlx_egraph.accelerated(), rlx_egraph.__file__)"]
    where = subprocess.run(check, cwd=work, capture_output=True, text=True, env=_env()).stdout.split()
    assert where[0] == "True" and Path(where[1]).is_relative_to(tmp_path / "venv")
    compiled_demo = _demo(bin_dir, work)
    assert "graph: 110 nodes -> 62 nodes" in compiled_demo and "parity: ok" in compiled_demo

    sdist, pure_wheel, _ = sdist_and_pure_wheel
    with tarfile.open(sdist) as archive:
        assert "hatch_build.py" in {Path(m.name).name for m in archive.getmembers()}
    run = subprocess.run([*pip, "--force-reinstall", "--no-deps", str(pure_wheel)], capture_output=True, text=True,
                         env=no_compiler)
    assert run.returncode == 0, run.stderr
    where = subprocess.run(check, cwd=work, capture_output=True, text=True, env=_env()).stdout.split()
    assert where[0] == "False" and Path(where[1]).is_relative_to(tmp_path / "venv")
    assert _demo(bin_dir, work) == compiled_demo


def describe(module: ModuleType) -> dict[str, object]:
    """The public functions and classes a module defines: per function its parameters (name, kind, default), per
    class its methods' and, apart, the special methods it has.  Annotations are left out: Cython keeps those of
    ``def`` functions only."""

    def parameters(value: object) -> object:
        try:
            signature = inspect.signature(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        return [[p.name, p.kind.name, repr(p.default)] for p in signature.parameters.values()]

    out: dict[str, object] = {}
    for name, value in vars(module).items():
        if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if isinstance(value, type):
            out[name] = {m: None if isinstance(v, property) or inspect.isgetsetdescriptor(v) else parameters(v)
                         for m, v in vars(value).items() if not m.startswith("__")
                         and (callable(v) or isinstance(v, property) or inspect.isgetsetdescriptor(v))}
            out[f"{name}.__dunders__"] = sorted(m for m, v in vars(value).items() if m.startswith("__") and callable(v))
        else:
            out[name] = parameters(value)
    return out


def _c_only(module: str) -> set[str]:
    """The functions and methods that the module's ``.pxd`` declares ``cdef`` (C only: compiled, not attributes of
    the module or the class)."""
    pxd = ROOT / "src" / (module.replace(".", "/") + ".pxd")
    text = pxd.read_text() if pxd.exists() else ""
    return set(re.findall(r"^ *cdef [\w\[\]:, ]+? (\w+)\(", text, flags=re.MULTILINE))


def test_each_compiled_module_exposes_what_its_source_defines() -> None:
    """The sources are the compiled modules' stubs: every public function and class of a source but those its
    ``.pxd`` keeps in C is in the compiled module, with the same parameters, and so is every method of a class.
    The sources are described as the pure-Python path imports them (``RLX_EGRAPH_PURE=1``)."""
    if not accelerated():
        pytest.fail("this suite runs on an install whose accelerators compiled (make test builds them)")
    script = ("import json, importlib, rlx_egraph, test_packaging as t; assert not rlx_egraph.accelerated(); "
              f"print(json.dumps({{m: t.describe(importlib.import_module(m)) for m in {_accelerators.MODULES!r}}}))")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT / "tests", capture_output=True, text=True,
                         env=_env(**{_accelerators.PURE_VARIABLE: "1"}))
    assert run.returncode == 0, run.stderr[-3000:]
    sources = json.loads(run.stdout)
    for module in _accelerators.MODULES:
        compiled = json.loads(json.dumps(describe(importlib.import_module(module))))
        c_only = _c_only(module)
        expected = {name: ({m: v for m, v in kind.items() if m not in c_only} if isinstance(kind, dict) else kind)
                    for name, kind in sources[module].items() if name not in c_only}
        for name in [n for n in expected if n.endswith(".__dunders__")]:  # a compiled class has more of them
            assert set(expected.pop(name)) <= set(compiled.pop(name)), (module, name)
        for name, kind in compiled.items():  # and its fields are attributes of the class: only the methods count
            if isinstance(kind, dict):
                compiled[name] = {m: v for m, v in kind.items() if m in expected.get(name, {})}
        assert compiled == expected, module
