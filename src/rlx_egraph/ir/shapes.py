"""Shape-rule helpers shared by the op declarations."""

from __future__ import annotations

import math

from .registry import ShapeError, TensorType


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy broadcasting of shapes; ShapeError when they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(f"shapes {' and '.join(map(str, map(list, shapes)))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def axis_index(axis: int, rank: int, what: str = "axis") -> int:
    """Normalise a possibly negative axis; ShapeError when out of range."""
    if not -rank <= axis < rank:
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def same_dtype(ins: list[TensorType], what: str = "inputs") -> str:
    """The common dtype of ``ins``; ShapeError when they differ."""
    kinds = {t.dtype for t in ins}
    if len(kinds) != 1:
        raise ShapeError(f"{what} have different dtypes {[t.dtype for t in ins]}")
    return kinds.pop()


def require_float(t: TensorType, what: str) -> None:
    if t.dtype not in ("f32", "f16", "bf16"):
        raise ShapeError(f"{what} must be a float tensor, got {t.dtype}")


def require_int(t: TensorType, what: str) -> None:
    if t.dtype not in ("i64", "i32"):
        raise ShapeError(f"{what} must be an integer tensor, got {t.dtype}")


def require_rank(t: TensorType, rank: int | tuple[int, ...], what: str) -> None:
    ranks = (rank,) if isinstance(rank, int) else rank
    if t.rank not in ranks:
        raise ShapeError(f"{what} must have rank {' or '.join(map(str, ranks))}, got shape {list(t.shape)}")


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...], k_a: int, k_b: int, what: str) -> tuple[int, ...]:
    """Batched matmul output shape where ``k_a``/``k_b`` index the contracted dims."""
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"{what} needs operands of rank >= 2, got {list(a)} and {list(b)}")
    if a[k_a] != b[k_b]:
        raise ShapeError(f"{what} contracts {a[k_a]} with {b[k_b]}: shapes {list(a)} and {list(b)} do not match")
    m = a[-2] if k_a == -1 else a[-1]
    n = b[-1] if k_b == -2 else b[-2]
    return (*broadcast(a[:-2], b[:-2]), m, n)


def norm_param_check(x: TensorType, p: TensorType, axis: int, what: str) -> None:
    """A norm's gamma/beta must have the normalised trailing shape."""
    start = axis_index(axis, x.rank)
    if p.shape != x.shape[start:]:
        raise ShapeError(f"{what} shape {list(p.shape)} must equal the normalised shape {list(x.shape[start:])}")


def reshape_target(src: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """Resolve one ``-1`` in ``target``; ShapeError when element counts differ."""
    if sum(1 for d in target if d == -1) > 1 or any(d < -1 or d == 0 for d in target):
        raise ShapeError(f"reshape target {list(target)} may hold positive dims and at most one -1")
    known = math.prod(d for d in target if d != -1)
    total = math.prod(src)
    if -1 in target:
        if known == 0 or total % known:
            raise ShapeError(f"cannot reshape {list(src)} to {list(target)}")
        target = tuple(total // known if d == -1 else d for d in target)
    if math.prod(target) != total:
        raise ShapeError(f"cannot reshape {list(src)} ({total} elements) to {list(target)}")
    return target
