"""Rules generated from decompositions (rlx_egraph.rules.generate): the shipped files hold them as generated, the
text read back from a decomposition, what is not a pattern, and adding a rule to a file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlx_egraph import RuleSet
from rlx_egraph.ir import REGISTRY, op_spec
from rlx_egraph.rules.generate import (
    MARKER,
    NotAPattern,
    declared_rules,
    decomposition_rule,
    decomposition_terms,
    main,
    stale,
    updated,
)
from rlx_egraph.rules.ruleset import default_rule_dir


def test_the_shipped_rule_files_hold_the_generated_rules() -> None:
    assert stale() == []
    shipped = RuleSet.shipped()
    for specs in declared_rules().values():
        for spec in specs:
            rule = shipped.by_name(spec.rule.name)
            assert (rule.file, rule.stage) == (f"rules/{spec.rule.file}", spec.rule.stage)
            assert decomposition_rule(spec).endswith(rule.source)  # under its marker line
            assert rule.builds == {spec.name}


def test_the_generated_rules_are_the_declared_ones() -> None:
    assert {spec.name for specs in declared_rules().values() for spec in specs} >= {
        "FusedResidualLN", "FusedResidualRmsNorm", "FusedRmsNormMatMul", "GroupNormSilu", "QuickGelu", "SwiGLU"}
    assert all(spec.rule is None or spec.decompose is not None for spec in REGISTRY.values())


def test_a_decomposition_read_backwards() -> None:
    assert decomposition_rule(op_spec("QuickGelu")) == (
        f"{MARKER.format(op='QuickGelu')}\n"
        "(rewrite (Mul ?x (Sigmoid (Mul ?x (Scalar ?alpha ?dt)))) (QuickGelu ?x ?alpha)\n"
        '         :ruleset recognize :name "quick-gelu")')
    assert decomposition_rule(op_spec("SwiGLU")).split("\n")[1:] == [
        "(rule ((= ?e (Mul (Silu ?gate) ?up)) (= (shape ?gate) (shape ?up)))",
        '      ((union ?e (SwiGLU ?gate ?up))) :ruleset fuse :name "swiglu")']
    # an absent optional input is (NoInput)
    assert "(RmsNorm ?x ?w_norm (NoInput) ?axis ?eps)" in decomposition_rule(op_spec("FusedRmsNormMatMul"))


@pytest.mark.parametrize(("op", "message"), [
    ("FusedSwiGLU", "FusedSwiGLU's decomposition reads the shape of a node"),
    ("FusedMatMulBiasAct", "computes with its attribute 'act'"),
    ("FusedAddLayerNorm", "FusedAddLayerNorm has several results"),
    ("Relu", "Relu has no decomposition"),
])
def test_what_is_not_a_pattern(op: str, message: str) -> None:
    with pytest.raises(NotAPattern, match=message):
        decomposition_terms(op_spec(op))


def test_a_rule_missing_from_its_file_is_added_at_its_end_and_a_stale_one_replaced() -> None:
    spec = op_spec("QuickGelu")
    added = updated(";; Activations.\n", [spec])
    assert added == f";; Activations.\n\n;; QuickGelu: x * Sigmoid(alpha * x) (CLIP's QuickGELU; Silu at alpha 1) in " \
                    f"one kernel.\n{decomposition_rule(spec)}\n"
    assert updated(added, [spec]) == added
    edited = added.replace("(Scalar ?alpha ?dt)", "(Scalar 1.702 ?dt)")
    assert updated(edited, [spec]) == added


def test_check_and_write_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "rules"
    shutil.copytree(default_rule_dir(), folder)
    assert main(["--check", "--rules", str(folder)]) == 0
    norms = folder / "norms.egg"
    norms.write_text(norms.read_text().replace("(LayerNorm (Add ?x ?residual)", "(LayerNorm (Add ?residual ?x)"))
    assert main(["--check", "--rules", str(folder)]) == 1
    assert capsys.readouterr().err == "norms.egg: its generated rules are stale (python -m rlx_egraph.rules.generate)\n"
    assert main(["--rules", str(folder)]) == 0
    assert capsys.readouterr().out == "wrote norms.egg\n"
    assert norms.read_text() == (default_rule_dir() / "norms.egg").read_text()
