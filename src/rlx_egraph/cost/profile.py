"""A graph's IO profile on a target, and what rewriting one profile into another saves.

A graph's :func:`profile` is the sum of its node costs (:func:`~rlx_egraph.cost.model.node_cost`) plus the bytes
of each distinct output node read back to the host (views and leaves included); it can be asked for another list
of outputs (``outputs=``: what the host reads, the graph computed as it is).  A :class:`Target` prices it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import Graph
from ..ir.registry import REGISTRY, Kind
from ..ir.specialize import specialize_graph
from .model import FREE, NodeCost, line_key, line_op, masked_rows, node_cost
from .targets import Target, get_target


def _target(target: Target | str) -> Target:
    return get_target(target)


@dataclass(frozen=True)
class KindCost:
    """The nodes of one op kind in a graph, their summed :func:`node_cost` and their ops."""

    nodes: int
    cost: NodeCost
    ops: frozenset[str]


@dataclass(frozen=True)
class IoProfile:
    """A graph's counts, priced on ``target`` (a Target, or a preset name resolved on construction).

    ``ops`` names the ops the graph uses, so a target lacking one of them
    prices the graph at infinity.
    """

    launches: int
    sync_points: int
    readback_bytes: int
    traffic_bytes: int
    flops: int
    target: Target
    ops: frozenset[str] = field(default_factory=frozenset)
    by_kind: Mapping[str, KindCost] = field(default_factory=dict, compare=False)  # op kind -> its nodes' sum
    by_op: Mapping[str, NodeCost] = field(default_factory=dict, compare=False)  # line key -> its nodes' sum
    values: int = 0  # graph inputs and outputs a run is called with and returns
    value_bytes: int = 0  # their bytes
    rows: int = 0  # the nodes' rows and matrices (cost.model.node_rows, node_matrices), summed
    matrices: int = 0
    weight_bytes: int = 0  # the graph's parameters, which a run reads from memory once they outgrow the cache
    masked_rows: int = 0  # score rows a mask may mask keys of (cost.model.masked_rows), summed

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", _target(self.target))
        object.__setattr__(self, "ops", frozenset(self.ops))

    @property
    def unsupported_ops(self) -> tuple[str, ...]:
        """The ops of the graph that ``target`` lacks, sorted."""
        return tuple(sorted(op for op in self.ops if not self.target.supports(op)))

    def breakdown(self) -> dict[str, float]:
        """Predicted ns per term; ``run`` is the target's fixed cost of one run of the graph, ``values`` that of
        its inputs and outputs (:attr:`values`, :attr:`value_bytes`; 0 on targets that do not price them),
        ``stream`` that of reading its weights past the target's cache from memory (:attr:`weight_bytes`;
        0 on targets that do not price it), ``masked`` that of the score rows a mask masks keys of
        (:attr:`masked_rows`; 0 on targets that do not price it);
        ``unsupported`` is inf when the target lacks an op, else 0.  On a target with measured lines
        (:meth:`Target.rate`) each op's nodes are priced by their line (from ``by_op``; a profile without it by the
        target-wide figures)."""
        tgt = self.target
        if not (tgt.rates and self.by_op):
            terms = tgt.terms(self.launches, self.sync_points, self.traffic_bytes, self.readback_bytes, self.flops)
        else:
            terms = tgt.terms(0, self.sync_points, 0, self.readback_bytes, 0)
            for op, cost in self.by_op.items():
                part = tgt.terms(cost.launches, 0, cost.traffic_bytes, 0, cost.flops,
                                 tgt.rate(REGISTRY[line_op(op)], op), cost.rows, cost.matrices)
                for term in ("dispatch", "traffic", "compute"):
                    terms[term] += part[term]
        terms["run"] = tgt.run_ns
        terms["values"] = self.values * tgt.value_ns + self.value_bytes * tgt.value_ns_per_byte
        terms["stream"] = max(self.weight_bytes - tgt.cache_bytes, 0) * tgt.stream_ns_per_byte
        terms["masked"] = self.masked_rows * tgt.masked_row_ns
        terms["unsupported"] = math.inf if self.unsupported_ops else 0.0
        return terms

    @property
    def ns(self) -> float:
        """Predicted time in ns (inf when the target lacks an op the graph uses)."""
        return sum(self.breakdown().values())

    def kind_ns(self, kind: str) -> float:
        """Predicted ns of the nodes of op kind ``kind`` (readback excluded; inf if the target lacks one of
        their ops)."""
        part = self.by_kind[kind]
        if any(not self.target.supports(op) for op in part.ops):
            return math.inf
        if self.target.rates and self.by_op:
            return sum(self.target.cost_ns(cost, REGISTRY[line_op(key)], key) for key, cost in self.by_op.items()
                       if line_op(key) in part.ops)
        return self.target.cost_ns(part.cost)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target.name,
            "launches": self.launches,
            "sync_points": self.sync_points,
            "readback_bytes": self.readback_bytes,
            "traffic_bytes": self.traffic_bytes,
            "flops": self.flops,
            "ops": sorted(self.ops),
            "unsupported_ops": list(self.unsupported_ops),
            "ns": self.ns,
            "breakdown": self.breakdown(),
        }

    def __str__(self) -> str:
        text = (f"{self.target.name}: {self.launches} launches, {self.sync_points} syncs, "
                f"traffic {_bytes(self.traffic_bytes)}, readback {_bytes(self.readback_bytes)}, "
                f"{self.flops:,} FLOPs -> {format_ns(self.ns)}")
        if self.unsupported_ops:
            text += f" (unsupported: {', '.join(self.unsupported_ops)})"
        return text


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def format_ns(ns: float) -> str:
    """``ns`` in the largest unit that keeps it >= 1 (``"1.52 s"``, ``"230.00 ms"``)."""
    for unit, size in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if math.isfinite(ns) and abs(ns) >= size:
            return f"{ns / size:.2f} {unit}"
    return f"{ns:.0f} ns" if math.isfinite(ns) else "inf ns"


def profile(graph: Graph, target: Target | str = "cpu", outputs: Sequence[int] | None = None) -> IoProfile:
    """The IO profile of ``graph`` on ``target``: the sum of :func:`node_cost` over every node
    (unused ones too; a layout op the target copies is a kernel when it reads an intermediate, as
    :meth:`Target.node_ns` prices it) plus the bytes of each distinct output node read back: the graph's outputs,
    or the node ids ``outputs`` (GraphError naming one the graph lacks).  Symbolic dims count at the target's hints
    (:meth:`Target.hint`)."""
    tgt = _target(target)
    read = graph.outputs if outputs is None else [graph.node(i).id for i in outputs]
    if graph.symbols:
        graph = specialize_graph(graph, {s: tgt.hint(s) for s in graph.symbols})
    by_id, copied = graph.nodes_by_id, tgt.copied_layouts
    op_counts = Counter(node.op for node in graph.nodes)
    nodes: dict[str, int] = {}  # kind -> its nodes
    ops: dict[str, set[str]] = {}
    kind_of: dict[str, str] = {}  # op -> its kind's name, for the ops that cost something
    for op, count in op_counts.items():
        kind = REGISTRY[op].kind
        nodes[kind.value] = nodes.get(kind.value, 0) + count
        ops.setdefault(kind.value, set()).add(op)
        if kind.launches or op in copied:  # others are free: leaves, views, load-time weight preparation
            kind_of[op] = kind.value
    # node_cost is a pure function of a node's signature (op, attributes, input and output types, whether it
    # copies), and most nodes of a model repeat one: each signature is priced once, times its nodes
    signatures: dict[tuple, list] = {}  # signature -> [a node of it, its inputs, whether it copies, nodes]
    unhashable: list[list] = []  # nodes with attribute values such as arrays: priced one by one
    masked = 0  # score rows a mask may mask keys of: they depend on the inputs' ops, not the signature
    for node in graph.nodes:
        if node.op not in kind_of:
            continue
        ins = [by_id[i] for i in node.inputs]
        masked += masked_rows(node.spec, node.attrs, [i.op for i in ins], node.type)
        copies = node.op in copied and any(i.kind is not Kind.LEAF for i in ins)
        try:
            key = (node.op, tuple(node.attrs.items()) if node.attrs else (),
                   tuple([(i.shape, i.dtype, i.parts) for i in ins]), node.shape, node.dtype, node.parts, copies)
            same = signatures.get(key)
        except TypeError:
            unhashable.append([node, ins, copies, 1])
            continue
        if same is None:
            signatures[key] = [node, ins, copies, 1]
        else:
            same[3] += 1
    # kind -> launches, syncs, traffic bytes, FLOPs, rows, matrices (NodeCost's fields, in order)
    sums = {kind: [0] * 6 for kind in nodes}
    op_sums: dict[str, list[int]] = {}  # the same per line key (:func:`line_key`: the op, or the op and its variant)
    for node, ins, copies, count in [*signatures.values(), *unhashable]:
        cost = node_cost(node.spec, node.attrs, [i.type for i in ins], node.type, copies)
        line = op_sums.setdefault(line_key(node.spec, node.attrs, [i.type for i in ins]), [0] * 6)
        counts = (cost.launches, cost.syncs, cost.traffic_bytes, cost.flops, cost.rows, cost.matrices)
        for total in (sums[kind_of[node.op]], line):
            for k, n in enumerate(counts):
                total[k] += n * count
    costs = {k: NodeCost(*v) for k, v in sums.items()}
    total = sum(costs.values(), FREE)
    readback = sum(graph.node(i).type.nbytes for i in dict.fromkeys(read))
    called = [*graph.inputs, *(graph.node(i) for i in dict.fromkeys(read))]
    by_kind = {k: KindCost(nodes[k], costs[k], frozenset(ops[k])) for k in sorted(nodes)}
    return IoProfile(launches=total.launches, sync_points=total.syncs, readback_bytes=readback,
                     traffic_bytes=total.traffic_bytes, flops=total.flops, target=tgt,
                     ops=frozenset(op for k in ops.values() for op in k), by_kind=by_kind,
                     by_op={op: NodeCost(*v) for op, v in sorted(op_sums.items())}, values=len(called),
                     value_bytes=sum(n.type.nbytes for n in called), rows=total.rows, matrices=total.matrices,
                     weight_bytes=weight_bytes(graph, copied), masked_rows=masked)


def weight_bytes(graph: Graph, copied: frozenset[str] = frozenset()) -> int:
    """The bytes of the weights a run of ``graph`` reads: the values computed when the session loads (parameters,
    constants, and what weight preparation and layout ops over them make) that a kernel reads whole, each once; a
    kernel with index inputs (Embedding) reads rows of its table, not all of it.  ``copied``: the layout ops the
    target runs as kernels when they read an intermediate."""
    by_id = graph.nodes_by_id
    launched = {n.id for n in graph.nodes
                if n.kind.launches or (n.op in copied and any(by_id[i].kind is not Kind.LEAF for i in n.inputs))}
    weights = {i for n in graph.nodes if n.id in launched and not n.spec.index_inputs for i in n.inputs
               if i not in launched and by_id[i].op != "Input"}
    return sum(by_id[i].type.nbytes for i in weights)


@dataclass(frozen=True)
class FusionBenefit:
    """What rewriting one profile into another saves (positive = the rewrite helps)."""

    launches_saved: int
    sync_points_saved: int
    readback_bytes_saved: int
    traffic_bytes_saved: int
    flops_saved: int

    def score_ns(self, target: Target | str) -> float:
        """The saved time on ``target``: the difference of the two profiles' predicted ns, priced by the target-wide
        figures (the counts do not say which ops they came from; on a target with measured lines compare the
        profiles themselves: ``before.ns - after.ns``)."""
        saved = _target(target).terms(self.launches_saved, self.sync_points_saved, self.traffic_bytes_saved,
                                      self.readback_bytes_saved, self.flops_saved)
        return sum(saved.values())


def fusion_benefit(before: IoProfile, after: IoProfile) -> FusionBenefit:
    """The savings of ``after`` over ``before`` (target-free)."""
    return FusionBenefit(
        launches_saved=before.launches - after.launches,
        sync_points_saved=before.sync_points - after.sync_points,
        readback_bytes_saved=before.readback_bytes - after.readback_bytes,
        traffic_bytes_saved=before.traffic_bytes - after.traffic_bytes,
        flops_saved=before.flops - after.flops,
    )
