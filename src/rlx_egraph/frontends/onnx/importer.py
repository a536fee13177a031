"""ONNX -> MIR: :func:`import_model`.

Every ONNX value is *known* (computable without the inputs' values: constants,
initializers, shapes, and everything computed from them only, folded with onnx's
reference evaluator, or exactly for symbolic dims, :mod:`.symbolic`), a *form* (a
tensor of symbolic shape computed from dims only, such as ``Range(0, sequence)`` or
a causal mask: :mod:`.forms`), or *runtime* (a MIR node).  A node whose inputs are
all known is folded (within :class:`FoldLimits`); one whose inputs are known or
forms is kept a form where it is one; any other node is lowered by its entry in
:data:`rlx_egraph.frontends.onnx.lowering.LOWERINGS`, or, where MIR has no
equivalent, becomes one OnnxOp node per used output.  A known value or form becomes
a MIR node only where a runtime node reads it: an initializer, or a value folded
from one, is a Param whose value goes to the weight store (``graph.weights``); a
causal keep mask is a ``CausalMask``; a symbolic value a ``DimValues``; any other
known value is a Constant; a single-valued one read by an elementwise op is the
canonical ``Scalar`` (see ``Importer.operand``).  Every MIR node keeps the name of
the ONNX node it was lowered from (``graph.meta["node_names"]``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.external_data_helper
from onnx import helper, numpy_helper

from ...ir.dims import Dim, floor_atoms, minimum, symbols_of
from ...ir.graph import Graph, GraphError
from ...ir.ops.onnx_op import (
    ALL_OUTPUTS,
    MIR_DTYPES,
    ONNX_DTYPES,
    STANDARD_DOMAINS,
    encode_proto,
    outer_reads,
    reference_evaluator,
    rename_node,
)
from ...ir.registry import Kind, ShapeError, TensorType
from ...ir.shapes import broadcast
from .binding import ModelInput, bind_inputs
from .errors import OnnxImportError
from .form_folds import fold_forms
from .forms import Filled, Form, Mask, from_array, is_symbolic, unit_moves
from .lowering import LOWERINGS
from .rules import SOURCE
from .symbolic import FOLDS, fold_symbolic, lowers, refuse, refuse_shape_error
from .values import Value, dim_range

# Ops never folded even when every input is known: their value is not a function of their inputs, or (control
# flow) folding them can run without bound.
_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                         "Bernoulli", "Loop", "Scan", "If", "SequenceMap"})


def node_label(node: onnx.NodeProto, index: int) -> str:
    """How errors name an ONNX node: its name, else its position."""
    return f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node #{index}"


def mir_dtype(elem_type: int, what: str) -> str:
    if elem_type not in MIR_DTYPES:
        raise OnnxImportError(f"{what} has ONNX element type {onnx.TensorProto.DataType.Name(elem_type)}, "
                              f"which MIR has no dtype for ({', '.join(ONNX_DTYPES)})")
    return MIR_DTYPES[elem_type]


def load(model: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """The model to import: a copy of a ``ModelProto`` (the caller's is never changed), or the file at a path with
    its external data read from the model's own folder; local functions inlined.  OnnxImportError for a file that
    is not a model, a model without the default domain's opset, or external data that cannot be read."""
    folder = None
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    else:
        path = Path(model)
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise OnnxImportError(f"{model}: cannot read the model: {exc.strerror}") from None
        if not path.is_file() or size == 0:
            raise OnnxImportError(f"{model}: not an ONNX model: " + ("the file is empty" if path.is_file()
                                                                      else "not a file"))
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # onnx raises DecodeError, OSError, ...
            raise OnnxImportError(f"{model}: not a readable ONNX model: {exc}") from None
        folder = path.parent
    if not proto.HasField("graph") or not any(o.domain in ("", "ai.onnx") for o in proto.opset_import):
        what = "has no graph" if not proto.HasField("graph") else \
            "imports no opset of the default domain (ai.onnx), so its ops have no meaning"
        raise OnnxImportError(f"{model if folder is not None else 'the model'}: not an ONNX model: it {what}")
    external = [t for t in _tensors(proto.graph) if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        _load_external(proto, external, folder)
    if proto.functions:
        from onnx import inliner  # a submodule onnx does not import itself

        try:
            proto = inliner.inline_local_functions(proto)
        except Exception as exc:  # onnx raises RuntimeError and others
            raise OnnxImportError(f"the model's local functions cannot be inlined: {exc}") from None
    return proto


def _tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """Every tensor a graph holds: its initializers and its nodes' tensor attributes, subgraphs included."""
    out = list(graph.initializer)
    for node in graph.node:
        for a in node.attribute:
            out += ([a.t] if a.HasField("t") else []) + list(a.tensors)
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                out += _tensors(sub)
    return out


def _load_external(proto: onnx.ModelProto, tensors: list[onnx.TensorProto], folder: Path | None) -> None:
    """Read the external data of ``tensors`` from files in ``folder`` (the model's own); a location outside it is
    an OnnxImportError, as is a model given as a ModelProto (no folder to read from)."""
    if folder is None:
        raise OnnxImportError(f"initializer {tensors[0].name!r} keeps its data in an external file: import the "
                              "model from its path, so the data can be read from the model's folder")
    root = folder.resolve()
    for tensor in tensors:
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (root / location).resolve()
        if not location or Path(location).is_absolute() or not target.is_relative_to(root) or target == root:
            raise OnnxImportError(f"initializer {tensor.name!r}: external data location {location!r} is not a file "
                                  "in the model's folder (only files beside the model are read)")
        if not target.is_file():
            raise OnnxImportError(f"initializer {tensor.name!r}: external data file {location!r} is missing from "
                                  "the model's folder")
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, str(root))
    except Exception as exc:  # onnx raises ValueError, OSError, ...
        raise OnnxImportError(f"the model's external data cannot be read: {exc}") from None


def _model_dims(info: onnx.ValueInfoProto) -> tuple[int | str | None, ...] | None:
    """An input's dims as the model gives them: an int, a dim_param, None (unnamed); None for no shape."""
    tensor = info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in tensor.shape.dim)


