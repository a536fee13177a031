"""Regions: chains of elementwise ops run as one kernel, and their kinds.

Applied to the extracted graph, outside egglog: a region is variadic (any number of inputs and steps), which one
egglog constructor pattern cannot express.  On a target with region kernels, and only where the cost model says it
pays (the region's :meth:`~rlx_egraph.cost.Target.node_ns` below the sum of its steps'):

* ``ElementwiseRegion`` (:func:`find_regions`): a chain grows through values that are used exactly once (never a
  graph output) and whose shape matches the region's or broadcasts into it from the trailing axes; it stops at the
  target's ``region_max_steps`` steps or ``region_max_inputs`` inputs.  Its *prologue*: an ``Upsample2x`` that only
  the region reads becomes part of it (``prologue="upsample2x"``), the kernel reading the small tensor and
  upsampling on the fly, so the 4x larger one is never written; then one step is enough for a region.
* ``TransformRegion`` (:func:`find_transform_regions`, before the above): a chain that goes on through
  ``Transpose`` and ``Reshape`` steps between elementwise steps (each step computed in its own shape), where
  the elementwise pass stops at the layout op and would make two kernels and write the value between them.
* ``BatchElementwiseRegion`` (:func:`find_batches`, after both): independent ElementwiseRegions running the same
  chain on inputs of the same types become one kernel, one lane each, within the input limit; its result stacks
  the lanes on a new leading axis, and each lane's value is a ``Reshape`` of a ``Narrow`` of it (views, no copy),
  which keeps the lane's node id.

``ir.decompose.decompose(graph, REGION_KINDS)`` is the inverse.  A region already in a graph that is longer or reads
more inputs than a target's region kernels take (one made for another target, or by hand) is clipped by
:func:`clip_regions`: its steps regrouped into regions within the limits.  ``optimize`` and ``compile`` both apply it.

A region computes exactly what its steps compute: its kernel runs every step through
:func:`~rlx_egraph.ir.ops.reference.run_node`, as the interpreter runs the node it replaced, so each value is stored
in its step's dtype (f16/bf16 rounded, integers truncated) before the next step reads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count

from ..cost import Target
from ..cost.targets import REGION_MAX_INPUTS, REGION_MAX_STEPS
from ..ir.decompose import decompose
from ..ir.graph import Graph, Node, check_node
from ..ir.ops.regions import (
    BATCH_REGION,
    ELEMENTWISE_REGION,
    REGION_KINDS,
    TRANSFORM_REGION,
    TRANSFORM_STEPS,
)
from ..ir.registry import Kind, op_spec
from .budget import Deadline

# Elementwise-kind ops a region kernel cannot compute lane by lane: Embedding gathers whole rows
# of its table and RoPE reads its position (axis -2) and the partner lane rotate-half pairs it
# with.  Every other elementwise op is reproduced bit for bit inside a region (module docstring).
_NOT_IN_REGIONS = frozenset({"Embedding", "RoPE"})
REGION = ELEMENTWISE_REGION
PROLOGUE_OP = "Upsample2x"
DEADLINE_STRIDE = 4096  # nodes a region search looks at between two looks at the clock


@dataclass(frozen=True)
class Region:
    tail: int  # the node whose value the region produces
    members: tuple[int, ...]  # in topological order (a prologue's Upsample2x first)
    inputs: tuple[int, ...]  # with a prologue, input 0 is what the Upsample2x reads
    kind: str = ELEMENTWISE_REGION
    prologue: str = "none"

    @property
    def steps(self) -> tuple[int, ...]:
        """The members that are steps of the chain (not the prologue's node)."""
        return self.members[1:] if self.prologue != "none" else self.members


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


def _chains(graph: Graph, joins: Callable[[Node], bool], same_shape: Callable[[Node], bool], max_steps: int,
            max_inputs: int, deadline: Deadline | None = None) -> dict[int, list[int]]:
    """Chains (tail -> members) of the nodes ``joins`` admits, each inner value used once and, where
    ``same_shape`` says so, of the shape of the node reading it; within the limits.  Past ``deadline`` (checked
    every DEADLINE_STRIDE nodes), those among the nodes seen so far."""
    outputs = set(graph.outputs)
    members: dict[int, list[int]] = {}  # tail -> members so far
    region_of: dict[int, int] = {}
    for k, node in enumerate(graph.nodes):
        if deadline is not None and k % DEADLINE_STRIDE == 0 and deadline.expired():
            break
        if not joins(node):
            continue
        joinable = {region_of[i] for i in node.inputs
                    if i in region_of and graph.use_count(i) == 1 and i not in outputs
                    and (not same_shape(node) or graph.node(i).shape == node.shape)}
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
    return members


def find_regions(graph: Graph, max_steps: int = REGION_MAX_STEPS, max_inputs: int = REGION_MAX_INPUTS,
                 prologues: bool = True, deadline: Deadline | None = None) -> list[Region]:
    """Chains of two or more eligible nodes, each inner value used once; with ``prologues``, a chain (of one
    node too) that alone reads an ``Upsample2x`` takes it as its prologue.  Past ``deadline``, the chains among
    the nodes seen so far."""
    chains = _chains(graph, lambda n: eligible(graph, n), lambda n: True, max_steps, max_inputs, deadline)
    out = []
    for tail, chain in sorted(chains.items()):
        inputs = _external_inputs(graph, chain)
        upsample = _prologue_input(graph, inputs) if prologues else None
        if upsample is not None:
            rest = [i for i in inputs if i != upsample.id]
            out.append(Region(tail, (upsample.id, *chain), (upsample.inputs[0], *rest), prologue="upsample2x"))
        elif len(chain) >= 2:
            out.append(Region(tail, tuple(chain), tuple(inputs)))
    return out


def _prologue_input(graph: Graph, inputs: Sequence[int]) -> Node | None:
    """The first of a chain's ``inputs`` that is an Upsample2x only the chain reads, once."""
    for i in inputs:
        node = graph.node(i)
        if node.op == PROLOGUE_OP and graph.use_count(i) == 1 and i not in graph.outputs:
            return node
    return None


def find_transform_regions(graph: Graph, max_steps: int = REGION_MAX_STEPS, max_inputs: int = REGION_MAX_INPUTS,
                           deadline: Deadline | None = None) -> list[Region]:
    """Chains of eligible nodes and Transpose/Reshape steps with a layout step between two elementwise ones (the
    layout steps at either end are left out: they stay views).  Past ``deadline``, those among the nodes seen
    so far."""
    def joins(node: Node) -> bool:
        return node.op in TRANSFORM_STEPS or eligible(graph, node)

    out = []
    for chain in _chains(graph, joins, lambda n: n.op not in TRANSFORM_STEPS, max_steps, max_inputs,
                         deadline).values():
        while chain and graph.node(chain[0]).op in TRANSFORM_STEPS:
            chain = chain[1:]
        while chain and graph.node(chain[-1]).op in TRANSFORM_STEPS:
            chain = chain[:-1]
        if any(graph.node(m).op in TRANSFORM_STEPS for m in chain):
            out.append(Region(chain[-1], tuple(chain), tuple(_external_inputs(graph, chain)), TRANSFORM_REGION))
    return sorted(out, key=lambda r: r.tail)


def _external_inputs(graph: Graph, chain: Sequence[int]) -> list[int]:
    inside = set(chain)
    return list(dict.fromkeys(i for m in chain for i in graph.node(m).inputs if i not in inside))


def chain_json(graph: Graph, region: Region) -> str:
    """The region's program: its inputs' dtypes and one [op, attrs, operands] per step,
    operand i >= 0 region input i, -k the value of step k-1 (with a prologue, its node is operand 0)."""
    step_of = {m: k for k, m in enumerate(region.steps)}
    slot = {i: k for k, i in enumerate(region.inputs)}
    if region.prologue != "none":
        slot[region.members[0]] = 0
    steps = []
    for m in region.steps:
        node = graph.node(m)
        operands = [-(step_of[i] + 1) if i in step_of else slot[i] for i in node.inputs]
        attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in node.attrs.items()}
        steps.append([node.op, attrs, operands])
    return json.dumps({"inputs": [graph.node(i).dtype for i in region.inputs], "steps": steps})


