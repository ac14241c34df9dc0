"""Stage: bundle the winners, the model library, weights and manifest into a ``.aotpack``.

Format: docs/archive.md (format_version and paths in ``aotpack.archive.layout``) — a zstd-compressed tar: manifest.json,
manifest.sha256, the optional manifest.sig, then the files sorted; fixed owners, modes,
mtimes and zstd levels (a frame per run of entries with one level: tensors at a low level,
the rest high), so equal inputs give equal bytes. The archive is written to a temp file beside
the target and renamed into place. Reading follows one set of rules shared with the
native runtime: ``aotpack.archive.reader``.
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
from aotpack import backends, env, leftovers
from aotpack.archive import layout, reader, signing

#: zstd level of code, sources and the manifest: small and very compressible. Not 19: on
#: MobileNetV3-Small's 3.8 MB of them level 19 took 315 ms for 133 KB, level 12 42 ms for
#: 145 KB (0.13 % of the 9.4 MB archive); levels 15-19 cost 4-7.5x level 12 for the last 8 %.
ZSTD_LEVEL = 12
#: zstd level of tensor files (``*.safetensors``): float weights barely compress (random
#: mantissas), and a high level costs minutes per 100 MB for the same size (docs/archive.md).
TENSOR_ZSTD_LEVEL = 1


def _mtime() -> int:
    return env.get(env.SOURCE_DATE_EPOCH)


def _add(tar: tarfile.TarFile, name: str, data: bytes, binary_suffix: str) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = _mtime()
    info.mode = 0o755 if name.endswith(binary_suffix) else 0o644
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
            "timing_contended": choice.contended,
            "lib_kernel": layout.lib_kernel_path(name, win.kernel_key), "wrapper": layout.wrapper_path(name),
        })
    return entries


def choice_entries(points: list, choices: dict) -> list[dict]:
    """The manifest's ``choices``: per choice point (``ir.choice``: a shipped kernel, a
    GEMM/conv step) its id, kind, candidates by name, the winner's name, timings (us, empty
    when not timed) and whether the inputs reached it and its timing was contended.

    Args:
        points: the choice points, in order. choices: ``choice id -> autotune.Choice``
            (a point without one used candidate 0, untimed).
    """
    entries = []
    for point in points:
        choice = choices.get(point.choice_id)
        names = point.candidate_names()
        index = choice.index if choice else 0
        entries.append({
            "id": point.choice_id, "kind": point.choice_kind, "name": point.label, **point.details(),
            "candidates": names, "labels": point.candidate_labels(), "winner": names[index],
            "timings_us": [round(t, 3) for t in (choice.timings_us if choice else ())],
            "visited": bool(choice and choice.visited), "timing_contended": bool(choice and choice.contended),
        })
    return entries


def manifest(name: str, version: str, backend, target: dict, settings, graph, output_names: list[str],
             kernels: list[dict], weight_aliases: dict[str, str] | None = None,
             choices: list[dict] | None = None) -> dict:
    """Every manifest key but ``files`` (``write_archive`` adds the file table).

    Format: docs/archive.md. ``target`` is the backend's target description
    (``Backend.target``), recorded under the keys ``Backend.manifest_target`` names.
    ``weight_aliases``: constant name -> the name its bytes are stored under in the
    weights file (``aotpack.archive.weights.WeightPlan.aliases``). ``choices``: every
    choice point's winner (``choice_entries``).
    """
    import torch

    import aotpack

    return {
        "format_version": layout.FORMAT_VERSION, "name": name, "version": version,
        "aotpack_version": aotpack.__version__, "torch_version": torch.__version__.split("+")[0],
        "backend": backend.name, **backend.manifest_target(target), "device_limit": settings.device_limit,
        "model": {"library": layout.MODEL_LIBRARY_PATH, "source": layout.MODEL_SOURCE_PATH,
                  "abi_version": backend.model_abi_version},
        "constants": _signature(graph.constants, [b.name for b in graph.constants]),
        "inputs": _signature(graph.inputs, [b.name for b in graph.inputs]),
        "outputs": _output_signature(graph, output_names),
        "weight_aliases": dict(sorted((weight_aliases or {}).items())),
        "mutated_buffers": graph.mutated_buffers,
        "mutated_inputs": graph.mutated_inputs,
        "kernels": kernels,
        "choices": choices or [],
    }


def file_table(files: dict[str, bytes]) -> dict[str, dict]:
    """``{path: {"sha256", "size"}}`` for the manifest."""
    return {path: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for path, data in sorted(files.items())}


def manifest_bytes(manifest: dict) -> bytes:
    """The stored form of a manifest: sorted keys, 2-space indent, trailing newline."""
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def manifest_digest(text: bytes) -> bytes:
    """Content of ``manifest.sha256``: the hex sha256 of manifest.json plus a newline."""
    return (hashlib.sha256(text).hexdigest() + "\n").encode()


def pack(manifest_text: bytes, files: dict[str, bytes], signature: bytes | None = None) -> bytes:
    """The compressed archive bytes: manifest entries first, then ``files`` sorted by path.

    ``signature``: 64-byte Ed25519 signature of ``manifest_text`` (``aotpack.archive.signing``).
    """
    raw = io.BytesIO()
    starts = []  # (tar offset where an entry's header starts, its zstd level)
    binary_suffix = backends.get(json.loads(manifest_text)["backend"]).binary_suffix  # executable entries
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(path: str, data: bytes) -> None:
            starts.append((tar.offset, entry_level(path)))
            _add(tar, path, data, binary_suffix)
        add(layout.MANIFEST_PATH, manifest_text)
        add(layout.MANIFEST_DIGEST_PATH, manifest_digest(manifest_text))
        if signature is not None:
            add(layout.MANIFEST_SIGNATURE_PATH, signature)
        for path in sorted(files):
            add(path, files[path])
    return compress_frames(raw.getbuffer(), starts)


def entry_level(path: str) -> int:
    """The zstd level of one archive entry: ``TENSOR_ZSTD_LEVEL`` for tensor files, else
    ``ZSTD_LEVEL``."""
    return TENSOR_ZSTD_LEVEL if path.endswith(".safetensors") else ZSTD_LEVEL


def compress_frames(tar: memoryview, starts: list[tuple[int, int]]) -> bytes:
    """``tar`` as consecutive zstd frames, one per run of entries with the same level
    (each with its content size and checksum). Concatenated frames decompress to the
    concatenated data, so readers see one tar stream; the tar's end blocks join the last
    frame. ``starts``: (offset of an entry's first header byte, level), in tar order."""
    runs = []  # [start, level], merged while the level repeats
    for offset, level in starts:
        if not runs or runs[-1][1] != level:
            runs.append([offset, level])
    frames = []
    for i, (begin, level) in enumerate(runs):
        end = runs[i + 1][0] if i + 1 < len(runs) else len(tar)
        compressor = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)
        frames.append(compressor.compress(tar[begin:end]))
    return b"".join(frames)


