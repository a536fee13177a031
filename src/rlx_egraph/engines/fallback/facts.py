"""What rule guards read, evaluated on the graph itself.

Primitives and the fact tables (``shape``, ``dtype``, ``param-order``, ...) mean what :mod:`rlx_egraph.rules`
defines, evaluated on the rewriter's live nodes; a rule may set a fact table's value where the graph has none.
Helper tables declared in rule files are filled by the rules that write them, and a row about a replaced node
follows it to its replacement, as egglog's tables follow unions.  A row of a tracked relation keeps the rules that
wrote it (:attr:`~rlx_egraph.rules.RuleSet.tracked`), as the egglog engine's ``wrote-`` tables do.

A node's *forms* are terms a rule unioned with it that read the node itself (``w = ConcatParams([w])``): a graph
cannot hold them without a cycle, so they are kept here, and patterns match them top-down like the node itself.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from ...ir.graph import Node
from ...ir.rewrite import GraphRewriter, node_key
from ...rules import FACT_TABLES, PRIMITIVES, Absent, Call, Declaration, FactTable, Lit, Lookup, NoValue, Term, Var

ABSENT: Any = Absent()
"""The value of ``(NoInput)`` (the term itself): an optional input that is not there."""

Tables = Mapping[str, Declaration | FactTable]
"""The tables rules read or write, by name: the fact tables and the helper relations and functions declared in rule
files."""


class Facts:
    """Every table rules read or write, for one rewriter; the fact tables read the graph through it (it is a
    :class:`rlx_egraph.rules.FactSource`)."""

    def __init__(self, rw: GraphRewriter, decls: Tables, param_order: Mapping[int, int],
                 attention_block_max_tokens: int, tracked: frozenset[str] = frozenset()) -> None:
        self.rw = rw
        self.decls = dict(decls)
        self.attention_block_max_tokens = attention_block_max_tokens
        self._node_of, self._orders = rw.nodes_by_id.get, param_order
        self.overlay: dict[str, dict[tuple, Any]] = {}
        """Values rules set in the graph's own tables (kept only where the graph has none)."""
        self.rows: dict[str, dict[tuple, Any]] = {n: {} for n in self.decls if n not in FACT_TABLES}
        # per ``tracked`` relation: row -> the rules that wrote it (see the module docstring)
        self.writers: dict[str, dict[tuple, tuple[str, ...]]] = {n: {} for n in tracked if n in self.rows}
        self._indexes: dict[str, dict[int, dict[Any, dict[tuple, None]]]] = {}  # table -> column -> its index
        self._mentions: dict[int, list[tuple[str, tuple]]] = {}  # node -> the helper rows that name it
        self._merge: dict[str, Callable[[Any, Any], Any]] = {}
        for name, decl in self.decls.items():
            if isinstance(decl, Declaration) and decl.merge is not None:
                fn = compile_term(decl.merge, {"old": 0, "new": 1}, self)
                self._merge[name] = lambda old, new, fn=fn: fn([old, new])
        self.changed = False
        """Set whenever a helper row is added or a value changes; the owner may clear it."""
        self.forms: dict[int, dict[tuple | None, Node]] = {}
        """Node -> its other forms (see the module docstring), by op, inputs and attributes."""

    def node(self, nid: int) -> Node:
        """Live node ``nid``; NoValue if there is none."""
        node = self._node_of(nid)
        if node is None:
            raise NoValue
        return node

    def param_order(self, nid: int) -> int:
        """A Param's place among the graph's Params, or the one a rule set; NoValue if none."""
        value = self._orders.get(nid)
        if value is None:
            value = self.overlay.get("param-order", {}).get((nid,))
            if value is None:
                raise NoValue
        return value

    def clear(self) -> None:
        """Forget every row and form (the rewriter was reopened on another graph); the table objects stay,
        as compiled matchers hold them."""
        indexes = [index for by_column in self._indexes.values() for index in by_column.values()]
        for table in (self.overlay, self._mentions, self.forms, *self.rows.values(), *indexes, *self.writers.values()):
            table.clear()
        self.changed = False

    # --- reading -----------------------------------------------------------------------

    def getter(self, name: str) -> Callable[..., Any]:
        """A function of the arguments giving the table's value (True for a relation row); NoValue if none."""
        if name in FACT_TABLES:  # made per call: a Facts holding it would be a reference cycle
            return partial(FACT_TABLES[name].evaluate, self)
        rows = self.rows[name]

        def get(*args: Any) -> Any:
            value = rows.get(args)
            if value is None:
                raise NoValue
            return value
        return get

    def lookup(self, name: str, bound: tuple[tuple[int, Any], ...], args: tuple | None = None
               ) -> list[tuple[tuple, Any]]:
        """Rows ``(args, value)`` of a helper table whose columns ``bound`` hold the given values; with ``args``, only
        the row ``args`` (if it exists)."""
        rows = self.rows[name]
        if args is not None:
            found: Iterable[tuple] = (args,) if args in rows else ()
        elif not bound:
            return list(rows.items())
        else:
            found, bound = self.column(name, bound[0][0]).get(bound[0][1], ()), bound[1:]
        return [(row, rows[row]) for row in found if all(row[c] == v for c, v in bound)]

    def tables_naming(self, nid: int) -> set[str]:
        """The helper tables with a row that names node ``nid``."""
        return {name for name, _ in self._mentions.get(nid, ())}

    def export(self) -> list[tuple[str, tuple, Any, tuple[str, ...]]]:
        """Every helper row: its table, arguments, value and writers (see :meth:`set`)."""
        return [(name, args, value, self.wrote(name, args)) for name, rows in self.rows.items()
                for args, value in rows.items()]

    # --- writing -----------------------------------------------------------------------

    def insert(self, name: str, args: tuple) -> None:
        self.set(name, args, True)

    def wrote(self, name: str, args: tuple) -> tuple[str, ...]:
        """The rules that wrote row ``args`` of relation ``name`` (none for an untracked one)."""
        return self.writers.get(name, {}).get(args, ())

    def set(self, name: str, args: tuple, value: Any, writers: tuple[str, ...] = ()) -> None:
        """Write a row; a function merges with the value it had (relations just add the row, and ``writers``, the
        rules that wrote it, to those it had)."""
        if name in FACT_TABLES:
            self.overlay.setdefault(name, {}).setdefault(args, value)  # the schema's tables all merge with old
            return
        rows = self.rows[name]
        old = rows.get(args)
        wrote = self.writers.get(name)
        if wrote is not None and writers:
            known = wrote.get(args, ())
            more = tuple(w for w in writers if w not in known)
            if more:
                wrote[args] = known + more
                if old is not None:  # the readers of the row pass the names on
                    self.changed = True
        if old is not None:
            merge = self._merge.get(name)
            value = merge(old, value) if merge is not None else old
            if value == old:
                return
        else:
            for column, index in self._indexes.get(name, {}).items():
                index.setdefault(args[column], {})[args] = None
            decl = self.decls[name]
            for sort, v in zip((*decl.inputs, decl.output), (*args, value), strict=True):
                for n in (v,) if sort == "Op" else v if sort == "TensorList" else ():  # the nodes it names
                    self._mentions.setdefault(n, []).append((name, args))
        rows[args] = value
        self.changed = True

    def has_form(self, nid: int, form: Node) -> bool:
        return node_key(form) in self.forms.get(nid, {})

    def add_form(self, nid: int, form: Node) -> None:
        """Record ``form`` (a node over live nodes, one of them ``nid``) as another form of ``nid``."""
        self.forms.setdefault(nid, {})[node_key(form)] = dataclasses.replace(form, id=nid)

    def replaced(self, old: int) -> None:
        """Re-key the rows that mention ``old``, and move its forms, to what now holds its value."""
        new = self.rw.find(old)
        for form in self.forms.pop(old, {}).values():
            self.add_form(new, dataclasses.replace(form, inputs=tuple(self.rw.find(i) for i in form.inputs)))
        for name, args in self._mentions.pop(old, ()):
            rows = self.rows[name]
            if args not in rows:
                continue
            value = rows.pop(args)
            writers = self.writers[name].pop(args, ()) if name in self.writers else ()
            for column, index in self._indexes.get(name, {}).items():
                index[args[column]].pop(args, None)
            self.set_moved(name, args, value, writers, self.rw.find)

    def set_moved(self, name: str, args: tuple, value: Any, writers: tuple[str, ...], node: Callable[[int], int]
                  ) -> None:
        """:meth:`set` the row ``args`` and its value with each node id in them mapped by ``node``."""
        decl = self.decls[name]

        def moved(sort: str | None, v: Any) -> Any:
            return node(v) if sort == "Op" else tuple(map(node, v)) if sort == "TensorList" else v
        self.set(name, tuple(moved(s, a) for s, a in zip(decl.inputs, args, strict=True)),
                 moved(decl.output, value), writers)

    def column(self, name: str, column: int) -> dict[Any, dict[tuple, None]]:
        """A helper table's index on one column: value -> its rows' arguments (kept up to date)."""
        by_column = self._indexes.setdefault(name, {})
        index = by_column.get(column)
        if index is None:
            index = by_column[column] = {}
            for args in self.rows[name]:
                index.setdefault(args[column], {})[args] = None
        return index


