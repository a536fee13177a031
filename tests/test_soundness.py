"""The soundness checker: every shipped rule sound on random instances, deliberately wrong rules caught."""

import json
import tomllib
from pathlib import Path

import pytest

import rlx_egraph.rules
from rlx_egraph.cli.main import main
from rlx_egraph.engines.egglog.rules import SHIPPED_RULES_DIR, default_rule_dir
from rlx_egraph.engines.egglog.soundness import NOT_CHECKABLE as NOT_CHECKABLE_STATUS
from rlx_egraph.engines.egglog.soundness import SOUND, UNSOUND, SoundnessReport, check
from rlx_egraph.rules import RuleSet

ROOT = Path(__file__).resolve().parent.parent

# Each rule is wrong in one way the issue names; the checker must blame exactly it.
WRONG = {
    "silu-to-sigmoid": '(rewrite (Silu ?x) (Sigmoid ?x) :ruleset recognize :name "silu-to-sigmoid")',
    "swiglu-halves-swapped": """
(rule ((= ?e (SwiGLU (Narrow ?cat -1 0 ?n) (Narrow ?cat -1 ?n ?n)))
       (= ?s (shape ?cat)) (= (vec-get ?s (- (vec-length ?s) 1)) (* 2 ?n)))
      ((union ?e (FusedSwiGLU ?cat false "none"))) :ruleset fuse :name "swiglu-halves-swapped")""",
    "layer-norm-eps-dropped": """
(rewrite (LayerNorm ?x ?g ?b ?axis ?eps) (LayerNorm ?x ?g ?b ?axis 1e-12)
         :ruleset fuse :name "layer-norm-eps-dropped")""",
    "layer-norm-to-rms-norm": """
(rewrite (LayerNorm ?x ?g ?b ?axis ?eps) (RmsNorm ?x ?g ?b ?axis ?eps) :ruleset fuse :name "layer-norm-to-rms-norm")""",
    "bias-dropped": """
(rule ((= ?e (Add (MatMul ?x ?w) ?bias)) (<= (vec-length (shape ?bias)) 1))
      ((union ?e (MatMul ?x ?w))) :ruleset fuse :name "bias-dropped")""",
    "reshape-dropped": '(rewrite (Reshape ?x ?s) ?x :ruleset simplify :name "reshape-dropped")',
}
# Rules the checker could not instantiate before (a fused op on the left side, Param definitions shared by k
# matmuls of one input, facts-only operand orders no reader's instance unfolded, a head split whose Reshape target
# no guard pins down): now each has exactly 3 instances.
ONCE_NOT_CHECKABLE = {"transformer-layer", "shared-input-matmul", "ln-normed-rsqrt#4", "ln-std#2",
                      "qkv-attention-plain"}
# A decoding step's attention over its KV cache (rules/decode.egg): the head widths GroupQueryAttention's kernel
# needs and a query of one position are not drawn. Checked on built decoding steps in both engines with
# onnxruntime parity at three past lengths (test_decode).
DECODE_RULES = {"decode-split-heads", "group-query-attention", "group-query-attention-rope", "kv-cache-attention"}
# sdpa's Where(IsNaN(p), 0, p) over a padding- or causally masked softmax (rules/onnx/): the OnnxOp IsNaN's proto is not
# drawn. Checked on sdpa-style ONNX models against onnxruntime (test_onnx_rules).
ISNAN_RULES = {"onnx-attention-isnan", "onnx-attention-isnan#2", "onnx-attention-causal-isnan"}
# tanh GELU through the scalar chains (rules/export_forms.egg): x-power's rows are products of constants and powers
# that the rules read only where they multiply to GELU's constants (0.5, 0.044715, sqrt(2/pi)), which no random
# instance's drawn constants do.  Each rule is checked on a graph built for it in both engines with parity
# (test_fallback) and the associations exporters write in onnxruntime (test_onnx_gelu_forms); x-power-scaled is
# checked here through the erf GELU that reads it.
SCALAR_CHAIN_BASES = {"x-power-square", "x-power-pow-2", "x-power-pow-3", "x-power-divided", "x-power-times-constant",
                      "x-power-by-constant", "x-power-times-x", "x-power-product", "gelu-arg-x-cube",
                      "gelu-arg-scaled-cube", "gelu-arg-x-factored", "gelu-arg-scaled-factored",
                      "gelu-arg-times-constant", "gelu-tanh-one", "gelu-tanh-x-o-half", "gelu-tanh-x-by-half-o",
                      "gelu-tanh-half-x-o"}
