"""The e-graph bridge never lets an ill-typed or wrongly merged value through."""

import logging
import math
from pathlib import Path

import numpy as np
import pytest
from egglog import bindings as eb
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlx_egraph import Graph, dump_egglog_program, evaluate, optimize_with_report
from rlx_egraph.engines.egglog.encode import ESCAPED_MARK, encode_graph, string_literal, string_value
from rlx_egraph.engines.egglog.rules import default_rule_dir
from rlx_egraph.engines.egglog.schema import schema_text
from rlx_egraph.engines.egglog.view import UnsoundRewrite

H, B, S, HEADS = 16, 2, 4, 2


def rule_file(tmp_path: Path, text: str) -> list[Path]:
    path = tmp_path / "user.egg"
    path.write_text(";; wrong on purpose (a test rule)\n" + text + "\n")
    return [default_rule_dir(), path]


def with_rules(tmp_path: Path, text: str, graph: Graph, **options):
    return optimize_with_report(graph, rules=rule_file(tmp_path, text), regions=False, **options)


# --- item 4: a class holding input-graph nodes of different types -------------------------------

WRONG_NARROW = '(rewrite (Narrow ?x ?axis ?start ?len) ?x :ruleset simplify :name "wrong-narrow")'


def narrow_graph() -> Graph:
    g = Graph("narrow")
    x = g.input("x", (4, 8))
    g.set_outputs([g.relu(g.narrow(x, axis=1, start=0, length=4))])
    return g


MERGED = ("unsound rewrite: e-class 0 holds input-graph nodes of different types "
          "(node 0 (Input) f32[4, 8], node 1 (Narrow) f32[4, 4]): a rule merged values that cannot be equal; "
          "rules that merged or built it: ")


def test_merged_input_nodes_of_different_types_return_the_input_unchanged(tmp_path, caplog):
    g = narrow_graph()
    with caplog.at_level(logging.WARNING, logger="rlx_egraph"):
        og, rep = with_rules(tmp_path, WRONG_NARROW, g, verify=True)
    assert og == g and og is not g
    assert rep.matches_per_rule["wrong-narrow"] > 0
    assert rep.stop_reason.startswith(MERGED)
    assert "wrong-narrow (" in rep.stop_reason[len(MERGED):]  # with shipped rules that fired on its merge
    assert rep.stop_reason.endswith("user.egg:2); the input graph is returned unchanged")
    assert rep.fusions == [] and rep.nodes_after == 3 and rep.parity.ok
    assert [r.name for r in caplog.records] == ["rlx_egraph"] and caplog.records[0].getMessage() == rep.stop_reason


def test_merged_input_nodes_of_different_types_raise_when_strict(tmp_path):
    g = narrow_graph()
    with pytest.raises(UnsoundRewrite) as err:
        with_rules(tmp_path, WRONG_NARROW, g, strict=True)
    assert str(err.value).startswith(MERGED) and str(err.value).endswith("user.egg:2)")


# --- item 5: constants are equal only when bit-equal --------------------------------------------

def signs(graph: Graph) -> list[float]:
    return [math.copysign(1.0, n.attrs["value"]) for n in graph.nodes if n.op == "Scalar"]


def test_negative_zero_keeps_its_own_eclass_and_its_sign():
    g = Graph()
    x = g.input("x", (4,))
    plus = g.add(x, g.scalar(-0.0))  # add-zero removes it: x + (-0.0) is x, -0.0 included
    minus = g.div(g.scalar(1.0), g.mul(g.abs(x), g.scalar(-0.0)))  # 1 / (|x| * -0.0) = -inf
    kept = g.add(x, g.scalar(0.0))  # x + 0.0 is not x: -0.0 + 0.0 is 0.0
    g.set_outputs([plus, minus, kept])
    for engine in ("egglog", "fallback"):
        og, rep = optimize_with_report(g, verify=True, engine=engine, regions=False)
        assert rep.matches_per_rule["add-zero"] > 0
        assert og.outputs[0] == og.inputs[0].id and og.node(og.outputs[2]).op == "Add"
        out = evaluate(og, {"x": np.array([1.0, 2.0, 0.5, -0.0], np.float32)})
        assert out[1].tolist() == [-math.inf] * 4
        assert math.copysign(1.0, out[0][3]) == -1.0 and math.copysign(1.0, out[2][3]) == 1.0
        assert signs(og) == [-1.0, 1.0, 1.0]  # the -0.0 add-zero matched, the 1.0, the +0.0 kept


