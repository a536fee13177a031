"""Binding symbolic dims: :func:`specialize_graph`, and the sentinels a symbolic graph is optimized under.

The optimizer (egglog terms, rule guards, the fallback's matcher) works on int
dims.  A symbolic graph is optimized as a static one whose symbols are
:class:`Sentinels`: distinct primes of at least :data:`SENTINEL_FLOOR` that
divide no int of the graph and give no two different dims of the graph the same
value.  So guards that compare dims decide as they would for every value of the
symbols (equal symbols are equal, a symbol never equals a number, and a size
guard such as ``batch*seq <= 64`` fails, as it does not hold for every value),
and :meth:`Sentinels.restore` maps the optimized graph back: each dim attribute
(Reshape and Expand targets, Narrow bounds, leaf shapes) is a dim of the input
graph, or else an int times a product of sentinels (read back as that
monomial), and every re-inferred symbolic shape must give the static one at the
sentinels, or GraphError names the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dims import Dim, Sym, evaluate, symbol, symbols_of
from .graph import MAX_DIM, Graph, GraphError, Node
from .registry import AttrType, Kind

SENTINEL_FLOOR = 1009  # the smallest sentinel (a prime): above the small dims and factors graphs use
_SHIFTS = 64  # how many later windows of candidate primes are tried when a window collides


def specialize_graph(graph: Graph, binding: Mapping[str, int]) -> Graph:
    """``graph`` with every symbol replaced by its value in ``binding`` (a new graph, same ids; the weight store
    is shared).  A static graph with an empty binding is returned as is.

    GraphError naming the symbol (and an input using it) when one has no value or a bad one, or a symbol the
    graph lacks; naming the node when the values break a shape rule.
    """
    symbols = graph.symbols
    if not symbols:
        if binding:
            raise GraphError(f"specialize: unknown symbol(s) {sorted(binding)}: the graph has no symbolic dims")
        return graph
    unknown = sorted(set(binding) - set(symbols))
    if unknown:
        raise GraphError(f"specialize: unknown symbol(s) {unknown}: the graph's symbols are {', '.join(symbols)}")
    for name in symbols:
        if name not in binding:
            raise GraphError(f"specialize: no value for symbol {name!r} ({_first_use(graph, name)})")
        value = binding[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GraphError(f"specialize: symbol {name!r} must be bound to an int >= 1, got {value!r}")
    return map_dims(graph, lambda d: evaluate(d, binding), f"specialize {dict(sorted(binding.items()))}")


def bind_shapes(graph: Graph, values: Mapping[str, Any]) -> dict[str, int]:
    """The sizes the shapes of ``values`` (arrays by input name) give the symbols of ``graph``'s inputs: a dim
    that is one symbol takes the array's extent there (the other dims are checked when the graph is
    specialized).  GraphError naming the input when a value's rank differs or two inputs bind one symbol to
    two sizes; a name that is no input is left to the caller."""
    out: dict[str, int] = {}
    for node in graph.inputs:
        if node.name not in values:
            continue
        shape = np.shape(values[node.name])
        if len(shape) != len(node.shape):
            raise GraphError(f"node {node.id} (Input {node.name!r}): given an array of shape {list(shape)}, "
                             f"expected rank {len(node.shape)} {list(node.shape)}")
        for dim, size in zip(node.shape, shape, strict=True):
            if isinstance(dim, Sym) and len(dim.terms) == 1 and dim.terms[0][1] == 1 and len(dim.terms[0][0]) == 1:
                name = dim.terms[0][0][0]
                if out.setdefault(name, int(size)) != size:
                    raise GraphError(f"node {node.id} (Input {node.name!r}): symbol {name!r} is {size} here and "
                                     f"{out[name]} in an input before")
    return out


def map_dims(graph: Graph, fn: Callable[[Any], Dim], what: str) -> Graph:
    """``graph`` rebuilt with ``fn`` applied to every dim attribute (shapes are inferred again).

    A node the new dims break raises GraphError starting with ``what`` and naming it.
    """
    out = Graph(graph.name)
    for node in graph.nodes:
        attrs = {key: _map_attr(node, key, value, fn) for key, value in node.attrs.items()}
        try:
            out.add_node(node.op, node.inputs, node_id=node.id, **attrs)
        except GraphError as exc:
            raise GraphError(f"{what}: {exc}") from None
    out.set_outputs(graph.outputs)
    out.adopt_store(graph)
    return out


@dataclass(frozen=True)
class Sentinels:
    """Distinct primes standing for a graph's symbols while it is optimized as a static graph."""

    binding: dict[str, int]  # symbol -> its sentinel
    known: dict[int, Dim]  # value at the sentinels -> the dim of the graph it stands for

    @classmethod
    def choose(cls, graph: Graph) -> Sentinels:
        """The first window of primes >= SENTINEL_FLOOR (not dividing an int of ``graph``) under which every
        dim of ``graph`` keeps a value of its own below MAX_DIM in magnitude, and >= 0 for a dim of a shape (an
        attribute such as an Arange's start ``128 - sequence`` may be negative there); GraphError when none of the
        tries does."""
        symbols = graph.symbols  # not the floor atoms: they take the values their definitions give
        dims = {d for n in graph.nodes for d in n.dims()}
        shape_dims = {d for n in graph.nodes for d in n.shape}
        ints = {abs(d) for d in dims if isinstance(d, int) and d}
        primes = _primes_from(SENTINEL_FLOOR, lambda p: all(k % p for k in ints))
        window = [next(primes) for _ in symbols]
        for _ in range(_SHIFTS):
            binding = dict(zip(symbols, window, strict=True))
            known: dict[int, Dim] = {d: d for d in dims if isinstance(d, int)}
            for d in (d for d in dims if isinstance(d, Sym)):
                value = d.evaluate(binding)
                low = 0 if d in shape_dims else 1 - MAX_DIM
                if not low <= value < MAX_DIM or known.setdefault(value, d) != d:
                    break
            else:
                return cls(binding, known)
            window = [*window[1:], next(primes)]
        raise GraphError(f"cannot optimize symbolic graph {graph.name!r}: no sentinel values for "
                         f"{', '.join(symbols)} keep its dims distinct and below 2**31")

    def decode(self, value: int) -> Dim:
        """The dim ``value`` stands for: a dim of the graph, else an int times the product of the symbols whose
        sentinels divide it (an int when none does)."""
        if value in self.known:
            return self.known[value]
        rest, dim = value, 1
        for name, prime in self.binding.items():
            while rest and rest % prime == 0:
                rest //= prime
                dim *= symbol(name)
        return rest * dim

    def restore(self, static: Graph) -> Graph:
        """The symbolic graph of ``static`` (a graph at these sentinels): GraphError naming a node whose dims
        cannot be mapped back."""
        out = map_dims(static, self.decode, "cannot map the optimized graph back to symbolic dims")
        for node in static.nodes:
            shape = out.node(node.id).shape
            if tuple(evaluate(d, self.binding) for d in shape) != node.shape:
                raise GraphError(f"cannot map the optimized graph back to symbolic dims: node {node.id} "
                                 f"({node.op}) has shape {list(node.shape)} at the sentinels {self.binding}, "
                                 f"read back as {list(shape)}")
        return out

    def price(self, hints: Mapping[str, int]) -> Callable[[int], int]:
        """Value at the sentinels -> value at ``hints`` (remembered per value)."""
        memo: dict[int, int] = {}

        def at_hints(value: int) -> int:
            if value not in memo:
                memo[value] = evaluate(self.decode(value), hints)
            return memo[value]

        return at_hints


def _map_attr(node: Node, key: str, value: Any, fn: Callable[[Any], Dim]) -> Any:
    spec = next(a for a in node.spec.attrs if a.name == key)
    if not spec.dims:
        return value
    return tuple(fn(d) for d in value) if spec.type is AttrType.INTS else fn(value)


def _first_use(graph: Graph, name: str) -> str:
    """Where ``name`` shows: the first leaf (else node) that holds it."""
    node = min((n for n in graph.nodes if name in symbols_of(n.dims())), key=lambda n: n.kind is not Kind.LEAF)
    label = f"{node.op.lower()} {node.name!r}" if node.name is not None else f"node {node.id} ({node.op})"
    return f"{label} has shape {list(node.shape)}"


def _primes_from(start: int, keep: Callable[[int], bool]) -> Iterator[int]:
    """The primes >= ``start`` that ``keep`` accepts, in order."""
    n = start
    while True:
        if all(n % k for k in range(2, math.isqrt(n) + 1)) and keep(n):
            yield n
        n += 1


__all__ = ["SENTINEL_FLOOR", "Sentinels", "map_dims", "specialize_graph"]
