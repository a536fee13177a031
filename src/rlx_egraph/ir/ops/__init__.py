"""Op declarations; importing this package registers every op."""

from . import fused, primitives

__all__ = ["fused", "primitives"]