def initializer_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The value of an initializer; OnnxImportError naming it when its dims do not match its data."""
    try:
        return numpy_helper.to_array(tensor)
    except Exception as exc:  # onnx raises ValueError, TypeError, ...
        raise OnnxImportError(f"initializer {tensor.name!r} (dims {list(tensor.dims)}): its data does not match "
                              f"its dims and type: {exc}") from None


def check_outputs(graph: onnx.GraphProto) -> None:
    """Each value is defined once: by one node, input or initializer (else OnnxImportError naming both)."""
    defined: dict[str, str] = {}
    for info in graph.input:
        defined.setdefault(info.name, f"input {info.name!r}")
    for t in graph.initializer:
        defined.setdefault(t.name, f"initializer {t.name!r}")
    for k, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            if name in defined:
                raise OnnxImportError(f"{node_label(node, k)} writes {name!r}, which {defined[name]} already "
                                      "defines (a value has one producer)")
            defined[name] = node_label(node, k)


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


class Importer:
    """The state of one import: the MIR graph being built and every ONNX value seen so far."""

    def __init__(self, model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[Any]],
                 max_dims: Mapping[str, int] | None = None, limits: FoldLimits | None = None) -> None:
        self.model = model
        self.onnx_graph = model.graph
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        self.opsets["ai.onnx"] = self.opsets[""]
        self.graph = Graph(model.graph.name or "onnx")
        self.values: dict[str, Value] = {}
        self.materialized: dict[str, int] = {}
        self.label = "graph"
        self.limits = limits or FoldLimits()
        self.fold_seconds = 0.0
        self.names: dict[int, str] = {}  # MIR node id -> the name of the ONNX node it was lowered from
        self.assumptions: dict[str, None] = {}  # facts the import relies on that hold only under a bound
        initializers = {t.name: t for t in model.graph.initializer}
        inputs = [ModelInput(i.name, _model_dims(i)) for i in model.graph.input if i.name not in initializers]
        bound = bind_inputs(inputs, input_shapes)
        for name, tensor in initializers.items():
            self.values[name] = Value(array=initializer_array(tensor), weight=True)
        for info in model.graph.input:
            if info.name in initializers:
                continue
            dt = mir_dtype(info.type.tensor_type.elem_type, f"input {info.name!r}")
            self.values[info.name] = Value(node=self.graph.input(info.name, bound.shapes[info.name], dt))
        self.max_dims = check_max_dims(max_dims or {}, self.graph.symbols)
        self.limits_found: dict[str, int] = {}  # symbol -> the model's own limit on it (:meth:`model_limit`)
        self.guarded_limits: dict[str, int] = {}  # symbol -> a limit past which the original computes otherwise
        self.hints = dict(bound.hints)
        self.table_lengths = _table_lengths(model.graph)
        self.window_lengths = _window_lengths(model.graph)
        for name, dim in bound.related.items():
            self.assumptions.setdefault(f"{name} = {dim} (the attention mask covers the cached and the new tokens)")
        self.graph.meta = {"source": SOURCE, "dim_names": bound.dim_names,
                           "output_names": [o.name for o in model.graph.output], "opset": self.opsets[""]}
        if bound.hints:
            self.graph.meta["dim_hints"] = bound.hints

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
        """The value of ``name`` when it is a known array of numbers (an empty name is an absent optional input:
        None; so is a symbolic value, which only :meth:`known_dims` gives)."""
        array = self.value(name).array if name else None
        return None if is_symbolic(array) else array

    def known_dims(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is known, a symbolic value included (for the slots read as dims: Reshape
        and Expand targets, Slice bounds)."""
        return self.value(name).array if name else None

    def form(self, name: str) -> Form | None:
        """The form of ``name`` when it is one (:mod:`.forms`)."""
        return self.value(name).form if name else None

    def type(self, name: str) -> TensorType:
        v = self.value(name)
        if v.known:
            return TensorType(tuple(int(d) for d in v.array.shape), self.array_dtype(v.array, name))
        if v.form is not None:
            return TensorType(v.form.shape, self.array_dtype(np.zeros((), v.form.dtype), name))
        return self.graph.node(v.node).type

    def array_dtype(self, array: np.ndarray, name: str) -> str:
        if array.dtype == object:  # a symbolic value: int64 dims
            return "i64"
        return mir_dtype(helper.np_dtype_to_tensor_dtype(array.dtype), f"{self.label}: value {name!r}")

    def tensor(self, name: str) -> int:
        """The MIR node of ``name``, made on first use for a known value (Param, Scalar, Constant, CausalMask or,
        for a symbolic value, DimValues) or a form (:meth:`.forms.Form.materialize`)."""
        v = self.value(name)
        if v.runtime:
            return v.node
        if name not in self.materialized:
            self.materialized[name] = self.materialize(v, name)
        return self.materialized[name]

    def materialize(self, v: Value, name: str) -> int:
        """The MIR node of a known value or a form (see :meth:`tensor`)."""
        if v.form is not None:
            return v.form.materialize(self)
        array = v.array
        dt = self.array_dtype(array, name)
        if is_symbolic(array):
            return self.graph.add_node("DimValues", values=tuple(array.reshape(-1)), shape=array.shape, dtype="i64")
        if array.ndim == 0 and np.isfinite(array):
            return self.graph.scalar(array.item(), dt)
        form = from_array(array) if array.dtype == np.bool_ else None
        if isinstance(form, Mask) and form.is_causal():  # the one causal keep mask form, whatever its name
            return form.materialize(self)
        if v.weight:
            self.graph.weights[name] = array
            return self.graph.param(name, array.shape, dt)
        return self.graph.add_node("Constant", value=array, dtype=dt)

    def operand(self, name: str, others: Sequence[tuple[Dim, ...]]) -> int:
        """``name`` as an operand of a broadcasting elementwise op whose other operands have shapes ``others``.

        A known value holding one repeated finite number (one element, for an initializer) is the canonical
        ``Scalar`` when leaving it out does not change the result's shape; a form that does not vary along some
        axes is materialized with size 1 there when the broadcast keeps the result's shape (a causal mask read by a
        Where over [batch, heads, S, S] scores is the [1, 1, S, S] CausalMask).
        """
        v = self.value(name)
        if v.known and not is_symbolic(v.array) and v.array.size and (v.array.size == 1 or not v.weight):
            flat = v.array.reshape(-1)
            drops = not others or broadcast(*others) == broadcast(*others, v.array.shape)
            if drops and np.all(flat == flat[0]) and np.isfinite(flat[0]):
                return self.graph.scalar(flat[0].item(), self.array_dtype(v.array, name))
        if v.form is not None and others:
            return self.form_operand(v.form, others, name)
        return self.tensor(name)

    def form_operand(self, form: Form, others: Sequence[tuple[Dim, ...]], key: str) -> int:
        """``form`` as an operand of a broadcasting op whose other operands have shapes ``others``: with size 1 on
        the axes it does not vary along, and without leading size-1 axes, where the broadcast keeps the result's
        shape; made once per ``key``."""
        compact = form.compact()
        if not others or broadcast(*others, compact.shape) != broadcast(*others, form.shape):
            compact = form
        shape = _squeezed(compact.shape)
        if broadcast(*others, shape) != broadcast(*others, form.shape):
            shape = compact.shape
        if isinstance(compact, Filled) and np.isfinite(compact.value):
            return self.graph.scalar(compact.value.item(), self.array_dtype(compact.value, key))
        key = f"{key}\0{shape}"
        if key not in self.materialized:
            moves = unit_moves(compact.shape, shape)  # only size-1 axes dropped: the form itself at that shape
            made = compact.axes(moves, shape) if moves is not None else compact
            self.materialized[key] = self.fit(made.materialize(self), shape)
        return self.materialized[key]

    def fit(self, nid: int, shape: tuple[Dim, ...]) -> int:
        """``nid`` reshaped or broadcast to ``shape`` (where scalar canonicalisation dropped dims)."""
        have = self.graph.node(nid).shape
        if have == shape:
            return nid
        if math.prod(have) == math.prod(shape):
            return self.graph.reshape(nid, shape=shape) if shape else nid
        return self.graph.expand(nid, shape=shape)

    # --- decisions on dims ------------------------------------------------------------

    def decide(self, a: Dim, op: str, b: Dim, model_limit: bool = True) -> bool:
        """``a op b`` (op one of ``<``, ``<=``, ``>``, ``>=``) for every value of the symbols; where only the user's
        ``max_dims`` decide it, under them; else, for one symbol without a user bound that the model limits (a
        comparison with the size of one of its tables: ``max(128 - sequence, 0)``), as it holds from 1 up to that
        limit (:meth:`model_limit`).  Both are recorded as assumptions.  ShapeError when none decides it."""
        diff = a - b if op in ("<", "<=") else b - a  # a < b is diff < 0, a <= b is diff <= 0
        strict = op in ("<", ">")
        try:
            return bool(diff < 0) if strict else bool(diff <= 0)
        except ShapeError:
            for bounds, why in ((self.max_dims, "the given max_dims"), (self.limits_found, "the model's own limit")):
                low, high = dim_range(diff, {**self.max_dims, **bounds})
                if (high < 0 if strict else high <= 0) or (low >= 0 if strict else low > 0):
                    held = high < 0 if strict else high <= 0
                    if bounds is self.max_dims:  # a fact under a model limit follows from the limit's own record
                        self.assume(f"{a} {op if held else _NEGATED[op]} {b}", why)
                    return held
            held = self.model_limit(diff, strict) if model_limit else None
            if held is not None:
                return held
            raise ShapeError(f"cannot decide {a} {op} {b} for every value of "
                             f"{', '.join(sorted(symbols_of([a, b])))}") from None

    def model_limit(self, diff: Dim, strict: bool) -> bool | None:
        """``diff < 0`` (``strict``) or ``diff <= 0`` where ``diff = c * s + k`` is linear in one symbol ``s`` with no
        user bound: its value at ``s = 1``, which holds up to a limit ``L`` of the model: the length ``L`` or ``L + 1``
        of an axis of a table the model slices or gathers (``128 - sequence >= 0`` up to 128 for a 128-position
        table); ``s <= L`` is recorded as an assumption and decides later steps alike.  None otherwise (more
        symbols, a user bound, no such table, a limit below 2 or below the symbol's hint)."""
        terms = dict(diff.terms)
        if len(diff.symbols) != 1 or diff.symbols[0] in self.max_dims or set(terms) - {diff.symbols, ()}:
            return None
        s = diff.symbols[0]
        c, k = terms[(s,)], terms.get((), 0)
        held = (c + k < 0) if strict else (c + k <= 0)
        # the largest s at which c * s + k keeps the sign it has at s = 1 (c * s + k is monotone in s)
        limit = ((-k - 1 if strict else -k) if held else (-k if strict else 1 - k)) // c
        if c > 0 if held else c < 0:  # the fact weakens as s grows: a limit from above
            if limit < max(2, self.hints.get(s, 0)):
                return None
            if {limit, limit + 1} & self.table_lengths:
                source = "the model's own limit"
            elif {limit, limit + 1} & self.window_lengths:
                source = ("the model's window: past it the model drops its oldest keys, which this import does not; "
                          "the export checks it at run time")
                self.guarded_limits[s] = min(limit, self.guarded_limits.get(s, limit))
            else:
                return None
            self.limits_found[s] = min(limit, self.limits_found.get(s, limit))
            self.assume(f"{s} <= {limit}", f"{source}; beyond it {diff} {'<' if strict else '<='} 0 "
                        f"{'fails' if held else 'holds'}")
            return held
        return None

    def assume(self, fact: str, why: str) -> None:
        """Record that the import holds only where ``fact`` does (the report and the exported model say so)."""
        self.assumptions.setdefault(f"{fact} ({self.label}: {why})")

    def slice_bounds(self, size: Dim, start: Dim, end: Dim) -> tuple[Dim, Dim]:
        """ONNX Slice's ``[start, end)`` of an axis of ``size`` as ``(begin, stop)`` with ``0 <= begin <= stop <=
        size``; a symbolic end past a static size is assumed not to pass it (the model's own limit: a position
        table's length), unless the user's ``max_dims`` let it, which is an error."""
        def negative(d: Dim) -> bool:
            if isinstance(d, int):
                return d < 0
            try:
                return self.decide(d, "<", 0)
            except ShapeError:
                return False

        def clamp(d: Dim) -> Dim:
            if negative(d):  # counted from the end: -sequence is size - sequence
                d = d + size
                if isinstance(d, int):
                    return max(d, 0)
                try:
                    return d if self.decide(d, ">=", 0) else 0
                except ShapeError:
                    try:  # 0 also where it reaches 0 (a window cut to the cache's length)
                        return 0 if self.decide(d, "<=", 0) else d
                    except ShapeError:
                        return d
            if isinstance(d, int) and isinstance(size, int):
                return min(d, size)
            if isinstance(d, int) and d >= 2**62:  # "to the end"
                return size
            try:
                return d if self.decide(d, "<=", size, model_limit=False) else size
            except ShapeError:
                if isinstance(size, int) and symbols_of([d]) and not symbols_of([d]) & set(self.max_dims):
                    self.assume(f"{d} <= {size}", f"the axis it slices has {size} entries")
                    return d
                raise ShapeError(f"cannot decide whether {d} passes the axis of size {size} for every value of "
                                 f"{', '.join(sorted(symbols_of([d, size])))}") from None

        begin, stop = clamp(start), clamp(end)
        try:
            return (begin, stop) if self.decide(begin, "<=", stop) else (begin, begin)
        except ShapeError:
            raise ShapeError(f"cannot decide whether the slice [{begin}, {stop}) is empty for every value of "
                             f"{', '.join(sorted(symbols_of([begin, stop])))}") from None

    # --- the walk -------------------------------------------------------------------

    def run(self) -> Graph:
        """The MIR graph of the model; the graph's dims context (:class:`~rlx_egraph.ir.dims.DimContext`) is the
        active one throughout, so the facts its Conv nodes state decide the steps after them, and no other graph's
        do."""
        with self.graph.dim_context.active():
            return self._walk()

    def _walk(self) -> Graph:
        graph = self.onnx_graph
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        for index, node in enumerate(graph.node):
            self.label = node_label(node, index)
            outputs = self.named_step(node, used)
            for name, value in zip(node.output, outputs, strict=True):
                if name and value is not None:
                    self.values[name] = value
        self.label = "graph"
        self.graph.set_outputs([self.tensor(o.name) for o in graph.output])
        if self.names:
            self.graph.meta["node_names"] = {str(k): v for k, v in self.names.items()}
        for name, (numerator, divisor) in floor_atoms(d for n in self.graph.nodes for d in n.shape).items():
            self.assumptions.setdefault(f"{name} = floor(({numerator}) / {divisor}) >= {minimum(name)} (the lengths "
                                        "it gives are not empty)")
        if self.assumptions:
            self.graph.meta["assumptions"] = list(self.assumptions)
        if self.guarded_limits:
            self.graph.meta["guarded_limits"] = dict(sorted(self.guarded_limits.items()))
        return self.graph

    def named_step(self, node: onnx.NodeProto, used: set[str]) -> list[Value | None]:
        """:meth:`step`, and every MIR node it made (but leaves, which have names of their own, and nodes a branch it
        inlined named already) keeps the ONNX node's name."""
        first = len(self.graph)
        outputs = self.step(node, used)
        if node.name:
            for nid in range(first, len(self.graph)):
                if self.graph.nodes_by_id[nid].kind is not Kind.LEAF:
                    self.names.setdefault(nid, node.name)
        return outputs

    def step(self, node: onnx.NodeProto, used: set[str]) -> list[Value | None]:
        """The values of ``node``'s outputs: folded (every input known), kept as forms, or lowered to MIR."""
        ins = [self.value(n) if n else None for n in node.input]
        at = attributes(node)
        if node.op_type == "If" and (cond := self.known(node.input[0])) is not None and cond.size == 1:
            return self.inline(node, at["then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"])
        try:
            if all(v is None or not v.runtime for v in ins) and node.op_type not in _NOT_FOLDED:
                arrays = [v.array if v is not None else None for v in ins]
                if all(v is None or v.known for v in ins) and not lowers(self, node) and (
                        not any(is_symbolic(a) for a in arrays) or node.op_type in FOLDS):
                    values = self.fold(node, list(node.input))
                    if values is not None:
                        return values
                folded = fold_forms(self, node, at, [None if v is None else v.form or v.array for v in ins])
                if folded is not None:
                    return [None if x is None else Value(form=x) if isinstance(x, Form) else Value(array=x)
                            for x in folded]
            lower = LOWERINGS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            outputs = list(lower(self, node, at) or []) if lower is not None else []
        except GraphError as exc:
            if isinstance(exc, OnnxImportError):
                raise
            raise OnnxImportError(f"{self.label}: {exc}") from None
        except ShapeError as exc:  # a symbolic dim that a fold or a lowering cannot decide on
            raise refuse_shape_error(self, exc) from None
        outputs += [None] * (len(node.output) - len(outputs))
        wanted = [k for k, name in enumerate(node.output) if name and name in used and outputs[k] is None]
        if len(wanted) > 1 and all(node.output):  # one node for all its outputs: it runs once
            results = self.opaque(node, ALL_OUTPUTS)
            for k in wanted:
                outputs[k] = Value(node=self.graph.add_node("Get", [results], index=k))
        else:
            for k in wanted:
                outputs[k] = Value(node=self.opaque(node, k))
        return outputs

    def inline(self, node: onnx.NodeProto, branch: onnx.GraphProto) -> list[Value | None]:
        """The outputs of an If whose condition is known: its branch's nodes imported in its place (they read the
        enclosing graph's values by name, and their names are their own)."""
        label = self.label
        for t in branch.initializer:
            self.values[t.name] = Value(array=initializer_array(t), weight=True)
        used = {n for inner in branch.node for n in inner.input} | {o.name for o in branch.output}
        for k, inner in enumerate(branch.node):
            self.label = f"{node_label(inner, k)} (in the taken branch of {label})"
            for name, value in zip(inner.output, self.named_step(inner, used), strict=True):
                if name and value is not None:
                    self.values[name] = value
        self.label = label
        return [self.value(o.name) for o in branch.output]

    def fold(self, node: onnx.NodeProto, ins: list[str]) -> list[Value | None] | None:
        """Run a node whose inputs are all known with onnx's reference evaluator (a tensor Constant is read), within
        the import's fold limits (:class:`FoldLimits`); a symbolic one exactly (None where it has no exact fold)."""
        if any(is_symbolic(self.values[n].array) for n in ins if n):
            return fold_symbolic(self, node, ins, attributes(node))
        if node.op_type == "Constant" and [a.name for a in node.attribute] == ["value"]:
            return [Value(array=initializer_array(node.attribute[0].t))]
        arrays = {n: self.values[n].array for n in dict.fromkeys(ins) if n}
        for name, array in arrays.items():  # folding would keep the real part only (numpy warns, no more)
            if array.dtype.kind == "c":
                raise OnnxImportError(f"{self.label}: value {name!r} holds complex values ({array.dtype}), which MIR "
                                      f"has no dtype for ({', '.join(ONNX_DTYPES)})")
        self.check_fold_size(node, arrays)
        weight = any(self.values[n].weight for n in arrays)
        t0 = time.perf_counter()
        named = iter(self.evaluate(node, arrays))
        self.fold_seconds += time.perf_counter() - t0
        if self.fold_seconds > self.limits.max_seconds:
            raise OnnxImportError(f"{self.label}: folding the model's constants has taken {self.fold_seconds:.0f} s, "
                                  f"more than the import's limit of {self.limits.max_seconds:g} s "
                                  "(import_model(..., fold_limits=FoldLimits(max_seconds=...)))")
        return [Value(array=np.asarray(next(named)), weight=weight) if o else None for o in node.output]

    def check_fold_size(self, node: onnx.NodeProto, arrays: Mapping[str, np.ndarray]) -> None:
        """OnnxImportError naming ``node`` when folding it would make more elements than the import's limit (its
        output shapes by onnx's shape inference on its constant inputs, asked only where they can grow)."""
        limit = self.limits.max_elements
        sizes = [a.size for a in arrays.values()]
        if node.op_type not in _SIZE_FROM_VALUES and math.prod(max(s, 1) for s in sizes) <= limit:
            return  # no output of an op that reads only its inputs' shapes can pass the product of their sizes
        outputs = _inferred_sizes(node, arrays, self.model.opset_import)
        if outputs is None:
            raise OnnxImportError(f"{self.label}: its output size is not known before folding it, and folding an op "
                                  f"that can make any number of elements is bounded (limit {limit:,} elements)")
        if max(outputs, default=0) > limit:
            raise OnnxImportError(f"{self.label}: folding it would make {max(outputs):,} elements, more than the "
                                  f"import's limit of {limit:,} (import_model(..., fold_limits=FoldLimits("
                                  "max_elements=...)))")

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
        """An OnnxOp node for output ``output`` of ``node`` (:data:`ALL_OUTPUTS`: all of them): runtime inputs,
        weights, symbolic values and forms become its inputs ``in0, ...``, other known inputs initializers of its
        one-node graph (small int initializers too: pads, repeats, sizes, from which onnx's shape inference computes
        the output's shape); values its subgraphs (If, Loop, Scan) read from the enclosing graph become inputs too."""
        inputs: list[int] = []
        renamed: dict[str, str] = {"": ""}
        constants = []
        for name in [*node.input, *outer_reads(node)]:
            if name in renamed:
                continue
            v = self.value(name)
            if v.known and not is_symbolic(v.array) and (not v.weight or v.array.size <= 1 or (
                    v.array.dtype.kind in "iub" and v.array.size <= SHAPE_CONSTANT_MAX)):
                renamed[name] = f"c{len(constants)}"
                constants.append(numpy_helper.from_array(v.array, renamed[name]))
            else:
                renamed[name] = f"in{len(inputs)}"
                inputs.append(self.tensor(name))
        copy = rename_node(node, renamed)
        del copy.output[:]
        copy.output.extend(f"out{k}" if o else "" for k, o in enumerate(node.output))
        sub = helper.make_graph([copy], node.op_type, [], [], constants)
        domain = "" if node.domain == "ai.onnx" else node.domain
        if not inputs:
            why = "it is not folded (control flow can run without bound)" if node.op_type in _NOT_FOLDED else \
                "its value cannot be computed here"
            raise OnnxImportError(f"{self.label}: every input is a constant, but {why}, and an op with no runtime "
                                  "input cannot be kept as an ONNX node")
        try:
            return self.graph.add_node("OnnxOp", inputs, op_type=node.op_type, domain=domain,
                                       opset=self.opsets.get(domain or "", self.opset), output=output,
                                       proto=encode_proto(sub))
        except GraphError as exc:
            why = str(exc).partition("): ")[2] or str(exc)
            raise _refuse_opaque(self, why) from None


