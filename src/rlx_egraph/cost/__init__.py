"""The IO cost model: graph profiles, per-node costs and targets.

``profile(graph, target)`` counts a graph's kernel launches, host sync points,
host readback bytes, device traffic bytes and FLOPs; a :class:`Target` turns
the counts into predicted ns, and ``Target.node_ns`` is the per-e-node cost the
extractor minimises.  ``fusion_benefit`` (what a rewrite saves, term by term) and
``Target.should_fuse`` compare two whole graphs by that same cost: there is no
second decision rule.
"""

from .model import FusionBenefit, IoProfile, NodeCost, fusion_benefit, node_cost, profile
from .targets import TARGETS, Target, get_target

__all__ = ["TARGETS", "FusionBenefit", "IoProfile", "NodeCost", "Target", "fusion_benefit", "get_target",
           "node_cost", "profile"]
