"""The wall-clock budget of one optimize run, shared by its phases, and the collector paused during it."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager


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


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (then restored): a run allocates millions of objects that
    live until its end (e-nodes, records, rewriter entries), and every full collection rescans them all (a
    fifth of the time at 100k nodes).

    A run leaves no reference cycles of its own (a test checks), so what it allocated and still holds at its end
    is what it returns: long-lived data.  The collector counts it as young all the same, and its next two
    passes would scan all of it (about 0.25 s after the fallback at 100k nodes, 0.45 s after the egglog engine,
    each time the run is repeated).  So when the collector is back on, everything it tracks joins the oldest
    generation (``gc.freeze`` then ``gc.unfreeze``: two list splices), as a later pass would have put it; unless
    the caller has frozen objects of its own, which must stay frozen."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
