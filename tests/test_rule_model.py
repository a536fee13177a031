"""The rule model: rules parsed once into data, written back as egglog exactly, operand orders as data, and the
primitives and fact tables defined once with egglog's meaning."""

import math
from pathlib import Path

import pytest
from egglog import bindings as eb

from rlx_egraph import Graph
from rlx_egraph.engines.egglog.schema import FACT_TABLES as SCHEMA_TABLES
from rlx_egraph.engines.egglog.schema import schema_text
from rlx_egraph.frontends.onnx.rules import onnx_rules
from rlx_egraph.ir.graph import Node
from rlx_egraph.rules import (
    FACT_TABLES,
    PRIMITIVES,
    STAGES,
    Absent,
    Call,
    Fact,
    Guard,
    Insert,
    Let,
    Lit,
    Lookup,
    NoValue,
    OpTerm,
    Pattern,
    RuleError,
    RuleSet,
    SetValue,
    TensorList,
    Union,
    Var,
    atom_variables,
    rename_atom,
)
from rlx_egraph.rules.emit import rule_text
from rlx_egraph.rules.flat import flatten, input_vars
from rlx_egraph.rules.parse import parse_file
from rlx_egraph.rules.primitives import I64_MAX, I64_MIN, same_value
from rlx_egraph.rules.signatures import constructor_args, node_arg
from rlx_egraph.rules.tables import GraphFacts
from rlx_egraph.rules.terms import float_text

F64 = "f64"


def lit(value):
    return Lit(value, {bool: "bool", int: "i64", float: "f64", str: "String"}[type(value)])


def test_a_rule_is_parsed_into_patterns_facts_guards_and_actions():
    rules = RuleSet.shipped()
    t = rules.by_name("transpose-transpose")
    assert t.kind == "rule" and t.stage == "simplify" and t.location.endswith("rules/algebra.egg:26")
    assert t.query == (Pattern(OpTerm("Transpose", (OpTerm("Transpose", (Var("?x"), Var("?p"))), Var("?q"))),
                               Var("?e")),
                       Fact("inverse-perms", (Var("?p"), Var("?q"))))
    assert t.actions == (Union(Var("?e"), Var("?x")),)
    assert t.variables == ("?e", "?x", "?p", "?q") and t.facts_only is False
    div = rules.by_name("attn-scores-div")
    assert div.query[1:] == (Fact("attn-scores", (Var("?m"), Var("?q4"), Var("?k4"), Var("?a"))),
                             Guard(">", (Var("?c"), Lit(0.0, F64))))
    assert div.actions == (Insert("attn-scores", (Var("?s"), Var("?q4"), Var("?k4"),
                                                  Call("/", (Var("?a"), Var("?c"))))),)
    assert div.facts_only and div.tables_read == {"attn-scores"} and div.tables_written == {"attn-scores"}
    noop = rules.by_name("reshape-noop")
    assert noop.query[1] == Fact("shape", (Var("?x"),), Var("?s"))
    sdpa = rules.by_name("attn-keys-heads-last-sdpa")
    assert sdpa.actions[:2] == (
        Let("?k4", OpTerm("Transpose", (Var("?k"), Call("vec-of", tuple(map(lit, (0, 2, 1, 3))))))),
        SetValue("shape", (Var("?k4"),), Call("vec-of", tuple(Call("vec-get", (Var("?sk"), lit(i)))
                                                                for i in (0, 2, 1, 3)))))
    chain = rules.by_name("shared-input-matmul")
    assert chain.query[0].term.args[1] == OpTerm("ConcatParams", (TensorList((Var("?wh"),), Var("?wt")), lit(-1)))
    assert chain.query[1] == Fact("shared-prev", (Var("?x"), lit("matmul"), Lookup("param-order", (Var("?wh"),))),
                                  Var("?o"), value_first=True)
    rms = rules.by_name("rms-norm")
    assert rms.actions[0].right.args[2] == Absent()


