"""rlx-egraph: optimise ML computation graphs by equality saturation."""

from . import examples
from .compile import compile, specialize
from .egraph import dump_egglog_program
from .ir import Graph, GraphError, Node, TensorType
from .kernels.interpreter import evaluate
from .optimize import optimize, optimize_with_report

__all__ = ["Graph", "GraphError", "Node", "TensorType", "compile", "dump_egglog_program", "evaluate", "examples",
           "optimize", "optimize_with_report", "specialize"]