def publish(target: Path, data: bytes, before_publish: Callable[[Path], None] | None = None) -> Path:
    """Write ``data`` to ``target`` atomically (temp file beside it, then rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    leftovers.remove_dead(target.parent, f".{target.name}.*.partial")  # of killed builds
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{leftovers.tag()}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
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


def write_archive(target: Path, manifest: dict, files: dict[str, bytes],
                  before_publish: Callable[[Path], None] | None = None,
                  sign_key: str | Path | None = None) -> Path:
    """Write ``target`` atomically: manifest (with the file table) + ``files``.

    Args:
        manifest: every manifest key except ``files``, which is computed here.
        files: archive path -> content.
        before_publish: called with the finished temp file before it is renamed into
            place; an exception there removes it, so ``target`` never holds a bad archive.
        sign_key: an Ed25519 private key (PEM) to sign the manifest with (``manifest.sig``).
    """
    text = manifest_bytes(dict(manifest, files=file_table(files)))
    signature = None
    if sign_key is not None:
        signature = signing.sign_bytes(text, sign_key)
    return publish(target, pack(text, files, signature), before_publish)


def read_members(archive: Path) -> dict[str, bytes]:
    """Every file of a valid archive, by path, the manifest entries included (checked with
    ``aotpack.archive.reader`` first; each file is held in memory, so use it for small archives).

    Raises:
        AotpackError: the archive breaks a reading rule (docs/archive.md).
    """
    return reader.read_all(archive)


def read_manifest(archive: Path) -> dict:
    """The manifest of an archive; reads only the manifest entries (they come first) and
    checks them (digest, schema, limits).

    Raises:
        AotpackError: unreadable archive, or no valid manifest in it.
    """
    return reader.read_manifest(archive)


def verify_files(archive: Path) -> list[str]:
    """Problems with the archive against the reading rules (empty = ok): the first rule it
    breaks, as one line, as the native runtime would report it."""
    try:
        reader.check(archive)
    except AotpackError as exc:
        return [str(exc)]
    return []


def sign_archive(archive: str | Path, key_path: str | Path) -> Path:
    """Sign ``archive`` in place (atomically): checks it with the reading rules, then
    rewrites it with ``manifest.sig`` (replacing any earlier signature).

    Raises:
        AotpackError: the archive breaks a reading rule, or the key is unusable.
    """
    archive = Path(archive)
    sign = signing.signer(key_path)
    members = reader.read_all(archive)
    text = members.pop(layout.MANIFEST_PATH)
    members.pop(layout.MANIFEST_DIGEST_PATH)
    members.pop(layout.MANIFEST_SIGNATURE_PATH, None)
    return publish(archive, pack(text, members, sign(text)))
