"""Progress: long runs show each phase as it runs, in a terminal, in Jupyter, or as plain lines.

A function decorated with :func:`tracked` runs its phases under :func:`timed` (or names them with
:func:`phase`) and reports steps with :func:`step`.  Each phase is logged on the ``rlx_egraph`` logger
(:mod:`rlx_egraph.log`: INFO one line per phase with its time and outcome, DEBUG the steps).  A run
lasting over ``after`` seconds (1 s) shows its phases, drawn in the way :func:`progress_mode` picks:
``terminal`` (a live display on stderr drawn with ``rich``: a spinner, the elapsed time and the last
step for the running phase, a tick and the time for each finished one; removed at the end),
``jupyter`` (an HTML block in the cell's output, updated in place, left showing the phase times),
``lines`` (plain lines on stderr: each phase as it starts, a line on the running phase every
:data:`LINE_INTERVAL` seconds, and the total at the end) or ``off``.
"""

from __future__ import annotations

import functools
import html
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from ..log import LOGGER

MODES = ("auto", "terminal", "jupyter", "lines", "off")
ENV_MODE = "RLX_EGRAPH_PROGRESS"  # a mode from MODES; set_progress() takes precedence
SHOW_AFTER_SECONDS = 1.0
LINE_INTERVAL = 5.0  # seconds between two lines on the running phase (``lines``)
JUPYTER_INTERVAL = 0.25  # seconds between two redraws of the same phase (``jupyter``)

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class _Settings:
    mode: str | None = None  # None: the environment variable, else "auto"
    after: float = SHOW_AFTER_SECONDS


_SETTINGS = _Settings()


def set_progress(mode: str = "auto", after: float = SHOW_AFTER_SECONDS) -> None:
    """Choose how runs show their progress (one of :data:`MODES`; ``auto`` picks, see :func:`progress_mode`),
    for runs lasting over ``after`` seconds.  This process only; ``RLX_EGRAPH_PROGRESS`` sets the mode too."""
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(after, bool) or not isinstance(after, int | float) or not after >= 0:
        raise ValueError(f"after must be a number of seconds >= 0, got {after!r}")
    _SETTINGS.mode, _SETTINGS.after = mode, float(after)


@contextmanager
def progress_set(mode: str = "auto", after: float | None = None) -> Iterator[None]:
    """:func:`set_progress` for the block's duration."""
    saved = _Settings(_SETTINGS.mode, _SETTINGS.after)
    set_progress(mode, _SETTINGS.after if after is None else after)
    try:
        yield
    finally:
        _SETTINGS.mode, _SETTINGS.after = saved.mode, saved.after


def progress_mode() -> str:
    """The mode a run starting now draws in: the one set (``set_progress``, else ``RLX_EGRAPH_PROGRESS``), or for
    ``auto``: ``off`` under pytest, ``jupyter`` in a Jupyter kernel, ``terminal`` when stderr is a terminal, else
    ``lines``."""
    mode = _SETTINGS.mode or os.environ.get(ENV_MODE, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV_MODE} must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "auto":
        return mode
    if "PYTEST_CURRENT_TEST" in os.environ:
        return "off"
    if in_jupyter():
        return "jupyter"
    return "terminal" if _stderr_is_terminal() else "lines"


