"""The op registry: the single source of truth for every MIR op.

Each :class:`OpSpec` declares, once, an op's name (which is also its egglog
constructor), its kind (which is its cost class), its inputs (arity), its typed
attributes, its shape/dtype rule, its numpy kernel, and for composite ops its
decomposition into other ops and a sampler of valid inputs.  Graph builders,
JSON I/O, validation, the egglog datatype, the decoder, the interpreter, the
cost model and :func:`rlx_egraph.ir.decompose.decompose` are all generated from
these declarations.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from .dims import ShapeError, as_dim
from .dtypes import DTYPES
from .export import OnnxExport, OnnxWriter

if TYPE_CHECKING:
    from .graph import Graph


class Kind(StrEnum):
    """What an op is; also its cost class (see :mod:`rlx_egraph.cost`)."""

    LEAF = "leaf"
    LAYOUT = "layout"
    WEIGHT_PREP = "weight-prep"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    NORM = "norm"
    ATTENTION = "attention"
    VISION = "vision"
    LOSS = "loss"
    BACKWARD = "backward"
    FUSED = "fused"
    HOST_SYNC = "host-sync"
    OPAQUE = "opaque"  # an op kept in a foreign definition (OnnxOp): one launch, no rule matches into it
    PROJECTION = "projection"  # Get: one result of a multi-result node (no launch, no bytes)

    @property
    def launches(self) -> int:
        """Kernel launches one node of this kind costs (leaves, views and projections cost none)."""
        return 0 if self in (Kind.LEAF, Kind.LAYOUT, Kind.WEIGHT_PREP, Kind.PROJECTION) else 1


class AttrType(StrEnum):
    """Attribute value types, each with the egglog sort that carries it."""

    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"
    DTYPE = "dtype"
    INTS = "ints"
    ARRAY = "array"
    JSON = "json"

    @property
    def egglog_sort(self) -> str:
        return _EGGLOG_SORTS[self]


_EGGLOG_SORTS = {
    AttrType.INT: "i64",
    AttrType.FLOAT: "f64",
    AttrType.BOOL: "bool",
    AttrType.STR: "String",
    AttrType.DTYPE: "String",
    AttrType.INTS: "IntVec",
    AttrType.ARRAY: "String",
    AttrType.JSON: "String",
}

REQUIRED: Any = object()


def positive(value: float) -> str | None:
    """Attribute check: a finite number > 0."""
    if not math.isfinite(value) or value <= 0:
        return "must be a finite number > 0"
    return None


def at_least_one(value: int) -> str | None:
    """Attribute check: an integer >= 1."""
    return None if value >= 1 else "must be >= 1"


def non_negative(value: float) -> str | None:
    """Attribute check: a finite number >= 0."""
    if not math.isfinite(value) or value < 0:
        return "must be a finite number >= 0"
    return None


_SHORT = reprlib.Repr(maxlevel=3, maxstring=60, maxother=60, maxlist=8, maxtuple=8, maxdict=4)


def short_repr(value: Any) -> str:
    """``value``'s repr for an error message, cut to a readable length (a file may hold a megabyte of dim)."""
    return _SHORT.repr(value)


