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
``exact`` solves the same problem as an integer program (HiGHS via scipy).
Both respect the run's deadline: greedy stops improving (its choice is valid
at every step), exact gets at most the time left.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cost import Target
from ..ir.registry import Kind, OpSpec, TensorType, TupleType
from .budget import Deadline, DeadlineExceeded
from .view import EGraphView

# A view of an intermediate (not a leaf) costs this much: never a real cost,
# only a tie-breaker that prefers reshaping inputs to reshaping results.
VIEW_TIE_NS = 1e-3
EPS = 1e-9


@dataclass
class Extraction:
    """Chosen e-node per class for the classes the outputs need."""

    choice: dict[int, int]
    cost_ns: float
    method: str
    seconds: float = 0.0
    moves: int = 0
    optimal: bool = False  # proven optimal (exact mode finished)
    notes: list[str] = field(default_factory=list)


def enode_ns(target: Target, spec: OpSpec, attrs: Mapping[str, Any], in_types: list[TensorType],
             out_type: TensorType, reads_intermediate: bool) -> float:
    """The per-node cost both engines minimise: ``Target.node_ns``, plus the view
    tie-breaker when a layout op reads an intermediate (not a leaf)."""
    cost = target.node_ns(spec, attrs, in_types, out_type)
    if spec.kind is Kind.LAYOUT and reads_intermediate:
        cost += VIEW_TIE_NS
    return cost


def node_costs(view: EGraphView, target: Target) -> list[float]:
    """:func:`enode_ns` of every e-node."""
    leaf_classes = {n.eclass for n in view.nodes if n.spec.kind is Kind.LEAF}
    costs = []
    for n in view.nodes:
        in_types = [view.classes[c].type for c in n.children]
        out_type = view.classes[n.eclass].type
        cost = enode_ns(target, n.spec, n.attrs, in_types, out_type,
                        any(c not in leaf_classes for c in n.children))
        if n.eclass in n.children:
            cost = math.inf  # x = f(x): never a way to compute x
        costs.append(cost)
    return costs


def dag_cost(view: EGraphView, choice: dict[int, int], roots: list[int], costs: list[float]) -> float:
    """Sum of node costs over the classes reachable from ``roots`` under ``choice``."""
    seen: set[int] = set()
    stack = list(roots)
    total = 0.0
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        n = choice[c]
        total += costs[n]
        stack.extend(view.nodes[n].children)
    return total


def _best_tree_choice(view: EGraphView, costs: list[float]) -> tuple[dict[int, int], dict[int, float]]:
    """Knuth-style bottom-up pass: per class the e-node of least tree cost."""
    parents = view.parents()
    pending = [len(set(n.children)) for n in view.nodes]
    best_cost: dict[int, float] = {}
    best_node: dict[int, int] = {}
    heap: list[tuple[float, int, int]] = []
    for n in view.nodes:
        if pending[n.index] == 0 and costs[n.index] < math.inf:
            heapq.heappush(heap, (costs[n.index], n.index, n.eclass))
    while heap:
        cost, idx, c = heapq.heappop(heap)
        if c in best_cost:
            continue
        best_cost[c], best_node[c] = cost, idx
        for p in parents[c]:
            pending[p] -= 1
            if pending[p] == 0 and costs[p] < math.inf and view.nodes[p].eclass not in best_cost:
                pn = view.nodes[p]
                total = costs[p] + sum(best_cost[ch] for ch in set(pn.children))
                heapq.heappush(heap, (total, p, pn.eclass))
    return best_node, best_cost


