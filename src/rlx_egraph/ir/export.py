"""An op's ONNX export, declared with the op (:attr:`OpSpec.onnx <rlx_egraph.ir.registry.OpSpec.onnx>`).

An export is either data, :class:`OnnxExport` (one ONNX node on the op's inputs), or a function,
:class:`OnnxWriter`, written against :class:`ExportBuilder`: the few calls of the ONNX exporter's builder an export
needs.  The ONNX front end's builder (``rlx_egraph.frontends.onnx.exporter.Builder``) implements the protocol, so an
op family module declares an export of several nodes, or one that depends on the node's shapes, next to its kernel
and decomposition without importing the front end.  A fused op that declares an export is one the ``onnxruntime``
cost target runs, as the kernel the declaration names (:attr:`OnnxExport.kernel`, :attr:`OnnxWriter.kernel`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from .dims import Dim
    from .graph import Graph, Node
    from .registry import Attrs, TensorType

MS = "com.microsoft"  # the domain of onnxruntime's contrib ops


class ExportBuilder(Protocol):
    """What an export function may call on the exporter's builder: it appends ONNX nodes and initializers and
    returns the names of the values they write."""

    graph: Graph | None  # the graph being written (an export that looks at a node's producers reads it)
    shapes: dict[str, tuple[Dim, ...]]  # a written value -> its shape, where known
    written: dict[int, Any]  # a node of ``graph`` already written -> its output name(s)
    dim_tensors: dict[Any, Any]  # values written once per key (run-time shape values, shared caches)

    def op(self, op_type: str, inputs: list[str], domain: str = "", **attrs: Any) -> str:
        """Append one node with one output; returns the output's name."""
        ...

    def multi(self, op_type: str, inputs: list[str], used: Sequence[int], domain: str = "", **attrs: Any) -> list[str]:
        """Append one node whose output slots ``used`` get names; returns those names."""
        ...

    def const(self, array: np.ndarray, dtype: str | None = None, name: str | None = None) -> str:
        """An initializer holding ``array`` (stored as MIR ``dtype``)."""
        ...

    def ints(self, values: Iterable[Dim]) -> str:
        """A 1-D int64 tensor of ``values`` (computed at run time where a value is symbolic)."""
        ...

    def dim(self, d: Dim) -> str:
        """A 1-D int64 tensor ``[d]``."""
        ...

    def scalar_dim(self, d: Dim) -> str:
        """A rank-0 int64 tensor of ``d``."""
        ...

    def expand(self, name: str, shape: Iterable[Dim]) -> str:
        """``name`` broadcast to ``shape``, written once per tensor and shape."""
        ...

    def reshape(self, name: str, dims: Iterable[Dim]) -> str:
        """``name`` reshaped to ``dims`` (a view; no node where it undoes one)."""
        ...

    def merged_heads(self, name: str) -> str | None:
        """For ``name`` written as split heads [B, H, S, D], the [B, S, H*D] value it splits; else None."""
        ...

    def split_heads(self, name: str, heads: int) -> str:
        """``name`` [B, S, heads*D] as split heads [B, heads, S, D]."""
        ...

    def known(self, name: str) -> np.ndarray | None:
        """The value of an initializer already written, else None."""
        ...

    def producer(self, name: str) -> tuple[str, list[str]] | None:
        """The op type and inputs of the node written whose first output is ``name``; None if there is none."""
        ...


ExportResult = str | tuple[str, ...] | None
WriteFn = Callable[[ExportBuilder, "Node", list[str], list["TensorType"]], ExportResult]


def _no_attributes(attrs: Attrs) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class OnnxExport:
    """An export as data: one ONNX node of ``op_type`` in ``domain`` (``""``: the default domain; :data:`MS`: an
    onnxruntime contrib op) reading the node's inputs in order, with the ONNX attributes ``attributes(node attrs)``.
    """

    op_type: str
    domain: str = ""
    attributes: Callable[[Attrs], dict[str, Any]] = _no_attributes

    @property
    def kernel(self) -> str:
        """The kernel in words: ``com.microsoft QuickGelu``, ``RotaryEmbedding (opset 23)``."""
        return f"{self.domain} {self.op_type}" if self.domain else self.op_type

    def write(self, b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> ExportResult:
        """Write ``node`` (its inputs' names ``ins`` and types ``types``) through ``b``."""
        return b.op(self.op_type, ins, domain=self.domain, **self.attributes(node.attrs))


@dataclass(frozen=True)
class OnnxWriter:
    """An export as a function ``function(b, node, ins, types)``: it writes ``node`` through ``b`` (its inputs'
    names ``ins``, their types ``types``) and returns the ONNX name of its value (of each result of a multi-result
    op), or None where the kernel does not take this node (the exporter then writes its decomposition).
    ``kernel`` names in words what the ``onnxruntime`` target runs for it (the ONNX op types written appear in it).
    """

    kernel: str
    function: WriteFn

    def write(self, b: ExportBuilder, node: Node, ins: list[str], types: list[TensorType]) -> ExportResult:
        """Write ``node`` through ``b``: ``function``'s result."""
        return self.function(b, node, ins, types)


__all__ = ["MS", "ExportBuilder", "ExportResult", "OnnxExport", "OnnxWriter", "WriteFn"]
