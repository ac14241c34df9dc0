"""The build cache: compiled candidates, safe across processes.

Layout (under ``AOTPACK_CACHE_DIR``)::

    <cache>/<backend>/<kernel base name>/<artifact_hash>/
        compile.lock                    serialises compile + autotune of this kernel
        static_kernel/<kernel_key>/     kernel source + binary of one candidate (``archive.layout`` names)
        wrapper source + binary         kernel_key -> TilingInfo map of the timed candidates
        <binary>.sha256                 "sha256 size" of every binary, written with it
    <cache>/<backend>/binaries/<source + toolchain hash>/lib<binary suffix>, source<source suffix>
    <cache>/<backend>/models/<source + model toolchain hash>/lib, source, compile.lock
                                    the model library of one model source (the backend's model fingerprint)
    <cache>/<backend>/choices/<label>-<key>.json
                                    the tuning record of one choice point (``tune.choice_cache``)

``artifact_hash`` covers the kernel (``kernel_id``), the toolchain fingerprint
(compiler, flags, target), the device limit and the candidate set. Tuning choices (a
kernel's winning tiling, a GEMM step's implementation) are not kept here but in
``choices/``, all in one format. Binaries are keyed by source + toolchain in
``binaries/`` and linked into the kernel folders, so another ``--topn`` (another
folder) reuses every candidate already compiled; ``models/`` does the same for the model library,
so a warm rebuild compiles nothing. Wrappers are compiled per folder and
never linked: the dynamic loader treats two links of one file as one library, and a
wrapper holds its kernel's loaded state. A binary in a kernel folder is reused
only if the source stored beside it equals the source generated now.
Every file is written to a temp name and renamed, so a crash never leaves a
half-written entry; temp names carry the writer's pid, and the next build removes those
of killed writers (``aotpack.leftovers``). Every binary's sha256 and size are recorded
when it is written and re-checked before it is loaded or shipped: a damaged one (a
truncated, emptied or swapped file) is logged at WARNING, moved to ``quarantine/``
beside it and rebuilt.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout

from aotpack import leftovers
from aotpack.archive import layout
from aotpack.errors import AotpackError

log = logging.getLogger("aotpack")

LOCK_TIMEOUT_S = 900


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` via a temp file in the same folder + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{leftovers.tag()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def digest(*parts: str, length: int = 24) -> str:
    """sha256 of ``parts`` (NUL-separated), first ``length`` hex digits."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:length]


def artifact_hash(kernel_id: str, toolchain_fingerprint: str, device_limit: int, kernel_keys=()) -> str:
    """The cache folder of one kernel for one toolchain, device limit and candidate set."""
    return digest(kernel_id, toolchain_fingerprint, str(device_limit), *kernel_keys)


class BinaryStore:
    """Compiled binaries keyed by source + toolchain fingerprint (``<root>/<hash>/lib<binary_suffix>``,
    its source beside it as ``source<source_suffix>``: the backend's suffixes)."""

    def __init__(self, root: Path, fingerprint: str, binary_suffix: str, source_suffix: str):
        self.root = root
        self.fingerprint = fingerprint
        self.binary_suffix = binary_suffix
        self.source_suffix = source_suffix

    def path(self, source: str) -> Path:
        """Where the binary of ``source`` lives (it may not exist yet)."""
        return self.root / digest(source, self.fingerprint) / f"lib{self.binary_suffix}"

    def provide(self, source: str, output: Path, source_file: Path, compile_fn) -> bool:
        """Make ``output`` the binary of ``source``: from the store, else compiled into it.

        Returns:
            Whether a compiler ran.
        """
        stored = self.path(source)
        compiled = False
        leftovers.remove_dead(stored.parent)
        stored_source = stored.with_name(f"source{self.source_suffix}")
        if not is_current(stored, stored_source, source):
            write_atomic(stored_source, source)
            compile_fn(stored_source, stored)
            record(stored)
            compiled = True
        _link(stored, output)
        record(output)
        write_atomic(source_file, source)
        return compiled


