"""The wall-clock budget of one optimize run, shared by its phases."""

from __future__ import annotations

import math
import time


class DeadlineExceeded(RuntimeError):
    """A phase could not finish before the run's deadline."""


class Deadline:
    """The end of a run that started at ``start`` with ``seconds`` to spend (``math.inf``: no end)."""

    def __init__(self, seconds: float = math.inf, start: float | None = None) -> None:
        self.seconds = seconds
        self.start = time.perf_counter() if start is None else start
        self.end = self.start + seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        return self.end - time.perf_counter()

    def expired(self) -> bool:
        return time.perf_counter() >= self.end

    def check(self, what: str) -> None:
        """Raise :class:`DeadlineExceeded` naming ``what`` if the time is up."""
        if self.expired():
            raise DeadlineExceeded(f"{what} did not finish within max_seconds={self.seconds:g}")
