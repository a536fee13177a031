"""The optimization as inspectable data: plain records (lists of dicts), one table each.

:class:`OptimizationData` keeps the saturated e-graph's classes and e-nodes (op,
attributes, type, node cost), the extraction's choice per class, the provenance
of every optimized node, per-iteration statistics and the IO profile per op kind
before and after.  Every table is a :class:`Records` (a list of dicts) with
``to_dataframe()`` when pandas is installed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
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


@dataclass
class OptimizationData:
    """Tables of one optimize run (see the module doc); ``tables()`` lists them by name."""

    eclasses: Records = field(default_factory=Records)
    enodes: Records = field(default_factory=Records)
    choices: Records = field(default_factory=Records)
    provenance: Records = field(default_factory=Records)
    iterations: Records = field(default_factory=Records)
    io_by_kind: Records = field(default_factory=Records)
    rule_applications: Records = field(default_factory=Records)

    @classmethod
    def build(cls, profiles: tuple[IoProfile, IoProfile], iterations: list[IterationStats], decoded: Decoded,
              view: EGraphView | None = None, choice: dict[int, int] | None = None,
              costs: list[float] | None = None) -> OptimizationData:
        """The tables of a run (``profiles``: the input's and the result's); the e-graph tables stay empty
        without ``view`` (no e-graph was built)."""
        data = cls()
        data.iterations = Records(
            {"step": k, "stage": it.stage, "rule": rule, "matches": m, "enodes_after": it.enodes}
            for k, it in enumerate(iterations) for rule, m in sorted(it.matches.items()))
        data.provenance = Records(
            {"node": n.id, "op": n.op, "eclass": decoded.class_of.get(n.id), "replaces": decoded.originals[n.id],
             "built_by": list(decoded.built_by.get(n.id, ())), "merged_by": list(decoded.merged_by.get(n.id, ()))}
            for n in decoded.graph.nodes)
        data.io_by_kind = Records(io_by_kind(profiles[0], "before") + io_by_kind(profiles[1], "after"))
        if view is None or choice is None or costs is None:
            return data
        type_text = [str(c.type) for c in view.classes]
        data.eclasses = Records(
            {"eclass": c.id, "type": type_text[c.id], "enodes": len(c.nodes), "originals": list(c.originals),
             "merged_by": list(c.merged_by), "chosen_enode": choice.get(c.id)} for c in view.classes)
        data.enodes = Records(
            {"enode": n.index, "eclass": n.eclass, "op": n.op, "kind": n.spec.kind.value,
             "attrs": {k: _json_value(v) for k, v in n.attrs.items()}, "children": list(n.children),
             "type": type_text[n.eclass], "cost_ns": costs[n.index], "original": n.original,
             "built_by": list(n.built_by), "chosen": choice.get(n.eclass) == n.index} for n in view.nodes)
        data.choices = Records({"eclass": c, "enode": n, "op": view.nodes[n].op, "cost_ns": costs[n]}
                               for c, n in sorted(choice.items()))
        built: Counter[str] = Counter(name for n in view.nodes for name in n.built_by)
        merged: Counter[str] = Counter(name for c in view.classes for name in c.merged_by)
        data.rule_applications = Records(
            {"rule": r, "enodes_built": built[r], "eclasses_merged_into": merged[r]} for r in sorted(built | merged))
        return data

    def tables(self) -> dict[str, Records]:
        return {name: getattr(self, name) for name in TABLES}

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {name: list(rows) for name, rows in self.tables().items()}
