"""Op declarations; importing this package registers every op."""

from . import fused, host, onnx_op, primitives

__all__ = ["fused", "host", "onnx_op", "primitives"]