def in_jupyter() -> bool:
    """Whether this runs in a Jupyter kernel (IPython with a kernel: JupyterLab, Notebook, VS Code, Colab)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except ValueError:  # a closed stream
        return False


class PhaseProgress:
    """The phases of one run: logged as they end, drawn once the run is long (see the module doc).

    ``mode``: one of ``terminal``, ``jupyter``, ``lines``, ``off`` (None: :func:`progress_mode`).
    """

    def __init__(self, title: str, mode: str | None = None, after: float | None = None) -> None:
        self.title = title
        self.mode = progress_mode() if mode is None else mode
        if self.mode not in MODES[1:]:
            raise ValueError(f"mode must be one of {', '.join(MODES[1:])}, got {self.mode!r}")
        self.after = _SETTINGS.after if after is None else after
        self.done: list[tuple[str, float]] = []  # finished phases and their seconds
        self.current: str | None = None
        self.detail = ""  # the running phase's last step
        self._start = self._phase_start = self._last_line = time.perf_counter()
        self._lock = threading.RLock()
        self._timer: threading.Timer | None = None
        self._view: _View | None = None  # once drawn
        self._closed = False

    def phase(self, name: str) -> None:
        """End the running phase (if any) and start ``name``."""
        with self._lock:
            self._end_phase()
            self.current, self.detail, self._phase_start = name, "", time.perf_counter()
            if self._view is not None:
                self._view.phase_started()
            elif self.mode != "off":
                self._draw_when_due()

    def step(self, detail: str) -> None:
        """What the running phase is doing now (shown beside it)."""
        with self._lock:
            self.detail = detail
            if self._view is not None:
                self._view.stepped()
            elif self.mode != "off":
                self._draw_when_due()

    def end_phase(self) -> float:
        """End the running phase; returns its seconds (0 if none runs)."""
        with self._lock:
            return self._end_phase()

    def close(self) -> None:
        """End the running phase and finish the display (see the module doc for what stays)."""
        with self._lock:
            self._end_phase()
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._view is not None:
                self._view.close()

    @property
    def drawing(self) -> bool:
        """Whether the run is shown now."""
        return self._view is not None and not self._closed

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def text(self) -> str:
        """``rlx-egraph optimize: saturate (fuse: iteration 3)...  (encode 0.41 s)``; after the run, the total."""
        done = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.done)
        if self.current is None:
            return f"rlx-egraph {self.title}: done in {self.elapsed:.2f} s" + (f" ({done})" if done else "")
        detail = f" ({self.detail})" if self.detail else ""
        return f"rlx-egraph {self.title}: {self.current}{detail}..." + (f"  ({done})" if done else "")

    def _end_phase(self) -> float:
        if self.current is None:
            return 0.0
        seconds = time.perf_counter() - self._phase_start
        self.done.append((self.current, seconds))
        self.current, self.detail = None, ""
        if self._view is not None and not self._closed:
            self._view.phase_ended()
        return seconds

    def _draw_when_due(self) -> None:
        """Draw now if the run is already long, else arrange to (a timer, except in Jupyter: a kernel routes
        output by the thread's context, so the display is made by the run's own thread, at its next step)."""
        if self._closed:
            return
        if self.elapsed >= self.after:
            self._draw()
        elif self._timer is None and self.mode != "jupyter":
            self._timer = threading.Timer(self.after - self.elapsed, self._draw)
            self._timer.daemon = True
            self._timer.start()

    def _draw(self) -> None:
        with self._lock:
            if self._view is None and not self._closed and self.current is not None:
                self._view = _VIEWS[self.mode](self)


class _View:
    """How a drawn run looks in one mode; called under the run's lock."""

    def __init__(self, run: PhaseProgress) -> None:
        self.run = run

    def phase_started(self) -> None: ...

    def phase_ended(self) -> None: ...

    def stepped(self) -> None: ...

    def close(self) -> None: ...


class _Lines(_View):
    """Plain lines on stderr."""

    def __init__(self, run: PhaseProgress) -> None:
        super().__init__(run)
        self.phase_started()

    def phase_started(self) -> None:
        self._print(self.run.text())

    def stepped(self) -> None:
        if time.perf_counter() - self.run._last_line >= LINE_INTERVAL:
            seconds = time.perf_counter() - self.run._phase_start
            self._print(f"rlx-egraph {self.run.title}: {self.run.current} running for {seconds:.1f} s"
                        + (f" ({self.run.detail})" if self.run.detail else ""))

    def close(self) -> None:
        self._print(self.run.text())

    def _print(self, line: str) -> None:
        self.run._last_line = time.perf_counter()
        print(line, file=sys.stderr, flush=True)


