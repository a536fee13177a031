"""Type stub of the compiled module ``_rows.pyx`` (egglog's frozen rows read as integers, for the view)."""

from collections.abc import Callable
from typing import Any

def value_id(value: Any) -> int: ...

class ClassNumbers:
    """Numbers e-class ids in order of first sight."""

    count: int

    def of(self, value: Any) -> int: ...
    def of_id(self, value: int) -> int: ...
    def of_keys(self, rows: list[Any], key_of: Callable[[Any], Any]) -> dict[Any, int]: ...

class ListCells:
    """The cells of the ``TensorList`` sort, by list id."""

    def __init__(self, rows: list[Any]) -> None: ...

class RuleRelation:
    """The rows of a provenance relation: key (value ids) -> the rules' names."""

    def __init__(self, rows: list[Any], names_of: Callable[[tuple[Any, ...]], tuple[str, ...]],
                 named: dict[tuple[int, ...], tuple[str, ...]]) -> None: ...
    def __len__(self) -> int: ...
    def items(self) -> list[tuple[tuple[int, ...], tuple[str, ...]]]: ...

class ENode:
    """An op applied to e-classes: one alternative of an e-class."""

    index: int
    op: str
    children: tuple[int, ...]
    attrs: dict[str, Any]
    eclass: int
    original: int | None
    built_by: tuple[str, ...]

    def __init__(self, index: int, op: str, children: tuple[int, ...], attrs: dict[str, Any], eclass: int,
                 original: int | None = None, built_by: tuple[str, ...] = ()) -> None: ...
    @property
    def spec(self) -> Any: ...

class EClass:
    """An e-class: its e-nodes, its type, the input-graph nodes in it, the rules that merged into it."""

    id: int
    nodes: list[int]
    type: Any
    originals: list[int]
    merged_by: tuple[str, ...]

    def __init__(self, id: int, nodes: list[int] | None = None, type: Any = None, originals: list[int] | None = None,
                 merged_by: tuple[str, ...] = ()) -> None: ...

def make_classes(eclasses: list[int], originals: list[list[int]]) -> list[EClass]: ...
def link_graph_nodes(graph_nodes: tuple[Any, ...], class_of_id: dict[int, int], num_classes: int
                     ) -> tuple[dict[int, int], list[list[int]], list[Any]]: ...
def read_enodes(op: str, rows: list[Any], input_columns: list[tuple[int, bool]],
                attr_columns: list[tuple[int, str, Any, dict[int, Any]]], classes: ClassNumbers, lists: ListCells,
                absent: set[int], convert: Callable[[Any, Any], Any],
                built_by: RuleRelation, nodes: list[ENode], eclasses: list[int],
                deadline: Any) -> None: ...
