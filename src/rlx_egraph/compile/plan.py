"""LIR: a graph's launch order and its memory plan in one arena.

:func:`plan_memory` turns a (legalized) graph into a :class:`Plan`:

* **Steps** in three phases.  Prologue: ``feed`` each graph input into its
  buffer, ``load`` each weight (Param, Constant, Scalar), ``prepare`` each
  derived weight (ConcatParams).  Body: one ``kernel`` per computing node and a
  ``copy`` per layout op that cannot be a view.  Epilogue: per output node a
  ``read`` of the buffer it was computed into, or a ``copy`` into an output
  buffer when it is a view, a leaf or a weight.
* **Views** take no memory: Transpose, Narrow and Expand always, Reshape when
  numpy's no-copy rule holds for its input's strides, and a Param that a
  derived weight concatenates (it is that slice of the derived weight).  A view
  is its root buffer, a byte offset and byte strides.
* **Buffers** live in four sections of the arena, in this order: ``weights``,
  ``inputs``, ``outputs`` (never reused) and ``scratch``, where buffers whose
  liveness intervals (first write .. last read, inclusive, in steps) are
  disjoint share memory.  Scratch offsets come from TFLite's greedy-by-size
  heuristic (largest buffer first, each at the best-fitting gap among the
  placed buffers live at the same time), repeated with the buffers that end
  above the lower bound moved to the front while that helps (squeaky wheel).
  Every offset is a multiple of the alignment (64 bytes by default).

The lower bound of the arena is the fixed sections plus the largest total of
aligned scratch bytes live at one step; no reuse is the fixed sections plus
the sum of all aligned scratch buffers.  A buffer's size is
:func:`value_bytes` of its type and a view's strides come from
:func:`dense_strides`: the only two places where sizes are computed.

Running a plan (:meth:`Plan.run`): numpy views into one arena buffer.

Every value lives where the plan puts it: a kernel reads its inputs from the
arena just before it runs and its output is written to its buffer, a view is
read through its root's bytes at its offset and strides, and bf16 is kept as
its 2-byte bit pattern.  The arena starts filled with 0xFF bytes and a scratch
buffer is filled again after its last read, so a wrong offset, a buffer
reused too early or a liveness interval that ends too soon gives wrong
outputs; a view whose planned bytes differ from the layout op's value raises
:class:`PlanError` naming the view.

The result equals :func:`~rlx_egraph.evaluate` bit for bit: nodes run through
the same :func:`~rlx_egraph.ir.ops.reference.run_node`, leaves get the same
data, and a kernel sees its inputs in the memory layout ``evaluate`` gives
them (numpy reductions sum in an order that depends on the layout), so a
value stored row-major in the arena is handed over in the strides its kernel
produced it with.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir.dtypes import DTYPES
from ..ir.graph import Graph, Node
from ..ir.ops.reference import run_node
from ..ir.registry import Kind, TensorType, ValueType
from ..kernels.interpreter import leaf_value

if TYPE_CHECKING:
    from collections.abc import Sequence

ALIGNMENT = 64
FORMAT = "rlx-egraph-lir"
FORMAT_VERSION = 1
VIEW_OPS = frozenset({"Reshape", "Transpose", "Narrow", "Expand"})
PLACEMENT_ROUNDS = 16


class PlanError(ValueError):
    """A plan breaks one of its invariants, or a run found it wrong; the message names the node or buffer."""


class Phase(StrEnum):
    PROLOGUE = "prologue"
    BODY = "body"
    EPILOGUE = "epilogue"


class Section(StrEnum):
    """The arena's sections, in arena order."""

    WEIGHTS = "weights"
    INPUTS = "inputs"
    OUTPUTS = "outputs"
    SCRATCH = "scratch"


FIXED = (Section.WEIGHTS, Section.INPUTS, Section.OUTPUTS)


def value_bytes(t: ValueType) -> int:
    """Bytes a value of type ``t`` occupies in the arena (a multi-result node's: its results, one after
    the other, each a view of its Get)."""
    return t.nbytes