SCALAR_CHAIN = {r.name for r in RuleSet.shipped().rules if r.base in SCALAR_CHAIN_BASES}
NOT_CHECKABLE = DECODE_RULES | ISNAN_RULES | SCALAR_CHAIN
# The packed-projection attention with a bias fires on 2 of its 80 draws (the bias must be [., ., ., S]); it is
# also checked on built graphs: the op recovered from its decomposition and its kernel against it
# (test_decompositions), each rule in both engines with parity (test_fallback), exported models in onnxruntime
# (test_onnx_export, test_onnx_rules).
FEW_INSTANCES = {"qkv-attention"} | NOT_CHECKABLE
SHIPPED_ORDERS = len(RuleSet.shipped().extend(default_rule_dir() / "onnx").rules)  # rules/*.egg and rules/onnx/
CLOSING_LINE_START = (f"{SHIPPED_ORDERS} rules: {SHIPPED_ORDERS - len(NOT_CHECKABLE)} sound, 0 unsound, "
                      f"{len(NOT_CHECKABLE)} not checkable; instances checked per rule: neg-neg 3,")


# Wrong rules checked among the whole shipped set (every rules/*.egg and rules/onnx/): each must be found unsound
# there as alone, and leave the shipped rules' verdicts as they are (a rule draws its instances by its name).
WRONG_AMONG_SHIPPED = {
    # a transpose taken for its own inverse: right on the perms drawn for the shipped transpose rules' instances
    "perm-its-own-inverse": """
(rewrite (Transpose (Transpose ?x ?p) ?p) ?x :ruleset simplify :name "perm-its-own-inverse")""",
    # reads a helper relation that only the shipped RMS-norm rules fill: checkable only among them
    "rms-norm-gamma-squared": """
(rule ((= ?y (Mul ?n ?g)) (rms-normed ?n ?x ?eps)
       (= (shape ?x) ?sx) (= ?h (vec-get ?sx (- (vec-length ?sx) 1))) (= (shape ?g) (vec-of ?h)))
      ((union ?y (RmsNorm ?x (Mul ?g ?g) (NoInput) -1 ?eps))) :ruleset recognize :name "rms-norm-gamma-squared")""",
    # the shipped matmul epilogue with the wrong activation
    "matmul-relu-as-gelu": """
(rewrite (Relu (Add (MatMul ?x ?w) ?b)) (FusedMatMulBiasAct ?x ?w ?b "gelu")
         :ruleset fuse :name "matmul-relu-as-gelu")""",
    # adds wrong rows to a shipped helper relation: the shipped layer-norm reading them builds the wrong value, but
    # the rule that wrote the rows is at fault (layer-norm stays sound)
    "tanh-is-ln-normed": """
(rule ((= ?n (Tanh ?x))) ((ln-normed ?n ?x 1e-05)) :ruleset recognize :name "tanh-is-ln-normed")""",
    # the shipped causal biased attention with its own fill for the causal Where's: right wherever a query keeps an
    # unmasked key, wrong on the rows a left-padded mask fully masks (only the padded-mask run draws them)
    "causal-biased-own-fill": """
(rule ((= ?ctx (MatMul (Softmax ?c -1) ?v4)) (causal-scores ?c ?sum) (= ?c (Where ?keep ?sum (Scalar ?fill ?dt)))
       (= ?sum (Add ?s ?bias)) (attn-scores ?s ?q4 ?k4 ?scale) (= (shape ?sum) (shape ?s))
       (> (vec-length (shape ?bias)) 0) (= (shape ?k4) (shape ?v4)) (split-qk ?q4 ?k4)
       (head-split ?q4 ?q ?heads) (head-split ?k4 ?k ?heads) (head-split ?v4 ?v ?heads)
       (= ?t (Transpose ?ctx (vec-of 0 2 1 3))))
      ((union ?t (MultiHeadAttention ?q ?k ?v ?bias ?heads ?scale true false -1000000000.0)))
      :ruleset blocks :name "causal-biased-own-fill")""",
    # a weight fold that forgets to scale the bias: judged on stored weights like the shipped folds, and wrong there
    "layer-scale-bias-unscaled": """
(rule ((= ?e (Mul (Add (MatMul ?x ?w) ?b) ?g)) (= ?w (Param ?wn ?ws ?dt)) (= ?b (Param ?bn ?bs ?dt))
       (= ?g (Param ?gn ?bs ?dt)) (= (vec-length ?ws) 2) (= ?bs (vec-of (vec-get ?ws 1))))
      ((let ?sw (WeightScale ?w ?g)) (set (shape ?sw) ?ws) (set (dtype ?sw) ?dt) (union ?e (Add (MatMul ?x ?sw) ?b)))
      :ruleset simplify :name "layer-scale-bias-unscaled")""",
}
# Rules that build derived weights from parameters (weight-prep ops: a BatchNormalization or a layer scale folded
# into the weights before it, a zero bias, parameters concatenated), every operand order: judged with the parameters
# they fold as stored, finite weights, as optimize checks each fold on the model's stored weights.
WEIGHT_FOLDS = {"conv-batch-norm", "conv-batch-norm-bias", "conv-sum-zero-bias", "conv-sum-zero-bias#2",
                "layer-scale-linear", "layer-scale-linear#2", "layer-scale-linear#3", "layer-scale-linear#4",
                "shared-input-last", "shared-input-last-bias", "shared-input-linear", "shared-input-matmul"}
