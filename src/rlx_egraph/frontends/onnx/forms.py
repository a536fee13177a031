"""Forms: tensors of symbolic shape that an ONNX model computes from dims alone, held exactly.

PyTorch's exporters build position ids, causal masks and index tensors from ``Shape`` of the inputs:
``Range(0, sequence)``, ``ConstantOfShape([S, S], -inf) -> Trilu``, ``kv_idx <= q_idx``, a position table
sliced to ``[:sequence]``.  With a symbolic ``sequence`` none of these is an array, so the importer keeps them
as *forms*, each an exact description of every element as a function of its index ``i``:

* :class:`Filled`: one value everywhere (``ConstantOfShape``, a broadcast constant);
* :class:`Affine`: ``offset + sum(coefs[a] * i[a])``, an integer (``Range``, positions, offsets, sums of them);
* :class:`Mask`: ``sum(coefs[a] * i[a]) <= bound``, a bool (comparisons of affine values, ``Trilu``);
* :class:`Select`: ``a`` where a mask holds, else ``b`` (``Where`` of a mask, additive masks);
* :class:`Stacked`: affine values stacked on a last axis (the index tuples of ``GatherND``).

Shape ops (Unsqueeze, Reshape of unit dims, Expand, Slice, Gather of one index, Transpose), elementwise ops
on single-valued operands and comparisons keep a form a form (:func:`fold_forms`).  Where a runtime op reads
one, it is *materialized* as MIR nodes (:meth:`Form.materialize`): ``Arange``, ``CausalMask`` (the one mask
form the rules know: a causal mask of any size), ``DimValues`` and ordinary MIR ops.  Coefficients, offsets,
bounds and sizes are dims: ints or symbolic (:mod:`rlx_egraph.ir.dims`), so every decision about them holds
for every value of the symbols, or is a ShapeError naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ...ir.dims import Dim, ShapeError, Sym, symbols_of
from ...ir.shapes import broadcast

if TYPE_CHECKING:
    from .importer import Importer


INT64 = np.dtype(np.int64)
AFFINE_CHECK_MAX = 1 << 22  # elements of a known int array checked for an affine form (position id buffers)


def is_symbolic(array: np.ndarray | None) -> bool:
    """``array`` is a symbolic value (dtype object: ints and Syms, see :mod:`.symbolic`)."""
    return isinstance(array, np.ndarray) and array.dtype == object


def _zero(d: Dim) -> bool:
    return isinstance(d, int) and d == 0


def _same(a: Dim, b: Dim) -> bool:
    """Equal for every value of the symbols (identical polynomials)."""
    return (a - b) == 0


def _align(coefs: tuple[Dim, ...], shape: tuple[Dim, ...], rank: int) -> tuple[Dim, ...]:
    """``coefs`` of a value of ``shape`` broadcast to ``rank`` (leading axes added, coefficient 0)."""
    return (0,) * (rank - len(shape)) + coefs


def _expand_coefs(coefs: tuple[Dim, ...], shape: tuple[Dim, ...], target: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Coefficients after broadcasting ``shape`` to ``target``: a size-1 axis grown has coefficient 0."""
    coefs = _align(coefs, shape, len(target))
    shape = (1,) * (len(target) - len(shape)) + tuple(shape)
    return tuple(0 if s == 1 else c for c, s in zip(coefs, shape, strict=True))


@dataclass(frozen=True)
class Form:
    """A tensor of (possibly symbolic) ``shape`` computed from dims alone; ``dtype`` a numpy dtype."""

    shape: tuple[Dim, ...]

    @property
    def dtype(self) -> np.dtype:
        raise NotImplementedError

    def expand(self, shape: tuple[Dim, ...]) -> Form:
        """Broadcast to ``shape`` (which must be the broadcast of the two)."""
        raise NotImplementedError

    def axes(self, perm: Sequence[int | None], shape: tuple[Dim, ...]) -> Form:
        """The form with axes ``perm`` (an old axis per new one; None: a new unit axis) and ``shape``."""
        raise NotImplementedError

    def shift(self, axis: int, start: Dim, length: Dim) -> Form:
        """``[start, start + length)`` of ``axis``."""
        raise NotImplementedError

    def materialize(self, imp: Importer) -> int:
        """The MIR node computing this value."""
        raise NotImplementedError

    def compact(self) -> Form:
        """The form with size 1 on each axis its value does not vary along (broadcasts back to this one)."""
        return self


