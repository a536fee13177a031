"""MIR -> ONNX: :func:`export_model`, a model onnxruntime's CPU provider runs.

Each node is written by its entry in :data:`~.export_table.EXPORTS` (standard
ONNX, or a com.microsoft contrib op of the same meaning), else as its unfused
form (the op spec's ``decompose``, or :data:`~.export_table.MIR_FORMS`), node
by node.  Parameters become initializers from the weight store, derived
weights (ConcatParams) initializers computed from it, OnnxOp nodes their
original ONNX node.  Inputs keep their names; outputs take the names of the
imported model (``graph.meta["output_names"]``), else ``output_0, ...``.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...ir.dims import Dim, Sym, floor_atoms, parse, symbol, symbols_of, to_json
from ...ir.graph import Graph, GraphError, Node
from ...ir.ops.onnx_op import ALL_OUTPUTS, ONNX_DTYPES, decode_graph, node_model, outer_reads, rename_node
from ...ir.ops.reference import run_node
from ...ir.registry import Kind, ShapeError
from .export_table import EXPORTS, MIR_FORMS
from .forms import unit_moves

OPSET = 23  # the default domain's opset of exported models (Attention and RotaryEmbedding need 23)
IR_VERSION = 10  # what onnxruntime 1.17 and later read
CONTRIB_OPSET = 1


class Builder:
    """Collects the nodes and initializers of the exported graph; hands out unique tensor names.

    A symbolic dim is read at run time from the first graph input (of ``inputs``) that has it.
    """

    def __init__(self, taken: set[str], inputs: Iterable[Node] = (), graph: Graph | None = None) -> None:
        self.graph = graph  # the graph being written (export forms that look at a node's producers read it)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.taken = set(taken)
        self.domains: dict[str, int] = {"": OPSET}
        self.dim_sources: dict[Sym, tuple[str, int]] = {}  # symbolic dim -> (input name, axis)
        for node in inputs:
            for axis, d in enumerate(node.shape):
                if isinstance(d, Sym):
                    self.dim_sources.setdefault(d, (node.name, axis))
        self.dim_tensors: dict[Any, str] = {}
        self.expanded: dict[tuple[str, tuple[Dim, ...]], str] = {}
        self.splits: dict[tuple[str, int], dict[tuple[int, int], str] | None] = {}  # (tensor, axis) -> its Split
        self.shapes: dict[str, tuple[Dim, ...]] = {}  # a written value -> its shape, where known
        self.views: dict[str, str] = {}  # a Reshape written by reshape() -> the value it reshapes
        self.transposed: dict[str, tuple[str, tuple[int, ...]]] = {}  # a Transpose by transpose() -> (input, perm)
        self.label: str | None = None  # the name the nodes written for the current MIR node take (made unique)
        self.writing: int | None = None  # the id of the MIR node being written (None: a run-time shape value)
        self.written_for: dict[str, int | None] = {}  # an ONNX node's name -> the MIR node it was written for
        self.written: dict[int, Any] = {}  # a node of ``graph`` already written -> its output name(s)

    def fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.taken:
            k += 1
            name = f"{hint}_{k}"
        self.taken.add(name)
        return name

    def op(self, op_type: str, inputs: list[str], domain: str = "", **attrs: Any) -> str:
        """Append one node with one output; returns the output's name."""
        return self.multi(op_type, inputs, (0,), domain, **attrs)[0]

    def multi(self, op_type: str, inputs: list[str], used: Sequence[int], domain: str = "", **attrs: Any) -> list[str]:
        """Append one node whose output slots ``used`` (increasing) get names, the slots between left out
        (``""``); returns those names."""
        first = self.fresh(f"{op_type}_{len(self.nodes)}")
        names = [first, *(self.fresh(f"{first}_out{k}") for k in used[1:])]
        outputs = [""] * (used[-1] + 1)
        for k, name in zip(used, names, strict=True):
            outputs[k] = name
        label = self.fresh(self.label) if self.label is not None else first
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=label, domain=domain, **attrs))
        self.written_for[label] = self.writing
        if domain:
            self.domains.setdefault(domain, CONTRIB_OPSET)
        return names

    def const(self, array: np.ndarray, dtype: str | None = None, name: str | None = None) -> str:
        """An initializer holding ``array`` (stored as MIR ``dtype``); returns its name."""
        if dtype == "bf16":
            raise GraphError("bf16 tensors are not exported (numpy has no bfloat16 to store them in)")
        name = name if name is not None else self.fresh(f"const_{len(self.initializers)}")
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def expand(self, name: str, shape: Iterable[Dim]) -> str:
        """``name`` broadcast to ``shape`` by an Expand node, written once per tensor and shape."""
        key = (name, tuple(shape))
        if key not in self.expanded:
            self.expanded[key] = self.op("Expand", [name, self.ints(key[1])])
        return self.expanded[key]

    def reshape(self, name: str, dims: Iterable[Dim]) -> str:
        """``name`` reshaped to ``dims`` (one may be -1) as one Reshape of what it views: a reshape of a
        reshape reads the first one's input, and a reshape to the shape that input has is no node at all
        (row-major views compose, so the 3-D <-> 2-D pairs around Gemm and after Attention cancel)."""
        dims = tuple(dims)
        source = self.views.get(name, name)
        if any(isinstance(d, int) and d == 0 for d in dims):  # ONNX reads 0 as "copy that input dim"
            source = name
        shape = _resolved(dims, self.shapes.get(source))
        if shape is not None and shape == self.shapes.get(source):
            return source
        key = ("reshape", source, dims)
        if key in self.dim_tensors:  # one Reshape per value and target shape
            return self.dim_tensors[key]
        moves = _unit_moves(self.shapes.get(source), shape)
        if moves is not None:  # only size-1 axes dropped and added: Squeeze and Unsqueeze by constant axes
            dropped, added = moves
            out = self.op("Squeeze", [source, self.ints(dropped)]) if dropped else source
            out = self.op("Unsqueeze", [out, self.ints(added)]) if added else out
        else:
            out = self.op("Reshape", [source, self.ints(_copied(dims, self.shapes.get(source)))])
        self.dim_tensors[key] = out
        self.views[out] = source
        if shape is not None:
            self.shapes[out] = shape
        return out

    def rows(self, ins: Sequence[str], shape: tuple[Dim, ...]) -> list[str] | None:
        """The inputs of an op that computes every row of its last axis alike (elementwise, a norm over the last
        axis) as rows ``[-1, N]``, where one of them is a view of rows (a Gemm's result reshaped back to ``shape``):
        the op is then written on the rows and its result viewed as ``shape``, and a reader taking rows (the next
        Gemm) reads them without a node, so a chain of such ops between Gemms stays 2-D.  Every input of ``shape``
        must be a view of rows or have its rows written already (a Gemm's input); inputs of rank <= 1 broadcast
        along the rows as they are.  None where no input views rows, or an input would need a reshape of its own
        or broadcasts another way."""
        width = shape[-1] if len(shape) >= 3 else None
        if not isinstance(width, int):
            return None

        def viewed(name: str) -> bool:
            source = self.shapes.get(self.views.get(name, ""))
            return source is not None and len(source) == 2 and source[-1] == width

        shapes = [self.shapes.get(n) if n else () for n in ins]
        full = [n for n, s in zip(ins, shapes, strict=True) if s == shape]
        if not any(map(viewed, full)) or any(
                s is None or (s != shape and (len(s) > 1 or s[-1:] not in ((), (1,), (width,)))) for s in shapes) \
                or not all(viewed(n) or ("reshape", n, (-1, width)) in self.dim_tensors for n in full):
            return None
        return [self.reshape(n, (-1, width)) if n in full else n for n in ins]

    def on_rows(self, out: str, shape: tuple[Dim, ...]) -> str:
        """``out``, written on the rows :meth:`rows` gave, viewed as ``shape``."""
        self.shapes[out] = (math.prod(shape[:-1]), shape[-1])
        return self.reshape(out, shape)

    def transpose(self, name: str, perm: Iterable[int]) -> str:
        """``name`` transposed by ``perm``: no node where it undoes the transpose that wrote ``name``."""
        perm = tuple(perm)
        source, first = self.transposed.get(name, (None, None))
        if source is not None and tuple(first[p] for p in perm) == tuple(range(len(perm))):
            return source
        out = self.op("Transpose", [name], perm=list(perm))
        self.transposed[out] = (name, perm)
        if name in self.shapes:
            self.shapes[out] = tuple(self.shapes[name][p] for p in perm)
        return out

    def known(self, name: str) -> np.ndarray | None:
        """The value of an initializer already written, else None."""
        return next((numpy_helper.to_array(t) for t in self.initializers if t.name == name), None)

    def producer(self, name: str) -> tuple[str, list[str]] | None:
        """The op type and inputs of the node written whose first output is ``name``; None if there is none."""
        written = next((w for w in self.nodes if w.output and w.output[0] == name), None)
        return None if written is None else (written.op_type, list(written.input))

    def merged_heads(self, name: str) -> str | None:
        """For ``name`` [B, H, S, D] written as split heads, Transpose(x [B, S, H, D], 0 2 1 3), the value
        [B, S, H*D] whose heads it splits (x reshaped, a view); else None."""
        source, perm = self.transposed.get(name, (None, None))
        shape = self.shapes.get(source) if source is not None else None
        if perm != (0, 2, 1, 3) or shape is None or len(shape) != 4:
            return None
        return self.reshape(source, (*shape[:2], shape[2] * shape[3]))

    def split_heads(self, name: str, heads: int) -> str:
        """``name`` [B, S, heads*D] as split heads [B, heads, S, D]: a reshape and a transpose (which a
        consumer merging the heads back undoes without a node)."""
        b, s, width = self.shapes[name]
        return self.transpose(self.reshape(name, (b, s, heads, width // heads)), (0, 2, 1, 3))

    def ints(self, values: Iterable[Dim]) -> str:
        """A 1-D int64 tensor of ``values``: an initializer, or for symbolic dims a Concat of :meth:`dim`."""
        values = list(values)
        if not symbols_of(values):
            return self.const(np.array(values, np.int64))
        key = ("ints", tuple(values))
        if key not in self.dim_tensors:  # one run-time shape tensor per symbolic target
            with self.shape_values():
                parts = [self.dim(d) for d in values]
                self.dim_tensors[key] = parts[0] if len(parts) == 1 else self.op("Concat", parts, axis=0)
        return self.dim_tensors[key]

    @contextlib.contextmanager
    def shape_values(self) -> Iterator[None]:
        """Nodes written within are a run-time shape computation (``written_for`` None), not a MIR node's form."""
        writing, self.writing = self.writing, None
        try:
            yield
        finally:
            self.writing = writing

    def dim(self, d: Dim) -> str:
        """A 1-D int64 tensor ``[d]``; a symbolic one computed at run time from the inputs' shapes
        (``Shape(start, end)`` of an input that has it, else Mul/Add of its symbols, a floor atom by Div), once per
        dim."""
        if d in self.dim_tensors:
            return self.dim_tensors[d]
        with self.shape_values():
            out = self._dim(d)
        self.dim_tensors[d] = out
        return out

    def _dim(self, d: Dim) -> str:
        """The nodes :meth:`dim` writes for ``d``."""
        if not isinstance(d, Sym):
            out = self.const(np.array([d], np.int64))
        elif d in self.dim_sources:
            name, axis = self.dim_sources[d]
            out = self.op("Shape", [name], start=axis, end=axis + 1)
        elif d == symbol(d.symbols[0]) and (floor := floor_atoms([d]).get(d.symbols[0])) is not None:
            numerator, divisor = floor  # >= 0 wherever the atom is a dim: integer Div is its floor
            out = self.op("Div", [self.dim(numerator), self.dim(divisor)])
        elif d == symbol(d.symbols[0]):
            raise ShapeError(f"symbolic dim {d} is no dim of a graph input, so its value is not known at run time")
        else:
            terms = [reduce(lambda x, y: self.op("Mul", [x, y]),
                            [self.dim(symbol(name)) for name in mono] + ([self.dim(coef)] if coef != 1 else []))
                     if mono else self.dim(coef) for mono, coef in d.terms]
            out = reduce(lambda x, y: self.op("Add", [x, y]), terms)
        return out

    def scalar_dim(self, d: Dim) -> str:
        """A rank-0 int64 tensor of ``d`` (computed at run time for a symbolic dim), once per dim."""
        key = ("scalar", d)
        if key not in self.dim_tensors:
            with self.shape_values():
                self.dim_tensors[key] = self.const(np.array(d, np.int64)) if not isinstance(d, Sym) else \
                    self.op("Reshape", [self.dim(d), self.const(np.zeros(0, np.int64))])
        return self.dim_tensors[key]

    def reduce(self, op_type: str, x: str, axes: list[int] | None, keepdims: bool) -> str:
        """A reduction over ``axes`` (None: all) given as an input (opset 18)."""
        inputs = [x] if axes is None else [x, self.ints(axes)]
        return self.op(op_type, inputs, keepdims=int(keepdims))

    def opaque(self, node: Node, ins: list[str]) -> str | tuple[str, ...]:
        """An OnnxOp's ONNX node, converted to the export opset where its definition changed since; the name of
        its output (of each output, for a node of all of them)."""
        graph = decode_graph(node.attrs["proto"])
        domain, opset = node.attrs["domain"], node.attrs["opset"]
        if domain in ("", "ai.onnx") and _definition(graph.node[0].op_type, opset) != _definition(
                graph.node[0].op_type, OPSET):
            try:
                graph = onnx.version_converter.convert_version(node_model(graph, domain, opset), OPSET).graph
            except Exception as exc:  # the converter raises RuntimeError and others
                raise GraphError(f"node {node.id} (OnnxOp {graph.node[0].op_type}): cannot convert it from opset "
                                 f"{opset} to the export opset {OPSET}: {exc}") from None
        elif domain not in ("", "ai.onnx"):
            self.domains[domain] = max(self.domains.get(domain, 0), opset)
        names = {f"in{k}": name for k, name in enumerate(ins)} | {"": ""}
        for tensor in graph.initializer:
            names[tensor.name] = self.const(numpy_helper.to_array(tensor))
        op_type, output = graph.node[0].op_type, node.attrs["output"]
        outputs = range(len(graph.node[0].output)) if output == ALL_OUTPUTS else (output,)
        results = tuple(self.fresh(f"{op_type}_{len(self.nodes)}" + (f"_{k}" if output == ALL_OUTPUTS else ""))
                        for k in outputs)
        names.update((f"out{k}", name) for k, name in zip(outputs, results, strict=True))
        for inner in graph.node:
            copy = rename_node(inner, names)  # its inputs and what its subgraphs read of the enclosing graph
            for slot, name in enumerate(inner.output):
                if name not in names:
                    names[name] = self.fresh(f"{inner.op_type}_{len(self.nodes)}_unused")
                copy.output[slot] = names[name]
            copy.name = self.fresh(self.label if self.label is not None else copy.output[0])
            self.nodes.append(copy)
            self.written_for[copy.name] = self.writing
        return results if output == ALL_OUTPUTS else results[0]


def _copied(dims: tuple[Dim, ...], source: tuple[Dim, ...] | None) -> tuple[Dim, ...]:
    """A Reshape target with each symbolic dim that the source has at the same position written as 0 (ONNX's "copy
    that input dim"), when that leaves no symbol: a constant target, whose result's dims onnxruntime's shape
    inference knows (a target computed from Shape nodes leaves them unknown, and its Attention then infers a width
    of 0).  Otherwise ``dims`` as they are."""
    if source is None or not symbols_of(dims) or any(isinstance(d, int) and d == 0 for d in (*dims, *source)):
        return dims
    copied = tuple(0 if not isinstance(d, int) and k < len(source) and d == source[k] else d
                   for k, d in enumerate(dims))
    return dims if symbols_of(copied) else copied


def _unit_moves(source: tuple[Dim, ...] | None, shape: tuple[Dim, ...] | None
                ) -> tuple[list[int], list[int]] | None:
    """For a reshape of a value of shape ``source`` to a symbolic ``shape`` that only drops and adds size-1 axes:
    the axes of ``source`` dropped and the axes of ``shape`` added, which a Squeeze and an Unsqueeze take as
    constants (a Reshape's target would be computed at run time, a Concat of Shape nodes).  None otherwise."""
    if source is None or shape is None or not symbols_of(shape):
        return None
    perm = unit_moves(source, shape)
    if perm is None:
        return None
    kept = {k for k in perm if k is not None}
    return [k for k in range(len(source)) if k not in kept], [k for k, old in enumerate(perm) if old is None]


def _resolved(dims: tuple[Dim, ...], source: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
    """The shape a Reshape to ``dims`` gives a value of shape ``source`` (None if not known): its -1 is what
    the other dims leave of the element count."""
    if not any(isinstance(d, int) and d == -1 for d in dims):
        return dims
    if source is None:
        return None
    rest = math.prod(d for d in dims if not (isinstance(d, int) and d == -1))
    try:
        missing = math.prod(source) // rest
    except (ShapeError, ZeroDivisionError):
        return None
    return tuple(missing if isinstance(d, int) and d == -1 else d for d in dims)


def _definition(op_type: str, opset: int) -> int:
    """The opset version that introduced ``op_type``'s definition in force at ``opset``."""
    return onnx.defs.get_schema(op_type, opset).since_version


def _emit(b: Builder, graph: Graph, node: Node, ins: list[Any],
          weights: dict[int, np.ndarray]) -> str | tuple[str, ...]:
    """Write ``node`` of ``graph``; returns the ONNX name of its value (of each result of a multi-result
    node, which its Gets name without a node of their own)."""
    if node.kind is Kind.PROJECTION:
        return ins[0][node.attrs["index"]]
    if node.op == "Input":
        return node.name
    if node.op == "Param":
        weights[node.id] = graph.weights[node.name]
        return b.const(weights[node.id], node.dtype, name=node.name)
    if node.op in EXPORTS and node.kind is Kind.LEAF and symbols_of(node.dims()):  # dims data: computed at run time
        return EXPORTS[node.op](b, node, ins, [])
    if node.kind is Kind.LEAF or node.kind is Kind.WEIGHT_PREP:  # Constant, Scalar, dims data, derived weights
        value = run_node(node.spec, node.attrs, [weights[i] for i in node.inputs],
                         [graph.node(i).dtype for i in node.inputs], node.type)
        weights[node.id] = value
        return b.const(value, node.dtype, name=b.fresh(f"weight_{node.id}") if node.inputs else None)
    if node.op == "OnnxOp":
        return b.opaque(node, ins)
    types = [graph.node(i).type for i in node.inputs]
    write = EXPORTS.get(node.op)
    out = write(b, node, ins, types) if write is not None else None
    if out is not None:
        return out
    unfold = node.spec.decompose or MIR_FORMS.get(node.op)
    if unfold is None:
        raise GraphError(f"{graph.describe(node.id)}: has no ONNX export and no unfused form")
    scratch = Graph(node.op)
    slots = [scratch.input(f"in{k}", t.shape, t.dtype) for k, t in enumerate(types)]
    result = unfold(scratch, slots, node.attrs)
    names = dict(zip(slots, ins, strict=True))
    outer = b.graph, b.written
    b.graph, b.written = scratch, names  # export forms that look at producers and readers look in the unfused form
    try:
        for inner in scratch.nodes:
            if inner.id not in names:
                names[inner.id] = _emit(b, scratch, inner, [names[i] for i in inner.inputs], {})
    finally:
        b.graph, b.written = outer
    return tuple(names[r] for r in result) if isinstance(result, tuple) else names[result]


def output_names(graph: Graph) -> list[str]:
    """The imported model's output names when the graph has them, else ``output_0, ...``."""
    given = graph.meta.get("output_names")
    if isinstance(given, list) and len(given) == len(graph.outputs) and len(set(given)) == len(given):
        return [str(n) for n in given]
    return [f"output_{k}" for k in range(len(graph.outputs))]


def _guards(b: Builder, graph: Graph) -> list[str]:
    """Run-time checks of ``graph.meta["guarded_limits"]`` (symbol -> largest value the graph holds for): per
    symbol, the input dim ``d = symbol + c`` that gives it, reshaped from ``[d]`` to ``[1 + max(d - limit - c, 0)]``.
    Within the limit that is ``d`` itself; past it onnxruntime fails at that Reshape, whose name (``assumes
    past_sequence <= 4094``) says what does not hold.  Nothing reads the result (onnxruntime runs every node);
    returns their names, which the export keeps."""
    limits = graph.meta.get("guarded_limits")
    out = []
    for name, limit in sorted(limits.items()) if isinstance(limits, dict) else ():
        s = symbol(name)
        source = next((d for d in b.dim_sources if isinstance(d - s, int)), None)
        if source is None:  # the symbol is no input's dim: nothing to check it by
            continue
        shift = source - s
        raw = b.dim(source)
        b.label = f"check {name}"
        past = b.op("Max", [b.op("Sub", [raw, b.ints([limit + shift])]), b.ints([0])])
        size = b.op("Add", [past, b.ints([1])])
        b.label = f"assumes {name} <= {limit}"
        out.append(b.op("Reshape", [raw, size]))
    b.label = None
    return out


def _live(nodes: list[onnx.NodeProto], outputs: Iterable[str]) -> list[onnx.NodeProto]:
    """``nodes`` (in order) that compute ``outputs``, directly or through others."""
    needed, live = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(node.input, outer_reads(node))
    return live[::-1]


def _sum_before_layer_norm(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` with each Add read only by a LayerNormalization (as its input) written as a two-input Sum (the
    same values, broadcasting alike).  onnxruntime fuses Add + LayerNormalization into SkipLayerNormalization
    when a session loads (ORT_ENABLE_ALL, its default), whose CPU kernel the calibration measures several times
    slower than the two; where the cost model chose them unfused (else the graph holds a FusedResidualLN), a
    Sum keeps them so.  A node is changed in place: the list is the export's own."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for node in nodes:
        if node.op_type == "Add" and not node.domain:
            read = readers.get(node.output[0], [])
            if len(read) == 1 and read[0].op_type == "LayerNormalization" and list(read[0].input).count(
                    node.output[0]) == 1 and read[0].input[0] == node.output[0]:
                node.op_type = "Sum"
    return nodes


def _value_info(name: str, node: Node, spelled: dict[Dim, str]) -> onnx.ValueInfoProto:
    """A typed value; a symbolic dim is its dim_param as the imported model spelled it (``spelled``), else as
    written by ``to_json`` (``"batch"``, ``"batch*sequence"``)."""
    dims = [spelled.get(d, to_json(d)) if isinstance(d, Sym) else d for d in node.shape]
    return helper.make_tensor_value_info(name, ONNX_DTYPES[node.dtype], dims)


def _spellings(graph: Graph) -> dict[Dim, str]:
    """Symbolic dim -> the dim_param an imported model wrote for it (``"past_sequence + 1"``), from
    ``graph.meta["dim_names"]``."""
    out: dict[Dim, str] = {}
    names = graph.meta.get("dim_names")
    for dims in (names.values() if isinstance(names, dict) else ()):
        for text in dims or ():
            if not isinstance(text, str):
                continue
            try:
                out.setdefault(parse(text), text)
            except ShapeError:
                continue
    return out


def check_weights(graph: Graph) -> None:
    """Raise GraphError naming the parameters whose values ``graph.weights`` lacks: export writes them all
    (optimizing keeps a graph's parameters, so this can be asked of its input before a long run)."""
    missing = [p.name for p in graph.params if p.name not in graph.weights]
    if missing:
        raise GraphError(f"export needs every parameter's value in graph.weights; missing: {missing}")


def export_name(graph: Graph, node: Node) -> str | None:
    """The name the ONNX nodes written for ``node`` take: its source name, or for a node replacing several, what it
    replaced (``/m/layers.0/mlp/FusedMatMulBiasAct[up_proj/MatMul, act/Mul]``: their common path, the op, the rest of
    each name); None without source names."""
    names = graph.source_names(node.id)
    if len(names) <= 1:
        return names[0] if names else None
    parts = [n.split("/") for n in names]
    common = 0
    while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
        common += 1
    prefix = "/".join(parts[0][:common]) + "/" if common else ""
    tails = [n[len(prefix):] for n in names]
    listed = ", ".join(tails[:NAMES_LISTED]) + (f", +{len(tails) - NAMES_LISTED} more" if len(tails) > NAMES_LISTED
                                                 else "")
    return f"{prefix}{node.op}[{listed}]"


NAMES_LISTED = 4  # source names an exported fused node's name lists (then how many more)


# Above this many bytes of weights, save_model writes them beside the model (protobuf cannot hold 2 GB).
EXTERNAL_DATA_BYTES = 1 << 30


def export_model(graph: Graph, path: str | Path | None = None, external_data: bool | None = None,
                 ort_optimized: bool = False) -> onnx.ModelProto:
    """``graph`` as an ONNX model (default domain opset 23, com.microsoft contrib ops) for onnxruntime.

    Symbolic dims are written as ``dim_param``s and computed at run time from the inputs' shapes.  Every parameter
    needs its value in ``graph.weights`` (see :func:`check_weights`); raises GraphError naming the missing
    parameters, or the node that cannot be written.  ``graph`` is not changed.  With ``path``, the model is also
    saved there (:func:`save_model`; ``external_data``: weights in a file beside it, by default when they pass 1 GB).
    ``ort_optimized`` (needs ``path``): save instead the graph onnxruntime's CPU session makes of the model
    (:func:`save_ort_optimized`: faster to load and, on convolutional models, to run, but specific to the machine's
    instruction set), and return that graph.
    """
    if path is None and (external_data or ort_optimized):
        option = "external_data" if external_data else "ort_optimized"
        raise GraphError(f"export_model({option}=True) needs the path to save the model at")
    model, _ = export_written(graph)
    if ort_optimized:
        return save_ort_optimized(model, path, external_data)
    if path is not None:
        save_model(model, path, external_data)
    return model


def export_written(graph: Graph) -> tuple[onnx.ModelProto, dict[str, int | None]]:
    """:func:`export_model` of ``graph``, and for each node of the model (by name) the id of the MIR node it was
    written for, None for a node of a run-time shape computation (a symbolic Reshape or Expand target); the
    Identity nodes that name the outputs are not listed."""
    check_weights(graph)
    outs = output_names(graph)
    b = Builder({n.name for n in graph.inputs} | {n.name for n in graph.params} | set(outs), graph.inputs, graph)
    names: dict[int, Any] = b.written
    weights: dict[int, np.ndarray] = {}
    with graph.dim_context.active():  # the graph's facts on its dims decide the forms written
        for node in graph.nodes:
            b.label, b.writing = export_name(graph, node), node.id
            try:
                names[node.id] = _emit(b, graph, node, [names[i] for i in node.inputs], weights)
                if isinstance(names[node.id], str):
                    b.shapes.setdefault(names[node.id], node.shape)
            except ShapeError as exc:  # an unfused form that needs a static value of a symbolic dim
                raise GraphError(f"{graph.describe(node.id)}: cannot be exported with symbolic dims: {exc}") \
                    from None
    b.label, b.writing = None, None
    for name, nid in zip(outs, graph.outputs, strict=True):
        b.nodes.append(helper.make_node("Identity", [names[nid]], [name], name=b.fresh(f"output_{name}")))
    guards = _guards(b, graph)
    b.nodes = _sum_before_layer_norm(_live(b.nodes, [*outs, *guards]))  # a value left unread is not written
    read = {name for n in b.nodes for name in (*n.input, *outer_reads(n))}
    spelled = _spellings(graph)
    onnx_graph = helper.make_graph(b.nodes, graph.name, [_value_info(n.name, n, spelled) for n in graph.inputs],
                                   [_value_info(name, graph.node(nid), spelled) for name, nid in
                                    zip(outs, graph.outputs, strict=True)],
                                   [t for t in b.initializers if t.name in read])  # not the parts of derived weights
    model = helper.make_model(onnx_graph, ir_version=IR_VERSION, producer_name="rlx-egraph",
                              opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(b.domains.items())])
    assumptions = graph.meta.get("assumptions")
    if isinstance(assumptions, list) and assumptions:  # what the graph holds only under (see docs/onnx.md)
        helper.set_model_props(model, {"rlx_egraph.assumptions": "; ".join(map(str, assumptions))})
    return model, {n.name: b.written_for[n.name] for n in b.nodes if n.name in b.written_for}


def save_model(model: onnx.ModelProto, path: str | Path, external_data: bool | None = None) -> None:
    """Save ``model`` at ``path``; with ``external_data`` (None: when its weights pass 1 GB) its weights go in one
    file beside it, ``<file name>.data``, written by onnx (``save_as_external_data``; ``model`` then refers to it).
    """
    path = Path(path)
    size = sum(t.ByteSize() for t in model.graph.initializer)
    if external_data if external_data is not None else size > EXTERNAL_DATA_BYTES:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{path.name}.data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def save_ort_optimized(model: onnx.ModelProto, path: str | Path, external_data: bool | None = None
                       ) -> onnx.ModelProto:
    """Save at ``path`` the graph onnxruntime's CPU session makes of ``model`` at ``ORT_ENABLE_ALL`` when it loads
    (``optimized_model_filepath``: onnxruntime's offline optimization, as the transformer optimizer's
    ``opt_level=99`` writes it), and return that graph (its weights not loaded when they went beside it).
    ``external_data`` as in :func:`save_model`.  The saved graph runs without the load-time rewriting (on
    convolutional models, faster: the blocked NCHWc layout is in the file), but holds onnxruntime's CPU-only ops and
    a block size that follows the machine's vector width: run it with onnxruntime's CPU provider on the machine
    that wrote it.  Raises GraphError with onnxruntime's message when it cannot load ``model``."""
    import onnxruntime as ort  # in the onnx extra; imported here so that the plain export needs only onnx

    path = Path(path)
    size = sum(t.ByteSize() for t in model.graph.initializer)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(path)
    opts.log_severity_level = 3
    if external_data if external_data is not None else size > EXTERNAL_DATA_BYTES:
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{path.name}.data")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "model.onnx"
        save_model(model, source)  # weights beside it past 1 GB: protobuf cannot hold 2 GB in one piece
        try:
            ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own error types; its message says what it could not load
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            raise GraphError(f"onnxruntime cannot load the exported model: {lines[0] if lines else exc}") from exc
    return onnx.load(str(path), load_external_data=False)


__all__ = ["EXTERNAL_DATA_BYTES", "OPSET", "Builder", "check_weights", "export_model", "export_name", "export_written",
           "output_names", "save_model", "save_ort_optimized"]