SHIPPED_FILES = {str(p.relative_to(ROOT)) for p in (ROOT / "rules").rglob("*.egg")}  # rules/ and rules/onnx/


@pytest.mark.long
def test_the_whole_shipped_set_is_sound_and_wrong_rules_among_it_are_found() -> None:
    """One check of every shipped rule file (rules/*.egg and the ONNX front end's rules/onnx/) with the wrong rules
    (the costliest check of the suite, run once: the assertions on it are grouped below)."""
    wrong = RuleSet.from_strings(*WRONG_AMONG_SHIPPED.values(), names=[f"{n}.egg" for n in WRONG_AMONG_SHIPPED])
    report = check(RuleSet.shipped().extend(default_rule_dir() / "onnx") + wrong)
    shipped = SoundnessReport([v for v in report.verdicts if v.location.rpartition(":")[0] in SHIPPED_FILES])
    assert {v.location.rpartition(":")[0] for v in shipped.verdicts} == SHIPPED_FILES
    _wrong_rules_among_all_shipped_rules_are_found(report)
    _every_shipped_rule_is_sound_on_random_instances(shipped)
    _facts_only_rules_are_checked_through_their_readers(shipped)
    _weight_folds_are_judged_on_stored_weights(report, shipped)
    _the_closing_line_lists_instances_per_rule(shipped)


def _wrong_rules_among_all_shipped_rules_are_found(report: SoundnessReport) -> None:
    assert sorted(report.unsound()) == sorted(WRONG_AMONG_SHIPPED)
    for name in WRONG_AMONG_SHIPPED:
        verdict = report.by_rule(name)
        assert verdict.status == UNSOUND and name in verdict.counterexample.problem
    text = WRONG_AMONG_SHIPPED["perm-its-own-inverse"]
    alone = check(RuleSet.from_strings(text, names=["perm-its-own-inverse.egg"])).by_rule("perm-its-own-inverse")
    among = report.by_rule("perm-its-own-inverse")
    assert alone.status == UNSOUND and among.counterexample.leaves == alone.counterexample.leaves  # drawn by name
    # alone, nothing fills rms-normed: the rule cannot fire; among the shipped rules it is checked on their forms
    rms = WRONG_AMONG_SHIPPED["rms-norm-gamma-squared"]
    assert check(RuleSet.from_strings(rms), attempts=4).by_rule("rms-norm-gamma-squared").status == NOT_CHECKABLE_STATUS
    rows = report.by_rule("tanh-is-ln-normed")
    assert rows.counterexample.rule == "tanh-is-ln-normed" and rows.counterexample.problem.startswith("a LayerNorm ")
    assert rows.counterexample.problem.endswith("; built or merged by layer-norm on helper-relation rows written by "
                                                "tanh-is-ln-normed")
    # alone, it is checked through the shipped rules that read ln-normed, which are not reported
    alone = check(RuleSet.from_strings(WRONG_AMONG_SHIPPED["tanh-is-ln-normed"], names=["rows.egg"]), instances=1)
    assert [(v.rule, v.status) for v in alone.verdicts] == [("tanh-is-ln-normed", UNSOUND)]
    assert "built or merged by layer-norm on helper-relation rows written by tanh-is-ln-normed" in str(alone)


