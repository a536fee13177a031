"""The MIR graph: a DAG of typed nodes in topological order.

Reads like torch.fx: ``g.matmul(x, w)`` appends a node and returns its id,
``g.users(id)`` lists consumers, ``str(g)`` prints a table.  Every node is
checked when it is added (op, arity, attributes, shapes, dtypes), so a Graph
is always valid; a bad node raises :class:`GraphError` naming node, op and
problem, and leaves the graph unchanged.

Every tensor dimension is an int in ``[0, MAX_DIM)`` (2**31): rules compute
with dims in egglog's i64 (a product of two, as batch*seq, or a sum of a few,
as concatenated widths), and these bounds keep every such result in range.
A dimension may also be symbolic (``g.input("x", ("batch", "seq", 64))``, see
:mod:`rlx_egraph.ir.dims`); ``graph.symbols`` names them and
:func:`rlx_egraph.specialize` binds them.
Node ids are ints (a string such as ``"2"`` is refused, never converted).
"""

from __future__ import annotations

import inspect
import json
import math
import reprlib
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .._builders import GraphBuilders
from ..errors import RlxError
from . import ops as _ops  # noqa: F401  (registers every op)
from .dims import (
    DimContext,
    Sym,
    active_minima,
    as_dim,
    free_symbols,
    reset_context,
    state_facts,
    stated_facts,
    symbols_of,
    to_json,
    use_context,
)
from .dot import format_attrs, graph_to_dot
from .dtypes import DTYPES
from .dtypes import dtype as lookup_dtype
from .registry import REGISTRY, REQUIRED, TUPLE, AttrType, Kind, OpSpec, ShapeError, TensorType, TupleType, ValueType

FORMAT = "rlx-egraph-mir"
# Version 2 may hold symbolic dims (strings) and multi-result nodes (a shape and dtype per result); a graph with
# neither is written as version 1.
FORMAT_VERSION = 2
READ_VERSIONS = (1, FORMAT_VERSION)
MAX_DIM = 2**31
# Node ids are ints in [-MAX_NODE_ID, MAX_NODE_ID): egglog holds them as i64, and the ids an engine adds after the
# largest one stay in range.
MAX_NODE_ID = 2**62
FILE_FIELDS = ("format", "version", "name", "nodes", "outputs", "meta", "weights")
RECORD_FIELDS = ("id", "op", "inputs", "attrs")  # a record for from_nodes; a file's records may add:
FILE_RECORD_FIELDS = (*RECORD_FIELDS, "shape", "dtype")


class GraphError(RlxError, ValueError):
    """A graph, node or file is malformed; the message names node, op and problem."""


