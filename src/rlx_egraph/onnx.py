"""``rlx_egraph.onnx``: import ONNX models as MIR graphs and export MIR graphs for onnxruntime.

Needs the ``onnx`` extra (``pip install 'rlx-egraph[onnx]'``); without it, importing this module raises
:class:`MissingExtra` (an ``ImportError``) saying so.
"""

from .errors import RlxError


class MissingExtra(RlxError, ImportError):
    """An optional dependency of the feature asked for is not installed; the message says which extra to install."""


try:
    import onnx  # noqa: F401
except ModuleNotFoundError as exc:
    raise MissingExtra("ONNX support needs the onnx extra: pip install 'rlx-egraph[onnx]'") from exc

from .frontends.onnx.calibrate import calibrate  # noqa: E402
from .frontends.onnx.exporter import check_weights, export_model, save_model, save_ort_optimized  # noqa: E402
from .frontends.onnx.importer import FoldLimits, OnnxImportError, import_model  # noqa: E402
from .frontends.onnx.latency import Latency, measure_latencies, measure_latency, measure_report  # noqa: E402
from .frontends.onnx.pricing import ExportPrice, price_export  # noqa: E402
from .frontends.onnx.rules import onnx_rules  # noqa: E402

__all__ = ["ExportPrice", "FoldLimits", "Latency", "MissingExtra", "OnnxImportError", "calibrate", "check_weights",
           "export_model", "import_model", "measure_latencies", "measure_latency", "measure_report", "onnx_rules",
           "price_export", "save_model", "save_ort_optimized"]
