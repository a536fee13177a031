"""ElementwiseRegion: maximal chains of elementwise ops as one kernel.

Applied to the extracted graph, outside egglog: a region is variadic (any
number of inputs and steps), which one egglog constructor pattern cannot
express.  A chain grows through values that are used exactly once (never a
graph output) and whose shape matches the region's or broadcasts into it from
the trailing axes; it stops at the target's ``region_max_steps`` steps or
``region_max_inputs`` inputs.
A target without region kernels keeps the ops unfused, and a region is kept
only when the cost model says it pays.  ``ir.decompose.decompose(graph, {"ElementwiseRegion"})`` is the inverse.

A region computes exactly what its steps compute: its kernel runs every step
through :func:`~rlx_egraph.kernels.reference.run_node`, as the interpreter runs
the node it replaced, so each value is stored in its step's dtype (f16/bf16
rounded, integers truncated) before the next step reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..cost import Target
from ..cost.targets import REGION_MAX_INPUTS, REGION_MAX_STEPS
from ..ir.graph import Graph, Node, check_node
from ..ir.registry import Kind, op_spec
from .budget import Deadline

# Elementwise-kind ops a region kernel cannot compute lane by lane: Embedding gathers whole rows
# of its table and RoPE reads its position (axis -2) and the partner lane rotate-half pairs it
# with.  Every other elementwise op is reproduced bit for bit inside a region (module docstring).
_NOT_IN_REGIONS = frozenset({"Embedding", "RoPE"})
DEADLINE_STRIDE = 4096  # nodes find_regions looks at between two looks at the clock


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


def find_regions(graph: Graph, max_steps: int = REGION_MAX_STEPS, max_inputs: int = REGION_MAX_INPUTS,
                 deadline: Deadline | None = None) -> list[Region]:
    """Chains of two or more eligible nodes, each inner value used once; past ``deadline`` (checked every
    DEADLINE_STRIDE nodes), those among the nodes seen so far."""
    outputs = set(graph.outputs)
    members: dict[int, list[int]] = {}  # tail -> members so far
    region_of: dict[int, int] = {}
    for k, node in enumerate(graph.nodes):
        if deadline is not None and k % DEADLINE_STRIDE == 0 and deadline.expired():
            break
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


def apply_regions(graph: Graph, target: Target,
                  deadline: Deadline | None = None) -> tuple[Graph, dict[int, int], list[Region]]:
    """``graph`` with its regions fused when ``target`` has region kernels and they pay.

    Returns the new graph (``graph`` itself when no region applies), a map new node id -> ``graph`` node
    id of the same value, and the regions applied.  Past ``deadline`` the pass stops looking: the regions
    found and priced by then are applied.
    """
    regions = find_regions(graph, target.region_max_steps, target.region_max_inputs, deadline) \
        if target.region_kernels else []
    paying = []
    for r in regions:
        if deadline is not None and deadline.expired():
            break
        if _pays(graph, r, target):
            paying.append(r)
    regions = paying
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
