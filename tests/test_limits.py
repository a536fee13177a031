"""Limits bound the whole run; shared-input matmuls of any k merge with quadratic growth."""

import re
import time
from functools import partial
from pathlib import Path

import pytest
from egglog import bindings as eb

from benchmarks.limits import assoc_comm_rules, limit_row, shared_input, shared_row, sum_of_products
from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.cost import get_target, profile
from rlx_egraph.engines.budget import Deadline, DeadlineExceeded
from rlx_egraph.engines.egglog import extract
from rlx_egraph.engines.egglog.decode import decode
from rlx_egraph.engines.egglog.encode import encode_graph
from rlx_egraph.engines.egglog.rules import STAGES, default_rule_dir, load_rules
from rlx_egraph.engines.egglog.saturate import SaturationLimits, saturate
from rlx_egraph.engines.egglog.schema import schema_text
from rlx_egraph.engines.egglog.view import EGraphView, build_view

# these measure the egglog engine itself (engine="auto" would fall back when a limit stops it)
egglog_engine = partial(optimize_with_report, engine="egglog")


def ops(g: Graph) -> dict[str, int]:
    return {k: v for k, v in sorted(g.op_counts().items()) if k not in ("Input", "Param")}


def saturated(g: Graph) -> tuple[eb.EGraph, dict]:
    """The e-graph of ``g`` saturated with the shipped rules, and the encoding's constants."""
    rules = load_rules()
    encoding = encode_graph(g)
    egraph = eb.EGraph()
    egraph.run_program(*egraph.parse_program(schema_text()))
    egraph.run_program(*egraph.parse_program("\n".join(f"(ruleset {s})" for s in STAGES)))
    egraph.run_program(*rules.commands())
    egraph.run_program(*egraph.parse_program(encoding.text))
    saturate(egraph, rules, SaturationLimits())
    return egraph, encoding.constants


def saturated_view(g: Graph) -> EGraphView:
    egraph, constants = saturated(g)
    return build_view(egraph, g, constants, load_rules())


# --- limits on rules that never saturate (associativity and commutativity) -----------------


def test_max_seconds_bounds_the_whole_run_and_names_the_limit(tmp_path: Path):
    # Under associativity and commutativity this graph never saturates: the deadline must bound saturation, the
    # view and extraction together.
    start = time.perf_counter()
    og, rep = egglog_engine(sum_of_products(32), rules=assoc_comm_rules(tmp_path), max_seconds=5, verify=True)
    assert time.perf_counter() - start < 10
    assert rep.parity.ok and len(og.outputs) == 1
    assert rep.stop_reason.startswith("time limit: ") and "max_seconds=5 " in rep.stop_reason


def test_max_enodes_holds_after_every_iteration(tmp_path: Path):
    # Before: checked every 4 iterations, a limit of 20,000 ended at 54,198 e-nodes here.
    og, rep = egglog_engine(sum_of_products(32), rules=assoc_comm_rules(tmp_path), max_enodes=20_000,
                                   verify=True)
    assert max(it.enodes for it in rep.iterations) <= 20_000
    assert rep.enodes <= 20_000
    assert rep.stop_reason == ("node limit: rule add-comm has 6,722 matches, which could add 13,444 e-nodes, "
                               "more than the 13,182 that max_enodes=20,000 leaves (stage simplify, 6,818 e-nodes)")
    assert rep.parity.ok
    again, rep2 = egglog_engine(sum_of_products(32), rules=assoc_comm_rules(tmp_path), max_enodes=20_000)
    assert again == og and rep2.stop_reason == rep.stop_reason  # node limits are deterministic


