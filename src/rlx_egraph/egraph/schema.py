"""The egglog schema rules are written against: one definition, in :mod:`rlx_egraph.rules`.

The op constructors (:mod:`rlx_egraph.rules.signatures`, generated from the op
registry), the fact tables (:data:`rlx_egraph.rules.tables.FACT_TABLES`) and
the schema's egglog text (:func:`rlx_egraph.rules.emit.schema_text`) are
defined there; this module names them for the egglog engine.
"""

from __future__ import annotations

from ..rules.emit import schema_text
from ..rules.signatures import LIST_CONS, LIST_NIL, NO_INPUT, ConstructorArg, constructor_args
from ..rules.tables import FACT_TABLES as _TABLES

# Each fact table's egglog declaration, by name.
FACT_TABLES: dict[str, str] = {name: table.declaration for name, table in _TABLES.items()}

__all__ = ["FACT_TABLES", "LIST_CONS", "LIST_NIL", "NO_INPUT", "ConstructorArg", "constructor_args", "schema_text"]