def compile_term(term: Term, slots: Mapping[str, int], facts: Facts) -> Callable[[list], Any]:
    """A function of the variable slots computing ``term`` (raises NoValue where it has no value)."""
    if isinstance(term, Var):
        return operator.itemgetter(slots[term.name])
    if isinstance(term, Lit | Absent):
        value = term.value if isinstance(term, Lit) else ABSENT
        return lambda env: value
    assert isinstance(term, Call | Lookup), term
    fn = PRIMITIVES[term.name].evaluate if isinstance(term, Call) else facts.getter(term.table)
    args = [compile_term(a, slots, facts) for a in term.args]
    if len(args) == 0:
        return lambda env: fn()
    if len(args) == 1:
        (a,) = args
        return lambda env: _guard(fn, a(env))
    if len(args) == 2:
        a, b = args
        return lambda env: _guard(fn, a(env), b(env))
    return lambda env: _guard(fn, *(a(env) for a in args))


def _guard(fn: Callable[..., Any], *args: Any) -> Any:
    """Apply a primitive; a Python error (wrong operand types, overflow) means no value."""
    try:
        return fn(*args)
    except NoValue:
        raise
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, IndexError):
        raise NoValue from None


__all__ = ["ABSENT", "Facts", "Tables", "compile_term"]
