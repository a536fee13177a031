"""Greedy extraction in time linear in the e-graph: the worklist does what a full sweep does, the positions are the
fixpoint, and a free constant shared by many classes no longer makes every move try all of its readers."""

from __future__ import annotations

import math
import random

import pytest

from rlx_egraph.cost import TARGETS, get_target
from rlx_egraph.engines.budget import Deadline
from rlx_egraph.engines.egglog import extract
from rlx_egraph.engines.egglog._solver import Log, Solver
from rlx_egraph.engines.egglog.view import EClass, EGraphView, ENode
from rlx_egraph.ir.graph import attrs_equal
from rlx_egraph.ir.registry import Kind


def view_of(classes: list[list[tuple[str, tuple[int, ...]]]], originals: dict[int, int] | None = None) -> EGraphView:
    """A view whose class ``k`` holds the e-nodes ``(op, children)`` of ``classes[k]``;
    ``originals`` maps a class to the graph node id that its first e-node is."""
    nodes: list[ENode] = []
    eclasses = []
    for cid, members in enumerate(classes):
        eclasses.append(EClass(cid, originals=[originals[cid]] if originals and cid in originals else []))
        for k, (op, children) in enumerate(members):
            eclasses[cid].nodes.append(len(nodes))
            original = originals.get(cid) if originals and k == 0 else None
            nodes.append(ENode(len(nodes), op, children, {}, cid, original))
    return EGraphView(eclasses, nodes, {g: c for c, g in (originals or {}).items()})


def random_view(rng: random.Random, size: int) -> tuple[EGraphView, list[float]]:
    """Leaves, then classes of 1-3 e-nodes reading lower classes (shared often), with random costs."""
    leaves = 4
    classes: list[list[tuple[str, tuple[int, ...]]]] = [[("Input", ())] for _ in range(leaves)]
    for c in range(leaves, size):
        classes.append([("Add", tuple(rng.sample(range(c), min(c, rng.randint(1, 3)))))
                        for _ in range(rng.randint(1, 3))])
    view = view_of(classes)
    costs = [0.0 if not n.children else float(rng.choice([0, 1, 2, 5, 10, 20])) for n in view.nodes]
    return view, costs


def full_sweep(solver: Solver, pos: list[float], max_passes: int, max_group: int) -> int:
    """The reference: every pass tries every candidate class in position order."""
    candidates = sorted((c for c in solver.choices() if len(solver.view.classes[c].nodes) > 1),
                        key=lambda c: (pos[c], c))
    kept = 0
    for _ in range(max_passes):
        moved = [c for c in candidates if solver.attempt(c, max_group) is not None]
        kept += len(moved)
        if not moved:
            break
    return kept


