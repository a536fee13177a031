"""rlx-egraph: optimise ML computation graphs by equality saturation."""

from .ir import Graph, GraphError, Node, TensorType
from .kernels.interpreter import evaluate

__all__ = ["Graph", "GraphError", "Node", "TensorType", "evaluate"]
