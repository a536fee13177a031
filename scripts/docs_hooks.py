"""mkdocs hooks (mkdocs.yml ``hooks:``): the generated parts of the docs pages.

* ``docs/fusions.md``'s marker ``<!-- fused-op-table -->`` becomes the table of every fused op and derived weight,
  made from the op declarations and the shipped rules: the module that declares it (spec, kernel, decomposition,
  cost class, export), what it computes, the rules that build it and what the ONNX export writes for onnxruntime.
"""

from __future__ import annotations

from typing import Any

from rlx_egraph.cost.targets import ONNXRUNTIME_FUSED
from rlx_egraph.ir import REGISTRY, Kind
from rlx_egraph.onnx import onnx_rules

MARKER = "<!-- fused-op-table -->"


def fused_op_table() -> str:
    """The catalogue's table of fused ops and derived weights, one row per op in the registry's order."""
    builders: dict[str, list[str]] = {}
    for rule in onnx_rules().rules:  # the shipped rules and rules/onnx/
        for op in rule.builds:
            builders.setdefault(op, [])
            if rule.base not in builders[op]:
                builders[op].append(rule.base)
    rows = ["| op | declared in | computes | built by | onnxruntime export |", "| --- | --- | --- | --- | --- |"]
    for name, spec in REGISTRY.items():
        if spec.kind not in (Kind.FUSED, Kind.WEIGHT_PREP):
            continue
        declared = spec.decompose or spec.infer  # (every fused op and derived weight has a decomposition)
        module = "src/" + declared.__module__.replace(".", "/") + ".py"
        rules = ", ".join(f"`{r}`" for r in builders.get(name, [])) or "a pass (below)"
        export = ONNXRUNTIME_FUSED.get(name, "its decomposition" if spec.kind is Kind.FUSED else "an initializer")
        rows.append(f"| `{name}` | `{module}` | {spec.doc.replace('|', '/')} | {rules} | {export} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Fill the generated parts of a page."""
    return markdown.replace(MARKER, fused_op_table()) if MARKER in markdown else markdown
