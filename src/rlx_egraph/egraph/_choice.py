"""Extraction's passes over the flat e-graph: the classes' positions, the least tree-cost choice, greedy's start
and the DAG cost of a choice (see :mod:`rlx_egraph.egraph.extract`).

The positions and the tree choice are the two Dijkstra-like bottom-up passes (Knuth's generalisation), on a heap
of (key, id) pairs popped least first; floating-point sums are taken in a fixed order, so the same e-graph
always gives the same result.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence

try:
    import cython
except ModuleNotFoundError:  # Cython compiles this module; the module runs without it
    from .. import _cython_shim as cython

from ._flat import FlatEGraph, Heap, copy_ints, flag_array, float_array, int_array

COMPILED: bool = cython.compiled


def settle_positions(g: FlatEGraph, start: Iterable[float], final: Iterable[bool],
                     costs: Sequence[float] | None = None) -> list[float]:
    """The positions of :func:`rlx_egraph.egraph.extract.class_positions` from the ``start`` positions of the
    classes that are ``final`` already (leaves, input-graph classes): every other class gets the least over
    its e-nodes (those of finite ``costs``; all when None) of its highest child's position plus 1/2."""
    out = array("d", start)
    pos: cython.double[::1] = out
    done: cython.char[::1] = array("b", final)
    pending: cython.int[::1] = g.distinct_children()
    priced: cython.bint = costs is not None
    cost: cython.double[::1] = array("d", costs) if priced else float_array(0, 0.0)
    heap: Heap = Heap(g.num_nodes)
    n: cython.int
    c: cython.int
    for n in range(g.num_nodes):
        if pending[n] == 0:
            _offer_position(g, n, pos, done, cost, priced, heap)
    for c in range(g.num_classes):
        if done[c]:
            _settle(g, c, pending, pos, done, cost, priced, heap)
    while heap.size > 0:
        c = heap.ids[0]
        key: cython.double = heap.keys[0]
        heap.pop()
        if not done[c]:
            pos[c], done[c] = key, True
            _settle(g, c, pending, pos, done, cost, priced, heap)
    return out.tolist()


@cython.cfunc
def _offer_position(g: FlatEGraph, n: cython.int, pos: cython.double[::1], done: cython.char[::1],
                    cost: cython.double[::1], priced: cython.bint, heap: Heap) -> cython.void:
    """All children of e-node ``n`` have their position: offer its class one."""
    c: cython.int = g.eclass[n]
    k: cython.int
    highest: cython.double = -1.0
    if done[c] or (priced and not cost[n] < math.inf):
        return
    for k in range(g.child_start[n], g.child_start[n + 1]):
        if pos[g.child[k]] > highest:
            highest = pos[g.child[k]]
    heap.push(highest + 0.5, c)


@cython.cfunc
def _settle(g: FlatEGraph, c: cython.int, pending: cython.int[::1], pos: cython.double[::1],
            done: cython.char[::1], cost: cython.double[::1], priced: cython.bint, heap: Heap) -> cython.void:
    k: cython.int
    p: cython.int
    for k in range(g.parent_start[c], g.parent_start[c + 1]):
        p = g.parent[k]
        pending[p] -= 1
        if pending[p] == 0:
            _offer_position(g, p, pos, done, cost, priced, heap)


def tree_choice(g: FlatEGraph, costs: Iterable[float]) -> tuple[dict[int, int], dict[int, float]]:
    """Knuth-style bottom-up pass: per class the e-node of least tree cost (an e-node's own cost plus its
    distinct children's tree costs, added in ascending class order), as (class -> e-node, class -> cost)
    for the classes that have one; ties go to the lower e-node index."""
    costs_out = float_array(g.num_classes, 0.0)
    best_cost: cython.double[::1] = costs_out
    best_node: cython.int[::1] = _tree_choice(g, array("d", costs), best_cost)
    return ({c: best_node[c] for c in range(g.num_classes) if best_node[c] >= 0},
            {c: best_cost[c] for c in range(g.num_classes) if best_node[c] >= 0})


