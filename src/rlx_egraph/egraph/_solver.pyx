# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
# distutils: language = c++
"""The passes over the e-graph, compiled: the view's type propagation, pricing, and greedy extraction's
positions, tree choice and local search.

:class:`FlatEGraph` is the e-graph as integer arrays (built once per view, see
:meth:`rlx_egraph.egraph.view.EGraphView.flat`).  :func:`propagate_types` and :func:`price_nodes` walk it for
the view's type check and for pricing, calling back into Python (the registry's shape rules, the target's
cost) once per distinct signature.  :func:`settle_positions` and :func:`tree_choice` are the two
Dijkstra-like bottom-up passes of :mod:`rlx_egraph.egraph.extract`.

:class:`Solver` holds one e-node choice per class and, per class, how many live readers need it (the
outputs count as readers).  A move switches a class to another e-node, paying for the classes that
become needed and refunding those no longer needed; :meth:`Solver.improve` keeps the moves that pay
(see :func:`rlx_egraph.egraph.extract.greedy` for the strategy).  Every step appends to a log (a C++
struct; :class:`Log` for Python) so that a move that does not pay is undone exactly.  The search holds no
Python object, so :meth:`Solver.improve` runs without the GIL and two solvers can search at once.

The e-graph arrives as flat arrays (children of each e-node, readers of each class, e-nodes of each
class), so the search runs without Python objects; the floating-point sums are taken in a fixed order,
so the same e-graph always gives the same choices.
"""

from cython.operator cimport dereference as deref
from libcpp.algorithm cimport sort
from libcpp.pair cimport pair
from libcpp.queue cimport priority_queue
from libcpp.string cimport string
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

from cpython.object cimport PyObject, PyObject_TypeCheck, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.math cimport INFINITY
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from numpy import ndarray

# numpy's array type, checked in C: isinstance's general protocol (a type's __instancecheck__) costs 6x more per call
cdef PyTypeObject* _NDARRAY = <PyTypeObject*>ndarray

from rlx_egraph.egraph._rows cimport EClass, ENode

from rlx_egraph.ir.graph import Node
from rlx_egraph.ir.registry import Kind, ops_of_kind

EPS = 1e-9  # a move pays when it lowers the cost by more than this (float sums differ in the last digits)
MAX_RELEASED_READERS = 8  # a shared child is released from at most this many other readers
cdef double _EPS = EPS
cdef int _MAX_RELEASED_READERS = MAX_RELEASED_READERS
cdef int _ATTEMPTS_PER_CLOCK = 16  # the local search reads the clock before every 16th attempt (the first included)


cdef struct _Log:
    vector[int] steps  # reference-count steps: d up, ~d down
    vector[pair[int, int]] switched  # (class, its previous e-node)


cdef inline void _clear(_Log& log) noexcept nogil:
    log.steps.clear()
    log.switched.clear()


cdef inline void _extend(_Log& log, _Log& other) noexcept nogil:
    log.steps.insert(log.steps.end(), other.steps.begin(), other.steps.end())
    log.switched.insert(log.switched.end(), other.switched.begin(), other.switched.end())


cdef class Log:
    """What a move changed, to undo it: reference-count steps (``d`` up, ``~d`` down), then switched
    choices as (class, its previous e-node)."""

    cdef _Log data

    @property
    def refs(self):
        return list(self.data.steps)

    @property
    def choices(self):
        return [(p.first, p.second) for p in self.data.switched]


cdef double _now() noexcept nogil:
    """``time.perf_counter()`` (CLOCK_MONOTONIC on Linux), readable without the GIL."""
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + 1e-9 * t.tv_nsec


cdef class FlatEGraph:
    """An e-graph as flat arrays: per e-node its class and children (in order, repeats kept); per class its
    e-nodes and the e-nodes that read it (each reader once, in e-node order, as ``EGraphView.parents``)."""

    cdef vector[int] child_start, child, parent_start, parent, member_start, member, eclass
    cdef readonly int num_nodes, num_classes

    def __init__(self, view):
        cdef int n, c, k
        cdef vector[int] seen, fill
        cdef ENode node
        cdef EClass cls
        cdef tuple children
        cdef list members
        self.num_nodes, self.num_classes = len(view.nodes), len(view.classes)
        self.child_start.reserve(self.num_nodes + 1)
        self.child_start.push_back(0)
        self.eclass.reserve(self.num_nodes)
        for node in view.nodes:
            children = node.children
            for k in range(len(children)):
                self.child.push_back(children[k])
            self.child_start.push_back(self.child.size())
            self.eclass.push_back(node.eclass)
        self.member_start.reserve(self.num_classes + 1)
        self.member_start.push_back(0)
        for cls in view.classes:
            members = cls.nodes
            for k in range(len(members)):
                self.member.push_back(members[k])
            self.member_start.push_back(self.member.size())
        seen = vector[int](self.num_classes, -1)  # the last e-node counted as a reader of each class
        self.parent_start = vector[int](self.num_classes + 1, 0)
        for n in range(self.num_nodes):
            for k in range(self.child_start[n], self.child_start[n + 1]):
                c = self.child[k]
                if seen[c] != n:
                    seen[c] = n
                    self.parent_start[c + 1] += 1
        for c in range(self.num_classes):
            self.parent_start[c + 1] += self.parent_start[c]
        self.parent = vector[int](self.parent_start[self.num_classes])
        fill = self.parent_start
        seen.assign(self.num_classes, -1)
        for n in range(self.num_nodes):
            for k in range(self.child_start[n], self.child_start[n + 1]):
                c = self.child[k]
                if seen[c] != n:
                    seen[c] = n
                    self.parent[fill[c]] = n
                    fill[c] += 1

    def parents(self):
        """Per class, the list of e-nodes that read it (each reader once, in e-node order)."""
        cdef int c, k
        cdef list out = [None] * self.num_classes
        for c in range(self.num_classes):
            out[c] = [self.parent[k] for k in range(self.parent_start[c], self.parent_start[c + 1])]
        return out

    cdef vector[int] distinct_children(self):
        """Per e-node, how many distinct classes it reads."""
        cdef vector[int] count = vector[int](self.num_nodes, 0), seen = vector[int](self.num_classes, -1)
        cdef int n, k
        for n in range(self.num_nodes):
            for k in range(self.child_start[n], self.child_start[n + 1]):
                if seen[self.child[k]] != n:
                    seen[self.child[k]] = n
                    count[n] += 1
        return count


