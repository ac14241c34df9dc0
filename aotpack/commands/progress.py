"""What a build is doing, while it does it: phases with their times, and counters.

On a terminal (and unless ``-q``) a ``rich`` live display shows the current phase and
its counter (candidates compiled n/N, kernels tuned i/N; a spinner while the total is
unknown), and log lines are printed above it through the display's console; otherwise
each phase start and every quarter of a counter is one log line. Either way the phase
times are kept for the final summary (``BuildResult.seconds``).
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

log = logging.getLogger("aotpack")


class _ConsoleHandler(logging.Handler):
    """Log records printed through a live display's console, so they land above the
    progress line instead of inside it."""

    def __init__(self, console, formatter: logging.Formatter | None):
        super().__init__()
        self._console = console
        self.setFormatter(formatter or logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._console.print(self.format(record), markup=False, highlight=False, soft_wrap=True)
        except Exception:  # a log line must never break the build
            self.handleError(record)


def _stream_handlers() -> list[logging.StreamHandler]:
    """The root logger's plain stream handlers (logging.basicConfig's, writing to stderr);
    file handlers are left alone."""
    return [h for h in logging.getLogger().handlers if type(h) is logging.StreamHandler]


class BuildProgress:
    """Phase timer and progress reporter of one build.

    Args:
        live: use a ``rich`` live display (only when stderr is a terminal, or ``console``).
        console: the ``rich.console.Console`` to draw on (default: stderr's); tests pass
            one that records.
    """

    def __init__(self, live: bool = False, console=None):
        self.seconds: dict[str, float] = {}
        self._rich = None
        self._task = None
        self._last_quarter = -1
        self._swapped: list[tuple[logging.Handler, logging.Handler]] = []
        if live and (console is not None or sys.stderr.isatty()):
            self._rich = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), _CountColumn(),
                                  TimeElapsedColumn(), transient=True,
                                  console=console or Console(stderr=True))

    @contextlib.contextmanager
    def phase(self, name: str, what: str):
        """Time ``name`` (a key of the summary) while ``what`` is shown."""
        start = time.perf_counter()
        if self._rich is not None:
            self._rich.start()
            self._route_logs_to_console()
            self._task = self._rich.add_task(what, total=None)
        else:
            log.info("%s ...", what)
        self._last_quarter = -1
        try:
            yield self
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if self._rich is not None:
                self._rich.remove_task(self._task)
                self._rich.stop()
                self._restore_logs()
                self._task = None

    def count(self, done: int, total: int, what: str) -> None:
        """``done`` of ``total`` items of the current phase (e.g. candidates compiled)."""
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, completed=done, total=total, description=what)
            return
        quarter = 4 * done // max(total, 1)
        if total and quarter != self._last_quarter and (quarter > 0 or done == 0):
            self._last_quarter = quarter
            log.info("  %s: %d/%d", what, done, total)

    def _route_logs_to_console(self) -> None:
        root = logging.getLogger()
        for handler in _stream_handlers():
            routed = _ConsoleHandler(self._rich.console, handler.formatter)
            routed.setLevel(handler.level)
            root.removeHandler(handler)
            root.addHandler(routed)
            self._swapped.append((handler, routed))

    def _restore_logs(self) -> None:
        root = logging.getLogger()
        for handler, routed in self._swapped:
            root.removeHandler(routed)
            root.addHandler(handler)
        self._swapped = []


class _CountColumn(ProgressColumn):
    """``done/total`` once a total is known; nothing before (the spinner says "busy")."""

    def render(self, task) -> Text:
        return Text("" if task.total is None else f"{int(task.completed)}/{int(task.total)}")


def summary(seconds: dict[str, float]) -> list[str]:
    """The phase times as aligned lines (``phase  seconds``), total last."""
    width = max(map(len, seconds), default=5)
    return [f"  {name:<{width}}  {value:7.2f} s" for name, value in seconds.items()]
