"""The user-facing RuleSet: load from files or strings, combine, disable, list; load errors by exact message."""

import json
import re
from pathlib import Path

import pytest

from rlx_egraph import Graph, optimize_with_report
from rlx_egraph.cli.main import main
from rlx_egraph.engines.egglog.rules import RuleError, RuleSet, default_rule_dir, load_rules

EXP_LOG = ';; exp(log(x)) = x for x > 0\n(rewrite (Exp (Log ?x)) ?x :ruleset simplify :name "exp-log")\n'


def exp_log_graph() -> Graph:
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.relu(g.exp(g.log(g.sigmoid(x))))])
    return g


def load_error(text: str) -> str:
    with pytest.raises(RuleError) as err:
        RuleSet.from_strings(text, names=["mine.egg"])
    return str(err.value)


def test_shipped_is_the_default_rule_set() -> None:
    assert RuleSet.shipped() is load_rules() is RuleSet.from_files(default_rule_dir())
    assert RuleSet.shipped().disabled == frozenset()


def test_from_strings_names_its_sources() -> None:
    one, two = RuleSet.from_strings(EXP_LOG, '\n(rewrite (Neg (Neg ?x)) ?x :ruleset simplify :name "nn")\n').list()
    assert (one["name"], one["location"], two["name"], two["location"]) == ("exp-log", "<string 1>:2",
                                                                             "nn", "<string 2>:2")
    with pytest.raises(ValueError) as err:
        RuleSet.from_strings(EXP_LOG, names=["a.egg", "b.egg"])
    assert str(err.value) == "from_strings got 1 texts but 2 names"


def test_list_gives_one_record_per_rule() -> None:
    records = RuleSet.from_strings(EXP_LOG, names=["mine.egg"]).list()
    assert records == [{"name": "exp-log", "stage": "simplify", "file": "mine.egg", "line": 2,
                        "location": "mine.egg:2", "reads": ["Exp", "Log"], "builds": [], "operand_orders": 1}]
    shipped = RuleSet.shipped()
    assert [r["name"] for r in shipped.list()] == list(dict.fromkeys(r.base for r in shipped.rules))
    assert sum(r["operand_orders"] for r in shipped.list()) == len(shipped.rules)


def test_adding_user_rules_to_the_shipped_ones(tmp_path: Path) -> None:
    path = tmp_path / "mine.egg"
    path.write_text(EXP_LOG)
    shipped, mine = RuleSet.shipped(), RuleSet.from_files(path)
    combined = shipped + mine
    assert [r.name for r in combined.rules] == [r.name for r in shipped.rules] + ["exp-log"]
    assert combined.by_name("exp-log").location == f"{path}:2"
    assert [r.name for r in shipped.extend(path).rules] == [r.name for r in combined.rules]
    assert len(shipped.rules) == len(combined.rules) - 1  # the operands are not changed
    optimized, report = optimize_with_report(exp_log_graph(), rules=combined, regions=False)
    assert [n.op for n in optimized.nodes] == ["Input", "Sigmoid", "Relu"]
    assert report.matches_per_rule["exp-log"] >= 1


def test_replacing_the_shipped_rules() -> None:
    only = RuleSet.from_strings(EXP_LOG)
    assert [r.name for r in only.rules] == ["exp-log"]
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.mul(x, g.sigmoid(g.exp(g.log(x))))])  # x * sigmoid(x) once exp-log fired: no Silu rule here
    # exp-log holds only for x > 0, where the parity check's normal data does not stay: not checked here
    optimized, report = optimize_with_report(g, rules=only, regions=False, verify=False)
    assert [n.op for n in optimized.nodes] == ["Input", "Sigmoid", "Mul"]
    assert set(report.matches_per_rule) <= {"exp-log"}


def test_without_disables_rules_by_name_and_survives_adding() -> None:
    shipped = RuleSet.shipped()
    less = shipped.without(["silu-mul-sigmoid"])
    assert len(less.rules) == len(shipped.rules) - 2  # the rule as written and its other operand order
    assert less.disabled == {"silu-mul-sigmoid"}
    assert "silu-mul-sigmoid" not in [r.name for r in (less + RuleSet.from_strings(EXP_LOG)).rules]
    assert less.without("silu-mul-sigmoid") is less  # disabling twice is not an error
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.mul(x, g.sigmoid(x))])
    assert [n.op for n in optimize_with_report(g, rules=shipped, regions=False)[0].nodes] == ["Input", "Silu"]
    optimized, report = optimize_with_report(g, rules=less, regions=False)
    assert [n.op for n in optimized.nodes] == ["Input", "Sigmoid", "Mul"]
    assert "silu-mul-sigmoid" not in report.matches_per_rule


