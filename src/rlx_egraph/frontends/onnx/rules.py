"""The rules for imported ONNX models: the shipped rules plus ``rules/onnx/*.egg``.

The ONNX forms rules rely on what the importer guarantees (the causal keep mask is
the parameter named :data:`~.importer.CAUSAL_MASK`, lower-triangular), which an
arbitrary graph does not, so they are not among the rules every graph gets.
"""

from __future__ import annotations

from pathlib import Path

from ...egraph.rules import RuleSet, default_rule_dir


def onnx_rule_dir() -> Path:
    """The folder of the ONNX-only rule files."""
    return default_rule_dir() / "onnx"


def onnx_rules() -> RuleSet:
    """The shipped rules and the ONNX forms rules, for graphs made by :func:`~.importer.import_model`.

    Loaded together: the ONNX forms read relations of the shipped files (attn-scores, repeat-kv)."""
    return RuleSet.from_files(default_rule_dir(), onnx_rule_dir())