@dataclass(frozen=True)
class Filled(Form):
    """Every element is ``value`` (a 0-d array)."""

    value: np.ndarray

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    def expand(self, shape: tuple[Dim, ...]) -> Form:
        return replace(self, shape=shape)

    def axes(self, perm: Sequence[int | None], shape: tuple[Dim, ...]) -> Form:
        return replace(self, shape=shape)

    def shift(self, axis: int, start: Dim, length: Dim) -> Form:
        return replace(self, shape=_set(self.shape, axis, length))

    def compact(self) -> Form:
        return replace(self, shape=(1,) * len(self.shape))

    def materialize(self, imp: Importer) -> int:
        g = imp.graph
        dt = imp.array_dtype(self.value, "a filled value")
        value = self.value.reshape(())
        leaf = g.scalar(value.item(), dt) if np.isfinite(value) else g.add_node("Constant", value=value, dtype=dt)
        return leaf if not self.shape else g.expand(leaf, shape=self.shape)


@dataclass(frozen=True)
class Affine(Form):
    """``offset + sum(coefs[a] * i[a])``: integers of numpy dtype ``kind`` (a size-1 axis has coefficient 0)."""

    coefs: tuple[Dim, ...]
    offset: Dim
    kind: np.dtype = INT64

    @property
    def dtype(self) -> np.dtype:
        return self.kind

    def expand(self, shape: tuple[Dim, ...]) -> Form:
        return replace(self, shape=shape, coefs=_expand_coefs(self.coefs, self.shape, shape))

    def axes(self, perm: Sequence[int | None], shape: tuple[Dim, ...]) -> Form:
        return replace(self, shape=shape, coefs=tuple(0 if a is None else self.coefs[a] for a in perm))

    def shift(self, axis: int, start: Dim, length: Dim) -> Form:
        return replace(self, shape=_set(self.shape, axis, length), offset=self.offset + self.coefs[axis] * start,
                       coefs=_set(self.coefs, axis, 0 if length == 1 else self.coefs[axis]))

    def compact(self) -> Form:
        return replace(self, shape=tuple(1 if _zero(c) else s for c, s in zip(self.coefs, self.shape, strict=True)))

    def plus(self, other: Affine, sign: int = 1) -> Affine:
        shape = broadcast(self.shape, other.shape)
        a = _expand_coefs(self.coefs, self.shape, shape)
        b = _expand_coefs(other.coefs, other.shape, shape)
        return Affine(shape, tuple(x + sign * y for x, y in zip(a, b, strict=True)), self.offset + sign * other.offset,
                      self.kind)

    def times(self, k: Dim) -> Affine:
        return replace(self, coefs=tuple(c * k for c in self.coefs), offset=self.offset * k)

    def materialize(self, imp: Importer) -> int:
        g, dt = imp.graph, imp.array_dtype(np.zeros((), self.kind), "an index value")
        varying = [a for a, c in enumerate(self.coefs) if not _zero(c)]
        total = None
        for a in varying:
            start = self.offset if len(varying) == 1 and self.coefs[a] == 1 else 0
            term = g.add_node("Arange", start=start, length=self.shape[a], dtype=dt)
            if self.coefs[a] != 1:
                term = g.mul(term, dim_scalar(imp, self.coefs[a], dt))
            unit = tuple(self.shape[a] if k == a else 1 for k in range(len(self.shape)))
            if len(unit) != 1:
                term = g.reshape(term, shape=unit)
            total = term if total is None else g.add(total, term)
        if total is None:
            total = dim_scalar(imp, self.offset, dt)
        elif not (len(varying) == 1 and self.coefs[varying[0]] == 1) and not _zero(self.offset):
            total = g.add(total, dim_scalar(imp, self.offset, dt))
        return imp.fit(total, self.shape) if self.shape else total


