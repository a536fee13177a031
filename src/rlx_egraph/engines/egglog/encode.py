"""Graph -> egglog: the nodes as rows of plain values, and one rule per op that builds their terms.

egglog compiles every action it is given, at top level or in a rule, at some 40 us each:
a graph written as terms and shape facts cost ~150 us per node before anything ran.  So
the graph is written as rows of primitive values, one relation per op present,
``rlx-row-<Op>``: the node id, then per constructor argument an input's node id or the
attribute's value.  :meth:`Encoding.load` feeds the rows to egglog's ``input`` command from
tab-separated files (no compilation per row), and one rule per op, run once, builds
``(union (rlx-node id) (<Op> (rlx-node a) ...))``.  ``(rlx-node i)`` is an unextractable
constructor naming node ``i``'s e-class: no rule recurses, so one iteration builds a graph
of any depth.  Values that are no primitive of a row: an ``IntVec`` by the id of its row in
``rlx-vec`` (each distinct tuple once), a bool by its row in ``rlx-bool``, an absent
optional input as node :data:`NO_INPUT_ID` (the class of ``(NoInput)``), a variadic input
list by its id in ``rlx-list`` (built from ``rlx-row-TCons`` rows, one per distinct suffix).
The shape and dtype facts (one row per node) and the param-order facts are rows too.

Every value reads back exactly: any Python str (:func:`stored_string`), a constant array by
its bit-exact content key (:func:`array_key`), and a Scalar -0.0, which egglog's f64 would
equate with 0.0, as ``(Neg (Scalar 0.0 dtype))`` (rows ``rlx-row-neg-zero``).
:attr:`Encoding.text` is the same program with the rows written as facts: it runs as-is.

:func:`graph_terms` writes the same graph for a person to read: one global per node,
``(let $n3 (MatMul $n0 $n1))``, with its shape facts on the same line.  It builds the same
e-graph (less the ``rlx-node`` tables) and re-runs in egglog as-is, but egglog compiles each of
its commands (~150 us per node), so it is the form for small graphs;
``dump_egglog_program(graph, form="terms")`` gives the whole program in it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ...ir.graph import Graph, Node
from ...ir.registry import REGISTRY, AttrType, OpSpec
from ...rules.flat import is_negative_zero_scalar
from ...rules.signatures import node_arg
from .rules import load_rules
from .schema import LIST_CONS, LIST_NIL, NO_INPUT, constructor_args, schema_text

# Node i's e-class: an unextractable constructor, unioned with the node's term by the loading rules.
NODE_TABLE = "rlx-node"
# A variadic input list's TensorList class, by list id.
LIST_TABLE = "rlx-list"
# Every distinct int tuple (shapes, perms, axes) once, by id; every bool by 0 / 1.
VEC_TABLE = "rlx-vec"
BOOL_TABLE = "rlx-bool"
# The node id of an absent optional input: its rlx-node is unioned with (NoInput).
NO_INPUT_ID = -1
# The ruleset of the loading rules, run once.
LOAD_RULESET = "rlx-load"
ROW_PREFIX = "rlx-row-"
NEG_ZERO_ROWS = f"{ROW_PREFIX}neg-zero"
# The facts filled from rows: relation -> the sorts of its columns after the node id (c0, c1, ...), what its
# rule's query adds, and the (table, value) pairs it sets for the node (a shape goes by its IntVec's id).
FACT_ROWS = {"type": (("i64", "String"), f" (= s ({VEC_TABLE} c0))", (("shape", "s"), ("dtype", "c1"))),
             "param-order": (("i64",), "", (("param-order", "c0"),))}

Row = tuple[int | float | str, ...]
# Rows per file that egglog reads (see Encoding.load): its reading of one file hides our writing of the next.
ROWS_PER_FILE = 2_000


def literal(value: Any, kind: AttrType) -> str:
    """An attribute value as an egglog literal of its sort."""
    if kind is AttrType.INT:
        return str(int(value))
    if kind is AttrType.FLOAT:
        return repr(float(value))
    if kind is AttrType.BOOL:
        return "true" if value else "false"
    if kind is AttrType.INTS:
        return f"(vec-of {' '.join(map(str, value))})" if value else "(vec-empty)"
    return string_literal(str(value))


# Prefix of a string stored in its JSON-escaped (ASCII) form; see stored_string.
ESCAPED_MARK = "rlx-escaped:"


def stored_string(text: str) -> str:
    """``text`` as the e-graph stores it; :func:`string_value` reads back exactly ``text``.

    Printable text is stored as is.  Text with any other character (tabs, newlines,
    controls, format characters such as RTL marks, lone surrogates), with a leading or
    trailing space (egglog trims the fields of a row), or starting with :data:`ESCAPED_MARK`
    is stored as the mark followed by its JSON escape, spaces as ``\\u0020``, so every
    Python str has one distinct stored form that is a valid field of a tab-separated row.
    """
    if text.startswith(ESCAPED_MARK) or not text.isprintable() or text != text.strip(" "):
        return ESCAPED_MARK + json.dumps(text)[1:-1].replace(" ", "\\u0020")
    return text


def string_literal(text: str) -> str:
    """``text`` as an egglog String literal of its stored form (:func:`stored_string`)."""
    return '"' + stored_string(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def string_value(stored: str) -> str:
    """The Python str that :func:`stored_string` stored as ``stored``."""
    if stored.startswith(ESCAPED_MARK):
        return json.loads(f'"{stored[len(ESCAPED_MARK):]}"')
    return stored


def array_key(value: np.ndarray) -> str:
    """Content key of a constant array, so equal constants share one e-class."""
    digest = hashlib.sha1(f"{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
    return f"const:{digest.hexdigest()[:20]}"


# Row column sort per attribute type (an IntVec and a bool go by id).
_COLUMN_SORT = {AttrType.INT: "i64", AttrType.FLOAT: "f64", AttrType.BOOL: "i64", AttrType.INTS: "i64"}


@dataclass
class Encoding:
    """The graph part of an egglog program: declarations, rows, loading rules, graph-wide facts;
    and what decoding needs to undo it."""

    declarations: str  # the tables, the vec and bool rows
    rows: dict[str, list[Row]]  # relation -> its rows (strings in their stored form)
    rules: str  # the loading rules, their run, then the graph-wide facts
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    def load(self, egraph: Any) -> None:
        """Run the program on ``egraph``: the rows through tab-separated files and ``input``.  egglog reads
        each file in a second thread while the next one is written (it lets go of the GIL while it works), so
        the writing hides behind egglog's reading, all but the first file's writing and the last file's reading:
        so a file holds at most :data:`ROWS_PER_FILE` rows.  The program is :meth:`write_rows`', in the same
        order."""
        with tempfile.TemporaryDirectory(prefix="rlx-egraph-rows-") as folder, \
                ThreadPoolExecutor(1, thread_name_prefix="rlx-egglog-input") as egglog:
            egraph.parse_and_run_program(self.declarations)
            inputs = [egglog.submit(egraph.parse_and_run_program, self._write(Path(folder), *part))
                      for part in self._parts()]
            for read in inputs:
                read.result()
            egraph.parse_and_run_program(self.rules)

    def write_rows(self, folder: Path) -> str:
        """Write the rows into ``folder`` as tab-separated files (see :meth:`load`); returns the program that runs
        with them (the declarations, an ``input`` per file, the loading rules and graph-wide facts)."""
        inputs = [self._write(folder, *part) for part in self._parts()]
        return "\n".join([self.declarations, *inputs, self.rules])

    def _parts(self) -> Iterator[tuple[str, str, list[Row]]]:
        """The rows files, in order: (file name, relation, its rows there)."""
        for relation, rows in self.rows.items():
            for k, start in enumerate(range(0, len(rows), ROWS_PER_FILE)):
                yield f"{relation}.{k}", relation, rows[start:start + ROWS_PER_FILE]

    @staticmethod
    def _write(folder: Path, name: str, relation: str, rows: list[Row]) -> str:
        """Write rows of ``relation`` into file ``name`` of ``folder``; returns the ``input`` command that reads
        them."""
        path = folder / f"{name}.tsv"
        with path.open("w", encoding="utf-8", newline="") as file:  # fields hold no tab nor newline
            csv.writer(file, delimiter="\t", quoting=csv.QUOTE_NONE, quotechar=None,
                       lineterminator="\n").writerows(rows)
        return f"(input {relation} {string_literal(str(path))})"

    @cached_property
    def text(self) -> str:
        """The program with the rows as facts, runnable as-is (:meth:`load` is the fast way)."""
        facts = [f"({relation} {' '.join(map(_fact_literal, row))})"
                 for relation, rows in self.rows.items() for row in rows]
        return "\n".join([self.declarations, *facts, self.rules]) + "\n"


def _fact_literal(value: int | float | str) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value) if isinstance(value, float) else str(value)


def _load_rule(spec: OpSpec) -> tuple[tuple[str, ...], str]:
    """The row columns of ``spec`` and the rule that builds its terms from its rows."""
    kinds = {a.name: a.type for a in spec.attrs}
    columns, query, args = ["i64"], [], []
    for j, arg in enumerate(constructor_args(spec)):
        column = f"c{j}"
        if arg.is_input:
            columns.append("i64")
            args.append(f"({LIST_TABLE if arg.variadic else NODE_TABLE} {column})")
            continue
        kind = kinds[arg.name]
        columns.append(_COLUMN_SORT.get(kind, "String"))
        if kind in (AttrType.INTS, AttrType.BOOL):
            query.append(f"(= v{j} ({VEC_TABLE if kind is AttrType.INTS else BOOL_TABLE} {column}))")
            column = f"v{j}"
        args.append(column)
    relation = ROW_PREFIX + spec.name
    head = " ".join(["k", *(f"c{j}" for j in range(len(columns) - 1))])
    built = f"({spec.name}{''.join(' ' + a for a in args)})"
    return tuple(columns), f"(rule (({relation} {head}){''.join(' ' + q for q in query)}) " \
                          f"((union ({NODE_TABLE} k) {built})) :ruleset {LOAD_RULESET})"


def encode_graph(graph: Graph, attention_block_max_tokens: int = 64) -> Encoding:
    """The rows of ``graph``'s nodes and facts, the rules that load them, then the graph-wide facts."""
    constants: dict[str, np.ndarray] = {}
    vec_ids: dict[tuple[int, ...], int] = {}
    list_ids: dict[tuple[int, ...], int] = {}
    cons_rows: list[Row] = []
    plans: dict[str, tuple[list[tuple[bool, bool, AttrType | None, str]], list[Row]]] = {}  # op -> columns, rows
    rows: dict[str, list[Row]] = {}
    facts: dict[str, list[Row]] = {name: [] for name in FACT_ROWS}
    perms: set[tuple[int, ...]] = set()
    absent = False

    def vec_id(value: tuple[int, ...]) -> int:
        return vec_ids.setdefault(tuple(value), len(vec_ids))

    def list_id(items: tuple[int, ...]) -> int:
        """The id of the TensorList of ``items``, its suffixes first (each distinct one once)."""
        tail = list_ids.setdefault((), len(list_ids))
        for k in range(len(items) - 1, -1, -1):
            lid = list_ids.get(items[k:])
            if lid is None:
                lid = list_ids[items[k:]] = len(list_ids)
                cons_rows.append((lid, items[k], tail))
            tail = lid
        return tail

    dtype_text: dict[str, str] = {}  # dtype -> its stored form
    type_rows, order_rows = facts["type"], facts["param-order"]

    for node in graph.nodes:
        op = node.op
        if op == "Scalar" and is_negative_zero_scalar(node):  # a term egglog keeps apart from +0.0
            rows.setdefault(NEG_ZERO_ROWS, []).append((node.id, stored_string(str(node.dtype))))
        else:
            plan = plans.get(op)
            if plan is None:
                kinds = {a.name: a.type for a in node.spec.attrs}
                plan = plans[op] = ([(a.is_input, a.variadic, kinds.get(a.name), a.name)
                                     for a in constructor_args(node.spec)], rows.setdefault(ROW_PREFIX + op, []))
            row: list[int | float | str] = [node.id]
            inputs = node.inputs
            k = 0
            for is_input, variadic, kind, name in plan[0]:
                if is_input:
                    if variadic:
                        row.append(list_id(tuple(inputs[k:])))
                        k = len(inputs)
                    elif k < len(inputs):
                        row.append(inputs[k])
                        k += 1
                    else:
                        row.append(NO_INPUT_ID)
                        absent = True
                    continue
                value = node.attrs[name]
                if kind is AttrType.INT:
                    row.append(int(value))
                elif kind is AttrType.FLOAT:
                    row.append(float(value))
                elif kind is AttrType.BOOL:
                    row.append(1 if value else 0)
                elif kind is AttrType.INTS:
                    row.append(vec_id(value))
                elif kind is AttrType.ARRAY:
                    key = array_key(value)
                    constants[key] = value
                    row.append(key)
                else:
                    row.append(stored_string(str(value)))
            plan[1].append(tuple(row))
        if not node.parts:  # a multi-result node has no one shape: its Gets have theirs
            text = dtype_text.get(node.dtype)
            if text is None:
                text = dtype_text[node.dtype] = stored_string(str(node.dtype))
            shape_id = vec_ids.get(node.shape)
            type_rows.append((node.id, vec_id(node.shape) if shape_id is None else shape_id, text))
        if op == "Param":
            order_rows.append((node.id, len(order_rows)))
        elif op == "Transpose":
            perms.add(node.attrs["perm"])

    declarations = [f"(constructor {NODE_TABLE} (i64) Op :unextractable)",
                    f"(constructor {LIST_TABLE} (i64) TensorList :unextractable)",
                    f"(function {VEC_TABLE} (i64) IntVec :no-merge)",
                    f"(function {BOOL_TABLE} (i64) bool :no-merge)",
                    f"(ruleset {LOAD_RULESET})",
                    f"(set ({BOOL_TABLE} 0) false)", f"(set ({BOOL_TABLE} 1) true)"]
    declarations += [f"(set ({VEC_TABLE} {i}) {literal(v, AttrType.INTS)})" for v, i in vec_ids.items()]
    if absent:
        declarations.append(f"(union ({NODE_TABLE} {NO_INPUT_ID}) ({NO_INPUT}))")
    if () in list_ids:
        declarations.append(f"(union ({LIST_TABLE} {list_ids[()]}) ({LIST_NIL}))")
    columns: dict[str, tuple[str, ...]] = {}
    rules: list[str] = []
    for relation in sorted(rows):
        if relation == NEG_ZERO_ROWS:
            columns[relation] = ("i64", "String")
            rules.append(f"(rule (({relation} k d)) ((union ({NODE_TABLE} k) (Neg (Scalar 0.0 d)))) "
                         f":ruleset {LOAD_RULESET})")
        else:
            columns[relation], rule = _load_rule(REGISTRY[relation.removeprefix(ROW_PREFIX)])
            rules.append(rule)
    if cons_rows:
        relation = ROW_PREFIX + LIST_CONS
        columns[relation], rows[relation] = ("i64", "i64", "i64"), cons_rows
        rules.append(f"(rule (({relation} l h t)) ((union ({LIST_TABLE} l) ({LIST_CONS} ({NODE_TABLE} h) "
                     f"({LIST_TABLE} t)))) :ruleset {LOAD_RULESET})")
    for name, (sorts, query, sets) in FACT_ROWS.items():
        if facts[name]:
            relation = ROW_PREFIX + name
            columns[relation], rows[relation] = ("i64", *sorts), facts[name]
            head = " ".join(["k", *(f"c{j}" for j in range(len(sorts)))])
            actions = " ".join(f"(set ({table} ({NODE_TABLE} k)) {value})" for table, value in sets)
            rules.append(f"(rule (({relation} {head}){query}) ({actions}) :ruleset {LOAD_RULESET})")
    declarations += [f"(relation {relation} ({' '.join(sorts)}))" for relation, sorts in columns.items()]
    graph_facts = [f"(run {LOAD_RULESET} 1)", *_graph_facts(perms, attention_block_max_tokens)]
    return Encoding("\n".join(declarations), {r: rows[r] for r in columns}, "\n".join(rules + graph_facts),
                    constants)