def test_atoms_rename_their_variables():
    rule = RuleSet.shipped().by_name("attn-keys-heads-last")
    first, *_ = rule.query
    renamed = rename_atom(first, {"?m": Var("?root"), "?k": OpTerm("Relu", (Var("?y"),))})
    assert str(renamed) == "(= ?root (MatMul ?q4 (Transpose (Relu ?y) (vec-of 0 2 3 1))))"
    assert atom_variables(renamed) == ["?root", "?q4", "?y"]
    assert str(rename_atom(rule.query[1], {"?sk": Var("?s")})) == "(= ?s (shape ?k))"


def test_a_rewrite_is_a_rule_over_its_root_with_sides_and_conditions():
    rule = RuleSet.shipped().by_name("matmul-bias-gelu")
    assert rule.kind == "rewrite" and rule.query[0].var == Var("?rewrite-root")
    assert str(rule.lhs) == '(Gelu (FusedMatMulBiasAct ?x ?w ?b "none") "none")'
    assert str(rule.rhs) == '(FusedMatMulBiasAct ?x ?w ?b "gelu")' and rule.conditions == ()
    assert rule.egglog_names == ("matmul-bias-gelu",)
    both = RuleSet.from_strings('(birewrite (Max ?x ?y) (Min ?y ?x) :when ((!= ?x ?y)) :ruleset simplify '
                                ':name "mm")').by_name("mm")
    assert [str(c) for c in both.conditions] == ["(!= ?x ?y)"]
    assert [(d.name, str(d.query[0]), str(d.actions[0])) for d in both.directions] == [
        ("mm=>", "(= ?rewrite-root (Max ?x ?y))", "(union ?rewrite-root (Min ?y ?x))"),
        ("mm<=", "(= ?rewrite-root (Min ?y ?x))", "(union ?rewrite-root (Max ?x ?y))")]
    with pytest.raises(AttributeError, match="is a rule, not a rewrite"):
        _ = RuleSet.shipped().by_name("reshape-noop").lhs


def test_operand_orders_are_rules_of_their_own_with_the_written_one_first():
    rules = RuleSet.shipped()
    orders = [r for r in rules.rules if r.base == "mul-one"]
    assert [(r.name, r.order, str(r.lhs)) for r in orders] == [
        ("mul-one", 1, "(Mul ?x (Scalar 1.0 ?dt))"), ("mul-one#2", 2, "(Mul (Scalar 1.0 ?dt) ?x)")]
    assert [r.name for r in rules.written] == [r["name"] for r in rules.list()]
    square = RuleSet.from_strings('(rewrite (Mul ?x ?x) (Neg ?x) :ruleset simplify :name "sq")')
    assert [r.name for r in square.rules] == ["sq"]  # (Mul ?x ?x) has one order


def every_rule():
    shipped = RuleSet.shipped()
    return shipped.rules + [r for r in onnx_rules().rules if r.file.endswith("onnx_forms.egg")]


def test_the_program_the_engine_runs_is_what_egglog_itself_prints_for_it():
    reader = eb.EGraph()
    for rule in every_rule():
        commands = reader.parse_program(rule.program_text)
        assert "\n".join(map(str, commands)) == rule.program_text, rule.name
        assert [c.rule.name for c in commands] == list(rule.egglog_names)


def test_a_rule_written_back_parses_to_the_same_model():
    for rule in (r for r in every_rule() if r.order == 1):  # (an order's name is refused in a file)
        again = parse_file("again.egg", rule_text(rule)).rules[0]
        assert (again.kind, again.query, again.actions, again.reads, again.builds, again.new_enodes) == (
            rule.kind, rule.query, rule.actions, rule.reads, rule.builds, rule.new_enodes), rule.name


@pytest.mark.parametrize("value", [1.0, 0.5, 1e-6, 2.5e-8, 1e15, 1e16, 1e20, 1.5e300, -10000.0, 0.7978845608028654,
                                   5e-324, math.inf, -math.inf, math.nan, -0.0])
def test_float_literals_are_written_so_egglog_reads_back_the_same_value(value):
    egraph = eb.EGraph()
    (command,) = egraph.parse_program(f"(let $v {float_text(value)})")
    assert same_value(command.action.rhs.value.value, value)
    assert math.copysign(1.0, command.action.rhs.value.value) == math.copysign(1.0, value)


