"""IEEE special values (-0.0, +-inf, NaN, subnormals, +-max) in the verifier, the soundness checker and the
shipped algebraic identities; soundness instances whose dims let an op's parameters matter."""

import math
from pathlib import Path

import numpy as np
import pytest

from rlx_egraph import Graph, evaluate
from rlx_egraph.engines.egglog.soundness import SOUND, UNSOUND, check
from rlx_egraph.ir.registry import REGISTRY, TensorType
from rlx_egraph.kernels.interpreter import random_value, special_rounds, special_values
from rlx_egraph.kernels.parity import ParityError
from rlx_egraph.optimize import optimize_with_report
from rlx_egraph.rules import RuleSet

ENGINES = ("egglog", "fallback")
ROOT = Path(__file__).resolve().parent.parent
PLUS_ZERO = '(rewrite (Add ?x (Scalar 0.0 ?dt)) ?x :ruleset simplify :name "add-plus-zero")'


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal element by element, NaN equal to NaN and the sign of a zero told apart."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.all(((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))))


# --- the draws ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2,), (4,), (3, 5), (64,)])
def test_the_special_rounds_put_every_kind_in_every_leaf(shape: tuple[int, ...]) -> None:
    g = Graph()
    x = g.node(g.input("x", shape))
    g.set_outputs([x.id])
    rounds = special_rounds([math.prod(shape)])
    assert rounds == {2: 9, 4: 9, 15: 5, 64: 2}[math.prod(shape)]
    seen = np.concatenate([random_value(g, x, 0, k).reshape(-1) for k in range(1, rounds + 1)])
    for kind in special_values("f32"):
        assert any(_same_bits(v, kind) for v in seen), kind
    ordinary = random_value(g, x, 0)
    assert np.all(np.isfinite(ordinary)) and not _same_bits(ordinary, random_value(g, x, 0, 1))


# --- the verifier --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_the_verifier_catches_a_rule_wrong_only_for_negative_zero(engine: str) -> None:
    g = Graph()
    x = g.input("x", (4,))  # four elements: one special value per round, -0.0 in one of nine rounds
    g.set_outputs([g.div(g.scalar(1.0), g.add(x, g.scalar(0.0)))])
    with pytest.raises(ParityError, match=r"IEEE special values .*: a zero of the other sign .*add-plus-zero"):
        optimize_with_report(g, rules=RuleSet.from_strings(PLUS_ZERO), verify=True, engine=engine)


def _identities() -> tuple[Graph, list[str]]:
    """Every shipped algebraic identity on one input x, each as an output."""
    g = Graph()
    x = g.input("x", (4, 9))
    outs = {
        "mul-one": g.mul(x, g.scalar(1.0)), "one-mul": g.mul(g.scalar(1.0), x),
        "div-one": g.div(x, g.scalar(1.0)), "sub-zero": g.sub(x, g.scalar(0.0)),
        "add-zero": g.add(x, g.scalar(-0.0)), "kept: x + 0.0": g.add(x, g.scalar(0.0)),
        "neg-neg": g.neg(g.neg(x)), "relu-relu": g.relu(g.relu(x)), "identity": g.identity(x),
        "max +0": g.max(x, g.scalar(0.0)), "max -0": g.max(g.scalar(-0.0), x),
        "min +0": g.min(g.scalar(0.0), x), "min -0": g.min(x, g.scalar(-0.0)),
        "transpose-transpose": g.transpose(g.transpose(x, perm=(1, 0)), perm=(1, 0)),
    }
    g.set_outputs(list(outs.values()))
    return g, list(outs)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_shipped_identities_keep_every_special_value_exact(engine: str) -> None:
    g, names = _identities()
    og, report = optimize_with_report(g, verify=True, engine=engine, regions=False)
    assert report.parity.ok and report.parity.special == 3  # 4 of 36 elements a round: 3 rounds for 9 kinds
    assert sum(report.matches_per_rule.get(r, 0) for r in ("mul-one", "div-one", "sub-zero", "add-zero", "neg-neg",
                                                           "relu-relu", "identity", "transpose-transpose")) >= 8
    assert og.node(og.outputs[names.index("kept: x + 0.0")]).op == "Add"
    x = np.resize(special_values("f32"), (4, 9))  # every kind in every column
    for name, want, got in zip(names, evaluate(g, {"x": x}), evaluate(og, {"x": x}), strict=True):
        assert _same_bits(got, want), name