# E-nodes type-checked between two looks at the deadline (as the view's row decoding).
cdef int _DEADLINE_STRIDE = 4096
# The errors that make an e-node ill-typed: ShapeError, or a rule gone wild.
_ILL_TYPED = (ArithmeticError, LookupError, TypeError, ValueError)


cdef inline void _append_word(string& key, long long value):
    key.append(<const char*>&value, sizeof(long long))


cdef inline void _append_int(string& key, int value):
    key.append(<const char*>&value, sizeof(int))


cdef inline void _signature_head(string& key, ENode node, long long extra, bint with_attrs=True):
    """Start e-node ``node``'s memo key in ``key`` (as bytes, for a C++ map): its op's and its attributes dict's
    identities (e-nodes of equal attributes share one, see :func:`rlx_egraph.egraph.view.build_view`; none
    without ``with_attrs``) and ``extra``.  Keys are compared within one pass, while the e-nodes live."""
    key.clear()
    _append_word(key, <long long><PyObject*>node.op)
    _append_word(key, <long long><PyObject*>node.attrs if with_attrs else 0)
    _append_word(key, extra)


cdef void _signature(string& key, ENode node, int n, vector[int]& child_start, vector[int]& child,
                     vector[int]& numbers, long long extra, bint with_attrs=True):
    """Write e-node ``n``'s memo key into ``key``: :func:`_signature_head`, then its children's ``numbers``."""
    _signature_head(key, node, extra, with_attrs)
    for k in range(child_start[n], child_start[n + 1]):
        _append_int(key, numbers[child[k]])


def input_types(tuple graph_nodes, dict class_of, int num_classes, dict numbers, number_of_node):
    """Per class the type number of the input-graph nodes in it (``class_of``: node id -> class), -1 for none,
    and the classes holding nodes of different types.  ``numbers``: (shape, dtype, parts) -> type number;
    ``number_of_node(node)`` numbers a node whose key is not in it yet."""
    cdef vector[int] fixed = vector[int](num_classes, -1)
    cdef set split = set()
    cdef int c, k
    cdef string key
    cdef unordered_map[string, int] seen  # the identities of a (shape, dtype, parts) -> its type number
    for gnode in graph_nodes:
        c = class_of[gnode.id]
        shape, dtype, parts = gnode.shape, gnode.dtype, gnode.parts
        key.clear()  # nodes share their shape objects: keyed by identity, most need no hash of a shape
        _append_word(key, <long long><PyObject*>shape)
        _append_word(key, <long long><PyObject*>dtype)
        _append_word(key, <long long><PyObject*>parts)
        found = seen.find(key)
        if found != seen.end():
            k = deref(found).second
        else:
            number = numbers.get((shape, dtype, parts))
            k = seen[key] = number_of_node(gnode) if number is None else number
        if fixed[c] < 0:
            fixed[c] = k
        elif fixed[c] != k:
            split.add(c)
    return fixed, split


def propagate_types(FlatEGraph g, list nodes, fixed, original, excluded, infer, deadline):
    """The view's type propagation (see :func:`rlx_egraph.egraph.view._check_types`) over the flat e-graph.

    Types are numbers (equal numbers, equal types).  ``fixed``: per class its input-graph type's number, -1 when
    it has none; ``original``: per e-node whether it is an input-graph node; ``excluded``: classes whose
    rule-made e-nodes are left out; ``infer(n, numbers)``: the number of the type that e-node ``n``'s shape rule
    gives from its children's type ``numbers`` (raising the error that makes it ill-typed), called once per
    (op, attributes, children's types).  An input-graph e-node passes when its class and children are fixed
    (the input graph inferred its type from the same attributes and its inputs' types); the rule-made ones are
    inferred in order, each once its children's classes have types, the first typing its class.  Returns per
    class its type's number (-1: none), per e-node whether it passes, the ill-typed e-nodes (e-node -> error),
    the e-nodes whose type is not their class's (e-node -> (its type, the class's)) and the classes without an
    input-graph type whose e-nodes disagree (class -> type numbers)."""
    cdef vector[int] types = fixed, waiting = vector[int](g.num_nodes, 0), queue
    cdef vector[int] seen = vector[int](g.num_classes, -1)
    cdef vector[char] is_original = original, kept = vector[char](g.num_nodes, 0)
    cdef vector[char] skip = vector[char](g.num_classes, 0)
    cdef int n, c, k, out, have, p
    cdef size_t head = 0
    cdef bint ok
    cdef dict errors = {}, mismatches = {}, conflicts = {}
    cdef unordered_map[string, int] memo  # signature -> its outcome's place in outcomes
    cdef list outcomes = []
    cdef string key
    for c in excluded:
        skip[c] = True
    for n in range(g.num_nodes):
        if is_original[n]:
            ok = types[g.eclass[n]] >= 0
            for k in range(g.child_start[n], g.child_start[n + 1]):
                ok = ok and types[g.child[k]] >= 0
            kept[n] = ok
            continue
        for k in range(g.child_start[n], g.child_start[n + 1]):
            c = g.child[k]
            if types[c] < 0 and seen[c] != n:
                seen[c] = n
                waiting[n] += 1
        if waiting[n] == 0:
            queue.push_back(n)
    while head < queue.size():
        n = queue[head]
        head += 1
        if n % _DEADLINE_STRIDE == 0:
            deadline.check("type-checking the e-graph view")
        c = g.eclass[n]
        if skip[c]:
            continue
        _signature(key, nodes[n], n, g.child_start, g.child, types, 0)
        found = memo.find(key)
        if found != memo.end():
            hit = outcomes[deref(found).second]
        else:
            try:
                hit = infer(n, tuple([types[g.child[k]] for k in range(g.child_start[n], g.child_start[n + 1])]))
            except _ILL_TYPED as exc:
                hit = exc
            memo[key] = len(outcomes)
            outcomes.append(hit)
        if isinstance(hit, BaseException):
            errors[n] = hit
            continue
        out = hit
        have = types[c]
        if have < 0:
            types[c] = have = out
            for k in range(g.parent_start[c], g.parent_start[c + 1]):
                p = g.parent[k]
                waiting[p] -= 1
                if waiting[p] == 0 and not is_original[p]:
                    queue.push_back(p)
        if out == have:
            kept[n] = True
        else:
            mismatches[n] = (out, have)
            if fixed[c] < 0:
                conflicts.setdefault(c, {have}).add(out)
    return list(types), [bool(x) for x in kept], errors, mismatches, conflicts