@dataclass(frozen=True)
class Mask(Form):
    """``sum(coefs[a] * i[a]) <= bound``, a bool (a size-1 axis has coefficient 0)."""

    coefs: tuple[Dim, ...]
    bound: Dim

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.bool_)

    def expand(self, shape: tuple[Dim, ...]) -> Form:
        return replace(self, shape=shape, coefs=_expand_coefs(self.coefs, self.shape, shape))

    def axes(self, perm: Sequence[int | None], shape: tuple[Dim, ...]) -> Form:
        return replace(self, shape=shape, coefs=tuple(0 if a is None else self.coefs[a] for a in perm))

    def shift(self, axis: int, start: Dim, length: Dim) -> Form:
        return replace(self, shape=_set(self.shape, axis, length), bound=self.bound - self.coefs[axis] * start,
                       coefs=_set(self.coefs, axis, 0 if length == 1 else self.coefs[axis]))

    def compact(self) -> Form:
        return replace(self, shape=tuple(1 if _zero(c) else s for c, s in zip(self.coefs, self.shape, strict=True)))

    def negate(self) -> Mask:
        """Its complement: ``sum(-coefs * i) <= -bound - 1``."""
        return replace(self, coefs=tuple(-c for c in self.coefs), bound=-self.bound - 1)

    def settled(self) -> bool | None:
        """True where the mask holds at every index for every value of the symbols, False where it holds at
        none, None otherwise (or where that cannot be decided): ``sum(coefs * i)`` over ``0 <= i < shape`` lies
        between its terms' least and greatest values (a coefficient's sign must be known)."""
        if any(not isinstance(c, int) for c in self.coefs):
            return None
        spans = [(c, c * (s - 1)) for c, s in zip(self.coefs, self.shape, strict=True)]
        high = sum((span for c, span in spans if c > 0), 0)
        low = sum((span for c, span in spans if c < 0), 0)
        try:
            if high <= self.bound:
                return True
            if low > self.bound:
                return False
        except ShapeError:
            return None
        return None

    def is_causal(self) -> bool:
        """The causal keep mask ``[..., R, C]``, ``j <= i + C - R`` (what ``CausalMask`` computes), broadcast over
        leading axes along which it does not vary."""
        if len(self.shape) < 2 or any(not _zero(c) for c in self.coefs[:-2]):
            return False
        rows, cols = self.shape[-2:]
        row, col = self.coefs[-2:]
        return col == 1 and (row == -1 or rows == 1) and _same(self.bound, cols - rows)

    def materialize(self, imp: Importer) -> int:
        g = imp.graph
        if self.is_causal():
            lead = tuple(1 for _ in self.shape[:-2])
            mask = g.add_node("CausalMask", shape=(*lead, *self.shape[-2:]))
            return imp.fit(mask, self.shape)
        total = Affine(self.shape, self.coefs, 0).materialize(imp)
        return g.less(total, dim_scalar(imp, self.bound + 1, "i64"))


@dataclass(frozen=True)
class Select(Form):
    """``a`` where ``mask`` holds, else ``b`` (0-d arrays of one dtype); the shape is the mask's."""

    mask: Mask
    a: np.ndarray
    b: np.ndarray

    @property
    def dtype(self) -> np.dtype:
        return self.a.dtype

    def _with(self, mask: Form) -> Select:
        assert isinstance(mask, Mask)
        return replace(self, mask=mask, shape=mask.shape)

    def expand(self, shape: tuple[Dim, ...]) -> Form:
        return self._with(self.mask.expand(shape))

    def axes(self, perm: Sequence[int | None], shape: tuple[Dim, ...]) -> Form:
        return self._with(self.mask.axes(perm, shape))

    def shift(self, axis: int, start: Dim, length: Dim) -> Form:
        return self._with(self.mask.shift(axis, start, length))

    def compact(self) -> Form:
        return self._with(self.mask.compact())

    def materialize(self, imp: Importer) -> int:
        g = imp.graph
        a, b = (Filled((), v).materialize(imp) for v in (self.a, self.b))
        return imp.fit(g.where(self.mask.materialize(imp), a, b), self.shape)


@dataclass(frozen=True)
class Stacked(Form):
    """Affine values of one shape stacked on a new last axis (``GatherND``'s index tuples)."""

    parts: tuple[Affine, ...]

    @property
    def dtype(self) -> np.dtype:
        return self.parts[0].dtype

    def _each(self, fn: Callable[[Affine], Form]) -> Form:
        parts = tuple(fn(p) for p in self.parts)
        assert all(isinstance(p, Affine) for p in parts)
        return Stacked((*parts[0].shape, len(parts)), parts)  # type: ignore[arg-type]

    def expand(self, shape: tuple[Dim, ...]) -> Form:
        return self._each(lambda p: p.expand(shape[:-1]))

    def axes(self, perm: Sequence[int | None], shape: tuple[Dim, ...]) -> Form:
        raise NotImplementedError  # not asked for by the exporters' forms: fold_forms declines

    def shift(self, axis: int, start: Dim, length: Dim) -> Form:
        return self._each(lambda p: p.shift(axis, start, length))

    def materialize(self, imp: Importer) -> int:
        g = imp.graph
        parts = [g.reshape(p.materialize(imp), shape=(*p.shape, 1)) for p in self.parts]
        return g.concat(parts, axis=-1)


