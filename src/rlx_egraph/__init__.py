"""rlx-egraph: optimise ML computation graphs by equality saturation."""

from . import examples
from .ir import Graph, GraphError, Node, TensorType
from .egraph import dump_egglog_program
from .kernels.interpreter import evaluate
from .optimize import optimize, optimize_with_report

__all__ = ["Graph", "GraphError", "Node", "TensorType", "dump_egglog_program", "evaluate", "optimize", "optimize_with_report", "examples"]