@cython.cfunc
def _tree_choice(g: FlatEGraph, cost: cython.double[::1], best_cost: cython.double[::1]) -> object:
    """:func:`tree_choice` as arrays: per class its e-node (-1: none), and its cost in ``best_cost``."""
    out = int_array(g.num_classes, -1)
    best_node: cython.int[::1] = out
    pending: cython.int[::1] = g.distinct_children()
    reads: cython.int[::1] = int_array(16, 0)
    heap: Heap = Heap(g.num_nodes)
    n: cython.int
    c: cython.int
    k: cython.int
    p: cython.int
    j: cython.int
    i: cython.int
    width: cython.int
    item: cython.int
    total: cython.double
    for c in range(g.num_classes):
        best_cost[c] = 0.0
    for n in range(g.num_nodes):
        if pending[n] == 0 and cost[n] < math.inf:
            heap.push(cost[n], n)
    while heap.size > 0:
        n = heap.ids[0]
        total = heap.keys[0]
        heap.pop()
        c = g.eclass[n]
        if best_node[c] >= 0:
            continue
        best_cost[c], best_node[c] = total, n
        for k in range(g.parent_start[c], g.parent_start[c + 1]):
            p = g.parent[k]
            pending[p] -= 1
            if pending[p] == 0 and cost[p] < math.inf and best_node[g.eclass[p]] < 0:
                width = g.child_start[p + 1] - g.child_start[p]
                if width > len(reads):
                    reads = int_array(width, 0)
                for j in range(width):  # insertion sort: the children in ascending class order
                    item = g.child[g.child_start[p] + j]
                    i = j
                    while i > 0 and reads[i - 1] > item:
                        reads[i] = reads[i - 1]
                        i -= 1
                    reads[i] = item
                total = 0.0
                for j in range(width):
                    if j == 0 or reads[j] != reads[j - 1]:
                        total += best_cost[reads[j]]
                heap.push(cost[p] + total, p)
    return out


class ClassChoice:
    """An e-node per class as an array (-1: none), read like a dict of class -> e-node: greedy's starts, passed
    between the passes without making a dict of every class."""

    def __init__(self) -> None:
        self.node = int_array(0, 0)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __contains__(self, c: object) -> bool:
        return 0 <= c < len(self.node) and self.node[c] >= 0

    def __getitem__(self, c: int) -> int:
        if c not in self:
            raise KeyError(c)
        return self.node[c]

    def keys(self) -> list[int]:
        return [c for c in range(len(self.node)) if self.node[c] >= 0]

    def items(self) -> list[tuple[int, int]]:
        return [(c, self.node[c]) for c in range(len(self.node)) if self.node[c] >= 0]

    def to_dict(self) -> dict[int, int]:
        return {c: self.node[c] for c in range(len(self.node)) if self.node[c] >= 0}

    def __eq__(self, other: object) -> bool:
        c: cython.Py_ssize_t
        if type(other) is ClassChoice:
            that: ClassChoice = other
            if len(self.node) != len(that.node):
                return False
            for c in range(len(self.node)):
                if self.node[c] != that.node[c]:
                    return False
            return True
        return isinstance(other, dict) and self.to_dict() == other

    __hash__ = None


def class_choice(node: object) -> ClassChoice:
    """A :class:`ClassChoice` holding ``node`` (an int array per class, -1: none)."""
    out: ClassChoice = ClassChoice.__new__(ClassChoice)
    nodes: cython.int[::1] = node
    c: cython.Py_ssize_t
    out.node = node
    out.count = 0
    for c in range(len(nodes)):
        out.count += nodes[c] >= 0
    return out


def choice_array(g: FlatEGraph, choice: object) -> object:
    """``choice`` (a :class:`ClassChoice`, or a mapping of class -> e-node) as a new int array per class (-1:
    none); raises ValueError for an e-node that is not its class's."""
    c: cython.int
    n: cython.int
    if type(choice) is ClassChoice:
        given: ClassChoice = choice
        out = copy_ints(given.node)
        nodes: cython.int[::1] = out
        for c in range(len(nodes)):
            n = nodes[c]
            if n >= 0 and not (n < g.num_nodes and g.eclass[n] == c):
                raise ValueError(f"the choice gives class {c} e-node {n}, which is not one of its e-nodes")
        return out
    out = int_array(g.num_classes, -1)
    chosen: cython.int[::1] = out
    for c, n in choice.items():
        if not (0 <= c < g.num_classes and 0 <= n < g.num_nodes and g.eclass[n] == c):
            raise ValueError(f"the choice gives class {c} e-node {n}, which is not one of its e-nodes")
        chosen[c] = n
    return out


