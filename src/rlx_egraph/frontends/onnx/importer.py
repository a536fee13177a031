"""ONNX -> MIR: :func:`import_model`.

Every ONNX value is either *known* (computable without a graph input: constants,
initializers, shapes, and everything computed from them only, folded with onnx's
reference evaluator for the given input shapes) or *runtime* (a MIR node).  A node
whose inputs are all known is folded; any other node is lowered by its entry in
:data:`rlx_egraph.frontends.onnx.lowering.LOWERINGS`, or, where MIR has no
equivalent, becomes one OnnxOp node per used output.  A known value becomes a MIR
node only where a runtime node reads it: an initializer, or a value folded from
one, is a Param whose value goes to the weight store (``graph.weights``); any
other known value is a Constant; a single-valued one read by an elementwise op is
the canonical ``Scalar`` (see ``Importer.operand``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...ir.dims import Dim, parse
from ...ir.graph import Graph, GraphError
from ...ir.ops.onnx_op import MIR_DTYPES, ONNX_DTYPES, STANDARD_DOMAINS, encode_proto, reference_evaluator
from ...ir.registry import ShapeError, TensorType
from ...ir.shapes import broadcast

# Ops never folded even when every input is known: their value is not a function of their inputs.
_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                         "Bernoulli"})


# The one name of a known causal keep mask, so the rules (rules/onnx_forms.egg) see every exporter's alike.
CAUSAL_MASK = "rlx.causal_mask"


def is_causal_keep(array: np.ndarray) -> bool:
    """``array`` is a bool lower-triangular keep mask [1, ..., S, S] (query i sees keys 0..i)."""
    return (array.dtype == np.bool_ and array.ndim >= 2 and array.shape[-1] == array.shape[-2]
            and all(d == 1 for d in array.shape[:-2])
            and np.array_equal(array.reshape(array.shape[-2:]), np.tri(array.shape[-1], dtype=bool)))


def causal_fill(array: np.ndarray) -> float | None:
    """The fill of an additive causal mask (0 on and below the diagonal, one value <= -1e4 above), else None."""
    if array.dtype.kind != "f" or not is_causal_keep(np.zeros(array.shape, bool) | (array == 0)):
        return None
    above = array.reshape(array.shape[-2:])[~np.tri(array.shape[-1], dtype=bool)]
    if not above.size or not np.all(above == above[0]) or not above[0] <= -1e4:
        return None
    return float(above[0])


class OnnxImportError(GraphError):
    """The model cannot be imported; the message names the node, input or op types at fault.

    When static input shapes would get the import past the error, ``reason`` is the message without its hint
    (``input_shapes=``, in Python's terms) and ``unbound`` names the inputs to give static shapes, each with its
    dims as the model writes them (a symbol's name, a number, ``?`` for an unnamed dim)."""

    def __init__(self, reason: str, hint: str = "", unbound: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(f"{reason}; {hint}" if hint else reason)
        self.reason = reason
        self.unbound = {name: tuple(dims) for name, dims in (unbound or {}).items()}

    def command_line_message(self) -> str:
        """The message with its hint in the command line's terms (``--input-shape NAME=D1,D2,...``)."""
        if not self.unbound:
            return str(self)
        flags = " ".join(f"--input-shape {name}={','.join(dims)}" for name, dims in self.unbound.items())
        return f"{self.reason}; give static shapes: {flags} (each dim a number)"


@dataclass
class Value:
    """One ONNX value: a MIR node id (runtime), or a known array (``weight``: an initializer or folded from one)."""

    node: int | None = None
    array: np.ndarray | None = None
    weight: bool = False

    @property
    def known(self) -> bool:
        return self.array is not None


def node_label(node: onnx.NodeProto, index: int) -> str:
    """How errors name an ONNX node: its name, else its position."""
    return f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node #{index}"


def mir_dtype(elem_type: int, what: str) -> str:
    if elem_type not in MIR_DTYPES:
        raise OnnxImportError(f"{what} has ONNX element type {onnx.TensorProto.DataType.Name(elem_type)}, "
                              f"which MIR has no dtype for ({', '.join(ONNX_DTYPES)})")
    return MIR_DTYPES[elem_type]


def _load(model: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)  # the caller's model is never changed
    else:
        try:
            proto = onnx.load(str(model))
        except Exception as exc:  # onnx raises DecodeError, OSError, ...
            raise OnnxImportError(f"{model}: not a readable ONNX model: {exc}") from None
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    return proto


def check_domains(graph: onnx.GraphProto) -> None:
    """Refuse, in one error, every op outside the standard ONNX domains or unknown to onnx."""
    bad: dict[str, str] = {}
    for k, node in enumerate(graph.node):
        domain = node.domain
        if domain not in STANDARD_DOMAINS or not onnx.defs.has(node.op_type, domain):
            bad.setdefault(f"{domain or 'ai.onnx'}.{node.op_type}", node.name or f"#{k}")
    if bad:
        listing = ", ".join(f"{op} (node {name!r})" for op, name in sorted(bad.items()))
        raise OnnxImportError(f"the model uses {len(bad)} op type(s) outside the standard ONNX domains, so nothing "
                              f"was imported: {listing}")


def bind_inputs(graph: onnx.GraphProto, input_shapes: Mapping[str, Sequence[int]],
                skip: set[str]) -> tuple[dict[str, tuple[Dim, ...]], dict[str, list[str | None]]]:
    """Shapes of the graph inputs (not ``skip``) and their symbolic dim names.

    A symbolic dim is bound by ``input_shapes`` for its input or, by name, for another input; an
    unbound one stays symbolic (its ``dim_param`` read by :func:`~rlx_egraph.ir.dims.parse`).
    """
    unknown = sorted(set(input_shapes) - {i.name for i in graph.input})
    if unknown:
        raise OnnxImportError(f"input_shapes names {unknown}, which are not inputs of the model")
    names: dict[str, list[str | None]] = {}
    bound: dict[str, int] = {}
    for info in graph.input:
        if info.name in skip:
            continue
        dims = info.type.tensor_type.shape.dim
        names[info.name] = [d.dim_param or None for d in dims]
        given = input_shapes.get(info.name)
        if given is None:
            continue
        given = tuple(int(d) for d in given)
        if len(given) != len(dims):
            raise OnnxImportError(f"input {info.name!r}: input_shapes gives rank {len(given)} {list(given)}, the "
                                  f"model's input has rank {len(dims)}")
        for axis, (d, value) in enumerate(zip(dims, given, strict=True)):
            if d.HasField("dim_value") and d.dim_value != value:
                raise OnnxImportError(f"input {info.name!r}: dimension {axis} is fixed to {d.dim_value} in the "
                                      f"model, input_shapes gives {value}")
            if d.dim_param and bound.setdefault(d.dim_param, value) != value:
                raise OnnxImportError(f"input {info.name!r}: dimension {axis} {d.dim_param!r} is bound to "
                                      f"{value} here and to {bound[d.dim_param]} by another input")
    shapes: dict[str, tuple[int, ...]] = {}
    for info in graph.input:
        if info.name in skip:
            continue
        given = input_shapes.get(info.name)
        dims = []
        for axis, d in enumerate(info.type.tensor_type.shape.dim):
            if given is not None:
                dims.append(int(given[axis]))
            elif d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.dim_param in bound:
                dims.append(bound[d.dim_param])
            elif d.dim_param:
                dims.append(_symbolic_dim(info, axis, d.dim_param))
            else:
                label = f"{d.dim_param!r}" if d.dim_param else "(unnamed)"
                raise OnnxImportError(f"input {info.name!r}: dimension {axis} {label} has no binding",
                                      f"pass input_shapes={{{info.name!r}: (...)}} or bind {label} through "
                                      "another input", {info.name: _dim_names(info)})
        if any(isinstance(d, int) and d < 1 for d in dims):
            raise OnnxImportError(f"input {info.name!r}: shape {dims} must hold positive dimensions")
        shapes[info.name] = tuple(dims)
    return shapes, names


def _symbolic_dim(info: onnx.ValueInfoProto, axis: int, dim_param: str) -> Dim:
    """The symbolic dim an unbound ``dim_param`` stands for; OnnxImportError when it is not one."""
    try:
        dim = parse(dim_param)
    except ShapeError as exc:
        dim, why = None, str(exc)
    else:
        why = "it is a number"
    if dim is None or isinstance(dim, int):
        raise OnnxImportError(f"input {info.name!r}: dimension {axis} {dim_param!r} is not a symbolic dim ({why})",
                              f"pass input_shapes={{{info.name!r}: (...)}}", {info.name: _dim_names(info)})
    return dim


def _dim_names(info: onnx.ValueInfoProto) -> tuple[str, ...]:
    """An input's dims as the model writes them: a number, a symbol's name, ``?`` where it has neither (or the
    name holds a space, which would split a command line)."""
    return tuple(str(d.dim_value) if d.HasField("dim_value") else "?" if not d.dim_param or " " in d.dim_param
                 else d.dim_param for d in info.type.tensor_type.shape.dim)


class Importer:
    """The state of one import: the MIR graph being built and every ONNX value seen so far."""

    def __init__(self, model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> None:
        self.model = model
        self.onnx_graph = model.graph
        self.opsets = {(o.domain or ""): o.version for o in model.opset_import}
        self.opsets.setdefault("ai.onnx", self.opsets.get("", 1))
        self.graph = Graph(model.graph.name or "onnx")
        self.values: dict[str, Value] = {}
        self.materialized: dict[str, int] = {}
        self.label = "graph"
        initializers = {t.name: t for t in model.graph.initializer}
        shapes, dim_names = bind_inputs(model.graph, input_shapes, set(initializers))
        for name, tensor in initializers.items():
            self.values[name] = Value(array=numpy_helper.to_array(tensor), weight=True)
        for info in model.graph.input:
            if info.name in initializers:
                continue
            dt = mir_dtype(info.type.tensor_type.elem_type, f"input {info.name!r}")
            self.values[info.name] = Value(node=self.graph.input(info.name, shapes[info.name], dt))
        self.graph.meta = {"dim_names": dim_names, "output_names": [o.name for o in model.graph.output],
                           "opset": self.opsets[""]}

    @property
    def opset(self) -> int:
        """The default domain's opset version."""
        return self.opsets[""]

    # --- values ----------------------------------------------------------------------

    def value(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise OnnxImportError(f"{self.label}: reads {name!r}, which no earlier node, input or initializer "
                                  "defines") from None

    def known(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is known (an empty name is an absent optional input: None)."""
        return self.value(name).array if name else None

    def type(self, name: str) -> TensorType:
        v = self.value(name)
        if v.known:
            return TensorType(tuple(int(d) for d in v.array.shape), self.array_dtype(v.array, name))
        return self.graph.node(v.node).type

    def array_dtype(self, array: np.ndarray, name: str) -> str:
        return mir_dtype(helper.np_dtype_to_tensor_dtype(array.dtype), f"{self.label}: value {name!r}")

    def tensor(self, name: str) -> int:
        """The MIR node of ``name``, made on first use for a known value (Param, Scalar or Constant)."""
        v = self.value(name)
        if not v.known:
            return v.node
        from .symbolic import check_output

        check_output(self, name)  # a graph output computed from symbolic dims only
        if name not in self.materialized:  # a causal keep mask is the Param CAUSAL_MASK, whatever its name
            dt = self.array_dtype(v.array, name)
            if v.array.ndim == 0 and np.isfinite(v.array):
                nid = self.graph.scalar(v.array.item(), dt)
            elif is_causal_keep(v.array) and self.graph.weights.get(CAUSAL_MASK, v.array).shape == v.array.shape:
                nid = self.graph.param(CAUSAL_MASK, v.array.shape, dt)
                self.graph.weights[CAUSAL_MASK] = v.array
            elif v.weight:
                nid = self.graph.param(name, v.array.shape, dt)
                self.graph.weights[name] = v.array
            else:
                nid = self.graph.add_node("Constant", value=v.array, dtype=dt)
            self.materialized[name] = nid
        return self.materialized[name]

    def operand(self, name: str, others: Sequence[tuple[int, ...]]) -> int:
        """``name`` as an operand of a broadcasting elementwise op whose other operands have shapes ``others``.

        A known value holding one repeated finite number (one element, for an initializer) is the
        canonical ``Scalar`` when leaving it out does not change the result's shape.
        """
        v = self.value(name)
        if v.known and v.array.size and (v.array.size == 1 or not v.weight):
            flat = v.array.reshape(-1)
            drops = not others or broadcast(*others) == broadcast(*others, v.array.shape)
            if drops and np.all(flat == flat[0]) and np.isfinite(flat[0]):
                return self.graph.scalar(flat[0].item(), self.array_dtype(v.array, name))
        return self.tensor(name)

    def fit(self, nid: int, shape: tuple[int, ...]) -> int:
        """``nid`` reshaped or broadcast to ``shape`` (where scalar canonicalisation dropped dims)."""
        have = self.graph.node(nid).shape
        if have == shape:
            return nid
        if math.prod(have) == math.prod(shape):
            return self.graph.reshape(nid, shape=shape)
        return self.graph.expand(nid, shape=shape)

    # --- the walk -------------------------------------------------------------------

    def run(self) -> Graph:
        from .lowering import LOWERINGS
        from .symbolic import check_lowering, lowers, refuse_shape_error

        graph = self.onnx_graph
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        for index, node in enumerate(graph.node):
            self.label = node_label(node, index)
            ins = list(node.input)
            if all(not n or self.value(n).known for n in ins) and node.op_type not in _NOT_FOLDED \
                    and not lowers(self, node):
                outputs = self.fold(node, ins)
            else:
                check_lowering(self, node)
                lower = LOWERINGS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
                try:
                    outputs = lower(self, node, attributes(node)) if lower is not None else None
                except GraphError as exc:
                    raise OnnxImportError(f"{self.label}: {exc}") from None
                except ShapeError as exc:  # a symbolic dim that a lowering cannot decide on
                    raise refuse_shape_error(self, exc) from None
                outputs = list(outputs or [])
                outputs += [None] * (len(node.output) - len(outputs))
                for k, name in enumerate(node.output):
                    if name and name in used and outputs[k] is None:
                        outputs[k] = Value(node=self.opaque(node, k))
            for name, value in zip(node.output, outputs, strict=True):
                if name and value is not None:
                    self.values[name] = value
        self.label = "graph"
        self.graph.set_outputs([self.tensor(o.name) for o in graph.output])
        return self.graph

    def fold(self, node: onnx.NodeProto, ins: list[str]) -> list[Value]:
        """Run a node whose inputs are all known with onnx's reference evaluator (a tensor Constant is read)."""
        from .symbolic import fold_symbolic, is_symbolic

        if any(is_symbolic(self.values[n].array) for n in ins if n):
            return fold_symbolic(self, node, ins, attributes(node))
        if node.op_type == "Constant" and [a.name for a in node.attribute] == ["value"]:
            return [Value(array=numpy_helper.to_array(node.attribute[0].t))]
        arrays = {n: self.values[n].array for n in dict.fromkeys(ins) if n}
        weight = any(self.values[n].weight for n in arrays)
        named = iter(self.evaluate(node, arrays))
        return [Value(array=np.asarray(next(named)), weight=weight) if o else None for o in node.output]

    def evaluate(self, node: onnx.NodeProto, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The used outputs of ``node`` run by onnx's reference evaluator on ``arrays`` (one per input name)."""
        sub = helper.make_graph([node], "fold", [], [helper.make_value_info(o, onnx.TypeProto()) for o in node.output
                                                     if o], [numpy_helper.from_array(a, n) for n, a in arrays.items()])
        try:
            model = helper.make_model(sub, opset_imports=self.model.opset_import)
            with np.errstate(all="ignore"):  # as onnxruntime: log(0) is -inf, a branch Where discards (T5)
                return reference_evaluator(model).run(None, {})
        except Exception as exc:  # the reference evaluator raises many types
            raise OnnxImportError(f"{self.label}: folding it for the given input shapes fails: {exc}") from None

    def opaque(self, node: onnx.NodeProto, output: int) -> int:
        """An OnnxOp node for output ``output`` of ``node``: runtime inputs (and weights) become its inputs
        ``in0, ...``, other known inputs initializers of its one-node graph."""
        from .symbolic import check_opaque

        check_opaque(self, node)
        inputs: list[int] = []
        renamed: dict[str, str] = {"": ""}
        constants = []
        for name in node.input:
            if name in renamed:
                continue
            v = self.value(name)
            if v.known and not (v.weight and v.array.size > 1):
                renamed[name] = f"c{len(constants)}"
                constants.append(numpy_helper.from_array(v.array, renamed[name]))
            else:
                renamed[name] = f"in{len(inputs)}"
                inputs.append(self.tensor(name))
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = node.name
        del copy.input[:]
        copy.input.extend(renamed[n] for n in node.input)
        del copy.output[:]
        copy.output.extend(f"out{k}" if o else "" for k, o in enumerate(node.output))
        sub = helper.make_graph([copy], node.op_type, [], [], constants)
        domain = "" if node.domain == "ai.onnx" else node.domain
        if not inputs:
            raise OnnxImportError(f"{self.label}: an op with no runtime input cannot be kept opaque")
        try:
            return self.graph.add_node("OnnxOp", inputs, op_type=node.op_type, domain=domain,
                                       opset=self.opsets.get(domain or "", self.opset), output=output,
                                       proto=encode_proto(sub))
        except GraphError as exc:
            raise OnnxImportError(f"{self.label}: {exc}") from None


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes as Python values (strings decoded)."""
    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def import_model(model: str | Path | onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Import an ONNX model (a path or a ``ModelProto``, which is not changed) as a MIR :class:`Graph`.

    ``input_shapes`` maps input names to static shapes and binds the model's symbolic dims (a dim
    name bound for one input binds it for every input); a ``dim_param`` left unbound stays a symbolic
    dim (see :mod:`.symbolic`).  Shape computations and constant subgraphs are folded for these shapes.
    The graph carries the initializers in ``graph.weights`` and, in ``graph.meta``, the inputs'
    symbolic dim names (``"dim_names"``), the output names (``"output_names"``) and the default
    domain's opset (``"opset"``).  Raises :class:`OnnxImportError` naming the node, input or op types
    at fault.
    """
    proto = _load(model)
    check_domains(proto.graph)
    return Importer(proto, input_shapes or {}).run()


__all__ = ["Importer", "OnnxImportError", "Value", "attributes", "import_model"]
