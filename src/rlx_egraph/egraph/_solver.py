"""Greedy extraction's local search (see :func:`rlx_egraph.egraph.extract.greedy` for the strategy).

:class:`Solver` holds one e-node choice per class and, per class, how many live readers need it (the outputs
count as readers).  A move switches a class to another e-node, paying for the classes that become needed and
refunding those no longer needed; :meth:`Solver.improve` keeps the moves that pay.  Every step appends to a
:class:`Log` so that a move that does not pay is undone exactly.

The search reads the e-graph as flat arrays (children of each e-node, readers of each class, e-nodes of each
class) and holds no Python object: compiled, :meth:`Solver.improve` runs without the GIL, so two solvers search
at once.  The floating-point sums are taken in a fixed order, so the same e-graph always gives the same choices.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

try:
    import cython
except ModuleNotFoundError:  # Cython compiles this module; the module runs without it
    from .. import _cython_shim as cython

from ._choice import ClassChoice, choice_array
from ._flat import FlatEGraph, copy_ints, flag_array, float_array, int_array

COMPILED: bool = cython.compiled

EPS = 1e-9  # a move pays when it lowers the cost by more than this (float sums differ in the last digits)
MAX_RELEASED_READERS = 8  # a shared child is released from at most this many other readers
_EPS, _MAX_RELEASED_READERS = EPS, MAX_RELEASED_READERS  # compiled: C constants (see _solver.pxd)
_ATTEMPTS_PER_CLOCK = 16  # the local search reads the clock before every 16th attempt (the first included)


@cython.cfunc
@cython.nogil
@cython.exceptval(check=False)
def _now() -> cython.double:
    """A monotonic clock in seconds, readable without the GIL (compiled: ``rlx_monotonic_seconds`` in
    ``_solver.pxd``)."""
    if cython.compiled:
        return rlx_monotonic_seconds()  # noqa: F821  (declared in _solver.pxd)
    return time.perf_counter()


class IntVec:
    """A growable array of ints (``data[:size]``), appended to without the GIL (it takes the GIL to grow)."""

    def __init__(self, capacity: cython.Py_ssize_t = 8) -> None:
        self.data = int_array(max(capacity, 1), 0)
        self.size = 0

    def push(self, x: cython.int) -> cython.int:
        if self.size == len(self.data):
            self._grow()
        self.data[self.size] = x
        self.size += 1
        return 0

    def _grow(self) -> cython.int:
        """Double the capacity (kept apart from :meth:`push`, which the C compiler then inlines)."""
        with cython.gil:
            bigger = int_array(2 * len(self.data), 0)
            data: cython.int[::1] = bigger
            data[: self.size] = self.data[: self.size]
            self.data = bigger
        return 0

    def extend(self, other: IntVec) -> cython.int:
        k: cython.Py_ssize_t
        for k in range(other.size):
            self.push(other.data[k])
        return 0

    def tolist(self) -> list[int]:
        return [self.data[k] for k in range(self.size)]


class Log:
    """What a move changed, to undo it: reference-count steps (``d`` up, ``~d`` down), then switched
    choices as (class, its previous e-node)."""

    def __init__(self) -> None:
        self.steps, self.switched_class, self.switched_node = IntVec(), IntVec(), IntVec()

    @property
    def refs(self) -> list[int]:
        return self.steps.tolist()

    @property
    def choices(self) -> list[tuple[int, int]]:
        return [(self.switched_class.data[k], self.switched_node.data[k]) for k in range(self.switched_class.size)]

    def clear(self) -> cython.void:
        self.steps.size = self.switched_class.size = self.switched_node.size = 0

    def extend(self, other: Log) -> cython.int:
        self.steps.extend(other.steps)
        self.switched_class.extend(other.switched_class)
        self.switched_node.extend(other.switched_node)
        return 0


@cython.cfunc
@cython.nogil
@cython.exceptval(check=False)
def _contains(items: IntVec, x: cython.int) -> cython.bint:
    k: cython.Py_ssize_t
    for k in range(items.size):
        if items.data[k] == x:
            return True
    return False


@cython.cfunc
@cython.nogil
@cython.exceptval(-1, check=True)
def _add(ranks: IntVec, member: cython.char[::1], r: cython.int) -> cython.int:
    if not member[r]:
        member[r] = True
        ranks.push(r)
    return 0


# A binary max-heap of negated ranks on an IntVec (pops the least rank first).

@cython.cfunc
@cython.nogil
@cython.exceptval(-1, check=True)
def _push_heap(heap: IntVec, x: cython.int) -> cython.int:
    i: cython.Py_ssize_t = heap.size
    parent: cython.Py_ssize_t
    heap.push(x)
    while i > 0:
        parent = (i - 1) // 2
        if heap.data[parent] >= heap.data[i]:
            break
        heap.data[parent], heap.data[i] = heap.data[i], heap.data[parent]
        i = parent
    return 0


@cython.cfunc
@cython.nogil
@cython.exceptval(check=False)
def _pop_heap(heap: IntVec) -> cython.void:
    i: cython.Py_ssize_t = 0
    left: cython.Py_ssize_t
    largest: cython.Py_ssize_t
    n: cython.Py_ssize_t
    heap.size -= 1
    heap.data[0] = heap.data[heap.size]
    n = heap.size
    while True:
        left = 2 * i + 1
        largest = i
        if left < n and heap.data[left] > heap.data[largest]:
            largest = left
        if left + 1 < n and heap.data[left + 1] > heap.data[largest]:
            largest = left + 1
        if largest == i:
            return
        heap.data[largest], heap.data[i] = heap.data[i], heap.data[largest]
        i = largest


@cython.cfunc
@cython.nogil
@cython.exceptval(check=False)
def _before(keys: cython.double[::1], ids: cython.int[::1], a: cython.Py_ssize_t, b: cython.Py_ssize_t
            ) -> cython.bint:
    """Whether pair ``a`` comes before pair ``b`` by (key, id)."""
    return keys[a] < keys[b] or (keys[a] == keys[b] and ids[a] < ids[b])


@cython.cfunc
@cython.nogil
@cython.exceptval(check=False)
def _sift(keys: cython.double[::1], ids: cython.int[::1], at: cython.Py_ssize_t, end: cython.Py_ssize_t
          ) -> cython.void:
    """Heapsort's sift-down of pair ``at`` in the max-heap ``[0, end)``."""
    child: cython.Py_ssize_t
    while 2 * at + 1 < end:
        child = 2 * at + 1
        if child + 1 < end and _before(keys, ids, child, child + 1):
            child += 1
        if not _before(keys, ids, at, child):
            return
        keys[at], keys[child] = keys[child], keys[at]
        ids[at], ids[child] = ids[child], ids[at]
        at = child