# Arguments of every primitive, edge cases included (overflow, zero divisors, out of range, negative operands).
SAMPLES = [
    ("+", (1, 2)), ("+", (I64_MAX, 1)), ("+", (1.5, 2.25)), ("+", ("ab", "c")), ("+", ("a", "b", "c")),
    ("-", (3, 5)), ("-", (I64_MIN, 1)), ("-", (0.5, 2.0)),
    ("*", (6, -7)), ("*", (2 ** 40, 2 ** 40)), ("*", (1.5, -2.0)),
    ("/", (7, 2)), ("/", (-7, 2)), ("/", (7, -2)), ("/", (7, 0)), ("/", (I64_MIN, -1)), ("/", (-7.0, 2.0)),
    ("/", (1.0, 0.0)),
    ("%", (7, 2)), ("%", (-7, 2)), ("%", (7, -2)), ("%", (7, 0)), ("%", (I64_MIN, -1)), ("%", (-7.5, 2.0)),
    ("%", (1.0, 0.0)),
    ("^", (6, 3)), ("^", (2.0, 0.5)), ("^", (-8.0, 0.3333)), ("^", (10.0, 400.0)),
    ("&", (6, 3)), ("|", (6, 3)),
    ("<<", (3, 2)), ("<<", (3, 62)), ("<<", (1, 64)), ("<<", (1, -1)), (">>", (-8, 1)), (">>", (8, 64)),
    ("not-i64", (5,)), ("log2", (9,)), ("log2", (1,)), ("log2", (0,)),
    ("min", (1, 2)), ("min", (2.5, -1.0)), ("max", (1, 2)), ("max", (2.5, -1.0)),
    ("abs", (-3,)), ("abs", (I64_MIN,)), ("abs", (-2.5,)), ("neg", (2.0,)),
    ("to-f64", (3,)), ("to-i64", (-2.7,)), ("to-i64", (1e300,)), ("to-i64", (-1e300,)),
    ("to-string", (12,)), ("to-string", (-3,)), ("to-string", (1.5,)), ("to-string", (100.0,)),
    ("to-string", (1e-7,)), ("to-string", (1e-5,)), ("to-string", (0.0001,)), ("to-string", (1e15,)),
    ("to-string", (1e16,)), ("to-string", (1e20,)),
    ("<", (1, 2)), ("<", (2, 1)), ("<", (1.0, 2.0)), (">", (2, 1)), (">", (1.0, 1.0)), ("<=", (2, 2)),
    ("<=", (3, 2)), (">=", (1, 2)), (">=", (2.0, 2.0)),
    ("!=", (1, 1)), ("!=", (1, 2)), ("!=", ("a", "b")), ("!=", (0.0, -0.0)), ("!=", ((1, 2), (1, 2))),
    ("bool-=", (1, 1)), ("bool-<", (1, 2)), ("bool->", (1, 2)), ("bool-<=", (2, 2)), ("bool->=", (1, 2)),
    ("not", (True,)), ("and", (True, False)), ("or", (True, False)), ("xor", (True, True)), ("=>", (True, False)),
    ("=>", (False, False)),
    ("replace", ("abab", "ab", "c")), ("count-matches", ("aaaa", "aa")),
    ("vec-of", (1, 2, 3)), ("vec-empty", ()), ("vec-push", ((1,), 2)), ("vec-pop", ((1, 2),)), ("vec-pop", ((),)),
    ("vec-append", ((1,), (2, 3))), ("vec-get", ((1, 2), 1)), ("vec-get", ((1, 2), 2)), ("vec-get", ((1, 2), -1)),
    ("vec-set", ((1, 2), 0, 5)), ("vec-set", ((1, 2), 2, 5)), ("vec-remove", ((1, 2), 0)),
    ("vec-remove", ((1, 2), 5)), ("vec-length", ((1, 2, 3),)), ("vec-range", (3,)), ("vec-range", (-2,)),
    ("vec-contains", ((1, 2), 2)), ("vec-contains", ((1, 2), 3)), ("vec-not-contains", ((1, 2), 2)),
    ("vec-not-contains", ((1, 2), 3)),
]


