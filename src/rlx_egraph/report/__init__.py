"""Reports: what an optimization did and why."""

from .optimize_report import OptimizeReport

__all__ = ["OptimizeReport"]
