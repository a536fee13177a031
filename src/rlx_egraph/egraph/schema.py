"""The egglog schema, generated from the op registry (never a hand-kept list).

Every op becomes a constructor of sort ``Op`` named like the op, taking its
inputs first (``Op`` each; an optional input is ``(NoInput)`` when absent; a
variadic tail is one ``TensorList``), then its attributes in declaration order
(``i64``, ``f64``, ``bool``, ``String`` or ``IntVec``)::

    (MatMul ?a ?b)   (Narrow ?x -1 0 64)   (Scalar 0.5 "f32")   (Input "x" (vec-of 4 64) "f32")

Shape facts that rule guards need live in function tables filled by the
encoder (and by rules that build new terms):

* ``(shape ?x)`` -> ``IntVec`` of dims, ``(dtype ?x)`` -> ``String``
* ``(param-order ?w)`` -> ``i64``: declaration order of a Param, to order concatenations
* ``(attention-block-max-tokens)`` -> ``i64``: the batch*seq threshold of FusedAttentionBlock
* ``(inverse-perms ?p ?q)``: perms ``p`` and ``q`` of the graph's Transposes undo each other
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.registry import REGISTRY, OpSpec

NO_INPUT = "NoInput"
LIST_NIL = "TNil"
LIST_CONS = "TCons"

# Tables (functions) the encoder fills and rules may read or extend.
FACT_TABLES = {
    "shape": "(function shape (Op) IntVec :merge old)",
    "dtype": "(function dtype (Op) String :merge old)",
    "param-order": "(function param-order (Op) i64 :merge old)",
    "attention-block-max-tokens": "(function attention-block-max-tokens () i64 :merge old)",
    "inverse-perms": "(relation inverse-perms (IntVec IntVec))",
}


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
        args = [ConstructorArg(raw.rstrip("?*"), "TensorList" if raw.endswith("*") else "Op", True,
                               optional=raw.endswith("?"), variadic=raw.endswith("*")) for raw in spec.inputs]
        args += [ConstructorArg(a.name, a.type.egglog_sort, False) for a in spec.attrs]
        known = _CONSTRUCTOR_ARGS[spec.name] = (spec, tuple(args))
    return known[1]


_CONSTRUCTOR_ARGS: dict[str, tuple[OpSpec, tuple[ConstructorArg, ...]]] = {}


def schema_text() -> str:
    """The egglog declarations: sorts, the Op datatype, list and fact tables."""
    lines = [
        ";; generated from the rlx_egraph op registry",
        "(sort IntVec (Vec i64))",
        "(datatype Op",
        f"  ({NO_INPUT})",
    ]
    variadic = [spec for spec in REGISTRY.values() if spec.variadic]
    for spec in REGISTRY.values():
        if not spec.variadic:
            sorts = " ".join(a.sort for a in constructor_args(spec))
            lines.append(f"  ({spec.name}{' ' + sorts if sorts else ''})")
    lines.append(")")
    # Variadic ops take a TensorList, which itself holds Ops: declared after both sorts exist.
    lines.append(f"(datatype TensorList ({LIST_NIL}) ({LIST_CONS} Op TensorList))")
    for spec in variadic:
        sorts = " ".join(a.sort for a in constructor_args(spec))
        lines.append(f"(constructor {spec.name} ({sorts}) Op)")
    lines.extend(FACT_TABLES.values())
    return "\n".join(lines) + "\n"