@cython.cfunc
@cython.nogil
@cython.exceptval(check=False)
def _sort_pairs(keys: cython.double[::1], ids: cython.int[::1], size: cython.Py_ssize_t) -> cython.void:
    """Sort the pairs ``(keys[k], ids[k])``, ``k < size``, ascending (heapsort: no memory)."""
    k: cython.Py_ssize_t
    for k in range(size // 2, 0, -1):
        _sift(keys, ids, k - 1, size)
    for k in range(size - 1, 0, -1):
        keys[0], keys[k] = keys[k], keys[0]
        ids[0], ids[k] = ids[k], ids[0]
        _sift(keys, ids, 0, k)


class Solver:
    """Local search over a choice (``choice``: class -> e-node) with reference counts of needed classes.

    ``pos`` orders the classes: only e-nodes whose children all sit strictly below their class are
    usable, so no move closes a cycle.  ``roots`` are the classes the outputs need.
    """

    def __init__(self, view: Any, costs: Sequence[float], choice: ClassChoice | Mapping[int, int],
                 roots: Iterable[int], pos: Sequence[float]) -> None:
        n: cython.int
        c: cython.int
        k: cython.int
        widest: cython.int = 1
        g: FlatEGraph = view.flat()
        self.view = view
        self.switches = 0
        self.child, self.child_start, self.parent, self.parent_start = g.child, g.child_start, g.parent, g.parent_start
        self.member, self.member_start, self.eclass = g.member, g.member_start, g.eclass
        if len(costs) != g.num_nodes or len(pos) != g.num_classes:
            raise ValueError(f"{len(costs)} costs and {len(pos)} positions for {g.num_nodes} e-nodes and "
                             f"{g.num_classes} classes")
        self.costs = float_array(g.num_nodes, 0.0)
        self.pos = float_array(g.num_classes, 0.0)
        for n in range(g.num_nodes):
            self.costs[n] = costs[n]
        for c in range(g.num_classes):
            self.pos[c] = pos[c]
            widest = max(widest, g.member_start[c + 1] - g.member_start[c])
        # Per class its e-nodes, cheapest first (ties by index): the order moves are tried in, sorted on a
        # class's first attempt (the FusionReport's solver never attempts a move).
        self.by_cost = copy_ints(g.member)
        self.ranked = flag_array(g.num_classes, 0)
        self.rank_keys = float_array(widest, 0.0)  # scratch of _rank
        self.rank_ids = int_array(widest, 0)
        self.choice = choice_array(g, choice)
        self.refs_ = int_array(g.num_classes, 0)
        self.stamp = int_array(g.num_classes, 0)
        self.stamp_now = 0
        self.move_log, self.group_log, self.release_log, self.trial_log = Log(), Log(), Log(), Log()
        self.newly_live, self.read, self.work, self.brought = IntVec(), IntVec(), IntVec(), IntVec()
        self.seen = IntVec()
        self.reader_class, self.reader_node, self.alt_start, self.alts = IntVec(), IntVec(), IntVec(), IntVec()
        self.candidates, self.pending = IntVec(), IntVec()
        self.reader_head = int_array(g.num_classes, -1)
        self.reader_tail = int_array(g.num_classes, -1)
        self.reader_next, self.reader_rank, self.reader_free = IntVec(), IntVec(), -1
        self.is_pending = flag_array(0, 0)
        self.searched = False
        # Usable: finite cost, every child has a choice and sits strictly below the node's class.
        self.usable = flag_array(g.num_nodes, 0)
        self.free_leaf = flag_array(g.num_nodes, 0)
        for n in range(g.num_nodes):
            c = self.eclass[n]
            self.usable[n] = self.costs[n] < math.inf
            for k in range(self.child_start[n], self.child_start[n + 1]):
                if not (self.pos[self.child[k]] < self.pos[c] and self.choice[self.child[k]] >= 0):
                    self.usable[n] = False
            # A free e-node without children offers nothing that another class could share.
            self.free_leaf[n] = self.costs[n] == 0.0 and self.child_start[n] == self.child_start[n + 1]
        for r in roots:
            self._check_class(r)
            self._incref(r, self.trial_log)
        self.trial_log.clear()

    # --- what Python reads ---------------------------------------------------------------------

    @property
    def refs(self) -> list[int]:
        """Per class, how many live readers (or outputs) need it (0: not needed)."""
        return [self.refs_[c] for c in range(len(self.refs_))]

    def needed(self, c: cython.int) -> int:
        """How many live readers (or outputs) need class ``c``."""
        self._check_class(c)
        return self.refs_[c]

    def chosen(self, c: cython.int) -> int:
        """Class ``c``'s e-node, -1 when it has none."""
        self._check_class(c)
        return self.choice[c]

    def set_choice(self, c: cython.int, n: cython.int) -> None:
        """Give class ``c``, which nothing needs, e-node ``n`` (a later move that needs it starts there)."""
        self._check_member(c, n)
        if self.refs_[c] != 0:
            raise ValueError(f"class {c} is needed: only a move may change its choice")
        self.choice[c] = n

    def _check_class(self, c: cython.int) -> cython.int:
        if not 0 <= c < len(self.choice):
            raise IndexError(f"class {c} is not in the e-graph ({len(self.choice)} classes)")
        return 0

    def _check_member(self, c: cython.int, n: cython.int) -> cython.int:
        self._check_class(c)
        if not 0 <= n < len(self.eclass) or self.eclass[n] != c:
            raise ValueError(f"e-node {n} is not an e-node of class {c}")
        return 0

    def restart(self, start: ClassChoice | Mapping[int, int]) -> int:
        """Give every class that nothing needs and that has a choice its e-node in ``start`` (a later move that
        needs it again finds it there); returns how many changed.  The next :meth:`improve` attempts first the
        classes whose last attempt read a changed class (the others would fail again the same way)."""
        c: cython.int
        n: cython.int
        changed: cython.int = 0
        size: cython.int = len(self.choice)
        if type(start) is ClassChoice:  # read as its array, in class order
            given: ClassChoice = start
            for c in range(min(len(given.node), size)):
                if given.node[c] >= 0:
                    changed += self._restart_class(c, given.node[c])
            for c in range(size, len(given.node)):
                if given.node[c] >= 0:
                    self._check_class(c)
            return changed
        for c, n in start.items():
            changed += self._restart_class(c, n)
        return changed

    def _restart_class(self, c: cython.int, n: cython.int) -> cython.int:
        """:meth:`restart` for class ``c`` and its e-node ``n`` in the start; 1 when ``c`` changed, else 0."""
        i: cython.int
        self._check_member(c, n)
        if self.refs_[c] != 0 or self.choice[c] < 0 or self.choice[c] == n:
            return 0
        self.choice[c] = n
        if self.searched:
            i = self.reader_head[c]
            while i >= 0:
                _add(self.pending, self.is_pending, self.reader_rank.data[i])
                i = self.reader_next.data[i]
            self._clear_readers(c)
        return 1

    def live_choices(self) -> dict[int, int]:
        """Class -> its e-node, for the classes something needs (the extracted graph)."""
        return {c: self.choice[c] for c in range(len(self.choice)) if self.refs_[c] > 0}

    def choices(self) -> dict[int, int]:
        """Class -> its e-node, for the classes that have one."""
        return {c: self.choice[c] for c in range(len(self.choice)) if self.choice[c] >= 0}

    # --- the readers each attempt read (per class, linked lists in two arrays, with a free list) -------------

    def _note_reader(self, d: cython.int, rank: cython.int) -> cython.int:
        """Note the attempt at ``rank`` as a reader of class ``d``."""
        i: cython.int = self.reader_free
        if i >= 0:
            self.reader_free = self.reader_next.data[i]
            self.reader_next.data[i] = -1
            self.reader_rank.data[i] = rank
        else:
            i = self.reader_rank.size
            self.reader_rank.push(rank)
            self.reader_next.push(-1)
        if self.reader_head[d] < 0:
            self.reader_head[d] = i
        else:
            self.reader_next.data[self.reader_tail[d]] = i
        self.reader_tail[d] = i
        return 0

    def _clear_readers(self, d: cython.int) -> cython.void:
        if self.reader_head[d] >= 0:
            self.reader_next.data[self.reader_tail[d]] = self.reader_free
            self.reader_free = self.reader_head[d]
            self.reader_head[d] = self.reader_tail[d] = -1

    # --- reference counts --------------------------------------------------------------------

    def _incref(self, c: cython.int, log: Log) -> cython.double:
        return self._count(c, log, 1)

    def _decref(self, c: cython.int, log: Log) -> cython.double:
        return self._count(c, log, -1)

    def _count(self, c: cython.int, log: Log, step: cython.int) -> cython.double:
        """Class ``c`` gains (``step`` 1) or loses (-1) a reader: a class that becomes needed needs its chosen
        e-node's children in turn, one that no longer is needed lets them go.  Returns the change of cost."""
        delta: cython.double = 0.0
        d: cython.int
        n: cython.int
        k: cython.int
        self.work.size = 0  # the classes to count (never nested: one scratch stack)
        self.work.push(c)
        while self.work.size > 0:
            self.work.size -= 1
            d = self.work.data[self.work.size]
            self.refs_[d] += step
            log.steps.push(d if step > 0 else ~d)
            if self.refs_[d] == (1 if step > 0 else 0):
                n = self.choice[d]
                if n < 0:
                    with cython.gil:
                        raise KeyError(f"class {d} is needed but has no e-node")
                if step > 0:
                    self.newly_live.push(d)
                    delta += self.costs[n]
                else:
                    delta -= self.costs[n]
                for k in range(self.child_start[n], self.child_start[n + 1]):
                    self.work.push(self.child[k])
        return delta

    def switch(self, c: cython.int, n: cython.int, log: Log) -> float:
        """Choose e-node ``n`` of class ``c`` for it (recorded in ``log``); returns the change of the DAG cost."""
        self._check_member(c, n)
        if self.choice[c] < 0:
            raise KeyError(f"class {c} has no e-node to switch from")
        return self._switch(c, n, log)

    def _switch(self, c: cython.int, n: cython.int, log: Log) -> cython.double:
        old: cython.int = self.choice[c]
        k: cython.int
        delta: cython.double
        self.switches += 1
        self.choice[c] = n
        log.switched_class.push(c)
        log.switched_node.push(old)
        delta = self.costs[n] - self.costs[old]
        for k in range(self.child_start[n], self.child_start[n + 1]):
            delta += self._incref(self.child[k], log)
        for k in range(self.child_start[old], self.child_start[old + 1]):
            delta += self._decref(self.child[k], log)
        return delta

    def undo(self, log: Log) -> None:
        """Take back every step of ``log``."""
        self._undo(log)

    def _undo(self, log: Log) -> cython.void:
        d: cython.int
        k: cython.Py_ssize_t
        for k in range(log.steps.size):
            d = log.steps.data[k]
            if d >= 0:
                self.refs_[d] -= 1
            else:
                self.refs_[~d] += 1
        for k in range(log.switched_class.size, 0, -1):
            self.choice[log.switched_class.data[k - 1]] = log.switched_node.data[k - 1]

    def _read_log(self, log: Log) -> cython.int:
        """Note every class ``log`` changed as read by the current attempt."""
        d: cython.int
        k: cython.Py_ssize_t
        for k in range(log.steps.size):
            d = log.steps.data[k]
            self.read.push(d if d >= 0 else ~d)
        for k in range(log.switched_class.size):
            self.read.push(log.switched_class.data[k])
        return 0

    # --- the search ----------------------------------------------------------------------------

    def improve(self, deadline: Any, max_passes: cython.int = 6, max_group: cython.int = 64) -> tuple[int, bool]:
        """Apply improving moves until none is left or ``deadline`` passes;
        returns how many were kept and whether the deadline stopped it.

        Passes sweep the live classes with alternatives in position order, up to
        ``max_passes``.  A pass visits only the classes whose last attempt read
        something that a kept move changed since (the others would fail again the
        same way), so it does what a sweep over every class does, in time
        proportional to the moves.  A later call goes on from there: its first pass
        visits the classes left for it (by the pass limit, the deadline, or
        :meth:`restart`), as a sweep over every class would do.  ``deadline``: a
        :class:`~rlx_egraph.egraph.budget.Deadline`, read as its ``end`` on
        ``time.perf_counter``'s clock; compiled, the search runs without the GIL.
        """
        kept: cython.int = 0
        end: cython.double
        if not self.searched:
            self._rank_candidates()
        heap: IntVec = IntVec(self.candidates.size + 1)  # ranks of a pass, as a max-heap of negated ranks
        queued: cython.char[::1] = flag_array(self.candidates.size, 0)  # per rank, whether it is on the heap
        end = _now() + (deadline.end - time.perf_counter())  # the deadline on _now's clock
        with cython.nogil:  # the search touches no Python object: another thread can search meanwhile
            kept = self._improve(end, max_passes, max_group, heap, queued)
        return kept, self.stopped

    def _improve(self, end: cython.double, max_passes: cython.int, max_group: cython.int, heap: IntVec,
                 queued: cython.char[::1]) -> cython.int:
        """:meth:`improve` until ``end`` (on :func:`_now`'s clock); returns the moves kept, and notes in
        ``stopped`` whether the deadline stopped it."""
        at: cython.int
        c: cython.int
        d: cython.int
        k: cython.Py_ssize_t
        i: cython.int
        _pass: cython.int
        moved: cython.int
        kept: cython.int = 0
        attempts: cython.long = 0
        self.stopped = False
        for _pass in range(max_passes):
            _sort_ints(self.pending)
            heap.size = 0
            for k in range(self.pending.size):  # descending negated ranks: already a heap
                heap.push(-self.pending.data[k])
                queued[self.pending.data[k]] = True
                self.is_pending[self.pending.data[k]] = False
            self.pending.size = 0
            if heap.size == 0:
                break
            while heap.size > 0:
                at = -heap.data[0]
                if attempts % _ATTEMPTS_PER_CLOCK == 0 and _now() >= end:
                    for k in range(heap.size):  # left for a later call
                        _add(self.pending, self.is_pending, -heap.data[k])
                    self.stopped = True
                    return kept
                _pop_heap(heap)
                queued[at] = False
                attempts += 1
                c = self.candidates.data[at]
                self.read.size = 0
                self.read.push(c)
                moved = self._attempt(c, max_group)
                if not moved:
                    self.stamp_now += 1
                    for k in range(self.read.size):
                        d = self.read.data[k]
                        if self.stamp[d] != self.stamp_now:  # each reader once
                            self.stamp[d] = self.stamp_now
                            self._note_reader(d, at)
                    continue
                kept += 1
                _add(self.pending, self.is_pending, at)
                self.stamp_now += 1
                for k in range(self.move_log.steps.size):
                    i = self.move_log.steps.data[k]
                    self._wake(i if i >= 0 else ~i, at, heap, queued)
                for k in range(self.move_log.switched_class.size):
                    self._wake(self.move_log.switched_class.data[k], at, heap, queued)
        return kept

    def _rank_candidates(self) -> cython.int:
        """The candidates (live or not, classes with an e-node and an alternative) in position order, all
        pending."""
        c: cython.int
        k: cython.Py_ssize_t
        size: cython.Py_ssize_t = 0
        keys: cython.double[::1] = float_array(len(self.choice), 0.0)
        ids: cython.int[::1] = int_array(len(self.choice), 0)
        for c in range(len(self.choice)):
            if self.choice[c] >= 0 and self.member_start[c + 1] - self.member_start[c] > 1:
                keys[size], ids[size] = self.pos[c], c
                size += 1
        _sort_pairs(keys, ids, size)
        for k in range(size):
            self.candidates.push(ids[k])
            self.pending.push(k)
        self.is_pending = flag_array(size, 1)
        self.searched = True
        return 0

    def _wake(self, d: cython.int, at: cython.int, heap: IntVec, queued: cython.char[::1]) -> cython.int:
        """Class ``d`` changed in the kept move at rank ``at``: the attempts that read it run again, later in
        this pass or in the next one."""
        r: cython.int
        i: cython.int
        if self.stamp[d] == self.stamp_now:
            return 0
        self.stamp[d] = self.stamp_now
        i = self.reader_head[d]
        while i >= 0:
            r = self.reader_rank.data[i]
            if r > at and not queued[r]:
                _push_heap(heap, -r)
                queued[r] = True
            elif r <= at:
                _add(self.pending, self.is_pending, r)
            i = self.reader_next.data[i]
        self._clear_readers(d)
        return 0

    def attempt(self, c: cython.int, max_group: cython.int = 64) -> Log | None:
        """One attempt at class ``c`` (see :meth:`improve`): the kept move's log (a copy), or None."""
        self._check_class(c)
        if not self._attempt(c, max_group):
            return None
        copy = Log()
        copy.extend(self.move_log)
        return copy

    def _attempt(self, c: cython.int, max_group: cython.int) -> cython.int:
        """Switch live class ``c`` to its cheapest e-node whose move pays; 1 when a move was kept (its log in
        ``move_log``, valid until the next move), else 0."""
        k: cython.int
        n: cython.int
        if self.refs_[c] == 0:
            return 0
        if not self.ranked[c]:
            self._rank(c)
        for k in range(self.member_start[c], self.member_start[c + 1]):
            n = self.by_cost[k]
            if n != self.choice[c] and self.usable[n]:
                if self._try_move(c, n, max_group):
                    return 1
        return 0

    def _rank(self, c: cython.int) -> cython.void:
        """Sort class ``c``'s e-nodes in ``by_cost`` by (cost, index)."""
        k: cython.int
        first: cython.int = self.member_start[c]
        size: cython.int = self.member_start[c + 1] - first
        for k in range(size):
            self.rank_keys[k] = self.costs[self.by_cost[first + k]]
            self.rank_ids[k] = self.by_cost[first + k]
        _sort_pairs(self.rank_keys, self.rank_ids, size)
        for k in range(size):
            self.by_cost[first + k] = self.rank_ids[k]
        self.ranked[c] = True

    def _try_move(self, c: cython.int, n: cython.int, max_group: cython.int) -> cython.int:
        """Switch class ``c`` to e-node ``n``, with the group and release moves that help; 1 when the whole move
        pays (kept, its log in ``move_log``), else 0 (undone)."""
        old: cython.int = self.choice[c]
        group: cython.int = 0
        d: cython.int
        p: cython.int
        pc: cython.int
        k: cython.int
        j: cython.Py_ssize_t
        delta: cython.double
        step: cython.double
        self.newly_live.size = 0
        self.move_log.clear()
        delta = self._switch(c, n, self.move_log)
        if delta < -_EPS:
            return 1
        # Group move: other classes that could read what this switch made live.
        self.brought.size = 0
        self.brought.extend(self.newly_live)  # copied: the group's switches add to newly_live
        for j in range(self.brought.size):
            d = self.brought.data[j]
            if self.free_leaf[self.choice[d]]:
                continue
            for k in range(self.parent_start[d], self.parent_start[d + 1]):
                p = self.parent[k]
                pc = self.eclass[p]
                self.read.push(pc)
                if (group >= max_group or pc == c or self.refs_[pc] == 0 or self.choice[pc] == p
                        or not self.usable[p]):
                    continue
                self.group_log.clear()
                step = self._switch(pc, p, self.group_log)
                if step < -_EPS:
                    self.move_log.extend(self.group_log)
                    delta += step
                    group += 1
                else:
                    self._read_log(self.group_log)
                    self._undo(self.group_log)
        if delta < -_EPS:
            return 1
        delta += self._release(c, old, self.move_log)
        if delta < -_EPS:
            return 1
        self._read_log(self.move_log)
        self._undo(self.move_log)
        return 0

    def _release(self, c: cython.int, old: cython.int, log: Log) -> cython.double:
        """Switching class ``c`` away from e-node ``old`` can leave a child of ``old`` alive only for its other
        readers (the sibling projections of a multi-result node, the Narrows of a shared wide matmul): switch
        each of them to its alternative of most gain that does not read the child, so that the child dies with
        them (kept in ``log`` only then); returns the change of cost."""
        delta: cython.double = 0.0
        ch: cython.int
        k: cython.int
        p: cython.int
        pc: cython.int
        a: cython.int
        m: cython.int
        j: cython.Py_ssize_t
        some: cython.bint
        self.seen.size = 0
        for k in range(self.child_start[old], self.child_start[old + 1]):
            ch = self.child[k]
            if _contains(self.seen, ch):
                continue
            self.seen.push(ch)
            if self.refs_[ch] == 0 or self.free_leaf[self.choice[ch]]:
                continue
            self.reader_class.size = 0  # live classes whose chosen e-node reads ch, and that e-node
            self.reader_node.size = 0
            for j in range(self.parent_start[ch], self.parent_start[ch + 1]):
                p = self.parent[j]
                pc = self.eclass[p]
                self.read.push(pc)
                if pc != c and self.refs_[pc] > 0 and self.choice[pc] == p:
                    self.reader_class.push(pc)
                    self.reader_node.push(p)
            if self.reader_class.size == 0 or self.reader_class.size > _MAX_RELEASED_READERS:
                continue
            self.alt_start.size = 0  # per reader, its e-nodes that do not read ch
            self.alts.size = 0
            self.alt_start.push(0)
            some = True
            for j in range(self.reader_class.size):
                pc = self.reader_class.data[j]
                for m in range(self.member_start[pc], self.member_start[pc + 1]):
                    a = self.member[m]
                    if a != self.reader_node.data[j] and self.usable[a] and not self._reads(a, ch):
                        self.alts.push(a)
                self.alt_start.push(self.alts.size)
                if self.alt_start.data[j + 1] == self.alt_start.data[j]:  # the reader keeps ch alive whatever it does
                    some = False
                    break
            if some:
                delta += self._switch_away(ch, log)
        return delta

    def _reads(self, n: cython.int, ch: cython.int) -> cython.bint:
        k: cython.int
        for k in range(self.child_start[n], self.child_start[n + 1]):
            if self.child[k] == ch:
                return True
        return False

    def _switch_away(self, ch: cython.int, log: Log) -> cython.double:
        """Switch each reader of ``ch`` (``reader_class``) to its alternative of most gain among its ``alts``
        (those that leave fewer reading ``ch``); kept in ``log`` only if ``ch`` dies, else undone.  Returns the
        change of cost."""
        step: cython.double = 0.0
        delta_alt: cython.double
        best_delta: cython.double
        j: cython.Py_ssize_t
        m: cython.int
        pc: cython.int
        alt: cython.int
        before: cython.int
        best: cython.int
        self.release_log.clear()
        for j in range(self.reader_class.size):
            pc = self.reader_class.data[j]
            best = -1  # the alternative of most gain after which fewer read ch (ties: the lowest index)
            best_delta = 0.0
            before = self.refs_[ch]
            for m in range(self.alt_start.data[j], self.alt_start.data[j + 1]):
                alt = self.alts.data[m]
                self.trial_log.clear()
                delta_alt = self._switch(pc, alt, self.trial_log)
                if self.refs_[ch] < before and (best < 0 or delta_alt < best_delta
                                                or (delta_alt == best_delta and alt < best)):
                    best, best_delta = alt, delta_alt
                self._read_log(self.trial_log)
                self._undo(self.trial_log)
            if best < 0:
                break
            step += self._switch(pc, best, self.release_log)
        if self.refs_[ch] == 0:
            log.extend(self.release_log)
            return step
        self._read_log(self.release_log)  # still read (an output, or another path): nothing was released
        self._undo(self.release_log)
        return 0.0


@cython.cfunc
@cython.nogil
@cython.exceptval(check=False)
def _sort_ints(items: IntVec) -> cython.void:
    """Sort ``items`` ascending (heapsort: no memory)."""
    data: cython.int[::1] = items.data
    size: cython.Py_ssize_t = items.size
    k: cython.Py_ssize_t
    for k in range(size // 2, 0, -1):
        _sift_ints(data, k - 1, size)
    for k in range(size - 1, 0, -1):
        data[0], data[k] = data[k], data[0]
        _sift_ints(data, 0, k)


@cython.cfunc
@cython.nogil
@cython.exceptval(check=False)
def _sift_ints(data: cython.int[::1], at: cython.Py_ssize_t, end: cython.Py_ssize_t) -> cython.void:
    child: cython.Py_ssize_t
    while 2 * at + 1 < end:
        child = 2 * at + 1
        if child + 1 < end and data[child] < data[child + 1]:
            child += 1
        if data[at] >= data[child]:
            return
        data[at], data[child] = data[child], data[at]
        at = child
