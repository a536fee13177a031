"""The rules for imported ONNX models: the shipped rules plus ``rules/onnx/*.egg``.

The ONNX forms rules rely on what the importer guarantees (a causal keep mask is the ``CausalMask``
op, built only for a mask of that form), which an arbitrary graph does not, so they are not among the
rules every graph gets.  A graph made by :func:`~.importer.import_model` carries
``meta["source"] = "onnx"``, and ``optimize`` loads the front end's rules folder (``rules/onnx/``)
for such a graph without being asked (``rlx_egraph.optimize.default_rules``).
"""

from __future__ import annotations

from ...egraph.rules import RuleSet, default_rule_dir, load_rules

SOURCE = "onnx"  # graph.meta["source"] of an imported model; also the name of its rules folder


def onnx_rules() -> RuleSet:
    """The shipped rules and the ONNX forms rules, for graphs made by :func:`~.importer.import_model`.

    Loaded together: the ONNX forms read relations of the shipped files (attn-scores, repeat-kv)."""
    return load_rules([default_rule_dir(), default_rule_dir() / SOURCE])