def test_near_the_limit_iterations_run_bounded_by_the_room(tmp_path: Path):
    _, rep = egglog_engine(sum_of_products(16), rules=assoc_comm_rules(tmp_path), max_enodes=3_000)
    # The 47-node graph; the simplify rules (with the loader's operand orders: 2 of add-comm, 8 of add-assoc)
    # and the shipped simplify rules build at most 28 e-nodes per match in all.
    assert [it.enodes for it in rep.iterations] == [134, 564, 564, 938, 938, 938]
    assert [it.match_limit for it in rep.iterations] == [
        (3_000 - 47) // 28,  # a stage starts bounded
        None,  # plain while the predicted growth fits
        (3_000 - 564) // 28,  # then bounded: the rules over the limit wait ...
        516,  # ... until only they are left: the largest limit whose e-nodes fit the room
        (3_000 - 938) // 28,
        890,
    ]
    assert rep.stop_reason == ("node limit: rule add-assoc has 4,936 matches, which could add 39,488 e-nodes, more "
                               "than the 2,062 that max_enodes=3,000 leaves (stage simplify, 938 e-nodes)")


def test_rules_over_the_match_limit_wait_and_still_fire():
    g = examples.llama(layers=1)
    og, rep = egglog_engine(g, match_limit=1)
    assert rep.stop_reason == "saturated"
    assert ops(og) == ops(egglog_engine(g)[0])


def test_no_time_at_all_returns_a_copy_of_the_input(tmp_path: Path):
    g = sum_of_products(4)
    og, rep = egglog_engine(g, rules=assoc_comm_rules(tmp_path), max_seconds=0, verify=True)
    assert og == g and og is not g
    assert rep.fusions == [] and rep.parity.ok
    assert re.fullmatch(r"time limit: max_seconds=0 leaves no time for more saturation after \d+\.\d s "
                        r"\(stage simplify; 11 e-nodes to extract\); building the e-graph view did not "
                        r"finish within max_seconds=0, so the input graph is returned unchanged", rep.stop_reason)


def test_view_building_stops_at_the_deadline():
    g = examples.llama(layers=1)
    egraph, constants = saturated(g)
    with pytest.raises(DeadlineExceeded, match=r"^building the e-graph view did not finish within max_seconds=0$"):
        build_view(egraph, g, constants, load_rules(), deadline=Deadline(0))


def test_greedy_at_the_deadline_keeps_the_input_graph():
    g = examples.llama(layers=1)
    view = saturated_view(g)
    roots = [view.class_of_node[o] for o in g.outputs]
    position = {n.id: k for k, n in enumerate(g.nodes)}
    cpu = get_target("cpu")
    stopped = extract.greedy(view, roots, cpu, position, deadline=Deadline(0))
    assert stopped.moves == 0
    assert stopped.notes == ["extraction stopped at the time limit with the best graph found so far"]
    unchanged = decode(view, stopped.choice, g).graph
    assert ops(unchanged) == ops(g) | {"Scalar": 2}  # its 6 scalars hold 2 values: equal constants share a class
    assert profile(unchanged, cpu).ns == profile(g, cpu).ns
    free = extract.greedy(view, roots, cpu, position)
    assert free.moves > 0 and free.notes == [] and free.cost_ns < stopped.cost_ns


def test_exact_without_time_raises_and_optimize_falls_back_to_greedy(monkeypatch: pytest.MonkeyPatch):
    g = examples.llama(layers=1)
    view = saturated_view(g)
    with pytest.raises(DeadlineExceeded, match=r"^exact extraction did not finish within max_seconds=0$"):
        extract.exact(view, [view.class_of_node[o] for o in g.outputs], get_target("cpu"), deadline=Deadline(0))

    def out_of_time(*args, **kwargs):
        raise DeadlineExceeded("exact extraction found no solution within max_seconds=1")

    monkeypatch.setattr(extract, "exact", out_of_time)
    og, rep = egglog_engine(g, extraction="exact")
    assert rep.extraction == "greedy"
    assert rep.stop_reason == ("time limit: exact extraction found no solution within max_seconds=1; "
                               "greedy extraction was used")
    assert og == egglog_engine(g)[0]


# --- shared-input matmuls: any k, quadratic growth ------------------------------------------


