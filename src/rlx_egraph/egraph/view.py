"""A Python view of a saturated e-graph: classes, decoded e-nodes and types.

Built from egglog's frozen e-graph.  Every e-node is decoded back into an op
name, its input classes and its attributes (the inverse of the encoder), and
every class gets a TensorType: the original node's, or one inferred from the
registry's shape rules.  Provenance comes from the tables the instrumented
rules fill (see :mod:`.rules`): each e-node knows the rules that built it, each
e-class the rules that merged into it.  A rule that unions terms of different
types is unsound; :class:`UnsoundRewrite` names the op and those rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egglog import bindings as eb

from ..ir.graph import Graph, attrs_equal
from ..ir.registry import REGISTRY, AttrType, ShapeError, TensorType
from .encode import egglog_name
from .rules import MERGED_BY, RuleSet, built_by_table
from .schema import LIST_CONS, LIST_NIL, NO_INPUT, constructor_args


class UnsoundRewrite(RuntimeError):
    """A saturated e-class holds terms of different types (an unsound rule)."""


@dataclass
class ENode:
    """An op applied to e-classes: one alternative of an e-class."""

    index: int
    op: str
    children: tuple[int, ...]
    attrs: dict[str, Any]
    eclass: int
    original: int | None = None  # graph node id when this e-node is that node
    built_by: tuple[str, ...] = ()  # rules whose actions constructed this e-node

    @property
    def spec(self):
        return REGISTRY[self.op]


@dataclass
class EClass:
    id: int
    nodes: list[int] = field(default_factory=list)
    type: TensorType | None = None
    originals: list[int] = field(default_factory=list)  # graph node ids in this class
    merged_by: tuple[str, ...] = ()  # rules that unioned something into this class


@dataclass
class EGraphView:
    classes: list[EClass]
    nodes: list[ENode]
    class_of_node: dict[int, int]  # graph node id -> class id

    @property
    def num_enodes(self) -> int:
        return len(self.nodes)

    def parents(self) -> list[list[int]]:
        """For each class, the e-nodes that read it."""
        out: list[list[int]] = [[] for _ in self.classes]
        for n in self.nodes:
            for c in dict.fromkeys(n.children):
                out[c].append(n.index)
        return out


class _Values:
    """Converts egglog primitive Values to Python, caching per value."""

    def __init__(self, egraph: eb.EGraph, constants: dict[str, Any]) -> None:
        self.egraph = egraph
        self.constants = constants
        self.cache: dict[tuple[str, Any], Any] = {}

    def get(self, value: Any, kind: AttrType) -> Any:
        key = (kind.value, value)
        if key not in self.cache:
            self.cache[key] = self._convert(value, kind)
        return self.cache[key]

    def _convert(self, value: Any, kind: AttrType) -> Any:
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
        return self.constants[text] if kind is AttrType.ARRAY else text


def build_view(egraph: eb.EGraph, graph: Graph, constants: dict[str, Any], rules: RuleSet) -> EGraphView:
    """Decode the saturated ``egraph`` of ``graph`` into an :class:`EGraphView`."""
    frozen = egraph.freeze()
    functions = frozen.functions
    class_ids: dict[Any, int] = {}
    classes: list[EClass] = []

    def class_of(value: Any) -> int:
        cid = class_ids.get(value)
        if cid is None:
            cid = class_ids[value] = len(classes)
            classes.append(EClass(cid))
        return cid

    lists: dict[Any, list[Any]] = {}
    if LIST_NIL in functions:
        for row in functions[LIST_NIL].rows:
            lists.setdefault(row.output, [])
    cons_rows = functions[LIST_CONS].rows if LIST_CONS in functions else []
    cons = {row.output: (row.inputs[0], row.inputs[1]) for row in cons_rows[::-1]}

    def expand(value: Any) -> list[Any]:
        items = []
        while value in cons:
            head, value = cons[value]
            items.append(head)
        return items

    values = _Values(egraph, constants)
    order = {r.name: k for k, r in enumerate(rules.rules)}

    def provenance(table: str) -> dict[tuple[Any, ...], tuple[str, ...]]:
        """Rows of a provenance relation: key (its leading columns) -> rule names, in rule-file order."""
        names: dict[tuple[Any, ...], set[str]] = {}
        for row in functions[table].rows if table in functions else ():
            names.setdefault(tuple(row.inputs[:-1]), set()).add(values.get(row.inputs[-1], AttrType.STR))
        return {key: tuple(sorted(found, key=order.__getitem__)) for key, found in names.items()}

    absent = {row.output for row in functions[NO_INPUT].rows} if NO_INPUT in functions else set()
    nodes: list[ENode] = []
    for name in sorted(REGISTRY):
        fn = functions.get(name)
        if fn is None:
            continue
        spec = REGISTRY[name]
        args = constructor_args(spec)
        kinds = {a.name: a.type for a in spec.attrs}
        built_by = provenance(built_by_table(name))
        for row in fn.rows:
            if row.subsumed:
                continue
            children: list[int] = []
            attrs: dict[str, Any] = {}
            for arg, value in zip(args, row.inputs, strict=True):
                if not arg.is_input:
                    attrs[arg.name] = values.get(value, kinds[arg.name])
                elif arg.variadic:
                    children.extend(class_of(v) for v in expand(value))
                elif value not in absent:
                    children.append(class_of(value))
            cid = class_of(row.output)
            node = ENode(len(nodes), name, tuple(children), attrs, cid, built_by=built_by.get(tuple(row.inputs), ()))
            nodes.append(node)
            classes[cid].nodes.append(node.index)

    for (value,), names in provenance(MERGED_BY).items():
        classes[class_ids[value]].merged_by = names

    class_of_node: dict[int, int] = {}
    for gnode in graph.nodes:
        fn = functions[egglog_name(gnode.id)]
        cid = class_ids[fn.rows[0].output]
        class_of_node[gnode.id] = cid
        classes[cid].originals.append(gnode.id)
        if classes[cid].type is None:
            classes[cid].type = gnode.type
    view = EGraphView(classes, nodes, class_of_node)
    _mark_originals(view, graph)
    _infer_types(view, rules)
    return view


def _mark_originals(view: EGraphView, graph: Graph) -> None:
    """Tag each e-node that is exactly a node of the input graph."""
    for gnode in graph.nodes:
        cid = view.class_of_node[gnode.id]
        children = tuple(view.class_of_node[i] for i in gnode.inputs)
        for idx in view.classes[cid].nodes:
            n = view.nodes[idx]
            if n.op == gnode.op and n.children == children and n.original is None and attrs_equal(n.attrs, gnode.attrs):
                n.original = gnode.id
                break


def _infer_types(view: EGraphView, rules: RuleSet) -> None:
    """Give every class a type; check that every non-original e-node agrees."""
    changed = True
    while changed:
        changed = False
        for n in view.nodes:
            if n.original is not None:
                continue
            child_types = [view.classes[c].type for c in n.children]
            if any(t is None for t in child_types):
                continue
            try:
                out = n.spec.infer(n.attrs, child_types)
            except ShapeError as exc:
                raise UnsoundRewrite(_blame(view, n, rules, f"is ill-typed: {exc}")) from None
            cls = view.classes[n.eclass]
            if cls.type is None:
                cls.type = out
                changed = True
            elif cls.type != out:
                raise UnsoundRewrite(_blame(view, n, rules, f"has type {out} but its e-class has type {cls.type}"))


def _blame(view: EGraphView, node: ENode, rules: RuleSet, problem: str) -> str:
    """The message of an unsound e-node: the rules that built it and that merged into its class."""
    names = dict.fromkeys(node.built_by + view.classes[node.eclass].merged_by)
    makers = ", ".join(f"{name} ({rules.by_name(name).location})" for name in names) or "none recorded"
    return f"unsound rewrite: a {node.op} e-node {problem}; built by rule(s): {makers}"
