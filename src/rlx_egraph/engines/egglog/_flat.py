"""The e-graph as flat integer arrays (built once per view, see :meth:`rlx_egraph.engines.egglog.view.EGraphView.flat`),
and what the passes over it share: arrays made from Python sequences, a heap of (key, id) pairs and the memo that
numbers the passes' keys (e-node signatures).

Arrays are ``array.array`` objects; compiled (``_flat.pxd`` declares the fields), the passes read them through
typed memoryviews, as C arrays.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

try:
    import cython
except ModuleNotFoundError:  # Cython compiles this module; the module runs without it
    from ... import _cython_shim as cython

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


def long_array(size: cython.Py_ssize_t, fill: cython.longlong) -> object:
    return array("q", [fill]) * size


def copy_ints(source: cython.int[::1]) -> object:
    """A new array holding ``source``'s ints."""
    k: cython.Py_ssize_t
    out = int_array(len(source), 0)
    copy: cython.int[::1] = out
    for k in range(len(source)):
        copy[k] = source[k]
    return out


# Arrays made from Python values.  As Python, array's constructor is the quickest way; compiled, a typed loop is
# (the constructor parses every item as its format says, some 200 instructions each).

def ints(values: Iterable[int]) -> object:
    """A new int array holding ``values``."""
    if not cython.compiled:
        return array("i", values)
    items: list = values if type(values) is list else list(values)
    out = int_array(len(items), 0)
    view: cython.int[::1] = out
    k: cython.Py_ssize_t
    for k in range(len(items)):
        view[k] = items[k]
    return out


def doubles(values: Iterable[float]) -> object:
    """A new float array holding ``values``."""
    if not cython.compiled:
        return array("d", values)
    items: list = values if type(values) is list else list(values)
    out = float_array(len(items), 0.0)
    view: cython.double[::1] = out
    k: cython.Py_ssize_t
    for k in range(len(items)):
        view[k] = items[k]
    return out


def flags(values: Iterable[bool]) -> object:
    """A new array of flags holding ``values`` (bools)."""
    if not cython.compiled:
        return array("b", values)
    items: list = values if type(values) is list else list(values)
    out = flag_array(len(items), 0)
    view: cython.char[::1] = out
    k: cython.Py_ssize_t
    for k in range(len(items)):
        view[k] = items[k]
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


# The multipliers of Memo's hash (odd, below 2**63: C constants).
_MIX = 0x100000001B3
_SCRAMBLE = 0x5851F42D4C957F2D


@cython.final
@cython.cclass
class Memo:
    """Keys made of ints, each numbered in order of first sight (0, 1, 2, ...): a pass keeps what it computed
    for a key at the key's number.  A key is written word by word (:meth:`start`, then :meth:`add`), then
    :meth:`number` finds it, or numbers it (:attr:`count` grows); :meth:`enode` does all three for an e-node's
    signature.  Compiled, the keys live in C arrays, an open-addressing hash table that allocates nothing per
    key; as Python, in a dict of tuples.  Both number the same keys alike."""

    def __init__(self) -> None:
        self.count = 0
        self.width = 0
        self.key = long_array(8, 0)  # the key being written: key[:width]
        if cython.compiled:
            self.words = long_array(64, 0)  # the keys' words, one key after the other: words[:used]
            self.used = 0
            self.first = int_array(17, 0)  # per number, where its key starts in words; first[count] = used
            self.hashes = long_array(16, 0)  # per number, its key's hash
            self.slots = int_array(32, -1)  # the table: a number, or -1 (free); a power of two, at most half full
        else:
            self.numbers = {}  # key (a tuple) -> its number

    def start(self) -> cython.void:
        """Begin a key."""
        self.width = 0

    def add(self, word: cython.longlong) -> cython.int:
        """Append ``word`` to the key being written."""
        if self.width == len(self.key):
            self.key = _grown(self.key, self.width)
        self.key[self.width] = word
        self.width += 1
        return 0

    def number(self) -> cython.int:
        """The number of the key written."""
        k: cython.Py_ssize_t
        at: cython.Py_ssize_t
        found: cython.int
        h: cython.ulonglong = self.width
        if not cython.compiled:
            found = self.numbers.setdefault(tuple(self.key[: self.width]), self.count)
            if found == self.count:
                self.count += 1
            return found
        for k in range(self.width):
            h = (h ^ cython.cast(cython.ulonglong, self.key[k])) * _MIX
        h = (h ^ (h >> 29)) * _SCRAMBLE
        h ^= h >> 32
        code: cython.longlong = cython.cast(cython.longlong, h)
        at = code & (len(self.slots) - 1)
        while self.slots[at] >= 0:
            found = self.slots[at]
            if self.hashes[found] == code and self._holds(found):
                return found
            at = (at + 1) & (len(self.slots) - 1)
        return self._insert(code, at)

    def _holds(self, number: cython.int) -> cython.bint:
        """Whether key ``number`` is the key written (compiled only)."""
        k: cython.Py_ssize_t
        first: cython.Py_ssize_t = self.first[number]
        if self.first[number + 1] - first != self.width:
            return False
        for k in range(self.width):
            if self.words[first + k] != self.key[k]:
                return False
        return True

    def _insert(self, code: cython.longlong, at: cython.Py_ssize_t) -> cython.int:
        """Number the key written, its hash ``code``, at free slot ``at`` (compiled only)."""
        k: cython.Py_ssize_t
        number: cython.int = self.count
        while self.used + self.width > len(self.words):
            self.words = _grown(self.words, self.used)
        for k in range(self.width):
            self.words[self.used + k] = self.key[k]
        self.used += self.width
        if number + 1 == len(self.hashes):
            self.hashes = _grown(self.hashes, number + 1)
            bigger = int_array(2 * len(self.first), 0)
            first: cython.int[::1] = bigger
            first[: number + 1] = self.first[: number + 1]
            self.first = bigger
        self.hashes[number] = code
        self.first[number + 1] = self.used
        self.slots[at] = number
        self.count += 1
        if 2 * self.count > len(self.slots):
            self._rehash()
        return number

    def _rehash(self) -> cython.int:
        """Double the table (compiled only)."""
        number: cython.int
        at: cython.Py_ssize_t
        self.slots = int_array(2 * len(self.slots), -1)
        for number in range(self.count):
            at = self.hashes[number] & (len(self.slots) - 1)
            while self.slots[at] >= 0:
                at = (at + 1) & (len(self.slots) - 1)
            self.slots[at] = number
        return 0

    def enode(self, g: FlatEGraph, node: ENode, n: cython.int, numbers: cython.int[::1], extra: cython.longlong,
              with_attrs: cython.bint) -> cython.int:
        """The number of e-node ``n``'s signature: the identities of its op and of its attributes dict (e-nodes of
        equal attributes share one, see :func:`._rows.read_enodes`; 0 without ``with_attrs``), ``extra``, then its
        children's ``numbers``.  Identities are compared within one pass, while the e-nodes live."""
        k: cython.int
        self.start()
        self.add(address(node.op))
        self.add(address(node.attrs) if with_attrs else 0)
        self.add(extra)
        for k in range(g.child_start[n], g.child_start[n + 1]):
            self.add(numbers[g.child[k]])
        return self.number()


@cython.cfunc
def _grown(words: cython.longlong[::1], size: cython.Py_ssize_t) -> object:
    """A long array of twice the length of ``words``, its first ``size`` words copied."""
    bigger = long_array(2 * len(words), 0)
    view: cython.longlong[::1] = bigger
    view[:size] = words[:size]
    return bigger
