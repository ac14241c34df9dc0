"""The native runtime's extraction cache ($XDG_CACHE_HOME/aotpack/runtime): list its
entries and prune them (``aotpack cache list|prune``), with the runtime's own protocol
(docs/archive.md "Extraction cache"): an entry is ``<manifest sha256>/`` holding the
archive's files, a ``.aotpack-complete`` marker (``bytes N``: the entry's size) and a
``.aotpack-lock`` file that every process using the entry holds a shared flock on; its
mtime is the entry's last use. An entry is removed only under an exclusive, non-blocking
flock (so never while in use), by renaming it into ``tmp/`` first.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from aotpack import env
from aotpack.errors import AotpackError

ENV_CACHE = env.RUNTIME_CACHE.name
ENV_CAP_MB = env.RUNTIME_CACHE_MB.name
DEFAULT_CAP_MB = env.RUNTIME_CACHE_MB.default
MARKER = ".aotpack-complete"
LOCK = ".aotpack-lock"
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}")


@dataclass
class Entry:
    """One cache entry: its folder, model name and version, size in bytes, last use
    (seconds since the epoch) and whether a process holds it now."""
    path: Path
    name: str
    version: str
    bytes: int
    last_use: float
    in_use: bool


def cache_root() -> Path | None:
    """The runtime's cache root, as the runtime computes it; None when it is off
    (AOTPACK_RUNTIME_CACHE=0) or no home folder is known."""
    if not env.get(env.RUNTIME_CACHE):
        return None
    base = env.raw(env.XDG_CACHE_HOME) or ""
    if not base.startswith("/"):
        home = env.raw(env.HOME) or ""
        if not home.startswith("/"):
            return None
        base = os.path.join(home, ".cache")
    return Path(base.rstrip("/") or "/") / "aotpack" / "runtime"


def cap_bytes() -> int:
    """AOTPACK_RUNTIME_CACHE_MB in bytes (default 4096 MiB).

    Raises:
        AotpackError: the value is not a whole number of MiB.
    """
    return env.get(env.RUNTIME_CACHE_MB) << 20


def _check_private(path: Path) -> None:
    """Refuse a cache folder that is a link or another user's (the runtime does not use it)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise AotpackError(f"'{path}' is not a folder of this user (a link or another user's); "
                           "the runtime does not use it: remove it by hand")