def dense_strides(t: TensorType) -> tuple[int, ...]:
    """Byte strides of a row-major value of type ``t``."""
    strides, step = [], DTYPES[t.dtype].itemsize
    for d in reversed(t.shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclass(frozen=True)
class Step:
    """One launch: ``action`` on ``node`` in ``phase``; ``index`` is its position in the launch order."""

    index: int
    phase: Phase
    action: str  # feed | load | prepare | kernel | copy | read
    node: int


@dataclass(frozen=True)
class Buffer:
    """Arena bytes [offset, offset + size) holding ``node``'s value from step ``first`` to step ``last``."""

    node: int
    section: Section
    offset: int
    size: int
    first: int
    last: int

    def overlaps(self, other: Buffer) -> bool:
        """Whether the two are live at one step and share a byte."""
        return self.first <= other.last and other.first <= self.last \
            and self.offset < other.offset + other.size and other.offset < self.offset + self.size


@dataclass(frozen=True)
class View:
    """``node``'s value is the bytes of ``root``'s buffer at ``offset`` + sum(index * ``strides``)."""

    node: int
    root: int
    offset: int
    strides: tuple[int, ...]


@dataclass(frozen=True)
class IoEntry:
    """One named value the host writes or reads, at arena byte ``offset`` with byte ``strides``."""

    name: str
    node: int
    shape: tuple[int, ...]
    dtype: str
    offset: int
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Manifest:
    inputs: tuple[IoEntry, ...]
    outputs: tuple[IoEntry, ...]
    params: tuple[IoEntry, ...]


@dataclass(frozen=True, eq=False)
class Plan:
    """A graph's launch order and memory plan (see the module doc); build it with :func:`plan_memory`."""

    graph: Graph
    target: str
    alignment: int
    steps: tuple[Step, ...]
    buffers: tuple[Buffer, ...]  # value buffers; an output copied in the epilogue has one in ``outputs`` too
    views: Mapping[int, View]
    sections: Mapping[Section, tuple[int, int]]  # base offset and size of each section
    value_buffers: Mapping[int, int]  # node -> index in ``buffers`` of the buffer holding its value
    output_buffers: Mapping[int, int]  # output node -> index of its buffer in the outputs section
    io: Manifest

    # --- sizes ----------------------------------------------------------------------------------

    @property
    def arena_bytes(self) -> int:
        return sum(size for _, size in self.sections.values())

    @property
    def fixed_bytes(self) -> int:
        """Bytes of the weights, inputs and outputs sections."""
        return sum(self.sections[s][1] for s in FIXED)

    @property
    def scratch_bytes(self) -> int:
        return self.sections[Section.SCRATCH][1]

    @property
    def scratch_lower_bound_bytes(self) -> int:
        """The largest total of aligned scratch bytes live at one step."""
        return peak_live_bytes([b for b in self.buffers if b.section is Section.SCRATCH], len(self.steps),
                               self.alignment)

    @property
    def lower_bound_bytes(self) -> int:
        return self.fixed_bytes + self.scratch_lower_bound_bytes

    @property
    def no_reuse_bytes(self) -> int:
        """The arena if no two scratch buffers shared memory."""
        return self.fixed_bytes + sum(align(b.size, self.alignment) for b in self.buffers
                                      if b.section is Section.SCRATCH)

    # --- queries --------------------------------------------------------------------------------

    def buffer_of(self, node: int) -> Buffer:
        """The buffer holding ``node``'s value (a view's root buffer)."""
        view = self.views.get(node)
        try:
            return self.buffers[self.value_buffers[node if view is None else view.root]]
        except KeyError:
            raise PlanError(f"node {node} has no buffer in the plan") from None

    def output_buffer(self, node: int) -> Buffer:
        """The buffer of the outputs section that output node ``node`` ends in."""
        return self.buffers[self.output_buffers[node]]

    def phase(self, phase: Phase) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.phase is phase)

    def phase_of(self, node: int) -> Phase:
        """The phase computing ``node``'s value (a view's: its root's)."""
        root = self.buffer_of(node).node
        return next(s.phase for s in self.steps if s.node == root and s.phase is not Phase.EPILOGUE)

    # --- checks, identity, execution ------------------------------------------------------------

    def check(self) -> None:
        """Raise PlanError on a broken invariant: an unaligned or out-of-section buffer, two buffers live at
        one step sharing a byte, a view past its root, or a value read outside its buffer's liveness."""
        check_plan(self)

    def fingerprint(self) -> str:
        """A sha256 of the plan's canonical JSON: the same plan gives the same value in any process."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def run(self, feeds: Mapping[str, np.ndarray] | None = None, params: Mapping[str, np.ndarray] | None = None,
            seed: int = 0) -> list[np.ndarray]:
        """Execute the plan in one numpy arena; returns the outputs exactly as ``evaluate`` does."""
        return run(self, feeds, params, seed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": FORMAT_VERSION, "target": self.target, "alignment": self.alignment,
            "graph": _graph_dict(self.graph),
            "steps": [[s.index, s.phase.value, s.action, s.node] for s in self.steps],
            "buffers": [[b.node, b.section.value, b.offset, b.size, b.first, b.last] for b in self.buffers],
            "views": [[v.node, v.root, v.offset, list(v.strides)] for v in self.views.values()],
            "io": {kind: [[e.name, e.node, list(e.shape), e.dtype, e.offset, list(e.strides)]
                          for e in getattr(self.io, kind)] for kind in ("inputs", "outputs", "params")},
            "sections": {s.value: list(v) for s, v in self.sections.items()},
        }

    def __str__(self) -> str:
        lines = [f"plan {self.graph.name} for {self.target}: {len(self.steps)} steps, arena {self.arena_bytes:,} B "
                 f"(lower bound {self.lower_bound_bytes:,} B, no reuse {self.no_reuse_bytes:,} B), "
                 f"alignment {self.alignment}"]
        lines += [f"  {s.value:8} [{base:>10,} .. {base + size:>10,})" for s, (base, size) in self.sections.items()]
        for step in self.steps:
            node = self.graph.node(step.node)
            where = ""
            if step.action != "read" and step.node in self.value_buffers:
                b = self.buffers[self.value_buffers[step.node]]
                where = f"  {b.section.value}@{b.offset} ({b.size} B, live {b.first}..{b.last})"
            lines.append(f"  {step.index:4} {step.phase.value:8} {step.action:7} %{node.id} {node.op}{where}")
        return "\n".join(lines)


def peak_live_bytes(buffers: Sequence[Buffer], steps: int, alignment: int) -> int:
    """The largest total of aligned sizes of ``buffers`` live at one step."""
    delta = [0] * (steps + 1)
    for b in buffers:
        delta[b.first] += align(b.size, alignment)
        delta[b.last + 1] -= align(b.size, alignment)
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


# --- planning -------------------------------------------------------------------------------------


def plan_memory(graph: Graph, target: str = "cpu", alignment: int = ALIGNMENT) -> Plan:
    """The launch order and memory plan of ``graph`` (see the module doc)."""
    if alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    views = _views(graph)
    outputs = dict.fromkeys(graph.outputs)
    steps, computed = _steps(graph, views, outputs)
    last = len(steps) - 1
    reads = _last_reads(graph, views, steps)
    fixed: dict[Section, list[tuple[int, int, int]]] = {s: [] for s in FIXED}  # node, size, first step
    scratch: list[Buffer] = []  # offsets relative to the section, set by _place_scratch
    for node in graph.nodes:
        if node.id in views:
            continue
        size, first = value_bytes(node.type), computed[node.id]
        if node.op == "Input":
            fixed[Section.INPUTS].append((node.id, size, first))
        elif node.kind in (Kind.LEAF, Kind.WEIGHT_PREP):
            fixed[Section.WEIGHTS].append((node.id, size, first))
        elif node.id in outputs:
            fixed[Section.OUTPUTS].append((node.id, size, first))
        else:
            scratch.append(Buffer(node.id, Section.SCRATCH, 0, size, first, reads.get(node.id, first)))
    copied = [s for s in steps if s.action == "copy" and s.phase is Phase.EPILOGUE]
    fixed[Section.OUTPUTS] += [(s.node, value_bytes(graph.node(s.node).type), s.index) for s in copied]

    buffers: list[Buffer] = []
    sections: dict[Section, tuple[int, int]] = {}
    base = 0
    for section in FIXED:
        offset = base
        for node_id, size, first in fixed[section]:
            buffers.append(Buffer(node_id, section, offset, size, first, last))
            offset += align(size, alignment)
        sections[section] = (base, offset - base)
        base = offset
    offsets = _place_scratch(scratch, len(steps), alignment)
    buffers += [replace(b, offset=base + off) for b, off in zip(scratch, offsets, strict=True)]
    sections[Section.SCRATCH] = (base, max((b.offset - base + align(b.size, alignment) for b in buffers
                                            if b.section is Section.SCRATCH), default=0))

    value_buffers: dict[int, int] = {}
    output_buffers: dict[int, int] = {}
    copied_nodes = {s.node for s in copied}
    for k, b in enumerate(buffers):
        if b.section is Section.OUTPUTS:
            output_buffers[b.node] = k
        if b.section is not Section.OUTPUTS or b.node not in copied_nodes:
            value_buffers[b.node] = k
    resolved = {n: View(n, root, offset, strides) for n, (root, offset, strides) in views.items()}
    io = _manifest(graph, resolved, buffers, value_buffers, output_buffers)
    return Plan(graph, target, alignment, tuple(steps), tuple(buffers), resolved, sections, value_buffers,
                output_buffers, io)


def _views(graph: Graph) -> dict[int, tuple[int, int, tuple[int, ...]]]:
    """node -> (root node, byte offset, byte strides) of every value that is a view of another's buffer."""
    views: dict[int, tuple[int, int, tuple[int, ...]]] = {}

    def where(node: Node) -> tuple[int, int, tuple[int, ...]]:
        return views.get(node.id, (node.id, 0, dense_strides(node.type)))

    # A derived weight's sources are slices of it: decided last-to-first, so a ConcatParams inside another
    # one is placed before its own sources.
    for node in reversed(graph.nodes):
        if node.op != "ConcatParams":
            continue
        root, offset, strides = where(node)
        axis = node.attrs["axis"] % len(node.shape)
        start = 0
        for i in node.inputs:
            part = graph.node(i)
            if i not in views and part.op in ("Param", "ConcatParams"):
                views[i] = (root, offset + start * strides[axis], strides)
            start += part.shape[axis]
    for node in graph.nodes:
        if node.kind is Kind.PROJECTION:  # result k: after results 0..k-1 in the multi-result node's buffer
            source = graph.node(node.inputs[0])
            root, offset = views[source.id][:2] if source.id in views else (source.id, 0)
            before = sum(p.nbytes for p in source.parts[:node.attrs["index"]])
            views[node.id] = (root, offset + before, dense_strides(node.type))
        elif node.op in VIEW_OPS:
            source = graph.node(node.inputs[0])
            root, offset, strides = where(source)
            view = _layout_view(node, source, offset, strides)
            if view is not None:
                views[node.id] = (root, *view)
    return views