def _attrs(graph: Graph, region: Region) -> dict[str, str]:
    attrs = {"chain": chain_json(graph, region)}
    return {**attrs, "prologue": region.prologue} if region.kind == ELEMENTWISE_REGION else attrs


def apply_regions(graph: Graph, target: Target,
                  deadline: Deadline | None = None) -> tuple[Graph, dict[int, int], list[Region]]:
    """``graph`` with its transform regions, then its elementwise regions fused, when ``target`` has region kernels
    (and the kind) and they pay.

    Returns the new graph (``graph`` itself when no region applies), a map new node id -> ``graph`` node
    id of the same value, and the regions applied.  Past ``deadline`` the pass stops looking: the regions
    found and priced by then are applied.
    """
    applied: list[Region] = []
    if target.region_kernels:
        limits = (target.region_max_steps, target.region_max_inputs)
        if target.supports(TRANSFORM_REGION):
            transform = _paying(graph, find_transform_regions(graph, *limits, deadline), target, deadline)
            graph = fuse_regions(graph, transform)[0] if transform else graph
            applied += transform
        if target.supports(ELEMENTWISE_REGION):
            elementwise = _paying(graph, find_regions(graph, *limits, deadline=deadline), target, deadline)
            graph = fuse_regions(graph, elementwise)[0] if elementwise else graph
            applied += elementwise
    return graph, {n.id: n.id for n in graph.nodes}, applied