def price_nodes(FlatEGraph g, list nodes, type_numbers, leaf, price, dict prices_attributes):
    """Per e-node its cost: ``price(n, reads_intermediate)``, called once per (op, attributes, class type,
    whether it reads a class that is not a ``leaf`` (a flag per class), children's types), with
    ``type_numbers`` per class (see :func:`_signature`); the attributes only where
    ``prices_attributes[op][reads_intermediate]``.  Infinity for an e-node that reads its own class (x = f(x)
    is never a way to compute x)."""
    cdef vector[int] numbers = type_numbers
    cdef vector[char] is_leaf = leaf
    cdef vector[double] costs = vector[double](g.num_nodes, 0.0)
    cdef int n, k, c
    cdef bint intermediate, cyclic
    cdef unordered_map[string, double] memo
    cdef string key
    cdef double cost
    cdef ENode node
    for n in range(g.num_nodes):
        c = g.eclass[n]
        intermediate = cyclic = False
        for k in range(g.child_start[n], g.child_start[n + 1]):
            intermediate = intermediate or not is_leaf[g.child[k]]
            cyclic = cyclic or g.child[k] == c
        node = nodes[n]
        _signature(key, node, n, g.child_start, g.child, numbers, 2 * numbers[c] + intermediate,
                   prices_attributes[node.op][intermediate])
        found = memo.find(key)
        if found == memo.end():
            cost = memo[key] = price(n, intermediate)
        else:
            cost = deref(found).second
        costs[n] = INFINITY if cyclic else cost
    return list(costs)


# Heap entries, negated: libcpp's priority_queue pops the largest, so (-key, -id) pops the least (key, id).
ctypedef pair[double, int] Keyed
ctypedef pair[double, pair[int, int]] Offer


def settle_positions(FlatEGraph g, list start, list final, costs=None):
    """The positions of :func:`rlx_egraph.egraph.extract.class_positions` from the ``start`` positions of the
    classes that are ``final`` already (leaves, input-graph classes): every other class gets the least over
    its e-nodes (those of finite ``costs``; all when None) of its highest child's position plus 1/2."""
    cdef vector[double] pos = start, cost
    cdef vector[char] done = final
    cdef vector[int] pending = g.distinct_children()
    cdef priority_queue[Keyed] heap
    cdef int n, c
    cdef bint priced = costs is not None
    cdef Keyed top
    if priced:
        cost = costs

    for n in range(g.num_nodes):
        if pending[n] == 0:
            _offer_position(g, n, pos, done, cost, priced, heap)
    for c in range(g.num_classes):
        if done[c]:
            _settle(g, c, pending, pos, done, cost, priced, heap)
    while not heap.empty():
        top = heap.top()
        heap.pop()
        c = -top.second
        if not done[c]:
            pos[c], done[c] = -top.first, True
            _settle(g, c, pending, pos, done, cost, priced, heap)
    return list(pos)


cdef void _offer_position(FlatEGraph g, int n, vector[double]& pos, vector[char]& done, vector[double]& cost,
                          bint priced, priority_queue[Keyed]& heap):
    """All children of e-node ``n`` have their position: offer its class one."""
    cdef int c = g.eclass[n], k
    cdef double highest = -1.0
    if done[c] or (priced and not cost[n] < INFINITY):
        return
    for k in range(g.child_start[n], g.child_start[n + 1]):
        if pos[g.child[k]] > highest:
            highest = pos[g.child[k]]
    heap.push(Keyed(-(highest + 0.5), -c))


cdef void _settle(FlatEGraph g, int c, vector[int]& pending, vector[double]& pos, vector[char]& done,
                  vector[double]& cost, bint priced, priority_queue[Keyed]& heap):
    cdef int k, p
    for k in range(g.parent_start[c], g.parent_start[c + 1]):
        p = g.parent[k]
        pending[p] -= 1
        if pending[p] == 0:
            _offer_position(g, p, pos, done, cost, priced, heap)


def tree_choice(FlatEGraph g, costs):
    """Knuth-style bottom-up pass: per class the e-node of least tree cost (an e-node's own cost plus its
    distinct children's tree costs, added in ascending class order), as (class -> e-node, class -> cost)
    for the classes that have one; ties go to the lower e-node index."""
    cdef vector[double] cost = costs, best_cost
    cdef vector[int] best_node = _tree_choice(g, cost, best_cost)
    return ({c: best_node[c] for c in range(g.num_classes) if best_node[c] >= 0},
            {c: best_cost[c] for c in range(g.num_classes) if best_node[c] >= 0})


cdef vector[int] _tree_choice(FlatEGraph g, vector[double]& cost, vector[double]& best_cost):
    """:func:`tree_choice` as arrays (-1: no e-node); fills ``best_cost``."""
    cdef vector[int] best_node = vector[int](g.num_classes, -1), pending = g.distinct_children(), reads
    cdef priority_queue[Offer] heap
    cdef int n, c, k, p, j
    cdef double total
    cdef Offer top
    best_cost.assign(g.num_classes, 0.0)
    for n in range(g.num_nodes):
        if pending[n] == 0 and cost[n] < INFINITY:
            heap.push(Offer(-cost[n], pair[int, int](-n, -g.eclass[n])))
    while not heap.empty():
        top = heap.top()
        heap.pop()
        n, c = -top.second.first, -top.second.second
        if best_node[c] >= 0:
            continue
        best_cost[c], best_node[c] = -top.first, n
        for k in range(g.parent_start[c], g.parent_start[c + 1]):
            p = g.parent[k]
            pending[p] -= 1
            if pending[p] == 0 and cost[p] < INFINITY and best_node[g.eclass[p]] < 0:
                reads.assign(g.child.begin() + g.child_start[p], g.child.begin() + g.child_start[p + 1])
                sort(reads.begin(), reads.end())
                total = 0.0
                for j in range(reads.size()):
                    if j == 0 or reads[j] != reads[j - 1]:
                        total += best_cost[reads[j]]
                heap.push(Offer(-(cost[p] + total), pair[int, int](-p, -g.eclass[p])))
    return best_node


cdef class ClassChoice:
    """An e-node per class as an array (-1: none), read like a dict of class -> e-node: greedy's starts, passed
    between the compiled passes without making a dict of every class."""

    cdef vector[int] node
    cdef int count

    def __len__(self) -> int:
        return self.count

    def __contains__(self, c) -> bool:
        return 0 <= c < <int>self.node.size() and self.node[c] >= 0

    def __getitem__(self, c) -> int:
        if c not in self:
            raise KeyError(c)
        return self.node[c]

    def keys(self) -> list:
        return [c for c in range(self.node.size()) if self.node[c] >= 0]

    def items(self) -> list:
        return [(c, self.node[c]) for c in range(self.node.size()) if self.node[c] >= 0]

    def to_dict(self) -> dict:
        return {c: self.node[c] for c in range(self.node.size()) if self.node[c] >= 0}

    def __eq__(self, other) -> bool:
        if type(other) is ClassChoice:
            return self.node == (<ClassChoice>other).node
        return isinstance(other, dict) and self.to_dict() == other

    __hash__ = None


