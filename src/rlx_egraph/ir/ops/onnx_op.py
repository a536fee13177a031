"""OnnxOp: an ONNX node with no MIR equivalent, kept in its ONNX definition.

The importer (:mod:`rlx_egraph.frontends.onnx`) turns every standard ONNX op
that MIR cannot express into one OnnxOp node per used output.  Its ``proto``
attribute is a one-node ONNX graph (base64 of a serialized ``GraphProto``):
the node, its inputs ``in0, in1, ...`` (the OnnxOp's own inputs, typed by
canonicalisation from the input types) and its constant inputs as
initializers.  onnx's shape inference gives its type, onnx's reference
evaluator its value; the cost model prices it as one launch (Kind.OPAQUE), no
rule matches into it, and the exporter writes the node back unchanged.
``onnx`` is imported only when such a node is built or run.
"""

from __future__ import annotations

import base64
from functools import lru_cache
from typing import Any

import numpy as np

from ..dims import Dim, parse, symbols_of, to_json
from ..registry import Attrs, AttrSpec, AttrType, Kind, OpSpec, ShapeError, TensorType, register

# MIR dtype -> ONNX TensorProto element type (the values of onnx.TensorProto.DataType).
ONNX_DTYPES: dict[str, int] = {"f32": 1, "f16": 10, "bf16": 16, "i64": 7, "i32": 6, "bool": 9}
MIR_DTYPES: dict[int, str] = {v: k for k, v in ONNX_DTYPES.items()}
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")


def encode_proto(message: Any) -> str:
    """A protobuf message as the text of a ``proto`` attribute."""
    return base64.b64encode(message.SerializeToString(deterministic=True)).decode("ascii")


@lru_cache(maxsize=4096)
def decode_graph(text: str) -> Any:
    """The ``GraphProto`` of a ``proto`` attribute (cached: treat it as read-only)."""
    import onnx

    graph = onnx.GraphProto()
    try:
        graph.ParseFromString(base64.b64decode(text, validate=True))
    except Exception as exc:  # binascii.Error or protobuf DecodeError
        raise ShapeError(f"proto is not a base64 GraphProto: {exc}") from None
    return graph


def node_model(graph: Any, domain: str, opset: int) -> Any:
    """A model around a one-node graph, importing ``domain`` at ``opset`` (and the default domain)."""
    import onnx

    imports = [onnx.helper.make_opsetid("", opset)]
    if domain not in ("", "ai.onnx"):
        imports = [onnx.helper.make_opsetid(domain, opset),
                   onnx.helper.make_opsetid("", onnx.defs.onnx_opset_version())]
    return onnx.helper.make_model(graph, opset_imports=imports)


def _canonical(a: Attrs, ins: list[TensorType]) -> dict[str, Any]:
    """Check the one-node graph against the attributes and type its inputs ``in0, ...`` from ``ins``."""
    import onnx

    graph = onnx.GraphProto()
    graph.CopyFrom(decode_graph(a["proto"]))
    if len(graph.node) != 1:
        raise ShapeError(f"proto must hold exactly one node, it holds {len(graph.node)}")
    node = graph.node[0]
    if (node.op_type, node.domain) != (a["op_type"], a["domain"]):
        raise ShapeError(f"proto holds {node.domain or 'ai.onnx'}.{node.op_type}, the attributes say "
                         f"{a['domain'] or 'ai.onnx'}.{a['op_type']}")
    if not 0 <= a["output"] < len(node.output) or not node.output[a["output"]]:
        raise ShapeError(f"output {a['output']} is not an output of {node.op_type}")
    names = [f"in{k}" for k in range(len(ins))]
    known = set(names) | {t.name for t in graph.initializer} | {""}
    missing = sorted(set(node.input) - known)
    if missing:
        raise ShapeError(f"{node.op_type} reads {missing}, which are neither inputs in0..in{len(ins) - 1} "
                         "nor constants")
    del graph.input[:]
    graph.input.extend(onnx.helper.make_tensor_value_info(n, ONNX_DTYPES[t.dtype], [to_json(d) for d in t.shape])
                       for n, t in zip(names, ins, strict=True))  # a symbolic dim as its dim_param
    return {**a, "proto": encode_proto(graph)}


