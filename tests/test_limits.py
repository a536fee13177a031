"""Limits bound the whole run; shared-input matmuls of any k merge with quadratic growth."""

import importlib
import math
import re
import resource
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from egglog import bindings as eb

from benchmarks.limits import assoc_comm_rules, limit_row, shared_input, shared_row, sum_of_products
from rlx_egraph import Graph, examples, optimize_with_report
from rlx_egraph.cost import get_target, profile
from rlx_egraph.engines.budget import (
    Deadline,
    DeadlineExceeded,
    default_max_memory_mb,
    machine_memory_mb,
    memory_in_use_mb,
)
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
    # and the shipped simplify rules build at most 54 e-nodes per match in all.
    assert [it.enodes for it in rep.iterations] == [134, 564, 564, 938, 938, 938]
    assert [it.match_limit for it in rep.iterations] == [
        (3_000 - 47) // 54,  # a stage starts bounded
        None,  # plain while the predicted growth fits
        (3_000 - 564) // 54,  # then bounded: the rules over the limit wait ...
        516,  # ... until only they are left: the largest limit whose e-nodes fit the room
        (3_000 - 938) // 54,
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
    ("max_memory_mb", -1, ValueError, "max_memory_mb must be a number >= 0, got -1"),
    ("max_memory_mb", "2G", TypeError, "max_memory_mb must be a number, got '2G' (str)"),
])
def test_bad_limits_are_named(option: str, value, error: type[Exception], message: str):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        egglog_engine(examples.mlp(), **{option: value})


# --- memory ---------------------------------------------------------------------------------------------------

