"""Rule files as data, the egglog encoding, and the checks that catch bad rules."""

from pathlib import Path

import pytest
from egglog import bindings as eb

from rlx_egraph import Graph, dump_egglog_program, examples, optimize_with_report
from rlx_egraph.egraph.encode import encode_graph
from rlx_egraph.egraph.rules import STAGES, RuleError, default_rule_dir, load_rules
from rlx_egraph.egraph.schema import schema_text
from rlx_egraph.egraph.view import UnsoundRewrite
from rlx_egraph.ir import REGISTRY
from rlx_egraph.kernels.parity import ParityError


def write(tmp_path: Path, text: str, name: str = "user.egg") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_rules_load_with_names_stages_and_locations():
    rules = load_rules()
    names = [r.name for r in rules.rules]
    assert len(names) == len(set(names)) >= 60
    assert {r.stage for r in rules.rules} == set(STAGES)
    silu = rules.by_name("silu-mul-sigmoid")
    assert silu.location == "rules/export_forms.egg:6" or silu.location.endswith("export_forms.egg:6")
    assert silu.builds == {"Silu"} and silu.reads == {"Mul", "Sigmoid"}
    assert {r.name for r in rules.producers("FusedSwiGLU")} == {"fused-swiglu-up-first", "fused-swiglu-gate-first",
                                                               "fused-swiglu-cast"}


def test_every_shipped_rule_is_documented_by_a_comment_above_it():
    """Each rule, or the block of rules it belongs to, sits right under a ;; comment."""
    for path in sorted(default_rule_dir().glob("*.egg")):
        lines = path.read_text().splitlines()
        for rule in load_rules(path).rules:
            k = rule.line - 2
            while k >= 0 and lines[k].strip() and not lines[k].startswith(";;"):
                k -= 1
            assert k >= 0 and lines[k].startswith(";;"), f"{rule.location} has no comment above it"


@pytest.mark.parametrize("text, message", [
    ('(rewrite (Relu ?x) (Foo ?x) :ruleset fuse :name "bad")', "user.egg:1: rule 'bad': unknown constructor 'Foo'"),
    ('\n\n(rewrite (Add ?a ?b ?c) (Relu ?a) :ruleset fuse :name "bad")',
     "user.egg:3: rule 'bad': wrong arity: Add takes 2 arguments (a, b), got 3"),
    ('(rewrite (Relu ?x', "user.egg:1:"),
    ('(rewrite (Relu ?x) (Silu ?x) :ruleset nowhere :name "bad")', "needs ':ruleset' set to one of"),
    ('(rewrite (Relu ?x) (Silu ?x) :ruleset fuse)', "every rule needs a ':name"),
    ('(rewrite (Relu ?x) (Silu ?x) :ruleset fuse :name "silu-mul-sigmoid")',
     "rule name 'silu-mul-sigmoid' is already used at"),
    ('(let $x (Relu (NoInput)))', "only rewrite, birewrite, rule and relation commands"),
])
def test_malformed_rule_files_fail_at_load_with_file_and_line(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(RuleError) as err:
        load_rules([default_rule_dir(), path])
    assert message in str(err.value)
    assert "user.egg:" in str(err.value)


def test_missing_rule_file_is_reported(tmp_path):
    with pytest.raises(RuleError, match="no such rule file or folder"):
        load_rules(tmp_path / "nope.egg")


def test_user_rules_run_with_the_shipped_ones(tmp_path):
    path = write(tmp_path, ';; exp(log(x)) = x for x > 0 (a test rule)\n'
                           '(rewrite (Exp (Log ?x)) ?x :ruleset simplify :name "exp-log")\n')
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.relu(g.exp(g.log(g.sigmoid(x))))])
    og, rep = optimize_with_report(g, rules=[default_rule_dir(), path], regions=False)
    assert [n.op for n in og.nodes] == ["Input", "Sigmoid", "Relu"]
    assert rep.matches_per_rule["exp-log"] >= 1


