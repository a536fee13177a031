"""Pricing over the flat e-graph: per e-node its cost, the target asked once per distinct signature (see
:func:`rlx_egraph.engines.egglog.extract.node_costs`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

try:
    import cython
except ModuleNotFoundError:  # Cython compiles this module; the module runs without it
    from ... import _cython_shim as cython

from ._flat import FlatEGraph, Memo, flags, float_array, ints
from ._rows import ENode

COMPILED: bool = cython.compiled

_INF = math.inf  # compiled: a C constant (_pricing.pxd)


def price_nodes(g: FlatEGraph, nodes: list[ENode], type_numbers: Iterable[int], leaf: Iterable[bool],
                price: Callable[[int, bool], float], prices_attributes: dict[str, tuple[bool, bool]]) -> list[float]:
    """Per e-node its cost: ``price(n, reads_intermediate)``, called once per (op, attributes, class type,
    whether it reads a class that is not a ``leaf`` (a flag per class), children's types), with
    ``type_numbers`` per class; the attributes only where ``prices_attributes[op][reads_intermediate]``.
    Infinity for an e-node that reads its own class (x = f(x) is never a way to compute x)."""
    numbers: cython.int[::1] = ints(type_numbers)
    is_leaf: cython.char[::1] = flags(leaf)
    out = float_array(g.num_nodes, 0.0)
    costs: cython.double[::1] = out
    n: cython.int
    k: cython.int
    c: cython.int
    signature: cython.int
    intermediate: cython.bint
    cyclic: cython.bint
    memo: Memo = Memo()
    priced: list = []  # per signature (its number in memo) its cost
    node: ENode
    for n in range(g.num_nodes):
        c = g.eclass[n]
        intermediate = cyclic = False
        for k in range(g.child_start[n], g.child_start[n + 1]):
            intermediate = intermediate or not is_leaf[g.child[k]]
            cyclic = cyclic or g.child[k] == c
        node = nodes[n]
        signature = memo.enode(g, node, n, numbers, 2 * numbers[c] + intermediate,
                               prices_attributes[node.op][intermediate])
        if signature == len(priced):
            priced.append(price(n, intermediate))
        costs[n] = _INF if cyclic else priced[signature]
    return out.tolist()