class _Terminal(_View):
    """A rich live display on stderr: one row per phase, its time, and the running phase's step."""

    def __init__(self, run: PhaseProgress) -> None:
        super().__init__(run)
        from rich.console import Console
        from rich.progress import Progress, ProgressColumn, SpinnerColumn, TextColumn
        from rich.text import Text

        class Seconds(ProgressColumn):
            def render(self, task: Any) -> Text:
                seconds = task.fields["seconds"] if task.finished else task.elapsed
                return Text(f"{seconds or 0.0:.1f} s", style="progress.elapsed")

        self.progress = Progress(SpinnerColumn(finished_text="[green]✓"), TextColumn("{task.description}"),
                                 Seconds(), TextColumn("[dim]{task.fields[detail]}"),
                                 console=Console(stderr=True), transient=True)
        for name, seconds in run.done:
            self.progress.add_task(f"{run.title}: {name}", total=1, completed=1, detail="", seconds=seconds)
        self.task: Any = None
        self.progress.start()
        self.phase_started()

    def phase_started(self) -> None:
        self.task = self.progress.add_task(f"{self.run.title}: {self.run.current}", total=1, detail="", seconds=0.0)

    def stepped(self) -> None:
        if self.task is not None:
            self.progress.update(self.task, detail=self.run.detail)

    def phase_ended(self) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=1, detail="", seconds=self.run.done[-1][1])
            self.task = None

    def close(self) -> None:
        self.progress.stop()


class _Jupyter(_View):
    """An HTML block in the cell's output, updated in place."""

    def __init__(self, run: PhaseProgress) -> None:
        super().__init__(run)
        from IPython.display import HTML, display

        self.html = HTML
        self.last = time.perf_counter()
        self.handle = display(HTML(self.render()), display_id=True)

    def phase_started(self) -> None:
        self.update()

    def stepped(self) -> None:
        if time.perf_counter() - self.last >= JUPYTER_INTERVAL:
            self.update()

    def close(self) -> None:
        self.update()

    def update(self) -> None:
        self.last = time.perf_counter()
        if self.handle is not None:
            self.handle.update(self.html(self.render()))

    def render(self) -> str:
        run = self.run
        rows = [f"<tr><td>✓</td><td>{html.escape(name)}</td><td>{seconds:.2f} s</td><td></td></tr>"
                for name, seconds in run.done]
        if run.current is not None:
            seconds = time.perf_counter() - run._phase_start
            rows.append(f"<tr><td>…</td><td>{html.escape(run.current)}</td><td>{seconds:.1f} s</td>"
                        f"<td>{html.escape(run.detail)}</td></tr>")
            head = f"rlx-egraph {html.escape(run.title)}: running for {run.elapsed:.1f} s"
        else:
            head = f"rlx-egraph {html.escape(run.title)}: done in {run.elapsed:.2f} s"
        return (f'<div class="rlx-progress" style="font-family:monospace;font-size:12px"><div>{head}</div>'
                f'<table style="border-collapse:collapse">{"".join(rows)}</table></div>')


_VIEWS: dict[str, Callable[[PhaseProgress], _View]] = {"terminal": _Terminal, "jupyter": _Jupyter, "lines": _Lines}

_RUNNING: ContextVar[PhaseProgress | None] = ContextVar("rlx_egraph_progress", default=None)


@contextmanager
def tracking(title: str, mode: str | None = None) -> Iterator[PhaseProgress]:
    """Make a :class:`PhaseProgress` the one :func:`phase` and :func:`step` report to, and close it at the end.
    Inside another tracked run, the outer run's display is used (a run inside a run is one of its phases)."""
    outer = _RUNNING.get()
    if outer is not None:
        yield outer
        return
    progress = PhaseProgress(title, mode)
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


def step(detail: str) -> None:
    """Say what the running phase of the tracked run is doing now (nothing outside one)."""
    progress = _RUNNING.get()
    if progress is not None:
        progress.step(detail)


class PhaseOutcome:
    """What :func:`timed` logs at the end of a phase: ``summary``, set by the phase's code."""

    summary: str = ""


@contextmanager
def timed(name: str, times: dict[str, float], title: str = "optimize") -> Iterator[PhaseOutcome]:
    """Run a phase: shown as running (:func:`phase`), its seconds added to ``times[name]``, and logged at INFO
    with the ``summary`` the block sets: ``optimize: saturate 0.086 s: 4 stages, 23 iterations``."""
    outcome = PhaseOutcome()
    phase(name)
    start = time.perf_counter()
    try:
        yield outcome
    finally:
        progress = _RUNNING.get()
        if progress is not None and progress.current == name:
            progress.end_phase()
        seconds = time.perf_counter() - start
        times[name] = times.get(name, 0.0) + seconds
        LOGGER.info("%s: %s %.3f s%s", title, name, seconds, f": {outcome.summary}" if outcome.summary else "")