def test_without_an_unknown_name_lists_close_names() -> None:
    with pytest.raises(RuleError) as err:
        RuleSet.shipped().without("silu-mul-sigmod")
    assert str(err.value) == "no rule named 'silu-mul-sigmod' to disable; close names: silu-mul-sigmoid"
    with pytest.raises(RuleError) as err:
        RuleSet.from_strings(EXP_LOG).without(["exp-log", "zzz"])
    assert str(err.value) == "no rule named 'zzz' to disable (1 rules loaded)"


def test_adding_a_rule_set_twice_names_both_places() -> None:
    mine = RuleSet.from_strings(EXP_LOG, names=["mine.egg"])
    other = RuleSet.from_strings('(rewrite (Relu ?x) (Relu ?x) :ruleset fuse :name "exp-log")', names=["b.egg"])
    with pytest.raises(RuleError) as err:
        mine + other
    assert str(err.value) == "b.egg:1: rule name 'exp-log' is already used at mine.egg:2"


@pytest.mark.parametrize(("text", "message"), [
    ('(rewrite (Relu ?x) (Neg ?x)) :ruleset simplify :name "oops")\n', "mine.egg:1: parse error: unexpected `)`"),
    ('\n(rewrite (Relu ?x) (Foo ?x) :ruleset fuse :name "bad")\n', "mine.egg:2: rule 'bad': unknown constructor 'Foo'"),
    ('(rewrite (Relu ?x) (Sigmod ?x) :ruleset fuse :name "bad")\n',
     "mine.egg:1: rule 'bad': unknown constructor 'Sigmod'; did you mean 'Sigmoid'?"),
    ('\n\n(rewrite (Add ?a ?b ?c) (Relu ?a) :ruleset fuse :name "bad")\n',
     "mine.egg:3: rule 'bad': wrong arity: Add takes 2 arguments (a, b), got 3 in (Add ?a ?b ?c)"),
    ('(rewrite (Narrow ?x -1 0 64) (Narrow ?x "a" 0 64) :ruleset fuse :name "bad")\n',
     "mine.egg:1: rule 'bad': wrong type: \"a\" has sort String where sort i64 is expected"),
    ('(rewrite (Narrow ?x -1 0 64) (Narrow ?x -1 0 1.5) :ruleset fuse :name "bad")\n',
     "mine.egg:1: rule 'bad': wrong type: 1.5 has sort f64 where sort i64 is expected"),
    ('(rewrite (Relu ?x) (Add ?x ?y) :ruleset fuse :name "bad")\n',
     "mine.egg:1: rule 'bad': variable ?y is used but the left side does not bind it"),
    ('(rule ((= ?e (Relu ?x)))\n      ((union ?e (Add ?x ?y)))\n      :ruleset fuse :name "bad")\n',
     "mine.egg:2: rule 'bad': variable ?y is used but its query does not bind it"),
    ('(rewrite (Relu ?x) (Neg ?x) :ruleset fuse :name "a")\n(rewrite (Neg ?x) (Relu ?x) :ruleset fuse :name "a")\n',
     "mine.egg:2: rule name 'a' is already used at mine.egg:1"),
], ids=["syntax", "unknown-constructor", "close-constructor", "arity", "attribute-type", "float-for-int",
        "unbound-rewrite", "unbound-rule", "duplicate"])
def test_load_errors_name_file_line_rule_and_problem(text: str, message: str) -> None:
    assert load_error(text) == message


def test_a_rule_file_with_an_error_is_named_by_its_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.egg"
    path.write_text('(rewrite (Relu ?x) (Foo ?x) :ruleset fuse :name "bad")\n')
    with pytest.raises(RuleError) as err:
        RuleSet.shipped().extend(path)
    assert str(err.value) == f"{path}:1: rule 'bad': unknown constructor 'Foo'"


