"""Stage: bundle the winners, model.so, weights and manifest into a ``.aotpack``.

Format: docs/archive.md (format_version 1; paths in ``aotpack.layout``) — a
zstd-compressed tar, manifest first, entries sorted, fixed owners, modes and mtimes, so
equal inputs give equal bytes.
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
from typing import Callable

import zstandard

from aotpack.errors import AotpackError
from aotpack import layout
from aotpack.layout import MANIFEST_PATH

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


def _signature(buffers, names) -> list[dict]:
    return [{"name": n, "dtype": str(b.dtype).removeprefix("torch."), "shape": list(b.shape),
             "strides": list(b.strides)} for n, b in zip(names, buffers)]


def _output_signature(graph, names: list[str]) -> list[dict]:
    return [{"name": name, "dtype": str(base.dtype).removeprefix("torch."),
             "shape": list(sizes), "strides": list(strides)}
            for name, (base, sizes, strides, _) in zip(names, graph.outputs)]


def kernel_entries(candidate_sets: dict, choices: dict) -> list[dict]:
    """The manifest's ``kernels``: per distinct kernel its winner, candidates and timings.

    Args:
        candidate_sets: ``kernel_id -> candidates.CandidateSet``.
        choices: ``kernel_id -> autotune.Choice``.
    """
    entries = []
    for kid, cs in candidate_sets.items():
        choice = choices[kid]
        win, name = cs.candidates[choice.index], cs.kernel.name
        entries.append({
            "name": name, "kernel_id": kid, "kernel_key": win.kernel_key, "tiling_repr": win.tiling_repr,
            "workspace": win.workspace, "block_dim": win.block_dim, "candidates": len(cs.candidates),
            "candidate_tilings": [c.tiling_repr for c in cs.candidates],
            "timings_us": [round(t, 3) for t in choice.timings_us], "visited": choice.visited,
            "lib_kernel": layout.lib_kernel_path(name, win.kernel_key), "wrapper": layout.wrapper_path(name),
        })
    return entries


def manifest(name: str, version: str, backend, target: dict, settings, graph, output_names: list[str],
             kernels: list[dict]) -> dict:
    """Every manifest key but ``files`` (``write_archive`` adds the file table).

    Format: docs/archive.md. ``target`` is the backend's target description (for the CPU,
    the resolved target ISA and the features the runtime checks at load).
    """
    import torch

    import aotpack

    return {
        "format_version": layout.FORMAT_VERSION, "name": name, "version": version,
        "aotpack_version": aotpack.__version__, "torch_version": torch.__version__.split("+")[0],
        "backend": backend.name, "target_isa": target, "device_limit": settings.device_limit,
        "model": {"library": layout.MODEL_LIBRARY_PATH, "source": layout.MODEL_SOURCE_PATH,
                  "abi_version": backend.model_abi_version},
        "constants": _signature(graph.constants, [b.name for b in graph.constants]),
        "inputs": _signature(graph.inputs, [b.name for b in graph.inputs]),
        "outputs": _output_signature(graph, output_names),
        "mutated_buffers": graph.mutated_buffers,
        "mutated_inputs": graph.mutated_inputs,
        "kernels": kernels,
    }


def file_table(files: dict[str, bytes]) -> dict[str, dict]:
    """``{path: {"sha256", "size"}}`` for the manifest."""
    return {path: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for path, data in sorted(files.items())}


def write_archive(target: Path, manifest: dict, files: dict[str, bytes],
                  before_publish: Callable[[Path], None] | None = None) -> Path:
    """Write ``target`` atomically: manifest (with the file table) + ``files``.

    Args:
        manifest: every manifest key except ``files``, which is computed here.
        files: archive path -> content.
        before_publish: called with the finished temp file before it is renamed into
            place; an exception there removes it, so ``target`` never holds a bad archive.
    """
    manifest = dict(manifest, files=file_table(files))
    manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST_PATH, manifest_bytes)
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
        if before_publish:
            before_publish(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _members(archive: Path):
    """Yield ``(path, content)`` of each regular file, in archive order.

    Raises:
        AotpackError: the file is missing or is not a zstd-compressed tar.
    """
    try:
        with open(archive, "rb") as handle:
            reader = zstandard.ZstdDecompressor().stream_reader(handle)
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for member in tar:
                    if member.isfile():
                        yield member.name, tar.extractfile(member).read()
    except OSError as exc:
        raise AotpackError(f"cannot read {archive}: {exc.strerror or exc}") from None
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise AotpackError(f"{archive} is not an .aotpack archive (a zstd-compressed tar): {exc}") from None


def read_members(archive: Path) -> dict[str, bytes]:
    """Every regular file of an archive, by path (decompresses the whole archive).

    Raises:
        AotpackError: the file is missing or is not a zstd-compressed tar.
    """
    return dict(_members(archive))


def _parse_manifest(archive: Path, data: bytes | None) -> dict:
    if data is None:
        raise AotpackError(f"{archive} has no {MANIFEST_PATH}; it was not written by aotpack")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise AotpackError(f"{archive}: {MANIFEST_PATH} is not valid JSON: {exc}") from None


def read_manifest(archive: Path) -> dict:
    """The manifest of an archive; reads only up to it (it is the first entry).

    Raises:
        AotpackError: unreadable archive, or no valid manifest.json in it.
    """
    for path, data in _members(archive):
        if path == MANIFEST_PATH:
            return _parse_manifest(archive, data)
    return _parse_manifest(archive, None)


def verify_files(archive: Path, members: dict[str, bytes] | None = None) -> list[str]:
    """Problems with the archive's files against the manifest's sizes and sha256 (empty = ok).

    ``members`` (from ``read_members``) avoids decompressing the archive again.
    """
    members = read_members(archive) if members is None else members
    manifest = _parse_manifest(archive, members.get(MANIFEST_PATH))
    listed = manifest.get("files", {})
    problems = [f"{path}: missing" for path in sorted(set(listed) - set(members))]
    problems += [f"{path}: not listed in the manifest" for path in sorted(set(members) - set(listed) - {MANIFEST_PATH})]
    for path, entry in sorted(listed.items()):
        data = members.get(path)
        if data is not None and (len(data) != entry.get("size")
                                 or hashlib.sha256(data).hexdigest() != entry.get("sha256")):
            problems.append(f"{path}: sha256 mismatch (the file was modified)")
    return problems