def test_max_and_min_order_the_zeros_either_way_round() -> None:
    g = Graph()
    x, y = g.input("x", (4,)), g.input("y", (4,))
    g.set_outputs([g.max(x, y), g.max(y, x), g.min(x, y), g.min(y, x)])
    xs, ys = np.array([-0.0, 0.0, np.nan, 1.0], np.float32), np.array([0.0, -0.0, 1.0, np.nan], np.float32)
    big_xy, big_yx, small_xy, small_yx = evaluate(g, {"x": xs, "y": ys})
    assert _same_bits(big_xy, [0.0, 0.0, np.nan, np.nan]) and _same_bits(big_yx, big_xy)
    assert _same_bits(small_xy, [-0.0, -0.0, np.nan, np.nan]) and _same_bits(small_yx, small_xy)


# --- the soundness checker -----------------------------------------------------------------------------------------


def test_the_soundness_checker_finds_x_plus_zero_unsound() -> None:
    verdict = check(RuleSet.from_strings(PLUS_ZERO)).by_rule("add-plus-zero")
    assert verdict.status == UNSOUND
    assert "a zero of the other sign" in verdict.counterexample.problem
    assert "IEEE special values" in verdict.counterexample.problem


def test_the_shipped_algebra_is_sound_with_special_values() -> None:
    report = check(RuleSet.from_files(ROOT / "rules" / "algebra.egg"))
    assert report.unsound() == [] and {v.rule: v.status for v in report.verdicts}["add-zero"] == SOUND


ROPE_THETA_DOUBLED = """
(rewrite (CausalAttention (RoPE ?q ?theta) (RoPE ?k ?theta) ?v ?scale)
         (CausalAttentionRoPE ?q ?k ?v (* 2.0 ?theta) ?scale) :ruleset fuse :name "rope-theta-doubled")"""


def test_a_rope_rule_with_the_wrong_theta_is_unsound() -> None:
    verdict = check(RuleSet.from_strings(ROPE_THETA_DOUBLED)).by_rule("rope-theta-doubled")
    assert verdict.status == UNSOUND and "CausalAttentionRoPE" in verdict.counterexample.problem


@pytest.mark.parametrize(("op", "attrs", "shapes", "why"), [
    ("RoPE", {"theta": 10.0}, [(1, 2, 5, 2)], "theta matters from D = 4 and S = 2"),
    ("RoPE", {"theta": 10.0}, [(1, 2, 1, 8)], "theta matters from D = 4 and S = 2"),
    ("RoPE", {"theta": 10.0}, [(1, 2, 5, 8)], None),
    ("CausalAttention", {"scale": 0.5}, [(1, 1, 4, 8)] * 3, "one head, key or query"),
    ("CausalAttention", {"scale": 0.5}, [(1, 2, 4, 8)] * 3, None),
    ("Softmax", {"axis": -1}, [(3, 1)], "one element along axis -1"),
    ("LayerNorm", {"axis": -1, "eps": 1e-5}, [(3, 1), (1,), (1,)], "one element normalized from axis -1"),
    ("Transpose", {"perm": (1, 0, 2)}, [(1, 1, 4)], "moves no element"),
    ("Transpose", {"perm": (1, 0, 2)}, [(2, 1, 4)], None),
])
def test_each_op_declares_the_dims_that_leave_its_parameters_without_effect(op, attrs, shapes, why) -> None:
    spec = REGISTRY[op]
    ins = [TensorType(s, "f32") for s in shapes]
    canonical, _ = spec.resolve(attrs, ins)
    said = spec.degenerate(canonical, ins)
    assert (said is None) if why is None else (why in said)