def test_the_rule_writing_walkthrough_rule_fires_as_documented(tmp_path: Path) -> None:
    section = (Path(__file__).resolve().parent.parent / "docs" / "writing_rules.md").read_text()
    rule_text = section.split('```scheme title="silu_div.egg"\n')[1].split("```")[0]  # the rule file
    path = tmp_path / "silu_div.egg"
    path.write_text(rule_text)
    g = Graph()
    x = g.input("x", (4, 64))
    w, b = g.param("w", (64, 64)), g.param("b", (64,))
    h = g.add(g.matmul(x, w), b)
    g.set_outputs([g.div(h, g.add(g.scalar(1.0), g.exp(g.neg(h))))])
    rules = RuleSet.shipped() + RuleSet.from_files(path)
    assert [(r["name"], r["line"], r["builds"]) for r in RuleSet.from_files(path).list()] == [
        ("silu-div-exp", 2, ["Silu"])]
    optimized, report = optimize_with_report(g, rules=rules, verify=True)
    # shared-input-*weight record the matmul's weight as a candidate for a shared-input concatenation
    assert set(report.matches_per_rule) == {"matmul-bias", "matmul-bias-silu", "silu-div-exp", "shared-input-weight",
                                            "shared-input-linear-weight"}
    assert [(f.node, f.op, f.rules, f.replaces) for f in report.fusions] == [
        (3, "FusedMatMulBiasAct", ("matmul-bias-silu",), (9,))]
    assert [n.op for n in optimized.nodes] == ["Input", "Param", "Param", "FusedMatMulBiasAct"]
    assert optimized.nodes[3].attrs["act"] == "silu"
    assert str(report.fusions[0]) in section
    without, _ = optimize_with_report(g, rules=RuleSet.shipped())
    assert len(without) == 6


# --- user rules that read the shipped helper relations -----------------------------------------------------------

def _declared_at(relation: str, rel_path: str) -> str:
    """``rel_path:line`` of the shipped declaration of ``relation``."""
    lines = (default_rule_dir().parent / rel_path).read_text().splitlines()
    return f"{rel_path}:{next(k for k, line in enumerate(lines, 1) if line.startswith(f'(relation {relation} '))}"


RMS_NORMED_DECLARED_AT = _declared_at("rms-normed", "rules/export_forms.egg")
RMS_BETA = (';; y = N * gamma + beta with gamma and beta [H] for x [..., H]: RmsNorm with a beta.\n'
            '(rule ((= ?y (Add (Mul ?n ?g) ?b)) (rms-normed ?n ?x ?eps)\n'
            '       (= (shape ?x) ?sx) (= ?h (vec-get ?sx (- (vec-length ?sx) 1)))\n'
            '       (= (shape ?g) (vec-of ?h)) (= (shape ?b) (vec-of ?h)))\n'
            '      ((union ?y (RmsNorm ?x ?g ?b -1 ?eps))) :ruleset recognize :name "rms-norm-beta")\n')


def rms_beta_graph() -> Graph:
    g = Graph()
    x = g.input("x", (4, 8))
    gamma, beta = g.param("g", (8,)), g.param("b", (8,))
    r = g.rsqrt(g.add(g.reduce_mean(g.mul(x, x), axes=[-1], keepdims=True), g.scalar(1e-6)))
    g.set_outputs([g.add(g.mul(g.mul(x, r), gamma), beta)])
    return g


def test_a_user_rule_reading_a_shipped_helper_relation_joins_the_shipped_rules(tmp_path: Path) -> None:
    path = tmp_path / "rms_beta.egg"
    path.write_text(RMS_BETA)
    alone = RuleSet.from_files(path)  # the shipped declaration it reads is borrowed
    (borrowed,) = alone.helpers
    assert (borrowed.name, borrowed.inputs, borrowed.borrowed) == ("rms-normed", ("Op", "Op", "f64"), True)
    assert borrowed.location.endswith(RMS_NORMED_DECLARED_AT)
    shipped = RuleSet.shipped()
    for rules in (shipped + alone, shipped.extend(path), alone + shipped, load_rules([path, default_rule_dir()])):
        assert not any(d.borrowed for d in rules.helpers)  # declared by the shipped file itself
        optimized, report = optimize_with_report(rms_beta_graph(), rules=rules, regions=False, verify=True)
        assert [n.op for n in optimized.nodes] == ["Input", "Param", "Param", "RmsNorm"]
        assert optimized.nodes[3].inputs == (0, 1, 2) and report.matches_per_rule["rms-norm-beta"] == 1
    # Alone, nothing fills the relation: the rule loads and matches nothing.
    optimized, report = optimize_with_report(rms_beta_graph(), rules=alone, regions=False)
    assert "RmsNorm" not in [n.op for n in optimized.nodes] and "rms-norm-beta" not in report.matches_per_rule