cdef ClassChoice _class_choice(vector[int]& node):
    cdef ClassChoice out = ClassChoice.__new__(ClassChoice)
    out.node = node
    out.count = 0
    for c in range(node.size()):
        out.count += node[c] >= 0
    return out


cdef vector[int] _choice_array(FlatEGraph g, choice) except *:
    """``choice`` (a :class:`ClassChoice`, or a dict of class -> e-node) as an array per class (-1: none);
    raises ValueError for an e-node that is not its class's."""
    cdef vector[int] out
    cdef int c, n
    if type(choice) is ClassChoice:
        out = (<ClassChoice>choice).node
        for c in range(out.size()):
            n = out[c]
            if n >= 0 and not (n < g.num_nodes and g.eclass[n] == c):
                raise ValueError(f"the choice gives class {c} e-node {n}, which is not one of its e-nodes")
        return out
    out.assign(g.num_classes, -1)
    for c, n in (<dict>choice).items():
        if not (0 <= c < g.num_classes and 0 <= n < g.num_nodes and g.eclass[n] == c):
            raise ValueError(f"the choice gives class {c} e-node {n}, which is not one of its e-nodes")
        out[c] = n
    return out


def start_choice(FlatEGraph g, costs, pos, original):
    """Greedy's starting point, from the e-nodes computed from classes strictly below their own (by ``pos``):
    per class its first input-graph e-node (``original``: a flag per e-node) among them, else its least
    tree-cost one.  Returns (class -> e-node, class -> its least tree-cost e-node), for the classes that have
    one, as :class:`ClassChoice`.  When rules merged several input-graph nodes into one class, only the lowest
    one is computed from classes below it, and it is the one taken."""
    cdef vector[double] monotone = costs, position = pos, unused
    cdef vector[char] is_original = original
    cdef vector[int] tree, choice = vector[int](g.num_classes, -1)
    cdef int n, c, k
    for n in range(g.num_nodes):
        for k in range(g.child_start[n], g.child_start[n + 1]):
            if not position[g.child[k]] < position[g.eclass[n]]:
                monotone[n] = INFINITY
    tree = _tree_choice(g, monotone, unused)
    for c in range(g.num_classes):
        for k in range(g.member_start[c], g.member_start[c + 1]):
            n = g.member[k]
            if is_original[n] and monotone[n] < INFINITY:
                choice[c] = n
                break
        if choice[c] < 0:
            choice[c] = tree[c]
    return _class_choice(choice), _class_choice(tree)


def drop_unreachable(FlatEGraph g, choice):
    """``choice`` without the classes whose chosen e-node reads a class that has no choice, nor, in turn,
    the classes whose chosen e-node reads one of those (so every walk down a choice ends at leaves)."""
    cdef vector[int] chosen = _choice_array(g, choice), stack
    cdef int c, n, k, j, p
    for c in range(g.num_classes):
        n = chosen[c]
        if n >= 0:
            for k in range(g.child_start[n], g.child_start[n + 1]):
                if chosen[g.child[k]] < 0:
                    stack.push_back(c)
                    break
    while not stack.empty():
        c = stack.back()
        stack.pop_back()
        if chosen[c] < 0:
            continue
        chosen[c] = -1
        for k in range(g.parent_start[c], g.parent_start[c + 1]):  # the classes whose choice reads c
            p = g.parent[k]
            if chosen[g.eclass[p]] == p:
                stack.push_back(g.eclass[p])
    return _class_choice(chosen)


def dag_cost(FlatEGraph g, dict choice, roots, costs):
    """The sum of ``costs`` over the classes reachable from ``roots`` under ``choice`` (class -> e-node), each
    once, walked depth first (roots, then children, pushed in order, the last popped first: the order of the
    float sum is fixed).  Raises KeyError for a reached class without a choice."""
    cdef vector[int] chosen = vector[int](g.num_classes, -1), stack
    cdef vector[char] seen = vector[char](g.num_classes, 0)
    cdef vector[double] cost = costs
    cdef double total = 0.0
    cdef int c, n, k
    for c, n in choice.items():
        if not (0 <= c < g.num_classes and 0 <= n < g.num_nodes and g.eclass[n] == c):
            raise ValueError(f"the choice gives class {c} e-node {n}, which is not one of its e-nodes")
        chosen[c] = n
    for c in roots:
        stack.push_back(c)
    while not stack.empty():
        c = stack.back()
        stack.pop_back()
        if seen[c]:
            continue
        seen[c] = 1
        n = chosen[c]
        if n < 0:
            raise KeyError(c)
        total += cost[n]
        for k in range(g.child_start[n], g.child_start[n + 1]):
            stack.push_back(g.child[k])
    return total


def least_per_class(dict class_of, dict value_of, int num_classes) -> list:
    """Per class the least ``value_of[key]`` over the keys of ``class_of`` (key -> class) in it, infinity for
    none."""
    cdef vector[double] least = vector[double](num_classes, INFINITY)
    cdef int c
    cdef double value
    for key, c in class_of.items():
        value = value_of[key]
        if value < least[c]:
            least[c] = value
    return least


def original_flags(list nodes) -> list:
    """Per e-node (``ENode``) whether it is a node of the input graph."""
    cdef ENode node
    return [node.original is not None for node in nodes]


def classes_of_ops(list nodes, ops) -> set:
    """The classes of the e-nodes (``ENode``) whose op is in ``ops``."""
    cdef set out = set()
    cdef ENode node
    for node in nodes:
        if node.op in ops:
            out.add(node.eclass)
    return out


cdef object _MISSING = object()


cdef bint _same_attrs(int n, dict have, gnode, same_attrs) except -1:
    """Whether e-node ``n``'s attributes ``have`` equal ``gnode``'s: compared here, the first pair that holds an
    array left to ``same_attrs(n, gnode)``."""
    cdef dict want = gnode.attrs
    if len(have) != len(want):
        return False
    for key, value in have.items():
        other = want.get(key, _MISSING)
        if other is _MISSING:
            return False
        if PyObject_TypeCheck(value, _NDARRAY) or PyObject_TypeCheck(other, _NDARRAY):
            return same_attrs(n, gnode)
        if value != other:
            return False
    return True


