"""A Python view of a saturated e-graph: classes, decoded e-nodes and types.

Built from egglog's frozen e-graph.  Every e-node is decoded back into an op
name, its input classes and its attributes (the inverse of the encoder), and
every e-node of every class is type-checked with the registry (arity,
attributes, shape rule).  A class holding input-graph nodes has their type; a
class that rules made has the type its e-nodes infer.

An e-node that is ill-typed, or whose type differs from its class's, was built
by an unsound rule: it is left out of the view, so extraction never sees it,
and listed in ``EGraphView.ill_typed``.  A class holding input-graph nodes of
different types means a rule merged values that cannot be equal: the whole
e-graph is suspect, and ``EGraphView.merged`` says so.  With ``strict`` both
raise :class:`UnsoundRewrite` instead.

Provenance comes from the tables the instrumented rules fill (see :mod:`.rules`):
each e-node knows the rules that built it, each e-class the rules that merged
into it, and every blame names exactly those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from egglog import bindings as eb

from ...errors import RlxError
from ...ir.graph import Graph, Node, attrs_equal
from ...ir.registry import REGISTRY, TUPLE, AttrType, Kind, TensorType, TupleType, ValueType, ops_of_kind
from ...rules.flat import is_negative_zero_scalar
from ..budget import Deadline
from ._flat import FlatEGraph
from ._rows import ClassNumbers, EClass, ENode, ListCells, RuleRelation, link_graph_nodes, make_classes, read_enodes
from ._typecheck import classes_of_ops, input_types, match_originals, original_flags, propagate_types
from .encode import NODE_TABLE, string_value
from .rules import MERGED_BY, RELIED_ON, RuleSet, built_by_table
from .schema import LIST_CONS, NO_INPUT, constructor_args


class UnsoundRewrite(RlxError, RuntimeError):
    """A saturated e-class holds terms of different types (an unsound rule)."""


@dataclass(frozen=True)
class IllTyped:
    """An e-node left out of extraction: a rule built a term of the wrong type."""

    op: str
    eclass: int
    problem: str
    rules: tuple[str, ...]  # the rules that built the e-node or merged into its class
    message: str  # the full sentence, rules with their file:line

    def to_dict(self) -> dict:
        return {"op": self.op, "eclass": self.eclass, "problem": self.problem, "rules": list(self.rules)}


@dataclass(frozen=True)
class MergedInputs:
    """An e-class holding input-graph nodes of different types: a rule merged unequal values."""

    eclass: int
    members: tuple[tuple[int, str, TensorType], ...]  # (graph node id, op, type)
    rules: tuple[str, ...]  # the rules that merged into the class or built its e-nodes
    message: str


@dataclass
class EGraphView:
    classes: list[EClass]
    nodes: list[ENode]  # the well-typed e-nodes only
    class_of_node: dict[int, int]  # graph node id -> class id
    ill_typed: list[IllTyped] = field(default_factory=list)
    merged: list[MergedInputs] = field(default_factory=list)
    dropped: int = 0  # e-nodes left out: ill-typed, or reading a class that has no type
    class_numbers: ClassNumbers | None = field(default=None, repr=False)  # egglog e-class Value -> class id
    # class id -> the rules that wrote the helper-relation rows the rules building its e-nodes read
    relied_on: dict[int, tuple[str, ...]] = field(default_factory=dict)
    _type_numbers: list[int] | None = field(default=None, init=False, repr=False, compare=False)
    _memo: dict[str, tuple[list[ENode], int, Any]] = field(default_factory=dict, init=False, repr=False,
                                                          compare=False)

    def class_of_value(self, value: Any) -> int | None:
        """The class of an egglog e-class ``Value`` of the saturated e-graph, or None when the view has none."""
        k = -1 if self.class_numbers is None else self.class_numbers.of(value)
        return None if k < 0 else k

    @property
    def num_enodes(self) -> int:
        """E-nodes in the e-graph, those left out included."""
        return len(self.nodes) + self.dropped

    def _per_nodes(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, kept under ``name`` until the list of e-nodes is replaced or resized."""
        hit = self._memo.get(name)
        if hit is not None and hit[0] is self.nodes and hit[1] == len(self.nodes):
            return hit[2]
        value = compute()
        self._memo[name] = (self.nodes, len(self.nodes), value)
        return value

    def parents(self) -> list[list[int]]:
        """For each class, the e-nodes that read it, each once, in e-node order (from :meth:`flat`; computed once
        per list of e-nodes; do not modify it)."""
        return self._per_nodes("parents", lambda: self.flat().parents())

    def type_numbers(self) -> list[int]:
        """Per class, a number for its type: equal numbers for equal types, -1 for no type (computed once: the
        memos of pricing and decoding key on them)."""
        if self._type_numbers is None or len(self._type_numbers) != len(self.classes):
            numbering = _TypeNumbers()
            self._type_numbers = [-1 if c.type is None else numbering.of_type(c.type) for c in self.classes]
        return self._type_numbers

    def original_flags(self) -> list[bool]:
        """Per e-node whether it is a node of the input graph (computed once per list of e-nodes, like
        :meth:`parents`; do not modify it)."""
        return self._per_nodes("original_flags", lambda: original_flags(self.nodes))

    def leaf_classes(self) -> set[int]:
        """The classes that hold a leaf e-node (an op of kind leaf: Input, Param, Constant, Scalar; computed once
        per list of e-nodes, like :meth:`parents`; do not modify it)."""
        return self._per_nodes("leaf_classes", lambda: classes_of_ops(self.nodes, ops_of_kind(Kind.LEAF)))

    def flat(self) -> FlatEGraph:
        """The e-graph as integer arrays, for the passes over it (computed once per list of e-nodes)."""
        return self._per_nodes("flat", lambda: FlatEGraph(self))