@pytest.mark.parametrize("k", [4, 6])
def test_k_matmuls_of_one_input_become_one_wide_matmul(k: int):
    og, rep = egglog_engine(shared_input(k), verify=True, exact_gap=True)
    assert ops(og) == {"ConcatParams": 1, "MatMul": 1, "Narrow": k}
    wide = og.node(og.node(og.outputs[0]).inputs[0])
    cat = og.node(wide.inputs[1])
    assert cat.op == "ConcatParams" and cat.shape == (64, 64 * k)
    assert [og.node(i).name for i in cat.inputs] == [f"w{i}" for i in range(k)]
    assert [og.node(o).attrs["start"] for o in og.outputs] == [64 * i for i in range(k)]
    assert rep.parity.ok
    assert rep.extracted_ns == pytest.approx(rep.exact_ns)  # the cheapest choice among all the groups
    assert rep.profile_after.ns < rep.profile_before.ns


def test_k_linear_layers_of_one_input_concatenate_weights_and_biases():
    og, rep = egglog_engine(shared_input(4, bias=True), verify=True)
    assert ops(og) == {"ConcatParams": 2, "FusedMatMulBiasAct": 1, "Narrow": 4}
    wide = og.node(og.node(og.outputs[0]).inputs[0])
    assert [og.node(c).shape for c in wide.inputs[1:]] == [(64, 256), (256,)]
    assert [og.node(i).name for i in og.node(wide.inputs[2]).inputs] == ["b0", "b1", "b2", "b3"]
    assert rep.parity.ok


def test_shared_input_growth_is_quadratic_in_k():
    # Before (a rule per pair and per triple): 409 / 3,313 / 26,849 e-nodes, k cubed.
    sizes = [egglog_engine(shared_input(k))[1].enodes for k in (8, 16, 32)]
    assert sizes == [88, 304, 1_120]


def test_rules_count_the_enodes_a_match_can_build():
    rules = load_rules()
    assert rules.by_name("shared-input-matmul").new_enodes == 6  # TCons, ConcatParams, MatMul, 2 Narrows, ...
    assert rules.by_name("narrow-narrow").new_enodes == 1
    assert rules.by_name("add-zero").new_enodes == 0  # x + 0 = x builds nothing


def test_bench_limits_rows(tmp_path: Path):
    assert shared_row(2, False)[:3] == ["2", "no", "10"]
    asked, _, largest, _, reason = limit_row(4, {"max_enodes": 60})
    assert asked == "max_enodes=60" and int(largest) <= 60 and reason.startswith("node limit: ")


def test_birewrites_count_in_both_directions(tmp_path: Path):
    # egglog reports a birewrite as "name=>" and "name<="; both build what the rule builds.
    rules = tmp_path / "assoc.egg"
    rules.write_text(";; Associativity of Add, both ways.\n"
                     "(birewrite (Add (Add ?a ?b) ?c) (Add ?a (Add ?b ?c)) :ruleset simplify :name \"add-assoc\")\n")
    _, rep = egglog_engine(sum_of_products(16), rules=[default_rule_dir(), rules], max_enodes=400)
    assert max(it.enodes for it in rep.iterations) <= 400
    # named by the rule as written; its 16 operand orders in both directions each build 2 e-nodes per match
    assert rep.stop_reason == ("node limit: rule add-assoc has 14 matches, which could add 448 e-nodes, more "
                               "than the 353 that max_enodes=400 leaves (stage simplify, 47 e-nodes)")


@pytest.mark.parametrize("option, value, error, message", [
    ("max_seconds", -1, ValueError, "max_seconds must be a number >= 0, got -1"),
    ("max_seconds", "5", TypeError, "max_seconds must be a number, got '5' (str)"),
    ("max_enodes", 2.5, TypeError, "max_enodes must be an int, got 2.5 (float)"),
    ("match_limit", -3, ValueError, "match_limit must be an int in [0, 2**63), got -3"),
    ("max_iterations", None, TypeError, "max_iterations must be an int, got None (NoneType)"),
])
def test_bad_limits_are_named(option: str, value, error: type[Exception], message: str):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        egglog_engine(examples.mlp(), **{option: value})
