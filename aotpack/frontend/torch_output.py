"""Capture what torch writes while it exports: its log records, its ``print(...,
file=sys.stderr)`` dumps (a failed export prints the partial FX graph, often hundreds of
KB) and its warnings, so they reach a debug file instead of the user's terminal.
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings

#: torch's structured-trace logger (TORCH_TRACE): left alone, it writes files, not the terminal.
TRACE_LOGGER = "torch.__trace"


class TorchOutput:
    """Text torch produced inside :func:`captured_torch_output` (log lines, stderr and
    stdout writes, warnings), in the order they came."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    def text(self) -> str:
        """Everything captured so far, as one string ('' when torch said nothing)."""
        return self.stream.getvalue()


def _torch_loggers() -> list[logging.Logger]:
    names = [n for n in list(logging.Logger.manager.loggerDict)
             if (n == "torch" or n.startswith("torch.")) and n != TRACE_LOGGER]
    loggers = [logging.getLogger("torch")]
    loggers += [logging.getLogger(n) for n in names
                if n != "torch" and isinstance(logging.Logger.manager.loggerDict[n], logging.Logger)]
    return loggers


@contextlib.contextmanager
def captured_torch_output():
    """Within the block, torch's log records (at the levels torch has set), writes to
    ``sys.stderr``/``sys.stdout`` and warnings go into the yielded :class:`TorchOutput`
    instead of the terminal. Loggers, streams and warning filters are restored on exit,
    also when the block raises."""
    output = TorchOutput()
    handler = logging.StreamHandler(output.stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved = [(logger, logger.handlers[:]) for logger in _torch_loggers()]
    for logger, handlers in saved:
        if handlers or logger.name == "torch":
            logger.handlers = [handler]
    try:
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stderr(output.stream), contextlib.redirect_stdout(output.stream):
            warnings.simplefilter("always")
            try:
                yield output
            finally:
                for w in caught:
                    output.stream.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
    finally:
        for logger, handlers in saved:
            logger.handlers = handlers
