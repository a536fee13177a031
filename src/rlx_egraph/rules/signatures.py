"""The constructors rules apply: one per registered op, generated from the op registry.

An op's constructor takes its inputs first (sort ``Op`` each; an optional input
is ``(NoInput)`` when absent; a variadic tail is one ``TensorList`` built from
``TCons`` cells ending in ``TNil``), then its attributes in declaration order
(``i64``, ``f64``, ``bool``, ``String`` or ``IntVec``)::

    (MatMul ?a ?b)   (Narrow ?x -1 0 64)   (Scalar 0.5 "f32")   (Input "x" (vec-of 4 64) "f32")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.graph import Node
from ..ir.registry import OpSpec

NO_INPUT = "NoInput"
LIST_CONS = "TCons"
LIST_NIL = "TNil"
OP, TENSOR_LIST, INT_VEC = "Op", "TensorList", "IntVec"


@dataclass(frozen=True)
class ConstructorArg:
    """One argument of an op's constructor: an input slot or an attribute."""

    name: str
    sort: str
    is_input: bool
    optional: bool = False
    variadic: bool = False


def constructor_args(spec: OpSpec) -> tuple[ConstructorArg, ...]:
    """The constructor's arguments in order: inputs, then attributes (made once per spec)."""
    known = _CONSTRUCTOR_ARGS.get(spec.name)
    if known is None or known[0] is not spec:  # (an op registered again gets its own)
        args = [ConstructorArg(raw.rstrip("?*"), TENSOR_LIST if raw.endswith("*") else OP, True,
                               optional=raw.endswith("?"), variadic=raw.endswith("*")) for raw in spec.inputs]
        args += [ConstructorArg(a.name, a.type.egglog_sort, False) for a in spec.attrs]
        known = _CONSTRUCTOR_ARGS[spec.name] = (spec, tuple(args))
    return known[1]


def node_arg(node: Node, position: int, arg: ConstructorArg, absent: Any = None) -> Any:
    """Argument ``arg``, at ``position`` of the constructor, of ``node``: an input's id (``absent`` where an optional
    input is not there; a variadic input: the ids from there on), or an attribute's value."""
    if not arg.is_input:
        return node.attrs[arg.name]
    if arg.variadic:
        return node.inputs[position:]
    return node.inputs[position] if position < len(node.inputs) else absent


_CONSTRUCTOR_ARGS: dict[str, tuple[OpSpec, tuple[ConstructorArg, ...]]] = {}
