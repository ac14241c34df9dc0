"""The build's live display: log lines above the progress line, spinners for unknown totals."""
from __future__ import annotations

import io
import logging
import re

import pytest
from rich.console import Console

from aotpack.commands.progress import BuildProgress


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _screen_lines(raw: str) -> list[str]:
    """What a terminal keeps: every \\r or \\n ends a line; ANSI codes removed."""
    return [part.strip() for part in re.split(r"[\r\n]", _ANSI.sub("", raw)) if part.strip()]


@pytest.fixture
def terminal_logging():
    """logging.basicConfig's stderr handler, as the CLI installs it, for one test."""
    root = logging.getLogger()
    handler = logging.StreamHandler(io.StringIO())  # stands for stderr
    handler.setFormatter(logging.Formatter("aotpack: %(message)s"))
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def test_log_lines_print_above_the_live_line_and_the_handler_comes_back(terminal_logging):
    screen = io.StringIO()
    progress = BuildProgress(live=True, console=Console(file=screen, force_terminal=True, width=120))
    with progress.phase("compile_model_so", "compiling model/model.so"):
        assert terminal_logging not in logging.getLogger().handlers
        logging.getLogger("aotpack").info("compiled graph vs eager PyTorch: max abs error 4.47e-08")
    assert terminal_logging in logging.getLogger().handlers
    assert "aotpack: compiled graph vs eager PyTorch: max abs error 4.47e-08" in _screen_lines(screen.getvalue())
    assert terminal_logging.stream.getvalue() == ""  # nothing written past the display
    assert set(progress.seconds) == {"compile_model_so"}


def test_a_phase_without_a_total_shows_no_count_and_a_counted_one_does():
    screen = io.StringIO()
    progress = BuildProgress(live=True, console=Console(file=screen, force_terminal=True, width=120))
    with progress.phase("lower", "lowering and fusing"):
        progress._rich.refresh()
        busy = _screen_lines(screen.getvalue())[-1]
        progress.count(3, 10, "candidates compiled")
        progress._rich.refresh()
        counted = _screen_lines(screen.getvalue())[-1]
    assert busy.startswith(("⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏")) and "lowering and fusing" in busy
    assert "/?" not in busy and "0/" not in busy
    assert "candidates compiled" in counted and " 3/10 " in counted


def test_without_a_terminal_each_phase_is_a_log_line(caplog):
    progress = BuildProgress(live=True)  # pytest's stderr is not a terminal
    with caplog.at_level(logging.INFO, logger="aotpack"):
        with progress.phase("export", "exporting m.py (torch.export)"):
            progress.count(0, 4, "kernels tuned")
            progress.count(4, 4, "kernels tuned")
    assert [r.getMessage() for r in caplog.records] == [
        "exporting m.py (torch.export) ...", "  kernels tuned: 0/4", "  kernels tuned: 4/4"]
