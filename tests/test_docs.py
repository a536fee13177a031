"""The docs: the site builds without a warning, every Python example of the README and the docs runs and prints
what the page says, the fusion catalogue names every shipped rule and fused op, and no tracked text points
outside the repository or narrates the work's history."""

from __future__ import annotations

import doctest
import re
import runpy
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import onnx
import pytest

from onnx_models import DYNAMIC_MODELS
from rlx_egraph.ir import REGISTRY, Kind
from rlx_egraph.onnx import onnx_rules

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A fenced block, possibly indented (inside a list item): its language, its attributes and its text.
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)(?P<attrs>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.MULTILINE | re.DOTALL)
TITLE = re.compile(r'title="([^"]+)"')


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    lang: str
    title: str | None
    text: str
    line: int  # of its first line of code


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        title = TITLE.search(match["attrs"])
        body = textwrap.dedent(match["body"])
        found.append(Block(match["lang"], title[1] if title else None, body,
                           text.count("\n", 0, match.start()) + 2))
    return found


def rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


EXAMPLE_PAGES = [page for page in PAGES if any(b.lang in ("python", "pycon") for b in blocks(page))]


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=rel)
def test_every_python_example_runs_and_prints_what_the_page_says(page: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's blocks run in order in one namespace, in an empty folder holding the page's titled blocks
    (```` ```scheme title="silu_div.egg" ```` is written to ``silu_div.egg``): ``pycon`` blocks as doctests (their
    printed output compared, ``...`` standing for any text), ``python`` blocks as scripts."""
    monkeypatch.chdir(tmp_path)
    # the user's exported model the ONNX examples name: a BERT layer as the TorchScript exporter writes it,
    # with dynamic batch and sequence
    onnx.save(DYNAMIC_MODELS["bert", "torchscript"](), tmp_path / "model.onnx")
    page_blocks = blocks(page)
    for block in page_blocks:
        if block.title is not None:
            (tmp_path / block.title).write_text(block.text, encoding="utf-8")
    namespace: dict = {"__name__": "__docs__"}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    parser = doctest.DocTestParser()
    report: list[str] = []
    ran = 0
    for block in page_blocks:
        where = f"{rel(page)}:{block.line}"
        if block.lang == "pycon":
            test = parser.get_doctest(block.text, namespace, where, rel(page), block.line - 1)
            assert test.examples, f"{where}: a pycon block without a >>> example"
            runner.run(test, out=report.append, clear_globs=False)
            namespace.update(test.globs)  # a DocTest runs in a copy of the namespace it is given
            ran += 1
        elif block.lang == "python":
            exec(compile("\n" * (block.line - 1) + block.text, rel(page), "exec"), namespace)
            ran += 1
    assert ran
    assert runner.failures == 0, "".join(report)


def test_the_docs_site_builds_without_a_warning(tmp_path: Path) -> None:
    """``mkdocs build --strict``: any warning (a broken link or anchor, a page missing from the nav, a docstring
    the API reference cannot read) fails the build."""
    site = tmp_path / "site"
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - start
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    assert seconds < 60, f"the docs build took {seconds:.1f} s"
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("rlx_egraph.optimize", "rlx_egraph.optimize_with_report", "rlx_egraph.Graph.matmul",
                 "rlx_egraph.RuleSet.shipped", "rlx_egraph.report.OptimizeReport"):
        assert f'id="{name}"' in api, name
    assert 'id="rlx_egraph.rules.Rule"' in (site / "api" / "rules" / "index.html").read_text(encoding="utf-8")
    assert 'id="rlx_egraph.onnx.import_model"' in (site / "api" / "onnx" / "index.html").read_text(encoding="utf-8")
    assert "architecture.svg" in (site / "architecture" / "index.html").read_text(encoding="utf-8")
    assert (site / "architecture.svg").read_text(encoding="utf-8").lstrip().startswith("<?xml")


def test_the_fusion_catalogue_names_every_shipped_rule_and_fused_op() -> None:
    """As the site shows it: the generated table (scripts/docs_hooks.py) lists every fused op and the rules that
    build it."""
    hooks = runpy.run_path(str(ROOT / "scripts" / "docs_hooks.py"))
    catalogue = hooks["on_page_markdown"]((ROOT / "docs" / "fusions.md").read_text(encoding="utf-8"), None)
    assert hooks["MARKER"] not in catalogue
    named = set(re.findall(r"`([A-Za-z][\w-]*)(?=[`(])", catalogue))  # `name` or `Op(args)`
    rules = {rule.base for rule in onnx_rules().rules}  # the shipped rules and rules/onnx/
    assert sorted(rules - named) == []
    fused = {name for name, spec in REGISTRY.items() if spec.kind in (Kind.FUSED, Kind.WEIGHT_PREP)}
    assert sorted(fused - named) == []


# --- what tracked text may say ----------------------------------------------------------------------------------

def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    suffixes = {".md", ".py", ".pyx", ".pxd", ".pyi", ".egg", ".ipynb", ".toml", ".yml", ".dot", ""}
    return [ROOT / name for name in names if name and Path(name).suffix in suffixes and name != "LICENSE"
            and (ROOT / name).is_file()]


ORDINAL = (r"(?:(?:twenty|thirty|forty)-)?(?:fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
           r"\w+teenth|twentieth|thirtieth|fortieth|(?<=-)first|(?<=-)second|(?<=-)third)")
NARRATION = re.compile(
    rf"(?-i:FUSIONS\.md)|/work/|/home/|\bissue \d|\bitems? \d+ of issue|\b{ORDINAL} session\b|\bsession by session\b"
    r"|\b20\d\d-[01]\d-[0-3]\d\b", re.IGNORECASE)


def test_no_tracked_text_narrates_history_or_points_outside_the_repository() -> None:
    """No absolute paths of a machine, no reference to a design summary the repository lacks, no "issue N",
    no numbered sessions or dated stretches of work: a measurement names its command and hardware class instead."""
    hits = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():  # the patterns themselves
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in NARRATION.finditer(line):
                hits.append(f"{rel(path)}:{number}: {match[0]!r}")
    assert hits == []


LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)#\s]+)(?:#[^)]*)?\)")
REPO_PATH = re.compile(r"`((?:src|rules|docs|tests|scripts|notebooks)/[\w./-]*\w)`")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_link_and_repository_path_of_a_page_exists(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = [target for target in LINK.findall(text) if not (page.parent / target).exists()]
    missing += [path for path in REPO_PATH.findall(text) if "*" not in path and not (ROOT / path).exists()]
    assert missing == []


# --- how the docs show an ONNX model's shapes --------------------------------------------------------------------

# A binding that fixes every dim of an input: --input-shape NAME=numbers, or import_model's binding a tuple with no
# symbol (no quoted dim) in it.
FIXED_SHAPES = re.compile(r"--input-shape\s+[\w.:/-]+=\d+(?:,\d+)*(?=\s|$)|import_model\([^)]*\([^\"'()]*\)\s*\}",
                          re.MULTILINE)


def test_the_docs_show_onnx_models_with_their_dynamic_axes() -> None:
    """Every code example of the README, the docs and the notebooks imports an ONNX model with its symbolic dims
    kept (a number in a binding fixes that dim only where a symbol sits beside it); the README's ONNX section starts
    with the command that keeps every dynamic axis."""
    examples = [(rel(page), b.text) for page in PAGES for b in blocks(page)]
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
        examples += [(rel(notebook), c.source) for c in cells]
    assert [(where, m[0]) for where, text in examples for m in FIXED_SHAPES.finditer(text)] == []
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = blocks_of(readme[readme.index("## ONNX models"):])[0]
    assert first.strip() == "rlx-egraph optimize model.onnx -o model.opt.onnx --target onnxruntime"


def blocks_of(text: str) -> list[str]:
    return [textwrap.dedent(m["body"]) for m in FENCE.finditer(text)]
