# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
# distutils: language = c++
"""egglog's frozen rows read as integers, for the view (see :func:`rlx_egraph.egraph.view.build_view`).

egglog's Python binding hands every cell of a row over as a ``Value`` object whose hash and equality run in
Rust: a dict keyed by them costs about 0.25 us per lookup, and the view looks up every cell.  A ``Value``
wraps egglog's 32-bit value id (pyo3 lays the object out as the Python object header followed by that id,
and prints it as ``Value(<id>)``), so :func:`value_id` reads the id directly and the loops below number
classes, follow list cells and key provenance by plain integers.  :func:`_check_layout` compares the read
against the printed id when the module is imported, so another binding layout fails at once and by name.

Ids are unique within one egglog sort, so every table here is keyed by ids of one sort: e-classes (the
``Op`` sort), list cells (``TensorList``), rule names (``String``).

The view's :class:`ENode` and :class:`EClass` are defined here too, as compiled classes: the reader makes one
per e-node and one per class (at 100k nodes 191,609 and 114,533), five times faster than dataclasses.
"""

cimport cython
from cython.operator cimport dereference as deref
from libcpp.map cimport map
from libcpp.pair cimport pair
from libcpp.string cimport string
from libcpp.unordered_map cimport unordered_map
from libcpp.unordered_set cimport unordered_set
from libcpp.vector cimport vector
from libc.stdint cimport uint32_t

from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM

from egglog import bindings as _eb


cdef Py_ssize_t _ID_OFFSET = sizeof(PyObject)  # the id follows the object header


cdef inline uint32_t _id(object value):
    return (<uint32_t*>((<char*><PyObject*>value) + _ID_OFFSET))[0]


def value_id(value) -> int:
    """The id of an egglog ``Value`` (unique among the values of its sort)."""
    if type(value) is not _eb.Value:
        raise TypeError(f"value_id takes an egglog Value, not {type(value).__name__}")
    return _id(value)


def _check_layout() -> None:
    """Fail unless :func:`value_id` reads the id that egglog prints for a value."""
    egraph = _eb.EGraph()
    egraph.parse_and_run_program("(datatype RlxProbe (RlxLeaf i64) (RlxPair RlxProbe RlxProbe))\n"
                                 + "\n".join(f"(RlxPair (RlxLeaf {k}) (RlxLeaf {3 * k + 1}))" for k in range(20)))
    cells = [v for f in egraph.freeze().functions.values() for row in f.rows for v in (*row.inputs, row.output)]
    if _eb.Value.__basicsize__ < _ID_OFFSET + 4 or any(str(v) != f"Value({_id(v)})" for v in cells):
        raise ImportError(f"rlx-egraph reads egglog's Value ids from the binding's object layout, and this egglog "
                          f"build lays them out differently (Value prints {cells[0]}); rlx-egraph supports "
                          f"egglog 14")


_check_layout()


cdef object _MISSING = object()

from rlx_egraph.ir.registry import REGISTRY


# Not tracked by the cycle collector (no_gc): an e-node's and an e-class's fields hold ints, strings, tuples, an
# attribute dict and a type, never an e-node or an e-class, so no cycle can run through them.  A view keeps
# hundreds of thousands of both, which every collection would otherwise scan.
@cython.no_gc
cdef class ENode:
    """An op applied to e-classes: one alternative of an e-class.  (Compiled: the view makes one per e-node,
    191,609 at 100k nodes; its fields are declared in ``_rows.pxd``, for the compiled passes to read.)"""

    def __init__(self, index, str op, tuple children, dict attrs, eclass, original=None, tuple built_by=()):
        self.index, self.op, self.children, self.attrs = index, op, children, attrs
        self.eclass, self.original, self.built_by = eclass, original, built_by

    @property
    def spec(self):
        return REGISTRY[self.op]

    def _fields(self):
        return (self.index, self.op, self.children, self.attrs, self.eclass, self.original, self.built_by)

    def __eq__(self, other):
        return type(other) is ENode and self._fields() == (<ENode>other)._fields()

    __hash__ = None  # mutable, compared by value

    def __repr__(self):
        return (f"ENode(index={self.index!r}, op={self.op!r}, children={self.children!r}, attrs={self.attrs!r}, "
                f"eclass={self.eclass!r}, original={self.original!r}, built_by={self.built_by!r})")