@dataclass(frozen=True)
class AttrSpec:
    """One typed attribute of an op."""

    name: str
    type: AttrType
    default: Any = REQUIRED
    choices: tuple[Any, ...] = ()
    check: Callable[[Any], str | None] | None = None
    dims: bool = False  # an INT or INTS attribute holding tensor dims: each an int or a symbolic dim

    def coerce(self, value: Any) -> Any:
        """Return ``value`` in canonical form or raise ShapeError saying why it is bad."""
        t = self.type
        if t is AttrType.INTS and isinstance(value, str | bytes | Mapping):  # "batch" is not a list of five dims
            raise ShapeError(f"attribute {self.name}={short_repr(value)} must be a list, not a "
                             f"{type(value).__name__}" + (f" (a shape of one dim is [{value!r}])"
                                                          if isinstance(value, str) else ""))
        try:
            if self.dims and t in (AttrType.INT, AttrType.INTS):
                try:
                    value = as_dim(value) if t is AttrType.INT else tuple(as_dim(v) for v in value)
                except ShapeError as exc:
                    raise ShapeError(f"attribute {self.name}={short_repr(value)}: {exc}") from None
            elif t is AttrType.INT:
                if isinstance(value, bool) or int(value) != value:
                    raise TypeError
                value = int(value)
            elif t is AttrType.FLOAT:
                if isinstance(value, bool):
                    raise TypeError
                value = float(value)
                if not math.isfinite(value):
                    raise ShapeError(f"attribute {self.name}={value} must be finite")
            elif t is AttrType.BOOL:
                if not isinstance(value, bool | np.bool_):
                    raise TypeError
                value = bool(value)
            elif t in (AttrType.STR, AttrType.JSON):
                if not isinstance(value, str):
                    raise TypeError
            elif t is AttrType.DTYPE:
                if value not in DTYPES:
                    raise ShapeError(f"attribute {self.name}={short_repr(value)} is not a dtype ({', '.join(DTYPES)})")
            elif t is AttrType.INTS:
                items = tuple(value)
                if any(isinstance(v, bool) or int(v) != v for v in items):
                    raise TypeError
                value = tuple(int(v) for v in items)
            elif t is AttrType.ARRAY:
                value = np.array(value)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ShapeError):
                raise
            raise ShapeError(f"attribute {self.name}={short_repr(value)} is not of type {t.value}") from None
        if self.choices and value not in self.choices:
            raise ShapeError(f"attribute {self.name}={short_repr(value)} must be one of {list(self.choices)}")
        if self.check is not None and (problem := self.check(value)) is not None:
            raise ShapeError(f"attribute {self.name}={short_repr(value)} {problem}")
        return value

    def sample(self, rng: np.random.Generator) -> Any:
        """A random valid value: one of the choices, a bool, or for a float the default or 10**U(-6, 0).

        Other attributes have no generic domain: their default, else the op's sampler must give them.
        """
        if self.choices:
            return pick(rng, self.choices)
        if self.type is AttrType.BOOL:
            return bool(rng.integers(2))
        if self.type is AttrType.FLOAT and (self.default is REQUIRED or rng.random() < 0.5):
            return float(10.0 ** rng.uniform(-6.0, 0.0))
        if self.default is REQUIRED:
            raise ShapeError(f"attribute {self.name!r} ({self.type.value}) has no generic random value; "
                             "the op's sampler must give it")
        return self.default


