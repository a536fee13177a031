"""OnnxOp: an ONNX node with no MIR equivalent, kept in its ONNX definition.

The importer (:mod:`rlx_egraph.frontends.onnx`) turns every standard ONNX op
that MIR cannot express into one OnnxOp node: of its one used output
(``output``), or, where two or more are used (TopK's values and indices), of all
of them (``output`` -1: a multi-result node, each output read through ``Get``),
so the node runs once.  Its ``proto``
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

from ..dims import Dim, Sym, parse, symbol, symbols_of, to_json
from ..registry import Attrs, AttrSpec, AttrType, Kind, OpSpec, ShapeError, TensorType, TupleType, register

# MIR dtype -> ONNX TensorProto element type (the values of onnx.TensorProto.DataType).
ONNX_DTYPES: dict[str, int] = {"f32": 1, "f16": 10, "bf16": 16, "i64": 7, "i32": 6, "bool": 9}
MIR_DTYPES: dict[int, str] = {v: k for k, v in ONNX_DTYPES.items()}
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")
ALL_OUTPUTS = -1  # the ``output`` of an OnnxOp that stands for every output of its node (a multi-result node)


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


def _defined(graph: Any) -> set[str]:
    """Names a (sub)graph defines itself: its inputs, initializers and node outputs."""
    return ({i.name for i in graph.input} | {t.name for t in graph.initializer}
            | {o for n in graph.node for o in n.output if o})


def outer_reads(node: Any) -> list[str]:
    """The values of the enclosing graph that ``node``'s subgraphs (If branches, Loop and Scan bodies) read, in
    order of first use."""
    out: dict[str, None] = {}

    def visit(graph: Any, inner: set[str]) -> None:
        here = inner | _defined(graph)
        for n in graph.node:
            for name in n.input:
                if name and name not in here:
                    out.setdefault(name)
            for sub in _subgraphs(n):
                visit(sub, here)
        for o in graph.output:
            if o.name not in here:
                out.setdefault(o.name)

    for sub in _subgraphs(node):
        visit(sub, set())
    return list(out)


def _subgraphs(node: Any) -> list[Any]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def rename_node(node: Any, names: dict[str, str]) -> Any:
    """A copy of ``node`` whose inputs, and the enclosing-graph values its subgraphs read, are renamed by
    ``names`` (names it does not hold are kept)."""
    import onnx

    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for slot, name in enumerate(copy.input):
        copy.input[slot] = names.get(name, name)

    def visit(graph: Any, inner: set[str]) -> None:
        here = inner | _defined(graph)
        for n in graph.node:
            for slot, name in enumerate(n.input):
                if name and name not in here and name in names:
                    n.input[slot] = names[name]
            for sub in _subgraphs(n):
                visit(sub, here)
        for o in graph.output:
            if o.name not in here and o.name in names:
                o.name = names[o.name]

    for sub in _subgraphs(copy):
        visit(sub, set())
    return copy


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
    if a["output"] == ALL_OUTPUTS:
        if len(node.output) < 2 or not all(node.output):
            raise ShapeError(f"output -1 (all outputs) needs two or more outputs, all named; {node.op_type} has "
                             f"{list(node.output)}")
    elif not 0 <= a["output"] < len(node.output) or not node.output[a["output"]]:
        raise ShapeError(f"output {a['output']} is not an output of {node.op_type}")
    names = [f"in{k}" for k in range(len(ins))]
    known = set(names) | {t.name for t in graph.initializer} | {""}
    missing = sorted((set(node.input) | set(outer_reads(node))) - known)
    if missing:
        raise ShapeError(f"{node.op_type} reads {missing}, which are neither inputs in0..in{len(ins) - 1} "
                         "nor constants")
    del graph.input[:]
    graph.input.extend(onnx.helper.make_tensor_value_info(n, ONNX_DTYPES[t.dtype], [to_json(d) for d in t.shape])
                       for n, t in zip(names, ins, strict=True))  # a symbolic dim as its dim_param
    return {**a, "proto": encode_proto(graph)}


@lru_cache(maxsize=4096)
def _output_type(proto: str, domain: str, opset: int, output: int) -> TensorType:
    """The type onnx's shape inference gives output ``output``; where it leaves a dim unknown because the inputs'
    dims are symbolic (it does no arithmetic on dim_params: Tile by 2 of ``batch``), the dims inferred with the
    symbols at two sets of distinct primes, each read back as a monomial of the symbols, when both agree."""
    import onnx

    graph = decode_graph(proto)
    node = graph.node[0]
    symbols = symbols_of(_read_dim(d.dim_param, None) for v in graph.input for d in v.type.tensor_type.shape.dim)
    tensor = _inferred(graph, domain, opset, output)
    dims = tuple(d.dim_value if d.HasField("dim_value") else _read_dim(d.dim_param, symbols)
                 for d in tensor.shape.dim) if tensor is not None and tensor.HasField("shape") else None
    if dims is not None and symbols and any(isinstance(d, int) and d < 0 for d in dims):
        dims = _dims_at_primes(graph, domain, opset, output, sorted(symbols)) or dims
    if dims is None or any(isinstance(d, int) and d < 0 for d in dims):  # -1: a dim onnx leaves unknown
        raise ShapeError(f"onnx shape inference gives no static shape for output {output} of {node.op_type} "
                         f"(got {list(dims) if dims is not None else 'none'})")
    if tensor.elem_type not in MIR_DTYPES:
        raise ShapeError(f"output {output} of {node.op_type} has ONNX element type "
                         f"{onnx.TensorProto.DataType.Name(tensor.elem_type)}, which MIR has no dtype for")
    return TensorType(dims, MIR_DTYPES[tensor.elem_type])


def _inferred(graph: Any, domain: str, opset: int, output: int) -> Any:
    """The TensorTypeProto onnx's shape inference gives output ``output`` of a one-node graph (None: none)."""
    import onnx

    node = graph.node[0]
    try:
        inferred = onnx.shape_inference.infer_shapes(node_model(graph, domain, opset), strict_mode=True,
                                                     data_prop=True).graph
    except Exception as exc:  # onnx raises InferenceError, ValidationError, ...
        raise ShapeError(f"onnx shape inference fails on {node.op_type}: {str(exc).strip()}") from None
    info = next((v for v in (*inferred.value_info, *inferred.output)
                 if v.name == node.output[output] and v.type.HasField("tensor_type")), None)
    return info.type.tensor_type if info is not None else None


