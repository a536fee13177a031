"""Symbolic dimensions: a tensor dim is an int or a :class:`Sym`, an exact polynomial over named symbols.

A symbol (``"batch"``, ``"seq"``) stands for any positive int.  ``Sym`` is a
polynomial with int coefficients over symbol names, always non-constant (an
arithmetic result without symbols is a plain ``int``), so the shape rules
written for ints run unchanged: ``+``, ``-``, ``*``, ``math.prod`` and ``sum``
are exact; ``==`` is identity of polynomials (equal symbols unify, ``batch``
never equals ``4``); ``//`` and ``%`` are exact when the division is exact for
every value of the symbols; ``<``, ``<=``, ``>``, ``>=`` and truth hold when
they hold for every positive value of the symbols.  Anything else (``batch < 4``,
``seq // 2``, ``int(batch)``) raises a :class:`ShapeError` naming it, never a
wrong answer.  ``str`` and :func:`parse` round-trip: ``"batch*seq"``,
``"2*seq+4"``, ``"seq*seq"``.
"""

from __future__ import annotations

import math
import operator
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any

from ..errors import RlxError


class ShapeError(RlxError, ValueError):
    """Raised by shape rules and attribute checks; the graph adds node and op."""


Monomial = tuple[str, ...]  # symbol names, sorted, repeated for powers; () is the constant term
# Bounds on a dim expression (a model's dims are a few terms: batch*seq, 2*seq+4): every Sym made, by parsing or
# arithmetic, has at most MAX_TERMS terms of degree at most MAX_DEGREE; parse reads at most MAX_TEXT characters
# nested at most MAX_NESTING parentheses deep.  Past a bound: a ShapeError saying which.
MAX_TERMS = 64
MAX_DEGREE = 16
MAX_TEXT = 4096
MAX_NESTING = 32
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(.))")


class Sym:
    """A non-constant polynomial dim; build one with :func:`symbol` or :func:`parse`."""

    __slots__ = ("_hash", "terms")

    def __init__(self, terms: tuple[tuple[Monomial, int], ...]) -> None:
        self.terms = terms  # canonical: sorted by (-degree, monomial), no zero coefficient
        self._hash = hash(("Sym", terms))

    # --- views ----------------------------------------------------------------------------------

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbol names, sorted."""
        return tuple(sorted({s for mono, _ in self.terms for s in mono}))

    def evaluate(self, binding: Mapping[str, int]) -> int:
        """The value under ``binding`` (symbol -> int); ShapeError naming a missing symbol."""
        total = 0
        for mono, coef in self.terms:
            value = coef
            for s in mono:
                if s in binding:
                    value *= binding[s]
                elif s in _FLOORS:  # a floor atom: its value follows from the symbols it divides
                    numerator, divisor = _FLOORS[s]
                    value *= evaluate(numerator, binding) // divisor
                else:
                    raise ShapeError(f"dim {self} needs a value for symbol {s!r}")
            total += value
        return total

    def __str__(self) -> str:
        parts = []
        for k, (mono, coef) in enumerate(self.terms):
            body = "*".join(mono)
            if not mono:
                text = str(abs(coef))
            elif abs(coef) == 1:
                text = body
            else:
                text = f"{abs(coef)}*{body}"
            parts.append(("-" if coef < 0 else "+" if k else "") + text)
        return "".join(parts)

    __repr__ = __str__  # so shapes print as [batch, seq, 64] in messages

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sym):
            return self.terms == other.terms
        if isinstance(other, int):
            return False  # a Sym is never constant
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    # --- arithmetic -----------------------------------------------------------------------------

    def __add__(self, other: Any) -> Dim:
        return _combine(self, _operand(other), 1)

    def __radd__(self, other: Any) -> Dim:
        return _combine(_operand(other), self, 1)

    def __sub__(self, other: Any) -> Dim:
        return _combine(self, _operand(other), -1)

    def __rsub__(self, other: Any) -> Dim:
        return _combine(_operand(other), self, -1)

    def __neg__(self) -> Dim:
        return _make({mono: -coef for mono, coef in self.terms})

    def __pos__(self) -> Sym:
        return self

    def __mul__(self, other: Any) -> Dim:
        return _multiply(self, _operand(other))

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Dim:
        return _divide(self, _operand(other), "//")[0]

    def __rfloordiv__(self, other: Any) -> Dim:
        return _divide(_operand(other), self, "//")[0]

    def __mod__(self, other: Any) -> Dim:
        return _divide(self, _operand(other), "%")[1]

    def __rmod__(self, other: Any) -> Dim:
        return _divide(_operand(other), self, "%")[1]

    # --- decisions ------------------------------------------------------------------------------

    def __lt__(self, other: Any) -> bool:
        return _positive(_operand(other) - self, f"{self} < {other}")

    def __le__(self, other: Any) -> bool:
        return not _positive(self - _operand(other), f"{self} <= {other}")

    def __gt__(self, other: Any) -> bool:
        return _positive(self - _operand(other), f"{self} > {other}")

    def __ge__(self, other: Any) -> bool:
        return not _positive(_operand(other) - self, f"{self} >= {other}")

    def __bool__(self) -> bool:
        low, high = _range(self)
        if low > 0 or high < 0:
            return True
        raise ShapeError(f"cannot decide whether {self} != 0 for every value of {', '.join(self.symbols)}")

    def _no_value(self, *_: Any) -> Any:
        raise ShapeError(f"dim {self} is symbolic: specialize the graph to give {', '.join(self.symbols)} a value")

    __int__ = __index__ = __float__ = __round__ = _no_value


Dim = int | Sym


def symbol(name: str) -> Sym:
    """The dim of one symbol; ShapeError unless ``name`` is an identifier."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ShapeError(f"symbol name {name!r} must be an identifier (a letter or _, then letters, digits, _)")
    return Sym((((name,), 1),))


