"""Stage: bundle the winners, model.so, weights and manifest into a ``.aotpack``.

Format: docs/archive.md (format_version 1) — a zstd-compressed tar, manifest first,
entries sorted, fixed owners, modes and mtimes, so equal inputs give equal bytes.
The archive is written to a temp file beside the target and renamed into place.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import zstandard

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MODEL_LIBRARY = "model/model.so"
MODEL_SOURCE = "model/model.cpp"
WEIGHTS = "weights/weights.safetensors"
ZSTD_LEVEL = 19


def _mtime() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = _mtime()
    info.mode = 0o755 if name.endswith(".so") else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def file_table(files: dict[str, bytes]) -> dict[str, dict]:
    """``{path: {"sha256", "size"}}`` for the manifest."""
    return {path: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for path, data in sorted(files.items())}


def write_archive(target: Path, manifest: dict, files: dict[str, bytes]) -> Path:
    """Write ``target`` atomically: manifest (with the file table) + ``files``.

    Args:
        manifest: every manifest key except ``files``, which is computed here.
        files: archive path -> content.
    """
    manifest = dict(manifest, files=file_table(files))
    manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST, manifest_bytes)
        for path in sorted(files):
            _add(tar, path, files[path])
    compressed = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(raw.getvalue())
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(compressed)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; archives are meant to be shared
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_manifest(archive: Path) -> dict:
    """The manifest of an archive (Python-side inspection; the runtime verifies)."""
    with open(archive, "rb") as handle:
        reader = zstandard.ZstdDecompressor().stream_reader(handle)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for member in tar:
                if member.name == MANIFEST:
                    return json.loads(tar.extractfile(member).read())
    raise ValueError(f"{archive}: no {MANIFEST}")


def read_members(archive: Path) -> dict[str, bytes]:
    """Every regular file of an archive, by path."""
    out = {}
    with open(archive, "rb") as handle:
        reader = zstandard.ZstdDecompressor().stream_reader(handle)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for member in tar:
                if member.isfile():
                    out[member.name] = tar.extractfile(member).read()
    return out
