"""An ElementwiseRegion computes exactly what its steps compute, in each step's dtype.

Every test compares a region with the unfused steps bit for bit (same dtype,
shape and bytes, so NaNs compare equal) on the same data.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_egraph import Graph, GraphError, evaluate
from rlx_egraph.cost import get_target
from rlx_egraph.engines.regions import apply_regions
from rlx_egraph.ir.decompose import decompose
from rlx_egraph.ir.dtypes import to_storage

CUDA = get_target("cuda")
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)
Leaves = dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype), in region-input order


def assert_bit_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes(), f"region {got!r}\nsteps  {want!r}"


def region_and_steps(leaves: Leaves, steps: list[list[Any]]) -> tuple[Graph, Graph]:
    """One ElementwiseRegion over ``leaves`` and the same steps as separate nodes."""
    fused, unfused = Graph("region"), Graph("steps")
    ids = [fused.input(name, shape, dt) for name, (shape, dt) in leaves.items()]
    fused.set_outputs([fused.elementwise_region(ids, chain=json.dumps(steps))])
    ids = [unfused.input(name, shape, dt) for name, (shape, dt) in leaves.items()]
    values: list[int] = []
    for op, attrs, operands in steps:
        values.append(unfused.add_node(op, [ids[i] if i >= 0 else values[-i - 1] for i in operands], **attrs))
    unfused.set_outputs([values[-1]])
    return fused, unfused


def run_region(leaves: Leaves, steps: list[list[Any]], feeds: dict[str, Any]) -> np.ndarray:
    """The region's value, after checking it bit for bit against the unfused steps."""
    fused, unfused = region_and_steps(leaves, steps)
    feeds = {name: np.asarray(v) for name, v in feeds.items()}
    (got,), (want,) = evaluate(fused, feeds), evaluate(unfused, feeds)
    assert_bit_equal(got, want)
    return got


def wide_values(shape: tuple[int, ...], dt: str, rng: np.random.Generator) -> np.ndarray:
    """Data that reaches the edges of ``dt``: magnitudes 1e-3..1e5, zeros, infinities, NaNs."""
    if dt in ("i64", "i32"):
        return to_storage(rng.integers(-9, 10, shape), dt)
    if dt == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    values = np.asarray(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 6, shape))
    special = np.asarray(rng.random(shape) < 0.1)
    values[special] = rng.choice([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan], size=int(special.sum()))
    with np.errstate(over="ignore"):  # 1e5 overflows f16 on purpose
        return to_storage(values, dt)


# --- the reported cases -------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ["i64", "i32"])
def test_integer_div_truncates_before_the_next_step(dt):
    leaves = {"x": ((4,), dt), "y": ((4,), dt)}
    got = run_region(leaves, [["Div", {}, [0, 1]], ["Mul", {}, [-1, 1]]],
                     {"x": np.array([7, -7, 9, 1]), "y": np.array([2, 2, 4, 3])})
    np.testing.assert_array_equal(got, [6, -6, 8, 0])


@pytest.mark.parametrize("dt", ["i64", "i32"])
def test_integer_div_by_zero_is_stored_before_the_next_step(dt):
    leaves = {"x": ((4,), dt), "y": ((4,), dt), "one": ((4,), dt)}
    run_region(leaves, [["Div", {}, [0, 1]], ["Add", {}, [-1, 2]]],
               {"x": np.array([7, -7, 0, 5]), "y": np.array([0, 0, 0, 1]), "one": np.ones(4)})


def test_f16_sum_is_rounded_before_equal():
    rng = np.random.default_rng(0)
    x, y = to_storage(rng.standard_normal(1000), "f16"), to_storage(rng.standard_normal(1000), "f16")
    z = to_storage(x.astype(np.float32) + y.astype(np.float32), "f16")
    leaves = {"x": ((1000,), "f16"), "y": ((1000,), "f16"), "z": ((1000,), "f16")}
    got = run_region(leaves, [["Add", {}, [0, 1]], ["Equal", {}, [-1, 2]]], {"x": x, "y": y, "z": z})
    assert int(got.sum()) == 1000


def test_f16_exp_overflows_before_the_next_step():
    leaves = {"x": ((1,), "f16"), "c": ((), "f16")}
    got = run_region(leaves, [["Exp", {}, [0]], ["Mul", {}, [-1, 1]]], {"x": [12.0], "c": 1e-3})
    assert got.tolist() == [np.inf]


# --- every dtype, Cast and Where steps, comparisons ------------------------------------------------