@dataclass(frozen=True)
class TensorType:
    """Shape and dtype of a tensor; a dim is an int or a symbolic dim (:mod:`rlx_egraph.ir.dims`)."""

    shape: tuple[Any, ...]
    dtype: str = "f32"

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Any:
        """An int, or a symbolic dim when the shape has symbols."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> Any:
        return self.numel * DTYPES[self.dtype].itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


# The dtype recorded for a node of a multi-result op (its results' types are in ``TupleType.parts``).
TUPLE = "tuple"


@dataclass(frozen=True)
class TupleType:
    """The type of a node of a multi-result op: one TensorType per result, read through ``Get(node, index)``."""

    parts: tuple[TensorType, ...]

    dtype = TUPLE

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.parts)

    @property
    def nbytes(self) -> int:
        """Bytes the node writes: every result."""
        return sum(p.nbytes for p in self.parts)

    def __str__(self) -> str:
        return f"({', '.join(map(str, self.parts))})"


ValueType = TensorType | TupleType
Attrs = Mapping[str, Any]
InferFn = Callable[[Attrs, list[ValueType]], ValueType]
KernelFn = Callable[..., np.ndarray]
FlopsFn = Callable[[Attrs, list[ValueType], ValueType], int]
CanonicalFn = Callable[[Attrs, list[TensorType]], dict[str, Any]]
DecomposeFn = Callable[["Graph", list[int], Attrs], int | tuple[int, ...]]
Shapes = dict[str, tuple[int, ...] | list[tuple[int, ...]]]
INDEX_DTYPE = "i64"  # the dtype of sampled index inputs (OpSpec.index_inputs)
SampleFn = Callable[[np.random.Generator], tuple[Shapes, dict[str, Any]]]
DegenerateFn = Callable[[Attrs, list[ValueType]], str | None]


def _elementwise_flops(attrs: Attrs, ins: list[ValueType], out: ValueType) -> int:
    return out.numel


@dataclass(frozen=True)
class DecompositionRule:
    """A fused op's recognition rule that is its decomposition read backwards: the subgraph ``decompose`` builds
    (its inputs and attributes as variables ``?<name>``) rewritten to the op, in stage ``stage`` under ``name``,
    where ``guards`` (egglog facts over those variables, e.g. ``(= (shape ?x) (shape ?residual))``) hold.  The rule
    is generated into the shipped rule file ``file`` (``rules/<file>``) by ``python -m rlx_egraph.rules.generate``;
    a test checks that the file holds it as generated."""

    name: str
    stage: str
    file: str
    guards: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpSpec:
    """Everything the project knows about one op.

    ``inputs`` names each input; a trailing ``?`` marks an optional input
    (only trailing inputs may be optional) and a ``*`` a variadic tail.
    ``infer`` returns the output type and raises ShapeError on bad input.
    ``kernel(attrs, *arrays)`` computes the output in the compute dtype.
    ``results`` names the results of a multi-result op (empty: one result):
    its ``infer`` returns a :class:`TupleType` of that many parts, its kernel a
    tuple of arrays, its ``decompose`` a tuple of node ids, and a node of it is
    read only through ``Get(node, index)`` (Kind.PROJECTION, no launch).  One
    name ending in ``*`` (OnnxOp's ``outputs*``): a node has one result or,
    by its attributes, several (two or more parts).

    ``decompose(g, inputs, attrs)`` appends to ``g`` the nodes of other ops
    that compute the same value from the node ids ``inputs`` and returns the
    result's id: for a fused op exactly the subgraph its rule recognises (which
    may name other fused ops; :func:`rlx_egraph.ir.decompose.decompose` repeats
    until none is left), for a composite primitive the export form the rules
    recognise.  ``sampler(rng)`` gives random input shapes by input name (a
    list for a variadic input; an optional input may be left out) and the
    attributes tied to them; see :meth:`sample`.  ``commutative`` marks a
    binary op whose inputs swap with a bit-identical result; the rule loader
    matches its patterns in both operand orders.  ``index_inputs`` names the
    inputs that hold integer indices (Embedding's ids): sampled as
    :data:`INDEX_DTYPE`, not the float dtype.  ``degenerate(attrs, input_types)``
    says why a node of these dims leaves an attribute or input without effect (a
    RoPE of head dim 2 turns by the same angle whatever its theta; a Softmax over
    one element is 1), or None: the soundness checker draws such an instance again,
    so that a rule that gets a parameter wrong is seen doing so.

    ``onnx`` is the op's ONNX export (:mod:`rlx_egraph.ir.export`): one ONNX node as data (:class:`OnnxExport`) or
    a function that writes it (:class:`OnnxWriter`); None: the exporter's own table, else the decomposition.  A
    fused op that declares one is an op the ``onnxruntime`` cost target runs.  ``cost_class`` names the measured
    cost line that prices the op on a target with per-op lines: another op's name (an op onnxruntime runs as the
    same kernel; it takes precedence over a line of the op's own) or a kind; empty: the op's own line, else its
    kind's.  ``cost_attr`` names the attribute whose value selects the kernels the op is exported as
    (FusedMatMulBiasAct's ``act``: Gemm, or MatMul + BiasGelu); on such a target each value has a line of its own
    (``Op.value``).  ``rule`` is the op's recognition rule when it is
    the decomposition read backwards (:class:`DecompositionRule`): it is generated from ``decompose``.
    """

    name: str
    kind: Kind
    inputs: tuple[str, ...]
    infer: InferFn
    kernel: KernelFn | None
    attrs: tuple[AttrSpec, ...] = ()
    flops: FlopsFn = _elementwise_flops
    doc: str = ""
    canonical: CanonicalFn | None = None
    builder: str = field(default="")
    decompose: DecomposeFn | None = None
    sampler: SampleFn | None = None
    commutative: bool = False
    results: tuple[str, ...] = ()
    index_inputs: tuple[str, ...] = ()
    degenerate: DegenerateFn | None = None
    onnx: OnnxExport | OnnxWriter | None = None
    cost_class: str = ""
    cost_attr: str = ""
    rule: DecompositionRule | None = None

    def __post_init__(self) -> None:
        if not self.builder:
            object.__setattr__(self, "builder", snake_case(self.name))

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n.rstrip("?*") for n in self.inputs)

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].endswith("*")

    @property
    def min_arity(self) -> int:
        return sum(1 for n in self.inputs if not n.endswith(("?", "*")))

    @property
    def max_arity(self) -> int | None:
        return None if self.variadic else len(self.inputs)

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)

    @cached_property
    def attr_specs(self) -> dict[str, AttrSpec]:
        """Each attribute's spec by name."""
        return {a.name: a for a in self.attrs}

    @cached_property
    def dim_attrs(self) -> tuple[AttrSpec, ...]:
        """The attributes that hold tensor dims (``AttrSpec.dims``)."""
        return tuple(a for a in self.attrs if a.dims)

    def arity_text(self) -> str:
        if self.variadic:
            return f"at least {max(self.min_arity, 1)}"
        if self.min_arity == self.max_arity:
            return str(self.min_arity)
        return f"{self.min_arity} to {self.max_arity}"

    def check_arity(self, n: int) -> None:
        low = max(self.min_arity, 1) if self.variadic else self.min_arity
        high = self.max_arity
        if n < low or (high is not None and n > high):
            raise ShapeError(f"takes {self.arity_text()} input(s) ({', '.join(self.inputs) or 'none'}), got {n}")

    def coerce_attrs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults, check types, and refuse unknown or missing attributes."""
        unknown = sorted(set(given) - set(self.attr_names))
        if unknown:
            raise ShapeError(f"unknown attribute(s) {unknown}; {self.name} takes {list(self.attr_names)}")
        out: dict[str, Any] = {}
        for spec in self.attrs:
            if spec.name in given:
                out[spec.name] = spec.coerce(given[spec.name])
            elif spec.default is REQUIRED:
                raise ShapeError(f"missing attribute {spec.name!r}")
            else:
                out[spec.name] = spec.default
        return out


    def resolve(self, given: Mapping[str, Any], ins: list[ValueType]) -> tuple[dict[str, Any], ValueType]:
        """Check arity and attributes, put them in canonical form, infer the output type.

        Canonical form: ``axis`` attributes are stored negative (-1 is the last
        axis) and ``axes`` sorted negative, so rules can match them literally.
        A multi-result value is read by projections only, and a projection reads only such a value.
        """
        self.check_arity(len(ins))
        for k, t in enumerate(ins):
            if isinstance(t, TupleType) != (self.kind is Kind.PROJECTION):
                raise ShapeError(f"input {k} is {t}: only Get reads the results of a multi-result op, one at a time"
                                 if isinstance(t, TupleType) else f"input {k} is {t}, not the results of a "
                                 "multi-result op")
        attrs = self.coerce_attrs(given)
        if ins and "axis" in attrs:
            rank = ins[0].rank
            attrs["axis"] = _axis_in(attrs["axis"], rank) - rank
        if ins and "axes" in attrs:
            rank = ins[0].rank
            attrs["axes"] = tuple(sorted(_axis_in(a, rank) - rank for a in attrs["axes"]))
        if self.canonical is not None:
            attrs = self.canonical(attrs, ins)
        out = self.infer(attrs, ins)
        parts = len(out.parts) if isinstance(out, TupleType) else 0
        if parts != len(self.results) and not (self.results[-1:] and self.results[-1].endswith("*") and parts != 1):
            raise ShapeError(f"{self.name} declares results {list(self.results)}, its shape rule gave {out}")
        return attrs, out

    def sample(self, rng: np.random.Generator, dtype: str = "f32") -> tuple[list[TensorType], dict[str, Any]]:
        """Random valid input types (all of ``dtype``) and attributes for one node of this op.

        Shapes and shape-bound attributes come from ``sampler`` (without one,
        every input gets one random shape of rank 1 to 3); the other attributes
        are drawn by :meth:`AttrSpec.sample`.  Raises ShapeError naming the op
        when the draw is not valid for it.
        """
        if self.sampler is not None:
            shapes, attrs = self.sampler(rng)
        else:
            shapes, attrs = dict.fromkeys(self.input_names, random_shape(rng, 1, 3)), {}
        unknown = sorted(set(shapes) - set(self.input_names)) + sorted(set(attrs) - set(self.attr_names))
        if unknown:
            raise ShapeError(f"{self.name} sampler gave unknown inputs/attributes {unknown}")
        types: list[TensorType] = []
        for raw, name in zip(self.inputs, self.input_names, strict=True):
            if raw.endswith("*"):
                types += [TensorType(s, dtype) for s in shapes.get(name, [])]
            elif name in shapes:
                types.append(TensorType(shapes[name], INDEX_DTYPE if name in self.index_inputs else dtype))
            elif not raw.endswith("?"):
                raise ShapeError(f"{self.name} sampler gave no shape for input {name!r}")
        try:
            attrs = {a.name: attrs[a.name] if a.name in attrs else a.sample(rng) for a in self.attrs}
            self.resolve(attrs, types)
        except ShapeError as exc:
            raise ShapeError(f"{self.name} sample {[str(t) for t in types]} {attrs} is not valid: {exc}") from None
        return types, attrs


def random_shape(rng: np.random.Generator, min_rank: int, max_rank: int, high: int = 5) -> tuple[int, ...]:
    """A shape of rank in [min_rank, max_rank] with dims in [1, high]."""
    return tuple(int(d) for d in rng.integers(1, high + 1, size=rng.integers(min_rank, max_rank + 1)))


def pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    """One of ``options``, uniformly (unlike ``rng.choice``, tuples stay tuples)."""
    return options[rng.integers(len(options))]


def _axis_in(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


REGISTRY: dict[str, OpSpec] = {}


def register(*specs: OpSpec) -> None:
    """Add op specs to the registry (names must be new)."""
    for spec in specs:
        if spec.name in REGISTRY:
            raise ValueError(f"op {spec.name!r} is already registered")
        if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", spec.name):
            raise ValueError(f"op name {spec.name!r} must be CamelCase (it is an egglog constructor)")
        REGISTRY[spec.name] = spec


def ops_of_kind(kind: Kind) -> frozenset[str]:
    """The names of the registered ops of ``kind`` (computed per call: the registry may grow)."""
    return frozenset(name for name, spec in REGISTRY.items() if spec.kind is kind)


def op_spec(name: str) -> OpSpec:
    """The spec of op ``name``; raises KeyError naming the known ops' count."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r} ({len(REGISTRY)} ops are registered)") from None


def snake_case(name: str) -> str:
    """``FusedMatMulBiasAct`` -> ``fused_mat_mul_bias_act``; ``MatMul`` -> ``matmul``."""
    special = {"MatMul": "matmul", "MatMulAT": "matmul_at", "MatMulBT": "matmul_bt", "RoPE": "rope"}
    if name in special:
        return special[name]
    name = name.replace("MatMulAT", "MatmulAt").replace("MatMulBT", "MatmulBt").replace("MatMul", "Matmul")
    name = name.replace("RoPE", "Rope").replace("SwiGLU", "Swiglu")
    name = name.replace("LN", "Ln").replace("QKV", "Qkv")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
