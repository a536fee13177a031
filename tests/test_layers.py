"""The package's layers (the import-linter contract in pyproject.toml), its import cycles and its function-level
imports, read from the source by grimp and import-linter."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import grimp
from importlinter.application.use_cases import lint_imports
from importlinter.configuration import configure

configure()  # import-linter's readers of configuration files and its graph builder

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "rlx_egraph"

def _contract(name: str = "layers") -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == name]
    return contract


def _config(tmp_path: Path, layers: list[str]) -> str:
    contract = _contract()
    listed = ", ".join(f'"{layer}"' for layer in layers)
    path = tmp_path / "importlinter.toml"
    path.write_text(f'[tool.importlinter]\nroot_package = "rlx_egraph"\nexclude_type_checking_imports = true\n\n'
                    f'[[tool.importlinter.contracts]]\nid = "layers"\nname = "layers"\ntype = "layers"\n'
                    f'containers = ["rlx_egraph"]\nexhaustive = {str(contract["exhaustive"]).lower()}\n'
                    f"layers = [{listed}]\n")
    return str(path)


def test_the_layer_contract_holds() -> None:
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_logo=True, cache_dir=None)


def test_the_layer_contract_lists_every_package_and_fails_on_an_import_that_climbs(tmp_path: Path) -> None:
    layers = _contract()["layers"]
    listed = {name.strip() for layer in layers for name in layer.split("|")}
    children = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
                if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert listed == children
    assert lint_imports(config_filename=_config(tmp_path, layers), no_logo=True, cache_dir=None)
    # the IR above the engines: the engines import the IR, which this order forbids
    swapped = [layer for layer in layers if layer != "ir"]
    swapped.insert(swapped.index("engines"), "ir")
    assert not lint_imports(config_filename=_config(tmp_path, swapped), no_logo=True, cache_dir=None)


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_no_import_cycle_between_modules() -> None:
    graph = grimp.build_graph("rlx_egraph", exclude_type_checking_imports=True, cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []
    # the check finds a cycle where there is one
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def _function_level_imports() -> set[tuple[str, str]]:
    """(module, imported module) of every import of a package module inside a function body."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module.split(".") if path.stem == "__init__" else module.split(".")[:-1]
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom):
                    base = package[:len(package) - node.level + 1] if node.level else []
                    target = ".".join([*base, *([node.module] if node.module else [])])
                elif isinstance(node, ast.Import):
                    target = node.names[0].name
                else:
                    continue
                if target.startswith("rlx_egraph"):
                    found.add((module, target))
    return found


def test_function_level_imports_only_load_the_onnx_extra_on_use() -> None:
    module = "rlx_egraph.cli.main"
    imports = _function_level_imports()
    cli = {target for importer, target in imports if importer == module}
    assert cli == {"rlx_egraph.onnx", "rlx_egraph.frontends.onnx.calibrate"}  # need onnx, an optional extra
    # and nowhere else: no function-level import dodges a cycle
    assert {(importer, target) for importer, target in imports if importer != module} == set()
