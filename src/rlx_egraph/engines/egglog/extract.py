"""Extraction: choose one e-node per needed e-class, minimising the IO cost.

The cost of a choice is a DAG cost: the sum of ``Target.node_ns`` over the
e-classes reachable from the outputs, each counted once, so a tensor read by
two consumers is paid for once and a fusion that keeps the unfused producer
alive for another consumer pays for both.  Unsupported ops cost infinity
(legalization by extraction).

``greedy`` starts from the input graph itself (every original class keeps its
original node), so the result is never worse than the input.  It then improves
the choice by local moves: switch one class to another e-node, paying for the
classes that become needed and refunding those no longer needed; when a switch
alone does not pay (a wide QKV matmul), it tries to also switch the classes
that could share what the switch brought in, and keeps the group if it pays.
It also searches from each class's least tree-cost e-node and keeps the
cheaper of the two results (so still never worse than the input): sharing can
hide a cheaper unshared form from every single move.
Its passes run on the e-graph as integer arrays (:mod:`._choice`, :mod:`._pricing`,
:mod:`._solver`: compiled where the install had a C compiler, see ``docs/install.md``);
the two searches run at once, each in its own thread (compiled, the search holds
no Python object, so it lets go of the GIL).
``exact`` solves the same problem as an integer program (HiGHS via ``highspy``).
Both respect the run's deadline: greedy stops improving (its choice is valid
at every step), exact gets at most the time left.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...cost import Target
from ...cost.enode import EPS, NodePrices, enode_ns
from ...cost.targets import unsupported_op
from ...ir.graph import Node
from ...ir.registry import REGISTRY
from ..budget import Deadline, DeadlineExceeded
from ._choice import ClassChoice, drop_unreachable, least_per_class, settle_positions, start_choice, tree_choice
from ._choice import dag_cost as flat_dag_cost
from ._pricing import price_nodes
from ._solver import Solver
from .view import EGraphView


@dataclass
class Extraction:
    """Chosen e-node per class for the classes the outputs need."""

    choice: dict[int, int]
    cost_ns: float
    method: str
    seconds: float = 0.0
    moves: int = 0  # greedy: the moves it kept
    switches: int = 0  # greedy: the switches its local search made, kept or undone (its work)
    optimal: bool = False  # proven optimal (exact mode finished)
    notes: list[str] = field(default_factory=list)
    ilp: dict[str, int] = field(default_factory=dict)  # exact mode: variables, constraints, cuts, LP rounds


def node_costs(view: EGraphView, target: Target) -> list[float]:
    """:func:`enode_ns` of every e-node, each distinct (op, attributes where :meth:`Target.prices_attributes`,
    input and output types, whether it reads an intermediate) priced once (see
    :func:`._pricing.price_nodes`; the classes' types go by :meth:`EGraphView.type_numbers`)."""
    classes, nodes = view.classes, view.nodes
    prices = NodePrices(target)
    leaves = view.leaf_classes()

    def price(n: int, reads_intermediate: bool) -> float:
        node = nodes[n]
        return enode_ns(prices, node.spec, node.attrs, [classes[c].type for c in node.children],
                        classes[node.eclass].type, reads_intermediate)

    reads_attrs = {op: (target.prices_attributes(spec, False), target.prices_attributes(spec, True))
                   for op, spec in REGISTRY.items()}
    return price_nodes(view.flat(), nodes, view.type_numbers(), [c.id in leaves for c in classes], price,
                       reads_attrs)


def dag_cost(view: EGraphView, choice: dict[int, int], roots: list[int], costs: list[float]) -> float:
    """Sum of node costs over the classes reachable from ``roots`` under ``choice`` (see
    :func:`._choice.dag_cost`)."""
    return flat_dag_cost(view.flat(), choice, roots, costs)


def _best_tree_choice(view: EGraphView, costs: list[float]) -> tuple[dict[int, int], dict[int, float]]:
    """Knuth-style bottom-up pass: per class the e-node of least tree cost (see :func:`._choice.tree_choice`)."""
    return tree_choice(view.flat(), costs)


def class_positions(view: EGraphView, graph_position: Mapping[int, int],
                    costs: list[float] | None = None) -> list[float]:
    """A potential over classes: leaves -1, input-graph classes their graph position,
    new classes just above the inputs of their lowest e-node that the target can run
    (finite ``costs``; every e-node when None): an unsupported e-node would otherwise
    place a class below the children of the only e-nodes that can compute it.

    Extraction only uses e-nodes whose children sit strictly below their class,
    so every choice is acyclic without searching for cycles.  Computed like
    Dijkstra's shortest paths (Knuth's generalisation: a class's position is the
    least over its e-nodes of the highest child's plus 1/2), so in O(E log E)
    (see :func:`._choice.settle_positions`).
    """
    pos = least_per_class(view.class_of_node, graph_position, len(view.classes))
    final = [p < math.inf for p in pos]
    for c in view.leaf_classes():
        pos[c], final[c] = -1.0, True
    return settle_positions(view.flat(), pos, final, costs)


def _original_op(view: EGraphView, nid: int) -> str:
    """The op of input-graph node ``nid`` (its e-node's)."""
    return next((view.nodes[i].op for i in view.classes[view.class_of_node[nid]].nodes
                 if view.nodes[i].original == nid), "")


def earliest_positions(nodes: Iterable[Node]) -> dict[int, int]:
    """Node id -> its place in the topological order that computes each node as early as its inputs allow: by
    depth (the longest path from a leaf), nodes of one depth in the order of ``nodes`` (a topological order).
    An exporter writes a value the layers share (a mask, rotary tables) just before the first layer reads it,
    between that layer's nodes; here it comes before every layer."""
    depth: dict[int, int] = {}
    order: list[tuple[int, int, int]] = []
    for k, n in enumerate(nodes):
        depth[n.id] = d = 1 + max((depth[i] for i in n.inputs), default=-1)
        order.append((d, k, n.id))
    return {nid: place for place, (_, _, nid) in enumerate(sorted(order))}


def greedy(view: EGraphView, roots: list[int], target: Target, graph_position: Mapping[int, int],
           costs: list[float] | None = None, deadline: Deadline | None = None,
           earliest: Mapping[int, int] | None = None) -> Extraction:
    """Deterministic DAG extraction by local search from two starts, the cheaper result kept: the input graph
    (each class its input-graph node where it has one), and each class's least tree-cost e-node.  Each search
    applies local and group moves until none is left or ``deadline`` passes (then the best choice so far is
    kept).  The second start finds what sharing hides from local moves: two linear layers with an activation
    each, first merged into one wide matmul, are cheaper as two fused layers, but no single move leaves the
    wide one unread.

    Every choice keeps each class's children below it in one order of the classes (:func:`class_positions`),
    which the input graph's topological order ``graph_position`` sets.  ``earliest`` (see
    :func:`earliest_positions`), another topological order of the same graph, runs the searches again under
    the order it sets, and the cheaper result is kept (the first on a tie): a fused node that reads a value
    the exporter wrote after the node it replaces (the first layer's attention reading the shared mask) is
    only within reach under it."""
    start = time.perf_counter()
    deadline = deadline or Deadline()
    costs = node_costs(view, target) if costs is None else costs
    best = _greedy_under(view, roots, target, graph_position, costs, deadline)
    switches = best.switches
    if earliest is not None and not best.stopped:
        other = _greedy_under(view, roots, target, earliest, costs, deadline)
        switches += other.switches
        if not other.stopped and other.cost_ns < best.cost_ns - EPS * max(1.0, abs(best.cost_ns)):
            best = other
    notes = ["extraction stopped at the time limit with the best graph found so far"] if best.stopped else []
    return Extraction(best.choice, best.cost_ns, "greedy", time.perf_counter() - start, best.moves, switches,
                      notes=notes)


def _greedy_under(view: EGraphView, roots: list[int], target: Target, graph_position: Mapping[int, int],
                  costs: list[float], deadline: Deadline) -> _SearchResult:
    """:func:`greedy`'s two searches under the class order ``graph_position`` sets, the cheaper kept."""
    pos = class_positions(view, graph_position, costs)
    flat = view.flat()
    first, tree_node = start_choice(flat, costs, pos, view.original_flags())
    first = drop_unreachable(flat, first)
    missing = [r for r in roots if r not in first]
    if missing:
        lost = sorted((graph_position[nid], nid) for nid, c in view.class_of_node.items() if c not in first)
        error = unsupported_op(target, ((nid, _original_op(view, nid)) for _, nid in lost))
        if error is not None:
            raise error
        ops = sorted({view.nodes[i].op for r in missing for i in view.classes[r].nodes})
        raise ValueError(f"no supported way to compute an output on {target.name} (computed by {', '.join(ops)}): "
                         "every way reads an op the target does not run, or a value computed only from itself")
    tree_start = drop_unreachable(flat, tree_node)
    if tree_start == first:  # the same start would search the same way
        return _search(view, costs, first, roots, pos, tree_node, deadline)
    with ThreadPoolExecutor(1, thread_name_prefix="rlx-greedy") as pool:  # the two searches at once (compiled,
        from_tree = pool.submit(_search, view, costs, tree_start, roots, pos, tree_node, deadline)  # the search
        best = _search(view, costs, first, roots, pos, tree_node, deadline)  # lets go of the GIL)
        second = from_tree.result()
    switches = best.switches + second.switches
    # a search from the input graph that the deadline stopped keeps the input graph's choice
    if not best.stopped and second.cost_ns < best.cost_ns - EPS * max(1.0, abs(best.cost_ns)):
        best = second
    return replace(best, switches=switches)


@dataclass(frozen=True)
class _SearchResult:
    choice: dict[int, int]
    cost_ns: float
    moves: int  # kept
    switches: int  # tried
    stopped: bool  # by the deadline


def _search(view: EGraphView, costs: list[float], start: ClassChoice, roots: list[int], pos: list[float],
            tree_node: ClassChoice, deadline: Deadline) -> _SearchResult:
    """Greedy's local search from ``start``, run a second time with each class no longer needed back at its
    cheapest tree choice (a later move that needs it again then finds it computed the cheap way, not the way it
    last was)."""
    solver = Solver(view, costs, start, roots, pos)
    moves, stopped = solver.improve(deadline)
    if not stopped and solver.restart(tree_node):
        more, stopped = solver.improve(deadline)
        moves += more
    chosen = solver.live_choices()
    return _SearchResult(chosen, dag_cost(view, chosen, roots, costs), moves, solver.switches, stopped)


def exact(view: EGraphView, roots: list[int], target: Target, costs: list[float] | None = None,
          time_limit: float = 30.0, deadline: Deadline | None = None,
          start: Mapping[int, int] | None = None) -> Extraction:
    """Optimal DAG extraction as a mixed-integer program (HiGHS through ``highspy``).

    ``start`` (a choice per class, e.g. greedy's) is the solver's first incumbent.
    The solver gets ``time_limit`` seconds, or what is left before ``deadline``;
    raises :class:`~.budget.DeadlineExceeded` if that is not enough for a solution.
    """
    begin = time.perf_counter()
    deadline = deadline or Deadline()
    deadline.check("exact extraction")
    costs = node_costs(view, target) if costs is None else costs
    stop = time.perf_counter() + min(time_limit, deadline.remaining())
    ilp = _Ilp(view, roots, costs)
    ilp.separate(stop)
    chosen, status, message = ilp.solve(stop, start)
    if chosen is None:
        if stop - begin < time_limit:
            raise DeadlineExceeded(f"exact extraction found no solution within max_seconds={deadline.seconds:g}")
        raise RuntimeError(f"exact extraction found no solution: {message}")
    optimal = status == "Optimal"
    notes = [] if optimal else [f"exact extraction stopped after {time.perf_counter() - begin:.1f} s with a solution "
                                f"not proven optimal ({message})"]
    return Extraction(chosen, dag_cost(view, chosen, roots, costs), "exact", time.perf_counter() - begin,
                      optimal=optimal, notes=notes, ilp=ilp.stats)


class _Ilp:
    """The integer program of DAG extraction: a binary per e-node, at most one per class, exactly one per root.

    Pruned first: only classes reachable from the roots, only e-nodes of finite cost, and no e-node
    dominated by another of its class (a subset of its children at no higher cost: switching to that
    one never costs more nor closes a cycle).  A class read by an e-node of class ``c`` is chosen at
    least as often as ``c`` chooses e-nodes reading it.  That relaxation is weak on deep models: a
    class split between two e-nodes that reach the same class by different paths (a MatMul of a
    normalised input, or the fused norm-matmul of the raw one) needs it only fractionally, and the
    fraction shrinks with every layer.  :meth:`separate` adds the violated "need" rows (a class
    needed by every extraction of each e-node of a set is chosen at least as often as the set) until
    the LP has none.  Cycles: ordering variables on the edges inside strongly connected components.
    """

    def __init__(self, view: EGraphView, roots: list[int], costs: list[float]) -> None:
        from scipy.sparse import coo_array
        from scipy.sparse.csgraph import connected_components

        self.view, self.roots, self.costs = view, roots, costs
        self.members, self.rep = _pruned_members(view, roots, costs)
        self.classes = list(self.members)
        index = {c: i for i, c in enumerate(self.classes)}
        self.nodes = [n for c in self.classes for n in self.members[c]]
        self.col = {n: i for i, n in enumerate(self.nodes)}
        edges = [(index[view.nodes[n].eclass], index[ch]) for n in self.nodes for ch in view.nodes[n].children]
        if edges:
            src, dst = zip(*edges, strict=True)
            graph = coo_array((np.ones(len(edges)), (src, dst)), shape=(len(self.classes),) * 2)
            self.component = connected_components(graph, directed=True, connection="strong")[1]
        else:
            self.component = np.arange(len(self.classes))
        self.index = index
        self.need, self.via = self._needs()
        h = self.highs = _silent_highs()
        for option, value in (("output_flag", False), ("threads", 1), ("random_seed", 0), ("mip_rel_gap", 0.0)):
            h.setOptionValue(option, value)
        # ordering variables, only for classes on a cycle
        cyclic = [c for c in self.classes if self._on_cycle(c)]
        self.tcol = {c: len(self.nodes) + i for i, c in enumerate(cyclic)}
        self.big = float(len(self.classes) + 1)
        nvar = len(self.nodes) + len(cyclic)
        h.addVars(nvar, np.zeros(nvar), np.array([1.0] * len(self.nodes) + [self.big] * len(cyclic)))
        h.changeColsCost(len(self.nodes), np.arange(len(self.nodes), dtype=np.int32),
                         np.array([costs[n] for n in self.nodes]))
        rows: list[tuple[dict[int, float], float, float]] = []
        root_set = set(roots)
        for c in self.classes:
            rows.append(({self.col[n]: 1.0 for n in self.members[c]}, 1.0 if c in root_set else 0.0, 1.0))
        for c in self.classes:
            readers: dict[int, list[int]] = {}
            for n in self.members[c]:
                for ch in dict.fromkeys(view.nodes[n].children):
                    readers.setdefault(ch, []).append(n)
                    if ch in self.tcol and self.component[index[c]] == self.component[index[ch]]:
                        # t[c] - t[ch] >= 1 - big * (1 - x[n])
                        rows.append(({self.tcol[c]: 1.0, self.tcol[ch]: -1.0, self.col[n]: -self.big},
                                     1.0 - self.big, math.inf))
            rows.extend(self._need_row(d, readers[d]) for d in readers)
        self._add_rows(rows)
        self.stats = {"variables": nvar, "constraints": len(rows), "cuts": 0, "rounds": 0}

    def _on_cycle(self, c: int) -> bool:
        label = self.component[self.index[c]]
        return any(self.component[self.index[ch]] == label for n in self.members[c]
                   for ch in self.view.nodes[n].children)

    def _needs(self) -> tuple[dict[int, int], dict[int, int]]:
        """Per class the bitset (bit = position in ``classes``) of the classes every extraction of it needs,
        itself included; per e-node the union over its children.  A class on a cycle counts as needing
        itself only (a subset of the truth, so the rows stay valid)."""
        bit = {c: 1 << i for i, c in enumerate(self.classes)}
        need: dict[int, int] = {}
        via: dict[int, int] = {}
        for c in self._children_first():
            common = None
            for n in self.members[c]:
                v = 0
                for ch in self.view.nodes[n].children:
                    v |= need.get(ch, bit[ch])
                via[n] = v
                common = v if common is None else common & v
            need[c] = bit[c] | (0 if common is None or self._on_cycle(c) else common)
        return need, via

    def _children_first(self) -> list[int]:
        """The classes in an order where every class comes after the classes it reads (cycles broken anywhere)."""
        order: list[int] = []
        state: dict[int, int] = {}  # 1: on the stack, 2: done
        for root in self.classes:
            if root in state:
                continue
            stack = [(root, False)]
            while stack:
                c, leaving = stack.pop()
                if leaving:
                    state[c] = 2
                    order.append(c)
                    continue
                if c in state:
                    continue
                state[c] = 1
                stack.append((c, True))
                stack.extend((ch, False) for n in reversed(self.members[c])
                             for ch in reversed(self.view.nodes[n].children) if ch not in state)
        return order

    def _need_row(self, d: int, readers: list[int]) -> tuple[dict[int, float], float, float]:
        """sum x[class d] - sum x[readers] >= 0."""
        coeffs = {self.col[m]: 1.0 for m in self.members[d]}
        for n in readers:
            coeffs[self.col[n]] = coeffs.get(self.col[n], 0.0) - 1.0
        return coeffs, 0.0, math.inf

    def _add_rows(self, rows: list[tuple[dict[int, float], float, float]]) -> None:
        import highspy

        starts, index, value = [], [], []
        for coeffs, _, _ in rows:
            starts.append(len(index))
            index.extend(coeffs)
            value.extend(coeffs.values())
        self.highs.addRows(len(rows), np.array([lo for _, lo, _ in rows]),
                           np.array([min(hi, highspy.kHighsInf) for _, _, hi in rows]), len(index),
                           np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32), np.array(value))

    def separate(self, stop: float, max_rounds: int = 100) -> None:
        """Solve the LP relaxation and add the violated need rows, until none is left (or ``stop``)."""
        import highspy

        h = self.highs
        position = {c: i for i, c in enumerate(self._children_first())}
        for _ in range(max_rounds):
            if time.perf_counter() >= stop:
                return
            h.setOptionValue("time_limit", max(stop - time.perf_counter(), 1e-3))
            h.run()
            if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                return
            self.stats["rounds"] += 1
            x = np.asarray(h.getSolution().col_value)
            total = np.array([x[[self.col[m] for m in self.members[d]]].sum() for d in self.classes])
            rows = [row for c in self.classes for row in self._violated(c, x, total, position)]
            if not rows:
                return
            self._add_rows(rows)
            self.stats["constraints"] += len(rows)
            self.stats["cuts"] += len(rows)

    def _violated(self, c: int, x: np.ndarray, total: np.ndarray,
                  position: dict[int, int]) -> list[tuple[dict[int, float], float, float]]:
        """Need rows of class ``c`` that ``x`` (``total`` per class) violates: a class ``d`` that two or more
        of its e-nodes chosen in ``x`` need, chosen less than their sum; only the highest such ``d`` (its row
        and the rows of the classes between imply those below)."""
        chosen = [n for n in self.members[c] if x[self.col[n]] > EPS]
        if len(chosen) < 2:
            return []
        size = len(self.classes)
        nbytes = (size + 7) // 8
        via = np.array([np.unpackbits(np.frombuffer(self.via[n].to_bytes(nbytes, "little"), np.uint8),
                                      bitorder="little")[:size] for n in chosen], dtype=bool)
        weight = np.array([x[self.col[n]] for n in chosen])
        lhs = weight @ via
        violated = np.flatnonzero((lhs > total + 1e-6) & (via.sum(axis=0) >= 2))
        rows = []
        covered = 0
        for i in sorted(violated, key=lambda i: -position[self.classes[i]]):
            d = self.classes[i]
            if covered >> int(i) & 1:
                continue
            covered |= self.need[d] & ~(1 << int(i))
            rows.append(self._need_row(d, [n for n in self.members[c] if self.via[n] >> int(i) & 1]))
        return rows

    def solve(self, stop: float, start: Mapping[int, int] | None) -> tuple[dict[int, int] | None, str, str]:
        """The MIP from ``start``: the choice reachable from the roots, HiGHS's model status and its words."""
        import highspy

        h = self.highs
        ncol = len(self.nodes)
        h.changeColsIntegrality(ncol, np.arange(ncol, dtype=np.int32),
                                np.array([highspy.HighsVarType.kInteger] * ncol))
        if start is not None:
            first = self._start(start)
            if first is not None:
                h.setSolution(len(first), np.arange(len(first), dtype=np.int32), first)
        h.setOptionValue("time_limit", max(stop - time.perf_counter(), 1e-3))
        h.run()
        status = h.modelStatusToString(h.getModelStatus())
        if h.getInfo().primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
            return None, status, status
        x = np.asarray(h.getSolution().col_value)
        picked = {self.view.nodes[n].eclass: n for n in self.nodes if x[self.col[n]] > 0.5}
        return _walk(self.view, self.roots, picked), status, status

    def _start(self, start: Mapping[int, int]) -> np.ndarray | None:
        """``start`` as a column vector (each e-node replaced by the one that dominates it), or None if it
        uses a pruned class."""
        choice = {c: self.rep.get(n, n) for c, n in start.items()}
        if any(c not in choice or choice[c] not in self.col for c in self.roots):
            return None
        try:
            reached = _walk(self.view, self.roots, choice)
        except KeyError:
            return None
        if any(n not in self.col for n in reached.values()):
            return None
        values = np.zeros(len(self.nodes) + len(self.tcol))
        for n in reached.values():
            values[self.col[n]] = 1.0
        height: dict[int, int] = {}
        for c in _postorder(self.view, self.roots, reached):
            height[c] = 1 + max((height[ch] for ch in self.view.nodes[reached[c]].children), default=-1)
            if c in self.tcol:
                values[self.tcol[c]] = float(height[c])
        return values