def test_an_unchanged_graph_with_both_zeros_decodes_bit_exact():
    g = Graph()
    x, y = g.input("x", (4,)), g.input("y", (4,), "f16")
    g.set_outputs([g.max(x, g.scalar(-0.0)), g.min(x, g.scalar(0.0)), g.max(y, g.scalar(-0.0, "f16"))])
    og, rep = optimize_with_report(g, regions=False)
    assert og == g and signs(og) == signs(g) == [-1.0, 1.0, -1.0]
    # -0.0 is encoded as Neg(Scalar 0.0): the f32 one reads the graph's +0.0, the f16 one adds its own +0.0
    assert rep.eclasses == len(g) + 1
    encoding = encode_graph(g)
    assert encoding.rows["rlx-row-neg-zero"] == [(2, "f32"), (6, "f16")]
    egraph = eb.EGraph()
    egraph.parse_and_run_program(schema_text())
    encoding.load(egraph)
    egraph.parse_and_run_program('(check (= (rlx-node 2) (Neg (Scalar 0.0 "f32"))))'
                                 '(check (= (rlx-node 6) (Neg (Scalar 0.0 "f16"))))')


# --- item 8: shipped rules build no ill-typed fused node; one that is built is left out --------

def attention_graph(mask_dtype: str = "f32", qkv_w: tuple[int, ...] = (H, 3 * H), layer: bool = False,
                    ffn_bias: tuple[int, ...] | None = None) -> Graph:
    """GPT-2 style QKV projection and Narrows with a custom-mask attention (the attention-block form);
    with ``layer``, the post-norm BERT layer around it (the transformer-layer form)."""
    g = Graph()
    hidden = g.input("hidden", (B, S, H))
    mask = g.input("mask", (B, S), mask_dtype)

    def linear(x: int, name: str, w: tuple[int, ...], bias: tuple[int, ...]) -> int:
        return g.add(g.matmul(x, g.param(f"{name}.weight", w)), g.param(f"{name}.bias", bias))

    qkv = linear(hidden, "qkv", qkv_w, (3 * H,))
    q, k, v = (g.narrow(qkv, axis=-1, start=i * H, length=H) for i in range(3))
    out = linear(g.attention(q, k, v, mask, heads=HEADS, mask="custom"), "out", (H, H), (H,))
    if layer:
        h1 = g.layer_norm(g.add(out, hidden), g.param("ln1.weight", (H,)), g.param("ln1.bias", (H,)))
        inner = g.gelu(linear(h1, "fc1", (H, 4 * H), (4 * H,) if ffn_bias is None else ffn_bias))
        f2 = linear(inner, "fc2", (4 * H, H), (H,) if ffn_bias is None else ffn_bias)
        out = g.layer_norm(g.add(f2, h1), g.param("ln2.weight", (H,)), g.param("ln2.bias", (H,)))
    g.set_outputs([out])
    return g


@pytest.mark.parametrize("graph, guarded, fused", [
    (attention_graph(), "", {"FusedAttentionBlock": 1}),
    (attention_graph(mask_dtype="bool"), "attention-block", {"FusedMatMulBiasAct": 2}),
    (attention_graph(mask_dtype="i64"), "attention-block", {"FusedMatMulBiasAct": 2}),
    (attention_graph(qkv_w=(B, H, 3 * H)), "attention-block", {"FusedMatMulBiasAct": 2}),
    (attention_graph(layer=True), "", {"FusedTransformerLayer": 1}),
    (attention_graph(layer=True, ffn_bias=(1,)), "transformer-layer",
     {"FusedAttentionBlock": 1, "FusedMatMulBiasAct": 2, "FusedResidualLN": 2}),
    (attention_graph(layer=True, ffn_bias=()), "transformer-layer",
     {"FusedAttentionBlock": 1, "FusedMatMulBiasAct": 2, "FusedResidualLN": 2}),
], ids=["f32-mask", "bool-mask", "i64-mask", "batched-qkv-weight", "layer", "ffn-bias-1", "ffn-bias-scalar"])
def test_attention_guards_stop_ill_typed_blocks(graph, guarded, fused):
    og, rep = optimize_with_report(graph, verify=True, strict=True, regions=False)
    assert rep.ill_typed == [] and rep.parity.ok
    if guarded:
        assert rep.matches_per_rule.get(guarded, 0) == 0
    assert {op: n for op, n in og.op_counts().items() if op.startswith("Fused")} == fused


ILL_TYPED_FUSION = '(rewrite (Add ?a ?b) (FusedMatMulBiasAct ?a ?b ?b "none") :ruleset fuse :name "add-as-matmul")'
ILL_TYPED = ("unsound rewrite: a FusedMatMulBiasAct e-node is ill-typed: bias must have rank <= 1, got [4, 8]; "
             "built by rule(s): add-as-matmul (")


def add_graph() -> Graph:
    g = Graph()
    g.set_outputs([g.relu(g.add(g.input("x", (4, 8)), g.input("y", (4, 8))))])
    return g


