"""The part of Cython's ``cython`` module that the accelerated modules use when they run as Python, for a machine
without Cython: every decorator returns what it decorates, ``nogil`` and ``gil`` do nothing.  (Compiled, Cython
reads these names itself; with Cython installed, its own module serves.)  Type annotations such as
``cython.int[::1]`` are never evaluated: the modules postpone their annotations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

compiled = False


def _unchanged(thing: Any) -> Any:
    return thing


cclass = cfunc = ccall = final = inline = no_gc = _unchanged


def exceptval(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    return _unchanged


class _GilState:
    """``nogil`` and ``gil``: a context manager, and a decorator, that do nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, function: Any) -> Any:
        return function


nogil = gil = _GilState()