def _graph_facts(perms: set[tuple[int, ...]], attention_block_max_tokens: int) -> list[str]:
    """The facts about the graph as a whole: the attention-block token bound, and which of its Transposes' perms
    undo each other."""
    facts = [f"(set (attention-block-max-tokens) {int(attention_block_max_tokens)})"]
    for p in sorted(perms):
        inverse = tuple(sorted(range(len(p)), key=p.__getitem__))
        if inverse in perms:
            facts.append(f"(inverse-perms {literal(p, AttrType.INTS)} {literal(inverse, AttrType.INTS)})")
    return facts


def term_name(node_id: int) -> str:
    """The egglog global holding node ``node_id``'s term in :func:`graph_terms`."""
    return f"$n{node_id}"


def _term(node: Node) -> str:
    """``node`` as an egglog term over its inputs' globals."""
    if is_negative_zero_scalar(node):
        return f"(Neg (Scalar 0.0 {string_literal(node.dtype)}))"
    kinds = {a.name: a.type for a in node.spec.attrs}
    args: list[str] = []
    for position, arg in enumerate(constructor_args(node.spec)):
        value = node_arg(node, position, arg)
        if arg.variadic:
            tail = f"({LIST_NIL})"
            for i in reversed(value):
                tail = f"({LIST_CONS} {term_name(i)} {tail})"
            args.append(tail)
        elif arg.is_input:
            args.append(f"({NO_INPUT})" if value is None else term_name(value))
        else:
            kind = kinds[arg.name]
            args.append(string_literal(array_key(value)) if kind is AttrType.ARRAY else literal(value, kind))
    return f"({node.op}{''.join(' ' + a for a in args)})"


