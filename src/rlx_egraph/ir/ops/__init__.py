"""Op declarations; importing this package registers every op."""

from . import dims_data, fused, host, onnx_op, primitives

__all__ = ["dims_data", "fused", "host", "onnx_op", "primitives"]