def egglog_text(value):
    if isinstance(value, tuple):
        return f"(vec-of {' '.join(map(str, value))})" if value else "(vec-empty)"
    if value is None:
        return "()"
    return str(lit(value))


def test_every_primitive_means_what_egglog_computes():
    assert {name for name, _ in SAMPLES} == set(PRIMITIVES)
    for name, args in SAMPLES:
        call = f"({name}{''.join(' ' + egglog_text(a) for a in args)})"
        egraph = eb.EGraph()
        egraph.parse_and_run_program("(sort IntVec (Vec i64))")
        try:
            expected = PRIMITIVES[name](*args)
        except NoValue:
            with pytest.raises(eb.EggSmolError, match=r"call of primitive .* failed"):
                egraph.parse_and_run_program(f"(let $v {call})")
            continue
        egraph.parse_and_run_program(f"(check (= {call} {egglog_text(expected)}))")  # egglog's own equality
        assert PRIMITIVES[name].holds(*args)


def small_graph() -> Graph:
    g = Graph()
    x = g.input("x", (2, 3))
    w = g.param("w", (3, 4))
    b = g.param("b", (4,))
    t = g.transpose(g.add(g.matmul(x, w), b), perm=(1, 0))
    g.set_outputs([g.transpose(t, perm=(1, 0)), g.transpose(g.transpose(g.reshape(t, shape=(2, 2, 2)),
                                                                          perm=(1, 2, 0)), perm=(2, 0, 1))])
    return g


def test_fact_tables_have_one_meaning_on_a_graph():
    g = small_graph()
    facts = GraphFacts(g, attention_block_max_tokens=32)
    table = FACT_TABLES
    assert table["shape"].evaluate(facts, 5) == (4, 2) and table["dtype"].evaluate(facts, 1) == "f32"
    assert table["param-order"].evaluate(facts, 2) == 1
    with pytest.raises(NoValue):
        table["param-order"].evaluate(facts, 0)
    with pytest.raises(NoValue):
        table["shape"].evaluate(facts, 99)
    assert table["attention-block-max-tokens"].evaluate(facts) == 32
    assert table["inverse-perms"].evaluate(facts, (1, 2, 0), (2, 0, 1)) is None
    with pytest.raises(NoValue):
        table["inverse-perms"].evaluate(facts, (1, 2, 0), (1, 2, 0))
    assert list(table["inverse-perms"].rows(g, facts)) == [(((1, 0), (1, 0)), None), (((1, 2, 0), (2, 0, 1)), None),
                                                          (((2, 0, 1), (1, 2, 0)), None)]
    assert list(table["param-order"].rows(g, facts)) == [((1,), 0), ((2,), 1)]
    assert [row for row in table["shape"].rows(g, facts)][:3] == [((0,), (2, 3)), ((1,), (3, 4)), ((2,), (4,))]


def test_the_schema_declares_each_fact_table_once_from_its_definition():
    assert {name: t.declaration for name, t in FACT_TABLES.items()} == SCHEMA_TABLES
    assert SCHEMA_TABLES["shape"] == "(function shape (Op) IntVec :merge old)"
    assert SCHEMA_TABLES["inverse-perms"] == "(relation inverse-perms (IntVec IntVec))"
    assert all(schema_text().count(d) == 1 for d in SCHEMA_TABLES.values())


def test_a_rule_calling_an_egglog_primitive_the_optimizer_does_not_define_is_refused():
    with pytest.raises(RuleError) as err:
        RuleSet.from_strings(';; sqrt is egglog\'s, not ours\n(rule ((= ?e (Scalar ?v ?dt)) (> (sqrt ?v) 1.0))\n'
                             '      ((union ?e (Scalar ?v ?dt))) :ruleset simplify :name "roots")', names=["mine.egg"])
    assert str(err.value).startswith("mine.egg:2: rule 'roots': egglog's primitive 'sqrt' is not one the optimizer "
                                     "defines (every engine evaluates primitives the same way); rules may call +, -, *")


