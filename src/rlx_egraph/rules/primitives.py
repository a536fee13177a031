"""The primitive operations rules may call, each defined once: its egglog name and its meaning in Python.

Values are Python values of the egglog sorts: ``i64`` an int in [-2^63, 2^63),
``f64`` a float, ``String`` a str, ``bool`` a bool, ``IntVec`` a tuple of ints,
``Unit`` None.  A call that egglog leaves without a value (an i64 overflow,
a division by zero, ``vec-get`` out of range, a comparison that does not hold)
raises :class:`NoValue`: in a query the match fails, in an action egglog
stops with an error.  Comparisons (``<``, ``!=``, ``vec-contains``, ...) are
*checks*: they return None (unit) when they hold, so as a query fact they
hold exactly when the call has a value.  Names that egglog overloads (``+``
on i64, f64 and String) dispatch on the arguments' Python type.

``tests/test_rule_model.py`` checks every definition against egglog itself,
edge cases included.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

I64_MIN, I64_MAX = -(2 ** 63), 2 ** 63 - 1


class NoValue(Exception):
    """A primitive or a table has no value at these arguments."""


@dataclass(frozen=True)
class Primitive:
    """One egglog primitive: ``evaluate(*args)`` is its value (NoValue where egglog's call fails)."""

    name: str
    evaluate: Callable[..., Any]
    doc: str
    check: bool = False  # returns unit: as a query fact it holds when the call has a value

    def __call__(self, *args: Any) -> Any:
        return self.evaluate(*args)

    def holds(self, *args: Any) -> bool:
        """Whether a check holds (or any primitive has a value) at ``args``."""
        try:
            self.evaluate(*args)
        except NoValue:
            return False
        return True


def same_value(a: Any, b: Any) -> bool:
    """egglog's equality of two values (the query's ``=``): floats by value with NaN equal to NaN and -0.0 to 0.0,
    vectors elementwise."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _i64(value: int) -> int:
    """``value`` if it is an i64, else NoValue (egglog's checked arithmetic)."""
    if not I64_MIN <= value <= I64_MAX:
        raise NoValue
    return value


def _wrap(value: int) -> int:
    """``value`` wrapped to 64-bit two's complement."""
    return (value + 2 ** 63) % 2 ** 64 - 2 ** 63


def _add(*args: Any) -> Any:
    if isinstance(args[0], str):
        return "".join(args)
    a, b = args
    return a + b if isinstance(a, float) else _i64(a + b)


def _sub(a: Any, b: Any) -> Any:
    return a - b if isinstance(a, float) else _i64(a - b)


def _mul(a: Any, b: Any) -> Any:
    return a * b if isinstance(a, float) else _i64(a * b)


def _truncated_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _div(a: Any, b: Any) -> Any:
    if b == 0:
        raise NoValue
    return a / b if isinstance(a, float) else _i64(_truncated_div(a, b))


def _rem(a: Any, b: Any) -> Any:
    if b == 0:
        raise NoValue
    if isinstance(a, float):
        return math.fmod(a, b)
    _i64(_truncated_div(a, b))  # i64::MIN % -1 overflows
    return a - b * _truncated_div(a, b)


def _power(a: float, b: float) -> float:
    """f64 ``^``: IEEE pow (NaN for a negative base and a fractional exponent, +-inf past the range)."""
    try:
        return math.pow(a, b)
    except ValueError:
        return math.nan
    except OverflowError:
        odd = b.is_integer() and int(b) % 2 == 1
        return -math.inf if a < 0 and odd else math.inf


def _caret(a: Any, b: Any) -> Any:
    return _power(a, b) if isinstance(a, float) else a ^ b  # f64 power, i64 xor


def _shift_amount(b: int) -> int:
    if not 0 <= b < 64:
        raise NoValue
    return b


def _shl(a: int, b: int) -> int:
    return _wrap(a << _shift_amount(b))


def _shr(a: int, b: int) -> int:
    return a >> _shift_amount(b)


def _log2(a: int) -> int:
    if a <= 0:
        raise NoValue
    return a.bit_length() - 1


def _float_min(a: float, b: float) -> float:
    return b if math.isnan(a) else a if math.isnan(b) else min(a, b)


def _float_max(a: float, b: float) -> float:
    return b if math.isnan(a) else a if math.isnan(b) else max(a, b)


def _min(a: Any, b: Any) -> Any:
    return _float_min(a, b) if isinstance(a, float) else min(a, b)


def _max(a: Any, b: Any) -> Any:
    return _float_max(a, b) if isinstance(a, float) else max(a, b)


def _abs(a: Any) -> Any:
    return abs(a) if isinstance(a, float) else _i64(abs(a))


def _to_i64(a: float) -> int:
    """f64 -> i64 as Rust's ``as``: toward zero, saturating, NaN to 0."""
    if math.isnan(a):
        return 0
    if math.isinf(a):
        return I64_MAX if a > 0 else I64_MIN
    return max(I64_MIN, min(I64_MAX, int(a)))


def _to_string(a: Any) -> str:
    if not isinstance(a, float):
        return str(a)
    if math.isnan(a) or math.isinf(a):
        return {"nan": "NaN", "inf": "inf", "-inf": "-inf"}[repr(a)]
    text = repr(a)  # Rust's Debug form: the shortest digits, an exponent outside 1e-5 <= |a| < 1e16
    mantissa, _, exponent = text.partition("e")
    if exponent:
        return f"{mantissa}e{int(exponent)}"
    return text


def _check(holds: bool) -> None:
    if not holds:
        raise NoValue


def _in_range(v: tuple, i: int) -> int:
    if not 0 <= i < len(v):
        raise NoValue
    return i


def _vec_get(v: tuple, i: int) -> Any:
    return v[_in_range(v, i)]


def _vec_set(v: tuple, i: int, x: Any) -> tuple:
    i = _in_range(v, i)
    return (*v[:i], x, *v[i + 1:])


def _vec_remove(v: tuple, i: int) -> tuple:
    i = _in_range(v, i)
    return (*v[:i], *v[i + 1:])


def _primitives(*entries: tuple[str, Callable[..., Any], str, bool]) -> dict[str, Primitive]:
    return {name: Primitive(name, fn, doc, check) for name, fn, doc, check in entries}


PRIMITIVES: dict[str, Primitive] = _primitives(
    # arithmetic: i64 checked (no value on overflow), f64 IEEE; String + concatenates
    ("+", _add, "i64/f64 sum, String concatenation", False),
    ("-", _sub, "i64/f64 difference", False),
    ("*", _mul, "i64/f64 product", False),
    ("/", _div, "i64 quotient truncated toward zero, f64 quotient; no value for a zero divisor", False),
    ("%", _rem, "i64 remainder (sign of the dividend), f64 fmod; no value for a zero divisor", False),
    ("^", _caret, "i64 bitwise xor, f64 power", False),
    ("&", lambda a, b: a & b, "i64 bitwise and", False),
    ("|", lambda a, b: a | b, "i64 bitwise or", False),
    ("<<", _shl, "i64 shift left (bits past 64 dropped); no value for a shift outside 0..63", False),
    (">>", _shr, "i64 arithmetic shift right; no value for a shift outside 0..63", False),
    ("not-i64", lambda a: ~a, "i64 bitwise not", False),
    ("log2", _log2, "i64 floor of the base-2 logarithm; no value for a <= 0", False),
    ("min", _min, "i64/f64 minimum (f64: a NaN operand gives the other)", False),
    ("max", _max, "i64/f64 maximum (f64: a NaN operand gives the other)", False),
    ("abs", _abs, "i64/f64 absolute value", False),
    ("neg", lambda a: -a, "f64 negation", False),
    ("to-f64", float, "i64 -> f64", False),
    ("to-i64", _to_i64, "f64 -> i64 toward zero, saturating, NaN -> 0", False),
    ("to-string", _to_string, "i64/f64 -> String", False),
    # comparisons: checks (unit when they hold) and their bool forms
    ("<", lambda a, b: _check(a < b), "i64/f64 check a < b", True),
    (">", lambda a, b: _check(a > b), "i64/f64 check a > b", True),
    ("<=", lambda a, b: _check(a <= b), "i64/f64 check a <= b", True),
    (">=", lambda a, b: _check(a >= b), "i64/f64 check a >= b", True),
    ("!=", lambda a, b: _check(not same_value(a, b)), "check that two values differ", True),
    ("bool-=", lambda a, b: a == b, "i64 a == b as a bool", False),
    ("bool-<", lambda a, b: a < b, "i64 a < b as a bool", False),
    ("bool->", lambda a, b: a > b, "i64 a > b as a bool", False),
    ("bool-<=", lambda a, b: a <= b, "i64 a <= b as a bool", False),
    ("bool->=", lambda a, b: a >= b, "i64 a >= b as a bool", False),
    # bool
    ("not", lambda a: not a, "bool negation", False),
    ("and", lambda a, b: a and b, "bool and", False),
    ("or", lambda a, b: a or b, "bool or", False),
    ("xor", lambda a, b: a != b, "bool exclusive or", False),
    ("=>", lambda a, b: (not a) or b, "bool implication", False),
    # String
    ("replace", lambda s, old, new: s.replace(old, new), "String replace every occurrence", False),
    ("count-matches", lambda s, sub: s.count(sub), "String non-overlapping occurrences of sub", False),
    # IntVec
    ("vec-of", lambda *xs: tuple(xs), "the vector of the arguments", False),
    ("vec-empty", lambda: (), "the empty vector", False),
    ("vec-push", lambda v, x: (*v, x), "v with x appended", False),
    ("vec-pop", lambda v: v[:-1], "v without its last element (the empty vector stays empty)", False),
    ("vec-append", lambda *vs: tuple(x for v in vs for x in v), "the vectors concatenated", False),
    ("vec-get", _vec_get, "element i of v; no value out of range", False),
    ("vec-set", _vec_set, "v with element i set to x; no value out of range", False),
    ("vec-remove", _vec_remove, "v without element i; no value out of range", False),
    ("vec-length", len, "the number of elements", False),
    ("vec-range", lambda n: tuple(range(n)), "(vec-of 0 1 ... n-1)", False),
    ("vec-contains", lambda v, x: _check(x in v), "check that v holds x", True),
    ("vec-not-contains", lambda v, x: _check(x not in v), "check that v does not hold x", True),
)
