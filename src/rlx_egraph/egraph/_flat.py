"""The e-graph as flat integer arrays (built once per view, see :meth:`rlx_egraph.egraph.view.EGraphView.flat`),
and what the passes over it share: a heap of (key, id) pairs and the memo key of an e-node.

Arrays are ``array.array`` objects; compiled (``_flat.pxd`` declares the fields), the passes read them through
typed memoryviews, as C arrays.
"""

from __future__ import annotations

from array import array
from typing import Any

try:
    import cython
except ModuleNotFoundError:  # Cython compiles this module; the module runs without it
    from .. import _cython_shim as cython

from ._rows import ENode

COMPILED: bool = cython.compiled


def address(thing: object) -> cython.Py_ssize_t:
    """``thing``'s identity (``id``), for memo keys."""
    if cython.compiled:
        return cython.cast(cython.Py_ssize_t, cython.cast(cython.p_void, thing))
    return id(thing)


def int_array(size: cython.Py_ssize_t, fill: cython.int) -> object:
    return array("i", [fill]) * size


def float_array(size: cython.Py_ssize_t, fill: cython.double) -> object:
    return array("d", [fill]) * size


def flag_array(size: cython.Py_ssize_t, fill: cython.char) -> object:
    return array("b", [fill]) * size


def copy_ints(source: cython.int[::1]) -> object:
    """A new array holding ``source``'s ints."""
    k: cython.Py_ssize_t
    out = int_array(len(source), 0)
    copy: cython.int[::1] = out
    for k in range(len(source)):
        copy[k] = source[k]
    return out


class FlatEGraph:
    """An e-graph as flat arrays: per e-node its class and children (in order, repeats kept); per class its
    e-nodes and the e-nodes that read it (each reader once, in e-node order, as ``EGraphView.parents``)."""

    def __init__(self, view: Any) -> None:
        n: cython.int
        c: cython.int
        k: cython.Py_ssize_t
        at: cython.Py_ssize_t = 0
        node: ENode
        children: tuple
        members: list
        nodes: list = view.nodes
        classes: list = view.classes
        num_nodes: cython.int = len(nodes)
        num_classes: cython.int = len(classes)
        self.num_nodes, self.num_classes = num_nodes, num_classes
        total: cython.Py_ssize_t = 0
        for node in nodes:
            total += len(node.children)
        child_start: cython.int[::1] = int_array(num_nodes + 1, 0)
        child: cython.int[::1] = int_array(total, 0)
        eclass: cython.int[::1] = int_array(num_nodes, 0)
        for n in range(num_nodes):
            node = nodes[n]
            children = node.children
            for k in range(len(children)):
                child[at] = children[k]
                at += 1
            child_start[n + 1] = at
            eclass[n] = node.eclass
        member_start: cython.int[::1] = int_array(num_classes + 1, 0)
        member: cython.int[::1] = int_array(num_nodes, 0)
        at = 0
        for c in range(num_classes):
            members = classes[c].nodes
            for k in range(len(members)):
                member[at] = members[k]
                at += 1
            member_start[c + 1] = at
        seen: cython.int[::1] = int_array(num_classes, -1)  # the last e-node counted as a reader of each class
        parent_start: cython.int[::1] = int_array(num_classes + 1, 0)
        for n in range(num_nodes):
            for k in range(child_start[n], child_start[n + 1]):
                c = child[k]
                if seen[c] != n:
                    seen[c] = n
                    parent_start[c + 1] += 1
        for c in range(num_classes):
            parent_start[c + 1] += parent_start[c]
        parent: cython.int[::1] = int_array(parent_start[num_classes], 0)
        fill: cython.int[::1] = copy_ints(parent_start)
        seen = int_array(num_classes, -1)
        for n in range(num_nodes):
            for k in range(child_start[n], child_start[n + 1]):
                c = child[k]
                if seen[c] != n:
                    seen[c] = n
                    parent[fill[c]] = n
                    fill[c] += 1
        self.child_start, self.child, self.eclass = child_start, child, eclass
        self.member_start, self.member = member_start, member
        self.parent_start, self.parent = parent_start, parent

    def parents(self) -> list[list[int]]:
        """Per class, the list of e-nodes that read it (each reader once, in e-node order)."""
        c: cython.int
        out: list = [None] * self.num_classes
        for c in range(self.num_classes):
            out[c] = [self.parent[k] for k in range(self.parent_start[c], self.parent_start[c + 1])]
        return out

    def distinct_children(self) -> object:
        """Per e-node, how many distinct classes it reads (an int array)."""
        out = int_array(self.num_nodes, 0)
        count: cython.int[::1] = out
        seen: cython.int[::1] = int_array(self.num_classes, -1)
        n: cython.int
        k: cython.int
        for n in range(self.num_nodes):
            for k in range(self.child_start[n], self.child_start[n + 1]):
                if seen[self.child[k]] != n:
                    seen[self.child[k]] = n
                    count[n] += 1
        return out

    def signature(self, node: ENode, n: cython.int, numbers: cython.int[::1], extra: cython.longlong,
                  with_attrs: cython.bint) -> tuple:
        """E-node ``n``'s memo key: its op, the identity of its attributes dict (e-nodes of equal attributes share
        one, see :func:`._rows.read_enodes`; 0 without ``with_attrs``), ``extra``, then its children's
        ``numbers``.  Keys are compared within one pass, while the e-nodes live."""
        k: cython.int
        first: cython.int = self.child_start[n]
        width: cython.int = self.child_start[n + 1] - first
        attrs: cython.Py_ssize_t = address(node.attrs) if with_attrs else 0
        child: cython.int[::1] = self.child
        if width == 0:  # the usual widths as tuple displays (built in one step when compiled)
            return (node.op, attrs, extra)
        if width == 1:
            return (node.op, attrs, extra, numbers[child[first]])
        if width == 2:
            return (node.op, attrs, extra, numbers[child[first]], numbers[child[first + 1]])
        if width == 3:
            return (node.op, attrs, extra, numbers[child[first]], numbers[child[first + 1]],
                    numbers[child[first + 2]])
        key: list = [node.op, attrs, extra]
        for k in range(first, first + width):
            key.append(numbers[child[k]])
        return tuple(key)


