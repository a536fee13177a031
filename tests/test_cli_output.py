"""What the CLI prints on stderr besides its results: warnings by default, -v / -vv for the run's phases and steps,
-q for errors only (no progress, no messages)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlx_egraph import Graph, examples
from rlx_egraph.cli.main import EXIT_INPUT, main
from rlx_egraph.report import progress
from rlx_egraph.rules import load_rules

PHASES = ["encode", "saturate", "extract", "decode", "regions", "report"]
# merges a Narrow with its input: values of different types (the run returns its input and warns)
WRONG_NARROW = '(rewrite (Narrow ?x ?a ?s ?l) ?x :ruleset simplify :name "wrong-narrow")\n'


@pytest.fixture
def llama1(tmp_path: Path) -> Path:
    path = tmp_path / "llama1.json"
    examples.llama(layers=1).save(path)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_verbose_logs_each_phase_and_very_verbose_each_step(capsys, llama1: Path, tmp_path: Path) -> None:
    code, out, err = run(capsys, "optimize", llama1, "-o", tmp_path / "o.json", "-v")
    assert code == 0 and out.endswith("wrote " + str(tmp_path / "o.json") + ": 34 nodes\n")
    lines = err.splitlines()
    shipped = load_rules(None)
    assert lines[0] == (f"info: optimize llama_L1_H64: 62 nodes, target cpu, {len({r.base for r in shipped.rules})} "
                        f"rules from {len(shipped.sources)} files; values not checked: only shipped rules, which the "
                        "test suite checks")
    assert [re.match(r"info: optimize: (\w+) \d+\.\d{3} s", line).group(1) for line in lines[1:-1]] == PHASES
    assert re.fullmatch(r"info: optimize llama_L1_H64: 62 -> 34 nodes in \d+\.\d{3} s \(egglog engine; saturated\)",
                        lines[-1])
    code, _, err = run(capsys, "-vv", "optimize", llama1, "-o", tmp_path / "o.json")  # before the command too
    steps = [line for line in err.splitlines() if line.startswith("debug: ")]
    assert code == 0 and len(steps) == 16
    assert all(re.match(r"debug: optimize: saturate: (simplify|recognize|fuse|blocks) iteration \((plain|bounded, "
                        r"match limit [\d,]+)\) \d+\.\d{3} s: [\d,]+ matches", line) for line in steps)


def test_warnings_reach_stderr_by_default_and_quiet_hides_them(capsys, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    g = Graph("narrow")
    g.set_outputs([g.relu(g.narrow(g.input("x", (4, 8)), axis=1, start=0, length=4))])
    g.save("narrow.json")
    Path("user.egg").write_text(WRONG_NARROW)
    code, out, err = run(capsys, "optimize", "narrow.json", "--rules", "user.egg", "-o", "o.json")
    assert code == 0 and err.startswith("warning: unsound rewrite: e-class 0 holds input-graph nodes of different "
                                        "types") and err.rstrip().endswith("the input graph is returned unchanged")
    assert len(err.splitlines()) == 1
    code, out, err = run(capsys, "optimize", "narrow.json", "--rules", "user.egg", "-o", "o.json", "-q")
    assert (code, out, err) == (0, "", "")
    assert Graph.load("o.json") == g


def test_quiet_prints_only_what_was_asked_for(capsys, llama1: Path, tmp_path: Path) -> None:
    code, out, err = run(capsys, "optimize", llama1, "-o", tmp_path / "o.json", "--report-json", tmp_path / "r.json",
                         "--html", tmp_path / "r.html", "-q")
    assert (code, out, err) == (0, "", "")
    assert (tmp_path / "r.json").exists() and (tmp_path / "r.html").exists() and len(Graph.load(tmp_path / "o.json")) \
        == 34
    code, out, err = run(capsys, "optimize", llama1, "-o", "-", "-q")
    assert code == 0 and err == "" and len(Graph.from_json(out)) == 34
    code, out, _ = run(capsys, "optimize", llama1, "-q")
    assert code == 0 and out.startswith("graph llama_L1_H64: 34 nodes")  # the result, without the report


def test_quiet_turns_progress_off_for_the_run_only(capsys, llama1: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr("rlx_egraph.cli.main._optimize_cmd", lambda args: seen.append(progress.progress_mode()))
    with progress.progress_set("lines"):
        assert main(["optimize", str(llama1), "-q"]) == 0
        assert progress.progress_mode() == "lines"
    assert seen == ["off"]


def test_verbose_and_quiet_do_not_go_together(capsys, llama1: Path) -> None:
    code, _, err = run(capsys, "optimize", llama1, "-v", "-q")
    assert code == EXIT_INPUT and "argument -q/--quiet: not allowed with argument -v/--verbose" in err