def class_positions(view: EGraphView, graph_position: dict[int, int]) -> list[float]:
    """A potential over classes: leaves -1, input-graph classes their graph position,
    new classes just above the inputs of their lowest e-node.

    Extraction only uses e-nodes whose children sit strictly below their class,
    so every choice is acyclic without searching for cycles.  Computed like
    Dijkstra's shortest paths (Knuth's generalisation: a class's position is the
    least over its e-nodes of the highest child's plus 1/2), so in O(E log E).
    """
    pos = [math.inf] * len(view.classes)
    final = [False] * len(view.classes)
    for cls in view.classes:
        if any(view.nodes[i].spec.kind is Kind.LEAF for i in cls.nodes):
            pos[cls.id], final[cls.id] = -1.0, True
        elif cls.originals:
            pos[cls.id], final[cls.id] = float(min(graph_position[o] for o in cls.originals)), True
    parents = view.parents()
    pending = [len(set(n.children)) for n in view.nodes]
    heap: list[tuple[float, int]] = []

    def reached(n: int) -> None:
        """All children of e-node ``n`` have their position: offer its class one."""
        node = view.nodes[n]
        if not final[node.eclass]:
            heapq.heappush(heap, (max((pos[ch] for ch in node.children), default=-1.0) + 0.5, node.eclass))

    def settle(c: int) -> None:
        for p in parents[c]:
            pending[p] -= 1
            if pending[p] == 0:
                reached(p)

    for n in view.nodes:
        if pending[n.index] == 0:
            reached(n.index)
    for c in range(len(view.classes)):
        if final[c]:
            settle(c)
    while heap:
        value, c = heapq.heappop(heap)
        if not final[c]:
            pos[c], final[c] = value, True
            settle(c)
    return pos


@dataclass
class _Log:
    """What a move changed, to undo it: reference-count steps (``d`` up, ``~d`` down), then switched choices."""

    refs: list[int] = field(default_factory=list)
    choices: list[tuple[int, int]] = field(default_factory=list)  # (class, its previous e-node)

    def extend(self, other: _Log) -> None:
        self.refs.extend(other.refs)
        self.choices.extend(other.choices)

    def classes(self) -> set[int]:
        """The classes whose reference count or choice the move changed."""
        return {d if d >= 0 else ~d for d in self.refs} | {c for c, _ in self.choices}


