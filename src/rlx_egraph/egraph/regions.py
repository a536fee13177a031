"""ElementwiseRegion: maximal chains of elementwise ops as one kernel.

Applied to the extracted graph, outside egglog: a region is variadic (any
number of inputs and steps), which one egglog constructor pattern cannot
express.  A chain grows through values that are used exactly once (never a
graph output) and whose shape matches the region's or broadcasts into it from
the trailing axes; it stops at the target's ``region_max_steps`` steps or
``region_max_inputs`` inputs.
A target without region kernels keeps the ops unfused, and a region is kept
only when the cost model says it pays.  ``ir.decompose.decompose(graph, {"ElementwiseRegion"})`` is the inverse.

A region already in a graph that is longer or reads more inputs than a target's region kernels take
(one made for another target, or by hand) is clipped by :func:`clip_regions`: its steps regrouped
into regions within the limits.  ``optimize`` and ``compile`` both apply it.

A region computes exactly what its steps compute: its kernel runs every step
through :func:`~rlx_egraph.kernels.reference.run_node`, as the interpreter runs
the node it replaced, so each value is stored in its step's dtype (f16/bf16
rounded, integers truncated) before the next step reads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from typing import Any

from ..cost import Target
from ..cost.targets import REGION_MAX_INPUTS, REGION_MAX_STEPS
from ..ir.decompose import decompose
from ..ir.graph import Graph, Node, check_node
from ..ir.ops.fused import region_program
from ..ir.registry import Kind, op_spec

# Elementwise-kind ops a region kernel cannot compute lane by lane: Embedding gathers whole rows
# of its table and RoPE reads its position (axis -2) and the partner lane rotate-half pairs it
# with.  Every other elementwise op is reproduced bit for bit inside a region (module docstring).
_NOT_IN_REGIONS = frozenset({"Embedding", "RoPE"})


@dataclass(frozen=True)
class Region:
    tail: int  # the node whose value the region produces
    members: tuple[int, ...]  # in topological order
    inputs: tuple[int, ...]


def eligible(graph: Graph, node: Node) -> bool:
    """An elementwise map whose inputs equal its shape or broadcast from the trailing axes."""
    if node.kind is not Kind.ELEMENTWISE or node.op in _NOT_IN_REGIONS:
        return False
    for i in node.inputs:
        shape = graph.node(i).shape
        if shape != node.shape and node.shape[len(node.shape) - len(shape):] != shape \
                and any(d != 1 for d in shape):
            return False
    return True


def find_regions(graph: Graph, max_steps: int = REGION_MAX_STEPS, max_inputs: int = REGION_MAX_INPUTS) -> list[Region]:
    """Chains of two or more eligible nodes, each inner value used once."""
    outputs = set(graph.outputs)
    members: dict[int, list[int]] = {}  # tail -> members so far
    region_of: dict[int, int] = {}
    for node in graph.nodes:
        if not eligible(graph, node):
            continue
        joinable = {region_of[i] for i in node.inputs
                    if i in region_of and graph.use_count(i) == 1 and i not in outputs
                    and graph.node(i).shape == node.shape}
        if len(joinable) == 1:
            tail = joinable.pop()
            chain = members[tail] + [node.id]
            if len(chain) <= max_steps and len(_external_inputs(graph, chain)) <= max_inputs:
                del members[tail]
                members[node.id] = chain
                for m in chain:
                    region_of[m] = node.id
                continue
        members[node.id] = [node.id]
        region_of[node.id] = node.id
    return [Region(tail, tuple(chain), tuple(_external_inputs(graph, chain)))
            for tail, chain in sorted(members.items()) if len(chain) >= 2]


def _external_inputs(graph: Graph, chain: list[int]) -> list[int]:
    inside = set(chain)
    return list(dict.fromkeys(i for m in chain for i in graph.node(m).inputs if i not in inside))


def chain_json(graph: Graph, region: Region) -> str:
    """The region's program: its inputs' dtypes and one [op, attrs, operands] per step,
    operand i >= 0 region input i, -k the value of step k-1."""
    step_of = {m: k for k, m in enumerate(region.members)}
    slot = {i: k for k, i in enumerate(region.inputs)}
    steps = []
    for m in region.members:
        node = graph.node(m)
        operands = [-(step_of[i] + 1) if i in step_of else slot[i] for i in node.inputs]
        attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in node.attrs.items()}
        steps.append([node.op, attrs, operands])
    return json.dumps({"inputs": [graph.node(i).dtype for i in region.inputs], "steps": steps})


def apply_regions(graph: Graph, target: Target) -> tuple[Graph, dict[int, int], list[Region]]:
    """``graph`` with its regions fused when ``target`` has region kernels and they pay.

    Returns the new graph (``graph`` itself when no region applies), a map new node id -> ``graph`` node
    id of the same value, and the regions applied.
    """
    regions = find_regions(graph, target.region_max_steps, target.region_max_inputs) if target.region_kernels else []
    regions = [r for r in regions if _pays(graph, r, target)]
    if not regions:
        return graph, {n.id: n.id for n in graph.nodes}, []
    out, same_value = fuse_regions(graph, regions)
    return out, same_value, regions


def fuse_regions(graph: Graph, regions: list[Region]) -> tuple[Graph, dict[int, int]]:
    """``graph`` with each of ``regions`` replaced by one ElementwiseRegion node; returns it and a map
    new node id -> ``graph`` node id of the same value.  Every node keeps its id (a region takes its tail's):
    the nodes outside the regions are the same, reading the same ids of the same types."""
    by_tail = {r.tail: r for r in regions}
    absorbed = {m for r in regions for m in r.members if m != r.tail}
    kept: list[Node] = []
    for node in graph.nodes:
        if node.id in absorbed:
            continue
        if node.id in by_tail:  # checked against ``graph``: its inputs are there, of the same types
            r = by_tail[node.id]
            region = check_node(node.id, "ElementwiseRegion", list(r.inputs), {"chain": chain_json(graph, r)},
                                graph.nodes_by_id.get, {})
            if region.type != node.type:
                raise AssertionError(f"region ending at node {node.id} computes {region.type}, not {node.type}")
            kept.append(region)
        else:
            kept.append(node)
    out = Graph.from_checked(graph.name, kept)
    out.set_outputs(graph.outputs)
    return out, {n.id: n.id for n in out.nodes}


def _pays(graph: Graph, region: Region, target: Target) -> bool:
    spec = op_spec("ElementwiseRegion")
    in_types = [graph.node(i).type for i in region.inputs]
    attrs, out = spec.resolve({"chain": chain_json(graph, region)}, in_types)
    fused = target.node_ns(spec, attrs, in_types, out)
    unfused = 0.0
    for m in region.members:
        node = graph.node(m)
        unfused += target.node_ns(node.spec, node.attrs, [graph.node(i).type for i in node.inputs], node.type)
    return fused < unfused


REGION = "ElementwiseRegion"
REGION_OPS = frozenset({REGION})  # the region kinds: expand_regions decomposes them


@dataclass(frozen=True)
class ClippedRegion:
    """A region over a target's limits, regrouped: ``pieces`` are the nodes that replace it, the last keeping its
    id (each a region within the limits, or a step left alone)."""

    node: int
    steps: int
    inputs: int
    pieces: tuple[int, ...]

    def __str__(self) -> str:
        return f"node {self.node} ({self.steps} steps, {self.inputs} inputs) -> {len(self.pieces)} nodes"


def oversized(graph: Graph, node: Node, max_steps: int, max_inputs: int) -> bool:
    """Whether ``node`` is a region with more than ``max_steps`` steps or ``max_inputs`` inputs."""
    if node.op != REGION:
        return False
    steps = region_program(node.attrs, [graph.node(i).type for i in node.inputs])
    return len(steps) > max_steps or len(node.inputs) > max_inputs


def clip_regions(graph: Graph, max_steps: int = REGION_MAX_STEPS,
                 max_inputs: int = REGION_MAX_INPUTS) -> tuple[Graph, list[ClippedRegion]]:
    """``graph`` with each oversized region (:func:`oversized`) replaced by its steps regrouped into regions
    within the limits, and what was clipped (``graph`` itself when nothing is).  Every other node keeps its id,
    a clipped region's value keeps the region's, and the other new nodes get ids after the largest one."""
    if not any(oversized(graph, n, max_steps, max_inputs) for n in graph.nodes):
        return graph, []
    out, _, pieces = substituted(graph, lambda n: _regrouped(graph, n, max_steps, max_inputs)
                                 if oversized(graph, n, max_steps, max_inputs) else None)
    return out, [ClippedRegion(nid, len(json.loads(graph.node(nid).attrs["chain"])["steps"]),
                               len(graph.node(nid).inputs), made) for nid, made in pieces.items()]


def expand_regions(graph: Graph) -> tuple[Graph, dict[int, int]]:
    """``graph`` with every region node replaced by the nodes of its steps, and the map node id -> id of the node
    of ``graph`` it stands for (a step: its region; a batched region's result: the Get that read it)."""
    if not any(n.op in REGION_OPS for n in graph.nodes):
        return graph, {n.id: n.id for n in graph.nodes}
    out, origin, _ = substituted(graph, lambda n: _steps(graph, n) if n.op in REGION_OPS else None)
    return out, origin


def substituted(graph: Graph, pieces_of: Callable[[Node], Graph | None]) -> tuple[Graph, dict[int, int],
                                                                                  dict[int, tuple[int, ...]]]:
    """``graph`` with each node for which ``pieces_of`` gives a graph (over one Input per input of the node, its
    outputs the node's results) replaced by that graph's nodes.  Other nodes keep their ids, a single result keeps
    the node's id, and the other new nodes get ids after the largest one; a Get of a replaced multi-result node
    is the result it read.  Returns the new graph, the map new id -> id of the node of ``graph`` it stands for, and
    per replaced node the ids of its new nodes."""
    out = Graph(graph.name)
    new_of: dict[int, Any] = {}
    origin: dict[int, int] = {}
    made: dict[int, tuple[int, ...]] = {}
    fresh = count(max(n.id for n in graph.nodes) + 1)
    for node in graph.nodes:
        if node.kind is Kind.PROJECTION and isinstance(new_of[node.inputs[0]], tuple):
            new_of[node.id] = new_of[node.inputs[0]][node.attrs["index"]]
            origin[new_of[node.id]] = node.id
            continue
        inputs = [new_of[i] for i in node.inputs]
        pieces = pieces_of(node)
        if pieces is None:
            new_of[node.id] = out.add_node(node.op, inputs, node_id=node.id, **node.attrs)
            origin[node.id] = node.id
            continue
        placed = dict(zip((n.id for n in pieces.inputs), inputs, strict=True))
        single = pieces.outputs[0] if not node.parts else None
        for n in pieces.nodes:
            if n.op != "Input":
                placed[n.id] = out.add_node(n.op, [placed[i] for i in n.inputs],
                                            node_id=node.id if n.id == single else next(fresh), **n.attrs)
                origin[placed[n.id]] = node.id
        made[node.id] = tuple(placed[n.id] for n in pieces.nodes if n.op != "Input")
        results = tuple(placed[o] for o in pieces.outputs)
        new_of[node.id] = results if node.parts else results[0]
    out.set_outputs(new_of[o] for o in graph.outputs)
    return out, origin, made


def _alone(graph: Graph, node: Node) -> Graph:
    """``node`` alone over one Input per input, its outputs the node's results."""
    alone = Graph(f"{node.op} {node.id}")
    slots = [alone.input(f"in{k}", graph.node(i).shape, graph.node(i).dtype) for k, i in enumerate(node.inputs)]
    made = alone.add_node(node.op, slots, **node.attrs)
    alone.set_outputs([alone.get(made, index=k) for k in range(len(node.parts))] if node.parts else [made])
    return alone


def _steps(graph: Graph, node: Node) -> Graph:
    """Region ``node`` alone as its steps."""
    return decompose(_alone(graph, node), REGION_OPS)


def _regrouped(graph: Graph, node: Node, max_steps: int, max_inputs: int) -> Graph:
    """Region ``node`` alone over Inputs, as its steps grouped into regions within the limits."""
    steps = decompose(_alone(graph, node), {REGION})
    return fuse_regions(steps, find_regions(steps, max_steps, max_inputs))[0]