def test_the_command_line_adds_a_user_rule_reading_a_shipped_relation(tmp_path: Path, capsys) -> None:
    path = tmp_path / "rms_beta.egg"
    path.write_text(RMS_BETA)
    graph, out = tmp_path / "g.json", tmp_path / "out.json"
    rms_beta_graph().save(graph)
    assert main(["optimize", str(graph), "--rules", str(path), "--verify", "-o", str(out)]) == 0
    assert [n.op for n in Graph.load(out).nodes] == ["Input", "Param", "Param", "RmsNorm"]
    capsys.readouterr()
    reader = tmp_path / "relu_normed.egg"  # one operand order: a quick check
    reader.write_text(';; a test rule reading a shipped relation\n(rule ((rms-normed ?n ?x ?eps) (= ?r (Relu ?n)))\n'
                      '      ((union ?r (Relu ?n))) :ruleset fuse :name "relu-of-normed")\n')
    assert main(["rules", "check", str(reader), "--json"]) == 0
    (verdict,) = json.loads(capsys.readouterr().out)["rules"]
    assert (verdict["rule"], verdict["location"]) == ("relu-of-normed", f"{reader}:2")


def test_files_loaded_together_resolve_each_others_relations_in_any_order(tmp_path: Path) -> None:
    reader, declarer = tmp_path / "a_reader.egg", tmp_path / "b_declarer.egg"
    reader.write_text(';; reads the relation b declares\n(rule ((relu-of ?r ?x)) ((union ?r (Relu ?x))) '
                      ':ruleset simplify :name "relu-again")\n')
    declarer.write_text(';; relu-of R X: R is Relu(X)\n(relation relu-of (Op Op))\n'
                        '(rule ((= ?r (Relu ?x))) ((relu-of ?r ?x)) :ruleset simplify :name "note-relu")\n')
    both = RuleSet.from_files(reader, declarer)
    assert [r.name for r in both.rules] == ["relu-again", "note-relu"]
    assert [(d.name, d.location, d.borrowed) for d in both.helpers] == [("relu-of", f"{declarer}:2", False)]
    with pytest.raises(RuleError) as err:
        RuleSet.from_files(reader)  # a user relation of another file is not borrowed
    assert str(err.value) == f"{reader}:2: rule 'relu-again': unknown constructor 'relu-of'"


def test_a_relation_declared_twice_names_both_places(tmp_path: Path) -> None:
    path = tmp_path / "mine.egg"
    path.write_text(';; my own rms-normed\n(relation rms-normed (Op Op f64))\n')
    assert RuleSet.from_files(path).helpers[0].borrowed is False
    with pytest.raises(RuleError) as err:
        RuleSet.shipped().extend(path)
    assert re.fullmatch(rf"{re.escape(str(path))}:2: 'rms-normed' is already declared at \S*{RMS_NORMED_DECLARED_AT}",
                        str(err.value))


# --- rules that fail while they run -------------------------------------------------------------------------------


def relu_narrow_graph() -> Graph:
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.relu(g.narrow(x, axis=-1, start=1, length=4))])
    return g


@pytest.mark.parametrize(("text", "problem"), [
    ('(rule ((= ?e (Relu ?x))) ((panic "relu is not allowed here")) :ruleset simplify :name "no-relu")',
     "rule 'no-relu' failed at run time (stage simplify): it panicked: relu is not allowed here"),
    ('(rule ((= ?e (Narrow ?x ?a ?s ?l)))\n      ((union ?e (Narrow ?x ?a (* ?s 9223372036854775807) ?l)))\n'
     '      :ruleset fuse :name "narrow-overflow")',
     "rule 'narrow-overflow' failed at run time (stage fuse): the primitive '*' has no value at "
     "(* ?s 9223372036854775807) in its actions"),
], ids=["panic", "i64-overflow"])
def test_a_rule_that_fails_in_a_run_is_a_rule_error_naming_it(tmp_path: Path, capsys, text: str,
                                                             problem: str) -> None:
    path = tmp_path / "mine.egg"
    path.write_text(";; fails when it fires\n" + text + "\n")
    rule = RuleSet.from_files(path).rules[0]
    assert (rule.panics, rule.facts_only) == (("panic" in text), False)
    with pytest.raises(RuleError) as err:
        optimize_with_report(relu_narrow_graph(), rules=RuleSet.shipped().extend(path))
    assert str(err.value) == f"{path}:2: {problem}"
    graph = tmp_path / "g.json"
    relu_narrow_graph().save(graph)
    assert main(["optimize", str(graph), "--rules", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}:2: {' '.join(problem.split())}\n"
    # the soundness check finds it failing on its first instance: unsound, exit 1
    assert main(["rules", "check", str(path)]) == 1
    verdict = capsys.readouterr().out.splitlines()
    assert verdict[0].split() == ["unsound", problem.split("'")[1], f"{path}:2", "1", "instance(s)"]
    assert verdict[1].startswith(f"    counter-example: {path}:2: {problem}; instance x0: ")
