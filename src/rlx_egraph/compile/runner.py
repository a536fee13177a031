"""Run a :class:`~rlx_egraph.compile.plan.Plan` with numpy views into one arena buffer.

Every value lives where the plan puts it: a kernel reads its inputs from the
arena just before it runs and its output is written to its buffer, a view is
read through its root's bytes at its offset and strides, and bf16 is kept as
its 2-byte bit pattern.  The arena starts filled with 0xFF bytes and a scratch
buffer is filled again after its last read, so a wrong offset, a buffer
reused too early or a liveness interval that ends too soon gives wrong
outputs; a view whose planned bytes differ from the layout op's value raises
:class:`PlanError` naming the view.

The result equals :func:`~rlx_egraph.evaluate` bit for bit: nodes run through
the same :func:`~rlx_egraph.kernels.reference.run_node`, leaves get the same
data, and a kernel sees its inputs in the memory layout ``evaluate`` gives
them (numpy reductions sum in an order that depends on the layout), so a
value stored row-major in the arena is handed over in the strides its kernel
produced it with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..ir.dtypes import DTYPES
from ..ir.graph import Node
from ..ir.registry import Kind
from ..kernels.interpreter import leaf_value
from ..kernels.reference import run_node
from .plan import Phase, Plan, PlanError, Section, dense_strides

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
