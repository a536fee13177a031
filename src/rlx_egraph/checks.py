"""Checks of numeric options, shared by ``optimize``'s options and the limit dataclasses of the engines.

A number option takes an int (``kind`` int: not a bool, below 2**63 because it may reach egglog as an i64) or a
real number (``kind`` float), never negative or NaN; a value of the wrong type raises TypeError, one out of
range ValueError, each message naming the option.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

INT_LIMIT = 2**63


def check_number(name: str, value: Any, kind: type) -> None:
    """Check the number option ``name`` (``kind`` int or float) against its type and range."""
    if isinstance(value, bool) or not isinstance(value, int if kind is int else int | float):
        raise TypeError(f"{name} must be {'an int' if kind is int else 'a number'}, got {show(value)}")
    low = 0
    if (isinstance(value, float) and math.isnan(value)) or value < low or (kind is int and value >= INT_LIMIT):
        bound = f"an int in [{low}, 2**63)" if kind is int else f"a number >= {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def show(value: Any) -> str:
    """``value`` for an error message: a short repr and its type."""
    return f"{reprlib.repr(value)} ({type(value).__name__})"
