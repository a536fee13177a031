"""The MIR graph IR and the op registry."""

from .dtypes import DTYPES, PARITY_TOLERANCE
from .graph import Graph, GraphError, Node
from .registry import REGISTRY, AttrSpec, AttrType, Kind, OpSpec, ShapeError, TensorType, op_spec, register

__all__ = ["DTYPES", "PARITY_TOLERANCE", "REGISTRY", "AttrSpec", "AttrType", "Graph", "GraphError", "Kind", "Node",
           "OpSpec", "ShapeError", "TensorType", "op_spec", "register"]