def match_originals(FlatEGraph g, list nodes, list op_spans, tuple graph_nodes, dict class_of, set skip,
                    same_attrs):
    """Per node of ``graph_nodes`` (the input graph's, in order), the e-node that is it, -1 for none: the first
    e-node of the node's class (``class_of``: node id -> class) that has its op, its inputs' classes as
    children and is no other node's, and its attributes (``nodes``: the e-nodes) when the op has attribute
    columns, else none.  Attributes are compared in C unless one is an array; then by ``same_attrs(e-node,
    node)`` (:func:`rlx_egraph.ir.graph.attrs_equal`, which gives the same answer for the others).
    ``op_spans``: (op, first e-node, end, whether the op has attributes) per op (the view reads the e-nodes op
    by op); nodes of ``skip`` (ids) are matched already."""
    cdef vector[int] op_of = vector[int](g.num_nodes, -1), found
    cdef vector[char] taken = vector[char](g.num_nodes, 0), attributed
    cdef vector[int] inputs
    cdef dict op_number = {}
    cdef int k, n, m, j, c, op, first, width
    cdef bint match
    for k, (name, first, end, has_attrs) in enumerate(op_spans):
        op_number[name] = k
        attributed.push_back(has_attrs)
        for n in range(first, end):
            op_of[n] = k
    for gnode in graph_nodes:
        found.push_back(-1)
        if gnode.id in skip:
            continue
        op = op_number.get(gnode.op, -2)  # -1: e-nodes outside the spans
        c = class_of[gnode.id]
        inputs.clear()
        for i in gnode.inputs:
            inputs.push_back(class_of[i])
        width = inputs.size()
        for m in range(g.member_start[c], g.member_start[c + 1]):
            n = g.member[m]
            if op_of[n] != op or taken[n] or g.child_start[n + 1] - g.child_start[n] != width:
                continue
            match = True
            for j in range(width):
                if g.child[g.child_start[n] + j] != inputs[j]:
                    match = False
                    break
            if match and (_same_attrs(n, (<ENode>nodes[n]).attrs, gnode, same_attrs) if attributed[op]
                          else not gnode.attrs):
                taken[n] = True
                found[found.size() - 1] = n
                break
    return list(found)


def decode_order(FlatEGraph g, dict wanted, first):
    """The order decoding builds the classes of ``wanted`` (class -> e-node) in: each once its e-node's children
    are built, the least sort key first, ties to the lower class.  A class's key is ``first[c]`` when that is
    finite (the position of its first input-graph node), else just above its children's keys (the highest plus
    1/2; -1/2 without children).  A class on a cycle of ``wanted``, or reading a class outside it, never
    comes: the order is then shorter than ``wanted``."""
    cdef vector[int] chosen = vector[int](g.num_classes, -1), pending = vector[int](g.num_classes, 0)
    cdef vector[int] seen = vector[int](g.num_classes, -1)
    cdef vector[double] position = first, key = vector[double](g.num_classes, 0.0)
    cdef priority_queue[Keyed] heap
    cdef list order = []
    cdef int c, n, k, p, pc
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
            heap.push(_ready(g, c, chosen[c], position, key))
    while not heap.empty():
        c = -heap.top().second
        heap.pop()
        order.append(c)
        for k in range(g.parent_start[c], g.parent_start[c + 1]):  # each reader e-node once
            p = g.parent[k]
            pc = g.eclass[p]
            if chosen[pc] == p:
                pending[pc] -= 1
                if pending[pc] == 0:
                    heap.push(_ready(g, pc, p, position, key))
    return order


def decoded_nodes(list order, dict wanted, list enodes, list classes, dict input_nodes, rechecked,
                  list type_numbers, check):
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
    cdef Py_ssize_t nid, k, width
    cdef list new_id = [-1] * len(classes), nodes = []
    cdef dict class_of = {}, originals = {}, built_by = {}, merged_by = {}
    cdef object key_of  # node id as a Python int
    cdef list made = [], checked = []  # checked: the first node of each signature
    cdef unordered_map[string, int] checked_at  # signature -> its place in checked
    cdef vector[int] numbers = type_numbers
    cdef string key
    cdef tuple children, inputs
    cdef ENode enode
    cdef EClass cls
    cdef object leaves = ops_of_kind(Kind.LEAF)
    for nid in range(len(order)):
        c = order[nid]
        enode = enodes[wanted[c]]
        cls = classes[c]
        children = enode.children
        width = len(children)
        inputs = PyTuple_New(width)
        for k in range(width):
            item = new_id[children[k]]
            if item < 0:
                raise RuntimeError(f"decode: class {c} reads class {children[k]} before it is built")
            Py_INCREF(item)
            PyTuple_SET_ITEM(inputs, k, item)
        op, original = enode.op, enode.original
        if original is not None and op not in rechecked:
            was = input_nodes[original]
            node = Node(nid, was.op, inputs, was.attrs, was.shape, was.dtype, was.parts)
        elif op in leaves:
            node = check(nid, op, inputs, enode.attrs, nodes)
        else:
            _signature_head(key, enode, 0)  # then the children's types, and a rechecked op's inputs' ops
            for k in range(width):
                _append_int(key, numbers[<int>children[k]])
            if op in rechecked:
                for k in range(width):
                    _append_word(key, <long long><PyObject*>(<list>nodes)[<Py_ssize_t>inputs[k]].op)
            found = checked_at.find(key)
            if found == checked_at.end():
                node = check(nid, op, inputs, enode.attrs, nodes)
                checked_at[key] = len(checked)
                checked.append(node)
            else:
                seen = checked[deref(found).second]
                node = Node(nid, seen.op, inputs, dict(seen.attrs), seen.shape, seen.dtype, seen.parts)
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


cdef Keyed _ready(FlatEGraph g, int c, int n, vector[double]& position, vector[double]& key):
    """Class ``c``, whose e-node ``n``'s children all have their keys, gets its own; returns its heap entry."""
    cdef int k
    cdef double highest = -1.0
    if position[c] < INFINITY:
        key[c] = position[c]
    else:
        for k in range(g.child_start[n], g.child_start[n + 1]):
            if key[g.child[k]] > highest:
                highest = key[g.child[k]]
        key[c] = highest + 0.5
    return Keyed(-key[c], -c)