class Heap:
    """A binary min-heap of (key, id) pairs, ordered by key, then id: its least pair is ``keys[0], ids[0]``."""

    def __init__(self, capacity: cython.Py_ssize_t) -> None:
        self.keys = float_array(max(capacity, 1), 0.0)
        self.ids = int_array(max(capacity, 1), 0)
        self.size = 0

    def push(self, key: cython.double, id: cython.int) -> cython.int:
        i: cython.Py_ssize_t = self.size
        parent: cython.Py_ssize_t
        if i == len(self.keys):
            self._grow()
        while i > 0:
            parent = (i - 1) // 2
            if self.keys[parent] < key or (self.keys[parent] == key and self.ids[parent] <= id):
                break
            self.keys[i], self.ids[i] = self.keys[parent], self.ids[parent]
            i = parent
        self.keys[i], self.ids[i] = key, id
        self.size += 1
        return 0

    def _grow(self) -> cython.int:
        keys = float_array(2 * len(self.keys), 0.0)
        ids = int_array(2 * len(self.ids), 0)
        new_keys: cython.double[::1] = keys
        new_ids: cython.int[::1] = ids
        new_keys[: self.size] = self.keys[: self.size]
        new_ids[: self.size] = self.ids[: self.size]
        self.keys, self.ids = keys, ids
        return 0

    def pop(self) -> cython.void:
        """Remove the least pair."""
        size: cython.Py_ssize_t = self.size - 1
        key: cython.double = self.keys[size]
        id: cython.int = self.ids[size]
        i: cython.Py_ssize_t = 0
        child: cython.Py_ssize_t
        self.size = size
        while True:
            child = 2 * i + 1
            if child >= size:
                break
            if child + 1 < size and (self.keys[child + 1] < self.keys[child]
                                     or (self.keys[child + 1] == self.keys[child]
                                         and self.ids[child + 1] < self.ids[child])):
                child += 1
            if key < self.keys[child] or (key == self.keys[child] and id <= self.ids[child]):
                break
            self.keys[i], self.ids[i] = self.keys[child], self.ids[child]
            i = child
        if size > 0:
            self.keys[i], self.ids[i] = key, id