def _silent_highs() -> Any:
    """A new ``highspy.Highs``.  The first one a process makes writes HiGHS's banner to file descriptor 1, before
    any option can turn its output off, so it is made with that descriptor pointing at the null device (the
    banner would otherwise land in the middle of the CLI's ``--json`` output)."""
    import highspy

    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (a daemon): nowhere for the banner to go
        return highspy.Highs()
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 1)
            return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _pruned_members(view: EGraphView, roots: list[int], costs: list[float]) -> tuple[dict[int, list[int]],
                                                                                        dict[int, int]]:
    """Per class reachable from ``roots`` its e-nodes worth a variable, and per dominated e-node the one kept
    instead (a subset of its children at no higher cost)."""
    kept: dict[int, list[int]] = {}
    rep: dict[int, int] = {}
    for cls in view.classes:
        keep: list[int] = []
        for n in sorted((n for n in cls.nodes if costs[n] < math.inf),
                        key=lambda n: (costs[n], len(set(view.nodes[n].children)), n)):
            children = set(view.nodes[n].children)
            rep[n] = next((m for m in keep if set(view.nodes[m].children) <= children), n)
            if rep[n] == n:
                keep.append(n)
        kept[cls.id] = keep
    changed = True
    while changed:  # an e-node reading a class left without e-nodes is no way to compute anything
        changed = False
        for c, keep in kept.items():
            usable = [n for n in keep if all(kept[ch] for ch in view.nodes[n].children)]
            if len(usable) < len(keep):
                kept[c], changed = usable, True
    members: dict[int, list[int]] = {}
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c not in members:
            members[c] = kept[c]
            stack.extend(ch for n in kept[c] for ch in view.nodes[n].children)
    return {c: members[c] for c in sorted(members)}, rep


def _walk(view: EGraphView, roots: list[int], choice: Mapping[int, int]) -> dict[int, int]:
    """The part of ``choice`` reachable from ``roots`` (KeyError if a reached class has no choice)."""
    chosen: dict[int, int] = {}
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c not in chosen:
            chosen[c] = choice[c]
            stack.extend(view.nodes[chosen[c]].children)
    return chosen


def _postorder(view: EGraphView, roots: list[int], choice: Mapping[int, int]) -> list[int]:
    """The classes of an acyclic ``choice``, each after the classes it reads."""
    order: list[int] = []
    done: set[int] = set()
    stack = [(r, False) for r in roots]
    while stack:
        c, leaving = stack.pop()
        if leaving:
            order.append(c)
        elif c not in done:
            done.add(c)
            stack.append((c, True))
            stack.extend((ch, False) for ch in view.nodes[choice[c]].children if ch not in done)
    return order


def _reachable_classes(view: EGraphView, roots: list[int], costs: list[float]) -> set[int]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for i in view.classes[c].nodes:
            if costs[i] < math.inf:
                stack.extend(view.nodes[i].children)
    return seen
