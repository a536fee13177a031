"""The view's passes over the flat e-graph: its type propagation (see :func:`rlx_egraph.egraph.view._check_types`)
and its tagging of the e-nodes that are input-graph nodes."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from typing import Any

try:
    import cython
except ModuleNotFoundError:  # Cython compiles this module; the module runs without it
    from .. import _cython_shim as cython

from numpy import ndarray

from ._flat import FlatEGraph, flag_array, int_array
from ._rows import ENode

if cython.compiled:  # a C function, cimported (_flat.pxd)
    from cython.cimports.rlx_egraph.egraph._flat import address
else:
    from ._flat import address

COMPILED: bool = cython.compiled

# E-nodes type-checked between two looks at the deadline (as the view's row decoding).
_DEADLINE_STRIDE = 4096
# The errors that make an e-node ill-typed: ShapeError, or a rule gone wild.
_ILL_TYPED = (ArithmeticError, LookupError, TypeError, ValueError)

_MISSING = object()


def input_types(graph_nodes: tuple[Any, ...], class_of: dict[int, int], num_classes: int, numbers: dict[tuple, int],
                number_of_node: Callable[[Any], int]) -> tuple[array, set[int]]:
    """Per class the type number of the input-graph nodes in it (``class_of``: node id -> class), -1 for none,
    and the classes holding nodes of different types.  ``numbers``: (shape, dtype, parts) -> type number;
    ``number_of_node(node)`` numbers a node whose key is not in it yet."""
    out = int_array(num_classes, -1)
    fixed: cython.int[::1] = out
    split: set = set()
    seen: dict = {}  # the identities of a (shape, dtype, parts) -> its type number
    c: cython.int
    k: cython.int
    for gnode in graph_nodes:
        c = class_of[gnode.id]
        shape, dtype, parts = gnode.shape, gnode.dtype, gnode.parts
        key = (address(shape), address(dtype), address(parts))  # nodes share shape objects: most need no hash
        found = seen.get(key)
        if found is not None:
            k = found
        else:
            number = numbers.get((shape, dtype, parts))
            k = number_of_node(gnode) if number is None else number
            seen[key] = k
        if fixed[c] < 0:
            fixed[c] = k
        elif fixed[c] != k:
            split.add(c)
    return out, split


def propagate_types(g: FlatEGraph, nodes: list[ENode], fixed: Iterable[int], original: Iterable[bool],
                    excluded: Iterable[int], infer: Callable[[int, tuple[int, ...]], int], deadline: Any
                    ) -> tuple[list[int], list[bool], dict[int, Exception], dict[int, tuple[int, int]],
                               dict[int, set[int]]]:
    """The view's type propagation over the flat e-graph.

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
    type_array = array("i", fixed)
    types: cython.int[::1] = type_array
    is_fixed: cython.int[::1] = array("i", fixed)
    is_original: cython.char[::1] = array("b", original)
    waiting: cython.int[::1] = int_array(g.num_nodes, 0)
    queue: cython.int[::1] = int_array(g.num_nodes, 0)  # each rule-made e-node comes at most once
    seen: cython.int[::1] = int_array(g.num_classes, -1)
    kept: cython.char[::1] = flag_array(g.num_nodes, 0)
    skip: cython.char[::1] = flag_array(g.num_classes, 0)
    n: cython.int
    c: cython.int
    k: cython.int
    out: cython.int
    have: cython.int
    p: cython.int
    head: cython.Py_ssize_t = 0
    tail: cython.Py_ssize_t = 0
    ok: cython.bint
    errors: dict = {}
    mismatches: dict = {}
    conflicts: dict = {}
    memo: dict = {}  # signature -> its outcome
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
            queue[tail] = n
            tail += 1
    while head < tail:
        n = queue[head]
        head += 1
        if n % _DEADLINE_STRIDE == 0:
            deadline.check("type-checking the e-graph view")
        c = g.eclass[n]
        if skip[c]:
            continue
        key = g.signature(nodes[n], n, types, 0, True)
        hit = memo.get(key, _MISSING)
        if hit is _MISSING:
            try:
                hit = infer(n, tuple([types[g.child[k]] for k in range(g.child_start[n], g.child_start[n + 1])]))
            except _ILL_TYPED as exc:
                hit = exc
            memo[key] = hit
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
                    queue[tail] = p
                    tail += 1
        if out == have:
            kept[n] = True
        else:
            mismatches[n] = (out, have)
            if is_fixed[c] < 0:
                conflicts.setdefault(c, {have}).add(out)
    return type_array.tolist(), [bool(kept[n]) for n in range(g.num_nodes)], errors, mismatches, conflicts


