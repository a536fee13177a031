"""Op declarations; importing this package registers every op.

The primitives, and one module per family of fused ops (matmul epilogues, norms, activations, attention, decoding,
embeddings, convolutions, regions): each op is declared once there, with its spec, kernel, decomposition (the
subgraph its rule recognises), cost class and ONNX export, and the registry, interpreter, exporter, cost model,
builder stubs and fusion catalogue read those declarations.
"""

from . import (
    activations,
    attention,
    conv,
    decode,
    dims_data,
    embedding,
    host,
    matmul,
    norms,
    onnx_op,
    primitives,
    regions,
)

__all__ = ["activations", "attention", "conv", "decode", "dims_data", "embedding", "host", "matmul", "norms",
           "onnx_op", "primitives", "regions"]