GROW = '(rule ((= ?x (Input ?n ?s ?dt))) ((Input (+ ?n ?n) ?s ?dt)) :ruleset simplify :name "grow")'
GROWING_RUN = f"""
import resource, sys
from rlx_egraph import Graph, RuleSet, optimize_with_report
rules = RuleSet.shipped() + RuleSet.from_strings({GROW!r}, names=["grow.egg"])
g = Graph()
g.set_outputs([g.relu(g.input("x", (4,)))])
out, report = optimize_with_report(g, rules=rules, engine="egglog", max_iterations=60, max_seconds=100)
print(report.stop_reason)
print(report.iterations[-1].enodes, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def capped(code: str, address_space_mb: int) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter whose address space is capped (``ulimit -v``)."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space_mb << 20, address_space_mb << 20))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, preexec_fn=cap)


def test_a_rule_that_grows_a_value_stops_at_the_default_memory_limit():
    """A string doubled each iteration: 33 e-nodes held 10 GB; under an address-space cap egglog aborted the
    process (SIGABRT).  The default limit is half of what the process may hold (here the cap's 2,000 MB), and
    saturation stops when the next iteration would not fit."""
    run = capped(GROWING_RUN, 2000)
    assert run.returncode == 0, run.stderr[-2000:]
    reason, last = run.stdout.splitlines()[-2:]
    assert re.fullmatch(r"memory limit: the process holds [\d,]+ MB and the next iteration is predicted to add "
                        r"[\d,]+ MB, more than max_memory_mb=1,000 leaves with the view and extraction still to come "
                        r"\(stage simplify, \d+ e-nodes\)", reason)
    enodes, peak_mb = map(int, last.split())
    assert 20 <= enodes <= 30 and peak_mb < 1500


def test_the_default_memory_limit_is_half_of_what_the_process_may_hold():
    assert SaturationLimits().max_memory_mb == default_max_memory_mb() == math.floor(machine_memory_mb() / 2)
    run = capped("from rlx_egraph.engines.egglog.saturate import SaturationLimits\n"
                 "print(SaturationLimits().max_memory_mb)", 3000)
    assert run.stdout.split() == ["1500.0"]


def test_memory_bounds_saturation_by_the_room_it_leaves(tmp_path: Path):
    """Associativity and commutativity: the e-nodes' memory, measured on the run, sets the room."""
    budget = memory_in_use_mb() + 150
    og, rep = egglog_engine(sum_of_products(32), rules=assoc_comm_rules(tmp_path), max_memory_mb=budget,
                            verify=True)
    assert rep.stop_reason.startswith("memory limit: ")
    assert f"max_memory_mb={budget:,.0f}" in rep.stop_reason
    # each e-node is counted at least 10 KB (egglog's bytes, at least 6 KB until measured, and the view's 4 KB)
    assert max(it.enodes for it in rep.iterations) <= 150 * 2**20 / 10_240
    assert rep.parity.ok and len(og.outputs) == 1
    _, free = egglog_engine(sum_of_products(32), rules=assoc_comm_rules(tmp_path), max_enodes=20_000)
    assert free.stop_reason.startswith("node limit: ")  # the same run with memory to spare


# --- the fallback's deadline ------------------------------------------------------------------------------------


def relu_chain(n: int) -> Graph:
    g = Graph(f"relu_chain_{n}")
    v = g.input("x", (4, 4))
    for _ in range(n):
        v = g.relu(v)
    g.set_outputs([v])
    return g


def test_the_fallback_checks_its_deadline_inside_passes_and_the_region_pass():
    """A 50,000-node Relu chain with max_seconds=1: the region pass alone took 4-5 s (10 s at 100,000 nodes), and
    a pass was only checked between passes.  Loading the graph and writing the result are on top."""
    _, rep = optimize_with_report(relu_chain(50_000), engine="fallback", max_seconds=1.0)
    assert rep.stop_reason == "time limit"
    searched = sum(t for phase, t in rep.phases.items() if phase not in ("load", "finish"))
    assert searched <= 1.0 + 0.5, rep.phases


def test_a_run_out_of_time_before_the_fallback_starts_keeps_the_graph():
    g = relu_chain(300)
    out, rep = optimize_with_report(g, engine="fallback", max_seconds=0, verify=True, regions=False)
    assert rep.stop_reason == "time limit" and out == g and rep.parity.ok


def test_auto_gives_the_fallback_only_the_time_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """egglog stopped at a limit hands over to the fallback, which used to get a whole max_seconds of its own and
    overshoot it inside its passes: 29 to 42 s for max_seconds=1, 2 or 4 here.  The fallback must run to the
    run's own deadline, and the run spend at most 1.5 s past it: counted in the process's CPU time, which other
    processes on a loaded machine do not stretch (the deadline is wall-clock time, so a starved run does less
    work before it, not more)."""
    optimize_module = importlib.import_module("rlx_egraph.optimize")
    made: list[Deadline] = []  # each run's deadline, made as it starts
    handed: list[Deadline] = []  # the deadlines the fallback was given
    to_fallback = optimize_module._optimize_fallback

    class RunDeadline(Deadline):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    def spy(*args, **kwargs):
        handed.append(args[-1])
        return to_fallback(*args, **kwargs)

    monkeypatch.setattr(optimize_module, "Deadline", RunDeadline)
    monkeypatch.setattr(optimize_module, "_optimize_fallback", spy)
    rules = assoc_comm_rules(tmp_path)
    for seconds in (1.0, 2.0):
        made.clear()
        handed.clear()
        cpu = time.process_time()
        og, rep = optimize_with_report(sum_of_products(32), rules=rules, max_seconds=seconds)
        assert time.process_time() - cpu < seconds + 1.5, rep.phases
        assert rep.stop_reason.startswith("time limit") and len(og.outputs) == 1
        assert made[0].seconds == seconds and all(d is made[0] for d in handed)
    made.clear()
    handed.clear()
    _, rep = optimize_with_report(sum_of_products(32), rules=rules, max_enodes=2_000, max_seconds=3.0)
    assert rep.engine == "fallback" and rep.engine_reason.startswith("auto: the egglog engine stopped at a limit "
                                                                     "(node limit: ")
    assert rep.engine_reason.endswith("so the fallback ran in the time left")
    assert len(handed) == 1 and handed[0] is made[0] and made[0].seconds == 3.0  # the run's, not one of its own
    g = sum_of_products(4)
    out, rep = optimize_with_report(g, rules=rules, max_seconds=0)
    assert rep.engine == "egglog" and out == g
    assert rep.engine_reason.startswith("auto: the egglog engine stopped at a limit (time limit: ") and \
        rep.engine_reason.endswith(" with no time left for the fallback, so its result stands")