_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}
SHAPE_CONSTANT_MAX = 1024  # elements of an int initializer an opaque node holds as a constant (pads, sizes)


def _refuse_opaque(imp: Importer, why: str) -> OnnxImportError:
    """The error for a node kept as an ONNX node whose type cannot be known; with symbolic dims, binding them
    (which makes the shapes static) may help."""
    reason = f"{imp.label}: MIR has no op for it here, and as an ONNX node its output's type is unknown: {why}"
    if not imp.graph.symbols:
        return OnnxImportError(reason)
    return refuse(imp, reason)


def _table_lengths(graph: onnx.GraphProto) -> set[int]:
    """The axis lengths (>= 2) of the known tensors (initializers, Constant nodes) the graph slices or gathers from:
    position tables, mask and bias buffers, whose lengths are the model's limits on its symbolic dims."""
    known = {t.name: tuple(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and [a.name for a in node.attribute] == ["value"]:
            known[node.output[0]] = tuple(node.attribute[0].t.dims)
    return {d for node in graph.node if node.op_type in ("Slice", "Gather") and node.input and node.input[0] in known
            for d in known[node.input[0]] if d >= 2}


def _window_lengths(graph: onnx.GraphProto) -> set[int]:
    """The lengths ``W >= 2`` of the sliding windows a graph keeps: a one-element int constant ``-W`` that starts a
    Slice (a cache cut to its last ``W`` entries, ``past[:, :, -W:]``) or is added to a value (the window's first
    position, ``max(past - W, 0)``)."""
    known = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and [a.name for a in node.attribute] == ["value"]:
            known[node.output[0]] = node.attribute[0].t
    values = {name: numpy_helper.to_array(t) for name, t in known.items()
              if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and math.prod(t.dims) == 1
              and t.data_location != onnx.TensorProto.EXTERNAL}
    reads = [name for node in graph.node for name in (node.input[1:2] if node.op_type == "Slice" else
                                                       node.input if node.op_type == "Add" else ())]
    return {-int(values[name].reshape(-1)[0]) for name in reads if name in values
            and int(values[name].reshape(-1)[0]) <= -2}


def _squeezed(shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """``shape`` without its leading size-1 axes (a broadcast operand needs no more)."""
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return shape[k:]


def check_max_dims(max_dims: Mapping[str, int], symbols: Sequence[str]) -> dict[str, int]:
    """``max_dims`` checked: each a symbol of the model's inputs bound to an int >= 1."""
    for name, value in max_dims.items():
        if name not in symbols:
            raise OnnxImportError(f"max_dims names {name!r}, which is no symbolic dim of the model's inputs"
                                  + (f" ({', '.join(symbols)})" if symbols else " (it has none)"))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise OnnxImportError(f"max_dims: {name!r} must be bound to an int >= 1, got {value!r}")
    return dict(max_dims)


# Ops whose outputs can outgrow the product of their inputs' sizes (sizes from input values or attributes): a fold
# of one is checked first.  Others (Reshape, Slice, Gather, elementwise ops, ...) make at most that product.
_SIZE_FROM_VALUES = frozenset({"ConstantOfShape", "Expand", "Range", "Tile", "Resize", "Upsample", "Pad", "OneHot",
                               "CenterCropPad", "Col2Im", "ConvTranspose", "MaxUnpool"})


def _inferred_sizes(node: onnx.NodeProto, arrays: Mapping[str, np.ndarray],
                    opsets: Sequence[onnx.OperatorSetIdProto]) -> list[int] | None:
    """The element counts of ``node``'s outputs by onnx's shape inference on its constant inputs; None where it
    cannot say (an output dim it leaves unknown)."""
    sub = helper.make_graph([node], "size", [], [], [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    try:
        inferred = onnx.shape_inference.infer_shapes(helper.make_model(sub, opset_imports=opsets), data_prop=True)
    except Exception:  # onnx raises InferenceError and others: the size is then unknown
        return None
    types = {v.name: v.type.tensor_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    sizes = []
    for name in (o for o in node.output if o):
        t = types.get(name)
        if t is None or not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            return None
        sizes.append(math.prod(d.dim_value for d in t.shape.dim))
    return sizes


@dataclass(frozen=True)
class FoldLimits:
    """Bounds on folding a model's constants at import: the elements one folded node may make, and the seconds all
    folds may take.  Past either, the import fails naming the node (a model may hold a ``ConstantOfShape`` of
    ``[30000, 30000]`` in 127 bytes)."""

    max_elements: int = 1 << 26
    max_seconds: float = 60.0


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes as Python values (strings decoded)."""
    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def import_model(model: str | Path | onnx.ModelProto, input_shapes: Mapping[str, Sequence[Any]] | None = None,
                 max_dims: Mapping[str, int] | None = None, fold_limits: FoldLimits | None = None) -> Graph:
    """Import an ONNX model (a path or a ``ModelProto``, which is not changed) as a MIR :class:`Graph`.

    ``input_shapes`` maps input names to their dims, each an int (fixes the dim), a symbol name (keeps it symbolic
    under that name) or ``"name=hint"`` (symbolic, priced at ``hint`` by ``optimize``); a model dim bound for one
    input is bound for every input, and a ``dim_param`` left unbound stays a symbolic dim of its name.  What the
    model computes from the shapes of its inputs is folded for them, exactly when they are symbolic
    (:mod:`.symbolic`, :mod:`.forms`); ``max_dims`` (symbol -> largest value) decides the steps that hold only up to
    a size, and each fact the import relies on that holds only under a bound is listed in
    ``graph.meta["assumptions"]``.  Folding constants is bounded by ``fold_limits`` (:class:`FoldLimits`).
    A model given by path reads its external data from its own folder only.

    The graph carries the initializers in ``graph.weights`` and, in ``graph.meta``: ``"source": "onnx"`` (so
    ``optimize`` adds the ONNX rules), the inputs' symbolic dim names (``"dim_names"``), the output names
    (``"output_names"``), the default domain's opset (``"opset"``), the ONNX node name of each MIR node
    (``"node_names"``), the hints given (``"dim_hints"``) and the limits past which the model computes otherwise
    than the graph (``"guarded_limits"``, symbol -> largest value: a sliding window), which the export checks at
    run time.  Raises :class:`OnnxImportError` naming the node,
    input or op types at fault.
    """
    proto = load(model)
    check_domains(proto.graph)
    check_outputs(proto.graph)
    return Importer(proto, input_shapes or {}, max_dims, fold_limits).run()


__all__ = ["FoldLimits", "Importer", "OnnxImportError", "attributes", "import_model", "load"]
