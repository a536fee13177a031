"""Property tests: random graphs optimize to numerically equal, never costlier graphs."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_egraph import Graph, optimize_with_report

WIDTH = 8

# Each step appends one pattern built from earlier values (all [4, WIDTH] f32).
STEPS = ("linear", "linear_gelu", "linear_silu", "silu_export", "residual", "layer_norm", "rms_export",
         "neg_neg", "mul_one", "swiglu", "shared_pair", "relu", "exp")


def build(plan: list[tuple[str, int, int]]) -> Graph:
    g = Graph("random")
    values = [g.input("x", (4, WIDTH)), g.input("y", (4, WIDTH))]
    n_params = 0

    def param(shape: tuple[int, ...]) -> int:
        nonlocal n_params
        n_params += 1
        return g.param(f"p{n_params}", shape)

    for step, i, j in plan:
        a, b = values[i % len(values)], values[j % len(values)]
        if step.startswith("linear"):
            v = g.add(g.matmul(a, param((WIDTH, WIDTH))), param((WIDTH,)))
            v = g.gelu(v) if step == "linear_gelu" else g.silu(v) if step == "linear_silu" else v
        elif step == "silu_export":
            v = g.mul(a, g.sigmoid(a))
        elif step == "residual":
            v = g.add(a, b)
        elif step == "layer_norm":
            v = g.layer_norm(a, param((WIDTH,)), param((WIDTH,)))
        elif step == "rms_export":
            r = g.rsqrt(g.add(g.reduce_mean(g.pow(a, g.scalar(2.0)), axes=(-1,), keepdims=True), g.scalar(1e-6)))
            v = g.mul(g.mul(a, r), param((WIDTH,)))
        elif step == "neg_neg":
            v = g.neg(g.neg(a))
        elif step == "mul_one":
            v = g.mul(a, g.scalar(1.0))
        elif step == "swiglu":
            v = g.mul(g.silu(a), b)
        elif step == "shared_pair":
            v = g.add(g.matmul(a, param((WIDTH, WIDTH))), g.matmul(a, param((WIDTH, WIDTH))))
        elif step == "relu":
            v = g.relu(a)
        else:
            v = g.exp(g.mul(a, g.scalar(0.1)))
        values.append(v)
    g.set_outputs(values[-2:])
    return g


plans = st.lists(st.tuples(st.sampled_from(STEPS), st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=10)


@pytest.mark.parametrize("engine", ["egglog", "fallback"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans, st.sampled_from(("cpu", "metal", "wgpu")))
def test_random_graphs_keep_parity_and_never_cost_more(engine, plan, target):
    g = build(plan)
    before = g.to_json()
    og, rep = optimize_with_report(g, target=target, verify=True, engine=engine)
    assert rep.engine == engine
    assert rep.parity.ok
    assert rep.profile_after.ns <= rep.profile_before.ns + 1e-6
    assert g.to_json() == before
    assert len(og.outputs) == len(g.outputs)
    assert [og.node(o).shape for o in og.outputs] == [g.node(o).shape for o in g.outputs]
