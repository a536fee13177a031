"""Op declarations; importing this package registers every op."""

from . import activations, conv, dims_data, fused, host, onnx_op, primitives

__all__ = ["activations", "conv", "dims_data", "fused", "host", "onnx_op", "primitives"]
