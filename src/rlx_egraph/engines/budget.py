"""The budgets of one optimize run: its wall-clock deadline, shared by its phases, and the memory it may hold;
and the collector paused during it."""

from __future__ import annotations

import gc
import math
import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MB = float(1 << 20)
# Where a cgroup (a container's or a systemd slice's) states the memory its processes may hold, v2 then v1.
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


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


def _address_space_limited() -> bool:
    """Whether an address-space rlimit (``ulimit -v``) is set: then allocations fail at the process's virtual
    size, which is what :func:`memory_in_use_mb` counts."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return soft != resource.RLIM_INFINITY


def memory_in_use_mb() -> float:
    """The process's memory in MB as the limits count it: its resident set, or its virtual size when an
    address-space rlimit is set (Linux ``/proc/self/statm``; elsewhere the peak resident set so far)."""
    try:
        size, resident = Path("/proc/self/statm").read_text().split()[:2]
    except (OSError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / MB if sys.platform == "darwin" else peak / 1024.0  # bytes on macOS, KiB elsewhere
    pages = int(size) if _address_space_limited() else int(resident)
    return pages * os.sysconf("SC_PAGE_SIZE") / MB


def machine_memory_mb() -> float:
    """The memory this process may hold, in MB: the least of the machine's physical memory, its cgroup's
    limit and its address-space and data rlimits (those that are set)."""
    bounds = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / MB]
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            bounds.append(int(text) / MB)
    for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft, _ = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY:
            bounds.append(soft / MB)
    return min(bounds)


def default_max_memory_mb() -> float:
    """The default ``max_memory_mb``: half of :func:`machine_memory_mb` (rounded down to a whole MB)."""
    return float(math.floor(machine_memory_mb() / 2))
