"""The ONNX front door's error, importable without onnx installed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...ir.graph import GraphError


class OnnxImportError(GraphError):
    """The model cannot be imported; the message names the node, input or op types at fault.

    When a binding of the inputs' dims would get the import past the error, ``reason`` is the message without its
    hint (``input_shapes=``, in Python's terms) and ``unbound`` names the inputs to bind, each with its dims as the
    model writes them (a symbol's name, a number, ``?`` for an unnamed dim)."""

    def __init__(self, reason: str, hint: str = "", unbound: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(f"{reason}; {hint}" if hint else reason)
        self.reason = reason
        self.unbound = {name: tuple(dims) for name, dims in (unbound or {}).items()}

    def command_line_message(self) -> str:
        """The message with its hint in the command line's terms (``--input-shape NAME=D1,D2,...``)."""
        if not self.unbound:
            return str(self)
        flags = " ".join(f"--input-shape {name}={','.join(dims) or '...'}" for name, dims in self.unbound.items())
        return f"{self.reason}; give static shapes: {flags} (each dim a number)"


__all__ = ["OnnxImportError"]
