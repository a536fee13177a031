"""Op declarations; importing this package registers every op."""

from . import fused, onnx_op, primitives

__all__ = ["fused", "onnx_op", "primitives"]
