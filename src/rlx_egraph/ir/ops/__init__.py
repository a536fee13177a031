"""Op declarations; importing this package registers every op."""

from . import conv, dims_data, fused, host, onnx_op, primitives

__all__ = ["conv", "dims_data", "fused", "host", "onnx_op", "primitives"]