def start_choice(g: FlatEGraph, costs: Iterable[float], pos: Iterable[float],
                 original: Iterable[bool]) -> tuple[ClassChoice, ClassChoice]:
    """Greedy's starting point, from the e-nodes computed from classes strictly below their own (by ``pos``):
    per class its first input-graph e-node (``original``: a flag per e-node) among them, else its least
    tree-cost one.  Returns (class -> e-node, class -> its least tree-cost e-node), for the classes that have
    one, as :class:`ClassChoice`.  When rules merged several input-graph nodes into one class, only the lowest
    one is computed from classes below it, and it is the one taken."""
    monotone: cython.double[::1] = array("d", costs)
    position: cython.double[::1] = array("d", pos)
    is_original: cython.char[::1] = array("b", original)
    unused: cython.double[::1] = float_array(g.num_classes, 0.0)
    n: cython.int
    c: cython.int
    k: cython.int
    for n in range(g.num_nodes):
        for k in range(g.child_start[n], g.child_start[n + 1]):
            if not position[g.child[k]] < position[g.eclass[n]]:
                monotone[n] = math.inf
    tree_array = _tree_choice(g, monotone, unused)
    tree: cython.int[::1] = tree_array
    choice_array = int_array(g.num_classes, -1)
    choice: cython.int[::1] = choice_array
    for c in range(g.num_classes):
        for k in range(g.member_start[c], g.member_start[c + 1]):
            n = g.member[k]
            if is_original[n] and monotone[n] < math.inf:
                choice[c] = n
                break
        if choice[c] < 0:
            choice[c] = tree[c]
    return class_choice(choice_array), class_choice(tree_array)


def drop_unreachable(g: FlatEGraph, choice: ClassChoice | Mapping[int, int]) -> ClassChoice:
    """``choice`` without the classes whose chosen e-node reads a class that has no choice, nor, in turn,
    the classes whose chosen e-node reads one of those (so every walk down a choice ends at leaves)."""
    out = choice_array(g, choice)
    chosen: cython.int[::1] = out
    stack: cython.int[::1] = int_array(g.num_classes + len(g.parent), 0)  # each class, then each of its readers
    top: cython.Py_ssize_t = 0
    c: cython.int
    n: cython.int
    k: cython.int
    p: cython.int
    for c in range(g.num_classes):
        n = chosen[c]
        if n >= 0:
            for k in range(g.child_start[n], g.child_start[n + 1]):
                if chosen[g.child[k]] < 0:
                    stack[top] = c
                    top += 1
                    break
    while top > 0:
        top -= 1
        c = stack[top]
        if chosen[c] < 0:
            continue
        chosen[c] = -1
        for k in range(g.parent_start[c], g.parent_start[c + 1]):  # the classes whose choice reads c
            p = g.parent[k]
            if chosen[g.eclass[p]] == p:
                stack[top] = g.eclass[p]
                top += 1
    return class_choice(out)


def dag_cost(g: FlatEGraph, choice: dict[int, int], roots: Iterable[int], costs: Sequence[float]) -> float:
    """The sum of ``costs`` over the classes reachable from ``roots`` under ``choice`` (class -> e-node), each
    once, walked depth first (roots, then children, pushed in order, the last popped first: the order of the
    float sum is fixed).  Raises KeyError for a reached class without a choice."""
    chosen: cython.int[::1] = int_array(g.num_classes, -1)
    seen: cython.char[::1] = flag_array(g.num_classes, 0)
    cost: cython.double[::1] = array("d", costs)
    root_array = array("i", roots)
    stack: cython.int[::1] = int_array(len(root_array) + len(g.child), 0)  # the roots, then each class's children
    top: cython.Py_ssize_t = 0
    total: cython.double = 0.0
    c: cython.int
    n: cython.int
    k: cython.int
    for c, n in choice.items():
        if not (0 <= c < g.num_classes and 0 <= n < g.num_nodes and g.eclass[n] == c):
            raise ValueError(f"the choice gives class {c} e-node {n}, which is not one of its e-nodes")
        chosen[c] = n
    for c in root_array:
        stack[top] = c
        top += 1
    while top > 0:
        top -= 1
        c = stack[top]
        if seen[c]:
            continue
        seen[c] = 1
        n = chosen[c]
        if n < 0:
            raise KeyError(c)
        total += cost[n]
        for k in range(g.child_start[n], g.child_start[n + 1]):
            stack[top] = g.child[k]
            top += 1
    return total


def least_per_class(class_of: dict[int, int], value_of: Mapping[int, float], num_classes: int) -> list[float]:
    """Per class the least ``value_of[key]`` over the keys of ``class_of`` (key -> class) in it, infinity for
    none."""
    out = float_array(num_classes, math.inf)
    least: cython.double[::1] = out
    c: cython.int
    value: cython.double
    for key, c in class_of.items():
        value = value_of[key]
        if value < least[c]:
            least[c] = value
    return out.tolist()