def twin_solvers(rng: random.Random, size: int) -> tuple[EGraphView, list[float], Solver, Solver]:
    """A random e-graph of ``size`` classes (positions by class id), and two solvers on it, each from every
    class's first e-node with three random roots in the upper half."""
    view, costs = random_view(rng, size)
    pos = [float(c) for c in range(len(view.classes))]
    start = {c: cls.nodes[0] for c, cls in enumerate(view.classes)}
    roots = sorted(rng.sample(range(len(view.classes) // 2, len(view.classes)), 3))
    return view, pos, Solver(view, costs, dict(start), roots, pos), Solver(view, costs, dict(start), roots, pos)


@pytest.mark.parametrize("max_passes,max_group", [(6, 64), (1, 64), (2, 1), (50, 3)])
def test_the_worklist_makes_the_same_moves_as_a_full_sweep_on_random_egraphs(max_passes, max_group):
    total = 0
    for seed in range(150):
        rng = random.Random(seed)
        _, pos, worklist, sweep = twin_solvers(rng, rng.randint(8, 40))
        kept, stopped = worklist.improve(Deadline(), max_passes, max_group)
        assert (kept, stopped) == (full_sweep(sweep, pos, max_passes, max_group), False), seed
        assert (worklist.choices(), worklist.refs) == (sweep.choices(), sweep.refs), seed
        total += kept
    assert total > 300  # the random e-graphs do give the search work


def test_after_a_restart_the_worklist_makes_the_same_moves_as_a_full_sweep():
    """The second search of greedy: improve, restart the classes no longer needed, improve again; the second
    call attempts only what the restart could change, and ends where two full sweeps end."""
    total = 0
    for seed in range(150):
        rng = random.Random(seed)
        view, pos, worklist, sweep = twin_solvers(rng, rng.randint(8, 40))
        other = {c: rng.choice(cls.nodes) for c, cls in enumerate(view.classes)}
        assert worklist.improve(Deadline()) == (full_sweep(sweep, pos, 6, 64), False), seed
        assert worklist.restart(other) == sweep.restart(other), seed
        kept, stopped = worklist.improve(Deadline())
        assert (kept, stopped) == (full_sweep(sweep, pos, 6, 64), False), seed
        assert (worklist.choices(), worklist.refs) == (sweep.choices(), sweep.refs), seed
        total += kept
    assert total > 10  # the restarts do give the second search work


def test_a_search_stopped_by_the_deadline_goes_on_where_it_stopped():
    _, pos, stopped_first, sweep = twin_solvers(random.Random(7), 40)
    assert stopped_first.improve(Deadline(0.0)) == (0, True)
    kept = full_sweep(sweep, pos, 6, 64)
    assert kept > 0
    assert stopped_first.improve(Deadline()) == (kept, False)
    assert stopped_first.choices() == sweep.choices()


# Two e-graphs where a class's failed group move pays only after a move elsewhere changes a class that the group
# move merely looked at: a reader of what it brought in, not live yet (1), or a class that a tried switch of another
# class brought in (2).  Per class its e-nodes (name, children, cost), each reading lower classes; classes 0-3 are
# leaves, the next ones rule-made; then C, P, ... are input-graph classes in that order, the last one the output.
SCENARIOS = {
    "a reader of what the move brings in becomes live": (1, [
        *[[("L", (), 0.0)]] * 4, [("D", (0,), 10.0)],
        [("C0", (0,), 5.0), ("C1", (4,), 5.0)],
        [("P0", (1,), 20.0), ("P1", (4,), 0.0)],
        [("E0", (2,), 40.0), ("E1", (6,), 1.0)],  # E1 makes P live
        [("R", (5, 7), 0.0)],
    ]),
    "a class that a tried switch brought in becomes live": (3, [
        *[[("L", (), 0.0)]] * 4, [("D", (0,), 10.0)], [("Y", (3,), 25.0)], [("G", (5,), 1.0)],
        [("C0", (0,), 5.0), ("C1", (4,), 5.0)],
        [("P0", (1,), 20.0), ("P1", (4, 5), 0.0)],  # P1 pays with Y live
        [("F0", (2,), 30.0), ("F1", (6,), 0.0)],  # F1 makes Y live
        [("R", (7, 8, 9), 0.0)],
    ]),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_class_is_tried_again_when_a_class_its_group_move_looked_at_changes(name):
    """The full sweep retries C after the change and switches C and P together; a worklist that forgot the class
    looked at would let P switch alone, after which C's switch no longer pays."""
    rule_made, spec = SCENARIOS[name]
    first_original = 4 + rule_made
    view = view_of([[("Input" if not children else "Relu", children) for _, children, _ in members]
                    for members in spec], {c: c for c in range(first_original, len(spec))})
    costs = [cost for members in spec for _, _, cost in members]
    label = [name for members in spec for name, _, _ in members]
    pos = extract.class_positions(view, {c: c for c in range(len(spec))})
    start = {c: cls.nodes[0] for c, cls in enumerate(view.classes)}
    worklist = Solver(view, costs, dict(start), [len(spec) - 1], pos)
    sweep = Solver(view, costs, dict(start), [len(spec) - 1], pos)
    assert worklist.improve(Deadline()) == (full_sweep(sweep, pos, 6, 64), False)
    assert worklist.choices() == sweep.choices()
    assert (label[worklist.chosen(first_original)], label[worklist.chosen(first_original + 1)]) == ("C1", "P1")


def fixpoint_positions(view: EGraphView, graph_position: dict[int, int], costs: list[float]) -> list[float]:
    """The reference: repeat sweeps over every e-node the target runs (finite cost) until no position drops."""
    pos: list[float | None] = [None] * len(view.classes)
    for cls in view.classes:
        if any(view.nodes[i].op == "Input" for i in cls.nodes):
            pos[cls.id] = -1.0
        elif cls.originals:
            pos[cls.id] = float(min(graph_position[o] for o in cls.originals))
    fixed = [p is not None for p in pos]
    changed = True
    while changed:
        changed = False
        for n in view.nodes:
            if fixed[n.eclass] or any(pos[ch] is None for ch in n.children) or costs[n.index] == math.inf:
                continue
            cand = max((pos[ch] for ch in n.children), default=-1.0) + 0.5
            if pos[n.eclass] is None or cand < pos[n.eclass]:
                pos[n.eclass] = cand
                changed = True
    return [math.inf if p is None else p for p in pos]


def test_class_positions_are_the_fixpoint_on_random_cyclic_egraphs():
    for seed in range(200):
        rng = random.Random(seed)
        size = rng.randint(3, 30)
        classes: list[list[tuple[str, tuple[int, ...]]]] = [[("Input", ())]]
        for _ in range(1, size):  # children anywhere, so classes may sit on cycles or be unreachable
            classes.append([("Add", tuple(rng.sample(range(size), rng.randint(1, 2))))
                            for _ in range(rng.randint(1, 3))])
        originals = {c: 100 + c for c in rng.sample(range(1, size), rng.randint(0, size // 3))}
        view = view_of(classes, originals)
        position = {g: rng.randint(0, 50) for g in originals.values()}
        costs = [math.inf if rng.random() < 0.2 else 1.0 for _ in view.nodes]  # unsupported e-nodes place nothing
        assert extract.class_positions(view, position, costs) == fixpoint_positions(view, position, costs), seed
        finite = [1.0] * len(view.nodes)
        assert extract.class_positions(view, position) == fixpoint_positions(view, position, finite), seed


def test_a_free_constant_read_by_many_classes_costs_one_switch_per_class():
    """Each class may read a shared free Scalar instead of its own input, at the same cost: no move pays.
    Group moves used to try every reader of the Scalar from every class (readers squared switches)."""
    readers = 60
    classes: list[list[tuple[str, tuple[int, ...]]]] = [[("Input", ())], [("Scalar", ())]]
    classes += [[("Relu", (0,)), ("Mul", (0, 1))] for _ in range(readers)]
    classes.append([("Concat", tuple(range(2, 2 + readers)))])
    view = view_of(classes, {0: 0, **{2 + k: 1 + k for k in range(readers)}, 2 + readers: 1 + readers})
    costs = [0.0 if not n.children else 10.0 for n in view.nodes]
    position = {g: g for g in range(2 + readers)}
    chosen = extract.greedy(view, [2 + readers], get_target("cpu"), position, costs)
    assert (chosen.moves, chosen.cost_ns, chosen.switches) == (0, 10.0 * (readers + 1), readers)


# --- exact extraction: the ILP proves optimality on deep models ----------------------------------------------


def brute_force_optimum(view: EGraphView, roots: list[int], costs: list[float]) -> float:
    """The least DAG cost over every acyclic choice of one e-node per class (small e-graphs only)."""
    import itertools

    best = math.inf
    options = [[n for n in cls.nodes if costs[n] < math.inf] or [None] for cls in view.classes]
    for picks in itertools.product(*options):
        total, state, cyclic = 0.0, {}, False
        stack = [(r, False) for r in roots]
        while stack and not cyclic:
            c, leaving = stack.pop()
            if leaving:
                state[c] = 2
                continue
            if state.get(c) == 2:
                continue
            if state.get(c) == 1 or picks[c] is None:
                cyclic = True
                break
            state[c] = 1
            total += costs[picks[c]]
            stack.append((c, True))
            stack.extend((ch, False) for ch in set(view.nodes[picks[c]].children))
        if not cyclic:
            best = min(best, total)
    return best


@pytest.mark.parametrize("cyclic", [False, True])
def test_exact_equals_the_brute_force_optimum_on_random_egraphs(cyclic: bool):
    proofs = 0
    for seed in range(100):
        rng = random.Random(seed)
        size = rng.randint(4, 7)
        classes: list[list[tuple[str, tuple[int, ...]]]] = [[("Input", ())], [("Input", ())]]
        for c in range(2, size):
            reach = size if cyclic else c  # children anywhere: classes may sit on cycles
            classes.append([("Add", tuple(rng.sample(range(reach), min(reach, rng.randint(1, 2)))))
                            for _ in range(rng.randint(1, 3))])
        view = view_of(classes)
        costs = [0.0 if not n.children else float(rng.choice([0, 1, 2, 5, 10, 20])) for n in view.nodes]
        costs = [math.inf if n.eclass in n.children else cost for n, cost in zip(view.nodes, costs, strict=True)]
        roots = [size - 1]
        optimum = brute_force_optimum(view, roots, costs)
        if optimum == math.inf:
            continue
        result = extract.exact(view, roots, get_target("cpu"), costs)
        assert (result.optimal, result.cost_ns) == (True, optimum), seed
        assert extract.dag_cost(view, result.choice, roots, costs) == optimum
        proofs += 1
    assert proofs == (63 if cyclic else 100)  # the others have no acyclic extraction


def test_a_dominated_enode_gets_no_variable_and_a_start_that_uses_it_is_mapped_to_its_dominator():
    # class 2: Mul(0, 1) costs 5, Relu(0) costs 3 and reads a subset of its children: Mul is dominated
    view = view_of([[("Input", ())], [("Input", ())], [("Mul", (0, 1)), ("Relu", (0,))], [("Relu", (2,))]])
    costs = [0.0, 0.0, 5.0, 3.0, 1.0]
    members, rep = extract._pruned_members(view, [3], costs)
    assert members == {0: [0], 2: [3], 3: [4]}  # class 1 is no longer reachable
    assert rep[2] == 3
    result = extract.exact(view, [3], get_target("cpu"), costs, start={0: 0, 1: 1, 2: 2, 3: 4})
    assert (result.choice, result.cost_ns, result.optimal) == ({3: 4, 2: 3, 0: 0}, 4.0, True)


def test_need_rows_close_the_relaxation_where_two_ways_reach_the_same_class():
    """A MatMul of a normalised input or the fused norm-matmul of the raw one, layer after layer: the LP
    relaxation with one row per read splits each class between its two e-nodes and needs the layer below only
    in part, so its bound decays with depth; the need rows make it exact (no branching) and the ILP proves the
    optimum, which greedy finds too."""
    layers = 12
    classes: list[list[tuple[str, tuple[int, ...]]]] = [[("Input", ())], [("Input", ())]]
    costs: list[float] = [0.0, 0.0]
    x = 0
    for _ in range(layers):
        norm = len(classes)
        classes.append([("RmsNorm", (x,))])
        classes.append([("MatMul", (norm, 1)), ("FusedRmsNormMatMul", (x, 1))])
        costs += [10.0, 10.0, 12.0]
        x = norm + 1
    view = view_of(classes)
    exact = extract.exact(view, [x], get_target("cpu"), costs)
    assert (exact.optimal, exact.cost_ns) == (True, 12.0 * layers)
    assert exact.ilp["cuts"] > 0
    assert {view.nodes[n].op for n in exact.choice.values()} == {"Input", "FusedRmsNormMatMul"}


@pytest.mark.parametrize("model", ["llama", "bert"])
def test_exact_proves_the_optimum_on_deep_models_and_greedy_has_no_gap(model: str):
    """8 layers: the previous formulation (no need rows, no warm start) hit its 10 s limit unproven here."""
    import importlib

    from rlx_egraph import examples
    from rlx_egraph.engines.egglog.decode import decode
    from rlx_egraph.engines.egglog.rules import load_rules
    from rlx_egraph.engines.egglog.saturate import saturate
    from rlx_egraph.engines.egglog.view import build_view
    from rlx_egraph.kernels.parity import check_parity

    pipeline = importlib.import_module("rlx_egraph.optimize")
    graph, rules, cpu = examples.ALL[model](layers=8), load_rules(), get_target("cpu")
    egraph, encoding = pipeline.build_egraph(graph, rules)
    saturate(egraph, rules)
    view = build_view(egraph, graph, encoding.constants, rules)
    roots = [view.class_of_node[o] for o in graph.outputs]
    greedy = extract.greedy(view, roots, cpu, {n.id: k for k, n in enumerate(graph.nodes)})
    exact = extract.exact(view, roots, cpu, time_limit=10.0, start=greedy.choice)
    assert exact.optimal and exact.notes == []
    assert exact.cost_ns == pytest.approx(greedy.cost_ns, rel=1e-12)  # greedy's gap to the optimum is 0
    assert exact.ilp["cuts"] > 0
    assert extract.exact(view, roots, cpu, time_limit=10.0, start=greedy.choice).choice == exact.choice
    decoded = decode(view, exact.choice, graph)
    assert check_parity(graph, decoded.graph, decoded.originals).ok


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("model", ["llama", "bert", "gpt2"])
def test_greedy_has_no_gap_to_the_proven_optimum_on_every_target(model: str, target: str):
    """On onnxruntime greedy missed llama's shared-input matmuls (3% over the optimum): the unsupported
    FusedRmsNormMatMul placed the concatenated matmul's class below the matmul that alone computes it there."""
    from rlx_egraph import examples
    from rlx_egraph.engines.egglog.rules import load_rules
    from rlx_egraph.engines.egglog.saturate import saturate
    from rlx_egraph.engines.egglog.view import build_view
    from rlx_egraph.optimize import build_egraph

    graph, rules, tgt = examples.ALL[model](layers=2), load_rules(), get_target(target)
    egraph, encoding = build_egraph(graph, rules)
    saturate(egraph, rules)
    view = build_view(egraph, graph, encoding.constants, rules)
    roots = [view.class_of_node[o] for o in graph.outputs]
    greedy = extract.greedy(view, roots, tgt, {n.id: k for k, n in enumerate(graph.nodes)})
    exact = extract.exact(view, roots, tgt, time_limit=10.0, start=greedy.choice)
    assert exact.optimal
    assert greedy.cost_ns == pytest.approx(exact.cost_ns, rel=1e-12)


@pytest.fixture(scope="module")
def synthetic_view() -> EGraphView:
    from rlx_egraph import examples
    from rlx_egraph.engines.egglog.rules import load_rules
    from rlx_egraph.engines.egglog.saturate import saturate
    from rlx_egraph.engines.egglog.view import build_view
    from rlx_egraph.optimize import build_egraph

    graph, rules = examples.synthetic(1500, seed=3), load_rules()
    egraph, encoding = build_egraph(graph, rules)
    saturate(egraph, rules)
    return build_view(egraph, graph, encoding.constants, rules)


def test_parents_list_each_reader_of_a_class_once_in_enode_order(synthetic_view: EGraphView) -> None:
    view = synthetic_view
    parents = view.parents()
    assert len(parents) == len(view.classes) and parents is view.parents()  # computed once
    readers: dict[int, list[int]] = {}
    for n in view.nodes:
        for c in dict.fromkeys(n.children):
            readers.setdefault(c, []).append(n.index)
    assert parents == [readers.get(c, []) for c in range(len(view.classes))]
    assert sum(map(len, parents)) > len(view.nodes) // 2 and any(len(p) > 1 for p in parents)


@pytest.mark.parametrize("target", ["cpu", "cuda", "wgpu"])
def test_node_costs_priced_once_per_key_equal_each_enode_priced_alone(synthetic_view: EGraphView, target: str):
    view, tgt = synthetic_view, get_target(target)
    leaves = {n.eclass for n in view.nodes if n.spec.kind is Kind.LEAF}
    alone = [math.inf if n.eclass in n.children else
             extract.enode_ns(tgt, n.spec, n.attrs, [view.classes[c].type for c in n.children],
                              view.classes[n.eclass].type, any(c not in leaves for c in n.children))
             for n in view.nodes]
    assert extract.node_costs(view, tgt) == alone
    assert len(set(alone)) < len(alone) // 4  # most e-nodes share their key with another


def test_types_inferred_once_per_key_equal_each_enode_typed_alone(synthetic_view: EGraphView):
    made = [n for n in synthetic_view.nodes if n.original is None and n.children]
    assert len(made) > 1000
    for n in made:
        assert n.spec.resolve(n.attrs, [synthetic_view.classes[c].type for c in n.children])[1] == \
            synthetic_view.classes[n.eclass].type


def test_class_choice_reads_like_the_dict_of_its_classes_and_drop_unreachable_takes_either(
        synthetic_view: EGraphView) -> None:
    from rlx_egraph.engines.egglog._choice import ClassChoice, drop_unreachable, start_choice

    view = synthetic_view
    costs = extract.node_costs(view, get_target("cpu"))
    pos = extract.class_positions(view, {nid: k for k, nid in enumerate(sorted(view.class_of_node))}, costs)
    first, tree_node = start_choice(view.flat(), costs, pos, view.original_flags())
    as_dict = first.to_dict()
    assert isinstance(first, ClassChoice) and len(first) == len(as_dict) > 0
    assert first == as_dict and dict(first) == as_dict and first.items() == list(as_dict.items())
    missing = next(c for c in range(len(view.classes)) if c not in as_dict) if len(as_dict) < len(view.classes) \
        else len(view.classes)
    assert missing not in first and -1 not in first and all(first[c] == n for c, n in as_dict.items())
    with pytest.raises(KeyError):
        first[missing]
    assert drop_unreachable(view.flat(), first) == drop_unreachable(view.flat(), as_dict)
    assert (tree_node == first) == (tree_node.to_dict() == as_dict)
    c = next(iter(as_dict))
    wrong = next(i for i in range(len(view.nodes)) if view.nodes[i].eclass != c)
    with pytest.raises(ValueError, match=rf"the choice gives class {c} e-node {wrong}, which is not one of its"):
        drop_unreachable(view.flat(), {**as_dict, c: wrong})


def test_a_restart_from_a_class_choice_does_what_one_from_its_dict_does(synthetic_view: EGraphView) -> None:
    from rlx_egraph.engines.egglog._choice import start_choice

    view = synthetic_view
    costs = extract.node_costs(view, get_target("cpu"))
    pos = extract.class_positions(view, {nid: k for k, nid in enumerate(sorted(view.class_of_node))}, costs)
    first, tree_node = start_choice(view.flat(), costs, pos, view.original_flags())
    roots = [view.class_of_node[nid] for nid in sorted(view.class_of_node)[-3:]]
    solvers = [Solver(view, costs, first, roots, pos) for _ in range(2)]
    for solver in solvers:
        solver.improve(Deadline())
    changed = [solvers[0].restart(tree_node), solvers[1].restart(tree_node.to_dict())]
    assert changed[0] == changed[1] > 0
    assert solvers[0].choices() == solvers[1].choices()
    after = [solver.improve(Deadline()) for solver in solvers]  # the second search attempts the same classes
    assert after[0] == after[1] and solvers[0].live_choices() == solvers[1].live_choices()
    with pytest.raises(IndexError, match=r"^class 999999 is not in the e-graph"):
        solvers[0].restart({999999: 0})


def test_greedy_s_two_searches_at_once_give_what_one_after_the_other_gives(synthetic_view: EGraphView):
    """greedy runs its two searches in two threads; run here one after the other, from the same starts."""
    from rlx_egraph.engines.egglog._choice import drop_unreachable, start_choice

    view, cpu = synthetic_view, get_target("cpu")
    roots = sorted({view.class_of_node[n] for c in view.classes for n in c.originals} - {
        ch for n in view.nodes if n.original is not None for ch in n.children})
    position = {nid: k for k, nid in enumerate(sorted(view.class_of_node))}
    costs = extract.node_costs(view, cpu)
    pos = extract.class_positions(view, position, costs)
    first, tree_node = start_choice(view.flat(), costs, pos, view.original_flags())
    searches = [extract._search(view, costs, drop_unreachable(view.flat(), start), roots, pos, tree_node,
                                Deadline()) for start in (first, tree_node)]
    assert searches[0].moves > 0 and searches[1].moves > 0 and searches[0].moves != searches[1].moves
    cheaper = searches[1].cost_ns < searches[0].cost_ns - extract.EPS * max(1.0, abs(searches[0].cost_ns))
    best = searches[1] if cheaper else searches[0]  # greedy's rule: the second only when cheaper
    both = extract.greedy(view, roots, cpu, position, costs)
    assert (both.choice, both.cost_ns, both.moves) == (best.choice, best.cost_ns, best.moves)
    assert both.switches == searches[0].switches + searches[1].switches


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_greedy_unshares_two_linear_layers_with_an_activation_each(target: str):
    """Both layers read one input: merged into one wide matmul (a launch, a view and an activation per layer)
    they cost more than two fused linear+activation layers, and no single move leaves the wide matmul unread.
    Greedy took the wide matmul (50% over the optimum on wgpu) until it also searched from the tree choice."""
    from rlx_egraph import Graph, optimize_with_report

    g = Graph("two_linear_silu")
    x = g.input("x", (4, 8))
    for k in range(2):
        g.set_outputs([*g.outputs, g.silu(g.add(g.matmul(x, g.param(f"w{k}", (8, 8))), g.param(f"b{k}", (8,))))])
    out, report = optimize_with_report(g, target, regions=False, exact_gap=True)
    assert report.exact_optimal and report.extracted_ns == pytest.approx(report.exact_ns, rel=1e-12)
    assert sorted(n.op for n in out.nodes if n.spec.kind is not Kind.LEAF) == ["FusedMatMulBiasAct"] * 2


@pytest.mark.long
def test_greedy_has_no_gap_to_the_proven_optimum_on_random_graphs():
    """30 random graphs of the property tests' patterns, on rotating targets: greedy searching from the input graph
    alone (not also from the least tree-cost choice) is over the optimum on 7 of them (2 by more than 0.1%);
    test_greedy_unshares_two_linear_layers_with_an_activation_each pins a shared wide matmul it is 50% over on."""
    from rlx_egraph import optimize_with_report
    from rlx_egraph.examples import random_graph, random_plan

    rng, targets, gaps = random.Random(6), sorted(TARGETS), []
    for k in range(30):
        graph = random_graph(random_plan(rng, max_steps=14))
        _, report = optimize_with_report(graph, targets[k % len(targets)], regions=False, exact_gap=True)
        assert report.exact_optimal
        gaps.append((report.extracted_ns - report.exact_ns) / max(report.exact_ns, 1.0))
    assert max(gaps) < 1e-9 and min(gaps) > -1e-9


def greedy_fingerprint(seeds: range) -> str:
    """Greedy's choice, cost and moves on random e-graphs (every third class an input-graph node), hashed."""
    import hashlib

    results = []
    for seed in seeds:
        rng = random.Random(seed)
        size = rng.randint(8, 60)
        classes: list[list[tuple[str, tuple[int, ...]]]] = [[("Input", ())] for _ in range(4)]
        for c in range(4, size):
            classes.append([("Add", tuple(rng.sample(range(c), min(c, rng.randint(1, 3)))))
                            for _ in range(rng.randint(1, 4))])
        view = view_of(classes, {c: c for c in range(4, size, 3)})
        costs = [0.0 if not n.children else float(rng.choice([0, 1, 2, 5, 10, 20])) for n in view.nodes]
        roots = sorted(rng.sample(range(size // 2, size), 3))
        chosen = extract.greedy(view, roots, get_target("cpu"), {c: c for c in range(size)}, costs)
        results.append((sorted(chosen.choice.items()), chosen.cost_ns, chosen.moves))
    assert sum(r[2] for r in results) > 200  # the search does work
    return hashlib.sha1(repr(results).encode()).hexdigest()


def test_greedy_makes_the_same_choices_as_when_its_moves_last_changed():
    """Pinned when greedy learned to search a second time from the least tree-cost choice (better on 5 of these
    400 e-graphs than before, worse on none; the hash before was 4841656e..., and before greedy learned to release
    a shared child from its other readers 6de155df...): any change of choice, cost or moves fails here, so that a
    change meant only to make greedy faster cannot change what it picks."""
    assert greedy_fingerprint(range(400)) == "a2761f8eff5a34d60c06320a2f9c5449fe824671"


def test_greedy_releases_a_shared_child_when_all_its_readers_switch_away():
    """k and v each read a slice of one wide node (as K/V projections through a shared-input matmul and
    Narrows): each alone would keep the wide node alive for the other, so only switching both pays."""
    x, wide, k, v, out = range(5)
    role = {"Exp": "wide", "Neg": "unfused", "Relu": "narrow", "Tanh": "fused"}  # ops standing for the roles
    view = view_of([[("Input", ())], [("Exp", (x,))],
                    [("Neg", (x,)), ("Relu", (wide,)), ("Tanh", (x,))],
                    [("Neg", (x,)), ("Relu", (wide,)), ("Tanh", (x,))],
                    [("Add", (k, v))]], {x: 0, k: 1, v: 2, out: 3})
    price = {"wide": 7.0, "unfused": 9.0, "narrow": 1.0, "fused": 3.0}
    costs = [price.get(role.get(n.op, ""), 0.0) + (n.op == "Add") for n in view.nodes]
    chosen = extract.greedy(view, [out], get_target("cpu"), {c: c for c in range(5)}, costs)
    assert {role[view.nodes[chosen.choice[c]].op] for c in (k, v)} == {"fused"} and wide not in chosen.choice
    assert chosen.cost_ns == extract.exact(view, [out], get_target("cpu"), costs).cost_ns == 7.0


def test_the_compiled_solver_rejects_what_is_not_in_its_egraph():
    """Class and e-node numbers reach the compiled search from Python: each is checked, never read out of bounds."""
    view = view_of([[("Input", ())], [("Relu", (0,)), ("Neg", (0,))], [("Add", (1, 1))]])
    costs, pos = [0.0, 2.0, 1.0, 3.0], [-1.0, 0.0, 1.0]
    solver = Solver(view, costs, {0: 0, 1: 1, 2: 3}, [2], pos)
    assert (solver.refs, solver.chosen(1), solver.switch(1, 2, Log())) == ([1, 2, 1], 1, -1.0)  # Add: 1 twice
    with pytest.raises(IndexError, match=r"class 3 is not in the e-graph \(3 classes\)"):
        solver.needed(3)
    with pytest.raises(ValueError, match="e-node 3 is not an e-node of class 1"):
        solver.switch(1, 3, Log())
    with pytest.raises(ValueError, match="class 1 is needed: only a move may change its choice"):
        solver.set_choice(1, 1)
    with pytest.raises(ValueError, match="the choice gives class 1 e-node 0, which is not one of its e-nodes"):
        Solver(view, costs, {0: 0, 1: 0, 2: 3}, [2], pos)
    with pytest.raises(KeyError, match="class 1 is needed but has no e-node"):
        Solver(view, costs, {0: 0, 2: 3}, [2], pos)
    with pytest.raises(ValueError, match="4 costs and 2 positions for 4 e-nodes and 3 classes"):
        Solver(view, costs, {}, [], pos[:2])


def test_greedy_names_the_output_it_cannot_compute():
    view = view_of([[("Input", ())], [("Relu", (0,))], [("Relu", (3,))], [("Neg", (2,))]], {0: 0, 1: 1})
    cpu = get_target("cpu")
    with pytest.raises(ValueError, match=r"no supported way to compute an output on cpu \(computed by Relu\): every "
                                         r"way reads an op the target does not run, or a value computed only from"):
        extract.greedy(view, [1], cpu, {0: 0, 1: 1}, [0.0, math.inf, 1.0, 1.0])  # Relu unsupported
    with pytest.raises(ValueError, match=r"on cpu \(computed by Relu\): every way reads"):
        extract.greedy(view, [2], cpu, {0: 0, 1: 1}, [0.0, 1.0, 1.0, 1.0])  # 2 and 3 compute each other only
    assert extract.greedy(view, [1], cpu, {0: 0, 1: 1}, [0.0, 1.0, 1.0, 1.0]).choice == {0: 0, 1: 1}


def test_enodes_of_one_op_with_equal_attributes_share_one_dict(synthetic_view: EGraphView):
    """The memos of pricing and typing key attributes by the dict's identity, so that equal attributes of one op
    are priced and typed once: they must be one dict."""
    by_op: dict[str, dict[int, dict]] = {}
    for n in synthetic_view.nodes:
        by_op.setdefault(n.op, {})[id(n.attrs)] = n.attrs
    shared = 0
    for op, dicts in by_op.items():
        found = list(dicts.values())
        for k, a in enumerate(found):
            assert not any(attrs_equal(a, b) for b in found[k + 1:]), op
        shared += sum(1 for n in synthetic_view.nodes if n.op == op) - len(found)
    assert shared > len(synthetic_view.nodes) // 2


def test_dag_cost_sums_each_reachable_class_once_and_needs_a_choice_for_each(synthetic_view: EGraphView):
    view = synthetic_view
    roots = sorted({c.id for c in view.classes if c.originals})[-3:]
    choice = {c.id: c.nodes[0] for c in view.classes if c.nodes}
    costs = [float(k % 7) for k in range(len(view.nodes))]
    reached, stack = set(), list(roots)
    while stack:
        c = stack.pop()
        if c not in reached:
            reached.add(c)
            stack.extend(view.nodes[choice[c]].children)
    assert extract.dag_cost(view, choice, roots, costs) == sum(costs[choice[c]] for c in reached)
    missing = next(iter(view.nodes[choice[roots[0]]].children))
    with pytest.raises(KeyError):
        extract.dag_cost(view, {c: n for c, n in choice.items() if c != missing}, roots, costs)
    with pytest.raises(ValueError, match="not one of its e-nodes"):
        extract.dag_cost(view, {**choice, roots[0]: choice[missing]}, roots, costs)


def test_decoded_nodes_checked_once_per_key_equal_each_node_checked_alone(synthetic_view: EGraphView):
    """Decoding checks a rule-made node once per (op, attributes, input types): every node it builds is what
    Graph.add_node makes of it from scratch."""
    from rlx_egraph import examples
    from rlx_egraph.engines.egglog.decode import decode
    from rlx_egraph.ir.graph import Graph

    graph, view, tgt = examples.synthetic(1500, seed=3), synthetic_view, get_target("cpu")
    roots = [view.class_of_node[o] for o in graph.outputs]
    choice = extract.greedy(view, roots, tgt, {n.id: k for k, n in enumerate(graph.nodes)}).choice
    decoded = decode(view, choice, graph).graph
    alone = Graph("alone")
    for node in decoded.nodes:
        alone.add_node(node.op, node.inputs, node.id, **node.attrs)
    assert sum(n.op.startswith("Fused") for n in decoded.nodes) > 50  # many rule-made nodes share a key
    assert [(n.id, n.op, n.inputs, n.shape, n.dtype, n.parts) for n in decoded.nodes] == \
        [(n.id, n.op, n.inputs, n.shape, n.dtype, n.parts) for n in alone.nodes]
    assert all(attrs_equal(a.attrs, b.attrs) for a, b in zip(decoded.nodes, alone.nodes, strict=True))


def reference_decode_order(view: EGraphView, wanted: dict[int, int], first: list[float]) -> list[int]:
    """decode's order in plain Python: Kahn's algorithm, a heap of (sort key, class)."""
    import heapq

    key: dict[int, float] = {}

    def ready(c: int) -> tuple[float, int]:
        children = view.nodes[wanted[c]].children
        key[c] = first[c] if first[c] < math.inf else max([key[ch] for ch in children], default=-1.0) + 0.5
        return key[c], c

    pending = {c: len(set(view.nodes[n].children)) for c, n in wanted.items()}
    readers: dict[int, list[int]] = {}
    for c, n in wanted.items():
        for ch in set(view.nodes[n].children):
            readers.setdefault(ch, []).append(c)
    heap = [ready(c) for c, p in pending.items() if p == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, c = heapq.heappop(heap)
        order.append(c)
        for r in readers.get(c, ()):
            pending[r] -= 1
            if pending[r] == 0:
                heapq.heappush(heap, ready(r))
    return order


def test_decode_order_is_kahns_order_least_key_first_on_random_egraphs():
    from rlx_egraph.engines.egglog._decoding import decode_order

    rng = random.Random(7)
    for _ in range(200):
        view, _ = random_view(rng, rng.randint(4, 40))
        wanted = {c: rng.choice(cls.nodes) for c, cls in enumerate(view.classes)}
        positions = iter(range(len(view.classes)))  # input-graph classes in increasing position, ties impossible
        first = [float(next(positions)) if rng.random() < 0.5 else math.inf for _ in view.classes]
        order = decode_order(view.flat(), wanted, first)
        assert order == reference_decode_order(view, wanted, first)
        assert sorted(order) == sorted(wanted)


def test_decode_order_leaves_out_a_cycle_and_what_reads_it():
    from rlx_egraph.engines.egglog._decoding import decode_order

    view = view_of([[("Input", ())], [("Add", (0, 2))], [("Relu", (1,))], [("Relu", (2,))]])
    wanted = {c: view.classes[c].nodes[0] for c in range(4)}
    assert decode_order(view.flat(), wanted, [0.0, math.inf, math.inf, math.inf]) == [0]
    with pytest.raises(ValueError, match="the choice gives class 1 e-node 0, which is not one of its e-nodes"):
        decode_order(view.flat(), {1: 0}, [math.inf] * 4)