def _every_shipped_rule_is_sound_on_random_instances(shipped: SoundnessReport) -> None:
    assert shipped.ok and shipped.unsound() == []
    statuses = {v.rule: v.status for v in shipped.verdicts}
    assert len(statuses) == SHIPPED_ORDERS  # every operand order the loader generates
    assert {r for r, s in statuses.items() if s != SOUND} == NOT_CHECKABLE
    instances = {v.rule: v.instances for v in shipped.verdicts if v.rule not in FEW_INSTANCES}
    assert min(instances.values()) == 3  # check()'s default: every rule, every operand order, 3 or more
    assert {r: instances[r] for r in ONCE_NOT_CHECKABLE} == dict.fromkeys(ONCE_NOT_CHECKABLE, 3)
    assert instances["mul-one"] == 3 and instances["gelu-erf-plus-one"] == 19  # checked through its three readers
    layer = shipped.by_rule("transformer-layer")  # FusedAttentionBlock(hidden [B, S, h], ...) as the layer's root,
    assert layer.status == SOUND and layer.instances == 3  # built from its registry sampler


def _facts_only_rules_are_checked_through_their_readers(shipped: SoundnessReport) -> None:
    erf = shipped.by_rule("gelu-erf-div")
    assert erf.status == SOUND and erf.reason.startswith("facts only: checked through the rules that read them (")
    assert "gelu-erf-x-o-half" in erf.reason
    order = shipped.by_rule("gelu-erf-mul#2")  # an operand order reached two unfoldings deep
    assert order.status == SOUND and order.instances == 8 and "gelu-erf-x-by-half-o" in order.reason
    chain = shipped.by_rule("shared-input-order")
    assert chain.status == SOUND and "k matmuls of one input" in chain.reason
    end = shipped.by_rule("shared-input-matmul")  # the chain's last step, on k matmuls of one Param-defined input
    assert end.status == SOUND and end.instances == 3


def _weight_folds_are_judged_on_stored_weights(report: SoundnessReport, shipped: SoundnessReport) -> None:
    folds = [v for v in shipped.verdicts if v.weight_fold]
    assert {v.rule for v in folds} == WEIGHT_FOLDS and all(v.status == SOUND and v.instances >= 3 for v in folds)
    layer_scale = shipped.by_rule("layer-scale-linear")
    assert layer_scale.reason == ("weight fold: builds WeightScale from parameters, judged with them as stored weights "
                                  "(finite; special values in the data only); optimize checks every fold on the "
                                  "model's stored weights")
    assert "weight fold: builds BnFoldBias, BnFoldWeight" in str(shipped.by_rule("conv-batch-norm"))
    assert shipped.to_dict()["rules"][[v.rule for v in shipped.verdicts].index("conv-batch-norm")]["weight_fold"]
    wrong = report.by_rule("layer-scale-bias-unscaled")  # a weight fold is judged, not exempted
    assert wrong.weight_fold and wrong.status == UNSOUND and "differs from its e-class's value" in str(wrong)


def _the_closing_line_lists_instances_per_rule(shipped: SoundnessReport) -> None:
    last = str(shipped).splitlines()[-1]
    assert last.startswith(CLOSING_LINE_START)
    qkv = shipped.by_rule("qkv-attention").instances  # fires on a few of its draws (FEW_INSTANCES)
    assert qkv >= 1 and f"qkv-attention {qkv}, " in last
    assert "transformer-layer 3, " in last and "shared-input-matmul 3, " in last \
        and "qkv-attention-plain 3, " in last and "group-query-attention 0, " in last
    assert shipped.to_dict()["ok"] is True and len(shipped.to_dict()["rules"]) == SHIPPED_ORDERS


