"""Verification by default where it is cheap: rules from outside the shipped set turn the parity check on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlx_egraph import Graph, ParityError, RuleSet, examples, optimize, optimize_with_report
from rlx_egraph.cli.main import EXIT_PARITY, main
from rlx_egraph.engines.egglog.rules import default_rule_dir
from rlx_egraph.options import rules_outside_shipped

DROP_RELU = '(rewrite (Relu ?x) ?x :ruleset simplify :name "drop-relu")\n'
SILU_DIV = ('(rewrite (Div ?x (Add (Scalar 1.0 ?dt) (Exp (Neg ?x)))) (Silu ?x) :ruleset recognize '
            ':name "silu-div-exp")\n')
HOW = "every optimized node against the value it replaces, with the numpy reference kernels on seeded random data"


@pytest.fixture
def unsound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A rule file in the working folder (so messages name it ``unsound.egg``)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "unsound.egg"
    path.write_text(DROP_RELU)
    return path


def silu_div_graph() -> Graph:
    g = Graph("silu_div")
    x = g.input("x", (4, 64))
    h = g.add(g.matmul(x, g.param("w", (64, 64))), g.param("b", (64,)))
    g.set_outputs([g.div(h, g.add(g.scalar(1.0), g.exp(g.neg(h))))])
    return g


def test_an_unsound_user_rule_fails_without_asking_for_verification(unsound: Path) -> None:
    rules = [default_rule_dir(), unsound]
    with pytest.raises(ParityError, match=r"built by rule\(s\): .*drop-relu"):
        optimize(examples.mlp(), rules=rules)
    with pytest.raises(ParityError, match=r"built by rule\(s\): .*drop-relu"):
        optimize_with_report(examples.mlp(), rules=RuleSet.shipped().extend(unsound))
    opt, report = optimize_with_report(examples.mlp(), rules=rules, verify=False)  # the user's word
    assert "Relu" not in opt.op_counts() and report.parity is None
    assert report.verification.to_dict() == {
        "checked": False, "user_rules": [unsound.name], "how": None, "weight_folds": 0,
        "why": f"switched off (verify=False), although rules from outside the shipped set were loaded: {unsound.name}"}
    assert str(report).splitlines()[-2] == (f"values not checked: switched off (verify=False), although rules from "
                                            f"outside the shipped set were loaded: {unsound.name} (verify=True checks "
                                            "them)")


def test_a_sound_user_rule_is_checked_and_the_report_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rule = tmp_path / "silu_div.egg"
    rule.write_text(SILU_DIV)
    opt, report = optimize_with_report(silu_div_graph(), rules=RuleSet.shipped().extend(rule))
    assert opt.op_counts()["FusedMatMulBiasAct"] == 1
    assert report.parity is not None and report.parity.ok and report.parity.seeds == (0, 1)
    assert report.verification.checked and report.verification.user_rules == ("silu_div.egg",)
    lines = str(report).splitlines()
    assert lines[-3] == f"values checked: rules from outside the shipped set: silu_div.egg; {HOW}"
    assert lines[-2].startswith(f"parity: ok on {len(report.parity.nodes)} comparisons (seeds 0, 1; IEEE special "
                                "values on seed 0")
    record = json.loads(report.to_json())["verification"]
    assert record["checked"] is True and record["how"].startswith("the input graph and the optimized graph run with "
                                                                  "the numpy reference kernels")
    assert "verify" in report.phases


def test_the_shipped_rules_are_not_checked_unless_asked(tmp_path: Path) -> None:
    _, report = optimize_with_report(examples.mlp())
    assert report.parity is None and "verify" not in report.phases
    assert str(report).splitlines()[-2] == ("values not checked: only shipped rules, which the test suite checks "
                                            "(verify=True checks them)")
    _, report = optimize_with_report(examples.mlp(), verify=True)
    assert report.parity is not None and report.verification.why == "requested (verify=True)"
    # a copy of a shipped file is shipped text; the ONNX forms are shipped too
    copy = tmp_path / "my_matmul.egg"
    shutil.copy(default_rule_dir() / "matmul.egg", copy)
    assert rules_outside_shipped(RuleSet.from_files(copy)) == ()
    from rlx_egraph.onnx import onnx_rules

    assert rules_outside_shipped(onnx_rules()) == ()
    assert rules_outside_shipped(RuleSet.from_strings(SILU_DIV, names=["mine"])) == ("mine",)


def test_verify_takes_true_false_or_none() -> None:
    with pytest.raises(TypeError, match=r"^verify must be True, False, None \(check when rules from outside the "
                                        r"shipped set are loaded\) or a mapping of reference inputs \(name -> array\), "
                                        r"got 'yes' \(str\)$"):
        optimize(examples.mlp(), verify="yes")


def test_cli_checks_user_rules_unless_told_not_to(capsys: pytest.CaptureFixture[str], unsound: Path,
                                                  tmp_path: Path) -> None:
    graph = tmp_path / "mlp.json"
    examples.mlp().save(graph)
    assert main(["optimize", str(graph), "--rules", str(unsound), "-o", str(tmp_path / "never.json")]) == EXIT_PARITY
    err = capsys.readouterr().err
    assert err.startswith("error: parity failure: node ")
    # the user's rule first, with its location; then the shipped rules that built on its value
    assert err.rstrip().split("built by rule(s): ")[1] == f"drop-relu ({unsound.name}:1), matmul-bias, relu-relu"
    assert not (tmp_path / "never.json").exists()
    assert main(["optimize", str(graph), "--rules", str(unsound), "--no-verify", "-o", str(tmp_path / "o.json")]) == 0
    out = capsys.readouterr().out
    assert "values not checked: switched off (verify=False), although rules from outside the shipped set were " \
           "loaded: unsound.egg" in out
