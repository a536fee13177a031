"""rlx-egraph: optimise ML computation graphs by equality saturation."""

from importlib.metadata import PackageNotFoundError, version

from . import examples, log  # noqa: F401  (log: egglog's loggers set to WARNING before anything runs egglog)
from ._accelerators import accelerated  # before the engine: RLX_EGRAPH_PURE=1 selects the pure-Python path
from .compile import compile, specialize
from .cost.targets import UnsupportedOp
from .engines.egglog import RuleError, RuleSet, dump_egglog_program
from .engines.egglog.soundness import check as check_rules
from .engines.egglog.view import UnsoundRewrite
from .errors import RlxError
from .frontends.onnx.errors import OnnxImportError  # noqa: F401  (a GraphError; needs no onnx installed)
from .ir import Graph, GraphError, Node, ShapeError, TensorType
from .kernels.interpreter import evaluate
from .kernels.parity import ParityError
from .optimize import optimize, optimize_with_report
from .options import Options

try:
    __version__ = version("rlx-egraph")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["Graph", "GraphError", "Node", "Options", "ParityError", "RlxError", "RuleError", "RuleSet", "ShapeError",
           "TensorType", "UnsoundRewrite", "UnsupportedOp", "__version__", "accelerated", "check_rules", "compile",
           "dump_egglog_program", "evaluate", "examples", "optimize", "optimize_with_report", "specialize"]