class _Solver:
    """Local search over a choice, with reference counts of needed classes."""

    def __init__(self, view: EGraphView, costs: list[float], choice: dict[int, int], roots: list[int],
                 pos: list[float]) -> None:
        self.view, self.costs, self.choice, self.roots, self.pos = view, costs, choice, roots, pos
        self.parents = view.parents()
        self.refs = [0] * len(view.classes)
        self.newly_live: list[int] = []
        self.read: list[int] = []  # classes the current attempt looked at without changing them
        # Usable: finite cost, every child has a choice and sits strictly below the node's class.
        self.usable = [costs[n.index] < math.inf and all(pos[ch] < pos[n.eclass] and ch in choice for ch in n.children)
                       for n in view.nodes]
        # A free e-node without children offers nothing that another class could share.
        self.free_leaf = [costs[n.index] == 0.0 and not n.children for n in view.nodes]
        for r in roots:
            self._incref(r, _Log())

    def _incref(self, c: int, log: _Log) -> float:
        delta = 0.0
        stack = [c]
        while stack:
            d = stack.pop()
            self.refs[d] += 1
            log.refs.append(d)
            if self.refs[d] == 1:
                self.newly_live.append(d)
                n = self.choice[d]
                delta += self.costs[n]
                stack.extend(self.view.nodes[n].children)
        return delta

    def _decref(self, c: int, log: _Log) -> float:
        delta = 0.0
        stack = [c]
        while stack:
            d = stack.pop()
            self.refs[d] -= 1
            log.refs.append(~d)
            if self.refs[d] == 0:
                n = self.choice[d]
                delta -= self.costs[n]
                stack.extend(self.view.nodes[n].children)
        return delta

    def switch(self, c: int, n: int, log: _Log) -> float:
        old = self.choice[c]
        self.choice[c] = n
        log.choices.append((c, old))
        delta = self.costs[n] - self.costs[old]
        for ch in self.view.nodes[n].children:
            delta += self._incref(ch, log)
        for ch in self.view.nodes[old].children:
            delta += self._decref(ch, log)
        return delta

    def undo(self, log: _Log) -> None:
        for d in log.refs:
            if d >= 0:
                self.refs[d] -= 1
            else:
                self.refs[~d] += 1
        for c, old in reversed(log.choices):
            self.choice[c] = old

    def improve(self, deadline: Deadline, max_passes: int = 6, max_group: int = 64) -> tuple[int, bool]:
        """Apply improving moves until none is left or ``deadline`` passes;
        returns how many were kept and whether the deadline stopped it.

        Passes sweep the live classes with alternatives in position order, up to
        ``max_passes``.  A pass visits only the classes whose last attempt read
        something that a kept move changed since (the others would fail again the
        same way), so it does what a sweep over every class does, in time
        proportional to the moves.
        """
        candidates = sorted((c for c in self.choice if len(self.view.classes[c].nodes) > 1),
                            key=lambda c: (self.pos[c], c))
        readers: dict[int, list[int]] = {}  # class -> ranks of the candidates whose last attempt read it
        this_pass = list(range(len(candidates)))  # a heap of ranks
        queued = set(this_pass)
        next_pass: set[int] = set()
        kept = 0
        for _ in range(max_passes):
            while this_pass:
                at = heapq.heappop(this_pass)
                queued.discard(at)
                if deadline.expired():
                    return kept, True
                c = candidates[at]
                self.read = [c]
                log = self._attempt(c, max_group)
                if log is None:
                    for d in self.read:
                        readers.setdefault(d, []).append(at)
                    continue
                kept += 1
                next_pass.add(at)
                for d in log.classes():
                    for r in readers.pop(d, ()):
                        if r > at and r not in queued:
                            heapq.heappush(this_pass, r)
                            queued.add(r)
                        elif r <= at:
                            next_pass.add(r)
            if not next_pass:
                break
            this_pass, queued, next_pass = sorted(next_pass), set(next_pass), set()
        return kept, False

    def _attempt(self, c: int, max_group: int) -> _Log | None:
        """Switch live class ``c`` to its cheapest e-node whose move pays; the kept move's log, or None."""
        if self.refs[c] == 0:
            return None
        for n in sorted(self.view.classes[c].nodes, key=lambda i: (self.costs[i], i)):
            if n != self.choice[c] and self.usable[n]:
                log = self._try_move(c, n, max_group)
                if log is not None:
                    return log
        return None

    def _try_move(self, c: int, n: int, max_group: int) -> _Log | None:
        log = _Log()
        self.newly_live = []
        old = self.choice[c]
        delta = self.switch(c, n, log)
        if delta < -EPS:
            return log
        # Group move: other classes that could read what this switch made live.
        group = 0
        for d in list(self.newly_live):
            if self.free_leaf[self.choice[d]]:
                continue
            for p in self.parents[d]:
                pc = self.view.nodes[p].eclass
                self.read.append(pc)
                if group >= max_group or pc == c or self.refs[pc] == 0 or self.choice.get(pc) == p \
                        or not self.usable[p]:
                    continue
                sub = _Log()
                step = self.switch(pc, p, sub)
                if step < -EPS:
                    log.extend(sub)
                    delta += step
                    group += 1
                else:
                    self.read.extend(sub.classes())
                    self.undo(sub)
        if delta < -EPS:
            return log
        delta += self._release(c, old, log)
        if delta < -EPS:
            return log
        self.read.extend(log.classes())
        self.undo(log)
        return None

    def _release(self, c: int, old: int, log: _Log) -> float:
        """Switching class ``c`` away from e-node ``old`` (a projection) leaves the multi-result class it
        read alive for its sibling projections: switch each sibling's class to its alternative of most
        gain too (kept in ``log``); returns the change of cost."""
        delta = 0.0
        for ch in self.view.nodes[old].children:
            if self.refs[ch] == 0 or not isinstance(self.view.classes[ch].type, TupleType):
                continue
            for p in self.parents[ch]:
                pc = self.view.nodes[p].eclass
                self.read.append(pc)
                if pc == c or self.refs[pc] == 0 or self.choice.get(pc) != p:
                    continue
                steps = []
                for alt in self.view.classes[pc].nodes:
                    if alt != p and self.usable[alt]:
                        sub = _Log()
                        steps.append((self.switch(pc, alt, sub), alt))
                        self.read.extend(sub.classes())
                        self.undo(sub)
                if steps:
                    delta += self.switch(pc, min(steps)[1], log)
        return delta