def test_a_rule_that_breaks_parity_is_named(tmp_path):
    path = write(tmp_path, ';; wrong on purpose\n(rewrite (Exp (Relu ?x)) (Relu ?x) :ruleset fuse :name "drop-exp")\n')
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.exp(g.relu(x))])
    with pytest.raises(ParityError) as err:
        optimize_with_report(g, rules=[default_rule_dir(), path], verify=True)
    assert "node 1 (Relu) differs from original node 2 (Exp)" in str(err.value)
    assert "built by rule(s): drop-exp" in str(err.value)


def test_a_rule_that_changes_shapes_is_caught_as_unsound(tmp_path):
    path = write(tmp_path, ';; wrong on purpose\n'
                           '(rewrite (Narrow ?x ?axis ?start ?len) (Relu ?x) :ruleset fuse :name "narrow-away")\n')
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.narrow(x, axis=1, start=0, length=4)])
    with pytest.raises(UnsoundRewrite) as err:
        optimize_with_report(g, rules=[default_rule_dir(), path], strict=True)
    assert "a Relu e-node has type f32[4, 8] but its e-class has type f32[4, 4]" in str(err.value)
    assert "narrow-away (" in str(err.value)
    og, rep = optimize_with_report(g, rules=[default_rule_dir(), path], verify=True)  # not strict: left out
    assert og == g
    assert [(bad.op, bad.rules) for bad in rep.ill_typed] == [("Relu", ("narrow-away",))]


def test_schema_has_one_constructor_per_registered_op():
    text = schema_text()
    for name in REGISTRY:
        assert f"({name} " in text or f"({name})" in text or f"(constructor {name} " in text


def test_dumped_program_runs_as_is_in_egglog():
    g = examples.llama(layers=1)
    program = dump_egglog_program(g)
    assert '(rlx-row-Input 0 "input_ids" 0 "i64")' in program and "(set (rlx-vec 0) (vec-of 2 16))" in program
    assert "(run-schedule" in program
    egraph = eb.EGraph()
    egraph.parse_and_run_program(program)
    out = egraph.parse_and_run_program(f"(extract (rlx-node {g.outputs[0]}))")
    assert "FusedRmsNormMatMul" in out[0].termdag.to_string(out[0].term) or out[0].cost > 0


def test_encoding_carries_attributes_and_shape_facts():
    g = Graph()
    x = g.input("x", (2, 3, 4))
    t = g.transpose(g.transpose(x, perm=(0, 2, 1)), perm=(0, 2, 1))
    g.set_outputs([g.narrow(g.scalar(0.5) if False else t, axis=-1, start=1, length=2)])
    encoding = encode_graph(g)
    text = encoding.text
    assert "(set (rlx-vec 1) (vec-of 0 2 1))" in text and "(rlx-row-Transpose 1 0 1)" in text
    assert "(rlx-row-Narrow 3 2 -1 1 2)" in text
    assert "(set (rlx-vec 3) (vec-of 2 3 2))" in text and '(rlx-row-type 3 3 "f32")' in text
    assert '(rlx-row-type 0 0 "f32")' in text
    assert "(inverse-perms (vec-of 0 2 1) (vec-of 0 2 1))" in text
    egraph = eb.EGraph()
    egraph.parse_and_run_program(schema_text())
    encoding.load(egraph)  # the rows through files: the same terms and facts
    egraph.parse_and_run_program("(check (= (rlx-node 1) (Transpose (rlx-node 0) (vec-of 0 2 1))))"
                                 "(check (= (rlx-node 3) (Narrow (rlx-node 2) -1 1 2)))"
                                 "(check (= (shape (rlx-node 3)) (vec-of 2 3 2)))"
                                 '(check (= (dtype (rlx-node 0)) "f32"))')
    og, _ = optimize_with_report(g)
    assert [n.op for n in og.nodes] == ["Input", "Narrow"]  # the transposes cancel
