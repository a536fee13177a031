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

def read_relation(rows: list[Any], names_of: Callable[[tuple[Any, ...]], tuple[str, ...]],
                  named: dict[tuple[int, ...], tuple[str, ...]]) -> dict[tuple[int, ...], tuple[str, ...]]: ...
def read_enodes(op: str, rows: list[Any], input_columns: list[tuple[int, bool]],
                attr_columns: list[tuple[int, str, Any, dict[int, Any]]], classes: ClassNumbers, lists: ListCells,
                absent: set[int], convert: Callable[[Any, Any], Any],
                built_by: dict[tuple[int, ...], tuple[str, ...]], nodes: list[Any], eclasses: list[int],
                make_enode: Callable[..., Any], deadline: Any) -> None: ...