@lru_cache(maxsize=4096)
def _output_type(proto: str, domain: str, opset: int, output: int) -> TensorType:
    import onnx

    graph = decode_graph(proto)
    node = graph.node[0]
    name = node.output[output]
    model = node_model(graph, domain, opset)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True).graph
    except Exception as exc:  # onnx raises InferenceError, ValidationError, ...
        raise ShapeError(f"onnx shape inference fails on {node.op_type}: {str(exc).strip()}") from None
    info = next((v for v in (*inferred.value_info, *inferred.output)
                 if v.name == name and v.type.HasField("tensor_type")), None)
    tensor = info.type.tensor_type if info is not None else None
    symbols = symbols_of(_read_dim(d.dim_param, None) for v in graph.input for d in v.type.tensor_type.shape.dim)
    dims = tuple(d.dim_value if d.HasField("dim_value") else _read_dim(d.dim_param, symbols)
                 for d in tensor.shape.dim) if tensor is not None and tensor.HasField("shape") else None
    if dims is None or any(isinstance(d, int) and d < 1 for d in dims):
        raise ShapeError(f"onnx shape inference gives no static shape for output {output} of {node.op_type} "
                         f"(got {list(dims) if dims is not None else 'none'})")
    if tensor.elem_type not in MIR_DTYPES:
        raise ShapeError(f"output {output} of {node.op_type} has ONNX element type "
                         f"{onnx.TensorProto.DataType.Name(tensor.elem_type)}, which MIR has no dtype for")
    return TensorType(dims, MIR_DTYPES[tensor.elem_type])


def _read_dim(dim_param: str, symbols: set[str] | None) -> Dim:
    """A dim_param as a symbolic dim over ``symbols`` (any, for None); -1 for a name onnx made up or none."""
    try:
        dim = parse(dim_param)
    except ShapeError:
        return -1
    return dim if symbols is None or symbols_of([dim]) <= symbols else -1


def _infer(a: Attrs, ins: list[TensorType]) -> TensorType:
    return _output_type(a["proto"], a["domain"], a["opset"], a["output"])


@lru_cache(maxsize=1)
def reference_fixes() -> list[type]:
    """onnx reference-evaluator ops replacing onnx's own where those are wrong (pass as ``new_ops``)."""
    from onnx.reference.op_run import OpRun

    class GatherElements(OpRun):
        """onnx's (1.23) goes through np.choose, which takes at most 32 (numpy 1) or 64 (numpy 2) choices, and
        beyond falls back to a wrong gather: a (1, 65) table gathered on axis 1 fails."""

        def _run(self, data: np.ndarray, indices: np.ndarray, axis: int = 0) -> tuple[np.ndarray]:
            indices = np.where(indices < 0, indices + data.shape[axis], indices)
            return (np.take_along_axis(data, indices, axis=axis),)

    return [GatherElements]


# ONNX ops that read indices into another input: op type -> (indices input, data input); the axis is the node's
# "axis" attribute (default 0).  The verifier draws such indices within the data's extent on that axis.
INDEXING_OPS = {"Gather": (1, 0), "GatherElements": (1, 0)}


def index_inputs(a: Attrs) -> tuple[tuple[int, int, int], ...]:
    """(indices input, data input, axis) of an OnnxOp whose node reads indices into another of its inputs, by
    the OnnxOp's input positions (an input held as a constant of the one-node graph is not one)."""
    if a["domain"] not in ("", "ai.onnx") or a["op_type"] not in INDEXING_OPS:
        return ()
    node = decode_graph(a["proto"]).node[0]
    indices, data = (node.input[k] if k < len(node.input) else "" for k in INDEXING_OPS[a["op_type"]])
    axis = next((att.i for att in node.attribute if att.name == "axis"), 0)
    if not all(name.startswith("in") and name[2:].isdigit() for name in (indices, data)):
        return ()
    return ((int(indices[2:]), int(data[2:]), axis),)


def reference_evaluator(model: Any) -> Any:
    """onnx's ``ReferenceEvaluator`` on ``model``, with :func:`reference_fixes`."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model, new_ops=reference_fixes())


@lru_cache(maxsize=256)
def _evaluator(proto: str, domain: str, opset: int) -> Any:
    return reference_evaluator(node_model(decode_graph(proto), domain, opset))


def _kernel(a: Attrs, *xs: np.ndarray) -> np.ndarray:
    """onnx's reference evaluator on the node; inputs are cast back to their ONNX element types."""
    import onnx

    graph = decode_graph(a["proto"])
    feeds = {info.name: np.asarray(x).astype(onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type),
                                             copy=False)
             for info, x in zip(graph.input, xs, strict=True)}
    outputs = _evaluator(a["proto"], a["domain"], a["opset"]).run([graph.node[0].output[a["output"]]], feeds)
    return np.asarray(outputs[0])


ONNX_OP = OpSpec(
    "OnnxOp", Kind.OPAQUE, ("xs*",), _infer, _kernel,
    (AttrSpec("op_type", AttrType.STR), AttrSpec("domain", AttrType.STR, ""), AttrSpec("opset", AttrType.INT),
     AttrSpec("output", AttrType.INT, 0), AttrSpec("proto", AttrType.STR)),
    canonical=_canonical,
    doc="A standard ONNX node MIR has no op for (one output of it), kept as a one-node ONNX graph.")
register(ONNX_OP)

__all__ = ["INDEXING_OPS", "MIR_DTYPES", "ONNX_DTYPES", "ONNX_OP", "STANDARD_DOMAINS", "decode_graph", "encode_proto",
           "index_inputs", "node_model", "reference_evaluator"]