def _set(values: tuple[Dim, ...], axis: int, value: Dim) -> tuple[Dim, ...]:
    return (*values[:axis], value, *values[axis + 1:])


def dim_scalar(imp: Importer, d: Dim, dt: str) -> int:
    """A rank-0 MIR value of ``d``: a Scalar for an int, a DimValues for a symbolic dim."""
    if isinstance(d, Sym):
        return imp.graph.add_node("DimValues", values=(d,), shape=(), dtype=dt if dt in ("i64", "i32") else "i64")
    return imp.graph.scalar(d, dt)


def unit_moves(old: tuple[Dim, ...], new: tuple[Dim, ...]) -> list[int | None] | None:
    """For a reshape that only adds or drops size-1 axes: the old axis of each new one (None: a new unit axis);
    None for any other reshape."""
    kept = [k for k, d in enumerate(old) if d != 1]
    perm: list[int | None] = []
    it = iter(kept)
    for d in new:
        if d == 1:
            perm.append(None)
            continue
        k = next(it, None)
        if k is None or (old[k] - d) != 0:
            return None
        perm.append(k)
    return perm if next(it, None) is None else None


# --- known arrays as forms --------------------------------------------------------------------------------------


def from_array(array: np.ndarray) -> Form | None:
    """A known array as a form, when it is one (constant, a causal or triangular keep mask, affine ints), so that a
    slice of it with symbolic bounds stays exact; None otherwise."""
    shape = tuple(int(d) for d in array.shape)
    if array.dtype == object or not array.size:
        return None
    flat = array.reshape(-1)
    if np.all(flat == flat[0]) and (array.dtype.kind != "f" or not np.isnan(flat[0])):
        return Filled(shape, flat[:1].reshape(()).copy())
    if array.dtype == np.bool_ and array.ndim >= 2:
        rows, cols = shape[-2:]
        lead = array.reshape(-1, rows, cols)
        counts = lead[0].sum(axis=1)
        partial = np.flatnonzero((counts > 0) & (counts < cols))
        if np.all(lead == lead[:1]) and partial.size:  # tri(rows, cols, k): row i keeps i + k + 1 keys
            diagonal = int(counts[partial[0]]) - int(partial[0]) - 1
            if np.array_equal(lead[0], np.tri(rows, cols, diagonal, bool)):
                return Mask(shape, (0,) * (len(shape) - 2) + (-1 if rows > 1 else 0, 1), diagonal)
    if array.dtype.kind in "iu" and array.size <= AFFINE_CHECK_MAX:
        offset = int(flat[0])
        coefs = []
        for axis, size in enumerate(shape):
            step = int(np.take(array, [1], axis=axis).reshape(-1)[0] - flat[0]) if size > 1 else 0
            coefs.append(step)
        index = np.indices(shape).reshape(len(shape), -1)
        if np.array_equal(flat.astype(np.int64), offset + np.tensordot(np.array(coefs, np.int64), index, axes=1)):
            return Affine(shape, tuple(coefs), offset, array.dtype)
    return None


def single(value: Any) -> Any | None:
    """The one value of a known array of one element (a dim for a symbolic one), else None."""
    if isinstance(value, np.ndarray) and value.size == 1:
        item = value.reshape(-1)[0]
        return item if isinstance(item, Sym) else item.item() if hasattr(item, "item") else item
    return None


def symbols_in(form: Form) -> set[str]:
    """The symbols a form's shape and dims hold."""
    dims: list[Any] = list(form.shape)
    for field in ("coefs", "offset", "bound"):
        value = getattr(form, field, None)
        dims += list(value) if isinstance(value, tuple) else [value]
    if isinstance(form, Select):
        dims += [*form.mask.coefs, form.mask.bound]
    return symbols_of(dims)


def numel(shape: Sequence[Dim]) -> Dim:
    return math.prod(shape)


__all__ = ["Affine", "Filled", "Form", "Mask", "Select", "Stacked", "dim_scalar", "from_array", "is_symbolic", "numel",
           "single", "symbols_in", "unit_moves"]