# Operands are absolute: i >= 0 is region input i, -k the value of step k-1.
ARITH_CHAIN = [["Mul", {}, [0, 1]], ["Sub", {}, [-1, 0]], ["Div", {}, [-2, 1]], ["Max", {}, [-3, -2]],
               ["Neg", {}, [-4]], ["Add", {}, [-5, 1]], ["Abs", {}, [-6]], ["Min", {}, [-7, 0]]]
FLOAT_CHAIN = [*ARITH_CHAIN, ["Tanh", {}, [-8]], ["Pow", {}, [-9, 1]], ["Exp", {}, [-10]], ["Sqrt", {}, [-11]],
               ["Gelu", {"approximate": "tanh"}, [-12]], ["Rsqrt", {}, [-13]]]
BOOL_CHAIN = [["Equal", {}, [0, 1]], ["Max", {}, [-1, 0]], ["Where", {}, [-2, 1, 0]], ["Less", {}, [-3, 1]],
              ["Min", {}, [-4, 0]], ["Greater", {}, [-5, 1]]]
CHAINS = {"f32": FLOAT_CHAIN, "f16": FLOAT_CHAIN, "bf16": FLOAT_CHAIN, "i64": ARITH_CHAIN, "i32": ARITH_CHAIN,
          "bool": BOOL_CHAIN}

@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dt", list(CHAINS))
def test_chains_of_every_dtype_match_their_steps(dt, seed):
    rng = np.random.default_rng(seed)
    leaves = {"x": ((6, 50), dt), "y": ((50,), dt)}
    run_region(leaves, CHAINS[dt], {name: wide_values(shape, d, rng) for name, (shape, d) in leaves.items()})


@pytest.mark.parametrize("seed", range(3))
def test_cast_and_where_steps_convert_between_dtypes(seed):
    rng = np.random.default_rng(seed)
    leaves = {"x": ((4, 64), "f32"), "h": ((4, 64), "f16"), "i": ((64,), "i32"), "a": ((4, 64), "bf16")}
    steps = [["Cast", {"dtype": "f16"}, [0]], ["Mul", {}, [-1, 1]], ["Cast", {"dtype": "bf16"}, [-2]],
             ["Exp", {}, [-3]], ["Greater", {}, [-4, 3]], ["Where", {}, [-5, -4, 3]],
             ["Cast", {"dtype": "i32"}, [-6]], ["Add", {}, [-7, 2]], ["Cast", {"dtype": "bool"}, [-8]],
             ["Where", {}, [-9, 0, 0]], ["Cast", {"dtype": "i64"}, [-10]]]
    got = run_region(leaves, steps, {name: wide_values(shape, d, rng) for name, (shape, d) in leaves.items()})
    assert got.dtype == np.int64


# --- the chain records its inputs' dtypes ---------------------------------------------------------


def test_chain_records_input_dtypes_and_canonical_attributes():
    fused, _ = region_and_steps({"x": ((3,), "f16"), "n": ((3,), "i32")},
                                [["Gelu", {}, [0]], ["Cast", {"dtype": "i32"}, [-1]], ["Add", {}, [-2, 1]]])
    chain = fused.node(fused.outputs[0]).attrs["chain"]
    assert json.loads(chain) == {"inputs": ["f16", "i32"], "steps": [
        ["Gelu", {"approximate": "none"}, [0]], ["Cast", {"dtype": "i32"}, [-1]], ["Add", {}, [-2, 1]]]}
    assert Graph.from_json(fused.to_json()) == fused


@pytest.mark.parametrize("chain, message", [
    ({"inputs": ["f32"], "steps": [["Neg", {}, [0]]]},
     "node 1 (ElementwiseRegion): chain inputs are ['f32'], the region's inputs are ['f16']"),
    ([["Add", {}, [0]]], "node 1 (ElementwiseRegion): chain step 0 (Add): takes 2 input(s) (a, b), got 1"),
    ([["Neg", {}, [0]], ["Neg", {}, [-2]]], "node 1 (ElementwiseRegion): chain step 1 refers to a missing operand"),
    ([["Neg", {}]], "node 1 (ElementwiseRegion): chain step 0 is not [op, attrs, operands]"),
    ({"steps": []}, "node 1 (ElementwiseRegion): chain must be {\"inputs\""),
])
def test_bad_chains_name_the_problem(chain, message):
    g = Graph()
    x = g.input("x", (3,), "f16")
    with pytest.raises(GraphError) as err:
        g.elementwise_region([x], chain=json.dumps(chain))
    assert message in str(err.value)


