"""Rule files are loaded honestly: cached by content, and every command the
optimizer cannot run faithfully is refused at load time with ``file:line``."""

from pathlib import Path

import pytest
from egglog import bindings as eb

from rlx_egraph import Graph, dump_egglog_program, optimize_with_report
from rlx_egraph.egraph.rules import RuleError, default_rule_dir, load_rules


def write(tmp_path: Path, text: str, name: str = "user.egg") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(RuleError) as err:
        load_rules([default_rule_dir(), path])
    return str(err.value)


def exp_log_graph() -> Graph:
    g = Graph()
    x = g.input("x", (4, 8))
    g.set_outputs([g.exp(g.log(g.sigmoid(x)))])
    return g


def test_a_rule_file_edited_in_place_is_read_again(tmp_path):
    # Both versions have the same length, so neither the path nor the size tells them apart.
    path = write(tmp_path, ';; a test rule\n(rewrite (Exp (Log ?x)) ?x :ruleset simplify :name "exp-log-a")\n')
    _, first = optimize_with_report(exp_log_graph(), rules=[default_rule_dir(), path], regions=False)
    path.write_text(';; a test rule\n(rewrite (Exp (Log ?x)) ?x :ruleset simplify :name "exp-log-b")\n')
    rules = load_rules([default_rule_dir(), path])
    assert [r.name for r in rules.rules if r.name.startswith("exp-log")] == ["exp-log-b"]
    optimized, second = optimize_with_report(exp_log_graph(), rules=[default_rule_dir(), path], regions=False)
    assert first.matches_per_rule["exp-log-a"] >= 1 and "exp-log-b" not in first.matches_per_rule
    assert second.matches_per_rule["exp-log-b"] >= 1 and "exp-log-a" not in second.matches_per_rule
    assert [n.op for n in optimized.nodes] == ["Input", "Sigmoid"]


def test_unchanged_rule_files_are_parsed_once(tmp_path):
    path = write(tmp_path, ';; a test rule\n(rewrite (Exp (Log ?x)) ?x :ruleset simplify :name "exp-log")\n')
    assert load_rules([default_rule_dir(), path]) is load_rules([default_rule_dir(), path])
    assert load_rules() is load_rules([default_rule_dir()])


ONLY_ADD = ("rules may only add terms and facts (union, let, set, relation facts); the extractor already picks "
            "the cheapest term of each e-class")


@pytest.mark.parametrize("text, line, problem", [
    (';; ok\n(rule ((= ?e (Relu ?x))) ((delete (Relu ?x))) :ruleset simplify :name "drop")\n', 2,
     "rule 'drop': 'delete' is not supported"),
    ('(rule ((= ?e (Relu (Relu ?x))))\n      ((union ?e (Relu ?x))\n       (subsume (Relu (Relu ?x))))\n'
     '      :ruleset simplify :name "relu-once")\n', 3, "rule 'relu-once': 'subsume' is not supported"),
    ('\n(rewrite (Relu (Relu ?x)) (Relu ?x) :subsume :ruleset simplify :name "relu-once")\n', 2,
     "rule 'relu-once': ':subsume' is not supported"),
])
def test_rules_that_remove_terms_are_refused_at_load(tmp_path, text, line, problem):
    path = write(tmp_path, text)
    assert refusal(path) == f"{path}:{line}: {problem}: {ONLY_ADD}"


@pytest.mark.parametrize("text, line, keyword", [
    ('(rewrite (Exp (Log ?x)) ?x :ruleset simplify :name "exp-log")\n\n(run 10)\n', 3, "run"),
    (';; comment (with parens\n(let $x (Relu (NoInput)))\n', 2, "let"),
    ('(relation seen (Op))\n;; "quoted" (text)\n\n(push)\n', 4, "push"),
    ('(relation seen (Op))\n  (pop)\n', 2, "pop"),
    ('\n(run-schedule (saturate (run simplify)))\n', 2, "run-schedule"),
    ('(datatype Extra (Thing))\n', 1, "datatype"),
    ('\n\n(check (Relu (NoInput)))\n', 3, "check"),
    ('\n(include "other.egg")\n', 2, "include"),
])
def test_other_commands_are_refused_at_their_line(tmp_path, text, line, keyword):
    path = write(tmp_path, text)
    assert refusal(path) == (f"{path}:{line}: '{keyword}' does not belong in a rule file, which holds only rewrite, "
                             f"birewrite, rule and relation commands; the optimizer declares and runs the stages "
                             f"simplify, recognize, fuse, blocks")


def test_a_rule_file_that_is_not_utf8_names_the_file_line_and_byte(tmp_path):
    path = tmp_path / "latin1.egg"
    path.write_bytes(b';; ok\n(rewrite (Exp (Log ?x)) ?x :ruleset simplify :name "exp-log")\n;; caf\xe9\n')
    assert refusal(path) == (f"{path}:3: not UTF-8 text (invalid continuation byte 0xe9 at byte 74, column 7); "
                             f"rule files must be UTF-8")


def test_a_union_of_tensor_lists_is_refused_because_its_provenance_cannot_be_recorded(tmp_path):
    path = write(tmp_path, '\n(rule ((= ?e (ConcatParams ?l ?axis))) ((union ?l (TNil)))\n'
                           '      :ruleset fuse :name "lists")\n')
    assert refusal(path) == (f"{path}:2: rule 'lists' cannot record provenance (only unions of Op terms can be "
                             f"recorded): Expect expression ?l to have type Op, but get type TensorList")


def test_the_dumped_program_records_provenance_when_run_as_is(tmp_path):
    path = write(tmp_path, ';; both directions of one equation\n'
                           '(birewrite (Max ?x ?y) (Max ?y ?x) :ruleset simplify :name "max-commute")\n')
    g = Graph()
    x = g.input("x", (4, 8))
    y = g.input("y", (4, 8))
    g.set_outputs([g.mul(x, g.sigmoid(x)), g.max(x, y)])  # nodes 0..4: x, y, Sigmoid, Mul, Max
    program = dump_egglog_program(g, [default_rule_dir(), path])
    assert "(relation built-Silu (Op String))" in program and "(relation merged-by (Op String))" in program
    egraph = eb.EGraph()
    egraph.parse_and_run_program(program)
    egraph.parse_and_run_program('(check (built-Silu (rlx-node 0) "silu-mul-sigmoid"))'
                                 '(check (merged-by (rlx-node 3) "silu-mul-sigmoid"))'
                                 '(check (built-Max (rlx-node 1) (rlx-node 0) "max-commute"))'
                                 '(check (merged-by (rlx-node 4) "max-commute"))')
    with pytest.raises(eb.EggSmolError):
        egraph.parse_and_run_program('(check (built-Silu (rlx-node 0) "silu-sigmoid-mul"))')


def test_a_rule_nested_past_the_limit_is_refused_before_egglog_parses_it(tmp_path):
    deep = 150  # well within the limit: loads, and its one order runs
    term = "(Neg " * deep + "?x" + ")" * deep
    path = write(tmp_path, f';; deep\n(rewrite {term} ?x :ruleset simplify :name "deep")\n')
    assert [r.name for r in load_rules(path).rules] == ["deep"]
    for deep in (400, 20_000):  # 20,000 would overflow egglog's own parser
        term = "(Neg " * deep + "?x" + ")" * deep
        path = write(tmp_path, f';; deep\n(rewrite {term} ?x :ruleset simplify :name "deep")\n')
        with pytest.raises(RuleError) as err:
            load_rules(path)
        assert str(err.value) == f"{path}:2: parentheses nest {deep + 1} deep; a rule file may nest at most 200"