_PRIME_SETS = ((10007, 10009, 10037, 10039), (10061, 10067, 10069, 10079))  # two windows of primes, 4 symbols each


def _dims_at_primes(graph: Any, domain: str, opset: int, output: int, symbols: list[str]) -> tuple[Dim, ...] | None:
    """Output ``output``'s dims with the inputs' symbols bound to each set of :data:`_PRIME_SETS`, each dim read
    back as an int times a product of symbols; None unless both bindings give every dim and read back alike."""
    import onnx

    if len(symbols) > len(_PRIME_SETS[0]):
        return None
    found = []
    for primes in _PRIME_SETS:
        binding = dict(zip(symbols, primes, strict=False))
        static = onnx.GraphProto()
        static.CopyFrom(graph)
        for info in static.input:
            for d in info.type.tensor_type.shape.dim:
                if d.dim_param:
                    value = _read_dim(d.dim_param, None)
                    d.dim_value = value.evaluate(binding) if isinstance(value, Sym) else value
        tensor = _inferred(static, domain, opset, output)
        if tensor is None or not tensor.HasField("shape") or any(not d.HasField("dim_value") for d in tensor.shape.dim):
            return None
        found.append(tuple(_monomial(d.dim_value, binding) for d in tensor.shape.dim))
    return found[0] if found[0] == found[1] else None


def _monomial(value: int, binding: dict[str, int]) -> Dim:
    """``value`` as an int times the product of the symbols whose primes divide it."""
    dim: Dim = 1
    for name, prime in binding.items():
        while value and value % prime == 0:
            value //= prime
            dim = dim * symbol(name)
    return value * dim


def _read_dim(dim_param: str, symbols: set[str] | None) -> Dim:
    """A dim_param as a symbolic dim over ``symbols`` (any, for None); -1 for a name onnx made up or none."""
    try:
        dim = parse(dim_param)
    except ShapeError:
        return -1
    return dim if symbols is None or symbols_of([dim]) <= symbols else -1


def _infer(a: Attrs, ins: list[TensorType]) -> TensorType | TupleType:
    if a["output"] == ALL_OUTPUTS:
        outputs = range(len(decode_graph(a["proto"]).node[0].output))
        return TupleType(tuple(_output_type(a["proto"], a["domain"], a["opset"], k) for k in outputs))
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


def _kernel(a: Attrs, *xs: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
    """onnx's reference evaluator on the node (every output, for ``output`` -1); inputs are cast back to their ONNX
    element types."""
    import onnx

    graph = decode_graph(a["proto"])
    feeds = {info.name: np.asarray(x).astype(onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type),
                                             copy=False)
             for info, x in zip(graph.input, xs, strict=True)}
    names = list(graph.node[0].output) if a["output"] == ALL_OUTPUTS else [graph.node[0].output[a["output"]]]
    outputs = [np.asarray(o) for o in _evaluator(a["proto"], a["domain"], a["opset"]).run(names, feeds)]
    return tuple(outputs) if a["output"] == ALL_OUTPUTS else outputs[0]


ONNX_OP = OpSpec(
    "OnnxOp", Kind.OPAQUE, ("xs*",), _infer, _kernel,
    (AttrSpec("op_type", AttrType.STR), AttrSpec("domain", AttrType.STR, ""), AttrSpec("opset", AttrType.INT),
     AttrSpec("output", AttrType.INT, 0), AttrSpec("proto", AttrType.STR)),
    canonical=_canonical, results=("outputs*",),
    doc="A standard ONNX node MIR has no op for (one output of it, or all of them for output -1), kept as a "
        "one-node ONNX graph.")
register(ONNX_OP)

__all__ = ["ALL_OUTPUTS", "INDEXING_OPS", "MIR_DTYPES", "ONNX_DTYPES", "ONNX_OP", "STANDARD_DOMAINS", "decode_graph",
           "encode_proto", "index_inputs", "node_model", "outer_reads", "reference_evaluator", "rename_node"]
