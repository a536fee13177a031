"""One ONNX value as the importer holds it (:class:`Value`), and the bounds of a symbolic dim (:func:`dim_range`):
what the importer and its op tables (:mod:`.lowering`, :mod:`.symbolic`, :mod:`.form_folds`) share."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ...ir.dims import Dim, shifted
from .forms import Form


@dataclass
class Value:
    """One ONNX value: a MIR node id (runtime), a known array (``weight``: an initializer or folded from one; dtype
    object for a symbolic value, :mod:`.symbolic`), or a form (a tensor of symbolic shape made of dims,
    :mod:`.forms`)."""

    node: int | None = None
    array: np.ndarray | None = None
    weight: bool = False
    form: Form | None = None

    @property
    def known(self) -> bool:
        """An array: computable now, without the inputs' values."""
        return self.array is not None

    @property
    def runtime(self) -> bool:
        """A MIR node: a value of the inputs' data."""
        return self.node is not None



def dim_range(d: Dim, max_dims: Mapping[str, int]) -> tuple[float, float]:
    """Bounds of ``d`` for symbols in ``[1, max_dims[s]]`` (unbounded where a symbol has no maximum), by interval
    arithmetic over its monomials (sound, not always tight)."""
    d = shifted(d)  # over symbols that start at 1
    if isinstance(d, int):
        return d, d
    low = high = 0.0
    for mono, coef in d.terms:
        lo = hi = 1.0
        for s in mono:
            lo, hi = lo * 1, hi * max_dims.get(s, math.inf)
        low += coef * (lo if coef > 0 else hi)
        high += coef * (hi if coef > 0 else lo)
    return low, high
