"""Pricing over the flat e-graph: per e-node its cost, the target asked once per distinct signature (see
:func:`rlx_egraph.egraph.extract.node_costs`)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable

try:
    import cython
except ModuleNotFoundError:  # Cython compiles this module; the module runs without it
    from .. import _cython_shim as cython

from ._flat import FlatEGraph, float_array
from ._rows import ENode

COMPILED: bool = cython.compiled


def price_nodes(g: FlatEGraph, nodes: list[ENode], type_numbers: Iterable[int], leaf: Iterable[bool],
                price: Callable[[int, bool], float], prices_attributes: dict[str, tuple[bool, bool]]) -> list[float]:
    """Per e-node its cost: ``price(n, reads_intermediate)``, called once per (op, attributes, class type,
    whether it reads a class that is not a ``leaf`` (a flag per class), children's types), with
    ``type_numbers`` per class; the attributes only where ``prices_attributes[op][reads_intermediate]``.
    Infinity for an e-node that reads its own class (x = f(x) is never a way to compute x)."""
    numbers: cython.int[::1] = array("i", type_numbers)
    is_leaf: cython.char[::1] = array("b", leaf)
    out = float_array(g.num_nodes, 0.0)
    costs: cython.double[::1] = out
    n: cython.int
    k: cython.int
    c: cython.int
    intermediate: cython.bint
    cyclic: cython.bint
    memo: dict = {}
    cost: cython.double
    node: ENode
    for n in range(g.num_nodes):
        c = g.eclass[n]
        intermediate = cyclic = False
        for k in range(g.child_start[n], g.child_start[n + 1]):
            intermediate = intermediate or not is_leaf[g.child[k]]
            cyclic = cyclic or g.child[k] == c
        node = nodes[n]
        key = g.signature(node, n, numbers, 2 * numbers[c] + intermediate,
                         prices_attributes[node.op][intermediate])
        found = memo.get(key)
        if found is None:
            cost = price(n, intermediate)
            memo[key] = cost
        else:
            cost = found
        costs[n] = math.inf if cyclic else cost
    return out.tolist()
