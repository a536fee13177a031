"""ONNX in and out: ``importer.import_model`` (ONNX -> MIR), ``exporter.export_model`` (MIR -> ONNX for
onnxruntime), their op tables ``lowering`` and ``export_table``, and ``measure_target``.  Use them through
:mod:`rlx_egraph.onnx`; this package imports nothing itself, so the cost target can read ``export_table``
without onnx installed."""