# --- apply_regions on random mixed-dtype chains, and its inverse (decomposing the regions) ---------------------

FLOAT_UNARY = ["Relu", "Silu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Rsqrt", "Recip", "Erf", "Gelu"]
SIGNED_UNARY = ["Neg", "Abs", "Identity"]
ARITH = ["Div", "Mul", "Add", "Sub", "Max", "Min"]
COMPARE = ["Greater", "Less", "Equal"]
DTYPES = ["i64", "f16", "bf16", "i32", "f32", "bool"]
SCALARS = {"f32": [0.0, 1e-3, -2.5, 12.0], "f16": [0.0, 1e-3, 12.0, 65504.0], "bf16": [0.0, 1e-3, -2.5, 3e38],
           "i64": [0, 2, -3, 7], "i32": [0, 2, -3, 7], "bool": [0, 1]}


@st.composite
def mixed_dtype_chain(draw: st.DrawFn) -> Graph:
    """A chain of 2..9 elementwise steps, each reading the previous value once, over mixed dtypes.

    Other operands are the value itself, fresh inputs (full or trailing shape) or scalars; some
    intermediate values are also graph outputs, which splits the chain into several regions.
    """
    shape = draw(st.sampled_from([(3, 4), (2, 3, 5), (7,)]))
    g = Graph("mixed")

    def leaf(dt: str) -> int:
        kind = draw(st.sampled_from(["full", "trailing", "scalar"]))
        if kind == "scalar":
            return g.scalar(draw(st.sampled_from(SCALARS[dt])), dt)
        return g.input(f"x{len(g)}", shape if kind == "full" else shape[1:], dt)

    def partner(value: int) -> int:
        """A second operand of ``value``'s dtype: ``value`` itself or a fresh leaf."""
        return value if draw(st.booleans()) else leaf(g.node(value).dtype)

    current = g.input("x0", shape, draw(st.sampled_from(DTYPES)))
    outputs = []
    for k in range(draw(st.integers(2, 9))):
        dt = g.node(current).dtype
        kinds = (["arith", "unary"] if dt != "bool" else ["logic"]) + ["cast", "compare", "where"]
        kind = draw(st.sampled_from(kinds))
        if kind == "cast":
            current = g.cast(current, dtype=draw(st.sampled_from(DTYPES)))
        elif kind == "unary":
            op = draw(st.sampled_from(SIGNED_UNARY + (FLOAT_UNARY if dt in ("f32", "f16", "bf16") else [])))
            current = g.add_node(op, [current])
        elif kind in ("arith", "compare", "logic"):
            ops = {"arith": ARITH + (["Pow"] if dt in ("f32", "f16", "bf16") else []), "compare": COMPARE,
                   "logic": ["Max", "Min", "Equal"]}[kind]
            current = g.add_node(draw(st.sampled_from(ops)), draw(st.permutations([current, partner(current)])))
        elif dt == "bool":  # where, the current value as the condition
            branch = draw(st.sampled_from(DTYPES))
            current = g.where(current, leaf(branch), leaf(branch))
        else:  # where, the current value as a branch
            current = g.where(leaf("bool"), *draw(st.permutations([current, partner(current)])))
        if k and draw(st.integers(0, 3)) == 0:
            outputs.append(current)
    g.set_outputs([*outputs, current])
    return g


def assert_same_outputs(got: Graph, want: Graph, seeds: range = range(3)) -> None:
    """Bit-equal outputs on several seeds of wide-range data."""
    for seed in seeds:
        rng = np.random.default_rng(seed)
        feeds = {n.name: wide_values(n.shape, n.dtype, rng) for n in want.inputs}
        for g_out, w_out in zip(evaluate(got, feeds), evaluate(want, feeds), strict=True):
            assert_bit_equal(g_out, w_out)


@SETTINGS
@given(mixed_dtype_chain())
def test_regions_of_random_mixed_dtype_chains_are_bit_identical(g):
    fused, same_value, applied = apply_regions(g, CUDA)
    assert applied and fused.op_counts()["ElementwiseRegion"] == len(applied)
    assert [same_value[o] for o in fused.outputs] == list(g.outputs)
    assert_same_outputs(fused, g)
    expanded = decompose(fused, {"ElementwiseRegion"})
    assert expanded.op_counts() == g.op_counts()
    assert_same_outputs(expanded, g)


