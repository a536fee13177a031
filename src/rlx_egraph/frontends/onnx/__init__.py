"""ONNX in and out: ``importer.import_model`` (ONNX -> MIR), ``exporter.export_model`` (MIR -> ONNX for
onnxruntime), their op tables ``lowering`` and ``export_table``, ``calibrate`` (the ``onnxruntime`` cost
target's figures, measured) and ``latency`` (a graph's latency in onnxruntime).  Use them through
:mod:`rlx_egraph.onnx`."""
