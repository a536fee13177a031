"""Property tests: random graphs optimize to numerically equal, never costlier graphs."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_egraph import optimize_with_report
from rlx_egraph.examples import random_graph, random_plan

plans = st.randoms(use_true_random=False).map(random_plan)  # drawn as the agreement bench draws them


@pytest.mark.long
@pytest.mark.parametrize("engine", ["egglog", "fallback"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans, st.sampled_from(("cpu", "metal", "wgpu")))
def test_random_graphs_keep_parity_and_never_cost_more(engine, plan, target):
    g = random_graph(plan)
    before = g.to_json()
    og, rep = optimize_with_report(g, target=target, verify=True, engine=engine)
    assert rep.engine == engine
    assert rep.parity.ok and rep.parity.special >= 1  # rounds with -0.0, +-inf, NaN, subnormals, +-max in the leaves
    assert rep.profile_after.ns <= rep.profile_before.ns + 1e-6
    assert g.to_json() == before
    assert len(og.outputs) == len(g.outputs)
    assert [og.node(o).shape for o in og.outputs] == [g.node(o).shape for o in g.outputs]
