"""Element types of MIR tensors and how numpy stores and computes them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    """One element type: its MIR name, byte size, storage and compute numpy types."""

    name: str
    itemsize: int
    storage: type
    compute: type
    is_float: bool


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("f32", 4, np.float32, np.float32, True),
        DType("f16", 2, np.float16, np.float32, True),
        # numpy has no bfloat16: values are stored as float32 rounded to bf16 precision.
        DType("bf16", 2, np.float32, np.float32, True),
        DType("i64", 8, np.int64, np.int64, False),
        DType("i32", 4, np.int32, np.int32, False),
        DType("bool", 1, np.bool_, np.bool_, False),
    )
}

# Parity tolerances (rtol, atol) per dtype, used after fusion reorders arithmetic.  A float value
# is judged with the loosest tolerance among the float dtypes it was computed through (see
# kernels/parity.py); integer and bool values are compared exactly.
PARITY_TOLERANCE: dict[str, tuple[float, float]] = {
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 1e-3),
    "bf16": (5e-2, 1e-2),
    "i64": (0.0, 0.0),
    "i32": (0.0, 0.0),
    "bool": (0.0, 0.0),
}


def dtype(name: str) -> DType:
    """Look up a dtype by its MIR name (``"f32"``, ``"bf16"``, ...)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})") from None


def loosest(names: Iterable[str]) -> str | None:
    """The float dtype among ``names`` with the widest parity tolerance (None if none is a float)."""
    return max((n for n in names if dtype(n).is_float), key=PARITY_TOLERANCE.__getitem__, default=None)


def widened(name: str) -> str:
    """The dtype kernels compute ``name`` in: every float widens to f32, other dtypes stay."""
    return "f32" if dtype(name).is_float else name


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)  # keeps rank 0 (ascontiguousarray would not)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded = np.asarray((bits + rounding) & np.uint32(0xFFFF0000), dtype=np.uint32)
    return np.where(np.isnan(x), np.float32(np.nan), rounded.view(np.float32))


def to_storage(x: np.ndarray, name: str) -> np.ndarray:
    """Cast a computed array to how ``name`` is stored (bf16 is rounded)."""
    dt = dtype(name)
    arr = np.asarray(x)
    if arr.dtype != dt.storage:  # (numpy's error state costs more than most casts: set only for a cast)
        with np.errstate(over="ignore"):  # beyond the dtype's largest value is infinity, as IEEE rounding makes it
            arr = arr.astype(dt.storage)
    return round_bf16(arr) if name == "bf16" else arr


def to_compute(x: np.ndarray, name: str) -> np.ndarray:
    """View a stored array in the type kernels compute with (f16/bf16 widen to f32)."""
    return np.asarray(x).astype(dtype(name).compute, copy=False)
