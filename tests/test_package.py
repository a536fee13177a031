"""What an installed package promises: version, licence, dependency bounds, typed builders, public errors."""

import ast
import importlib.metadata
import inspect
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import rlx_egraph
from rlx_egraph import GraphError, ParityError, RlxError, RuleError, RuleSet, ShapeError, UnsoundRewrite
from rlx_egraph._builders import GraphBuilders
from rlx_egraph.ir import REGISTRY, Graph, Kind
from rlx_egraph.ir.stubgen import STUB_PATH, stub_text

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_version_comes_from_the_package_metadata() -> None:
    assert rlx_egraph.__version__ == importlib.metadata.version("rlx-egraph") == PYPROJECT["version"]


def test_license_file_is_the_gpl3_text_the_metadata_declares() -> None:
    assert PYPROJECT["license"] == "GPL-3.0-only"
    text = (ROOT / "LICENSE").read_text()
    assert text.split("\n")[:2] == [" " * 20 + "GNU GENERAL PUBLIC LICENSE", " " * 23 + "Version 3, 29 June 2007"]
    assert text.rstrip().endswith("<https://www.gnu.org/licenses/why-not-lgpl.html>.")
    assert len(text.splitlines()) == 674


def test_dependencies_have_true_bounds_that_the_installed_versions_meet() -> None:
    requirements = {r.name: r for r in map(Requirement, PYPROJECT["dependencies"])}
    assert {name: str(r.specifier) for name, r in requirements.items()} == {
        "egglog": "<15,>=14", "numpy": ">=1.26", "scipy": ">=1.15", "highspy": "<2,>=1.7", "rich": "<16,>=13.6",
        "platformdirs": ">=2"}
    for name, requirement in requirements.items():
        assert Version(importlib.metadata.version(name)) in requirement.specifier, name


def test_py_typed_marks_the_package_typed() -> None:
    assert (Path(rlx_egraph.__file__).parent / "py.typed").is_file()


def test_builder_stub_is_in_sync_with_the_registry() -> None:
    """Regenerate with ``python -m rlx_egraph.ir.stubgen`` when this fails."""
    assert STUB_PATH.read_text() == stub_text()
    stub = ast.parse(STUB_PATH.read_text())
    (cls,) = [node for node in stub.body if isinstance(node, ast.ClassDef)]
    declared = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    builders = {spec.builder for spec in REGISTRY.values() if spec.kind is not Kind.LEAF}
    fused = {spec.builder for spec in REGISTRY.values() if spec.kind is Kind.FUSED}
    assert set(declared) == builders - fused | {"__getattr__"}  # fused ops' builders: __getattr__, typed generally
    assert ast.unparse(declared["__getattr__"].returns) == "Callable[..., int]"
    assert fused and all(callable(getattr(Graph, b)) for b in fused)
    assert GraphBuilders in Graph.__mro__ and not any(hasattr(GraphBuilders, b) for b in builders)
    narrow = declared["narrow"]
    assert ast.unparse(narrow.args) == "self, x: int, *, axis: int=-1, start: int | str, length: int | str"
    assert [p.name for p in inspect.signature(Graph.narrow).parameters.values()] == ["self", "x", "axis", "start",
                                                                                     "length"]
    assert ast.unparse(declared["matmul"].returns) == "int"


PUBLIC_ERRORS = [(GraphError, ValueError), (ShapeError, ValueError), (RuleError, ValueError),
                 (UnsoundRewrite, RuntimeError), (ParityError, AssertionError)]


@pytest.mark.parametrize(("error", "builtin"), PUBLIC_ERRORS, ids=[e.__name__ for e, _ in PUBLIC_ERRORS])
def test_public_errors_share_a_base_and_keep_their_builtin_base(error: type, builtin: type) -> None:
    assert issubclass(error, RlxError) and issubclass(error, builtin)
    assert getattr(rlx_egraph, error.__name__) is error
    assert error.__name__ in rlx_egraph.__all__


def test_onnx_import_error_is_a_graph_error() -> None:
    from rlx_egraph import OnnxImportError  # needs the onnx extra, which the dev extra includes

    assert issubclass(OnnxImportError, GraphError) and issubclass(OnnxImportError, RlxError)


def test_one_except_clause_catches_what_the_library_raises(tmp_path: Path) -> None:
    caught = []
    path = tmp_path / "g.json"
    path.write_text("{}")
    for fail in (lambda: Graph.load(path), lambda: RuleSet.from_strings("(rewrite (Relu ?x) (Foo ?x) "
                                                                        ':ruleset fuse :name "bad")'),
                 lambda: Graph().relu(7), lambda: RuleSet.shipped().without("nope")):
        try:
            fail()
        except RlxError as exc:
            caught.append(type(exc).__name__)
    assert caught == ["GraphError", "RuleError", "GraphError", "RuleError"]


def test_scipy_is_imported_only_when_a_kernel_needs_it() -> None:
    """Importing scipy.special (and the libraries it loads) took about 0.6 s of every ``import rlx_egraph``, the
    CLI's included: optimizing leaves it out; the parity check, whose sigmoid and erf kernels use it, brings it."""
    import subprocess
    import sys

    script = ("import sys\n"
              "from rlx_egraph import examples, optimize\n"
              "optimize(examples.llama(layers=1))\n"
              "print('scipy' in sys.modules)\n"
              "optimize(examples.llama(layers=1), verify=True)\n"
              "print('scipy' in sys.modules)\n")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert ran.stdout.split() == ["False", "True"]
