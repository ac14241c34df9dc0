"""The build cache: compiled candidates and tuning choices, safe across processes.

Layout (under ``AOTPACK_CACHE_DIR``)::

    <cache>/<backend>/<kernel base name>/<artifact_hash>/
        compile.lock                    serialises compile + autotune of this kernel
        static_kernel/<kernel_key>/     kernel.cpp + kernel.so of one candidate
        wrapper.cpp, wrapper.so         kernel_key -> TilingInfo map of the timed candidates
        optimize_tiling                 "tiling_repr|workspace|block_dim" of the winner
        timings.json                    the candidates it was chosen among, with timings (us)
        ship/<source hash>/wrapper.so   the shipped wrapper: the winner's TilingInfo only
    <cache>/<backend>/binaries/<source + toolchain hash>/lib.so, source.cpp

``artifact_hash`` covers the kernel (``kernel_id``), the toolchain fingerprint
(compiler, flags, target ISA), the device limit and the candidate set: the tuning
choice in it is keyed by all of them. Binaries are keyed by source + toolchain in
``binaries/`` and linked into the kernel folders, so another ``--topn`` (another
folder) reuses every candidate already compiled. Wrappers are compiled per folder and
never linked: the dynamic loader treats two links of one file as one library, and a
wrapper holds its kernel's loaded state. A binary in a kernel folder is reused
only if the source stored beside it equals the source generated now.
Every file is written to a temp name and renamed, so a crash never leaves a
half-written entry.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout

from aotpack.errors import AotpackError

LOCK_TIMEOUT_S = 900


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` via a temp file in the same folder + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
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
    """Compiled binaries keyed by source + toolchain fingerprint (``<root>/<hash>/lib.so``)."""

    def __init__(self, root: Path, fingerprint: str):
        self.root = root
        self.fingerprint = fingerprint

    def path(self, source: str) -> Path:
        """Where the binary of ``source`` lives (it may not exist yet)."""
        return self.root / digest(source, self.fingerprint) / "lib.so"

    def provide(self, source: str, output: Path, source_file: Path, compile_fn) -> bool:
        """Make ``output`` the binary of ``source``: from the store, else compiled into it.

        Returns:
            Whether a compiler ran.
        """
        stored = self.path(source)
        compiled = False
        if not is_current(stored, stored.with_name("source.cpp"), source):
            write_atomic(stored.with_name("source.cpp"), source)
            compile_fn(stored.with_name("source.cpp"), stored)
            compiled = True
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = output.with_name(f".{output.name}.{os.getpid()}.link")
        tmp.unlink(missing_ok=True)
        try:
            os.link(stored, tmp)
        except OSError:  # another file system: copy
            shutil.copyfile(stored, tmp)
        os.replace(tmp, output)
        write_atomic(source_file, source)
        return compiled


def is_current(binary: Path, source_file: Path, source: str) -> bool:
    """``binary`` exists and was compiled from exactly ``source`` (stored in ``source_file``)."""
    try:
        return binary.is_file() and source_file.read_text() == source
    except (OSError, UnicodeDecodeError):
        return False


class KernelFolder:
    """Paths inside one kernel's cache folder (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path

    def static_kernel(self, kernel_key: str) -> Path:
        """``static_kernel/<kernel_key>/`` of one candidate."""
        return self.path / "static_kernel" / kernel_key

    @property
    def wrapper(self) -> Path:
        """The PGO wrapper (every timed candidate's TilingInfo)."""
        return self.path / "wrapper.so"

    @property
    def wrapper_source(self) -> Path:
        """Source of the PGO wrapper."""
        return self.path / "wrapper.cpp"

    def shipped_wrapper(self, source: str) -> Path:
        """``ship/<source hash>/wrapper.so``: the wrapper that goes into the archive."""
        return self.path / "ship" / digest(source, length=16) / "wrapper.so"

    @property
    def optimize_tiling(self) -> Path:
        """``tiling_repr|workspace|block_dim`` of the winner."""
        return self.path / "optimize_tiling"

    @property
    def timings(self) -> Path:
        """``{"candidates": [kernel_key...], "timings_us": [...]}`` of the choice."""
        return self.path / "timings.json"

    def read_choice(self, candidates: list) -> tuple[int, list[float]] | None:
        """(winner index, timings) recorded for exactly these candidates, if any."""
        try:
            text = self.optimize_tiling.read_text().strip()
            record = json.loads(self.timings.read_text())
        except (OSError, ValueError):
            return None
        keys = [c.kernel_key for c in candidates]
        if not isinstance(record, dict) or record.get("candidates") != keys:
            return None
        for index, candidate in enumerate(candidates):
            if candidate.optimize_tiling == text:
                timings = record.get("timings_us")
                return index, (timings if isinstance(timings, list) else [])
        return None

    def write_choice(self, candidates: list, index: int, timings_us: list[float]) -> None:
        """Record the winner (``optimize_tiling``) and what it was chosen among."""
        record = {"candidates": [c.kernel_key for c in candidates],
                  "timings_us": [round(t, 3) for t in timings_us]}
        write_atomic(self.timings, json.dumps(record))
        write_atomic(self.optimize_tiling, candidates[index].optimize_tiling + "\n")


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
