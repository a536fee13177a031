"""Graph -> egglog text: the nodes and their shape facts, in chunks of rules.

Text is what we hand egglog: parsing a program is far faster than building
terms one by one through the high-level Python API.  A global ``let`` per node
would make egglog create one table per node (quadratic in the graph), so the
nodes are built by rules without a query, :data:`CHUNK` nodes each, run once:
inside a rule a node is a local ``n<id>``; the table ``(rlx-node id)`` names
every node afterwards, and a node that a later chunk reads also gets a global
``$n<id>``.  Every value is encoded
so that it reads back exactly: any Python str (:func:`string_literal`), a
constant array by its bit-exact content key (:func:`array_key`), and a Scalar
-0.0, which egglog's f64 would equate with 0.0, as ``(Neg (Scalar 0.0 dtype))``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.registry import AttrType
from .schema import LIST_CONS, LIST_NIL, NO_INPUT, constructor_args, schema_text

# Nodes per encoding rule (32 to 512 measured alike; one rule for the whole graph is slower).
CHUNK = 128
# The table from graph node id to its term, filled by the encoding rules.
NODE_TABLE = "rlx-node"


def egglog_name(node_id: int, local: bool = False) -> str:
    """The egglog name of a graph node: the global ``$n<id>``, or the local ``n<id>`` inside its chunk's rule."""
    return f"{'' if local else '$'}n{node_id}"


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


# egglog String literals take any UTF-8 text with the escapes \\ \" \n \t and no others.
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}
# Prefix of a string stored in its JSON-escaped (ASCII) form; see string_literal.
ESCAPED_MARK = "rlx-escaped:"


def string_literal(text: str) -> str:
    """``text`` as an egglog String literal; :func:`string_value` reads back exactly ``text``.

    Printable text (plus newlines and tabs) is written as is.  Text with any
    other character (controls, format characters such as RTL marks, lone
    surrogates) or starting with :data:`ESCAPED_MARK` is stored as the mark
    followed by its JSON escape, so every Python str has one distinct literal.
    """
    if text.startswith(ESCAPED_MARK) or not all(ch.isprintable() or ch in "\n\t" for ch in text):
        text = ESCAPED_MARK + json.dumps(text)[1:-1]
    return '"' + "".join(_ESCAPES.get(ch, ch) for ch in text) + '"'


def string_value(stored: str) -> str:
    """The Python str that :func:`string_literal` encoded as ``stored``."""
    if stored.startswith(ESCAPED_MARK):
        return json.loads(f'"{stored[len(ESCAPED_MARK):]}"')
    return stored


def is_negative_zero_scalar(node: Node) -> bool:
    """A Scalar -0.0: egglog's f64 equates it with 0.0, so it is encoded as ``(Neg (Scalar 0.0 dtype))``."""
    return node.op == "Scalar" and node.attrs["value"] == 0.0 and math.copysign(1.0, node.attrs["value"]) < 0


def array_key(value: np.ndarray) -> str:
    """Content key of a constant array, so equal constants share one e-class."""
    digest = hashlib.sha1(f"{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
    return f"const:{digest.hexdigest()[:20]}"


@dataclass
class Encoding:
    """The graph part of an egglog program and what decoding needs to undo it."""

    text: str
    constants: dict[str, np.ndarray] = field(default_factory=dict)


def node_term(node: Node, constants: dict[str, np.ndarray], local: frozenset[int] | set[int] = frozenset()) -> str:
    """The constructor application for one node, its inputs by egglog name (local for ids in ``local``)."""
    if is_negative_zero_scalar(node):  # the same value, a term that egglog keeps apart from +0.0
        return f"(Neg (Scalar 0.0 {literal(node.dtype, AttrType.DTYPE)}))"
    spec = node.spec
    parts = [spec.name]
    inputs = list(node.inputs)
    for arg in constructor_args(spec):
        if arg.is_input:
            if arg.variadic:
                tail = f"({LIST_NIL})"
                for i in reversed(inputs):
                    tail = f"({LIST_CONS} {egglog_name(i, i in local)} {tail})"
                parts.append(tail)
                inputs = []
            elif inputs:
                i = inputs.pop(0)
                parts.append(egglog_name(i, i in local))
            else:
                parts.append(f"({NO_INPUT})")
            continue
        value = node.attrs[arg.name]
        kind = next(a.type for a in spec.attrs if a.name == arg.name)
        if kind is AttrType.ARRAY:
            key = array_key(value)
            constants[key] = value
            value = key
        parts.append(literal(value, kind))
    return f"({' '.join(parts)})"


def encode_graph(graph: Graph, attention_block_max_tokens: int = 64) -> Encoding:
    """The node table, one rule per chunk of nodes (their terms and facts), then the graph-wide facts."""
    constants: dict[str, np.ndarray] = {}
    chunk_of = {node.id: k // CHUNK for k, node in enumerate(graph.nodes)}
    read_later = {i for node in graph.nodes for i in node.inputs if chunk_of[i] != chunk_of[node.id]}
    commands = [f"(function {NODE_TABLE} (i64) Op :merge old)"]
    facts: list[str] = [f"(set (attention-block-max-tokens) {int(attention_block_max_tokens)})"]
    param_order = 0
    perms: set[tuple[int, ...]] = set()
    for start in range(0, len(graph.nodes), CHUNK):
        chunk = graph.nodes[start:start + CHUNK]
        local = {node.id for node in chunk}
        actions: list[str] = []
        for node in chunk:
            name = egglog_name(node.id, local=True)
            actions.append(f"(let {name} {node_term(node, constants, local)})")
            actions.append(f"(set ({NODE_TABLE} {node.id}) {name})")
            if not node.parts:  # a multi-result node has no one shape: its Gets have theirs
                actions.append(f"(set (shape {name}) {literal(node.shape, AttrType.INTS)})")
                actions.append(f"(set (dtype {name}) {literal(node.dtype, AttrType.DTYPE)})")
            if node.op == "Param":
                actions.append(f"(set (param-order {name}) {param_order})")
                param_order += 1
            elif node.op == "Transpose":
                perms.add(node.attrs["perm"])
        ruleset = f"rlx-graph-{start // CHUNK}"
        commands.append(f"(ruleset {ruleset})")
        body = "\n   ".join(actions)
        commands.append(f"(rule ()\n  ({body})\n  :ruleset {ruleset})")
        commands.append(f"(run {ruleset} 1)")
        commands.extend(f"(let {egglog_name(n.id)} ({NODE_TABLE} {n.id}))" for n in chunk if n.id in read_later)
    for p in sorted(perms):
        inverse = tuple(sorted(range(len(p)), key=p.__getitem__))
        if inverse in perms:
            facts.append(f"(inverse-perms {literal(p, AttrType.INTS)} {literal(inverse, AttrType.INTS)})")
    return Encoding("\n".join(commands + facts) + "\n", constants)


def dump_egglog_program(graph: Graph, rules: Any = None, attention_block_max_tokens: int = 64) -> str:
    """The whole program for ``graph`` as text that runs as-is in egglog:
    schema, rules, the graph (node ``i`` is ``(rlx-node i)``) with shape facts, and
    the staged saturation schedule."""
    from .rules import load_rules

    ruleset = load_rules(rules)
    parts = [schema_text(), ruleset.text, encode_graph(graph, attention_block_max_tokens).text,
             ruleset.schedule_text()]
    return "\n".join(parts)