@dataclass(frozen=True, eq=False, init=False)
class Node:
    """One node: an op applied to earlier nodes, with its inferred output type.

    A node of a multi-result op has ``parts`` (its results' types), shape ``()`` and dtype ``"tuple"``;
    only ``Get`` nodes read it.
    """

    id: int
    op: str
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    shape: tuple[Any, ...]  # ints and symbolic dims
    dtype: str
    parts: tuple[TensorType, ...] = ()

    def __init__(self, id: int, op: str, inputs: tuple[int, ...], attrs: dict[str, Any],
                 shape: tuple[Any, ...], dtype: str, parts: tuple[TensorType, ...] = ()) -> None:
        # The fields straight into the instance dict: the generated frozen __init__ sets each through
        # object.__setattr__, four times slower, and the engines make a Node per checked, inserted or rewired
        # node (220,000 in a fallback run at 100k nodes).  The fields above are the parameters, in order.
        d = self.__dict__
        d["id"], d["op"], d["inputs"], d["attrs"], d["shape"], d["dtype"], d["parts"] = (
            id, op, inputs, attrs, shape, dtype, parts)

    @property
    def spec(self) -> OpSpec:
        return REGISTRY[self.op]

    @property
    def kind(self) -> Kind:
        return REGISTRY[self.op].kind

    @cached_property
    def type(self) -> ValueType:
        """The output type: a TupleType for a multi-result node (built once: a Node never changes)."""
        return TupleType(self.parts) if self.parts else TensorType(self.shape, self.dtype)

    @property
    def results(self) -> tuple[TensorType, ...]:
        """The types of what the node computes: its parts, or its one tensor."""
        return self.parts or (TensorType(self.shape, self.dtype),)

    @property
    def name(self) -> str | None:
        """The name of an Input or Param leaf."""
        return self.attrs.get("name") if self.kind is Kind.LEAF else None

    def dims(self) -> Iterator[Any]:
        """The dims of the shape, then those of the dim attributes (``AttrSpec.dims``: leaf shapes, Reshape and
        Expand targets, Narrow bounds)."""
        for dims in self.dim_tuples():
            yield from dims

    def dim_tuples(self) -> Iterator[tuple[Any, ...]]:
        """:meth:`dims` as the tuples that hold them: each result's shape, then each dim attribute's value."""
        for part in self.parts or (self,):  # a node of one result has that result's shape
            yield part.shape
        for spec in REGISTRY[self.op].dim_attrs:
            if spec.name in self.attrs:
                value = self.attrs[spec.name]
                yield tuple(value) if spec.type is AttrType.INTS else (value,)

    def same_as(self, other: Node) -> bool:
        """Equal op, attributes, inputs and type (ids aside)."""
        return (self.op, self.inputs, self.shape, self.dtype, self.parts) \
            == (other.op, other.inputs, other.shape, other.dtype, other.parts) and attrs_equal(self.attrs, other.attrs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and self.id == other.id and self.same_as(other)

    def __hash__(self) -> int:
        return hash((self.id, self.op, self.inputs))

    def __repr__(self) -> str:
        return f"Node({self.id}, {self.op}{format_attrs(self.attrs)}, inputs={list(self.inputs)}, {self.type})"


def attrs_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key, va in a.items():
        vb = b[key]
        if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
            if not (isinstance(va, np.ndarray) and isinstance(vb, np.ndarray)) or va.dtype != vb.dtype \
                    or not np.array_equal(va, vb, equal_nan=va.dtype.kind == "f"):
                return False
        elif va != vb:
            return False
    return True


def check_node(nid: int, op: str, inputs: Sequence[int], attrs: Mapping[str, Any],
               lookup: Callable[[int], Node | None], leaf_names: Mapping[str, int]) -> Node:
    """Validate one node (op, input ids, arity, attributes, shapes, dtypes, leaf rules) against the nodes
    ``lookup`` finds and the leaf names in use; returns it with canonical attributes and its type."""
    spec = _op_spec(nid, op)
    inputs = _node_ids(inputs, f"node {nid} ({op}): 'inputs'", f"node {nid} ({op}): input ")
    in_nodes: list[Node] = []
    for slot, i in enumerate(inputs):
        node = lookup(i)
        if node is None:
            raise GraphError(f"node {nid} ({op}): input {slot} refers to node {i}, which is not in the graph")
        in_nodes.append(node)
    try:
        attrs_c, out = _resolve(spec, attrs, in_nodes)
        for part in out.parts if isinstance(out, TupleType) else (out,):
            _check_dims(part.shape)
    except (ShapeError, OverflowError) as exc:  # OverflowError: an infinite float given as an int
        raise GraphError(f"node {nid} ({op}): {exc}") from None
    name = attrs_c.get("name") if spec.kind is Kind.LEAF else None
    if name is not None and name in leaf_names:
        raise GraphError(f"node {nid} ({spec.name}): name {name!r} is already used by node {leaf_names[name]}")
    if spec.kind is Kind.WEIGHT_PREP:
        bad = [n for n in in_nodes if n.op != "Param" and n.kind is not Kind.WEIGHT_PREP]
        if bad:
            raise GraphError(f"node {nid} ({spec.name}): inputs must be parameters, node {bad[0].id} is {bad[0].op}")
    if isinstance(out, TupleType):
        return Node(nid, op, inputs, attrs_c, (), TUPLE, out.parts)
    return Node(nid, op, inputs, attrs_c, out.shape, out.dtype)


_RESOLVED: dict[tuple, tuple[dict[str, Any], ValueType, tuple[tuple[str, int], ...]]] = {}
_RESOLVED_MAX = 1 << 16
_NO_NAME: Any = object()  # in a remembered leaf's attributes: where its own name goes


def _signed_zero(value: float) -> tuple[float, float]:
    """A float zero as a key that tells -0.0 from 0.0 (they are equal, but 1 / -0.0 is -inf)."""
    return value, math.copysign(1.0, value)


def _resolve(spec: OpSpec, attrs: Mapping[str, Any], in_nodes: list[Node]) -> tuple[dict[str, Any], ValueType]:
    """``spec.resolve``, remembered per (op, attributes, input types): shape rules are pure functions but for the
    facts on dims they state (:func:`~rlx_egraph.ir.dims.at_least`), which a remembered result states again in the
    active dims context.  A leaf's ``name`` (one per leaf) is left out of the key and checked on its own: it plays
    no part in its type."""
    named = spec.kind is Kind.LEAF and "name" in spec.attr_specs
    name = attrs.get("name", _NO_NAME) if named else _NO_NAME
    items = () if not attrs else tuple((k, _signed_zero(v) if v.__class__ is float and v == 0.0 else v)
                                       for k, v in attrs.items() if name is _NO_NAME or k != "name")
    key = (spec.name, items, tuple((n.shape, n.dtype, n.parts) for n in in_nodes))
    try:
        hit = _RESOLVED.get(key)
    except TypeError:  # unhashable attribute values (lists, arrays): not remembered
        return spec.resolve(attrs, [n.type for n in in_nodes])
    if hit is None:
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.clear()
        with stated_facts() as facts:
            attrs_c, out = spec.resolve(attrs, [n.type for n in in_nodes])
        state_facts(facts)
        _RESOLVED[key] = (attrs_c if name is _NO_NAME else {k: _NO_NAME if k == "name" else v
                                                            for k, v in attrs_c.items()}, out, tuple(facts))
        return dict(attrs_c), out
    if hit[2]:
        state_facts(hit[2])
    if name is _NO_NAME:
        return dict(hit[0]), hit[1]
    name = spec.attr_specs["name"].coerce(name)
    return {k: name if v is _NO_NAME else v for k, v in hit[0].items()}, hit[1]


class Graph(GraphBuilders):
    """A MIR graph.  Build it with the op methods, then :meth:`set_outputs`."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self._nodes: list[Node] = []
        self._by_id: dict[int, Node] = {}
        self._users: dict[int, list[int]] | None = None  # node id -> its readers; built on first ask
        self._positions: dict[int, int] | None = None  # node id -> its place in nodes; built on first ask
        self._outputs: tuple[int, ...] = ()
        self._leaf_names: dict[str, int] = {}
        self._next_id = 0
        self._symbols: tuple[str, ...] | None = None  # computed on first read, forgotten when a node is added
        self.weights: dict[str, np.ndarray] = {}  # Param name -> value (evaluate reads it; save writes .npz)
        self.meta: dict[str, Any] = {}  # JSON-ready facts about the graph's origin (e.g. ONNX dim names)
        # What this graph's nodes state about its floor atoms (active in add_node); a graph made while another's is
        # active (a scratch graph of an import) starts from what that one knows.
        self.dim_context = DimContext(active_minima())

    # --- building ---------------------------------------------------------------

    def add_node(self, op: str, inputs: Sequence[int] = (), node_id: int | None = None, **attrs: Any) -> int:
        """Append ``op`` applied to ``inputs``; returns the new node's id."""
        nid = self._next_id if node_id is None else as_node_id(node_id, "node id")
        if nid in self._by_id:
            raise GraphError(f"node {nid} ({_op_spec(nid, op).name}): id {nid} is already used")
        token = use_context(self.dim_context)
        try:
            node = check_node(nid, op, inputs, attrs, self._by_id.get, self._leaf_names)
        finally:
            reset_context(token)
        self._append(node)
        return nid

    def add_checked(self, node: Node) -> int:
        """Append ``node``, checked in another graph, as it is: its inputs must be here with the types they
        had there (the caller's promise; :meth:`add_node` checks from scratch).  Returns its id."""
        if node.id in self._by_id:
            raise GraphError(f"node {node.id} ({node.op}): id {node.id} is already used")
        missing = [i for i in node.inputs if i not in self._by_id]
        if missing:
            raise GraphError(f"node {node.id} ({node.op}): input {missing[0]} is not in the graph")
        self._append(node)
        return node.id

    @classmethod
    def from_checked(cls, name: str, nodes: list[Node]) -> Graph:
        """A graph of ``nodes`` in that order, each checked against the ones before it (by :func:`check_node`,
        or in another graph where its inputs had the same types): the caller's promise, as for
        :meth:`add_checked`.  Ids and leaf names must be distinct; set the outputs after."""
        graph = cls(name)
        graph._nodes = list(nodes)
        graph._by_id = {node.id: node for node in graph._nodes}
        if len(graph._by_id) != len(graph._nodes):
            seen: set[int] = set()
            twice = next(node for node in graph._nodes if node.id in seen or seen.add(node.id))
            raise GraphError(f"node {twice.id} ({twice.op}): id {twice.id} is already used")
        graph._next_id = max(graph._by_id, default=-1) + 1
        for node in graph._nodes:
            if "name" in node.attrs and node.kind is Kind.LEAF:
                used = graph._leaf_names.setdefault(node.attrs["name"], node.id)
                if used != node.id:
                    raise GraphError(f"node {node.id} ({node.op}): name {node.attrs['name']!r} is already used by "
                                     f"node {used}")
        return graph

    def _append(self, node: Node) -> None:
        """Add a node :func:`check_node` accepted against this graph (bookkeeping only)."""
        self._nodes.append(node)
        self._by_id[node.id] = node
        self._next_id = max(self._next_id, node.id + 1)
        self._symbols = None
        if self._positions is not None:
            self._positions[node.id] = len(self._nodes) - 1
        users = self._users
        if users is not None:
            users[node.id] = []
            for i in dict.fromkeys(node.inputs):
                users[i].append(node.id)
        if "name" in node.attrs and node.kind is Kind.LEAF:
            self._leaf_names[node.attrs["name"]] = node.id

    def input(self, name: str, shape: Sequence[int | str], dtype: str = "f32") -> int:
        """A graph input fed at run time; a dim is an int or a symbolic dim (``"batch"``, ``"batch*seq"``)."""
        return self.add_node("Input", name=name, shape=shape, dtype=dtype)

    def param(self, name: str, shape: Sequence[int | str], dtype: str = "f32") -> int:
        """A named weight (its dims may be symbolic too)."""
        return self.add_node("Param", name=name, shape=shape, dtype=dtype)

    def constant(self, value: Any, dtype: str | None = None) -> int:
        """A constant tensor (dtype defaults from the array: floats are f32)."""
        arr = np.asarray(value)
        if dtype is None:
            dtype = {"f": "f32", "i": "i64", "u": "i64", "b": "bool"}.get(arr.dtype.kind, "f32")
        return self.add_node("Constant", value=arr.astype(lookup_dtype(dtype).storage), dtype=dtype)

    def scalar(self, value: float, dtype: str = "f32") -> int:
        """A rank-0 constant that rules can match by value."""
        return self.add_node("Scalar", value=float(value), dtype=dtype)

    def set_outputs(self, ids: Iterable[int]) -> None:
        ids = _node_ids(ids, "outputs", "output ")
        missing = [i for i in ids if i not in self._by_id]
        if missing:
            raise GraphError(f"output refers to node {missing[0]}, which is not in the graph")
        tuples = [self._by_id[i] for i in ids if self._by_id[i].parts]
        if tuples:
            raise GraphError(f"output node {tuples[0].id} ({tuples[0].op}) has {len(tuples[0].parts)} results: "
                             "output them one by one through Get")
        self._outputs = ids

    # --- queries ----------------------------------------------------------------

    @property
    def nodes(self) -> tuple[Node, ...]:
        """All nodes in topological order."""
        return tuple(self._nodes)

    @property
    def outputs(self) -> tuple[int, ...]:
        return self._outputs

    def node(self, node_id: int) -> Node:
        try:
            return self._by_id[node_id]
        except KeyError:
            raise GraphError(f"no node {node_id} in graph {self.name!r}") from None

    @property
    def nodes_by_id(self) -> Mapping[int, Node]:
        """Node id -> node, kept up to date (read it, never modify it)."""
        return self._by_id

    def positions(self) -> Mapping[int, int]:
        """Node id -> its place in :attr:`nodes` (counted on first ask and kept up to date; read it, never modify
        it)."""
        if self._positions is None:
            self._positions = {n.id: k for k, n in enumerate(self._nodes)}
        return self._positions

    def users(self, node_id: int) -> list[int]:
        """Ids of the nodes that read ``node_id`` (each consumer once), in topological order."""
        return list(self._readers(node_id))

    def use_count(self, node_id: int) -> int:
        """Consumers plus the number of graph-output slots holding ``node_id``."""
        return len(self._readers(node_id)) + self._outputs.count(node_id)

    def _readers(self, node_id: int) -> list[int]:
        """The users index's list for ``node_id`` (the index is built on first ask; never modify the list)."""
        users = self._users
        if users is None:
            users = self._users = {n.id: [] for n in self._nodes}
            for n in self._nodes:
                nid = n.id
                for i in n.inputs:
                    readers = users[i]
                    if not readers or readers[-1] != nid:  # a node reading a value twice is listed once
                        readers.append(nid)
        if node_id not in users:
            self.node(node_id)  # raises: no such node
        return users[node_id]

    def leaf(self, name: str) -> Node:
        """The Input or Param leaf called ``name``."""
        try:
            return self._by_id[self._leaf_names[name]]
        except KeyError:
            raise GraphError(f"no input or parameter named {name!r}") from None

    @property
    def inputs(self) -> list[Node]:
        return [n for n in self._nodes if n.op == "Input"]

    @property
    def params(self) -> list[Node]:
        return [n for n in self._nodes if n.op == "Param"]

    @property
    def symbols(self) -> tuple[str, ...]:
        """The names of the symbolic dims in the graph, sorted (empty for a static graph); for a floor atom
        (:func:`~rlx_egraph.ir.dims.floor_div`), the symbols it divides."""
        if self._symbols is None:  # each distinct tuple of dims once: nodes share a few shapes
            tuples = {n.shape for n in self._nodes}  # most nodes: their shape alone (Node.dim_tuples)
            with_more = {op for op in {n.op for n in self._nodes} if REGISTRY[op].dim_attrs}
            for n in [n for n in self._nodes if n.parts or n.op in with_more]:
                tuples.update(n.dim_tuples())
            self._symbols = free_symbols(symbols_of(d for dims in tuples for d in dims))  # a floor atom's bases
        return self._symbols

    def source_names(self, node_id: int) -> tuple[str, ...]:
        """The names, in the model it came from, of the nodes ``node_id`` computes (``meta["node_names"]``: an
        imported ONNX node's name; after optimize, those of the input nodes it replaces); empty when unknown."""
        names = self.meta.get("node_names")
        given = names.get(str(node_id)) if isinstance(names, dict) else None
        return (given,) if isinstance(given, str) else tuple(n for n in given if isinstance(n, str)) \
            if isinstance(given, list) else ()

    def describe(self, node_id: int) -> str:
        """How messages name a node: ``'/m/layers.0/MatMul' (MatMul)`` when it has a source name (with how many more
        it replaces), else ``node 12 (MatMul)``."""
        op = self.node(node_id).op
        names = self.source_names(node_id)
        if not names:
            return f"node {node_id} ({op})"
        more = f" + {len(names) - 1} more" if len(names) > 1 else ""
        return f"{names[0]!r}{more} ({op})"

    def op_counts(self) -> Counter[str]:
        """How many nodes of each op the graph holds."""
        return Counter(n.op for n in self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._by_id

    def __eq__(self, other: object) -> bool:
        """Structural equality: same nodes (ids, ops, attributes, inputs, types) and outputs."""
        return isinstance(other, Graph) and self._outputs == other._outputs and len(self) == len(other) \
            and all(a == b for a, b in zip(self._nodes, other._nodes, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        rows = [("id", "op", "attrs", "inputs", "type")]
        outs = set(self._outputs)
        for n in self._nodes:
            mark = " *" if n.id in outs else ""
            rows.append((f"%{n.id}{mark}", n.op, format_attrs(n.attrs).strip("()"),
                         ", ".join(f"%{i}" for i in n.inputs), str(n.type)))
        widths = [max(len(r[c]) for r in rows) for c in range(5)]
        lines = [f"graph {self.name}: {len(self)} nodes, outputs {[f'%{i}' for i in self._outputs]} (* marks outputs)"]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self)} nodes, {len(self._outputs)} outputs>"

    def to_dot(self, provenance: Any = None) -> str:
        """Graphviz DOT text of the graph, fused nodes highlighted; ``provenance`` (an OptimizeReport, or its
        ``fusions``) puts the rules that built each node in its tooltip.  See :mod:`rlx_egraph.ir.dot`."""
        return graph_to_dot(self, provenance)

    def copy(self) -> Graph:
        """An equal graph with its own meta; the weight store's arrays are shared, not copied."""
        g = Graph.from_dict(self.to_dict())
        g.weights = dict(self.weights)
        return g

    def adopt_store(self, source: Graph) -> None:
        """Take ``source``'s weights (arrays shared) and meta, for a graph derived from it; and, when ``source`` has
        no symbolic dim, that fact (:attr:`symbols`, not counted again: a derived graph's shapes and dims are
        computed from ``source``'s)."""
        self.weights.update(source.weights)
        self.meta.update(json.loads(json.dumps(source.meta)))
        if self._symbols is None and source._symbols == ():
            self._symbols = ()

    # --- construction from records and JSON ---------------------------------------

    @classmethod
    def from_nodes(cls, records: Iterable[Mapping[str, Any]], outputs: Iterable[int], name: str = "graph") -> Graph:
        """Build a graph from node records ``{id, op, inputs, attrs}`` in any order.

        Records are sorted topologically (stably); a malformed record, a cycle or
        a reference to a missing node raises GraphError naming the nodes involved.
        """
        return cls._build([_record(k, rec, RECORD_FIELDS) for k, rec in enumerate(records)], outputs, name)

    @classmethod
    def _build(cls, records: list[_Record], outputs: Iterable[int], name: str) -> Graph:
        by_id: dict[int, _Record] = {}
        for rec in records:
            if rec.id in by_id:
                raise GraphError(f"node {rec.id}: id {rec.id} is used twice")
            by_id[rec.id] = rec
        for rec in records:
            for slot, i in enumerate(rec.inputs):
                if i not in by_id:
                    raise GraphError(f"node {rec.id} ({rec.op}): input {slot} refers to node {i}, "
                                     "which is not in the graph")
        g = cls(name)
        for nid in _topological(by_id):
            rec = by_id[nid]
            g.add_node(rec.op, rec.inputs, node_id=nid, **rec.attrs)
        g.set_outputs(outputs)
        return g

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (format version included)."""
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION if self.symbols or any(n.parts for n in self._nodes) else 1,
            "name": self.name,
            "nodes": [{"id": n.id, "op": n.op, "inputs": list(n.inputs),
                       "attrs": {k: _attr_to_json(v) for k, v in n.attrs.items()},
                       **_file_type(n)} for n in self._nodes],
            "outputs": list(self._outputs),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Graph:
        """Read :meth:`to_dict`'s form; every field is checked, errors name the node and op."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise GraphError(f"not an rlx-egraph graph: expected format {FORMAT!r}")
        if type(data.get("version")) is not int or data["version"] not in READ_VERSIONS:
            raise GraphError(f"graph format version {_show(data.get('version'))} is not supported "
                             f"(this library reads versions {' and '.join(map(str, READ_VERSIONS))})")
        _no_unknown_fields("graph file", data, FILE_FIELDS)
        missing = [f for f in ("nodes", "outputs") if f not in data]
        if missing:
            raise GraphError(f"malformed graph file: missing field {missing[0]!r}")
        name, nodes = data.get("name", "graph"), data["nodes"]
        if not isinstance(name, str):
            raise GraphError(f"'name' must be a string, got {_show(name)}")
        if not isinstance(nodes, list):
            raise GraphError(f"'nodes' must be a list of node records, got {_show(nodes)}")
        records = [_record(k, raw, FILE_RECORD_FIELDS) for k, raw in enumerate(nodes)]
        for rec in records:  # each record's attrs are its own copy
            for key, value in rec.attrs.items():
                if isinstance(value, dict) and "array" in value:
                    rec.attrs[key] = _array_from_json(rec.label, key, value)
        meta = data.get("meta", {})
        if not isinstance(meta, dict):
            raise GraphError(f"'meta' must be an object, got {_show(meta)}")
        g = cls._build(records, data["outputs"], name)
        g.meta = json.loads(json.dumps(meta))
        for rec, raw in zip(records, nodes, strict=True):
            _check_file_type(g.node(rec.id), raw)
        return g

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Graph:
        try:
            data = json.loads(text)
        except RecursionError:
            raise GraphError("graph file is nested too deeply to read") from None
        except ValueError as exc:  # JSONDecodeError, or an integer literal with too many digits
            raise GraphError(f"graph file is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        """Write JSON to ``path``; a non-empty weight store goes to the ``.npz`` beside it (``path`` with the
        suffix ``.npz``), which the JSON names.  GraphError for a ``path`` ending in ``.npz``, the store's own
        name."""
        path = graph_file_path(path)
        data = self.to_dict()
        if self.weights:
            store = path.with_suffix(".npz")
            np.savez(store, **self.weights)
            data["weights"] = store.name
        path.write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Graph:
        """Read a graph written by :meth:`save` (UTF-8 JSON), with the weight store (.npz) its JSON names.

        The store must be a file beside the graph (its name alone, no folder); of its arrays, those named as a
        Param of the graph are read, after their headers are checked against the Param (shape, a real
        numeric dtype), so no array is inflated beyond the size its Param declares.  OSError when the graph
        cannot be read, GraphError when it or its store is malformed.
        """
        path = Path(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GraphError(f"graph file is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        g = cls.from_json(text)
        store = json.loads(text).get("weights")
        if store is not None:
            g.weights = read_weight_store(path, store, {n.name: n for n in g.params})
        return g


def graph_file_path(path: str | Path) -> Path:
    """``path`` as where :meth:`Graph.save` may write a graph; GraphError for a name ending in ``.npz``, which
    is its weight store's (the JSON would be written over the weights)."""
    path = Path(path)
    if path.suffix == ".npz":
        raise GraphError(f"{path}: a graph is saved as JSON; '.npz' is the suffix of its weight store, written "
                         "beside it (save the graph as NAME.json)")
    return path


def read_weight_store(graph_path: Path, store: Any, params: Mapping[str, Node]) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file ``store`` beside ``graph_path`` that name one of ``params`` (see
    :meth:`Graph.load`); GraphError naming the store and the array for anything else."""
    if not (isinstance(store, str) and store.endswith(".npz") and store not in (".npz", "..npz")
            and "/" not in store and "\\" not in store and Path(store).name == store):
        raise GraphError(f"'weights' must name a .npz file beside the graph (a file name, no folder), "
                         f"got {store!r}" if isinstance(store, str) else _show(store))
    where = f"weight store {store!r} named by {graph_path}"
    file = graph_path.parent / store
    if file.resolve().parent != graph_path.parent.resolve():
        raise GraphError(f"{where}: it links to a file outside the graph's folder")
    return read_npz(file, where, params)


def read_reference_inputs(path: str | Path, graph: Graph) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file ``path`` as values of ``graph``'s inputs (reference inputs for the parity
    check), each checked against its Input as a stored weight is against its Param; GraphError naming the file
    and the array otherwise, or the names that are no input."""
    inputs = {n.name: n for n in graph.inputs}
    unknown: list[str] = []
    out = read_npz(Path(path), f"reference inputs {str(path)!r}", inputs, unknown)
    if unknown:
        raise GraphError(f"reference inputs {str(path)!r}: reference input(s) {', '.join(map(repr, unknown))} name "
                         f"no input of the graph (its inputs: {', '.join(map(repr, inputs)) or 'none'})")
    return out


def read_npz(file: Path, where: str, nodes: Mapping[str, Node],
             unknown: list[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` archive ``file`` that name one of ``nodes`` (leaves), each checked against its
    node before its data is read (:func:`_stored_array`); the names of the others go to ``unknown`` (else they
    are skipped).  GraphError starting with ``where`` for anything else."""
    try:
        if not zipfile.is_zipfile(file):
            raise GraphError(f"{where}: not an .npz archive (write one with numpy.savez)")
        out: dict[str, np.ndarray] = {}
        with zipfile.ZipFile(file) as archive:
            for info in archive.infolist():
                name = info.filename.removesuffix(".npy")
                if name not in nodes:
                    if unknown is not None:
                        unknown.append(name)
                    continue
                with archive.open(info) as member:
                    out[name] = _stored_array(member, nodes[name], where)
        return out
    except GraphError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise GraphError(f"{where}: {type(exc).__name__}: {exc}") from None


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
# A stored weight's numpy dtype kinds a Param may take, by the Param's dtype kind (float, int, bool).
_STORED_KINDS = {"f": "fiub", "i": "iub", "b": "b"}


def _stored_array(member: Any, param: Node, where: str) -> np.ndarray:
    """One ``.npy`` member for leaf ``param``: its header checked (a real numeric dtype, ``param``'s shape) before
    its data is read, so a member cannot inflate beyond that size."""
    label = f"{where}: array {param.name!r}"
    version = np.lib.format.read_magic(member)
    if version not in _NPY_HEADERS:
        raise GraphError(f"{label}: .npy format version {version} is not read (numpy.savez writes 1.0 and 2.0)")
    shape, fortran, stored = _NPY_HEADERS[version](member)
    kind = np.dtype(DTYPES[param.dtype].storage).kind
    if stored.hasobject or stored.kind not in _STORED_KINDS[kind]:
        raise GraphError(f"{label} holds {stored} values; its {param.op} is {param.dtype} (a value is a real "
                         "array of bool, int or float)")
    fits = len(shape) == len(param.shape) and all(
        isinstance(d, Sym) or d == n for d, n in zip(param.shape, shape, strict=True))
    if not fits:
        raise GraphError(f"{label} has shape {list(shape)}; its {param.op} has shape {list(param.shape)}")
    count = math.prod(shape)
    data = member.read(count * stored.itemsize)
    if len(data) != count * stored.itemsize:
        raise GraphError(f"{label} is truncated: {len(data)} of {count * stored.itemsize} bytes")
    array = np.frombuffer(data, stored).reshape(shape, order="F" if fortran else "C")
    return np.array(array)  # its own writable copy


class _Record(NamedTuple):
    """A checked node record."""

    id: int
    op: str
    inputs: tuple[int, ...]
    attrs: dict[str, Any]

    @property
    def label(self) -> str:
        return f"node {self.id} ({self.op})"


_REPR = reprlib.Repr(maxlevel=3, maxstring=40, maxother=40, maxlist=6, maxdict=4)


def _show(value: Any) -> str:
    """``value`` for an error message: a short repr, saying so when it is a string."""
    return _REPR.repr(value) + (" (a string)" if isinstance(value, str) else "")


def as_node_id(value: Any, what: str) -> int:
    """``value`` as a node id; GraphError naming ``what`` unless it is an int in [-MAX_NODE_ID, MAX_NODE_ID)
    (``"2"`` is refused)."""
    if type(value) is not int:
        if not isinstance(value, np.integer):  # bool is an int but not an id
            raise GraphError(f"{what} must be a node id (an int), got {_show(value)}")
        value = int(value)
    if not -MAX_NODE_ID <= value < MAX_NODE_ID:
        raise GraphError(f"{what} {_show(value)} is out of range (node ids are ints in [-2**62, 2**62))")
    return value


def _node_ids(value: Any, what: str, each: str) -> tuple[int, ...]:
    """``value`` as node ids; errors call the list ``what`` and its k-th entry ``each`` + k."""
    if type(value) not in (list, tuple) and (isinstance(value, (str, bytes, Mapping))
                                             or not isinstance(value, Iterable)):
        raise GraphError(f"{what} must be a list of node ids, got {_show(value)}")
    return tuple([i if type(i) is int else as_node_id(i, f"{each}{k}") for k, i in enumerate(value)])


def _op_spec(nid: int, op: Any) -> OpSpec:
    if not isinstance(op, str):
        raise GraphError(f"node {nid}: 'op' must be the name of an op, got {_show(op)}")
    spec = REGISTRY.get(op)
    if spec is None:
        raise GraphError(f"node {nid}: unknown op {op!r}")
    return spec


def _no_unknown_fields(label: str, record: Mapping[str, Any], fields: tuple[str, ...]) -> None:
    if not record.keys() <= set(fields):
        unknown = next(key for key in record if key not in fields)
        raise GraphError(f"{label}: unknown field {_show(unknown)}; the fields are {', '.join(fields)}")


def _record(k: int, raw: Any, fields: tuple[str, ...]) -> _Record:
    """Check the ``k``-th node record's fields (those in ``fields`` are allowed)."""
    if type(raw) is not dict and not isinstance(raw, Mapping):
        raise GraphError(f"node record {k} must be an object with fields {', '.join(fields)}, got {_show(raw)}")
    if "id" not in raw:
        raise GraphError(f"node record {k} has no 'id'")
    nid = as_node_id(raw["id"], f"node record {k}: 'id'")
    if "op" not in raw:
        raise GraphError(f"node {nid} has no 'op'")
    spec = _op_spec(nid, raw["op"])
    label = f"node {nid} ({spec.name})"
    _no_unknown_fields(label, raw, fields)
    attrs = raw.get("attrs", {})
    if (type(attrs) is not dict and not isinstance(attrs, Mapping)) or not all(type(key) is str for key in attrs):
        raise GraphError(f"{label}: 'attrs' must be an object mapping attribute names to values, got {_show(attrs)}")
    return _Record(nid, spec.name, _node_ids(raw.get("inputs", ()), f"{label}: 'inputs'", f"{label}: input "),
                   dict(attrs))


def _file_type(node: Node) -> dict[str, Any]:
    """A file record's ``shape`` and ``dtype``; a multi-result node's are one list entry per result."""
    if node.parts:
        return {"shape": [[to_json(d) for d in p.shape] for p in node.parts], "dtype": [p.dtype for p in node.parts]}
    return {"shape": [to_json(d) for d in node.shape], "dtype": node.dtype}


def _check_file_type(node: Node, raw: Mapping[str, Any]) -> None:
    """A file record's optional ``shape``/``dtype`` must be well formed and agree with inference."""
    written = _file_type(node)
    shape, dtype = raw.get("shape", written["shape"]), raw.get("dtype", written["dtype"])
    shapes, dtypes = (shape, dtype) if node.parts else ([shape], [dtype])
    per_result = " per result" if node.parts else ""
    try:
        if type(shapes) is not list or not all(type(s) is list and all(type(d) in (int, str) for d in s)
                                               for s in shapes):
            raise TypeError
        read = [tuple(as_dim(d) for d in s) for s in shapes]
    except TypeError:
        raise GraphError(f"node {node.id} ({node.op}): 'shape' must be a list of ints{per_result}, "
                         f"got {_show(shape)}") from None
    except ShapeError as exc:
        raise GraphError(f"node {node.id} ({node.op}): 'shape': {exc}") from None
    if type(dtypes) is not list or not all(isinstance(d, str) for d in dtypes):
        raise GraphError(f"node {node.id} ({node.op}): 'dtype' must be a string{per_result}, got {_show(dtype)}")
    inferred = [p.shape for p in node.parts] if node.parts else [node.shape]
    if (read, dtype) != (inferred, written["dtype"]):
        said = dtype if isinstance(dtype, str) and dtype.isprintable() else repr(dtype)
        raise GraphError(f"node {node.id} ({node.op}): file says {said}{shape}, inferred {node.type}")


def _check_dims(shape: tuple[Any, ...]) -> None:
    """Int dims in [0, MAX_DIM); a symbolic dim must be >= 0 for every value of its symbols (else ShapeError)."""
    bad = [d for d in shape if not (d >= 0 if isinstance(d, Sym) else 0 <= d < MAX_DIM)]
    if bad:
        raise ShapeError(f"dimension {bad[0]} of shape {list(shape)} is out of range (dims are ints in [0, 2**31))")


def _topological(by_id: dict[int, _Record]) -> list[int]:
    """Stable topological order of node records; GraphError on a cycle."""
    state: dict[int, int] = {}
    order: list[int] = []
    for root in by_id:
        if root in state:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        path: list[int] = []
        while stack:
            nid, k = stack.pop()
            if k == 0:
                if state.get(nid) == 2:
                    continue
                state[nid] = 1
                path.append(nid)
            inputs = by_id[nid].inputs
            if k < len(inputs):
                stack.append((nid, k + 1))
                child = inputs[k]
                if state.get(child) == 1:
                    cycle = [*path[path.index(child):], child]
                    raise GraphError(f"{by_id[nid].label}: the graph has a cycle through nodes "
                                     f"{' -> '.join(map(str, cycle))}")
                if state.get(child) != 2:
                    stack.append((child, 0))
            else:
                state[nid] = 2
                path.pop()
                order.append(nid)
    return order


def _attr_to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"array": value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, tuple):
        return [to_json(v) for v in value]
    return to_json(value)


def _array_from_json(label: str, key: str, value: dict[str, Any]) -> np.ndarray:
    """An array attribute as a file holds it: ``{"array", "dtype", "shape"}``."""
    try:
        return np.array(value["array"], dtype=value["dtype"]).reshape(value["shape"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise GraphError(f"{label}: malformed array attribute {key!r}: {type(exc).__name__}: {exc}") from None


def _make_builder(spec: OpSpec):
    """A Graph method ``g.<builder>(*inputs, **attrs)`` for one op, signature from its spec."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for raw in spec.inputs:
        name = raw.rstrip("?*")
        if raw.endswith("*"):
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Sequence[int]"))
        else:
            default = None if raw.endswith("?") else inspect.Parameter.empty
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                            annotation="int"))
    for a in spec.attrs:
        default = inspect.Parameter.empty if a.default is REQUIRED else a.default
        params.append(inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, default=default))
    signature = inspect.Signature(params, return_annotation="int")

    def build(self: Graph, *args: Any, **kwargs: Any) -> int:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError as exc:
            raise GraphError(f"node {self._next_id} ({spec.name}): {exc}") from None
        inputs: list[int] = []
        attrs: dict[str, Any] = {}
        for key, value in list(bound.arguments.items())[1:]:
            if key in spec.attr_names:
                attrs[key] = value
            elif spec.variadic and key == spec.input_names[-1]:
                inputs.extend(value)
            elif value is not None:
                inputs.append(value)
        return self.add_node(spec.name, inputs, **attrs)

    build.__name__ = spec.builder
    build.__qualname__ = f"Graph.{spec.builder}"
    build.__signature__ = signature  # type: ignore[attr-defined]
    build.__doc__ = f"Append a {spec.name} node ({spec.kind.value}). {spec.doc}".strip()
    return build


def install_builders() -> None:
    """Give Graph one builder method per registered non-leaf op (idempotent)."""
    for spec in REGISTRY.values():
        if spec.kind is not Kind.LEAF and not hasattr(Graph, spec.builder):
            setattr(Graph, spec.builder, _make_builder(spec))


install_builders()

__all__ = ["FORMAT", "FORMAT_VERSION", "MAX_DIM", "MAX_NODE_ID", "READ_VERSIONS", "Graph", "GraphError", "Node",
           "as_node_id", "check_node", "graph_file_path", "install_builders", "read_weight_store"]