def _paying(graph: Graph, regions: list[Region], target: Target, deadline: Deadline | None) -> list[Region]:
    """The ``regions`` that pay, among those priced before ``deadline``."""
    out = []
    for r in regions:
        if deadline is not None and deadline.expired():
            break
        if _pays(graph, r, target):
            out.append(r)
    return out


def fuse_regions(graph: Graph, regions: list[Region]) -> tuple[Graph, dict[int, int]]:
    """``graph`` with each of ``regions`` replaced by one region node of its kind; returns it and a map
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
            region = check_node(node.id, r.kind, list(r.inputs), _attrs(graph, r), graph.nodes_by_id.get, {})
            if region.type != node.type:
                raise AssertionError(f"region ending at node {node.id} computes {region.type}, not {node.type}")
            kept.append(region)
        else:
            kept.append(node)
    out = Graph.from_checked(graph.name, kept)
    out.set_outputs(graph.outputs)
    out.adopt_store(graph)  # the same Params: the same weights
    return out, {n.id: n.id for n in out.nodes}


def _node_ns(graph: Graph, node: Node, target: Target) -> float:
    return target.node_ns(node.spec, node.attrs, [graph.node(i).type for i in node.inputs], node.type,
                          any(graph.node(i).kind is not Kind.LEAF for i in node.inputs))


def _pays(graph: Graph, region: Region, target: Target) -> bool:
    spec = op_spec(region.kind)
    in_types = [graph.node(i).type for i in region.inputs]
    attrs, out = spec.resolve(_attrs(graph, region), in_types)
    fused = target.node_ns(spec, attrs, in_types, out, True)
    return fused < sum(_node_ns(graph, graph.node(m), target) for m in region.members)


# --- batches -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Independent ``lanes`` (node ids, in order) run as one BatchElementwiseRegion ``node``; lane j's value is the
    Reshape ``lanes[j]`` of the Narrow ``narrows[j]`` of it."""

    node: int
    lanes: tuple[int, ...]
    narrows: tuple[int, ...]


def _program(node: Node) -> str | None:
    """The chain a node runs when it may be a lane: an ElementwiseRegion without a prologue."""
    return node.attrs["chain"] if node.op == ELEMENTWISE_REGION and node.attrs["prologue"] == "none" else None