def as_dim(value: Any) -> Dim:
    """``value`` as a dim: an integral number (bool refused), a Sym, or a string parsed by :func:`parse`.

    TypeError for a value of another type or a number written as a string (``"2"`` is refused, never
    converted), ShapeError for a string that is not a dim.
    """
    if isinstance(value, Sym):
        return value
    if isinstance(value, str):
        dim = parse(value)
        if not isinstance(dim, Sym):
            raise TypeError(f"dim {value!r} is a number written as a string")
        return dim
    if isinstance(value, bool) or int(value) != value:  # int() raises TypeError for other types
        raise TypeError(f"dim {value!r} must be an int or a symbolic dim")
    return int(value)


def parse(text: str) -> Dim:
    """Parse ``"batch"``, ``"batch*seq"``, ``"2*seq+4"``, ``"(a+1)*b"``; ShapeError naming the text.

    A sum is collected term by term and made canonical once, so parsing is linear in the text's terms."""
    if len(text) > MAX_TEXT:
        raise ShapeError(f"dim {text[:40]!r}... is {len(text)} characters long (at most {MAX_TEXT})")
    tokens = [m.group(1) or m.group(2) or m.group(3) for m in _TOKEN.finditer(text) if m.group(0).strip()]
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise ShapeError(f"cannot parse dim {text!r}")
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def expr(depth: int) -> Dim:
        sign = -1 if peek() == "-" and take() else 1
        total = {mono: sign * coef for mono, coef in _terms(term(depth)).items()}
        while peek() in ("+", "-"):
            sign = 1 if take() == "+" else -1
            for mono, coef in _terms(term(depth)).items():
                total[mono] = total.get(mono, 0) + sign * coef
            if len(total) > 4 * MAX_TERMS:  # far past the bound even if some terms cancel later
                raise ShapeError(f"cannot parse dim {text[:40]!r}...: more than {MAX_TERMS} terms")
        return _make(total)

    def term(depth: int) -> Dim:
        value = factor(depth)
        while peek() == "*":
            take()
            value = value * factor(depth)
        return value

    def factor(depth: int) -> Dim:
        token = peek()
        if token is None:
            raise ShapeError(f"cannot parse dim {text!r}: it ends early")
        take()
        if token.isdigit():
            return int(token)
        if NAME.fullmatch(token):
            return symbol(token)
        if token == "(":
            if depth >= MAX_NESTING:
                raise ShapeError(f"cannot parse dim {text[:40]!r}...: parentheses nest deeper than {MAX_NESTING}")
            value = expr(depth + 1)
            if peek() != ")":
                raise ShapeError(f"cannot parse dim {text!r}: missing ')'")
            take()
            return value
        raise ShapeError(f"cannot parse dim {text!r}: unexpected {token!r}")

    value = expr(0)
    if pos != len(tokens):
        raise ShapeError(f"cannot parse dim {text!r}: unexpected {tokens[pos]!r}")
    return value


# Floor atoms: symbols that stand for floor(numerator / divisor), made by floor_div (a convolution's output length,
# ONNX's integer Div of a dim).  Named by their definition, so the same floor is the same symbol wherever it is made.
_FLOORS: dict[str, tuple[Dim, int]] = {}