cdef class Solver:
    """Local search over a choice (``choice``: class -> e-node) with reference counts of needed classes.

    ``pos`` orders the classes: only e-nodes whose children all sit strictly below their class are
    usable, so no move closes a cycle.  ``roots`` are the classes the outputs need.
    """

    cdef readonly object view
    cdef readonly long switches  # switches made, kept or undone (the search's work)
    cdef vector[int] child_start, child, parent_start, parent, member_start, member, by_cost
    cdef vector[char] ranked  # per class: whether its slice of by_cost is sorted yet
    cdef vector[int] eclass, choice, refs_, newly_live, read, stamp, work
    cdef vector[double] costs, pos
    cdef vector[char] usable, free_leaf
    cdef int stamp_now
    # Scratch logs, cleared and refilled by every move (their vectors keep their memory): the move's, a group
    # member's, and those of releasing a child (the group of switches, one trial switch).
    cdef _Log move_log, group_log, release_log, trial_log
    # Scratch vectors of one move, cleared before use (they keep their memory too).
    cdef vector[int] brought, seen, reader_class, reader_node, alt_start, alts
    # The search's memory between calls of improve: the candidate classes in position order (their ranks), per
    # class the ranks whose last attempt read it, and the ranks to attempt first in the next call.
    cdef vector[int] candidates, pending
    cdef vector[vector[int]] readers
    cdef vector[char] is_pending
    cdef bint searched

    def __init__(self, view, costs, choice, roots, pos):
        cdef int n, c, k
        cdef FlatEGraph g = view.flat()
        self.view = view
        self.switches = 0
        self.child, self.child_start, self.parent, self.parent_start = g.child, g.child_start, g.parent, g.parent_start
        self.member, self.member_start, self.eclass = g.member, g.member_start, g.eclass
        self.costs = costs
        # Per class its e-nodes, cheapest first (ties by index): the order moves are tried in, sorted on a
        # class's first attempt (the FusionReport's solver never attempts a move).
        self.by_cost = g.member
        self.ranked = vector[char](g.num_classes, 0)
        self.pos = pos
        if len(costs) != g.num_nodes or len(pos) != g.num_classes:
            raise ValueError(f"{len(costs)} costs and {len(pos)} positions for {g.num_nodes} e-nodes and "
                             f"{g.num_classes} classes")
        self.choice = _choice_array(g, choice)
        self.refs_ = vector[int](len(view.classes), 0)
        self.stamp = vector[int](len(view.classes), 0)
        self.stamp_now = 0
        # Usable: finite cost, every child has a choice and sits strictly below the node's class.
        self.usable = vector[char](len(view.nodes), 0)
        self.free_leaf = vector[char](len(view.nodes), 0)
        for n in range(len(view.nodes)):
            c = self.eclass[n]
            self.usable[n] = self.costs[n] < INFINITY
            for k in range(self.child_start[n], self.child_start[n + 1]):
                if not (self.pos[self.child[k]] < self.pos[c] and self.choice[self.child[k]] >= 0):
                    self.usable[n] = False
            # A free e-node without children offers nothing that another class could share.
            self.free_leaf[n] = self.costs[n] == 0.0 and self.child_start[n] == self.child_start[n + 1]
        for r in roots:
            self._check_class(r)
            self._incref(r, self.trial_log)
        _clear(self.trial_log)

    # --- what Python reads ---------------------------------------------------------------------

    @property
    def refs(self):
        """Per class, how many live readers (or outputs) need it (0: not needed)."""
        return list(self.refs_)

    def needed(self, int c):
        """How many live readers (or outputs) need class ``c``."""
        self._check_class(c)
        return self.refs_[c]

    def chosen(self, int c):
        """Class ``c``'s e-node, -1 when it has none."""
        self._check_class(c)
        return self.choice[c]

    def set_choice(self, int c, int n):
        """Give class ``c``, which nothing needs, e-node ``n`` (a later move that needs it starts there)."""
        self._check_member(c, n)
        if self.refs_[c] != 0:
            raise ValueError(f"class {c} is needed: only a move may change its choice")
        self.choice[c] = n

    cdef void _check_class(self, int c) except *:
        if not 0 <= c < <int>self.choice.size():
            raise IndexError(f"class {c} is not in the e-graph ({self.choice.size()} classes)")

    cdef void _check_member(self, int c, int n) except *:
        self._check_class(c)
        if not 0 <= n < <int>self.eclass.size() or self.eclass[n] != c:
            raise ValueError(f"e-node {n} is not an e-node of class {c}")

    def restart(self, start):
        """Give every class that nothing needs and that has a choice its e-node in ``start`` (a later move that
        needs it again finds it there); returns how many changed.  The next :meth:`improve` attempts first the
        classes whose last attempt read a changed class (the others would fail again the same way)."""
        cdef int c, n, changed = 0
        cdef vector[int]* node
        if type(start) is ClassChoice:  # read as its array, in class order
            node = &(<ClassChoice>start).node
            for c in range(min(node.size(), self.choice.size())):
                if deref(node)[c] >= 0:
                    changed += self._restart_class(c, deref(node)[c])
            for c in range(self.choice.size(), node.size()):
                if deref(node)[c] >= 0:
                    self._check_class(c)
            return changed
        for c, n in start.items():
            changed += self._restart_class(c, n)
        return changed

    cdef int _restart_class(self, int c, int n) except -1:
        """:meth:`restart` for class ``c`` and its e-node ``n`` in the start; 1 when ``c`` changed, else 0."""
        cdef int r
        self._check_member(c, n)
        if self.refs_[c] != 0 or self.choice[c] < 0 or self.choice[c] == n:
            return 0
        self.choice[c] = n
        if self.searched:
            for r in self.readers[c]:
                _add(self.pending, self.is_pending, r)
            self.readers[c].clear()
        return 1

    def live_choices(self):
        """Class -> its e-node, for the classes something needs (the extracted graph)."""
        return {c: self.choice[c] for c in range(self.choice.size()) if self.refs_[c] > 0}

    def choices(self):
        """Class -> its e-node, for the classes that have one."""
        return {c: n for c, n in enumerate(self.choice) if n >= 0}

    # --- reference counts --------------------------------------------------------------------

    cdef double _incref(self, int c, _Log& log) except? -1.0 nogil:
        return self._count(c, log, 1)

    cdef double _decref(self, int c, _Log& log) except? -1.0 nogil:
        return self._count(c, log, -1)

    cdef double _count(self, int c, _Log& log, int step) except? -1.0 nogil:
        """Class ``c`` gains (``step`` 1) or loses (-1) a reader: a class that becomes needed needs its chosen
        e-node's children in turn, one that no longer is needed lets them go.  Returns the change of cost."""
        cdef vector[int]* stack = &self.work  # never nested: one scratch stack
        cdef double delta = 0.0
        cdef int d, n, k
        stack.clear()
        stack.push_back(c)
        while stack.size():
            d = stack.back()
            stack.pop_back()
            self.refs_[d] += step
            log.steps.push_back(d if step > 0 else ~d)
            if self.refs_[d] == (1 if step > 0 else 0):
                n = self.choice[d]
                if n < 0:
                    with gil:
                        raise KeyError(f"class {d} is needed but has no e-node")
                if step > 0:
                    self.newly_live.push_back(d)
                    delta += self.costs[n]
                else:
                    delta -= self.costs[n]
                for k in range(self.child_start[n], self.child_start[n + 1]):
                    stack.push_back(self.child[k])
        return delta

    def switch(self, int c, int n, Log log):
        """Choose e-node ``n`` of class ``c`` for it (recorded in ``log``); returns the change of the DAG cost."""
        self._check_member(c, n)
        if self.choice[c] < 0:
            raise KeyError(f"class {c} has no e-node to switch from")
        return self._switch(c, n, log.data)

    cdef double _switch(self, int c, int n, _Log& log) except? -1.0 nogil:
        cdef int old = self.choice[c], k
        cdef double delta
        self.switches += 1
        self.choice[c] = n
        log.switched.push_back(pair[int, int](c, old))
        delta = self.costs[n] - self.costs[old]
        for k in range(self.child_start[n], self.child_start[n + 1]):
            delta += self._incref(self.child[k], log)
        for k in range(self.child_start[old], self.child_start[old + 1]):
            delta += self._decref(self.child[k], log)
        return delta

    def undo(self, Log log):
        """Take back every step of ``log``."""
        self._undo(log.data)

    cdef void _undo(self, _Log& log) noexcept nogil:
        cdef int d
        cdef size_t k
        for d in log.steps:
            if d >= 0:
                self.refs_[d] -= 1
            else:
                self.refs_[~d] += 1
        for k in range(log.switched.size(), 0, -1):
            self.choice[log.switched[k - 1].first] = log.switched[k - 1].second

    cdef void _read_log(self, _Log& log) noexcept nogil:
        """Note every class ``log`` changed as read by the current attempt."""
        cdef int d
        cdef pair[int, int] p
        for d in log.steps:
            self.read.push_back(d if d >= 0 else ~d)
        for p in log.switched:
            self.read.push_back(p.first)

    # --- the search ----------------------------------------------------------------------------

    def improve(self, deadline, int max_passes=6, int max_group=64):
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
        ``time.perf_counter``'s clock; the search runs without the GIL.
        """
        cdef int kept = 0, outcome
        cdef double end = deadline.end
        if not self.searched:
            self._rank_candidates()
        with nogil:  # the search touches no Python object: another thread can search meanwhile
            outcome = self._improve(end, max_passes, max_group, &kept)
        return kept, outcome == 1

    cdef int _improve(self, double end, int max_passes, int max_group, int* kept) except -1 nogil:
        """:meth:`improve` until ``end`` (on :func:`_now`'s clock); returns 1 when the deadline stopped it."""
        cdef int at, c, d, k, passes, moved
        cdef long attempts = 0
        cdef vector[int] heap  # ranks of this pass, as a max-heap of negated ranks
        cdef vector[char] queued = vector[char](self.candidates.size(), 0)
        for passes in range(max_passes):
            sort(self.pending.begin(), self.pending.end())
            heap.clear()
            for k in range(<int>self.pending.size()):  # descending negated ranks: already a heap
                heap.push_back(-self.pending[k])
                queued[self.pending[k]] = True
                self.is_pending[self.pending[k]] = False
            self.pending.clear()
            if heap.empty():
                break
            while heap.size():
                at = -heap.front()
                if attempts % _ATTEMPTS_PER_CLOCK == 0 and _now() >= end:
                    for k in range(<int>heap.size()):  # left for a later call
                        _add(self.pending, self.is_pending, -heap[k])
                    return 1
                _pop_heap(heap)
                queued[at] = False
                attempts += 1
                c = self.candidates[at]
                self.read.clear()
                self.read.push_back(c)
                moved = self._attempt(c, max_group)
                if not moved:
                    self.stamp_now += 1
                    for d in self.read:
                        if self.stamp[d] != self.stamp_now:  # each reader once
                            self.stamp[d] = self.stamp_now
                            self.readers[d].push_back(at)
                    continue
                kept[0] += 1
                _add(self.pending, self.is_pending, at)
                self.stamp_now += 1
                for d in self.move_log.steps:
                    self._wake(d if d >= 0 else ~d, at, heap, queued)
                for k in range(<int>self.move_log.switched.size()):
                    self._wake(self.move_log.switched[k].first, at, heap, queued)
        return 0

    cdef void _rank_candidates(self):
        """The candidates (live or not, classes with an e-node and an alternative) in position order, all
        pending."""
        cdef vector[Keyed] order  # (position, class)
        cdef int c, k
        for c in range(self.choice.size()):
            if self.choice[c] >= 0 and self.member_start[c + 1] - self.member_start[c] > 1:
                order.push_back(Keyed(self.pos[c], c))
        sort(order.begin(), order.end())
        for k in range(order.size()):
            self.candidates.push_back(order[k].second)
            self.pending.push_back(k)
        self.is_pending = vector[char](order.size(), 1)
        self.readers = vector[vector[int]](self.choice.size())
        self.searched = True

    cdef void _wake(self, int d, int at, vector[int]& heap, vector[char]& queued) noexcept nogil:
        """Class ``d`` changed in the kept move at rank ``at``: the attempts that read it run again, later in
        this pass or in the next one."""
        cdef int r
        if self.stamp[d] == self.stamp_now:
            return
        self.stamp[d] = self.stamp_now
        for r in self.readers[d]:
            if r > at and not queued[r]:
                _push_heap(heap, -r)
                queued[r] = True
            elif r <= at:
                _add(self.pending, self.is_pending, r)
        self.readers[d].clear()

    def attempt(self, int c, int max_group=64):
        """One attempt at class ``c`` (see :meth:`improve`): the kept move's log (a copy), or None."""
        cdef Log copy
        self._check_class(c)
        if not self._attempt(c, max_group):
            return None
        copy = Log()
        copy.data = self.move_log
        return copy

    cdef int _attempt(self, int c, int max_group) except -1 nogil:
        """Switch live class ``c`` to its cheapest e-node whose move pays; 1 when a move was kept (its log in
        ``move_log``, valid until the next move), else 0."""
        cdef int k, n
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

    cdef void _rank(self, int c) noexcept nogil:
        """Sort class ``c``'s e-nodes in ``by_cost`` by (cost, index)."""
        cdef vector[Keyed] keyed
        cdef int k, first = self.member_start[c]
        for k in range(first, self.member_start[c + 1]):
            keyed.push_back(Keyed(self.costs[self.by_cost[k]], self.by_cost[k]))
        sort(keyed.begin(), keyed.end())
        for k in range(<int>keyed.size()):
            self.by_cost[first + k] = keyed[k].second
        self.ranked[c] = True

    cdef int _try_move(self, int c, int n, int max_group) except -1 nogil:
        """Switch class ``c`` to e-node ``n``, with the group and release moves that help; 1 when the whole move
        pays (kept, its log in ``move_log``), else 0 (undone)."""
        cdef int old = self.choice[c], group = 0, d, p, pc, k, j
        cdef double delta, step
        self.newly_live.clear()
        _clear(self.move_log)
        delta = self._switch(c, n, self.move_log)
        if delta < -_EPS:
            return 1
        # Group move: other classes that could read what this switch made live.
        self.brought = self.newly_live  # copied: the group's switches add to newly_live
        for j in range(<int>self.brought.size()):
            d = self.brought[j]
            if self.free_leaf[self.choice[d]]:
                continue
            for k in range(self.parent_start[d], self.parent_start[d + 1]):
                p = self.parent[k]
                pc = self.eclass[p]
                self.read.push_back(pc)
                if group >= max_group or pc == c or self.refs_[pc] == 0 or self.choice[pc] == p or not self.usable[p]:
                    continue
                _clear(self.group_log)
                step = self._switch(pc, p, self.group_log)
                if step < -_EPS:
                    _extend(self.move_log, self.group_log)
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

    cdef double _release(self, int c, int old, _Log& log) except? -1.0 nogil:
        """Switching class ``c`` away from e-node ``old`` can leave a child of ``old`` alive only for its other
        readers (the sibling projections of a multi-result node, the Narrows of a shared wide matmul): switch
        each of them to its alternative of most gain that does not read the child, so that the child dies with
        them (kept in ``log`` only then); returns the change of cost."""
        cdef double delta = 0.0
        cdef int ch, k, p, pc, j, a, m
        cdef bint some
        self.seen.clear()
        for k in range(self.child_start[old], self.child_start[old + 1]):
            ch = self.child[k]
            if _contains(self.seen, ch):
                continue
            self.seen.push_back(ch)
            if self.refs_[ch] == 0 or self.free_leaf[self.choice[ch]]:
                continue
            self.reader_class.clear()  # live classes whose chosen e-node reads ch, and that e-node
            self.reader_node.clear()
            for j in range(self.parent_start[ch], self.parent_start[ch + 1]):
                p = self.parent[j]
                pc = self.eclass[p]
                self.read.push_back(pc)
                if pc != c and self.refs_[pc] > 0 and self.choice[pc] == p:
                    self.reader_class.push_back(pc)
                    self.reader_node.push_back(p)
            if self.reader_class.empty() or <int>self.reader_class.size() > _MAX_RELEASED_READERS:
                continue
            self.alt_start.clear()  # per reader, its e-nodes that do not read ch
            self.alts.clear()
            self.alt_start.push_back(0)
            some = True
            for j in range(self.reader_class.size()):
                pc = self.reader_class[j]
                for m in range(self.member_start[pc], self.member_start[pc + 1]):
                    a = self.member[m]
                    if a != self.reader_node[j] and self.usable[a] and not self._reads(a, ch):
                        self.alts.push_back(a)
                self.alt_start.push_back(self.alts.size())
                if self.alt_start[j + 1] == self.alt_start[j]:  # the reader keeps ch alive whatever it switches to
                    some = False
                    break
            if some:
                delta += self._switch_away(ch, self.reader_class, self.alt_start, self.alts, log)
        return delta

    cdef bint _reads(self, int n, int ch) noexcept nogil:
        cdef int k
        for k in range(self.child_start[n], self.child_start[n + 1]):
            if self.child[k] == ch:
                return True
        return False

    cdef double _switch_away(self, int ch, vector[int]& reader_class, vector[int]& alt_start, vector[int]& alts,
                             _Log& log) except? -1.0 nogil:
        """Switch each reader of ``ch`` to its alternative of most gain among ``alts`` (those that leave fewer
        reading ``ch``); kept in ``log`` only if ``ch`` dies, else undone.  Returns the change of cost."""
        cdef double step = 0.0, delta_alt, best_delta
        cdef int j, m, pc, alt, before, best
        _clear(self.release_log)
        for j in range(reader_class.size()):
            pc = reader_class[j]
            best = -1  # the alternative of most gain after which fewer read ch (ties: the lowest index)
            best_delta = 0.0
            before = self.refs_[ch]
            for m in range(alt_start[j], alt_start[j + 1]):
                alt = alts[m]
                _clear(self.trial_log)
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
            _extend(log, self.release_log)
            return step
        self._read_log(self.release_log)  # still read (an output, or another path): nothing was released
        self._undo(self.release_log)
        return 0.0


cdef bint _contains(vector[int]& items, int x) noexcept nogil:
    cdef int y
    for y in items:
        if y == x:
            return True
    return False


cdef void _add(vector[int]& ranks, vector[char]& member, int r) noexcept nogil:
    if not member[r]:
        member[r] = True
        ranks.push_back(r)


# A binary max-heap of negated ranks on a vector (pops the least rank first).

cdef void _push_heap(vector[int]& heap, int x) noexcept nogil:
    cdef size_t i = heap.size(), parent
    heap.push_back(x)
    while i > 0:
        parent = (i - 1) // 2
        if heap[parent] >= heap[i]:
            break
        heap[parent], heap[i] = heap[i], heap[parent]
        i = parent


cdef void _pop_heap(vector[int]& heap) noexcept nogil:
    cdef size_t i = 0, left, largest, n
    heap[0] = heap.back()
    heap.pop_back()
    n = heap.size()
    while True:
        left = 2 * i + 1
        largest = i
        if left < n and heap[left] > heap[largest]:
            largest = left
        if left + 1 < n and heap[left + 1] > heap[largest]:
            largest = left + 1
        if largest == i:
            return
        heap[largest], heap[i] = heap[i], heap[largest]
        i = largest