def graph_terms(graph: Graph, attention_block_max_tokens: int = 64) -> str:
    """``graph`` as egglog terms, a line per node in graph order: the node's global ``$n<id>``, then its shape and
    dtype facts (its Param order too); then the graph-wide facts.  Runs after the schema and the rules."""
    lines = [";; the graph: node i is the global $n<i>, with its shape and dtype facts"]
    perms: set[tuple[int, ...]] = set()
    params = 0
    for node in graph.nodes:
        name = term_name(node.id)
        line = [f"(let {name} {_term(node)})"]
        if not node.parts:  # a multi-result node has no one shape: its Gets have theirs
            line += [f"(set (shape {name}) {literal(node.shape, AttrType.INTS)})",
                     f"(set (dtype {name}) {string_literal(node.dtype)})"]
        if node.op == "Param":
            line.append(f"(set (param-order {name}) {params})")
            params += 1
        elif node.op == "Transpose":
            perms.add(node.attrs["perm"])
        lines.append(" ".join(line))
    return "\n".join([*lines, *_graph_facts(perms, attention_block_max_tokens)]) + "\n"


PROGRAM_FORMS = ("rows", "terms")


def dump_egglog_program(graph: Graph, rules: Any = None, attention_block_max_tokens: int = 64,
                        form: str = "rows") -> str:
    """The whole program for ``graph`` as text that runs as-is in egglog: schema, rules, the graph, and the
    staged saturation schedule.  ``form="rows"`` (what a run loads; fast at any size) writes the graph as
    relation rows, node ``i`` being ``(rlx-node i)``; ``form="terms"`` as one readable term per node
    (:func:`graph_terms`, node ``i`` being ``$n<i>``; for small graphs), ending with egglog's own ``extract`` of
    each output (egglog's smallest term, not the IO cost model's choice)."""
    if form not in PROGRAM_FORMS:
        raise ValueError(f"form must be one of {list(PROGRAM_FORMS)}, got {form!r}")
    ruleset = load_rules(rules)
    if form == "rows":
        graph_part = encode_graph(graph, attention_block_max_tokens).text
        tail: list[str] = []
    else:
        graph_part = graph_terms(graph, attention_block_max_tokens)
        tail = [f"(extract {term_name(o)})" for o in dict.fromkeys(graph.outputs)]
    return "\n".join([schema_text(), ruleset.text, graph_part, ruleset.schedule_text(), *tail])
