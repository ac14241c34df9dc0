"""Temp files and folders that name their owner's pid, and removal of those whose owner died.

Every temp name aotpack makes carries ``pid<pid>`` (``.kernel.so.pid1234.tmp``,
``.mlp-0.1.0.aotpack.pid1234.xyz.partial``, ``aotpack-model-pid1234-xyz``). A SIGKILLed build
cannot clean up after itself; the next build removes what such dead processes left,
and never touches the files of a build that is still running.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("aotpack")

#: A temp name's owner: ``.<anything>.pid<pid>.<anything>`` or ``aotpack-<what>-pid<pid>-<anything>``.
_OWNED = re.compile(r"^(?:\..+\.pid(\d+)\.|aotpack-[a-z]+-pid(\d+)-)")


def tag() -> str:
    """The ``pid<pid>`` part this process puts into its temp names."""
    return f"pid{os.getpid()}"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def owner(name: str) -> int | None:
    """The pid a temp name belongs to, or None for a name aotpack did not make."""
    found = _OWNED.match(name)
    if not found:
        return None
    return int(found.group(1) or found.group(2))


def remove_dead(folder: Path, pattern: str = "*") -> int:
    """Remove the temp files and folders in ``folder`` whose owner process is gone.

    Returns:
        How many were removed (each is logged at INFO).
    """
    removed = 0
    try:
        candidates = list(Path(folder).glob(pattern))
    except OSError:
        return 0
    for path in candidates:
        pid = owner(path.name)
        if pid is None or _alive(pid):
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed += 1
        log.info("removed %s, left by an aotpack process (pid %d) that was killed", path, pid)
    return removed


def temp_prefix(what: str) -> str:
    """``aotpack-<what>-pid<pid>-``: the prefix of this process's temp folders in TMPDIR."""
    return f"aotpack-{what}-{tag()}-"


def clean_tmpdir() -> int:
    """Remove aotpack temp folders in TMPDIR left by killed processes."""
    return remove_dead(Path(tempfile.gettempdir()), "aotpack-*")