@pytest.mark.parametrize(("text", "message"), [
    ('(rewrite ?x (Relu ?x) :ruleset simplify :name "r")',
     "mine.egg:1: rule 'r': the left side of a rewrite must be an op term, got ?x"),
    ('(rule ((= ?e (Relu ?x))) ((+ 1 2)) :ruleset simplify :name "r")',
     "mine.egg:1: rule 'r': the action (+ 1 2) neither adds a relation row nor builds a term"),
])
def test_forms_outside_the_model_are_refused_at_their_line(text, message):
    with pytest.raises(RuleError) as err:
        RuleSet.from_strings(text, names=["mine.egg"])
    assert str(err.value) == message


def test_the_rules_reference_documents_every_stage_table_primitive_and_shipped_helper():
    page = (Path(__file__).resolve().parent.parent / "docs" / "rules.md").read_text()
    tables = page.split("## Fact tables")[1].split("## Primitives")[0]
    assert [line.split("`")[1] for line in tables.splitlines() if line.startswith("| `")] == list(FACT_TABLES)
    primitives = page.split("## Primitives")[1].split("## Helper relations")[0]
    documented = {name.replace("\\|", "|") for line in primitives.splitlines() if line.startswith("| `")
                  for name in line.split("`")[1].split()}
    documented |= {"bool-=", "bool-<", "bool->", "bool-<=", "bool->="}  # named in the checks' row
    assert documented == set(PRIMITIVES)
    helpers = page.split("Shipped helper relations")[1].split("## Operand orders")[0]
    shipped = {name for line in helpers.splitlines() if line.startswith("| `")
               for name in line.split("|")[1].replace("`", "").replace(",", " ").split()}
    assert shipped == {d.name for d in onnx_rules().helpers}
    stages = page.split("### Stages")[1].split("### Terms")[0]
    assert [line.split("`")[1] for line in stages.splitlines() if line.startswith("| `")] == list(STAGES)
    for problem in ("it panicked: relu is not allowed here", "'rms-normed' is already declared at",
                    "egglog's primitive 'sqrt' is not one the optimizer defines"):
        assert problem in page


def test_a_node_argument_is_read_where_its_constructor_takes_it():
    """Inputs first (an optional input that is not there as the value given for it, a variadic one as the ids from
    there on), then the attributes in declaration order."""
    conv = Node(5, "Conv", (1, 2), {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "groups": 1},
                (1, 4, 8, 8), "f32")
    assert [node_arg(conv, k, arg, "absent") for k, arg in enumerate(constructor_args(conv.spec))] == [
        1, 2, "absent", (1, 1), (0, 0, 0, 0), (1, 1), 1]
    concat = Node(6, "Concat", (1, 2, 3), {"axis": 0}, (3,), "f32")
    assert [node_arg(concat, k, arg) for k, arg in enumerate(constructor_args(concat.spec))] == [(1, 2, 3), 0]


def test_flatten_names_each_nested_op_term_top_down_and_each_built_term():
    """A rule flattened for a node-by-node matcher: one Pattern atom per op term, the outer one first, each
    nested term named by a fresh variable; a guard's value terms as written; each new term a let of its own,
    inner ones first."""
    ruleset = RuleSet.from_strings('(rewrite (Gelu (FusedMatMulBiasAct ?x ?w ?b "none") "tanh") '
                                   '(Neg (FusedMatMulBiasAct ?x ?w ?b "gelu_tanh")) '
                                   ':when ((= (vec-length (shape ?x)) 2)) :ruleset fuse :name "flat")')
    (flat,) = flatten(ruleset.rules[0])
    assert [str(a) for a in flat.query] == [
        '(= ?rewrite-root (Gelu ?$1 "tanh"))', '(= ?$1 (FusedMatMulBiasAct ?x ?w ?b "none"))',
        "(= (vec-length (shape ?x)) 2)"]
    assert [str(a) for a in flat.actions] == ['(let ?$3 (FusedMatMulBiasAct ?x ?w ?b "gelu_tanh"))',
                                              "(let ?$2 (Neg ?$3))", "(union ?rewrite-root ?$2)"]
    assert input_vars(flat.query[1].term) == ["?x", "?w", "?b"]
    assert flat.facts_only is False and flat.tables_read == frozenset({"shape"})