class DimContext:
    """What one graph knows of its floor atoms beyond their definitions: each one's least value where more than 1
    (raised by :func:`at_least` while the context is active, e.g. by a strided Conv's shape rule).

    A :class:`~rlx_egraph.ir.graph.Graph` owns one (``graph.dims``) and activates it while it checks a node; the
    ONNX importer keeps its graph's active for the whole walk.  Facts stated in one graph never reach another:
    outside every context :func:`minimum` is 1 and :func:`at_least` records nothing."""

    __slots__ = ("minima",)

    def __init__(self, minima: Mapping[str, int] | None = None) -> None:
        self.minima: dict[str, int] = dict(minima or {})

    def minimum(self, name: str) -> int:
        """The least value of symbol ``name`` here: 1 unless a fact raised it."""
        return self.minima.get(name, 1)

    def state(self, atom: str, least: int) -> None:
        """Record that floor atom ``atom`` is at least ``least``."""
        if least > self.minima.get(atom, 1):
            self.minima[atom] = least

    @contextmanager
    def active(self) -> Iterator[DimContext]:
        """Make this the context :func:`minimum` and :func:`at_least` use, for the block's duration."""
        token = use_context(self)
        try:
            yield self
        finally:
            reset_context(token)


_CONTEXT: ContextVar[DimContext | None] = ContextVar("rlx_egraph_dim_context", default=None)


def use_context(context: DimContext | None) -> Token[DimContext | None]:
    """Make ``context`` the active one (what :meth:`DimContext.active` does, without a generator: a Graph does it
    per node); :func:`reset_context` of the token undoes it."""
    return _CONTEXT.set(context)


def reset_context(token: Token[DimContext | None]) -> None:
    """Undo the :func:`use_context` that gave ``token``."""
    _CONTEXT.reset(token)
# The facts at_least states while a shape rule runs under stated_facts (a cache of the rule's results replays them).
_STATED: ContextVar[list[tuple[str, int]] | None] = ContextVar("rlx_egraph_stated_dim_facts", default=None)


def active_minima() -> dict[str, int]:
    """The floor atoms' least values in the active :class:`DimContext` (a copy; empty outside every context)."""
    context = _CONTEXT.get()
    return {} if context is None else dict(context.minima)


@contextmanager
def stated_facts() -> Iterator[list[tuple[str, int]]]:
    """Collect the facts (floor atom, least value) :func:`at_least` states in the block, in order."""
    facts: list[tuple[str, int]] = []
    token = _STATED.set(facts)
    try:
        yield facts
    finally:
        _STATED.reset(token)


def state_facts(facts: Iterable[tuple[str, int]]) -> None:
    """Record ``facts`` (from :func:`stated_facts`) in the active context, as :func:`at_least` did."""
    context = _CONTEXT.get()
    for atom, least in facts:
        if context is not None:
            context.state(atom, least)
        if (stated := _STATED.get()) is not None:
            stated.append((atom, least))