def find_batches(graph: Graph, target: Target) -> list[list[int]]:
    """Groups of two or more regions running one program on inputs of the same types, none reading another's value
    (directly or not), whose inputs together fit ``target.region_max_inputs``, and that pay as one kernel."""
    position = graph.positions()
    last = len(graph.nodes)
    by_program: dict[tuple, list[int]] = {}
    for node in graph.nodes:
        program = _program(node)
        if program is not None:
            key = (program, tuple(graph.node(i).type for i in node.inputs), node.type)
            by_program.setdefault(key, []).append(node.id)
    batches = []
    for members in by_program.values():
        width = len(graph.node(members[0]).inputs)
        batch: list[int] = []
        latest_input, earliest_reader = -1, last  # the batch's last input and first reader, by position
        for m in members:
            node = graph.node(m)
            inputs = max(position[i] for i in node.inputs)
            readers = min([position[r] for r in graph.users(m)] + [last])
            if (len(batch) + 1) * width > target.region_max_inputs or set(node.inputs) & set(batch) \
                    or max(latest_input, inputs) >= min(earliest_reader, readers):
                if len(batch) >= 2:
                    batches.append(batch)
                batch, latest_input, earliest_reader = [], -1, last
            batch.append(m)
            latest_input, earliest_reader = max(latest_input, inputs), min(earliest_reader, readers)
        if len(batch) >= 2:
            batches.append(batch)
    chosen: list[list[int]] = []
    lanes: set[int] = set()
    inputs: set[int] = set()
    for b in batches:  # a batch reading another's lane, or read by it, is left out (placed apart, each right
        # after its last input, one could come before a lane it reads)
        reads = {i for m in b for i in graph.node(m).inputs}
        if not (reads & lanes or set(b) & inputs) and _batch_pays(graph, b, target):
            chosen.append(b)
            lanes.update(b)
            inputs.update(reads)
    return chosen


def _batch_attrs(graph: Graph, lanes: Sequence[int]) -> dict[str, object]:
    return {"chain": _program(graph.node(lanes[0])), "lanes": len(lanes)}


def _batch_pays(graph: Graph, lanes: Sequence[int], target: Target) -> bool:
    spec = op_spec(BATCH_REGION)
    in_types = [graph.node(i).type for m in lanes for i in graph.node(m).inputs]
    attrs, out = spec.resolve(_batch_attrs(graph, lanes), in_types)
    return target.node_ns(spec, attrs, in_types, out, True) < sum(_node_ns(graph, graph.node(m), target)
                                                                  for m in lanes)


def apply_batches(graph: Graph, target: Target) -> tuple[Graph, list[Batch]]:
    """``graph`` with its :func:`find_batches` fused, when ``target`` has region kernels and runs
    BatchElementwiseRegion; every lane keeps its id (as the Reshape holding its value), the batch and its
    Narrows get ids after the largest one, placed right after the batch's last input."""
    if not (target.region_kernels and target.supports(BATCH_REGION)):
        return graph, []
    groups = find_batches(graph, target)
    if not groups:
        return graph, []
    position = graph.positions()
    after: dict[int, list[list[int]]] = {}
    for g in groups:
        after.setdefault(max(position[i] for m in g for i in graph.node(m).inputs), []).append(g)
    lanes = {m for g in groups for m in g}
    out = Graph(graph.name)
    fresh = count(max(n.id for n in graph.nodes) + 1)
    made = []
    for k, node in enumerate(graph.nodes):
        if node.id not in lanes:
            out.add_node(node.op, node.inputs, node_id=node.id, **node.attrs)
        for group in after.get(k, ()):
            made.append(_place_batch(out, graph, group, fresh))
    out.set_outputs(graph.outputs)
    return out, made


def _place_batch(out: Graph, graph: Graph, group: list[int], fresh: Iterator[int]) -> Batch:
    """Append the batch of ``group`` (nodes of ``graph``) to ``out``, and per lane a Narrow and the Reshape that
    keeps the lane's id."""
    batch = out.add_node(BATCH_REGION, [i for m in group for i in graph.node(m).inputs],
                         node_id=next(fresh), **_batch_attrs(graph, group))
    narrows = []
    for j, m in enumerate(group):
        narrows.append(out.add_node("Narrow", [batch], node_id=next(fresh), axis=0, start=j, length=1))
        out.add_node("Reshape", [narrows[-1]], node_id=m, shape=graph.node(m).shape)
    return Batch(batch, tuple(group), tuple(narrows))


# --- clipping and expanding --------------------------------------------------------------------------------------


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


def _steps_of(node: Node) -> int:
    return len(json.loads(node.attrs["chain"])["steps"])


def oversized(graph: Graph, node: Node, max_steps: int, max_inputs: int) -> bool:
    """Whether ``node`` is a region with more than ``max_steps`` steps or ``max_inputs`` inputs."""
    return node.op in REGION_KINDS and (_steps_of(node) > max_steps or len(node.inputs) > max_inputs)


