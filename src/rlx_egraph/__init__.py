"""rlx-egraph: optimise ML computation graphs by equality saturation."""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from . import examples, log  # noqa: F401  (log: egglog's loggers set to WARNING before anything runs egglog)
from ._accelerators import accelerated  # before the engine: RLX_EGRAPH_PURE=1 selects the pure-Python path
from .compile import compile, specialize
from .cost.targets import UnsupportedOp
from .egraph import RuleError, RuleSet, dump_egglog_program
from .egraph.view import UnsoundRewrite
from .errors import RlxError
from .ir import Graph, GraphError, Node, ShapeError, TensorType
from .kernels.interpreter import evaluate
from .kernels.parity import ParityError
from .optimize import optimize, optimize_with_report

try:
    __version__ = version("rlx-egraph")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    """``OnnxImportError`` (a GraphError) is imported on first use from the ONNX front end (so it is not in
    ``__all__``); it needs no ``onnx`` installed."""
    if name == "OnnxImportError":
        from .frontends.onnx.errors import OnnxImportError

        return OnnxImportError
    raise AttributeError(f"module 'rlx_egraph' has no attribute {name!r}")


__all__ = ["Graph", "GraphError", "Node", "ParityError", "RlxError", "RuleError", "RuleSet", "ShapeError", "TensorType",
           "UnsoundRewrite", "UnsupportedOp", "__version__", "accelerated", "compile", "dump_egglog_program",
           "evaluate", "examples", "optimize", "optimize_with_report", "specialize"]