def greedy(view: EGraphView, roots: list[int], target: Target, graph_position: dict[int, int],
           costs: list[float] | None = None, deadline: Deadline | None = None) -> Extraction:
    """Deterministic DAG extraction: the input graph, improved by local and group moves
    until none is left or ``deadline`` passes (then the best choice so far is kept)."""
    start = time.perf_counter()
    costs = node_costs(view, target) if costs is None else costs
    pos = class_positions(view, graph_position)
    monotone = [c if all(pos[ch] < pos[n.eclass] for ch in n.children) else math.inf
                for n, c in zip(view.nodes, costs, strict=True)]
    tree_node, _ = _best_tree_choice(view, monotone)
    choice: dict[int, int] = {}
    for cls in view.classes:
        # When rules merged several input-graph nodes into one class, only the
        # lowest one is computed from classes below it.
        original = next((i for i in cls.nodes if view.nodes[i].original is not None and monotone[i] < math.inf),
                        None)
        pick = original if original is not None else tree_node.get(cls.id)
        if pick is not None:
            choice[cls.id] = pick
    missing = [r for r in roots if r not in choice]
    if missing:
        ops = sorted({view.nodes[i].op for r in missing for i in view.classes[r].nodes})
        raise ValueError(f"no supported way to compute an output on {target.name}: ops {ops} are unsupported")
    _drop_unreachable_cycles(view, choice)
    solver = _Solver(view, costs, choice, roots, pos)
    moves, stopped = solver.improve(deadline or Deadline())
    if not stopped:  # once more, with each class no longer needed back at its cheapest tree choice: a
        # later move that needs it again then finds it computed the cheap way, not the way it last was
        reset = [c for c in range(len(view.classes)) if solver.refs[c] == 0 and c in tree_node
                 and solver.choice.get(c, tree_node[c]) != tree_node[c]]
        for c in reset:
            solver.choice[c] = tree_node[c]
        if reset:
            more, stopped = solver.improve(deadline or Deadline())
            moves += more
    chosen = {c: solver.choice[c] for c in range(len(view.classes)) if solver.refs[c] > 0}
    notes = ["extraction stopped at the time limit with the best graph found so far"] if stopped else []
    return Extraction(chosen, dag_cost(view, chosen, roots, costs), "greedy", time.perf_counter() - start, moves,
                      notes=notes)


def _drop_unreachable_cycles(view: EGraphView, choice: dict[int, int]) -> None:
    """Keep only choices whose children all have choices (so every walk ends at leaves):
    drop every class whose chosen e-node reads a class without one, then its readers, and so on."""
    readers: dict[int, list[int]] = {}
    for c, n in choice.items():
        for ch in view.nodes[n].children:
            readers.setdefault(ch, []).append(c)
    stack = [c for c, n in choice.items() if any(ch not in choice for ch in view.nodes[n].children)]
    while stack:
        c = stack.pop()
        if choice.pop(c, None) is not None:
            stack.extend(readers.get(c, ()))


