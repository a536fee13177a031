"""Operand orders of commutative ops: the loader generates them, every export form is recognised in all of them."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import pytest

from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.engines.egglog.rules import MAX_VARIANTS, RuleError, default_rule_dir, load_rules
from rlx_egraph.examples import GELU_TANH_COEF, SQRT_2, SQRT_2_OVER_PI
from rlx_egraph.ir import REGISTRY
from rlx_egraph.rules import RuleSet

X_SHAPE = (2, 4, 8)


# --- graph helpers ---------------------------------------------------------------------------------------------------


def commutative_nodes(g: Graph) -> list[int]:
    """Ids of the nodes of commutative ops whose two inputs differ (swapping equal inputs changes nothing)."""
    return [n.id for n in g.nodes if n.spec.commutative and n.inputs[0] != n.inputs[1]]


def permuted(g: Graph, swap: set[int]) -> Graph:
    """``g`` with the inputs of the nodes ``swap`` in the other order."""
    records = [{"id": n.id, "op": n.op, "inputs": n.inputs[::-1] if n.id in swap else n.inputs, "attrs": n.attrs}
               for n in g.nodes]
    return Graph.from_nodes(records, g.outputs, g.name)


def every_order(g: Graph, nodes: list[int]) -> list[Graph]:
    """``g`` in every combination of operand orders of ``nodes`` (2 ** len(nodes) graphs, as built first)."""
    return [permuted(g, {n for n, swap in zip(nodes, choice, strict=True) if swap})
            for choice in product((False, True), repeat=len(nodes))]


def side_by_side(graphs: list[Graph]) -> Graph:
    """One graph holding ``graphs`` apart: ids shifted, leaves renamed ``v<k>.<name>``, outputs in order."""
    records, outputs, offset = [], [], 0
    for k, g in enumerate(graphs):
        for n in g.nodes:
            attrs = {**n.attrs, "name": f"v{k}.{n.attrs['name']}"} if n.op in ("Input", "Param") else n.attrs
            records.append({"id": offset + n.id, "op": n.op, "inputs": [offset + i for i in n.inputs], "attrs": attrs})
        outputs += [offset + o for o in g.outputs]
        offset += max(n.id for n in g.nodes) + 1
    return Graph.from_nodes(records, outputs, "orders")


# --- export forms (examples.py's, and the other forms the rules name) -----------------------------------------------


def _gelu_erf_half_first(g: Graph, x: int) -> int:
    """Exact GELU in the other association: ``(x * 0.5) * (1 + erf(x * 1/sqrt 2))``."""
    o = g.add(g.erf(g.mul(x, g.scalar(1.0 / SQRT_2))), g.scalar(1.0))
    return g.mul(g.mul(x, g.scalar(0.5)), o)


def _gelu_tanh_cubed_by_muls(g: Graph, x: int) -> int:
    """tanh-GELU with x^3 as ``(x * x) * x``, in the other association ``(x * 0.5) * O``."""
    a = g.mul(g.mul(g.mul(x, x), x), g.scalar(GELU_TANH_COEF))
    t = g.tanh(g.mul(g.add(x, a), g.scalar(SQRT_2_OVER_PI)))
    return g.mul(g.mul(x, g.scalar(0.5)), g.add(t, g.scalar(1.0)))


def _layer_norm_rsqrt(g: Graph, x: int) -> int:
    """Decomposed LayerNorm with ``d * rsqrt(var + eps)``."""
    d = g.sub(x, g.reduce_mean(x, axes=(-1,), keepdims=True))
    var = g.reduce_mean(g.pow(d, g.scalar(2.0)), axes=(-1,), keepdims=True)
    n = g.mul(d, g.rsqrt(g.add(var, g.scalar(1e-5))))
    return g.add(g.mul(n, g.param("ln.weight", X_SHAPE[-1:])), g.param("ln.bias", X_SHAPE[-1:]))


def _rms_norm_recip_sqrt(g: Graph, x: int) -> int:
    """RMSNorm with ``mean(x * x)`` and ``recip(sqrt(. + eps))``."""
    r = g.recip(g.sqrt(g.add(g.reduce_mean(g.mul(x, x), axes=(-1,), keepdims=True), g.scalar(1e-6))))
    return g.mul(g.mul(x, r), g.param("rms.weight", X_SHAPE[-1:]))


def _rms_norm_div_sqrt(g: Graph, x: int) -> int:
    """RMSNorm with ``x / sqrt(mean(x^2) + eps)``."""
    a = g.add(g.reduce_mean(g.pow(x, g.scalar(2.0)), axes=(-1,), keepdims=True), g.scalar(1e-6))
    return g.mul(g.div(x, g.sqrt(a)), g.param("rms.weight", X_SHAPE[-1:]))


def _residual(norm: str) -> Callable[[Graph, int], int]:
    """``norm(x + r)`` with a native LayerNorm or RmsNorm."""
    def build(g: Graph, x: int) -> int:
        gamma, beta = g.param("n.weight", X_SHAPE[-1:]), g.param("n.bias", X_SHAPE[-1:])
        return g.add_node(norm, [g.add(x, g.input("r", X_SHAPE)), gamma, beta], axis=-1, eps=1e-5)
    return build


@dataclass(frozen=True)
class Form:
    name: str
    build: Callable[[Graph, int], int]  # (graph, x) -> the form's output
    orders: int  # operand orders of its commutative ops
    fused: dict[str, int]  # the fusions recognised in each order


FORMS = [
    Form("silu", examples._silu, 2, {"Silu": 1}),
    Form("gelu-erf", examples._gelu_erf, 8, {"Gelu": 1}),
    Form("gelu-erf-half-first", _gelu_erf_half_first, 16, {"Gelu": 1}),
    Form("gelu-tanh", examples._gelu_tanh, 64, {"Gelu": 1}),
    Form("gelu-tanh-cubed-by-muls", _gelu_tanh_cubed_by_muls, 128, {"Gelu": 1}),
    Form("layer-norm", lambda g, x: examples._layer_norm(g, x, "ln", 1e-5), 8, {"LayerNorm": 1}),
    Form("layer-norm-rsqrt", _layer_norm_rsqrt, 16, {"LayerNorm": 1}),
    Form("rms-norm", lambda g, x: examples._rms_norm(g, x, "rms", 1e-6), 8, {"RmsNorm": 1}),
    Form("rms-norm-recip-sqrt", _rms_norm_recip_sqrt, 8, {"RmsNorm": 1}),
    Form("rms-norm-div-sqrt", _rms_norm_div_sqrt, 4, {"RmsNorm": 1}),
    Form("swiglu", lambda g, x: examples._llama_mlp(g, x, "mlp", 16), 4,
         {"ConcatParams": 1, "FusedSwiGLU": 1, "MatMul": 1}),
    Form("matmul-bias", lambda g, x: examples._linear(g, x, "fc", 16), 2, {"FusedMatMulBiasAct": 1}),
    Form("matmul-residual", lambda g, x: g.add(g.matmul(x, g.param("w", (8, 8))), g.input("r", X_SHAPE)), 2,
         {"FusedMatMulAdd": 1}),
    Form("residual-layer-norm", _residual("LayerNorm"), 2, {"FusedResidualLN": 1}),
    Form("residual-rms-norm", _residual("RmsNorm"), 2, {"FusedResidualRmsNorm": 1}),
]


@pytest.mark.parametrize("form", FORMS, ids=[f.name for f in FORMS])
def test_every_operand_order_of_an_export_form_is_recognised(form: Form) -> None:
    g = Graph(form.name)
    g.set_outputs([form.build(g, g.input("x", X_SHAPE))])
    orders = every_order(g, commutative_nodes(g))
    assert len(orders) == len({o.to_json() for o in orders}) == form.orders
    opt, report = optimize_with_report(side_by_side(orders), verify=True)
    built = Counter(f.op for f in report.fusions)  # nodes rules built (recognised primitives too)
    assert built == {op: n * form.orders for op, n in form.fused.items()}
    assert report.parity is not None and report.parity.ok
    assert len(opt.outputs) == form.orders


def test_tanh_gelu_is_recognised_in_each_of_its_64_orders_on_its_own():
    """Side by side proves the total; here the output of every order is a Gelu node."""
    g = Graph()
    g.set_outputs([examples._gelu_tanh(g, g.input("x", X_SHAPE))])
    opt, _ = optimize_with_report(side_by_side(every_order(g, commutative_nodes(g))), verify=True)
    assert [(opt.node(o).op, opt.node(o).attrs["approximate"]) for o in opt.outputs] == [("Gelu", "tanh")] * 64


def test_a_bert_layer_fuses_whole_with_its_residual_adds_in_any_order():
    """residual-layer-norm builds FusedResidualLN in both orders, so transformer-layer needs no commute rule."""
    g = examples.bert(layers=1)
    residuals = [n.id for n in g.nodes if n.op == "Add" and all(g.node(i).op not in ("Param", "Input", "Scalar")
                                                              and g.node(i).shape == g.node(n.id).shape
                                                              for i in n.inputs)]
    assert len(residuals) == 2
    _, report = optimize_with_report(side_by_side(every_order(g, residuals)), verify=True)
    assert report.fused_op_counts["FusedTransformerLayer"] == 4
    assert report.parity is not None and report.parity.ok


# --- the loader -----------------------------------------------------------------------------------------------------


def test_the_registry_marks_exactly_the_commutative_ops():
    assert sorted(op for op, spec in REGISTRY.items() if spec.commutative) == ["Add", "Equal", "Max", "Min", "Mul"]


def test_each_rule_is_loaded_once_per_distinct_operand_order():
    rules = load_rules()
    names: dict[str, list[str]] = {}
    for r in rules.rules:
        names.setdefault(r.base, []).append(r.name)
    assert names["gelu-tanh-x-o-half"] == ["gelu-tanh-x-o-half", "gelu-tanh-x-o-half#2", "gelu-tanh-x-o-half#3",
                                           "gelu-tanh-x-o-half#4"]
    cube = RuleSet.from_strings('(rule ((= ?c (Mul (Mul ?x ?x) ?x))) ((Relu ?c)) :ruleset recognize :name "cube")')
    assert [r.name for r in cube.rules] == ["cube", "cube#2"]  # (Mul (Mul ?x ?x) ?x): the inner swap repeats
    assert names["rms-mean-mul"] == ["rms-mean-mul"]  # (Mul ?x ?x)
    assert names["shared-input-matmul"] == ["shared-input-matmul"]  # no commutative op
    assert len(names) == sum(path.read_text().count(":name ") for path in rules.files)  # one base per rule written
    second = rules.by_name("silu-mul-sigmoid#2")
    assert (second.base, second.location, second.reads, second.builds) == (
        "silu-mul-sigmoid", rules.by_name("silu-mul-sigmoid").location, {"Mul", "Sigmoid"}, {"Silu"})
    assert str(second.command) == "(rewrite (Mul (Sigmoid ?x) ?x) (Silu ?x) :ruleset recognize)"
    assert second.command.rewrite.name == "silu-mul-sigmoid#2"


def test_a_variant_records_provenance_and_matches_under_its_base_rule():
    rules = load_rules()
    (command,) = rules.by_name("swiglu#2").program
    assert str(command) == ('(rule ((= ?e (Mul ?up (Silu ?gate)))\n'
                            '       (= (shape ?gate) (shape ?up)))\n'
                            '      ((union ?e (SwiGLU ?gate ?up))\n'
                            '       (built-SwiGLU ?gate ?up "swiglu")\n'
                            '       (merged-by ?e "swiglu"))\n'
                            '        :ruleset fuse :name "swiglu#2")')
    written, swapped = Graph(), Graph()
    for g, first in ((written, False), (swapped, True)):
        x = g.input("x", (4, 8))
        g.set_outputs([g.mul(g.sigmoid(x), x) if first else g.mul(x, g.sigmoid(x))])
    _, written_report = optimize_with_report(written)
    opt, report = optimize_with_report(swapped, verify=True)  # the order only silu-mul-sigmoid#2 matches
    assert [n.op for n in opt.nodes] == ["Input", "Silu"]
    assert [(f.op, f.rules) for f in report.fusions] == [("Silu", ("silu-mul-sigmoid",))]
    assert report.matches_per_rule == written_report.matches_per_rule
    assert list(report.matches_per_rule) == ["silu-mul-sigmoid"]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "user.egg"
    path.write_text(text)
    return path


def test_a_rule_with_too_many_operand_orders_is_refused_with_its_location(tmp_path):
    term = "?x0"
    for k in range(1, 10):  # nine nested Adds of distinct operands: 512 orders
        term = f"(Add {term} ?x{k})"
    path = _write(tmp_path, f';; too wide\n(rewrite {term} ?x0 :ruleset simplify :name "wide")\n')
    with pytest.raises(RuleError) as err:
        load_rules([default_rule_dir(), path])
    assert str(err.value) == (f"{path}:2: rule 'wide' matches in more than {MAX_VARIANTS} operand orders of its "
                              f"commutative ops (Add); split it into smaller rules joined by a helper relation")


def test_a_rule_at_the_bound_loads_every_order(tmp_path):
    term = "?x0"
    for k in range(1, 9):  # eight nested Adds: exactly 256 orders
        term = f"(Add {term} ?x{k})"
    path = _write(tmp_path, f';; as wide as allowed\n(rewrite {term} ?x0 :ruleset simplify :name "wide")\n')
    rules = load_rules(path)
    assert [r.name for r in rules.rules] == ["wide", *(f"wide#{k}" for k in range(2, MAX_VARIANTS + 1))]


def test_a_birewrite_matches_every_order_of_both_sides_and_records_its_base_name(tmp_path):
    path = _write(tmp_path, ';; max(x, y) = -min(-x, -y)\n(birewrite (Max ?x ?y) (Neg (Min (Neg ?x) (Neg ?y))) '
                            ':ruleset simplify :name "max-min")\n')
    rules = load_rules(path)
    assert [str(r.command) for r in rules.rules] == [
        "(birewrite (Max ?x ?y) (Neg (Min (Neg ?x) (Neg ?y))) :ruleset simplify)",
        "(birewrite (Max ?x ?y) (Neg (Min (Neg ?y) (Neg ?x))) :ruleset simplify)",
        "(birewrite (Max ?y ?x) (Neg (Min (Neg ?x) (Neg ?y))) :ruleset simplify)",
        "(birewrite (Max ?y ?x) (Neg (Min (Neg ?y) (Neg ?x))) :ruleset simplify)"]
    assert {c.rule.name for r in rules.rules for c in r.program} == {
        f"max-min{k}{d}" for k in ("", "#2", "#3", "#4") for d in ("=>", "<=")}
    recorded = re.findall(r'\((?:built-\w+|merged-by) [^\n]*"([^"]*)"\)', "\n".join(map(str, rules.commands())))
    assert len(recorded) == 4 * (2 + 5) and set(recorded) == {"max-min"}  # per variant: => 4 built + 1 merged, <= 1 + 1


def test_a_rule_name_with_the_variant_mark_is_refused(tmp_path):
    path = _write(tmp_path, ';; a name like a generated one\n(rewrite (Neg (Neg ?x)) ?x :ruleset simplify '
                            ':name "nn#2")\n')
    with pytest.raises(RuleError) as err:
        load_rules(path)
    assert str(err.value) == (f"{path}:2: rule name 'nn#2' contains '#', which names the operand-order variants the "
                              f"loader generates (nn#2, ...)")
