"""A Python view of a saturated e-graph: classes, decoded e-nodes and types.

Built from egglog's frozen e-graph.  Every e-node is decoded back into an op
name, its input classes and its attributes (the inverse of the encoder), and
every class gets a TensorType: the original node's, or one inferred from the
registry's shape rules.  A rule that unions terms of different types is
unsound; :class:`UnsoundRewrite` names the op and the rules that build it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egglog import bindings as eb

from ..ir.graph import Graph, attrs_equal
from ..ir.registry import REGISTRY, AttrType, ShapeError, TensorType
from .budget import Deadline
from .encode import egglog_name
from .rules import RuleSet
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

    @property
    def spec(self):
        return REGISTRY[self.op]


@dataclass
class EClass:
    id: int
    nodes: list[int] = field(default_factory=list)
    type: TensorType | None = None
    originals: list[int] = field(default_factory=list)  # graph node ids in this class


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


# Rows decoded (or e-nodes type-checked) between two looks at the deadline.
DEADLINE_STRIDE = 4096


def build_view(egraph: eb.EGraph, graph: Graph, constants: dict[str, Any], rules: RuleSet,
               deadline: Deadline | None = None) -> EGraphView:
    """Decode the saturated ``egraph`` of ``graph`` into an :class:`EGraphView`.

    Raises :class:`~.budget.DeadlineExceeded` when ``deadline`` passes first.
    """
    deadline = deadline or Deadline()
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
    absent = {row.output for row in functions[NO_INPUT].rows} if NO_INPUT in functions else set()
    nodes: list[ENode] = []
    for name in sorted(REGISTRY):
        fn = functions.get(name)
        if fn is None:
            continue
        spec = REGISTRY[name]
        args = constructor_args(spec)
        kinds = {a.name: a.type for a in spec.attrs}
        for row in fn.rows:
            if row.subsumed:
                continue
            if len(nodes) % DEADLINE_STRIDE == 0:
                deadline.check("building the e-graph view")
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
            node = ENode(len(nodes), name, tuple(children), attrs, cid)
            nodes.append(node)
            classes[cid].nodes.append(node.index)

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
    _infer_types(view, rules, deadline)
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


def _infer_types(view: EGraphView, rules: RuleSet, deadline: Deadline) -> None:
    """Give every class a type; check that every non-original e-node agrees."""
    changed = True
    while changed:
        changed = False
        for n in view.nodes:
            if n.index % DEADLINE_STRIDE == 0:
                deadline.check("building the e-graph view")
            if n.original is not None:
                continue
            child_types = [view.classes[c].type for c in n.children]
            if any(t is None for t in child_types):
                continue
            try:
                out = n.spec.infer(n.attrs, child_types)
            except ShapeError as exc:
                raise UnsoundRewrite(_blame(n, rules, f"is ill-typed: {exc}")) from None
            cls = view.classes[n.eclass]
            if cls.type is None:
                cls.type = out
                changed = True
            elif cls.type != out:
                raise UnsoundRewrite(_blame(n, rules, f"has type {out} but its e-class has type {cls.type}"))


def _blame(node: ENode, rules: RuleSet, problem: str) -> str:
    makers = ", ".join(f"{r.name} ({r.location})" for r in rules.producers(node.op)) or "unknown rules"
    return f"unsound rewrite: a {node.op} e-node {problem}; rules that build {node.op}: {makers}"
