"""The tables rule guards read, on the graph being rewritten.

Primitives and the fact tables (``shape``, ``dtype``, ``param-order``, ...)
mean what :mod:`rlx_egraph.rules` defines them to mean: the fact tables are
evaluated on the rewriter's live nodes (a rule may ``set`` a value where the
graph has none).  Helper tables declared in rule files (``relation``,
``function`` with its ``:merge``) are filled by the rules that ``set`` or
insert into them, and every row follows replacements (a row about a replaced
node then speaks of its replacement), as egglog's tables follow unions.

A node's *forms* are terms a rule unioned with it that read the node itself
(``w = ConcatParams([w])``, the start of the shared-input chain): a graph
cannot hold them without a cycle, so they are kept here, and patterns match a
node's forms top-down like the node itself, as egglog matches any node of an
e-class.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import Any

from ...ir.graph import Node
from ...ir.rewrite import GraphRewriter, node_key
from ...rules import FACT_TABLES, PRIMITIVES, NoValue
from .pattern import F, L, TableDecl, Term, V


class GraphSource:
    """The fact tables' view of the rewriter's graph (a :class:`rlx_egraph.rules.FactSource`), with the values
    rules set where the graph has none (``overlay``: table -> args -> value)."""

    def __init__(self, rw: GraphRewriter, attention_block_max_tokens: int) -> None:
        self.nodes = rw.nodes_by_id
        self.attention_block_max_tokens = attention_block_max_tokens
        self.order: dict[int, int] = {}
        self.overlay: dict[str, dict[tuple, Any]] = {}

    def node(self, nid: int) -> Any:
        node = self.nodes.get(nid)
        if node is None:
            raise NoValue
        return node

    def param_order(self, nid: int) -> int:
        value = self.order.get(nid)
        if value is None:
            value = self.overlay.get("param-order", {}).get((nid,))
            if value is None:
                raise NoValue
        return value


class Facts:
    """Every table rules read or write, for one rewriter."""

    def __init__(self, rw: GraphRewriter, decls: Mapping[str, TableDecl], attention_block_max_tokens: int) -> None:
        self.rw = rw
        self.decls = dict(decls)
        self.source = GraphSource(rw, attention_block_max_tokens)
        self.rows: dict[str, dict[tuple, Any]] = {n: {} for n, d in self.decls.items() if not d.builtin}
        self._index: dict[tuple[str, int], dict[Any, dict[tuple, None]]] = {}
        self._indexes: dict[str, list[tuple[int, dict[Any, dict[tuple, None]]]]] = {}  # table -> its indexes
        self._node_columns = {name: ([c for c, s in enumerate(d.inputs) if s == "Op"],
                                     [c for c, s in enumerate(d.inputs) if s == "TensorList"], d.output == "Op")
                              for name, d in self.decls.items()}  # where a row names nodes
        self._mentions: dict[int, list[tuple[str, tuple]]] = {}
        self._merge = {name: compile_term(d.merge, {"old": 0, "new": 1}, self)
                       for name, d in self.decls.items() if d.merge is not None}
        self.changed: set[str] = set()
        """The helper tables a row was added to or changed in; the owner may clear it."""
        self.fresh: set[int] = set()
        """Nodes named by rows added or changed since the owner last cleared it."""
        self.forms: dict[int, dict[tuple | None, Node]] = {}
        """Node -> its other forms (see the module docstring), by op, inputs and attributes."""

    def reset(self, params: list[int]) -> None:
        """Forget every row and form; ``params``: the graph's Params in declaration order."""
        for table in (self.source.overlay, self._mentions, self.forms, *self.rows.values(), *self._index.values()):
            table.clear()
        self.source.order = {nid: k for k, nid in enumerate(params)}
        self.changed = set()
        self.fresh = set()

    # --- reading -----------------------------------------------------------------------

    def getter(self, name: str) -> Callable[..., Any]:
        """A function of the arguments giving the table's value (unit for a relation row); NoValue if none."""
        table = FACT_TABLES.get(name)
        if table is not None:
            return lambda *args: table.evaluate(self.source, *args)
        rows = self.rows[name]

        def get(*args: Any) -> Any:
            value = rows.get(args, NoValue)
            if value is NoValue:
                raise NoValue
            return value
        return get

    def lookup(self, name: str, bound: tuple[tuple[int, Any], ...]) -> list[tuple[tuple, Any]]:
        """Rows ``(args, value)`` of a helper table whose columns ``bound`` hold the given values."""
        rows = self.rows[name]
        if not bound:
            return list(rows.items())
        column, value = bound[0]
        found = self.column(name, column).get(value, ())
        return [(args, rows[args]) for args in found if all(args[c] == v for c, v in bound[1:])]

    def row(self, name: str, args: tuple, bound: tuple[tuple[int, Any], ...]) -> list[tuple[tuple, Any]]:
        """The row ``args`` of a helper table as :meth:`lookup` gives it, if it exists and fits ``bound``."""
        rows = self.rows[name]
        if args not in rows or any(args[c] != v for c, v in bound):
            return []
        return [(args, rows[args])]

    # --- writing -----------------------------------------------------------------------

    def set(self, name: str, args: tuple, value: Any) -> None:
        """Write a row; a function merges with the value it had (relations just add the row)."""
        if name in FACT_TABLES:  # where the graph gives no value (every fact table merges with old)
            try:
                FACT_TABLES[name].evaluate(self.source, *args)
            except NoValue:
                self.source.overlay.setdefault(name, {}).setdefault(args, value)
            return
        rows = self.rows[name]
        old = rows.get(args, NoValue)
        if old is not NoValue:
            merge = self._merge.get(name)
            value = merge([old, value]) if merge is not None else old
            if value == old:
                return
        else:
            for column, index in self._indexes.get(name, ()):
                index.setdefault(args[column], {})[args] = None
            for n in self._nodes_in(name, args, value):
                self._mentions.setdefault(n, []).append((name, args))
        rows[args] = value
        self.changed.add(name)
        self.fresh.update(self._nodes_in(name, args, value))

    def has_form(self, nid: int, form: Node) -> bool:
        return node_key(form) in self.forms.get(nid, {})

    def add_form(self, nid: int, form: Node) -> None:
        """Record ``form`` (a node over live nodes, one of them ``nid``) as another form of ``nid``."""
        self.forms.setdefault(nid, {})[node_key(form)] = dataclasses.replace(form, id=nid)

    def replaced(self, old: int) -> None:
        """Re-key the rows that mention ``old``, and move its forms, to what now holds its value."""
        find = self.rw.find
        new = find(old)
        for form in self.forms.pop(old, {}).values():
            self.add_form(new, dataclasses.replace(form, inputs=tuple(map(find, form.inputs))))
        for name, args in self._mentions.pop(old, ()):
            rows = self.rows[name]
            if args not in rows:
                continue
            value = rows.pop(args)
            for column, index in self._indexes.get(name, ()):
                index[args[column]].pop(args, None)
            decl = self.decls[name]
            canonical = [_canonical(find, s, a) for s, a in zip(decl.inputs, args, strict=True)]
            self.set(name, tuple(canonical), _canonical(find, decl.output, value))

    def _nodes_in(self, name: str, args: tuple, value: Any) -> list[int]:
        ops, lists, value_is_op = self._node_columns[name]
        out = [args[c] for c in ops]
        for c in lists:
            out += args[c]
        if value_is_op:
            out.append(value)
        return out

    def column(self, name: str, column: int) -> dict[Any, dict[tuple, None]]:
        """A helper table's index on one column: value -> its rows' arguments (kept up to date)."""
        index = self._index.get((name, column))
        if index is None:
            index = self._index[(name, column)] = {}
            for args in self.rows[name]:
                index.setdefault(args[column], {})[args] = None
            self._indexes.setdefault(name, []).append((column, index))
        return index


def _canonical(find: Callable[[int], int], sort: str | None, value: Any) -> Any:
    if sort == "Op":
        return find(value)
    return tuple(map(find, value)) if sort == "TensorList" else value


def compile_term(term: Term, slots: Mapping[str, int], facts: Facts) -> Callable[[list], Any]:
    """A function of the variable slots computing ``term`` (raises NoValue where it has no value)."""
    if isinstance(term, V):
        return operator.itemgetter(slots[term.name])
    if isinstance(term, L):
        value = term.value
        return lambda env: value
    assert isinstance(term, F)
    primitive = PRIMITIVES.get(term.name)
    fn = primitive.evaluate if primitive is not None else facts.getter(term.name)
    args = [compile_term(a, slots, facts) for a in term.args]
    if len(args) == 1:
        (a,) = args
        return lambda env: fn(a(env))
    if len(args) == 2:
        a, b = args
        return lambda env: fn(a(env), b(env))
    return lambda env: fn(*[a(env) for a in args])