def _entry_bytes(path: Path) -> int:
    try:
        found = re.search(r"^bytes (\d+)$", (path / MARKER).read_text(), re.M)
    except OSError:
        found = None
    if found:
        return int(found.group(1))
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _in_use(path: Path) -> bool:
    try:
        fd = os.open(path / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def entries(root: Path) -> list[Entry]:
    """The entries under ``root``, least recently used first.

    Raises:
        AotpackError: ``root`` or a level above it inside the cache is a link or another user's.
    """
    if not root.exists():
        return []
    _check_private(root.parent)
    _check_private(root)
    found = []
    for path in sorted(root.iterdir()):
        if not _ENTRY_NAME.fullmatch(path.name) or not path.is_dir() or path.is_symlink():
            continue
        try:
            manifest = json.loads((path / "manifest.json").read_text())
            name, version = str(manifest.get("name", "?")), str(manifest.get("version", "?"))
        except (OSError, ValueError, AttributeError):
            name, version = "?", "?"
        lock = path / LOCK
        last_use = (lock if lock.exists() else path).stat().st_mtime
        found.append(Entry(path, name, version, _entry_bytes(path), last_use, _in_use(path)))
    return sorted(found, key=lambda e: (e.last_use, e.path.name))


def _remove(entry: Path) -> bool:
    """Moves ``entry`` into tmp/ and removes it, unless a process holds it (False)."""
    try:
        fd = os.open(entry / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None  # an entry of an older runtime
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        tmp = entry.parent / "tmp"
        tmp.mkdir(mode=0o700, exist_ok=True)
        lock_fd, lock = tempfile.mkstemp(prefix="x-", suffix=".lock", dir=tmp)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # the runtime's cleaner leaves it alone
            aside = Path(lock[:-len(".lock")])
            os.rename(entry, aside)
            shutil.rmtree(aside, ignore_errors=True)
        finally:
            os.unlink(lock)
            os.close(lock_fd)
        return True
    finally:
        if fd is not None:
            os.close(fd)


def prune(root: Path, max_bytes: int | None) -> tuple[list[Entry], list[Entry]]:
    """Removes entries no process uses, least recently used first, until the cache holds
    at most ``max_bytes`` (None: remove every entry not in use). Returns (removed, kept).

    Raises:
        AotpackError: the cache folders are a link or another user's.
    """
    found = entries(root)
    total = sum(e.bytes for e in found)
    removed, kept = [], []
    for entry in found:
        if (max_bytes is None or total > max_bytes) and _remove(entry.path):
            removed.append(entry)
            total -= entry.bytes
        else:
            kept.append(entry)
    return removed, kept


def format_size(n: int) -> str:
    """'512 B', '21.5 KiB', '3.0 MiB', '1.2 GiB'."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def _count(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def list_lines(root: Path | None) -> list[str]:
    """``aotpack cache list``: one line per entry (least recently used first) and a total."""
    if root is None:
        return [f"the extraction cache is off ({ENV_CACHE}=0 or no home folder)"]
    found = entries(root)
    lines = [f"{'ENTRY':<12}  {'MODEL':<24}  {'SIZE':>10}  {'LAST USE':<19}  IN USE"]
    for e in found:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_use))
        lines.append(f"{e.path.name[:12]}  {(e.name + ' ' + e.version)[:24]:<24}  "
                     f"{format_size(e.bytes):>10}  {used:<19}  {'yes' if e.in_use else 'no'}")
    lines.append(f"{_count(len(found))}, {format_size(sum(e.bytes for e in found))} in {root} "
                 f"(cap {cap_bytes() >> 20} MiB, {ENV_CAP_MB})")
    return lines


def prune_lines(root: Path | None, max_bytes: int | None) -> list[str]:
    """``aotpack cache prune``: what was removed and what is left."""
    if root is None:
        return [f"the extraction cache is off ({ENV_CACHE}=0 or no home folder)"]
    removed, kept = prune(root, max_bytes)
    in_use = sum(e.in_use for e in kept)
    return [f"removed {_count(len(removed))} ({format_size(sum(e.bytes for e in removed))}); "
            f"{_count(len(kept))} left ({format_size(sum(e.bytes for e in kept))}), {in_use} in use"]


def add_subcommand(sub) -> None:
    """Registers ``aotpack cache list|prune`` on the CLI's subparsers."""
    c = sub.add_parser("cache", help="list or prune the native runtime's extraction cache")
    actions = c.add_subparsers(dest="cache_command", required=True)
    actions.add_parser("list", help="entries, least recently used first: model, size, last use, in use")
    p = actions.add_parser("prune", help="remove entries no process uses, least recently used first")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--max-mb", type=int, metavar="N",
                     help=f"keep at most N MiB (default: {ENV_CAP_MB}, {DEFAULT_CAP_MB})")
    how.add_argument("--all", action="store_true", help="remove every entry not in use")


def run_subcommand(args) -> int:
    """The ``aotpack cache`` handler: prints the lines, returns 0. Raises AotpackError."""
    root = cache_root()
    if args.cache_command == "list":
        lines = list_lines(root)
    else:
        if args.max_mb is not None and args.max_mb < 0:
            raise AotpackError(f"--max-mb must be >= 0, got {args.max_mb}")
        limit = None if args.all else (args.max_mb << 20 if args.max_mb is not None else cap_bytes())
        lines = prune_lines(root, limit)
    print("\n".join(lines))
    return 0