def floor_div(a: Dim, divisor: int) -> Dim:
    """``floor(a / divisor)`` for an int ``divisor >= 1`` and a dim ``a >= 0``: an int or the exact polynomial where
    the division is exact, else a polynomial over a *floor atom* (a symbol standing for ``floor(b / divisor)``, with
    ``b`` the part of ``a`` the division leaves: ``floor((samples - 10) / 5)`` is ``samples_div5 - 2``).

    Canonical, so equal floors meet: the multiples of ``divisor`` come out of the floor and the rest keeps
    coefficients in ``[0, divisor)``; a floor of an atom plus an int is one floor (``floor((floor(s / 5) - 4) / 2)``
    is ``floor(s / 10) - 2``).  A floor atom is a symbol like any other: taken as >= 1 by comparisons (the caller
    records that where it matters, :func:`floor_atoms`), evaluated from its definition (:meth:`Sym.evaluate`).
    """
    if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor < 1:
        raise ShapeError(f"floor division of {a} by {divisor!r}: the divisor must be an int >= 1")
    if isinstance(a, int):
        return a // divisor
    terms = dict(a.terms)
    atoms = [mono for mono in terms if len(mono) == 1 and mono[0] in _FLOORS]
    if len(atoms) == 1 and set(terms) <= {atoms[0], ()} and terms[atoms[0]] == 1:  # floor(floor(q / b) + k) / c)
        numerator, inner = _FLOORS[atoms[0][0]]
        return floor_div(numerator + terms.get((), 0) * inner, inner * divisor)
    whole = {mono: coef // divisor for mono, coef in terms.items()}
    rest = {mono: coef % divisor for mono, coef in terms.items()}
    left = _make(rest)
    if isinstance(left, int):
        return _make(whole) + left // divisor
    name = f"{_identifier(left)}_div{divisor}"
    k = 1
    while _FLOORS.setdefault(name, (left, divisor)) != (left, divisor):  # a name another floor took
        name, k = f"{_identifier(left)}_div{divisor}_{k}", k + 1
    return _make(whole) + symbol(name)


def minimum(name: str) -> int:
    """The least value symbol ``name`` takes in the active :class:`DimContext`: 1, or more for a floor atom that
    :func:`at_least` raised there."""
    context = _CONTEXT.get()
    return 1 if context is None else context.minimum(name)


def shifted(d: Dim) -> Dim:
    """``d`` over symbols that start at 1: each floor atom ``a`` whose least value is ``m > 1`` written as
    ``a + m - 1`` (``a - 1`` with ``a >= 2`` is ``a``), so that sign decisions see its least value."""
    if isinstance(d, int) or not any(minimum(s) > 1 for s in d.symbols):
        return d
    out: Dim = 0
    for mono, coef in d.terms:
        out = out + coef * math.prod((symbol(s) + minimum(s) - 1 for s in mono), start=1)
    return out


def at_least(d: Dim, least: int) -> None:
    """Record in the active :class:`DimContext` that ``d`` (a floor atom plus an int: a convolution's output length)
    is at least ``least``, raising the atom's :func:`minimum`; nothing for other dims."""
    if isinstance(d, int) or len(d.symbols) != 1 or d.symbols[0] not in _FLOORS:
        return
    terms = dict(d.terms)
    atom = (d.symbols[0],)
    if set(terms) <= {atom, ()} and terms[atom] == 1:
        state_facts([(atom[0], least - terms.get((), 0))])


def _identifier(d: Sym) -> str:
    """``d`` spelled as an identifier (``2*s+3`` is ``2xs_p3``)."""
    return str(d).replace("*", "x").replace("+", "_p").replace("-", "_m")


def floor_atoms(dims: Iterable[Any]) -> dict[str, tuple[Dim, int]]:
    """The floor atoms in ``dims`` (dims, or symbol names) and in their definitions: name -> (numerator, divisor)."""
    out: dict[str, tuple[Dim, int]] = {}
    given = list(dims)
    todo = sorted(symbols_of(given) | {d for d in given if isinstance(d, str)})
    while todo:
        name = todo.pop()
        if name in _FLOORS and name not in out:
            out[name] = _FLOORS[name]
            todo.extend(symbols_of([out[name][0]]))
    return dict(sorted(out.items()))


def free_symbols(dims: Iterable[Any]) -> tuple[str, ...]:
    """The symbols a value of ``dims`` (dims, or symbol names) needs, sorted: a floor atom's are those of its
    definition."""
    given = list(dims)
    atoms = floor_atoms(given)
    names = symbols_of(given) | {d for d in given if isinstance(d, str)}
    return tuple(sorted((names | symbols_of(n for n, _ in atoms.values())) - set(atoms)))


def evaluate(dim: Dim, binding: Mapping[str, int]) -> int:
    """``dim``'s value under ``binding`` (an int stays itself)."""
    return dim.evaluate(binding) if isinstance(dim, Sym) else dim


def symbols_of(dims: Iterable[Any]) -> set[str]:
    """The symbol names in ``dims`` (ints and other values contribute none)."""
    return {s for d in dims if isinstance(d, Sym) for s in d.symbols}


def to_json(dim: Dim) -> int | str:
    """An int, or the Sym's string (what :func:`as_dim` reads back)."""
    return str(dim) if isinstance(dim, Sym) else dim


# --- polynomial arithmetic ----------------------------------------------------------------------


def _operand(value: Any) -> Dim:
    if isinstance(value, Sym):
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"unsupported operand for a symbolic dim: {value!r}")
    return operator.index(value)


def _terms(d: Dim) -> dict[Monomial, int]:
    return dict(d.terms) if isinstance(d, Sym) else ({(): d} if d else {})