def _layout_view(node: Node, source: Node, offset: int, strides: tuple[int, ...]
                 ) -> tuple[int, tuple[int, ...]] | None:
    """(byte offset, byte strides) of layout op ``node`` over ``source`` laid out at (offset, strides), or None
    when its value cannot be a view (a Reshape of incompatible strides)."""
    a = node.attrs
    if node.op == "Transpose":
        return offset, tuple(strides[p] for p in a["perm"])
    if node.op == "Narrow":
        axis = a["axis"] % len(source.shape)
        return offset + a["start"] * strides[axis], strides
    if node.op == "Expand":
        lead = len(node.shape) - len(source.shape)
        return offset, (0,) * lead + tuple(0 if d == 1 and n != 1 else s
                                           for d, n, s in zip(source.shape, node.shape[lead:], strides, strict=True))
    new = reshape_strides(source.shape, strides, node.shape, DTYPES[node.dtype].itemsize)
    return None if new is None else (offset, new)


def reshape_strides(shape: tuple[int, ...], strides: tuple[int, ...], new_shape: tuple[int, ...],
                    itemsize: int) -> tuple[int, ...] | None:
    """Strides of a no-copy reshape of (``shape``, ``strides``) to ``new_shape``, or None (numpy's rule)."""
    old = [(d, s) for d, s in zip(shape, strides, strict=True) if d != 1]
    new_strides = [0] * len(new_shape)
    oi = ni = 0
    while ni < len(new_shape) and oi < len(old):
        nj, oj = ni + 1, oi + 1
        n_size, o_size = new_shape[ni], old[oi][0]
        while n_size != o_size:
            if n_size < o_size:
                n_size *= new_shape[nj]
                nj += 1
            else:
                o_size *= old[oj][0]
                oj += 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
            return None
        new_strides[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            new_strides[k - 1] = new_strides[k] * new_shape[k]
        ni, oi = nj, oj
    tail = new_strides[ni - 1] if ni >= 1 else itemsize
    for k in range(ni, len(new_shape)):
        new_strides[k] = tail
    return tuple(new_strides)


def _steps(graph: Graph, views: Mapping[int, Any], outputs: Mapping[int, None]
           ) -> tuple[list[Step], dict[int, int]]:
    """The launch order, and the step writing each value that has a buffer."""
    prologue: list[tuple[str, int]] = []
    body: list[tuple[str, int]] = []
    for node in graph.nodes:
        if node.id in views:
            continue
        if node.op == "Input":
            prologue.append(("feed", node.id))
        elif node.kind is Kind.WEIGHT_PREP:
            prologue.append(("prepare", node.id))
        elif node.kind is Kind.LEAF:
            prologue.append(("load", node.id))
        else:
            body.append(("copy" if node.kind is Kind.LAYOUT else "kernel", node.id))
    in_place = {n for _, n in body}
    epilogue = [("read" if n in in_place else "copy", n) for n in outputs]
    steps = [Step(k, phase, action, n) for k, (phase, (action, n)) in enumerate(
        [(Phase.PROLOGUE, s) for s in prologue] + [(Phase.BODY, s) for s in body]
        + [(Phase.EPILOGUE, s) for s in epilogue])]
    return steps, {s.node: s.index for s in steps if s.phase is not Phase.EPILOGUE}


def _last_reads(graph: Graph, views: Mapping[int, tuple[int, int, tuple[int, ...]]], steps: Sequence[Step]
                ) -> dict[int, int]:
    """root node -> the last step reading its buffer (through any view)."""
    last: dict[int, int] = {}
    for step in steps:
        if step.phase is Phase.BODY:
            reads = graph.node(step.node).inputs
        elif step.action == "copy" and step.phase is Phase.EPILOGUE:
            reads = (step.node,)
        else:
            continue
        for i in reads:
            last[views[i][0] if i in views else i] = step.index
    return last


def _place_scratch(buffers: Sequence[Buffer], steps: int, alignment: int) -> list[int]:
    """Section offsets for the scratch ``buffers``: TFLite's greedy by size, then squeaky-wheel rounds.

    A round places the buffers in priority order (first: largest first), each at the best-fitting gap among
    the placed buffers live at the same time.  While the top exceeds the lower bound, the buffers above the
    bound move to the front of the order (keeping their order) for another round, at most
    ``PLACEMENT_ROUNDS`` in all; the lowest top wins.
    """
    sizes = [align(b.size, alignment) for b in buffers]
    bound = peak_live_bytes(buffers, steps, alignment)
    live_at: list[list[int]] = [[] for _ in range(steps)]
    for k, b in enumerate(buffers):
        for t in range(b.first, b.last + 1):
            live_at[t].append(k)
    order = sorted(range(len(buffers)), key=lambda k: (-sizes[k], buffers[k].first, buffers[k].node))
    best: list[int] = []
    best_top = math.inf
    for _ in range(PLACEMENT_ROUNDS):
        offsets = _best_fit(buffers, sizes, live_at, order)
        top = max((o + n for o, n in zip(offsets, sizes, strict=True)), default=0)
        if top < best_top:
            best, best_top = offsets, top
        if top <= bound:
            break
        above = [k for k in order if offsets[k] + sizes[k] > bound]
        order = above + [k for k in order if offsets[k] + sizes[k] <= bound]
    return best


def _best_fit(buffers: Sequence[Buffer], sizes: Sequence[int], live_at: Sequence[Sequence[int]],
              order: Sequence[int]) -> list[int]:
    """Offsets placing ``buffers`` in ``order``, each at the smallest gap that fits among the placed buffers
    it overlaps in time (``live_at[t]``: the buffers live at step t), else above them all."""
    offsets = [-1] * len(buffers)
    for k in order:
        b = buffers[k]
        others = sorted({j for t in range(b.first, b.last + 1) for j in live_at[t] if offsets[j] >= 0},
                        key=offsets.__getitem__)
        best, best_gap, top = -1, math.inf, 0
        for j in others:
            gap = offsets[j] - top
            if sizes[k] <= gap < best_gap:
                best, best_gap = top, gap
            top = max(top, offsets[j] + sizes[j])
        offsets[k] = top if best < 0 else best
    return offsets


def _manifest(graph: Graph, views: Mapping[int, View], buffers: Sequence[Buffer], value_buffers: Mapping[int, int],
              output_buffers: Mapping[int, int]) -> Manifest:
    def entry(name: str, node: Node, buffer: Buffer) -> IoEntry:
        view = views.get(node.id)
        if view is None:
            return IoEntry(name, node.id, node.shape, node.dtype, buffer.offset, dense_strides(node.type))
        return IoEntry(name, node.id, node.shape, node.dtype, buffer.offset + view.offset, view.strides)

    def value(node: Node) -> Buffer:
        view = views.get(node.id)
        return buffers[value_buffers[node.id if view is None else view.root]]

    return Manifest(
        inputs=tuple(entry(n.name, n, value(n)) for n in graph.inputs),
        outputs=tuple(IoEntry(f"output{k}", o, graph.node(o).shape, graph.node(o).dtype,
                              buffers[output_buffers[o]].offset, dense_strides(graph.node(o).type))
                      for k, o in enumerate(graph.outputs)),
        params=tuple(entry(n.name, n, value(n)) for n in graph.params),
    )


# --- the static checker -----------------------------------------------------------------------------


def check_plan(plan: Plan) -> None:
    """See :meth:`Plan.check`."""
    g = plan.graph
    base = 0
    for section, (start, size) in plan.sections.items():
        if start != base or size < 0 or start % plan.alignment:
            raise PlanError(f"the {section.value} section [{start}, {start + size}) does not follow the previous "
                            f"section, which ends at {base}, at an aligned offset")
        base = start + size
    for k, b in enumerate(plan.buffers):
        start, size = plan.sections[b.section]
        if b.offset % plan.alignment:
            raise PlanError(f"buffer {k} (node {b.node}) at offset {b.offset} is not aligned to {plan.alignment}")
        if not start <= b.offset or b.offset + b.size > start + size:
            raise PlanError(f"buffer {k} (node {b.node}) [{b.offset}, {b.offset + b.size}) runs outside the "
                            f"{b.section.value} section [{start}, {start + size})")
    # Fixed buffers are live throughout: no two may share a byte.  Scratch buffers live at one step may not.
    # Sorted by offset, a group with two overlapping buffers has two neighbours that overlap.
    groups: dict[int, list[Buffer]] = {-1: [b for b in plan.buffers if b.section is not Section.SCRATCH]}
    for b in plan.buffers:
        if b.section is Section.SCRATCH:
            for t in range(b.first, b.last + 1):
                groups.setdefault(t, []).append(b)
    for group in groups.values():
        ordered = sorted(group, key=lambda b: (b.offset, b.node))
        for a, b in pairwise(ordered):
            if b.offset < a.offset + a.size:
                raise PlanError(f"buffers of node {a.node} and node {b.node} share bytes while both are live "
                                f"(steps {a.first}..{a.last} and {b.first}..{b.last})")
    for view in plan.views.values():
        node, root = g.node(view.node), plan.buffer_of(view.node)
        itemsize = DTYPES[node.dtype].itemsize
        end = view.offset + sum((d - 1) * s for d, s in zip(node.shape, view.strides, strict=True)) + itemsize
        if view.offset < 0 or min(view.strides, default=0) < 0 or end > root.size:
            raise PlanError(f"view node {view.node} ({node.op}) reads bytes [{view.offset}, {end}) of node "
                            f"{view.root}'s {root.size}-byte buffer")
    for step in plan.steps:
        if step.phase is Phase.BODY:
            reads = g.node(step.node).inputs
        elif step.phase is Phase.EPILOGUE:
            reads = (step.node,)
        else:
            continue
        for i in reads:
            b = plan.buffer_of(i)
            if not b.first <= step.index <= b.last:
                raise PlanError(f"step {step.index} ({step.action} node {step.node}) reads node {i} outside its "
                                f"buffer's liveness {b.first}..{b.last}")


def _graph_dict(graph: Graph) -> dict[str, Any]:
    """The graph as canonical JSON data (arrays by content hash)."""
    def attr(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return {"dtype": str(v.dtype), "shape": list(v.shape), "sha256": hashlib.sha256(v.tobytes()).hexdigest()}
        return list(v) if isinstance(v, tuple) else v

    return {"name": graph.name, "outputs": list(graph.outputs),
            "nodes": [[n.id, n.op, list(n.inputs), {k: attr(v) for k, v in n.attrs.items()}, list(n.shape), n.dtype]
                      for n in graph.nodes]}


__all__ = ["ALIGNMENT", "Buffer", "IoEntry", "Manifest", "Phase", "Plan", "PlanError", "Section", "Step", "View",
           "align", "check_plan", "dense_strides", "peak_live_bytes", "plan_memory", "reshape_strides", "value_bytes"]


# Running a plan

POISON = 0xFF


class _Run:
    def __init__(self, plan: Plan, feeds: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray],
                 seed: int) -> None:
        self.plan, self.graph = plan, plan.graph
        self.feeds, self.params, self.seed = feeds, params, seed
        self.arena = np.full(plan.arena_bytes, POISON, dtype=np.uint8)
        self.layout: dict[int, tuple[int, ...]] = {}  # node -> strides of the value evaluate holds
        self.host: dict[int, np.ndarray] = {}  # leaves and derived weights as the host prepares them

    # --- arena access -----------------------------------------------------------------------------

    def _at(self, node: Node, offset: int, strides: tuple[int, ...]) -> np.ndarray:
        """``node``'s value read from the arena at (offset, byte strides), in its storage type."""
        if node.dtype == "bf16":
            bits = np.ndarray(node.shape, np.uint16, self.arena, offset, strides)
            return (bits.astype(np.uint32) << 16).view(np.float32)
        return np.ndarray(node.shape, DTYPES[node.dtype].storage, self.arena, offset, strides)

    def _write(self, node: Node, offset: int, value: Any) -> None:
        """Write ``node``'s value at ``offset``, row-major (a multi-result node's results one after the other)."""
        for t, v in zip(node.results, value if node.parts else (value,), strict=True):
            strides = dense_strides(t)
            if t.dtype == "bf16":
                bits = np.ndarray(t.shape, np.uint16, self.arena, offset, strides)
                bits[...] = (np.asarray(v, np.float32).view(np.uint32) >> 16).astype(np.uint16)
            else:
                np.ndarray(t.shape, DTYPES[t.dtype].storage, self.arena, offset, strides)[...] = v
            offset += t.nbytes

    def read(self, node_id: int) -> np.ndarray:
        """``node_id``'s value from the arena, laid out as ``evaluate`` lays it out."""
        node = self.graph.node(node_id)
        view = self.plan.views.get(node_id)
        if view is None:
            buffer = self.plan.buffer_of(node_id)
            return _with_strides(self._at(node, buffer.offset, dense_strides(node.type)), self.layout[node_id])
        planned = self._at(node, self.plan.buffer_of(node_id).offset + view.offset, view.strides)
        if node.kind is Kind.PROJECTION:  # a result of a multi-result node, laid out as its kernel made it
            return _with_strides(planned, self.layout[node.inputs[0]][node.attrs["index"]])
        if node.kind is not Kind.LAYOUT:  # a weight that is a slice of a derived weight
            return _with_strides(planned, self.layout[node_id])
        source = self.graph.node(node.inputs[0])
        value = run_node(node.spec, node.attrs, [self.read(source.id)], [source.dtype], node.type)
        if np.ascontiguousarray(planned).tobytes() != np.ascontiguousarray(value).tobytes():
            raise PlanError(f"view node {node_id} ({node.op}) at offset {view.offset} strides {list(view.strides)} "
                            f"of node {view.root}'s buffer does not hold the value of the layout op")
        return value

    # --- host data ---------------------------------------------------------------------------------

    def host_value(self, node_id: int) -> np.ndarray:
        """A leaf or derived weight as ``evaluate`` computes it (fed, given, stored or seeded random data)."""
        if node_id in self.host:
            return self.host[node_id]
        node = self.graph.node(node_id)
        if node.op in ("Input", "Param"):
            value = leaf_value(self.graph, node, self.feeds, self.params, self.seed)
        else:
            value = run_node(node.spec, node.attrs, [self.host_value(i) for i in node.inputs],
                             [self.graph.node(i).dtype for i in node.inputs], node.type)
        self.host[node_id] = value
        self.layout[node_id] = value.strides
        return value

    # --- execution ---------------------------------------------------------------------------------

    def run(self) -> list[np.ndarray]:
        ends: dict[int, list[int]] = {}
        for b in self.plan.buffers:
            if b.section is Section.SCRATCH:
                ends.setdefault(b.last, []).append(b.node)
        for step in self.plan.steps:
            node = self.graph.node(step.node)
            if step.phase is Phase.PROLOGUE:
                self._write(node, self.plan.buffer_of(node.id).offset, self.host_value(node.id))
            elif step.phase is Phase.BODY:
                value = run_node(node.spec, node.attrs, [self.read(i) for i in node.inputs],
                                 [self.graph.node(i).dtype for i in node.inputs], node.type)
                self._write(node, self.plan.buffer_of(node.id).offset, value)
                self.layout[node.id] = tuple(v.strides for v in value) if node.parts else value.strides
            elif step.action == "copy":
                self._write(node, self.plan.output_buffer(node.id).offset, self.read(node.id))
            for dead in ends.get(step.index, ()):
                b = self.plan.buffer_of(dead)
                self.arena[b.offset:b.offset + b.size] = POISON
        return [self._at(self.graph.node(o), self.plan.output_buffer(o).offset,
                         dense_strides(self.graph.node(o).type)).copy() for o in self.graph.outputs]


def _with_strides(values: np.ndarray, strides: tuple[int, ...]) -> np.ndarray:
    """``values`` itself when it has ``strides``, else a copy with exactly those (non-negative) strides."""
    if values.strides == strides:
        return values
    extent = sum((d - 1) * s for d, s in zip(values.shape, strides, strict=True)) + values.itemsize
    out = np.ndarray(values.shape, values.dtype, np.empty(extent, np.uint8), 0, strides)
    out[...] = values
    return out


def run(plan: Plan, feeds: Mapping[str, np.ndarray] | None = None, params: Mapping[str, np.ndarray] | None = None,
        seed: int = 0) -> list[np.ndarray]:
    """Execute ``plan``; returns the graph's outputs, equal to ``evaluate(plan.graph, feeds, params, seed)``."""
    return _Run(plan, dict(feeds or {}), dict(params or {}), seed).run()


__all__ = ["POISON", "run"]
