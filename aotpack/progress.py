"""What a build is doing, while it does it: phases with their times, and counters.

On a terminal (and unless ``-q``) a ``rich`` live display shows the current phase and
its counter (candidates compiled n/N, kernels tuned i/N); otherwise each phase start
and every quarter of a counter is one log line. Either way the phase times are kept
for the final summary (``BuildResult.seconds``).
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time

log = logging.getLogger("aotpack")


class BuildProgress:
    """Phase timer and progress reporter of one build.

    Args:
        live: use a ``rich`` live display (only when stderr is a terminal).
    """

    def __init__(self, live: bool = False):
        self.seconds: dict[str, float] = {}
        self._rich = None
        self._task = None
        self._last_quarter = -1
        if live and sys.stderr.isatty():
            try:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            except ImportError:  # rich is optional: plain lines
                return
            self._rich = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), transient=True)

    @contextlib.contextmanager
    def phase(self, name: str, what: str):
        """Time ``name`` (a key of the summary) while ``what`` is shown."""
        start = time.perf_counter()
        if self._rich is not None:
            self._rich.start()
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


def summary(seconds: dict[str, float]) -> list[str]:
    """The phase times as aligned lines (``phase  seconds``), total last."""
    width = max(map(len, seconds), default=5)
    return [f"  {name:<{width}}  {value:7.2f} s" for name, value in seconds.items()]