class _Values:
    """Converts egglog primitive Values to Python, caching per Value."""

    def __init__(self, egraph: eb.EGraph, constants: dict[str, Any]) -> None:
        self.egraph = egraph
        self.constants = constants
        self.cache: dict[AttrType, dict[Any, Any]] = {kind: {} for kind in AttrType}  # per kind: Value -> Python

    def get(self, value: Any, kind: AttrType) -> Any:
        cache = self.cache[kind]
        hit = cache.get(value, self)
        if hit is self:
            hit = cache[value] = self.convert(value, kind)
        return hit

    def convert(self, value: Any, kind: AttrType) -> Any:
        """The Python value of ``value``, an attribute of ``kind``."""
        eg = self.egraph
        if kind is AttrType.INT:
            return eg.value_to_i64(value)
        if kind is AttrType.FLOAT:
            return eg.value_to_f64(value)
        if kind is AttrType.BOOL:
            return eg.value_to_bool(value)
        if kind is AttrType.INTS:
            return tuple(eg.value_to_i64(v) for v in eg.value_to_vec(value))
        text = eg.value_to_string(value)
        return self.constants[text] if kind is AttrType.ARRAY else string_value(text)


class _Provenance:
    """Reads the provenance relations the instrumented rules fill (see :mod:`.rules`)."""

    def __init__(self, values: _Values, rules: RuleSet) -> None:
        self.values = values
        self.rank: dict[str, int] = {}  # base rule name -> its place in file order (provenance names base rules)
        for k, r in enumerate(rules.rules):
            self.rank.setdefault(r.base, k)
        self.named: dict[tuple[Any, ...], tuple[str, ...]] = {}  # rule-name Values -> names

    def table(self, rows: list[Any]) -> RuleRelation:
        """Rows of a provenance relation: key (its leading columns' Values) -> rule names, in rule-file
        order."""
        return RuleRelation(rows, self._names, self.named)

    def relied_on(self, rows: list[Any], classes: ClassNumbers) -> dict[int, tuple[str, ...]]:
        """The rows of ``relied-on`` (class Value -> a set of rule names): class id -> names, in rule-file order."""
        out = {}
        for row in rows:
            cid = classes.of(row.inputs[0])
            if cid >= 0:
                out[cid] = self._names(tuple(self.values.egraph.value_to_set(row.output)))
        return out

    def _names(self, rules: tuple[Any, ...]) -> tuple[str, ...]:
        found = {self.values.get(v, AttrType.STR) for v in rules}
        return tuple(sorted(found, key=lambda n: (self.rank.get(n, len(self.rank)), n)))


def view_tables() -> list[str]:
    """The egglog functions :func:`build_view` reads: the op constructors, list cells and the absent input,
    the provenance relations (with the writers of the helper rows a rule relied on), and the table of
    input-graph terms."""
    ops = sorted(REGISTRY)
    return [*ops, LIST_CONS, NO_INPUT, *map(built_by_table, ops), MERGED_BY, RELIED_ON, NODE_TABLE]