def _make(terms: Mapping[Monomial, int]) -> Dim:
    """The canonical dim of ``terms``: an int when no symbol is left."""
    kept = {mono: coef for mono, coef in terms.items() if coef}
    if not any(kept):  # only the constant term (or nothing) is left
        return kept.get((), 0)
    if len(kept) > MAX_TERMS:
        raise ShapeError(f"a dim expression of {len(kept)} terms is too large (at most {MAX_TERMS})")
    if (degree := max(map(len, kept))) > MAX_DEGREE:
        raise ShapeError(f"a dim expression of degree {degree} is too large (at most {MAX_DEGREE})")
    return Sym(tuple(sorted(kept.items(), key=lambda t: (-len(t[0]), t[0]))))


def _combine(a: Dim, b: Dim, sign: int) -> Dim:
    out = _terms(a)
    for mono, coef in _terms(b).items():
        out[mono] = out.get(mono, 0) + sign * coef
    return _make(out)


def _multiply(a: Dim, b: Dim) -> Dim:
    out: dict[Monomial, int] = {}
    for ma, ca in _terms(a).items():
        for mb, cb in _terms(b).items():
            mono = tuple(sorted(ma + mb))
            out[mono] = out.get(mono, 0) + ca * cb
    return _make(out)


def _divide(a: Dim, b: Dim, op: str) -> tuple[Dim, Dim]:
    """Exact ``(a // b, a % b)`` when it is the same for every value of the symbols, else ShapeError."""
    if b == 0:
        raise ShapeError(f"{a} {op} 0: division by zero")
    if isinstance(b, int):
        consts = _terms(a).pop((), 0)
        if all(coef % b == 0 for mono, coef in _terms(a).items() if mono):
            quotient = _make({mono: coef // b for mono, coef in _terms(a).items() if mono})
            return quotient + consts // b, consts % b
    else:
        bool(b)  # ShapeError unless b != 0 for every value of its symbols
        quotient = 0 if a == 0 else _exact_quotient(_terms(a), _terms(b))
        if quotient is not None:
            return quotient, 0
    raise ShapeError(f"cannot decide {a} {op} {b} for every value of {', '.join(sorted(symbols_of((a, b))))}")


def _exact_quotient(a: dict[Monomial, int], b: dict[Monomial, int]) -> Dim | None:
    """``a / b`` when it is a polynomial with int coefficients (``(64*batch*past + 64*batch) / (16*past + 16)``
    is ``4*batch``), by long division in graded lexicographic order; None when there is a remainder."""
    names = sorted({s for mono in (*a, *b) for s in mono})

    def order(mono: Monomial) -> tuple[int, tuple[int, ...]]:
        return len(mono), tuple(mono.count(s) for s in names)

    lead_b = max(b, key=order)
    need = Counter(lead_b)
    rest, out = dict(a), {}
    while rest:
        lead = max(rest, key=order)
        have = Counter(lead)
        if need - have or rest[lead] % b[lead_b]:
            return None
        mono, coef = tuple(sorted((have - need).elements())), rest[lead] // b[lead_b]
        out[mono] = coef
        for mb, cb in b.items():
            term = tuple(sorted(mono + mb))
            rest[term] = rest.get(term, 0) - coef * cb
            if not rest[term]:
                del rest[term]
    return _make(out)


def _range(d: Sym) -> tuple[float, float]:
    """Bounds of ``d`` over every value of its symbols (>= 1, a floor atom >= its :func:`minimum`), written over
    symbols that start at 1 (:func:`shifted`): with all non-constant coefficients >= 0 its least value is at 1 (the
    sum of its coefficients); with all <= 0 that is its largest."""
    d = shifted(d)
    at_one = sum(coef for _, coef in d.terms)
    coefs = [coef for mono, coef in d.terms if mono]
    low = at_one if all(c >= 0 for c in coefs) else float("-inf")
    high = at_one if all(c <= 0 for c in coefs) else float("inf")
    return low, high


def _positive(d: Dim, what: str) -> bool:
    """Whether ``d > 0`` for every value of its symbols (False when it is never), else ShapeError naming ``what``."""
    if isinstance(d, int):
        return d > 0
    low, high = _range(d)
    if low > 0:
        return True
    if high <= 0:
        return False
    raise ShapeError(f"cannot decide {what} for every value of {', '.join(d.symbols)}")


__all__ = ["MAX_DEGREE", "MAX_NESTING", "MAX_TERMS", "MAX_TEXT", "NAME", "Dim", "DimContext", "Sym", "active_minima",
           "as_dim", "at_least", "evaluate", "floor_atoms", "floor_div", "free_symbols", "minimum", "parse",
           "reset_context", "shifted", "state_facts", "stated_facts", "symbol", "symbols_of", "to_json",
           "use_context"]
