"""The optimization as inspectable data: plain records (lists of dicts), one table each.

:class:`OptimizationData` keeps the saturated e-graph's classes and e-nodes (op,
attributes, type, node cost), the extraction's choice per class, the provenance
of every optimized node, per-iteration statistics and the IO profile per op kind
before and after.  Every table is a :class:`Records` (a list of dicts) with
``to_dataframe()`` when pandas is installed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from ..cost.model import IoProfile
from ..egraph.decode import Decoded
from ..egraph.saturate import IterationStats
from ..egraph.view import EGraphView

TABLES = ("eclasses", "enodes", "choices", "provenance", "iterations", "io_by_kind", "rule_applications")


class Records(list):
    """A list of dicts (one per row); ``to_dataframe()`` gives a pandas DataFrame."""

    def to_dataframe(self) -> Any:
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_dataframe() needs pandas (pip install pandas); the rows are this list") from None
        return pd.DataFrame(list(self))


def _json_value(value: Any) -> Any:
    """Attributes as JSON-ready values (arrays become their shape, tuples lists)."""
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"array{tuple(value.shape)}"
    return value


def io_by_kind(profile: IoProfile, when: str) -> Records:
    """Per op kind of a graph's ``profile``: nodes and predicted ns (readback excluded)."""
    return Records({"when": when, "kind": k, "nodes": part.nodes, "ns": profile.kind_ns(k)}
                   for k, part in profile.by_kind.items())


class OptimizationData:
    """Tables of one optimize run (see the module doc); ``tables()`` lists them by name.

    Each table is made the first time it is read, from the run's results that this object keeps (a
    100,000-node run has some 200,000 e-node rows, which most callers never look at).  Without a view (no
    e-graph was built) the e-graph tables are empty.
    """

    def __init__(self, profiles: tuple[IoProfile, IoProfile] | None = None,
                 iterations: Sequence[IterationStats] = (), decoded: Decoded | None = None,
                 view: EGraphView | None = None, choice: Mapping[int, int] | None = None,
                 costs: Sequence[float] | None = None) -> None:
        self._profiles, self._iterations, self._decoded = profiles, iterations, decoded
        # the optimized graph is the caller's to add to: its nodes as they were at the end of the run (one tuple of
        # the Node records, which never change)
        self._nodes = decoded.graph.nodes if decoded is not None else ()
        complete = view is not None and choice is not None and costs is not None
        self._egraph = (view, choice, costs) if complete else None  # the e-graph tables' sources, all or none

    @classmethod
    def build(cls, profiles: tuple[IoProfile, IoProfile], iterations: list[IterationStats], decoded: Decoded,
              view: EGraphView | None = None, choice: dict[int, int] | None = None,
              costs: list[float] | None = None) -> OptimizationData:
        """The tables of a run (``profiles``: the input's and the result's), each made when first read."""
        return cls(profiles, iterations, decoded, view, choice, costs)

    @cached_property
    def iterations(self) -> Records:
        return Records({"step": k, "stage": it.stage, "rule": rule, "matches": m, "enodes_after": it.enodes}
                       for k, it in enumerate(self._iterations) for rule, m in sorted(it.matches.items()))

    @cached_property
    def provenance(self) -> Records:
        decoded = self._decoded
        if decoded is None:
            return Records()
        return Records(
            {"node": n.id, "op": n.op, "eclass": decoded.class_of.get(n.id), "replaces": decoded.originals[n.id],
             "built_by": list(decoded.built_by.get(n.id, ())), "merged_by": list(decoded.merged_by.get(n.id, ())),
             "names": list(decoded.graph.source_names(n.id))}
            for n in self._nodes)

    @cached_property
    def io_by_kind(self) -> Records:
        if self._profiles is None:
            return Records()
        return Records(io_by_kind(self._profiles[0], "before") + io_by_kind(self._profiles[1], "after"))

    @cached_property
    def _type_text(self) -> list[str]:
        return [str(c.type) for c in self._egraph[0].classes] if self._egraph is not None else []

    @cached_property
    def eclasses(self) -> Records:
        if self._egraph is None:
            return Records()
        view, choice, _ = self._egraph
        type_text = self._type_text
        return Records(
            {"eclass": c.id, "type": type_text[c.id], "enodes": len(c.nodes), "originals": list(c.originals),
             "merged_by": list(c.merged_by), "chosen_enode": choice.get(c.id)} for c in view.classes)

    @cached_property
    def enodes(self) -> Records:
        if self._egraph is None:
            return Records()
        view, choice, costs = self._egraph
        type_text = self._type_text
        return Records(
            {"enode": n.index, "eclass": n.eclass, "op": n.op, "kind": n.spec.kind.value,
             "attrs": {k: _json_value(v) for k, v in n.attrs.items()}, "children": list(n.children),
             "type": type_text[n.eclass], "cost_ns": costs[n.index], "original": n.original,
             "built_by": list(n.built_by), "chosen": choice.get(n.eclass) == n.index} for n in view.nodes)

    @cached_property
    def choices(self) -> Records:
        if self._egraph is None:
            return Records()
        view, choice, costs = self._egraph
        return Records({"eclass": c, "enode": n, "op": view.nodes[n].op, "cost_ns": costs[n]}
                       for c, n in sorted(choice.items()))

    @cached_property
    def rule_applications(self) -> Records:
        if self._egraph is None:
            return Records()
        view = self._egraph[0]
        built: Counter[str] = Counter(name for n in view.nodes for name in n.built_by)
        merged: Counter[str] = Counter(name for c in view.classes for name in c.merged_by)
        return Records(
            {"rule": r, "enodes_built": built[r], "eclasses_merged_into": merged[r]} for r in sorted(built | merged))

    def tables(self) -> dict[str, Records]:
        return {name: getattr(self, name) for name in TABLES}

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {name: list(rows) for name, rows in self.tables().items()}
