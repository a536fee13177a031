"""egglog's frozen rows read into the view's e-nodes and e-classes (see :func:`rlx_egraph.egraph.view.build_view`).

egglog's binding hands every cell of a row over as a ``Value``: hashable and comparable (in Rust), equal to
another exactly when both name the same value of one sort.  The tables here are keyed by these objects, each by
values of one sort: e-classes (the ``Op`` sort), list cells (``TensorList``), rule names (``String``).

The view's :class:`ENode` and :class:`EClass` are defined here too: the reader makes one per e-node and one per
class (at 100k nodes some 190,000 and 115,000).  Compiled (``_rows.pxd`` declares their fields, for the other
compiled passes), they are extension types that the cycle collector does not track: their fields hold ints,
strings, tuples, an attributes dict and a type, never an e-node or an e-class, so no cycle runs through them.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from typing import Any

try:
    import cython
except ModuleNotFoundError:  # Cython compiles this module; the module runs without it
    from .. import _cython_shim as cython

from ..ir.registry import REGISTRY, OpSpec

COMPILED: bool = cython.compiled

# Rows decoded between two looks at the deadline.
_DEADLINE_STRIDE = 4096

_MISSING = object()


@cython.no_gc  # above cclass: compiled, a class directive
@cython.cclass
class ENode:
    """An op applied to e-classes: one alternative of an e-class."""

    def __init__(self, index: int, op: str, children: tuple[int, ...], attrs: dict[str, Any], eclass: int,
                 original: int | None = None, built_by: tuple[str, ...] = ()) -> None:
        self.index, self.op, self.children, self.attrs = index, op, children, attrs
        self.eclass, self.original, self.built_by = eclass, original, built_by

    @property
    def spec(self) -> OpSpec:
        return REGISTRY[self.op]

    def _fields(self) -> tuple:
        return (self.index, self.op, self.children, self.attrs, self.eclass, self.original, self.built_by)

    def __eq__(self, other: object) -> bool:
        return type(other) is ENode and self._fields() == other._fields()

    __hash__ = None  # mutable, compared by value

    def __repr__(self) -> str:
        return (f"ENode(index={self.index!r}, op={self.op!r}, children={self.children!r}, attrs={self.attrs!r}, "
                f"eclass={self.eclass!r}, original={self.original!r}, built_by={self.built_by!r})")


@cython.no_gc
@cython.cclass
class EClass:
    """An e-class: its e-nodes (indices into ``EGraphView.nodes``), its type, the input-graph nodes in it and the
    rules that merged into it."""

    def __init__(self, id: int, nodes: list[int] | None = None, type: Any = None, originals: list[int] | None = None,
                 merged_by: tuple[str, ...] = ()) -> None:
        self.id, self.type, self.merged_by = id, type, merged_by
        self.nodes = [] if nodes is None else nodes
        self.originals = [] if originals is None else originals

    def _fields(self) -> tuple:
        return (self.id, self.nodes, self.type, self.originals, self.merged_by)

    def __eq__(self, other: object) -> bool:
        return type(other) is EClass and self._fields() == other._fields()

    __hash__ = None

    def __repr__(self) -> str:
        return (f"EClass(id={self.id!r}, nodes={self.nodes!r}, type={self.type!r}, originals={self.originals!r}, "
                f"merged_by={self.merged_by!r})")


def make_classes(eclasses: list[int], originals: list[list[int]]) -> list[EClass]:
    """One :class:`EClass` per class id: its e-nodes (those ``k`` with ``eclasses[k]`` its id, in order) and
    input-graph nodes ``originals[id]``."""
    k: cython.Py_ssize_t
    c: cython.Py_ssize_t
    count: cython.Py_ssize_t = len(originals)
    members: list = [[] for _ in range(count)]
    its_members: list
    out: list = []
    cls: EClass
    for k in range(len(eclasses)):
        c = eclasses[k]
        its_members = members[c]
        its_members.append(k)
    for k in range(count):
        cls = EClass.__new__(EClass)
        cls.id, cls.nodes, cls.type, cls.originals, cls.merged_by = k, members[k], None, originals[k], ()
        out.append(cls)
    return out


class ClassNumbers:
    """Numbers e-classes (their ``Value`` objects) in order of first sight: 0, 1, 2, ...  The ``absent`` values
    (the term of an absent optional input) are no class: they get no number."""

    def __init__(self, absent: Iterable[Any] = ()) -> None:
        self.number_of = dict.fromkeys(absent)  # e-class Value -> its number (None: absent)
        self.count = 0

    def number(self, value: object) -> object:
        """The number of e-class ``value``, numbering it if it is new (one int object per class, shared by every
        e-node that reads it); None for an absent value."""
        k = self.number_of.get(value, _MISSING)
        if k is _MISSING:
            k = self.number_of[value] = self.count
            self.count += 1
        return k

    def of(self, value: Any) -> int:
        """The number of the e-class ``value``, or -1 when not seen (or absent)."""
        k = self.number_of.get(value)
        return -1 if k is None else k

    def of_keys(self, rows: list[Any], key_of: Callable[[Any], Any]) -> dict[Any, int]:
        """Rows of a table that names e-classes: ``key_of(first input)`` -> the number of the row's output (-1
        when not seen), in row order."""
        out: dict = {}
        number_of: dict = self.number_of
        for row in rows:
            k = number_of.get(row.output)
            out[key_of(row.inputs[0])] = -1 if k is None else k
        return out


def link_graph_nodes(graph_nodes: tuple[Any, ...], class_of_id: dict[int, int], num_classes: int
                     ) -> tuple[dict[int, int], list[list[int]], list[Any]]:
    """The input graph's nodes in their classes (``class_of_id``: node id -> class, -1 for none): node id ->
    class, per class its nodes' ids, and the Scalar nodes (the view tags a negative zero's e-node itself).
    Raises RuntimeError naming a node in no class."""
    class_of_node: dict = {}
    originals: list = [[] for _ in range(num_classes)]
    scalars: list = []
    its_nodes: list
    c: cython.Py_ssize_t
    for gnode in graph_nodes:
        nid = gnode.id
        c = class_of_id.get(nid, -1)
        if c < 0:
            raise RuntimeError(f"node {nid} ({gnode.op}): its term is in no e-class the view read")
        class_of_node[nid] = c
        its_nodes = originals[c]
        its_nodes.append(nid)
        if gnode.op == "Scalar":
            scalars.append(gnode)
    return class_of_node, originals, scalars


class RuleRelation:
    """The rows of a relation whose last column names a rule (a provenance table, see :mod:`.rules`): per key
    (the tuple of the other columns' Values) ``names_of(rules)``, ``rules`` the key's rule Values in row order
    without repeats.  ``named`` keeps each distinct tuple of rule Values -> its names, across relations."""

    def __init__(self, rows: list[Any], names_of: Callable[[tuple[Any, ...]], tuple[str, ...]],
                 named: dict[tuple[Any, ...], tuple[str, ...]]) -> None:
        rules_at: dict = {}  # key -> its rule Values
        inputs: list
        rules: list
        for row in rows:
            inputs = row.inputs  # a new list at every read: taken apart here
            rule = inputs.pop()
            key = tuple(inputs)
            found = rules_at.get(key)
            if found is None:
                rules_at[key] = [rule]
            else:
                rules = found
                if rule not in rules:
                    rules.append(rule)
        self.names = {}
        for key, rules in rules_at.items():
            ids = tuple(rules)
            names = named.get(ids)
            if names is None:
                names = named[ids] = names_of(ids)
            self.names[key] = names

    def __len__(self) -> int:
        return len(self.names)

    def items(self) -> list[tuple[tuple[Any, ...], tuple[str, ...]]]:
        """(key, names) per key, in order of first sight; a key is the tuple of its Values."""
        return list(self.names.items())


class ListCells:
    """The cells of the ``TensorList`` sort: list Value -> (head class Value, tail list Value); when two rows give
    one list, the first wins."""

    def __init__(self, rows: list[Any]) -> None:
        self.cells = {}
        inputs: list
        for row in rows:
            inputs = row.inputs
            self.cells.setdefault(row.output, (inputs[0], inputs[1]))

    def extend(self, value: object, out: list) -> cython.void:
        """Append the class Values of list ``value``'s items to ``out``."""
        cell = self.cells.get(value)
        while cell is not None:
            out.append(cell[0])
            cell = self.cells.get(cell[1])


def read_enodes(op: str, rows: list[Any], input_columns: list[tuple[int, bool]],
                attr_columns: list[tuple[int, str, Any, dict[Any, Any]]], classes: ClassNumbers, lists: ListCells,
                convert: Callable[[Any, Any], Any], built_by: RuleRelation, nodes: list[ENode], eclasses: list[int],
                deadline: Any) -> None:
    """Append to ``nodes`` one :class:`ENode` per live row of op ``op``'s table, and its class to ``eclasses``.

    ``input_columns``: (column, variadic) per input, in order; an input reading an absent value (see
    :class:`ClassNumbers`) is left out and a variadic one gives its list's items.  ``attr_columns``: (column,
    attribute name, kind, cache) per attribute, ``cache`` a dict of Value -> ``convert(value, kind)``, the Python
    value.  E-nodes whose attribute columns hold the same Values share one attributes dict.  ``built_by``: the
    rules that built each row, keyed by the row's whole key.  Classes are numbered by ``classes``, children before
    the output.  ``deadline.check`` runs every 4096 rows.
    """
    r: cython.Py_ssize_t = 0
    j: cython.Py_ssize_t
    width: cython.Py_ssize_t = len(attr_columns)
    inputs: list
    kids: list
    column: tuple
    cache: dict
    items: list = []
    interned: dict = {}  # attribute columns' Values -> their shared attributes dict
    input_at: cython.int[::1] = array("i", [k for k, _ in input_columns] or [0])
    variadic: cython.char[::1] = array("b", [bool(v) for _, v in input_columns] or [0])
    attr_at: cython.int[::1] = array("i", [column[0] for column in attr_columns] or [0])
    num_inputs: cython.Py_ssize_t = len(input_columns)
    plain: cython.bint = not attr_columns and not any(v for _, v in input_columns)
    no_attrs: dict = {}
    attrs: dict
    names: dict = built_by.names
    enode: ENode
    for row in rows:
        if r % _DEADLINE_STRIDE == 0:
            deadline.check("building the e-graph view")
        r += 1
        if row.subsumed:
            continue
        inputs = row.inputs
        kids = []
        if plain:
            attrs = no_attrs
            for value in inputs:
                k = classes.number(value)
                if k is not None:
                    kids.append(k)
        else:
            attrs_key = inputs[attr_at[0]] if width == 1 else tuple([inputs[attr_at[j]] for j in range(width)])
            found = interned.get(attrs_key)
            if found is not None:
                attrs = found
            else:
                attrs = {}
                interned[attrs_key] = attrs
                for j in range(width):
                    column = attr_columns[j]
                    cache = column[3]
                    value = inputs[attr_at[j]]
                    python_value = cache.get(value, _MISSING)
                    if python_value is _MISSING:
                        python_value = cache[value] = convert(value, column[2])
                    attrs[column[1]] = python_value
            for j in range(num_inputs):
                value = inputs[input_at[j]]
                if variadic[j]:
                    items.clear()
                    lists.extend(value, items)
                    for item in items:
                        k = classes.number(item)
                        if k is not None:
                            kids.append(k)
                else:
                    k = classes.number(value)
                    if k is not None:
                        kids.append(k)
        enode = ENode.__new__(ENode)
        enode.index, enode.op, enode.children, enode.attrs = len(nodes), op, tuple(kids), attrs
        enode.eclass, enode.original = classes.number(row.output), None
        enode.built_by = names.get(tuple(inputs), ()) if names else ()
        nodes.append(enode)
        eclasses.append(enode.eclass)