def exact(view: EGraphView, roots: list[int], target: Target, costs: list[float] | None = None,
          time_limit: float = 30.0, deadline: Deadline | None = None) -> Extraction:
    """Optimal DAG extraction as a mixed-integer program (acyclic, Tensat-style).

    The solver gets ``time_limit`` seconds, or what is left before ``deadline``;
    raises :class:`~.budget.DeadlineExceeded` if that is not enough for a solution.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array
    from scipy.sparse.csgraph import connected_components

    start = time.perf_counter()
    deadline = deadline or Deadline()
    deadline.check("exact extraction")
    costs = node_costs(view, target) if costs is None else costs
    reach = _reachable_classes(view, roots, costs)
    nodes = [n.index for c in sorted(reach) for n in map(view.nodes.__getitem__, view.classes[c].nodes)
             if costs[n.index] < math.inf and all(ch in reach for ch in n.children)]
    col = {n: i for i, n in enumerate(nodes)}
    classes = sorted(reach)
    # Only an edge inside a strongly connected component of the class graph can
    # lie on a cycle, so only those edges need ordering constraints.
    index = {c: i for i, c in enumerate(classes)}
    edges = [(index[view.nodes[n].eclass], index[ch]) for n in nodes for ch in view.nodes[n].children]
    if edges:
        src, dst = zip(*edges, strict=True)
        graph = coo_array((np.ones(len(edges)), (src, dst)), shape=(len(classes), len(classes)))
        component = connected_components(graph, directed=True, connection="strong")[1]
    else:
        component = np.arange(len(classes))
    tcol = {c: len(nodes) + i for i, c in enumerate(classes)}
    nvar = len(nodes) + len(classes)
    big = len(classes) + 1
    entries: list[tuple[int, int, float]] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(coeffs: dict[int, float], low: float, high: float) -> None:
        row = len(lo)
        entries.extend((row, j, v) for j, v in coeffs.items())
        lo.append(low)
        hi.append(high)

    members: dict[int, list[int]] = {c: [] for c in classes}
    for n in nodes:
        members[view.nodes[n].eclass].append(n)
    for c in classes:
        add({col[n]: 1.0 for n in members[c]}, 0.0, 1.0)
    for r in roots:
        add({col[n]: 1.0 for n in members[r]}, 1.0, 1.0)
    for n in nodes:
        node = view.nodes[n]
        for ch in set(node.children):
            coeffs = {col[m]: 1.0 for m in members[ch]}
            coeffs[col[n]] = coeffs.get(col[n], 0.0) - 1.0
            add(coeffs, 0.0, math.inf)
            if component[index[node.eclass]] == component[index[ch]]:
                # t[c] - t[ch] >= 1 - big * (1 - x[n])
                add({tcol[node.eclass]: 1.0, tcol[ch]: -1.0, col[n]: -float(big)}, 1.0 - big, math.inf)
    r, c, v = zip(*entries, strict=True) if entries else ((), (), ())
    a = coo_array((v, (r, c)), shape=(len(lo), nvar)).tocsr()
    objective = np.array([costs[n] for n in nodes] + [0.0] * len(classes))
    integrality = np.array([1] * len(nodes) + [0] * len(classes))
    bounds = Bounds(np.zeros(nvar), np.array([1.0] * len(nodes) + [float(big)] * len(classes)))
    deadline.check("exact extraction")
    limit = min(time_limit, deadline.remaining())
    res = milp(objective, constraints=LinearConstraint(a, lo, hi), integrality=integrality, bounds=bounds,
               options={"time_limit": limit})
    if res.x is None:
        if limit < time_limit:
            raise DeadlineExceeded(f"exact extraction found no solution within max_seconds={deadline.seconds:g}")
        raise RuntimeError(f"exact extraction found no solution: {res.message}")
    picked = {view.nodes[n].eclass: n for n in nodes if res.x[col[n]] > 0.5}
    chosen: dict[int, int] = {}
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c not in chosen:
            chosen[c] = picked[c]
            stack.extend(view.nodes[picked[c]].children)
    notes = [] if res.status == 0 else [f"exact extraction stopped after {limit:.1f} s with a solution not proven "
                                        f"optimal ({res.message})"]
    return Extraction(chosen, dag_cost(view, chosen, roots, costs), "exact", time.perf_counter() - start,
                      optimal=res.status == 0, notes=notes)


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