def test_an_ill_typed_fused_enode_is_left_out_and_reported(tmp_path, caplog):
    g = add_graph()
    with caplog.at_level(logging.WARNING, logger="rlx_egraph"):
        og, rep = with_rules(tmp_path, ILL_TYPED_FUSION, g, verify=True)
    assert og == g and rep.parity.ok and rep.stop_reason == "saturated"
    bad, swapped = rep.ill_typed  # the rule matches Add(x, y) in both operand orders: (x, y, y) and (y, x, x)
    assert (bad.op, bad.eclass, bad.rules) == ("FusedMatMulBiasAct", 2, ("add-as-matmul",))  # Add's class
    assert bad.problem == "is ill-typed: bias must have rank <= 1, got [4, 8]"
    assert bad.message.startswith(ILL_TYPED) and bad.message.endswith("user.egg:2)")
    assert rep.to_dict()["ill_typed"] == 2 * [{"op": "FusedMatMulBiasAct", "eclass": bad.eclass,
                                               "problem": bad.problem, "rules": ["add-as-matmul"]}]
    assert swapped.message == bad.message
    assert f"ill-typed e-nodes left out: 2; first: {bad.message}" in str(rep)
    assert rep.enodes == len(g) + 2  # counted in the e-graph, absent from extraction
    assert caplog.records[0].getMessage().startswith("2 ill-typed e-node(s) left out of extraction")


def test_an_ill_typed_fused_enode_raises_when_strict(tmp_path):
    with pytest.raises(UnsoundRewrite) as err:
        with_rules(tmp_path, ILL_TYPED_FUSION, add_graph(), strict=True)
    assert str(err.value).startswith(ILL_TYPED)


def test_a_rule_made_class_whose_enodes_disagree_is_left_out_whole(tmp_path):
    text = '(rule ((= ?r (Relu ?x))) ((union (Neg ?x) (Narrow ?x -1 0 2))) :ruleset fuse :name "bad-union")'
    g = Graph()
    g.set_outputs([g.relu(g.input("x", (4, 8)))])
    og, rep = with_rules(tmp_path, text, g)
    again = with_rules(tmp_path, text, g)[1]
    assert og == g
    problem = "is in e-class 1, made by rules, whose e-nodes have different types (f32[4, 2] and f32[4, 8])"
    assert [(b.op, b.eclass, b.problem, b.rules) for b in rep.ill_typed] == [
        ("Narrow", 1, problem, ("bad-union",)), ("Neg", 1, problem, ("bad-union",))]
    assert rep.ill_typed == again.ill_typed


# --- item 9: any str is an Input/Param name --------------------------------------------------------

NAMES = ["\x00", "\n", '"', "\\", "a\tb\r\n", "\U0001f600", "\u05e9\u05dc\u05d5\u05dd", "\u202eevil",
         ESCAPED_MARK + "x", "\\u00e9", "\ud800"]


def read_back(literal: str) -> str:
    egraph = eb.EGraph()
    egraph.parse_and_run_program(f"(function f () String :no-merge)\n(set (f) {literal})")
    return string_value(egraph.value_to_string(egraph.freeze().functions["f"].rows[0].output))


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_categories=())))  # every code point, surrogates too
def test_every_str_has_an_egglog_literal_that_reads_back_exactly(text):
    assert read_back(string_literal(text)) == text


def test_string_literals_are_printable_and_distinct():
    literals = [string_literal(n) for n in NAMES]
    assert len(set(literals)) == len(NAMES)
    assert all(lit.isascii() and lit.isprintable() for lit in literals[:5] + literals[7:])
    assert string_literal('a"b\\c d') == '"a\\"b\\\\c d"'
    # a tab, a newline or an outer space would not survive a tab-separated row: stored escaped
    assert string_literal('a"b\\c\nd') == '"rlx-escaped:a\\\\\\"b\\\\\\\\c\\\\nd"'
    assert string_literal("x ") == '"rlx-escaped:x\\\\u0020"'
    assert string_literal("\x00") == '"rlx-escaped:\\\\u0000"'


# One graph per draw holds every drawn name, a pair per matmul (its Input and its Param): the names go through one
# optimize together (the run, not the names, is what costs), as many of them as 25 draws of one pair each did.
TRICKY_NAMES = ["\x00", "\n", '"', "\\", "\U0001f600", "\u05e9\u05dc\u05d5\u05dd \u200f", ESCAPED_MARK + "\\u0041", "A",
                "\ud800", "\udfff", " x", "y "]


@pytest.mark.long
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(), min_size=4, max_size=10, unique=True))
@example(TRICKY_NAMES)
def test_any_names_go_through_optimize_and_the_dumped_program(names):
    pairs = list(zip(names[0::2], names[1::2], strict=False))  # (Input name, Param name); an odd last one left out
    g = Graph()
    g.set_outputs([g.relu(g.matmul(g.input(i, (2, 3)), g.param(p, (3, 3)))) for i, p in pairs])
    og = optimize_with_report(g)[0]
    assert sorted((n.op, n.name) for n in og.nodes if n.name is not None) == sorted(
        [("Input", i) for i, _ in pairs] + [("Param", p) for _, p in pairs])
    egraph = eb.EGraph()
    egraph.parse_and_run_program(dump_egglog_program(g))
    for k, fn in enumerate(("Input", "Param")):
        read = [string_value(egraph.value_to_string(row.inputs[0])) for row in egraph.freeze().functions[fn].rows]
        assert sorted(read) == sorted(pair[k] for pair in pairs), fn