def _link(stored: Path, output: Path) -> None:
    """Make ``output`` a hard link of ``stored`` (a copy across file systems), atomically.

    An ``output`` that already is a link of ``stored`` (a build killed before it wrote the
    source beside it) is left as it is: rename() of one file's two links onto each other
    does nothing and would leave the temp link behind.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if os.path.samefile(stored, output):
            return
    tmp = output.with_name(f".{output.name}.{leftovers.tag()}.link")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(stored, tmp)
        except OSError:  # another file system: copy
            shutil.copyfile(stored, tmp)
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)  # still there after an error or a no-op rename


def _file_digest(path: Path) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a file, read in 1 MiB chunks."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _record_path(binary: Path) -> Path:
    return binary.with_name(binary.name + ".sha256")


def record(binary: Path) -> None:
    """Remember ``binary``'s sha256 and size (``<binary>.sha256``), right after writing it."""
    sha, size = _file_digest(binary)
    write_atomic(_record_path(binary), f"{sha} {size}\n")


def damage(binary: Path) -> str | None:
    """Why ``binary`` is not the file recorded for it (None: intact, or nothing recorded)."""
    try:
        text = _record_path(binary).read_text().split()
        want_sha, want_size = text[0], int(text[1])
    except (OSError, ValueError, IndexError):
        return None
    try:
        sha, size = _file_digest(binary)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if size != want_size:
        return f"{size} bytes, {want_size} when it was written"
    if sha != want_sha:
        return "its sha256 differs from when it was written"
    return None


def quarantine(binary: Path, reason: str) -> None:
    """Move a damaged cache file (and its record) aside into ``quarantine/`` beside it, and say so."""
    target = binary.parent / "quarantine" / f"{binary.name}.{leftovers.tag()}"
    target.parent.mkdir(parents=True, exist_ok=True)
    for path, dest in ((binary, target), (_record_path(binary), target.with_name(target.name + ".sha256"))):
        try:
            os.replace(path, dest)
        except OSError:
            Path(path).unlink(missing_ok=True)
    log.warning("cache entry %s is damaged (%s): moved to %s and rebuilt", binary, reason, target)


def is_current(binary: Path, source_file: Path, source: str) -> bool:
    """``binary`` exists, matches its record and was compiled from exactly ``source``
    (stored in ``source_file``). A damaged binary is quarantined (and so not current)."""
    try:
        if not binary.is_file() or source_file.read_text() != source:
            return False
    except (OSError, UnicodeDecodeError):
        return False
    if not _record_path(binary).is_file():  # written by an older aotpack: rebuild to record it
        return False
    reason = damage(binary)
    if reason:
        quarantine(binary, reason)
        return False
    return True


def verified_bytes(binary: Path) -> bytes:
    """The content of a cached binary, checked against its record (what gets shipped).

    Raises:
        AotpackError: the file changed since it was compiled in this build.
    """
    data = binary.read_bytes()
    try:
        want_sha, want_size = _record_path(binary).read_text().split()[:2]
    except (OSError, ValueError):
        raise AotpackError(f"cache entry {binary} has no integrity record; build again") from None
    if len(data) != int(want_size) or hashlib.sha256(data).hexdigest() != want_sha:
        quarantine(binary, "changed during the build")
        raise AotpackError(f"cache entry {binary} changed during the build (another process writing "
                           "the cache?); build again")
    return data


class KernelFolder:
    """Paths inside one kernel's cache folder (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path

    def static_kernel(self, kernel_key: str) -> Path:
        """``static_kernel/<kernel_key>/`` of one candidate."""
        return self.path / layout.STATIC_KERNEL_DIR / kernel_key

    @property
    def wrapper(self) -> Path:
        """The PGO wrapper (every timed candidate's TilingInfo)."""
        return self.path / layout.WRAPPER_NAME

    @property
    def wrapper_source(self) -> Path:
        """Source of the PGO wrapper."""
        return self.path / layout.WRAPPER_SOURCE_NAME


@contextlib.contextmanager
def locked(folders: list[Path]):
    """Hold every folder's ``compile.lock`` (taken in path order: no deadlock between builds).

    Raises:
        AotpackError: a lock was held by another process for longer than the timeout.
    """
    locks = []
    try:
        for folder in sorted(set(folders)):
            folder.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(folder / "compile.lock"), timeout=LOCK_TIMEOUT_S)
            try:
                lock.acquire()
            except Timeout:
                raise AotpackError(f"{folder / 'compile.lock'} is held by another aotpack process for "
                                   f"over {LOCK_TIMEOUT_S} s; wait for it or remove the stale lock") from None
            locks.append(lock)
        yield
    finally:
        for lock in reversed(locks):
            lock.release()
