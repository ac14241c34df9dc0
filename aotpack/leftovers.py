"""Temp files and folders that name their owner's pid, and removal of those whose owner died.

Every temp name aotpack makes carries ``pid<pid>`` (``.mm_1-3f2a.json.pid1234.tmp``,
``.mlp-0.1.0.aotpack.pid1234.xyz.partial``, ``aotpack-model-pid1234-xyz``). A SIGKILLed build
cannot clean up after itself; the next build removes what such dead processes left,
and never touches the files of a build that is still running. The compiler's own temp
files (gcc's ``cc*.o``/``cc*.s``) go to a folder of the same kind, ``<build
cache>/tmp/aotpack-cc-pid1234-xyz``, its ``TMPDIR`` (``compiler_tmpdir``).
"""
from __future__ import annotations

import contextlib
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


def compiler_temp_root(cache_dir: Path) -> Path:
    """Where compiler runs of builds using the build cache ``cache_dir`` keep their temp
    folders (``compiler_tmpdir``)."""
    return Path(cache_dir) / "tmp"


@contextlib.contextmanager
def compiler_tmpdir(root: Path):
    """A new folder ``<root>/aotpack-cc-pid<pid>-*`` for one compiler run's temp files
    (pass it as the child's ``TMPDIR``), removed when the block ends. Folders of killed
    processes under ``root`` are removed first, so a SIGKILLed build leaves them only until
    the next compile.

    Raises:
        OSError: ``root`` cannot be created.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    remove_dead(root, "aotpack-cc-*")
    folder = tempfile.mkdtemp(prefix=temp_prefix("cc"), dir=root)
    try:
        yield Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
