"""The verifier (kernels/parity.py): what it compares, on what data, with which tolerances."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_egraph import Graph, evaluate, examples, optimize_with_report
from rlx_egraph.engines.egglog.rules import default_rule_dir
from rlx_egraph.ir.dtypes import PARITY_TOLERANCE, loosest
from rlx_egraph.kernels.parity import (
    SECOND_SEED_MAX_ELEMENTS,
    ParityError,
    WeightFoldError,
    check_parity,
    parity_seeds,
    precisions,
)
from rlx_egraph.report import OptimizeReport


def rule_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "wrong.egg"
    path.write_text(";; wrong on purpose\n" + text)
    return path


def same_ids(g: Graph) -> dict[int, list[int]]:
    return {n.id: [n.id] for n in g.nodes}


def relu_graph() -> Graph:
    g = Graph()
    g.set_outputs([g.relu(g.input("x", (4, 8)))])
    return g


def input_only_graph() -> Graph:
    g = Graph()
    g.set_outputs([g.input("x", (4, 8))])
    return g


# --- every optimized node and every output is compared ---------------------------------------------------------------


def test_a_rule_that_returns_its_input_fails_parity(tmp_path: Path) -> None:
    rule = rule_file(tmp_path, '(rewrite (Relu ?x) ?x :ruleset simplify :name "wrong-relu")\n')
    with pytest.raises(ParityError) as err:
        optimize_with_report(relu_graph(), rules=[default_rule_dir(), rule], verify=True)
    message = str(err.value)
    assert message.startswith("parity failure: node 0 (Input) differs from original node 1 (Relu) on seed 0: ")
    assert message.split("built by rule(s): ")[1].split(", ")[0].startswith("wrong-relu (")  # the user's rule first


def test_outputs_are_compared_by_position_even_without_provenance() -> None:
    with pytest.raises(ParityError) as err:
        check_parity(relu_graph(), input_only_graph(), {})
    assert str(err.value).startswith("parity failure: node 0 (Input), output 0, differs from original node 1 (Relu) "
                                     "on seed 0: max abs error ")
    assert str(err.value).endswith("built by rule(s): none recorded")


def test_a_missing_output_is_a_parity_failure() -> None:
    g = relu_graph()
    g.set_outputs([1, 0])
    with pytest.raises(ParityError, match=r"^parity failure: the optimized graph has 1 outputs, the original 2$"):
        check_parity(g, relu_graph(), same_ids(g))


def test_each_value_is_compared_once_per_seed() -> None:
    g = relu_graph()
    report = check_parity(g, g.copy(), same_ids(g))
    assert report.seeds == (0, 1) and report.special == 3  # 9 special kinds, 4 of the 32 elements per round
    # the output was node 1 already; then seed 0 again in 3 rounds with IEEE special values in the drawn inputs
    assert [(n.node, n.original, n.seed, n.output, n.special) for n in report.nodes] == [
        (0, 0, 0, None, 0), (1, 1, 0, None, 0), (0, 0, 1, None, 0), (1, 1, 1, None, 0),
        (0, 0, 0, None, 1), (1, 1, 0, None, 1), (0, 0, 0, None, 2), (1, 1, 0, None, 2),
        (0, 0, 0, None, 3), (1, 1, 0, None, 3)]
    only_outputs = check_parity(g, g.copy(), {})
    assert [(n.node, n.original, n.seed, n.output, n.special) for n in only_outputs.nodes] == [
        (1, 1, 0, 0, 0), (1, 1, 1, 0, 0), (1, 1, 0, 0, 1), (1, 1, 0, 0, 2), (1, 1, 0, 0, 3)]
    assert all(n.tolerance_ratio == 0.0 and n.ok for n in report.nodes + only_outputs.nodes)


def test_blame_gets_the_optimized_node_id() -> None:
    asked: list[int] = []

    def blame(node: int) -> list[str]:
        asked.append(node)
        return ["rule-a", "rule-b"]

    with pytest.raises(ParityError) as err:
        check_parity(relu_graph(), input_only_graph(), {0: [0, 1]}, blame)
    assert asked == [0]
    assert str(err.value).endswith("; built by rule(s): rule-a, rule-b")
    with pytest.raises(ParityError, match=r"built by rule\(s\): none recorded$"):
        check_parity(relu_graph(), input_only_graph(), {0: [0, 1]}, lambda node: [])


def test_check_parity_leaves_both_graphs_unchanged() -> None:
    g, opt = relu_graph(), input_only_graph()
    before = (g.to_json(), opt.to_json())
    with pytest.raises(ParityError):
        check_parity(g, opt, {0: [0, 1]})
    assert (g.to_json(), opt.to_json()) == before


# --- structured data: masks, ids, targets; seeds ---------------------------------------------------------------------

DROP_MASK = ('(rewrite (Attention ?q ?k ?v ?m ?h ?kvh "custom" ?s) (Attention ?q ?k ?v (NoInput) ?h ?kvh "none" ?s)\n'
             '         :ruleset simplify :name "drop-mask")\n')


def test_a_rule_that_drops_the_attention_mask_is_caught_at_batch_1(tmp_path: Path) -> None:
    g = Graph()
    q, k, v = g.input("q", (1, 4, 8)), g.input("k", (1, 6, 8)), g.input("v", (1, 6, 8))
    g.set_outputs([g.attention(q, k, v, g.input("mask", (1, 6)), heads=2, mask="custom")])
    with pytest.raises(ParityError) as err:
        optimize_with_report(g, rules=[default_rule_dir(), rule_file(tmp_path, DROP_MASK)], verify=True)
    assert "(Attention) differs from original node 4 (Attention) on seed 0" in str(err.value)
    assert str(err.value).endswith(f"built by rule(s): drop-mask ({tmp_path / 'wrong.egg'}:2)")


@pytest.mark.parametrize(("batch", "keys"), [(1, 2), (1, 6), (5, 3), (3, 1)])
def test_key_masks_drop_some_keys_and_keep_one_in_every_row(batch: int, keys: int) -> None:
    g = Graph()
    q, k = g.input("q", (batch, 2, 8)), g.input("k", (batch, keys, 8))
    mask = g.input("mask", (batch, keys))
    g.set_outputs([g.attention(q, k, k, mask, heads=2, mask="custom")])
    for seed in (0, 1):
        m = evaluate(g, seed=seed, return_all=True)[mask]
        assert set(np.unique(m).tolist()) <= {0.0, 1.0}
        kept = m.sum(axis=1)
        assert np.all(kept >= 1)
        assert np.all(kept <= max(keys - 1, 1))  # a key is dropped in every row whenever one can be


def test_key_masks_change_with_the_seed() -> None:
    g = Graph()
    q, k = g.input("q", (4, 2, 8)), g.input("k", (4, 8, 8))
    mask = g.input("mask", (4, 8))
    g.set_outputs([g.attention(q, k, k, mask, heads=2, mask="custom")])
    assert not np.array_equal(evaluate(g, seed=0, return_all=True)[mask], evaluate(g, seed=1, return_all=True)[mask])


def test_ids_and_targets_cover_their_range() -> None:
    g = Graph()
    ids, few = g.input("ids", (2, 7), "i64"), g.input("few", (3,), "i32")
    targets = g.input("targets", (5,), "i64")
    table = g.param("table", (7, 3))
    g.set_outputs([g.embedding(table, ids), g.embedding(table, few),
                   g.cross_entropy_loss(g.input("logits", (5, 5)), targets)])
    values = evaluate(g, return_all=True)
    assert np.bincount(values[ids].ravel()).tolist() == [2] * 7  # every id, each as often
    assert len(set(values[few].tolist())) == 3 and set(values[few].tolist()) <= set(range(7))
    assert sorted(values[targets].tolist()) == [0, 1, 2, 3, 4]


def test_a_second_seed_only_for_graphs_of_bounded_size() -> None:
    g = Graph()
    x = g.input("x", (4, SECOND_SEED_MAX_ELEMENTS // 4))
    assert parity_seeds(g, 5) == (5, 6)
    g.set_outputs([g.relu(x)])
    assert parity_seeds(g, 5) == (5,)


def test_verify_checks_two_seeds() -> None:
    _, rep = optimize_with_report(examples.mlp(), verify=True)
    assert rep.parity.seeds == (0, 1) and rep.parity.special
    per_run = [sum(1 for n in rep.parity.nodes if (n.seed, n.special) == run) for run in ((0, False), (1, False),
                                                                                            (0, True))]
    assert per_run[0] == per_run[1] == per_run[2] > 0


# --- anchoring: each node judged on its own error --------------------------------------------------------------------


def _scaled_exp(scale: float) -> Graph:
    """exp(x * scale) in f32; ids: x 0, scale 1, product 2, exp 3."""
    g = Graph()
    x = g.input("x", (8, 8))
    g.set_outputs([g.exp(g.mul(x, g.scalar(scale)))])
    return g


def test_an_in_tolerance_difference_is_judged_where_it_is_made_not_where_it_is_amplified() -> None:
    """The product differs by 0.9 of its tolerance; Exp amplifies it past the Exp's own tolerance.  Anchored,
    the Exp is computed from the original product and is exact; end to end the output is within its bound."""
    original, optimized = _scaled_exp(1.0), _scaled_exp(1.00009)
    old, new = evaluate(original, return_all=True), evaluate(optimized, return_all=True)
    rtol, atol = PARITY_TOLERANCE["f32"]
    assert np.max(np.abs(new[3] - old[3]) / (atol + rtol * np.abs(old[3]))) > 1.5  # un-anchored: a false alarm
    report = check_parity(original, optimized, {0: [0], 2: [2], 3: [3]})  # the scale is the optimization's own
    assert report.ok
    seed0 = [(n.op, n.output, n.end_to_end) for n in report.nodes if n.seed == 0 and not n.special]
    assert seed0 == [("Input", None, False), ("Mul", None, False), ("Exp", None, False), ("Exp", 0, True)]
    product, exp_anchored, exp_end_to_end = [n for n in report.nodes if n.seed == 0 and not n.special][1:]
    assert 0.5 < product.tolerance_ratio <= 0.9
    assert exp_anchored.max_abs == 0.0
    assert 0.1 < exp_end_to_end.tolerance_ratio < 1.0
    # an output without provenance is compared anchored too: computed from the original product
    report = check_parity(original, optimized, {0: [0], 2: [2]})
    assert [(n.op, n.output, n.max_abs, n.end_to_end) for n in report.nodes
            if n.seed == 0 and not n.special][2] == ("Exp", 0, 0.0, False)


def _scaled_chain(scale: float, length: int) -> Graph:
    """x multiplied by ``scale`` ``length`` times, in f32; ids: x 0, then (scalar, product) pairs."""
    g = Graph()
    v = g.input("x", (8, 8))
    for _ in range(length):
        v = g.mul(v, g.scalar(scale))
    g.set_outputs([v])
    return g


def test_in_tolerance_errors_that_compound_are_caught_end_to_end() -> None:
    """Each product is 5e-5 off (half its tolerance, so each passes anchored); 30 of them compound to 1.5e-3."""
    original, optimized = _scaled_chain(1.0, 30), _scaled_chain(1.00005, 30)
    products = {2 * k: [2 * k] for k in range(1, 31)}
    with pytest.raises(ParityError) as err:
        check_parity(original, optimized, {0: [0], **products}, lambda node: ["scale-by-1.00005"])
    message = str(err.value)
    assert message.startswith("parity failure: node 60 (Mul), output 0, end to end, differs from original node 60 "
                              "(Mul) on seed 0: max abs error ")
    assert "x its end-to-end tolerance (4 x (atol=1e-05 + rtol=0.0001 x the output's largest magnitude, plus its " \
           "rounding error): f32 precision); differing on the way: node(s) " + ", ".join(map(str, products)) in message
    assert message.endswith("built by rule(s): scale-by-1.00005")
    assert check_parity(original, _scaled_chain(1.00005, 3), {0: [0], 2: [2], 4: [4], 6: [6]}).ok  # 3 do not


def test_a_wrong_rule_deep_in_a_chain_is_caught_where_it_is_made(tmp_path: Path) -> None:
    """A sign flip (a Neg dropped) between legitimately fused bf16 nodes: caught at its own node, named."""
    g = Graph()
    x = g.input("x", (16, 16), "bf16")
    h = g.gelu(g.add(g.matmul(x, g.param("w", (16, 16), "bf16")), g.param("b", (16,), "bf16")))
    flipped = g.neg(g.tanh(g.mul(h, g.sigmoid(h))))
    out = g.exp(g.mul(flipped, g.scalar(0.5, "bf16")))
    g.set_outputs([g.relu(g.add(g.matmul(out, g.param("w2", (16, 16), "bf16")), g.param("b2", (16,), "bf16")))])
    rule = rule_file(tmp_path, '(rewrite (Neg (Tanh ?x)) (Tanh ?x) :ruleset simplify :name "drop-neg")\n')
    # wgpu materializes each op: the Tanh that stands for the Neg; cuda fuses the chain into one region
    for target, where in (("wgpu", rf"\(Tanh\) differs from original node {flipped} \(Neg\)"),
                          ("cuda", r"\(ElementwiseRegion\) differs from original node \d+ \(Exp\)")):
        assert optimize_with_report(g, target=target, verify=True)[1].parity.ok  # the shipped rules alone are fine
        with pytest.raises(ParityError, match=where + " on seed 0: max abs error ") as err:
            optimize_with_report(g, rules=[default_rule_dir(), rule], target=target, verify=True)
        assert str(err.value).split("built by rule(s): ")[1].split(", ")[0].startswith("drop-neg (")


# --- tolerances: the precision a value was computed in ---------------------------------------------------------------


def test_loosest_is_the_widest_float_tolerance() -> None:
    assert loosest(["f32", "bf16", "i64"]) == "bf16"
    assert loosest(["f16", "f32"]) == "f16"
    assert loosest(["i64", "bool"]) is None


def test_precision_is_the_loosest_along_the_ancestors() -> None:
    g = Graph()
    x, y, i = g.input("x", (4,), "bf16"), g.input("y", (4,), "f32"), g.input("i", (4,), "i64")
    up = g.cast(x, dtype="f32")
    total = g.add(up, y)
    flags = g.cast(g.greater(total, y), dtype="i64")
    plain = g.add(y, y)
    g.set_outputs([g.add(flags, g.neg(i)), plain])
    assert precisions(g) == {x: "bf16", y: "f32", i: None, up: "bf16", total: "bf16", total + 1: "bf16",
                             flags: "bf16", plain: "f32", plain + 1: None, plain + 2: "bf16"}


def test_a_cast_of_a_bf16_value_is_judged_with_the_bf16_tolerance() -> None:
    g = Graph()
    x, w, b = g.input("x", (16, 32), "bf16"), g.param("w", (32, 32), "bf16"), g.param("b", (32,), "bf16")
    out = g.cast(g.add(g.matmul(x, w), b), dtype="f32")
    g.set_outputs([out])
    og, rep = optimize_with_report(g, verify=True)
    assert [n.op for n in og.nodes] == ["Input", "Param", "Param", "FusedMatMulBiasAct", "Cast"]
    anchored, end_to_end = [n for n in rep.parity.nodes if n.original == out and n.seed == 0 and not n.special]
    assert (anchored.end_to_end, end_to_end.end_to_end, end_to_end.output) == (False, True, 0)
    assert anchored.max_abs == 0.0  # cast from the original's sum: exactly the original's cast
    assert (anchored.rtol, anchored.atol) == (end_to_end.rtol, end_to_end.atol) == PARITY_TOLERANCE["bf16"]
    assert end_to_end.max_abs > PARITY_TOLERANCE["f32"][1] * 100  # far outside the f32 tolerance, inside bf16's


def _near_zero(variant: str) -> tuple[Graph, dict[int, list[int]]]:
    """f16 x rounded through x + 64 (the original) or taken as is: values near 0 that decide a Where.

    ``variant``: "original"; "exact" (the decision on x itself); "wrong" (Less instead of Greater);
    "region" (the decision made inside an ElementwiseRegion); "region-wrong" (Less inside it).
    Returns the graph and its node ids -> the original's node ids of the same value.
    """
    g = Graph(variant)
    x = g.input("x", (64, 16), "f16")
    shift, zero = g.scalar(64.0, "f16"), g.scalar(0.0, "f16")
    shifted = g.add(x, shift)
    value = g.sub(shifted, shift) if variant == "original" else g.identity(x)
    big, small = g.add(x, g.scalar(10.0, "f16")), g.sub(x, g.scalar(10.0, "f16"))
    test = "Less" if variant.endswith("wrong") else "Greater"
    if variant.startswith("region"):
        chain = json.dumps([[test, {}, [0, 1]], ["Where", {}, [-1, 2, 3]]])
        picked = g.elementwise_region([value, zero, big, small], chain=chain)
    else:
        picked = g.where(g.add_node(test, [value, zero]), big, small)
    g.set_outputs([g.matmul(picked, g.param("w", (16, 16), "f16"))])
    # a region stands for the Where: the Greater it decides with is not in the graph, so later ids shift by one
    shift_from = picked if variant.startswith("region") else len(g)
    return g, {n.id: [n.id + (n.id >= shift_from)] for n in g.nodes}


def test_a_decision_may_flip_only_near_its_boundary() -> None:
    original, _ = _near_zero("original")
    exact, mapping = _near_zero("exact")
    greater = next(n.id for n in original.nodes if n.op == "Greater")
    values, flipped = evaluate(original, return_all=True), evaluate(exact, return_all=True)
    assert np.count_nonzero(values[greater] != flipped[greater]) >= 5  # flips for the check to forgive
    report = check_parity(original, exact, mapping)
    assert report.ok and {n.op for n in report.nodes} >= {"Greater", "Where", "MatMul"}
    wrong, mapping = _near_zero("wrong")
    with pytest.raises(ParityError) as err:
        check_parity(original, wrong, mapping)
    assert f"node {greater} (Less) differs from original node {greater} (Greater) on seed 0: exact bool values " \
           "differ beyond the decisions allowed to flip" in str(err.value)


def test_a_decision_inside_a_fused_kernel_excuses_what_depends_on_it() -> None:
    original, _ = _near_zero("original")
    region, mapping = _near_zero("region")
    report = check_parity(original, region, mapping)
    assert [(n.op, n.end_to_end) for n in report.nodes if n.seed == 0 and not n.special] == [
        *((op, False) for op in ("Input", "Scalar", "Scalar", "Add", "Identity", "Scalar", "Add", "Scalar", "Sub",
                                 "ElementwiseRegion", "Param", "MatMul")),
        ("MatMul", True)]  # x itself is not x + 64 - 64: the output is also compared end to end
    wrong, mapping = _near_zero("region-wrong")
    with pytest.raises(ParityError, match=r"\(ElementwiseRegion\) differs from original node \d+ \(Where\)"):
        check_parity(original, wrong, mapping)


def test_an_ill_conditioned_value_is_judged_with_its_own_rounding_error() -> None:
    """LayerNorm of 4 + silu(0.1 x) in f16 divides rounding differences by a small spread; the plain graph
    rounds sigmoid to f16 before the product, the fused Silu does not."""

    def build(fused: bool) -> Graph:
        g = Graph("fused" if fused else "plain")
        x = g.input("x", (64, 16), "f16")
        y = g.mul(x, g.scalar(0.1, "f16"))
        e = g.silu(y) if fused else g.mul(y, g.sigmoid(y))
        shifted = g.add(e, g.scalar(4.0, "f16"))
        g.set_outputs([g.layer_norm(shifted, g.param("g", (16,), "f16"), g.param("b", (16,), "f16"))])
        return g

    plain, fused = build(False), build(True)
    # fused: x, 0.1, y, silu, 4, add, g, b, ln; plain: x, 0.1, y, sigmoid, mul, 4, add, g, b, ln
    mapping = {0: [0], 1: [1], 2: [2], 3: [4], 4: [5], 5: [6], 6: [7], 7: [8], 8: [9]}
    old, new = evaluate(plain), evaluate(fused)
    rtol, atol = PARITY_TOLERANCE["f16"]
    assert np.any(np.abs(new[0] - old[0]) > atol + rtol * np.abs(old[0]))  # the dtype tolerance alone fails
    assert check_parity(plain, fused, mapping).ok


# --- the report's headline -------------------------------------------------------------------------------------------


def test_the_summary_says_when_every_value_is_equal() -> None:
    g = relu_graph()
    report = OptimizeReport("egglog", "", "cpu", parity=check_parity(g, g.copy(), same_ids(g)))
    assert "parity: ok on 10 comparisons (seeds 0, 1; IEEE special values on seed 0 in 3 rounds), all values equal" in \
        str(report).splitlines()


def test_the_summary_ranks_by_tolerance_not_by_relative_error() -> None:
    """x + y - (x + y) is exactly 0; reassociated it is a rounding error: tiny, but huge relative to 0."""
    original, reassociated = Graph(), Graph()
    for g in (original, reassociated):
        x, y = g.input("x", (8, 16)), g.input("y", (8, 16))
        total = g.add(x, y)
        minus = g.neg(total)
        g.set_outputs([g.add(total, minus) if g is original else g.add(x, g.add(y, minus))])
    report = check_parity(original, reassociated, {0: [0], 1: [1], 2: [2], 3: [3], 5: [4]})
    worst = report.worst
    assert (worst.node, worst.op, worst.original) == (5, "Add", 4)
    assert 0 < worst.max_abs < 1e-5
    assert worst.tolerance_ratio == pytest.approx(worst.max_abs / PARITY_TOLERANCE["f32"][1])  # the value is 0
    assert worst.max_abs / 1e-6 > 0.1  # what the old headline called the "relative error"
    line = next(ln for ln in str(OptimizeReport("egglog", "", "cpu", parity=report)).splitlines()
                if ln.startswith("parity"))
    assert [(n.node, n.seed) for n in report.nodes if n.end_to_end] == [(5, 0), (5, 1)]  # the sum was rounded
    special = sum(n.special for n in report.nodes)
    assert special == 5 and not any(n.end_to_end for n in report.nodes if n.special)  # judged anchored
    assert line == f"parity: ok on {12 + special} comparisons (seeds 0, 1; IEEE special values on seed 0), worst at " \
                   f"{worst.tolerance_ratio:.2g} of tolerance (node 5 Add)"


# --- no false alarms on random low-precision graphs ------------------------------------------------------------------

WIDTH = 16
LOW_STEPS = ("linear", "linear_gelu", "linear_silu", "cast_up", "cast_down", "layer_norm", "rms_norm", "rms_export",
             "greater_where", "less_cast", "cast_int", "residual", "softmax", "silu_export", "swiglu", "exp")


def build_low_precision(dt: str, plan: list[tuple[str, int, int]]) -> Graph:
    """Each step appends one pattern built from earlier values ([8, WIDTH], in ``dt`` or f32 after a cast up)."""
    g = Graph("low_precision")
    values = [g.input("x", (8, WIDTH), dt), g.input("y", (8, WIDTH), dt)]

    def param(shape: tuple[int, ...], of: str) -> int:
        return g.param(f"p{len(g)}", shape, of)

    for step, i, j in plan:
        a, b = values[i % len(values)], values[j % len(values)]
        da = g.node(a).dtype
        b = b if g.node(b).dtype == da else g.cast(b, dtype=da)
        if step.startswith("linear"):
            v = g.add(g.matmul(a, param((WIDTH, WIDTH), da)), param((WIDTH,), da))
            v = g.gelu(v) if step == "linear_gelu" else g.silu(v) if step == "linear_silu" else v
        elif step in ("cast_up", "cast_down"):
            v = g.cast(a, dtype="f32" if step == "cast_up" else dt)
        elif step == "layer_norm":
            v = g.layer_norm(a, param((WIDTH,), da), param((WIDTH,), da))
        elif step == "rms_norm":
            v = g.rms_norm(a, param((WIDTH,), da))
        elif step == "rms_export":
            mean_sq = g.reduce_mean(g.pow(a, g.scalar(2.0, da)), axes=(-1,), keepdims=True)
            v = g.mul(g.mul(a, g.rsqrt(g.add(mean_sq, g.scalar(1e-6, da)))), param((WIDTH,), da))
        elif step == "greater_where":
            v = g.where(g.greater(a, g.scalar(0.0, da)), a, g.mul(b, g.scalar(0.5, da)))
        elif step == "less_cast":
            v = g.cast(g.less(a, b), dtype=da)
        elif step == "cast_int":
            v = g.cast(g.cast(g.mul(a, g.scalar(3.0, da)), dtype="i32"), dtype=da)
        elif step == "residual":
            v = g.add(a, b)
        elif step == "softmax":
            v = g.softmax(a)
        elif step == "silu_export":
            v = g.mul(a, g.sigmoid(a))
        elif step == "swiglu":
            v = g.mul(g.silu(a), b)
        else:
            v = g.exp(g.mul(a, g.scalar(0.1, da)))
        values.append(v)
    g.set_outputs(values[-2:])
    return g


low_plans = st.lists(st.tuples(st.sampled_from(LOW_STEPS), st.integers(0, 50), st.integers(0, 50)),
                     min_size=1, max_size=10)


@pytest.mark.long
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(("bf16", "f16")), low_plans, st.sampled_from(("cpu", "cuda", "metal", "wgpu")))
def test_random_low_precision_graphs_pass_verification(dt: str, plan: list[tuple[str, int, int]], target: str) -> None:
    g = build_low_precision(dt, plan)
    _, rep = optimize_with_report(g, target=target, verify=True)
    assert rep.parity.ok and rep.parity.seeds == (0, 1)
    assert {n.output for n in rep.parity.nodes} <= {None, 0, 1}
    assert rep.parity.worst.tolerance_ratio <= 1.0


def layer_scaled_linear(gamma: np.ndarray) -> Graph:
    """gamma * (x @ W + b) with W, b and gamma stored: the layer-scale weight fold's form."""
    g = Graph("layer-scale")
    x, w, b, s = g.input("x", (2, 8)), g.param("w", (8, 4)), g.param("b", (4,)), g.param("gamma", (4,))
    g.set_outputs([g.mul(g.add(g.matmul(x, w), b), s)])
    rng = np.random.default_rng(0)
    g.weights.update(w=rng.standard_normal((8, 4)).astype(np.float32), b=rng.standard_normal(4).astype(np.float32),
                     gamma=gamma.astype(np.float32))
    return g


