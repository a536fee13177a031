"""Leaves whose values are made of dims: what exported models compute from the shapes of their inputs.

A symbolic dim lives in shapes; these leaves hold dims as *data*, so an imported model's position ids, causal
masks and shape arithmetic keep their symbolic sizes (:mod:`rlx_egraph.frontends.onnx.forms` builds them):

* ``Arange(start, length)``: ``start, start + 1, ..., start + length - 1`` (both dims).
* ``CausalMask(shape)``: the bool keep mask ``[..., R, C]`` whose query ``i`` sees keys ``j <= i + C - R``
  (lower-triangular when square; aligned bottom-right otherwise, as a decode step with a KV cache), broadcast
  over the leading dims.  Rules match it (``rules/onnx``), so only this form is built.
* ``DimValues(values, shape)``: an int tensor of static ``shape`` holding ``values`` (dims), row-major.

Each is priced as a leaf (no launch: the exporter computes it from the inputs' shapes, which onnxruntime does
once per run in a few tiny nodes), and is a constant once its dims are bound.
"""

from __future__ import annotations

import math

import numpy as np

from ..dims import symbols_of
from ..registry import Attrs, AttrSpec, AttrType, Kind, OpSpec, ShapeError, TensorType, register

INT_DTYPES = ("i64", "i32")


def _non_negative(value: object) -> str | None:
    try:
        return None if value >= 0 else "must be >= 0"  # type: ignore[operator]
    except ShapeError:
        return "must be >= 0 for every value of its symbols"


def _arange_type(a: Attrs, ins: list[TensorType]) -> TensorType:
    return TensorType((a["length"],), a["dtype"])


def _arange(a: Attrs) -> np.ndarray:
    return np.arange(a["start"], a["start"] + a["length"], dtype=np.int64)


def _causal_type(a: Attrs, ins: list[TensorType]) -> TensorType:
    if len(a["shape"]) < 2:
        raise ShapeError(f"CausalMask shape {list(a['shape'])} needs rank >= 2 (queries, keys)")
    return TensorType(a["shape"], "bool")


def _causal(a: Attrs) -> np.ndarray:
    rows, cols = a["shape"][-2:]
    return np.broadcast_to(np.tri(rows, cols, cols - rows, dtype=bool), a["shape"]).copy()


def _dim_values_type(a: Attrs, ins: list[TensorType]) -> TensorType:
    if math.prod(a["shape"]) != len(a["values"]):
        raise ShapeError(f"DimValues holds {len(a['values'])} values, its shape {list(a['shape'])} "
                         f"{math.prod(a['shape'])}")
    return TensorType(a["shape"], a["dtype"])


def _dim_values(a: Attrs) -> np.ndarray:
    if symbols_of(a["values"]):
        raise ShapeError(f"DimValues {list(a['values'])} is symbolic: specialize the graph to give it a value")
    return np.array(a["values"], dtype=np.int64).reshape(a["shape"])


def _dtype(default: str = "i64") -> AttrSpec:
    return AttrSpec("dtype", AttrType.DTYPE, default, choices=INT_DTYPES)


DIMS_DATA = [
    OpSpec("Arange", Kind.LEAF, (), _arange_type, _arange,
           (AttrSpec("start", AttrType.INT, 0, dims=True),
            AttrSpec("length", AttrType.INT, check=_non_negative, dims=True), _dtype()),
           doc="start, start + 1, ..., start + length - 1 (dims)."),
    OpSpec("CausalMask", Kind.LEAF, (), _causal_type, _causal,
           (AttrSpec("shape", AttrType.INTS, dims=True), AttrSpec("dtype", AttrType.DTYPE, "bool", choices=("bool",))),
           doc="Keep mask [..., R, C]: query i sees keys j <= i + C - R."),
    OpSpec("DimValues", Kind.LEAF, (), _dim_values_type, _dim_values,
           (AttrSpec("values", AttrType.INTS, dims=True), AttrSpec("shape", AttrType.INTS), _dtype()),
           doc="An int tensor of dims (row-major)."),
]
register(*DIMS_DATA)

__all__ = ["DIMS_DATA", "INT_DTYPES"]