def build_view(egraph: eb.EGraph, graph: Graph, constants: dict[str, Any], rules: RuleSet,
               strict: bool = False, deadline: Deadline | None = None) -> EGraphView:
    """Decode the saturated ``egraph`` of ``graph`` into an :class:`EGraphView`.

    ``strict``: raise :class:`UnsoundRewrite` on the first merged or ill-typed
    e-node instead of recording it and leaving it out.  Raises
    :class:`~.budget.DeadlineExceeded` when ``deadline`` passes first.
    """
    deadline = deadline or Deadline()
    functions = egraph.freeze().functions

    def rows(name: str) -> list[Any]:
        return functions[name].rows if name in functions else []

    # e-class Value -> class id, numbered in order of first sight; the absent input's term is no class
    classes_seen = ClassNumbers(row.output for row in rows(NO_INPUT))
    lists = ListCells(rows(LIST_CONS))
    values = _Values(egraph, constants)
    provenance = _Provenance(values, rules)
    nodes: list[ENode] = []
    eclasses: list[int] = []  # per e-node its class
    op_spans: list[tuple[str, int, int, bool]] = []  # per op: its e-nodes' range, whether it has attributes
    for name in sorted(REGISTRY):
        if name not in functions:
            continue
        spec = REGISTRY[name]
        kinds = {a.name: a.type for a in spec.attrs}
        args = constructor_args(spec)
        attr_columns = [(k, a.name, kinds[a.name], values.cache[kinds[a.name]]) for k, a in enumerate(args)
                        if not a.is_input]
        first = len(nodes)
        read_enodes(name, functions[name].rows, [(k, a.variadic) for k, a in enumerate(args) if a.is_input],
                    attr_columns, classes_seen, lists, values.convert,
                    provenance.table(rows(built_by_table(name))), nodes, eclasses, deadline)
        op_spans.append((name, first, len(nodes), bool(attr_columns)))

    class_of_id = classes_seen.of_keys(functions[NODE_TABLE].rows, egraph.value_to_i64)  # node id -> class
    class_of_node, originals, scalars = link_graph_nodes(graph.nodes, class_of_id, classes_seen.count)
    negative_zeros: set[int] = set()  # graph nodes whose e-node is made here, already tagged
    for gnode in scalars:
        if is_negative_zero_scalar(gnode):  # as Neg(Scalar 0.0): the leaf is an e-node too
            cid = class_of_node[gnode.id]
            nodes.append(ENode(len(nodes), gnode.op, (), dict(gnode.attrs), cid, gnode.id))
            eclasses.append(cid)
            negative_zeros.add(gnode.id)
    classes = make_classes(eclasses, originals)
    for (value,), names in provenance.table(rows(MERGED_BY)).items():
        classes[classes_seen.of(value)].merged_by = names
    view = EGraphView(classes, nodes, class_of_node, class_numbers=classes_seen,
                      relied_on=provenance.relied_on(rows(RELIED_ON), classes_seen))
    _mark_originals(view, graph, negative_zeros, op_spans)
    kept = _check_types(view, graph, rules, strict, deadline)
    _keep_only(view, kept)
    return view


def _mark_originals(view: EGraphView, graph: Graph, marked: set[int], op_spans: list[tuple[str, int, int, bool]]
                    ) -> None:
    """Tag each e-node that is exactly a node of the input graph (but those of ``marked``, tagged already;
    ``op_spans``: see :func:`._typecheck.match_originals`)."""
    nodes = view.nodes

    def same_attrs(n: int, gnode: Node) -> bool:
        return attrs_equal(nodes[n].attrs, gnode.attrs)

    found = match_originals(view.flat(), nodes, op_spans, graph.nodes, view.class_of_node, marked, same_attrs)
    for gnode, n in zip(graph.nodes, found, strict=True):
        if n >= 0:
            nodes[n].original = gnode.id


def blamed_rules(view: EGraphView, enodes: Iterable[int], classes: Iterable[int]) -> tuple[str, ...]:
    """The rules that built any of ``enodes`` or merged into any of ``classes``, then those that wrote the helper rows
    they read, each once, in that order."""
    classes = list(classes)
    names = [name for i in enodes for name in view.nodes[i].built_by]
    names += [name for c in classes for name in view.classes[c].merged_by]
    names += [name for c in classes for name in view.relied_on.get(c, ())]
    return tuple(dict.fromkeys(names))


def _named(names: tuple[str, ...], rules: RuleSet) -> str:
    return ", ".join(f"{name} ({rules.by_name(name).location})" for name in names) or "none recorded"