def test_decomposing_a_region_keeps_other_ids_and_gives_its_steps_fresh_ids():
    g = Graph()
    a, b = g.input("a", (8, 16), "f16"), g.input("b", (16,), "f16")
    region = g.elementwise_region([a, b], chain=json.dumps([["Add", {}, [0, 1]], ["Exp", {}, [-1]],
                                                           ["Cast", {"dtype": "f32"}, [-2]]]))
    after = g.relu(region)
    g.set_outputs([after, region])
    before = g.to_dict()
    expanded = decompose(g, {"ElementwiseRegion"})
    assert g.to_dict() == before
    assert [(n.id, n.op, n.inputs, n.dtype) for n in expanded.nodes] == [
        (0, "Input", (), "f16"), (1, "Input", (), "f16"), (4, "Add", (0, 1), "f16"), (5, "Exp", (4,), "f16"),
        (6, "Cast", (5,), "f32"), (3, "Relu", (6,), "f32")]
    assert expanded.outputs == (3, 6)
    assert_same_outputs(expanded, g)


def test_decomposing_inverts_apply_on_a_chain():
    g = Graph()
    a, b, c = g.input("a", (8, 16), "bf16"), g.input("b", (8, 16), "bf16"), g.input("c", (16,), "bf16")
    g.set_outputs([g.relu(g.mul(g.add(a, b), c))])
    fused, same_value, _ = apply_regions(g, CUDA)
    assert [(n.id, n.op) for n in fused.nodes] == [(0, "Input"), (1, "Input"), (2, "Input"), (5, "ElementwiseRegion")]
    assert same_value == {0: 0, 1: 1, 2: 2, 5: 5}  # every node keeps its id; the region takes its tail's
    expanded = decompose(fused, {"ElementwiseRegion"})
    assert [(n.id, n.op, n.inputs) for n in expanded.nodes] == [
        (0, "Input", ()), (1, "Input", ()), (2, "Input", ()), (6, "Add", (0, 1)), (7, "Mul", (6, 2)),
        (8, "Relu", (7,))]
    assert_same_outputs(fused, g)
    assert_same_outputs(expanded, g)


@pytest.mark.parametrize("target", ["cuda", "wgpu"])
def test_apply_then_decompose_of_a_graph_without_regions_is_identity(target):
    g = Graph()
    x = g.input("x", (4, 8))
    s = g.softmax(g.relu(x))  # one elementwise op, then a reduction: no chain
    y = g.add(g.tanh(s), s) if target == "wgpu" else g.matmul(s, g.param("w", (8, 8)))  # wgpu: no region kernels
    g.set_outputs([y])
    fused, _, applied = apply_regions(g, get_target(target))
    assert applied == []
    assert fused == g
    assert decompose(fused, {"ElementwiseRegion"}) == g


def test_bf16_scalar_keeps_rank_zero_in_and_out_of_a_region():
    # round_bf16 went through np.ascontiguousarray, which turns rank 0 into [1]:
    # any op reading a bf16 scalar then failed to broadcast back to shape ().
    got = run_region({"s": ((), "bf16"), "x": ((3,), "bf16")}, [["Neg", {}, [0]], ["Mul", {}, [-1, 1]]],
                     {"s": 1.5, "x": [1.0, -2.0, 3.0]})
    np.testing.assert_array_equal(got, [-1.5, 3.0, -4.5])
    g = Graph()
    s = g.scalar(1.00390625, "bf16")  # halfway between two bf16 values: rounds to even, 1.0
    g.set_outputs([s, g.neg(s)])
    assert [(v.shape, float(v)) for v in evaluate(g)] == [((), 1.0), ((), -1.0)]


@pytest.mark.parametrize("engine", ["egglog", "fallback"])
def test_a_region_ending_at_a_rule_made_node_is_one_fusion_named_by_its_op(engine):
    """A region whose tail a rule built (``Silu`` from ``e * sigmoid(e)``) replaces that node: the report lists the
    region once, as an ElementwiseRegion carrying the rule, not also the Silu it no longer is."""
    from rlx_egraph import optimize_with_report

    g = Graph()
    e = g.exp(g.input("x", (4, 8)))
    g.set_outputs([g.mul(e, g.sigmoid(e))])
    out, report = optimize_with_report(g, "cuda", engine=engine)
    ops = {n.id: n.op for n in out.nodes}
    assert sorted(ops.values()) == ["ElementwiseRegion", "Input"]
    assert [(ops[f.node], f.op) for f in report.fusions] == [("ElementwiseRegion", "ElementwiseRegion")]
    (region,) = report.fusions
    assert "silu-mul-sigmoid" in region.rules and "pass:elementwise-region" in region.rules