def test_a_wrong_rule_over_param_definitions_is_caught() -> None:
    text = """
(rule ((= ?m (MatMul ?x ?w)) (= ?w (Param ?n ?s ?dt)) (= (vec-length ?s) 2) (= (vec-get ?s 0) (vec-get ?s 1)))
      ((union ?m (MatMulBT ?x ?w))) :ruleset fuse :name "param-transposed")"""
    verdict = check(RuleSet.from_strings(text)).by_rule("param-transposed")
    assert verdict.status == UNSOUND and "param-transposed" in verdict.counterexample.problem
    assert any(leaf.startswith("w") for leaf in verdict.counterexample.leaves)  # the weight is a Param leaf


@pytest.mark.parametrize("name", sorted(WRONG))
def test_each_wrong_rule_is_unsound_and_named(name: str) -> None:
    report = check(RuleSet.from_strings(WRONG[name], names=[f"{name}.egg"]))
    verdict = report.by_rule(name)
    assert not report.ok and report.unsound() == [name]
    assert verdict.status == UNSOUND and verdict.counterexample is not None
    assert name in verdict.counterexample.problem
    assert verdict.counterexample.leaves  # the instance's leaves with their types


def test_wrong_rules_loaded_together_are_each_blamed() -> None:
    report = check(RuleSet.from_strings(*WRONG.values(), names=[f"{n}.egg" for n in WRONG]))
    assert sorted(report.unsound()) == sorted(WRONG)


def test_a_value_error_reports_its_largest_error() -> None:
    verdict = check(RuleSet.from_strings(WRONG["silu-to-sigmoid"])).by_rule("silu-to-sigmoid")
    assert verdict.counterexample.max_abs > 1e-3
    assert "differs from its e-class's value" in verdict.counterexample.problem


def test_a_shape_changing_rule_is_reported_as_ill_typed() -> None:
    verdict = check(RuleSet.from_strings(WRONG["reshape-dropped"])).by_rule("reshape-dropped")
    assert "different types" in verdict.counterexample.problem


def test_the_check_is_deterministic() -> None:
    rules = RuleSet.from_strings(WRONG["silu-to-sigmoid"], '(rewrite (Neg (Neg ?x)) ?x :ruleset simplify :name "nn")')
    assert check(rules).to_dict() == check(rules).to_dict()


def test_cli_rules_check_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.egg"
    bad.write_text(WRONG["silu-to-sigmoid"] + "\n")
    assert main(["rules", "check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "unsound        silu-to-sigmoid" in out and "counter-example:" in out
    good = tmp_path / "good.egg"
    good.write_text('(rewrite (Neg (Neg ?x)) ?x :ruleset simplify :name "nn")\n')
    assert main(["rules", "check", str(good), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["rules"][0]["rule"] == "nn" and data["rules"][0]["instances"] == 3


def test_rules_module_is_public_and_the_wheel_ships_the_files_beside_it() -> None:
    # the checker runs rules in the egglog engine, a layer above the rule model: rlx_egraph.rules does not name it
    assert rlx_egraph.rules.RuleSet is RuleSet and "check" not in rlx_egraph.rules.__all__
    force = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert force["force-include"] == {"rules": f"rlx_egraph/{SHIPPED_RULES_DIR}"}
    assert SHIPPED_RULES_DIR != "rules"  # would clash with the package rlx_egraph/rules
    assert default_rule_dir() == ROOT / "rules"


def test_default_rule_dir_prefers_the_packaged_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlx_egraph.rules.ruleset as rules_module

    package = tmp_path / "rlx_egraph"
    (package / "rules").mkdir(parents=True)
    (package / SHIPPED_RULES_DIR).mkdir()
    monkeypatch.setattr(rules_module, "__file__", str(package / "rules" / "ruleset.py"))
    assert rules_module.default_rule_dir() == package / SHIPPED_RULES_DIR