def original_flags(nodes: list[ENode]) -> list[bool]:
    """Per e-node whether it is a node of the input graph."""
    out: list = []
    node: ENode
    for node in nodes:
        out.append(node.original is not None)
    return out


def classes_of_ops(nodes: list[ENode], ops: Iterable[str]) -> set[int]:
    """The classes of the e-nodes whose op is in ``ops``."""
    out: set = set()
    node: ENode
    for node in nodes:
        if node.op in ops:
            out.add(node.eclass)
    return out


@cython.cfunc
@cython.exceptval(-1, check=True)
def _same_attrs(n: cython.int, have: dict, gnode: object, same_attrs: object) -> cython.bint:
    """Whether e-node ``n``'s attributes ``have`` equal ``gnode``'s: compared here, the first pair that holds an
    array left to ``same_attrs(n, gnode)``."""
    want: dict = gnode.attrs
    if len(have) != len(want):
        return False
    for key, value in have.items():
        other = want.get(key, _MISSING)
        if other is _MISSING:
            return False
        if isinstance(value, ndarray) or isinstance(other, ndarray):
            return same_attrs(n, gnode)
        if value != other:
            return False
    return True


def match_originals(g: FlatEGraph, nodes: list[ENode], op_spans: list[tuple[str, int, int, bool]],
                    graph_nodes: tuple[Any, ...], class_of: dict[int, int], skip: set[int],
                    same_attrs: Callable[[int, Any], bool]) -> list[int]:
    """Per node of ``graph_nodes`` (the input graph's, in order), the e-node that is it, -1 for none: the first
    e-node of the node's class (``class_of``: node id -> class) that has its op, its inputs' classes as
    children and is no other node's, and its attributes (``nodes``: the e-nodes) when the op has attribute
    columns, else none.  Attributes are compared here unless one is an array; then by ``same_attrs(e-node,
    node)`` (:func:`rlx_egraph.ir.graph.attrs_equal`, which gives the same answer for the others).
    ``op_spans``: (op, first e-node, end, whether the op has attributes) per op (the view reads the e-nodes op
    by op); nodes of ``skip`` (ids) are matched already."""
    op_of: cython.int[::1] = int_array(g.num_nodes, -1)
    taken: cython.char[::1] = flag_array(g.num_nodes, 0)
    attributed: cython.char[::1] = flag_array(len(op_spans), 0)
    inputs: cython.int[::1] = int_array(16, 0)
    found: list = []
    op_number: dict = {}
    k: cython.int
    n: cython.int
    m: cython.int
    j: cython.int
    c: cython.int
    op: cython.int
    first: cython.int
    end: cython.int
    width: cython.int
    match: cython.bint
    enode: ENode
    for k, (name, first, end, has_attrs) in enumerate(op_spans):
        op_number[name] = k
        attributed[k] = has_attrs
        for n in range(first, end):
            op_of[n] = k
    for gnode in graph_nodes:
        found.append(-1)
        if gnode.id in skip:
            continue
        op = op_number.get(gnode.op, -2)  # -1: e-nodes outside the spans
        c = class_of[gnode.id]
        width = len(gnode.inputs)
        if width > len(inputs):
            inputs = int_array(width, 0)
        for j in range(width):
            inputs[j] = class_of[gnode.inputs[j]]
        for m in range(g.member_start[c], g.member_start[c + 1]):
            n = g.member[m]
            if op_of[n] != op or taken[n] or g.child_start[n + 1] - g.child_start[n] != width:
                continue
            match = True
            for j in range(width):
                if g.child[g.child_start[n] + j] != inputs[j]:
                    match = False
                    break
            if not match:
                continue
            enode = nodes[n]
            if _same_attrs(n, enode.attrs, gnode, same_attrs) if attributed[op] else not gnode.attrs:
                taken[n] = True
                found[len(found) - 1] = n
                break
    return found