def test_a_weight_fold_is_checked_on_the_stored_weights() -> None:
    """A fold whose operands are all stored weights is checked on their values when optimizing, verify or not: the
    layer scale folds on finite weights, and one that is not exact on the stored values (an infinite gamma, where
    inf * (x @ W + b) is an infinity and x @ (W * inf) a sum of opposite infinities, NaN) is one error naming the
    node, the rule and the weights."""
    fine = layer_scaled_linear(np.array([0.5, -2.0, 1e-3, 3.0]))
    out, report = optimize_with_report(fine, engine="fallback")
    assert [n.op for n in out.nodes if n.op == "WeightScale"] == ["WeightScale"] * 2
    assert report.verification.weight_folds == 1 and not report.verification.checked
    assert report.verification.to_dict()["weight_folds"] == 1
    bad = layer_scaled_linear(np.array([0.5, np.inf, 1.0, 3.0]))
    for engine in ("egglog", "fallback"):
        with pytest.raises(WeightFoldError) as caught:
            optimize_with_report(bad, engine=engine)
        assert str(caught.value).startswith("weight fold: node ")
        assert "reads weights folded from the stored 'w', 'b', 'gamma' by rule(s) layer-scale-linear, " \
            in str(caught.value)
        assert "not within tolerance of the unfolded computation on their values: parity failure: " in str(caught.value)
        assert "differs from original node 6 (Mul) on seed 0" in str(caught.value)