@cython.no_gc
cdef class EClass:
    """An e-class: its e-nodes (indices into ``EGraphView.nodes``), its type, the input-graph nodes in it and the
    rules that merged into it.  (Compiled, as :class:`ENode`.)"""

    def __init__(self, id, list nodes=None, type=None, list originals=None, tuple merged_by=()):
        self.id, self.type, self.merged_by = id, type, merged_by
        self.nodes = [] if nodes is None else nodes
        self.originals = [] if originals is None else originals

    def _fields(self):
        return (self.id, self.nodes, self.type, self.originals, self.merged_by)

    def __eq__(self, other):
        return type(other) is EClass and self._fields() == (<EClass>other)._fields()

    __hash__ = None

    def __repr__(self):
        return (f"EClass(id={self.id!r}, nodes={self.nodes!r}, type={self.type!r}, originals={self.originals!r}, "
                f"merged_by={self.merged_by!r})")


def make_classes(list eclasses, list originals) -> list:
    """One :class:`EClass` per class id: its e-nodes (those ``k`` with ``eclasses[k]`` its id, in order) and
    input-graph nodes ``originals[id]``."""
    cdef Py_ssize_t k, c, count = len(originals)
    cdef list out = [], members = [[] for _ in range(count)]
    cdef EClass cls
    for k in range(len(eclasses)):
        c = eclasses[k]
        (<list>members[c]).append(k)
    for k in range(count):
        cls = EClass.__new__(EClass)
        cls.id, cls.nodes, cls.type, cls.originals, cls.merged_by = k, members[k], None, originals[k], ()
        out.append(cls)
    return out



# Rows decoded between two looks at the deadline.
cdef int _DEADLINE_STRIDE = 4096


cdef class ClassNumbers:
    """Numbers e-class ids in order of first sight: 0, 1, 2, ..."""

    cdef vector[int] number_of  # value id -> class number, -1 when not seen yet
    cdef readonly int count
    cdef list ints  # class number -> that number as a Python int, one object for every e-node that reads it

    def __cinit__(self):
        self.ints = []

    cdef int number(self, uint32_t value):
        if value >= self.number_of.size():
            self.number_of.resize(max(<size_t>value + 1, 2 * self.number_of.size()), -1)
        cdef int k = self.number_of[value]
        if k < 0:
            k = self.number_of[value] = self.count
            self.count += 1
            self.ints.append(k)
        return k

    cdef tuple tuple_of(self, vector[int]& numbers):
        """``numbers`` (class numbers) as a Python tuple of the shared ints."""
        cdef tuple out = PyTuple_New(numbers.size())
        cdef size_t k
        cdef object item
        for k in range(numbers.size()):
            item = self.ints[numbers[k]]
            Py_INCREF(item)
            PyTuple_SET_ITEM(out, k, item)
        return out

    def of(self, value) -> int:
        """The class number of an e-class ``Value``, or -1 when not seen."""
        return self.of_id(value_id(value))

    def of_id(self, uint32_t value) -> int:
        """The class number of the e-class with value id ``value``, or -1 when not seen."""
        return self.number_of[value] if value < self.number_of.size() else -1

    def of_keys(self, list rows, key_of) -> dict:
        """Rows of a table that names e-classes: ``key_of(first input)`` -> the class number of the row's output
        (-1 when not seen), in row order."""
        cdef dict out = {}
        cdef uint32_t value
        for row in rows:
            value = _id(row.output)
            out[key_of(row.inputs[0])] = self.number_of[value] if value < self.number_of.size() else -1
        return out


