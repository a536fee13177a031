"""Decoding's passes (see :func:`rlx_egraph.egraph.decode.decode`): the order the chosen classes are built in,
and the loop that makes the optimized graph's nodes."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Mapping
from typing import Any

try:
    import cython
except ModuleNotFoundError:  # Cython compiles this module; the module runs without it
    from .. import _cython_shim as cython

from ..ir.graph import Node
from ..ir.registry import Kind, ops_of_kind
from ._flat import FlatEGraph, Heap, float_array, int_array
from ._rows import EClass, ENode

COMPILED: bool = cython.compiled


def decode_order(g: FlatEGraph, wanted: dict[int, int], first: Iterable[float]) -> list[int]:
    """The order decoding builds the classes of ``wanted`` (class -> e-node) in: each once its e-node's children
    are built, the least sort key first, ties to the lower class.  A class's key is ``first[c]`` when that is
    finite (the position of its first input-graph node), else just above its children's keys (the highest plus
    1/2; -1/2 without children).  A class on a cycle of ``wanted``, or reading a class outside it, never
    comes: the order is then shorter than ``wanted``."""
    chosen: cython.int[::1] = int_array(g.num_classes, -1)
    pending: cython.int[::1] = int_array(g.num_classes, 0)
    seen: cython.int[::1] = int_array(g.num_classes, -1)
    position: cython.double[::1] = array("d", first)
    key: cython.double[::1] = float_array(g.num_classes, 0.0)
    heap: Heap = Heap(len(wanted))
    order: list = []
    c: cython.int
    n: cython.int
    k: cython.int
    p: cython.int
    pc: cython.int
    for c, n in wanted.items():
        if not (0 <= c < g.num_classes and 0 <= n < g.num_nodes and g.eclass[n] == c):
            raise ValueError(f"the choice gives class {c} e-node {n}, which is not one of its e-nodes")
        chosen[c] = n
        for k in range(g.child_start[n], g.child_start[n + 1]):
            if seen[g.child[k]] != c:
                seen[g.child[k]] = c
                pending[c] += 1
    for c in range(g.num_classes):
        if chosen[c] >= 0 and pending[c] == 0:
            _ready(g, c, chosen[c], position, key, heap)
    while heap.size > 0:
        c = heap.ids[0]
        heap.pop()
        order.append(c)
        for k in range(g.parent_start[c], g.parent_start[c + 1]):  # each reader e-node once
            p = g.parent[k]
            pc = g.eclass[p]
            if chosen[pc] == p:
                pending[pc] -= 1
                if pending[pc] == 0:
                    _ready(g, pc, p, position, key, heap)
    return order


@cython.cfunc
def _ready(g: FlatEGraph, c: cython.int, n: cython.int, position: cython.double[::1], key: cython.double[::1],
           heap: Heap) -> cython.void:
    """Class ``c``, whose e-node ``n``'s children all have their keys, gets its own, and goes on the heap."""
    k: cython.int
    highest: cython.double = -1.0
    if position[c] < math.inf:
        key[c] = position[c]
    else:
        for k in range(g.child_start[n], g.child_start[n + 1]):
            if key[g.child[k]] > highest:
                highest = key[g.child[k]]
        key[c] = highest + 0.5
    heap.push(key[c], c)


def decoded_nodes(order: list[int], wanted: dict[int, int], enodes: list[ENode], classes: list[EClass],
                  input_nodes: Mapping[int, Node], rechecked: frozenset[str], type_numbers: list[int],
                  check: Callable[[int, str, tuple[int, ...], dict[str, Any], list[Node]], Node]
                  ) -> tuple[list[Node], list[int], dict[int, int], dict[int, list[int]], dict[int, tuple[str, ...]],
                             dict[int, tuple[str, ...]], list[int]]:
    """The nodes of the optimized graph: class ``order[k]`` becomes node ``k``, computed by its e-node
    ``wanted[c]`` reading the nodes of its children's classes (each must come before it).

    An e-node that is an input-graph node (and not of an op in ``rechecked``, whose inputs' ops matter) copies
    that node (``input_nodes``: id -> Node), sharing its attributes dict as the rewriter's nodes do (a Node
    never changes): it was checked there and its children's classes have its inputs' types.  Any other is
    checked by ``check(id, op, inputs, attributes, nodes so far)`` (a Node, or raises) once per (op,
    attributes, children's ``type_numbers``, for ``rechecked`` ops the inputs' ops too), then copied from that
    first one with its own attributes dict; a leaf every time.  Returns the nodes, per class its node id (-1
    when not built), per node id (dicts) its class, its class's input-graph nodes, its e-node's rules and its
    class's merging rules, and the rule-made nodes (of e-nodes that are no input-graph node), in order."""
    nid: cython.Py_ssize_t
    k: cython.Py_ssize_t
    c: cython.Py_ssize_t
    child: cython.Py_ssize_t
    width: cython.Py_ssize_t
    new_id: list = [-1] * len(classes)
    nodes: list = []
    class_of: dict = {}
    originals: dict = {}
    built_by: dict = {}
    merged_by: dict = {}
    made: list = []
    checked: dict = {}  # signature -> the first node checked for it
    numbers: cython.int[::1] = array("i", type_numbers)
    children: tuple
    inputs: list
    key: list
    enode: ENode
    cls: EClass
    leaves = ops_of_kind(Kind.LEAF)
    for nid in range(len(order)):
        c = order[nid]
        enode = enodes[wanted[c]]
        cls = classes[c]
        children = enode.children
        width = len(children)
        inputs = [None] * width
        for k in range(width):
            child = children[k]
            item = new_id[child]
            if item < 0:
                raise RuntimeError(f"decode: class {c} reads class {child} before it is built")
            inputs[k] = item
        op, original = enode.op, enode.original
        if original is not None and op not in rechecked:
            was = input_nodes[original]
            node = Node(nid, was.op, tuple(inputs), was.attrs, was.shape, was.dtype, was.parts)
        elif op in leaves:
            node = check(nid, op, tuple(inputs), enode.attrs, nodes)
        else:
            key = [op, id(enode.attrs), 0]  # then the children's types, and a rechecked op's inputs' ops
            for k in range(width):
                child = children[k]
                key.append(numbers[child])
            if op in rechecked:
                for k in range(width):
                    key.append(nodes[inputs[k]].op)
            signature = tuple(key)
            seen = checked.get(signature)
            if seen is None:
                node = check(nid, op, tuple(inputs), enode.attrs, nodes)
                checked[signature] = node
            else:
                node = Node(nid, seen.op, tuple(inputs), dict(seen.attrs), seen.shape, seen.dtype, seen.parts)
        nodes.append(node)
        key_of = nid  # one int object for the five tables
        new_id[c] = key_of
        class_of[key_of] = c
        originals[key_of] = list(cls.originals)
        merged_by[key_of] = cls.merged_by
        built_by[key_of] = () if original is not None else enode.built_by
        if original is None:
            made.append(key_of)
    return nodes, new_id, class_of, originals, built_by, merged_by, made
