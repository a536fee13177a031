"""ONNX in and out: :func:`import_model` (ONNX -> MIR) and :func:`export_model` (MIR -> ONNX for onnxruntime)."""

from .exporter import export_model
from .importer import OnnxImportError, import_model

__all__ = ["OnnxImportError", "export_model", "import_model"]