def link_graph_nodes(tuple graph_nodes, dict class_of_id, int num_classes):
    """The input graph's nodes in their classes (``class_of_id``: node id -> class, -1 for none): node id ->
    class, per class its nodes' ids, and the Scalar nodes (the view tags a negative zero's e-node itself).
    Raises RuntimeError naming a node in no class."""
    cdef dict class_of_node = {}
    cdef list originals = [[] for _ in range(num_classes)], scalars = []
    cdef Py_ssize_t c
    for gnode in graph_nodes:
        nid = gnode.id
        c = class_of_id.get(nid, -1)
        if c < 0:
            raise RuntimeError(f"node {nid} ({gnode.op}): its term is in no e-class the view read")
        class_of_node[nid] = c
        (<list>originals[c]).append(nid)
        if gnode.op == "Scalar":
            scalars.append(gnode)
    return class_of_node, originals, scalars


cdef inline void _append_id(string& key, uint32_t value):
    key.append(<const char*>&value, sizeof(uint32_t))


cdef class RuleRelation:
    """The rows of a relation whose last column names a rule (a provenance table, see :mod:`.rules`): per key,
    the value ids of the other columns, ``names_of(rules)``, ``rules`` the key's rule ``Value`` objects in row
    order without repeats.  ``named`` keeps each distinct tuple of rule ids -> its names, across relations.

    Keys live in C++, as the bytes of their ids: the view looks up every e-node's row here without making a
    Python object for the key."""

    cdef unordered_map[string, int] slot_of  # key -> its slot
    cdef vector[string] keys  # per slot its key, in order of first sight
    cdef vector[int] names_at  # per slot the position of its names in ``names``
    cdef list names  # each distinct tuple of rule names once

    def __init__(self, list rows, names_of, dict named):
        cdef vector[vector[uint32_t]] rules_at  # per slot its rule ids
        cdef map[vector[uint32_t], int] position  # rule ids -> the position of their names
        cdef list inputs
        cdef dict first = {}  # rule id -> its Value
        cdef string key
        cdef Py_ssize_t width, k
        cdef uint32_t rule
        cdef int slot
        self.names = []
        for row in rows:
            inputs = row.inputs
            width = len(inputs) - 1
            key.clear()
            for k in range(width):
                _append_id(key, _id(inputs[k]))
            rule = _id(inputs[width])
            if rule not in first:
                first[rule] = inputs[width]
            found = self.slot_of.find(key)
            if found == self.slot_of.end():
                slot = self.keys.size()
                self.slot_of[key] = slot
                self.keys.push_back(key)
                rules_at.push_back(vector[uint32_t](1, rule))
            elif not _holds(rules_at[deref(found).second], rule):
                rules_at[deref(found).second].push_back(rule)
        for slot in range(rules_at.size()):
            at = position.find(rules_at[slot])
            if at == position.end():
                ids = tuple(rules_at[slot])
                names = named.get(ids)
                if names is None:
                    names = named[ids] = names_of(tuple([first[r] for r in ids]))
                position[rules_at[slot]] = len(self.names)
                self.names.append(names)
                self.names_at.push_back(len(self.names) - 1)
            else:
                self.names_at.push_back(deref(at).second)

    cdef object names_of_key(self, const string& key):
        """The names of ``key``, or () when the relation has no row for it."""
        found = self.slot_of.find(key)
        return () if found == self.slot_of.end() else self.names[self.names_at[deref(found).second]]

    def __len__(self) -> int:
        return self.keys.size()

    def items(self) -> list:
        """(key, names) per key, in order of first sight; a key is the tuple of its value ids."""
        cdef size_t slot
        cdef const uint32_t* ids
        out = []
        for slot in range(self.keys.size()):
            ids = <const uint32_t*>self.keys[slot].data()
            key = tuple([ids[k] for k in range(self.keys[slot].size() // sizeof(uint32_t))])
            out.append((key, self.names[self.names_at[slot]]))
        return out


cdef inline bint _holds(vector[uint32_t]& ids, uint32_t value):
    for k in range(ids.size()):
        if ids[k] == value:
            return True
    return False


cdef class ListCells:
    """The cells of the ``TensorList`` sort: list id -> (head class value id, tail list id); when two rows
    give one list, the first wins."""

    cdef unordered_map[uint32_t, pair[uint32_t, uint32_t]] cells

    def __init__(self, list rows):
        cdef list inputs
        for row in rows:
            inputs = row.inputs
            self.cells.insert(pair[uint32_t, pair[uint32_t, uint32_t]](
                _id(row.output), pair[uint32_t, uint32_t](_id(inputs[0]), _id(inputs[1]))))

    cdef void extend(self, uint32_t value, vector[uint32_t]& out):
        """Append the class ids of list ``value``'s items to ``out``."""
        cdef unordered_map[uint32_t, pair[uint32_t, uint32_t]].iterator it = self.cells.find(value)
        while it != self.cells.end():
            out.push_back(deref(it).second.first)
            it = self.cells.find(deref(it).second.second)


def read_enodes(str op, list rows, list input_columns, list attr_columns, ClassNumbers classes, ListCells lists,
                set absent, convert, RuleRelation built_by not None, list nodes, list eclasses, deadline) -> None:
    """Append to ``nodes`` one :class:`ENode` per live row of op ``op``'s table, and its class to ``eclasses``.

    ``input_columns``: (column, variadic) per input, in order; an input reading a class in ``absent`` (value
    ids) is left out and a variadic one gives its list's items.  ``attr_columns``: (column, attribute name, kind,
    cache) per attribute, ``cache`` a dict of value id -> ``convert(value, kind)``, the Python value.  E-nodes
    whose attribute columns hold the same ids share one attributes dict.  ``built_by``: the rules that built
    each row, keyed by the row's whole key.  Classes are numbered by ``classes``, children before the output.
    ``deadline.check`` runs every 4096 rows.
    """
    cdef Py_ssize_t r = 0, k, j
    cdef list inputs
    cdef tuple column
    cdef dict cache
    cdef list interned = []  # distinct attributes dicts
    cdef unordered_map[string, int] interned_at  # attribute columns' ids -> the place of their dict
    cdef unordered_set[uint32_t] absent_ids
    cdef vector[int] input_at, kids
    cdef vector[char] variadic
    cdef vector[uint32_t] items
    cdef bint plain = not attr_columns and not any(v for _, v in input_columns)
    cdef uint32_t value
    cdef string row_key, attrs_key
    cdef object attrs, no_attrs = {}, python_value
    cdef ENode enode
    for k, v in input_columns:
        input_at.push_back(k)
        variadic.push_back(v)
    for value in absent:
        absent_ids.insert(value)
    for row in rows:
        if r % _DEADLINE_STRIDE == 0:
            deadline.check("building the e-graph view")
        r += 1
        if row.subsumed:
            continue
        inputs = row.inputs
        kids.clear()
        if plain:
            attrs = no_attrs
            for k in range(len(inputs)):
                value = _id(inputs[k])
                if not absent_ids.count(value):
                    kids.push_back(classes.number(value))
        else:
            attrs_key.clear()
            for j in range(len(attr_columns)):
                _append_id(attrs_key, _id(inputs[(<tuple>attr_columns[j])[0]]))
            found = interned_at.find(attrs_key)
            if found != interned_at.end():
                attrs = interned[deref(found).second]
            else:
                attrs = {}
                interned_at[attrs_key] = len(interned)
                interned.append(attrs)
                for j in range(len(attr_columns)):
                    column = attr_columns[j]
                    cache = column[3]
                    value = _id(inputs[column[0]])
                    python_value = cache.get(value, _MISSING)
                    if python_value is _MISSING:
                        python_value = cache[value] = convert(inputs[column[0]], column[2])
                    attrs[column[1]] = python_value
            for j in range(input_at.size()):
                value = _id(inputs[input_at[j]])
                if variadic[j]:
                    items.clear()
                    lists.extend(value, items)
                    for value in items:
                        kids.push_back(classes.number(value))
                elif not absent_ids.count(value):
                    kids.push_back(classes.number(value))
        out = classes.number(_id(row.output))
        if built_by.keys.empty():
            built = ()
        else:
            row_key.clear()
            for k in range(len(inputs)):
                _append_id(row_key, _id(inputs[k]))
            built = built_by.names_of_key(row_key)
        enode = ENode.__new__(ENode)
        enode.index, enode.op, enode.children, enode.attrs = len(nodes), op, classes.tuple_of(kids), attrs
        enode.eclass, enode.original, enode.built_by = classes.ints[out], None, built
        nodes.append(enode)
        eclasses.append(enode.eclass)
