"""Host-sync ops: the host reads a value back before the run can go on (Kind.HOST_SYNC).

Each is one launch and one sync point in the IO profile, priced at the target's
roundtrip plus its host-thunk penalty (:meth:`rlx_egraph.cost.Target.terms`):

* ``Item(x)``: ``x.item()``, the one element of ``x`` read to the host and used as a
  scalar tensor again (a loss printed, a bound computed from data).
* ``NonZero(x, count)``: a dynamic-shape output, the indices of ``x``'s non-zero
  elements (ONNX NonZero, ``torch.nonzero(x).T``).  How many there are is known only
  once the host has read it back; a graph holds the result at ``count`` columns (the
  first ``count`` non-zero elements in row-major order, -1 columns past the last).
* ``Cond(pred, then, otherwise)``: control that depends on a value, the host reads the
  one-element bool ``pred`` and goes on with ``then`` or ``otherwise`` (ONNX If over
  values both computed).
"""

from __future__ import annotations

import numpy as np

from ...kernels import reference as K
from ..registry import (
    Attrs,
    AttrSpec,
    AttrType,
    Kind,
    OpSpec,
    ShapeError,
    Shapes,
    TensorType,
    at_least_one,
    random_shape,
    register,
)

T = TensorType


def _one_element(t: T, what: str) -> None:
    if t.numel != 1:
        raise ShapeError(f"{what} must hold one element, got {list(t.shape)}")


def _item_infer(a: Attrs, ins: list[T]) -> T:
    _one_element(ins[0], "Item input")
    return T((), ins[0].dtype)


def _non_zero_infer(a: Attrs, ins: list[T]) -> T:
    if ins[0].rank < 1:
        raise ShapeError("NonZero input must have rank >= 1, got a scalar")
    return T((ins[0].rank, a["count"]), "i64")


def _non_zero_sample(rng: np.random.Generator) -> tuple[Shapes, dict]:
    shape = random_shape(rng, 1, 3)
    return {"x": shape}, {"count": int(rng.integers(1, int(np.prod(shape)) + 2))}


def _cond_infer(a: Attrs, ins: list[T]) -> T:
    pred, then, otherwise = ins
    _one_element(pred, "Cond pred")
    if pred.dtype != "bool":
        raise ShapeError(f"Cond pred must be bool, got {pred.dtype}")
    if then != otherwise:
        raise ShapeError(f"Cond branches must have one type, got then {then} and otherwise {otherwise}")
    return then


def _no_flops(a: Attrs, ins: list[T], out: T) -> int:
    return 0


HOST_SYNC = [
    OpSpec("Item", Kind.HOST_SYNC, ("x",), _item_infer, K.item, flops=_no_flops,
           doc="x.item(): the one element of x, read back to the host, as a scalar."),
    OpSpec("NonZero", Kind.HOST_SYNC, ("x",), _non_zero_infer, K.non_zero,
           (AttrSpec("count", AttrType.INT, check=at_least_one),), sampler=_non_zero_sample,
           doc="Indices [rank, count] of x's non-zero elements (the first count, -1 past the last); the host reads "
               "back how many there are."),
    OpSpec("Cond", Kind.HOST_SYNC, ("pred", "then", "otherwise"), _cond_infer, K.cond, flops=_no_flops,
           doc="then if the one-element bool pred is true, else otherwise; the host reads pred to decide."),
]
register(*HOST_SYNC)