def _check_types(view: EGraphView, graph: Graph, rules: RuleSet, strict: bool, deadline: Deadline) -> list[bool]:
    """Type every class and check every e-node against its class; returns per e-node whether it passes.

    A class holding input-graph nodes has their type; the rule-made e-nodes are inferred bottom-up from the
    leaves, with the shape rule called once per (op, attributes, input types) (see
    :func:`._typecheck.propagate_types`).  A rule-made class whose e-nodes disagree has no type to trust: all its
    e-nodes are left out and the check runs again without them, until no new
    disagreement appears.
    """
    numbering = _TypeNumbers()
    # per class its input-graph type's number (rule-made classes: by e-nodes); classes holding input-graph nodes of
    # different types
    fixed, split = input_types(graph.nodes, view.class_of_node, len(view.classes), numbering.numbers,
                               numbering.of_node)
    for c in sorted(split):
        fixed[c] = -1
        cls = view.classes[c]
        members = {o: graph.node(o) for o in cls.originals}
        found = blamed_rules(view, cls.nodes, [cls.id])
        listed = ", ".join(f"node {o} ({m.op}) {m.type}" for o, m in members.items())
        message = (f"unsound rewrite: e-class {cls.id} holds input-graph nodes of different types ({listed}): "
                   f"a rule merged values that cannot be equal; rules that merged or built it: "
                   f"{_named(found, rules)}")
        if strict:
            raise UnsoundRewrite(message)
        view.merged.append(MergedInputs(cls.id, tuple((o, m.op, m.type) for o, m in members.items()),
                                        found, message))
    excluded = {m.eclass for m in view.merged}
    original = view.original_flags()

    def infer(n: int, numbers: tuple[int, ...]) -> int:
        """The number of the type e-node ``n``'s shape rule gives it from its children's types."""
        node = view.nodes[n]
        return numbering.of_type(node.spec.resolve(node.attrs, [numbering.types[k] for k in numbers])[1])

    conflicts: dict[int, set[int]] = {}  # rule-made class -> the type numbers its e-nodes have
    while True:
        numbers, kept, errors, mismatches, new = propagate_types(view.flat(), view.nodes, fixed, original,
                                                                 excluded | conflicts.keys(), infer, deadline)
        if not new:
            break
        for c, seen in new.items():
            conflicts.setdefault(c, set()).update(seen)
    problems = {i: f"is ill-typed: {exc}" for i, exc in errors.items()}
    for i, (out, have) in mismatches.items():
        problems[i] = f"has type {numbering.types[out]} but its e-class has type {numbering.types[have]}"
    for c, seen in sorted(conflicts.items()):
        listed = " and ".join(sorted(str(numbering.types[k]) for k in seen))
        for i in view.classes[c].nodes:
            problems[i] = f"is in e-class {c}, made by rules, whose e-nodes have different types ({listed})"
    for cls, k in zip(view.classes, numbers, strict=True):
        cls.type = numbering.types[k] if k >= 0 else None
    view._type_numbers = numbers  # what type_numbers() would compute from the class types just set
    for i, problem in sorted(problems.items()):
        n = view.nodes[i]
        found = blamed_rules(view, [i], [n.eclass])
        message = f"unsound rewrite: a {n.op} e-node {problem}; built by rule(s): {_named(found, rules)}"
        if strict:
            raise UnsoundRewrite(message)
        view.ill_typed.append(IllTyped(n.op, n.eclass, problem, found, message))
    return kept


class _TypeNumbers:
    """Numbers types in order of first sight, equal types equal numbers.  A type is keyed by its shape, dtype
    and parts, as a Node holds them, so that an input-graph node is numbered without building its type."""

    def __init__(self) -> None:
        self.types: list[ValueType] = []  # number -> type
        self.numbers: dict[tuple, int] = {}  # key -> number (read it, never modify it)

    def of_node(self, node: Node) -> int:
        k = self.numbers.get((node.shape, node.dtype, node.parts))
        return self._new((node.shape, node.dtype, node.parts), node.type) if k is None else k

    def of_type(self, t: ValueType) -> int:
        key = ((), TUPLE, t.parts) if isinstance(t, TupleType) else (t.shape, t.dtype, ())
        k = self.numbers.get(key)
        return self._new(key, t) if k is None else k

    def _new(self, key: tuple, t: ValueType) -> int:
        k = self.numbers[key] = len(self.types)
        self.types.append(t)
        return k


def _keep_only(view: EGraphView, kept: list[bool]) -> None:
    """Drop every e-node not ``kept`` (a flag per e-node) from the view, renumbering the rest."""
    if all(kept):
        return
    nodes = [n for n, keep in zip(view.nodes, kept, strict=True) if keep]
    view.dropped = len(view.nodes) - len(nodes)
    for k, n in enumerate(nodes):
        n.index = k
    view.nodes = nodes
    for cls in view.classes:
        cls.nodes = []
    for n in nodes:
        view.classes[n.eclass].nodes.append(n.index)
