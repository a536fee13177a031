"""``rlx_egraph.onnx``: import ONNX models as MIR graphs and export MIR graphs for onnxruntime.

Needs the ``onnx`` extra (``pip install 'rlx-egraph[onnx]'``).
"""

from .frontends.onnx.calibrate import calibrate
from .frontends.onnx.exporter import check_weights, export_model
from .frontends.onnx.importer import OnnxImportError, import_model
from .frontends.onnx.latency import Latency, measure_latencies, measure_latency, measure_report
from .frontends.onnx.rules import onnx_rules

__all__ = ["Latency", "OnnxImportError", "calibrate", "check_weights", "export_model", "import_model",
           "measure_latencies", "measure_latency", "measure_report", "onnx_rules"]
