"""The fact tables rules read, each defined once: its egglog declaration and its meaning on a graph.

The optimizer fills these tables from the graph (rules may add rows for the
terms they build with ``set``); rule guards read them:

* ``(shape ?x)`` -> ``IntVec``: the dims of node ``?x`` (a multi-result node has none: its ``Get`` parts do)
* ``(dtype ?x)`` -> ``String``: its dtype
* ``(param-order ?w)`` -> ``i64``: the declaration order of a Param among the graph's Params
* ``(attention-block-max-tokens)`` -> ``i64``: the batch*seq threshold of FusedAttentionBlock (an option)
* ``(inverse-perms ?p ?q)``: a relation: ``p`` and ``q``, perms of the graph's Transposes, undo each other

Functions merge with ``old``: the first value written stays.  A table's
meaning is :meth:`FactTable.evaluate` over a :class:`FactSource` (the graph as
the optimizer sees it); :meth:`FactTable.rows` lists the rows a graph gives
it, as the egglog encoder writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ..ir.graph import Graph, GraphError
from .primitives import NoValue
from .signatures import INT_VEC, OP

ATTENTION_BLOCK_MAX_TOKENS = 64  # the option's default


class FactSource(Protocol):
    """What the fact tables read of a graph."""

    attention_block_max_tokens: int

    def node(self, nid: int) -> Any:
        """Node ``nid`` (with ``shape``, ``dtype``, ``op`` and ``parts``); NoValue if there is none."""

    def param_order(self, nid: int) -> int:
        """Node ``nid``'s place among the graph's Params in declaration order; NoValue if it is no Param."""


class GraphFacts:
    """A :class:`FactSource` over an IR graph."""

    def __init__(self, graph: Graph, attention_block_max_tokens: int = ATTENTION_BLOCK_MAX_TOKENS) -> None:
        self.graph = graph
        self.attention_block_max_tokens = attention_block_max_tokens
        self._order = {n.id: k for k, n in enumerate(graph.params)}

    def node(self, nid: int) -> Any:
        try:
            return self.graph.node(nid)
        except GraphError:
            raise NoValue from None

    def param_order(self, nid: int) -> int:
        order = self._order.get(nid)
        if order is None:
            raise NoValue
        return order


@dataclass(frozen=True)
class FactTable:
    """One fact table: a function (``output`` set) or a relation (``output`` None; its value is unit)."""

    name: str
    inputs: tuple[str, ...]
    output: str | None
    doc: str
    evaluate: Callable[..., Any]  # (FactSource, *args) -> value; NoValue where the graph gives none
    domain: Callable[[Graph], Iterable[tuple[Any, ...]]]  # the argument tuples the encoder writes rows for

    @property
    def declaration(self) -> str:
        """The egglog declaration."""
        if self.output is None:
            return f"(relation {self.name} ({' '.join(self.inputs)}))"
        return f"(function {self.name} ({' '.join(self.inputs)}) {self.output} :merge old)"

    def rows(self, graph: Graph, source: FactSource) -> Iterator[tuple[tuple[Any, ...], Any]]:
        """``(args, value)`` for every row ``graph`` gives this table."""
        for args in self.domain(graph):
            try:
                yield args, self.evaluate(source, *args)
            except NoValue:
                continue


def _single(source: FactSource, nid: int) -> Any:
    node = source.node(nid)
    if node.parts:  # a multi-result node has no one shape or dtype: its Gets have theirs
        raise NoValue
    return node


def inverse_perm(perm: tuple[int, ...]) -> tuple[int, ...]:
    """The perm that undoes ``perm``."""
    return tuple(sorted(range(len(perm)), key=perm.__getitem__))


def _inverse_perms(source: FactSource, p: tuple[int, ...], q: tuple[int, ...]) -> None:
    if sorted(p) != list(range(len(p))) or inverse_perm(p) != tuple(q):
        raise NoValue


def _perm_pairs(graph: Graph) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    perms = {n.attrs["perm"] for n in graph.nodes if n.op == "Transpose"}
    return [(p, inverse_perm(p)) for p in sorted(perms) if inverse_perm(p) in perms]


def _nodes(graph: Graph) -> list[tuple[int]]:
    return [(n.id,) for n in graph.nodes]


FACT_TABLES: dict[str, FactTable] = {t.name: t for t in (
    FactTable("shape", (OP,), INT_VEC, "the dims of a node", lambda s, n: tuple(_single(s, n).shape), _nodes),
    FactTable("dtype", (OP,), "String", "the dtype of a node", lambda s, n: str(_single(s, n).dtype), _nodes),
    FactTable("param-order", (OP,), "i64", "a Param's place among the graph's Params in declaration order",
              lambda s, n: s.param_order(n), lambda g: [(n.id,) for n in g.params]),
    FactTable("attention-block-max-tokens", (), "i64", "the batch*seq threshold of FusedAttentionBlock",
              lambda s: s.attention_block_max_tokens, lambda g: [()]),
    FactTable("inverse-perms", (INT_VEC, INT_VEC), None, "two perms of the graph's Transposes that undo each other",
              _inverse_perms, _perm_pairs),
)}