def clip_regions(graph: Graph, max_steps: int = REGION_MAX_STEPS,
                 max_inputs: int = REGION_MAX_INPUTS) -> tuple[Graph, list[ClippedRegion]]:
    """``graph`` with each oversized region (:func:`oversized`) replaced by its steps regrouped into regions
    within the limits, and what was clipped (``graph`` itself when nothing is).  Every other node keeps its id,
    a clipped region's value keeps the region's, and the other new nodes get ids after the largest one."""
    if not any(oversized(graph, n, max_steps, max_inputs) for n in graph.nodes):
        return graph, []
    out, _, pieces = substituted(graph, lambda n: _regrouped(graph, n, max_steps, max_inputs)
                                 if oversized(graph, n, max_steps, max_inputs) else None)
    return out, [ClippedRegion(nid, _steps_of(graph.node(nid)), len(graph.node(nid).inputs), made)
                 for nid, made in pieces.items()]


def expand_regions(graph: Graph) -> tuple[Graph, dict[int, int]]:
    """``graph`` with every region node replaced by the nodes of its steps, and the map node id -> id of the node
    of ``graph`` it stands for (a step: its region)."""
    if not any(n.op in REGION_KINDS for n in graph.nodes):
        return graph, {n.id: n.id for n in graph.nodes}
    out, origin, _ = substituted(graph, lambda n: decompose(_alone(graph, n), REGION_KINDS)
                                 if n.op in REGION_KINDS else None)
    return out, origin


def substituted(graph: Graph, pieces_of: Callable[[Node], Graph | None]) -> tuple[Graph, dict[int, int],
                                                                                  dict[int, tuple[int, ...]]]:
    """``graph`` with each node for which ``pieces_of`` gives a graph (over one Input per input of the node, its
    output the node's value) replaced by that graph's nodes.  Other nodes keep their ids (the same Node objects),
    the value keeps the node's id, and the other new nodes get ids after the largest one.  Returns the new graph,
    the map new id -> id of the node of ``graph`` it stands for, and per replaced node the ids of its new nodes."""
    nodes: list[Node] = []
    placed: dict[int, Node] = {}
    origin: dict[int, int] = {}
    made: dict[int, tuple[int, ...]] = {}
    fresh = count(max(n.id for n in graph.nodes) + 1)
    for node in graph.nodes:
        pieces = pieces_of(node)
        if pieces is None:  # its inputs keep their ids and types: the node is valid as it is
            nodes.append(node)
            placed[node.id] = node
            origin[node.id] = node.id
            continue
        local = dict(zip((n.id for n in pieces.inputs), node.inputs, strict=True))  # piece id -> id here
        new: list[int] = []
        for n in pieces.nodes:
            if n.op == "Input":
                continue
            nid = node.id if n.id == pieces.outputs[0] else next(fresh)
            placed[nid] = check_node(nid, n.op, [local[i] for i in n.inputs], n.attrs, placed.get, {})
            nodes.append(placed[nid])
            local[n.id], origin[nid] = nid, node.id
            new.append(nid)
        if placed[node.id].type != node.type:
            raise AssertionError(f"the nodes replacing node {node.id} compute {placed[node.id].type}, not {node.type}")
        made[node.id] = tuple(new)
    out = Graph.from_checked(graph.name, nodes)
    out.set_outputs(graph.outputs)
    out.adopt_store(graph)  # the same Params: the same weights
    return out, origin, made


def _alone(graph: Graph, node: Node) -> Graph:
    """``node`` alone over one Input per input."""
    alone = Graph(f"{node.op} {node.id}")
    slots = [alone.input(f"in{k}", graph.node(i).shape, graph.node(i).dtype) for k, i in enumerate(node.inputs)]
    alone.set_outputs([alone.add_node(node.op, slots, **node.attrs)])
    return alone


def _regrouped(graph: Graph, node: Node, max_steps: int, max_inputs: int) -> Graph:
    """Region ``node`` alone over Inputs, as its steps grouped into regions within the limits (transform regions
    first, for a TransformRegion)."""
    steps = decompose(_alone(graph, node), REGION_KINDS)
    if node.op == TRANSFORM_REGION:
        steps = fuse_regions(steps, find_transform_regions(steps, max_steps, max_inputs))[0]
    return fuse_regions(steps, find_regions(steps, max_steps, max_inputs))[0]
