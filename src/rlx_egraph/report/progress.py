"""Logging and progress: the library logs under ``rlx_egraph``, quiet by default; long runs show their phase.

The ``rlx_egraph`` logger has a NullHandler, so nothing is printed unless the application configures
logging.  egglog logs every command and rule through Python's ``logging`` (thousands of records per
run): its loggers are set to WARNING here unless the application gave them a level of its own.

A function decorated with :func:`tracked` names its phases with :func:`phase`.  Each phase's time is
logged (DEBUG) on the ``rlx_egraph`` logger; a run lasting over :data:`SHOW_AFTER_SECONDS` on an
interactive terminal shows the running phase and the finished ones on stderr (a transient ``rich``
status line; ``rich`` comes with the ``dev`` extra, and without it nothing is drawn), never under pytest
or when stderr is not a TTY.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.util import find_spec
from typing import Any, ParamSpec, TypeVar

LOGGER = logging.getLogger("rlx_egraph")
LOGGER.addHandler(logging.NullHandler())
# the Rust crates of the egglog bindings (pyo3-log names a record's logger after its crate and module)
EGGLOG_LOGGERS = ("egglog", "egglog_ast", "egglog_bridge", "egglog_concurrency", "egglog_core_relations",
                  "egglog_experimental", "egglog_numeric_id", "egglog_reports", "egglog_union_find")
SHOW_AFTER_SECONDS = 1.0

P = ParamSpec("P")
R = TypeVar("R")


def quiet_egglog() -> None:
    """Set egglog's loggers to WARNING, except those the application gave a level."""
    for name in EGGLOG_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


quiet_egglog()


def interactive() -> bool:
    """Whether progress may be drawn: stderr is a terminal, no test is running and ``rich`` is installed."""
    return sys.stderr.isatty() and "PYTEST_CURRENT_TEST" not in os.environ and find_spec("rich") is not None


class PhaseProgress:
    """The phases of one run: logged as they end, drawn on stderr once the run is long (see module doc)."""

    def __init__(self, title: str, show: bool | None = None, show_after: float = SHOW_AFTER_SECONDS) -> None:
        self.title, self.show, self.show_after = title, interactive() if show is None else show, show_after
        self.done: list[tuple[str, float]] = []  # finished phases and their seconds
        self.current: str | None = None
        self._started = time.perf_counter()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._status: Any = None  # a rich Status once drawn
        self._closed = False

    def phase(self, name: str) -> None:
        """End the running phase (if any) and start ``name``."""
        with self._lock:
            self._end_phase()
            self.current, self._started = name, time.perf_counter()
            if self._status is not None:
                self._status.update(self.text())
            elif self.show and self._timer is None:
                self._timer = threading.Timer(self.show_after, self._draw)
                self._timer.daemon = True
                self._timer.start()

    def close(self) -> None:
        """End the running phase and remove the status line."""
        with self._lock:
            self._end_phase()
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._status is not None:
                self._status.stop()

    @property
    def drawing(self) -> bool:
        """Whether the status line is on the terminal now."""
        return self._status is not None and not self._closed

    def text(self) -> str:
        """``rlx-egraph optimize: saturate...  (encode 0.41 s)``."""
        done = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.done)
        return f"rlx-egraph {self.title}: {self.current}..." + (f"  ({done})" if done else "")

    def _end_phase(self) -> None:
        if self.current is not None:
            seconds = time.perf_counter() - self._started
            self.done.append((self.current, seconds))
            LOGGER.debug("%s: %s took %.3f s", self.title, self.current, seconds)
            self.current = None

    def _draw(self) -> None:
        from rich.console import Console

        with self._lock:
            if not self._closed and self.current is not None:
                self._status = Console(stderr=True).status(self.text())
                self._status.start()


_RUNNING: ContextVar[PhaseProgress | None] = ContextVar("rlx_egraph_progress", default=None)


@contextmanager
def tracking(title: str, show: bool | None = None) -> Iterator[PhaseProgress]:
    """Make a :class:`PhaseProgress` the one :func:`phase` reports to, and close it at the end."""
    progress = PhaseProgress(title, show)
    token = _RUNNING.set(progress)
    try:
        yield progress
    finally:
        _RUNNING.reset(token)
        progress.close()


def tracked(title: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: every call of the function runs inside :func:`tracking` ``(title)``."""
    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with tracking(title):
                return function(*args, **kwargs)
        return run
    return decorate


def phase(name: str) -> None:
    """Start phase ``name`` of the innermost tracked run (nothing outside one)."""
    progress = _RUNNING.get()
    if progress is not None:
        progress.phase(name)
