"""Reading an ``.aotpack`` archive with the native runtime's rules (docs/archive.md,
"Reading rules"): the same archives are accepted and refused, with bounded memory.

The archive is streamed once: the manifest entries come first and are checked (digest,
optional Ed25519 signature, schema, limits) before any file is read; each file is hashed
in fixed chunks and must match the manifest; the backend's binaries and the weights are
spooled to an anonymous temporary file (removed by the OS even if this process is killed)
for the backend's binary check and the safetensors checks. Nothing here executes archive code.
"""
from __future__ import annotations

import contextlib
import hashlib
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import zstandard

from aotpack import env
from aotpack.archive import file_checks
from aotpack.archive import layout
from aotpack.archive import manifest_rules
from aotpack.errors import AotpackError

MANIFEST, DIGEST, SIGNATURE = manifest_rules.RESERVED
CHUNK = 1 << 20
_RING = 1 << 20
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _is_zstd(head: bytes) -> bool:
    """A zstd frame or a skippable frame (magic 0x184D2A50-5F) starts ``head``: both are
    zstd's format, and libarchive, ``zstd -d`` and this reader skip skippable frames."""
    return head == _ZSTD_MAGIC or (len(head) == 4 and head[1:] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50)


#: The registry's variable of each Limits field (native/src/limits.cpp reads the same).
LIMIT_VARIABLES = (("max_entries", env.MAX_ENTRIES), ("max_entry_bytes", env.MAX_ENTRY_BYTES),
                   ("max_total_bytes", env.MAX_TOTAL_BYTES), ("max_manifest_bytes", env.MAX_MANIFEST_BYTES))


@dataclass(frozen=True)
class Limits:
    """What reading may cost; the defaults of aotpack/archive/layout.py, as native/src/limits.h."""

    max_entries: int = layout.DEFAULT_MAX_ENTRIES
    max_entry_bytes: int = layout.DEFAULT_MAX_ENTRY_BYTES
    max_total_bytes: int = layout.DEFAULT_MAX_TOTAL_BYTES
    max_manifest_bytes: int = layout.DEFAULT_MAX_MANIFEST_BYTES

    @classmethod
    def from_env(cls) -> "Limits":
        """Defaults overridden by AOTPACK_MAX_ENTRIES / _ENTRY_BYTES / _TOTAL_BYTES /
        _MANIFEST_BYTES (``env.parse_limit``; empty = unset).

        Raises:
            AotpackError: a variable ``env.parse_limit`` refuses.
        """
        return cls(**{attr: env.get(var) for attr, var in LIMIT_VARIABLES})


def trusted_keys_from_env() -> list[str]:
    """The PEM public keys named in $AOTPACK_TRUSTED_KEYS (``signing.trusted_keys_from_env``:
    set but naming no key is an error)."""
    from aotpack.archive.signing import trusted_keys_from_env

    return trusted_keys_from_env()


@dataclass
class Report:
    """What a successful read found."""

    manifest: dict
    manifest_text: bytes
    signature: bytes | None
    files: int = 0
    members: dict[str, bytes] = field(default_factory=dict)  # only those asked for


class _Zstd:
    """A file-like zstd decoder over ``handle``, frame after frame, that refuses a stream
    ending inside a frame (libarchive's "Truncated zstd input"); checksums are verified.
    Compressed bytes go in 1 KiB at a time, so one step yields at most ~32 MiB."""

    def __init__(self, handle):
        self.handle, self.dobj = handle, zstandard.ZstdDecompressor().decompressobj()
        self.out, self.at, self.started = b"", 0, False

    def read(self, n: int) -> bytes:
        while self.at >= len(self.out):
            raw = self.handle.read(1024)
            if not raw:
                if self.started and not self.dobj.eof:
                    raise AotpackError("corrupt archive: Truncated zstd input")
                return b""
            pieces = []
            while raw:
                if self.dobj.eof:  # the next frame
                    self.dobj = zstandard.ZstdDecompressor().decompressobj()
                self.started = True
                pieces.append(self.dobj.decompress(raw))
                raw = self.dobj.unused_data if self.dobj.eof else b""
            self.out, self.at = b"".join(pieces), 0
        data = self.out[self.at:self.at + n]
        self.at += len(data)
        return data


def _inner_zstd(tape: "_Tape") -> bool:
    """Whether the decompressed stream is zstd again: a zstd frame, possibly after skippable
    frames (libarchive decodes a second layer, then counts it; skippable frames followed by
    anything else fail to decode there, and are a corrupt tar here)."""
    offset = 0
    while offset < _RING:
        head = tape.block_at(offset)[:8]
        if head[:4] == _ZSTD_MAGIC:
            return True
        if len(head) < 8 or not _is_zstd(head[:4]):
            return False
        offset += 8 + int.from_bytes(head[4:], "little")
    return False


class _Tape:
    """The decompressed stream as tarfile reads it, keeping a window of what was fetched so
    a block can be looked at again (to see where tarfile stopped: libarchive refuses a
    damaged header that tarfile would take for the end of the archive)."""

    def __init__(self, raw):
        self.raw, self.pos, self.window, self.window_start = raw, 0, bytearray(), 0

    @property
    def fetched(self) -> int:
        return self.window_start + len(self.window)

    def _fetch(self, n: int) -> bool:
        data = self.raw.read(max(n, CHUNK))
        self.window += data
        keep_from = min(self.pos, self.fetched) - _RING  # keep _RING bytes behind the reader
        if keep_from > self.window_start:
            del self.window[:keep_from - self.window_start]
            self.window_start = keep_from
        return bool(data)

    def read(self, n=-1):
        n = CHUNK if n is None or n < 0 else n
        if self.pos >= self.fetched and not self._fetch(n):
            return b""
        start = self.pos - self.window_start
        data = bytes(self.window[start:start + n])
        self.pos += len(data)
        return data

    def drain(self, end: int) -> None:
        """Read the rest of the stream (the tar's padding), as the runtime's finish() does,
        so a truncated or corrupt end of the zstd frame (its checksum) is an error; at most
        ``_RING`` bytes may follow ``end``, the end of the end-of-archive blocks."""
        while True:
            if self.fetched - end > _RING:
                raise AotpackError("corrupt archive: more than 1 MiB of data after the end of the tar")
            if not self._fetch(CHUNK):
                return

    def block_at(self, offset: int) -> bytes:
        """The 512 bytes at ``offset`` of the stream (fewer at its end)."""
        while self.fetched < offset + 512 and self._fetch(CHUNK):
            pass
        start = offset - self.window_start
        return bytes(self.window[start:start + 512]) if start >= 0 else b"?"


def _check_limits(manifest: dict, limits: Limits) -> None:
    files = manifest["files"]
    if len(files) + 3 > limits.max_entries:
        raise AotpackError(f"manifest.json lists {len(files)} files, more than the limit of "
                           f"{limits.max_entries} entries (AOTPACK_MAX_ENTRIES)")
    total = 0
    for path, rec in sorted(files.items()):  # the runtime's order: the same file is named
        if rec["size"] > limits.max_entry_bytes:
            raise AotpackError(f"file '{path}' is {rec['size']} bytes, more than the limit of "
                               f"{limits.max_entry_bytes} per entry (AOTPACK_MAX_ENTRY_BYTES)")
        total += rec["size"]
        if total > limits.max_total_bytes:
            raise AotpackError(f"the files of manifest.json add up to more than the limit of "
                               f"{limits.max_total_bytes} bytes (AOTPACK_MAX_TOTAL_BYTES)")


def check_manifest_entries(text: bytes, digest: bytes, signature: bytes | None,
                           trusted_keys: list[str], limits: Limits) -> dict:
    """Digest, signature (when ``trusted_keys``), JSON, schema and limits of the manifest.

    Raises:
        AotpackError: the first rule broken (the runtime's message).
    """
    if digest != (hashlib.sha256(text).hexdigest() + "\n").encode():
        raise AotpackError("manifest.json does not match manifest.sha256 (the manifest was modified or is corrupt)")
    if trusted_keys:
        if not signature:
            raise AotpackError("the archive is not signed, but trusted keys are set "
                               "(AOTPACK_TRUSTED_KEYS/--trusted-key)")
        from aotpack.archive.signing import verify_bytes
        verify_bytes(text, signature, trusted_keys)
    manifest = manifest_rules.validate(manifest_rules.parse_json(text))
    _check_limits(manifest, limits)
    manifest_rules.check_structure(manifest)
    return manifest


#: GNU tar's volume label and incremental-dump folder, Solaris tar's ACL of the next entry
_VOLUME_LABEL, _DUMP_DIR, _SOLARIS_ACL = b"V", b"D", b"A"
_MULTI_VOLUME = b"M"  # a continued file: of an unsupported type in both readers
_KNOWN_TYPES = tarfile.SUPPORTED_TYPES + (_DUMP_DIR, _MULTI_VOLUME)


def _as_libarchive_reads(member: tarfile.TarInfo) -> None:
    """Retype ``member`` as libarchive (the runtime's reader) reads it, where tarfile
    differs: a type neither knows is a regular file (tarfile reads its data as one too), a
    GNU dump folder or a regular file whose name ends in "/" is a folder, and a hard link
    naming nothing is an empty regular file when it has data, of no supported type when not."""
    if member.type not in _KNOWN_TYPES:
        member.type = tarfile.REGTYPE
    elif member.type == _DUMP_DIR or (member.type == tarfile.REGTYPE and member.name.endswith("/")):
        member.type, member.name = tarfile.DIRTYPE, member.name.rstrip("/")
    elif member.islnk() and not member.linkname:  # with data: an empty file; without: no type
        member.type, member.size = (tarfile.REGTYPE, 0) if member.size else (_MULTI_VOLUME, 0)


def _is_sparse(member: tarfile.TarInfo) -> bool:
    """Whether libarchive (the runtime's reader) sees a sparse file: it keeps the regions of
    the map that lie within the file and follow the previous one (merging adjacent ones),
    and a single region covering the whole file is no sparse file."""
    regions: list[list[int]] = []
    for offset, length in member.sparse or ():
        if offset < 0 or length < 0 or offset + length > member.size:
            continue
        if regions and regions[-1][0] + regions[-1][1] > offset:
            continue
        if regions and regions[-1][0] + regions[-1][1] == offset:
            regions[-1][1] += length
        else:
            regions.append([offset, length])
    return not (len(regions) == 0 or (len(regions) == 1 and regions[0][0] == 0 and regions[0][1] >= member.size))


class _Entries:
    """Regular-file members of the tar, in order, with the runtime's entry rules."""

    def __init__(self, tar: tarfile.TarFile, limits: Limits, tape: "_Tape | None" = None):
        self.tar, self.limits, self.seen, self.iter, self.tape = tar, limits, 0, iter(tar), tape

    def check_end(self) -> None:
        """At the end tarfile saw: refuse unless it is the end-of-archive block (tarfile
        takes a damaged header for the end; libarchive refuses it)."""
        if self.tape is not None:
            block = self.tape.block_at(self.tar.offset)
            if block and block != bytes(512):
                raise AotpackError("corrupt archive: damaged tar header")

    def next(self) -> tarfile.TarInfo | None:
        extension = False
        for member in self.iter:
            if member.type in (_VOLUME_LABEL, _SOLARIS_ACL):
                # libarchive: no entry; a label's data or an ACL at the end is damage
                if member.size and member.type == _VOLUME_LABEL:
                    raise AotpackError("corrupt archive: damaged tar header")
                extension = member.type == _SOLARIS_ACL
                continue
            extension = False
            _as_libarchive_reads(member)
            self.seen += 1
            if self.seen > self.limits.max_entries:
                raise AotpackError(f"the archive has more than {self.limits.max_entries} entries "
                                   f"(AOTPACK_MAX_ENTRIES)")
            name = member.name
            kind = ("hard link" if member.islnk() else "symbolic link" if member.issym()
                    else "device" if member.ischr() or member.isblk() else "FIFO" if member.isfifo() else None)
            if kind:
                raise AotpackError(f"entry '{name}' is a {kind}")
            if not member.isfile() and not member.isdir():
                raise AotpackError(f"entry '{name}' has an unsupported file type")
            if member.isfile() and _is_sparse(member):
                raise AotpackError(f"entry '{name}' is a sparse file")
            manifest_rules.check_entry_path(name.rstrip("/") if member.isdir() else name)
            if member.isfile():
                return member
        if extension:
            raise AotpackError("corrupt archive: damaged tar header")
        self.check_end()
        return None

    def read_small(self, member: tarfile.TarInfo, max_bytes: int, what: str) -> bytes:
        if member.size > max_bytes:
            raise AotpackError(f"{what} is {member.size} bytes, more than the limit of {max_bytes}")
        data = self.tar.extractfile(member).read()
        if len(data) != member.size:
            raise AotpackError(f"entry '{member.name}' is truncated")
        return data


def _expect(entries: _Entries, path: str, ordinal: str) -> tarfile.TarInfo:
    member = entries.next()
    if member is None or member.name != path:
        found = f", found '{member.name}'" if member is not None else ""
        raise AotpackError(f"the archive's {ordinal} entry must be {path}{found}")
    return member


def _stream(tar: tarfile.TarFile, member: tarfile.TarInfo, spool) -> str:
    handle = tar.extractfile(member)
    digest = hashlib.sha256()
    done = 0
    while chunk := handle.read(CHUNK):
        done += len(chunk)
        digest.update(chunk)
        if spool is not None:
            spool.write(chunk)
    if done != member.size:
        raise AotpackError(f"entry '{member.name}' is truncated")
    return digest.hexdigest()


def _content_checked(name: str, manifest: dict) -> bool:
    """Whether rule 6 reads the file's contents: the backend's binaries (and model.library,
    whatever its name: it is loaded) and safetensors files (weights, self-test)."""
    suffix = manifest_rules.HOST_RULES.binary_suffix
    return name.endswith((suffix, ".safetensors")) or name == manifest["model"]["library"]


def _check_contents(manifest: dict, spools: dict) -> None:
    """Rule 6 in the runtime's order (native/src/extract.cpp check_file_contents, then
    native/src/model.cpp make_constants): the manifest backend's binary checks, safetensors
    files, the constants."""
    library = manifest["model"]["library"]
    rules = manifest_rules.HOST_RULES
    for name in sorted(spools):
        if name.endswith(rules.binary_suffix) or name == library:
            rules.check_binary(spools[name], name)
    views = {name: file_checks.read_safetensors(spools[name], name)
             for name in sorted(spools) if name.endswith(".safetensors")}
    if manifest["constants"]:
        file_checks.check_weights(views[manifest_rules.WEIGHTS], manifest["constants"],
                                  manifest_rules.WEIGHTS, manifest_rules.weight_aliases(manifest))


def _walk(archive: Path, limits: Limits, trusted_keys: list[str], keep: Callable[[str], bool]) -> Report:
    with open(archive, "rb") as handle:
        if not _is_zstd(handle.read(4)):
            raise AotpackError("not zstd-compressed (an .aotpack archive is a zstd-compressed tar)")
        handle.seek(0)
        tape = _Tape(_Zstd(handle))
        if _inner_zstd(tape):
            raise AotpackError("compressed more than once (an .aotpack archive is zstd over tar)")
        with tarfile.open(fileobj=tape, mode="r|") as tar:
            entries = _Entries(tar, limits, tape)
            text = entries.read_small(_expect(entries, MANIFEST, "first"), limits.max_manifest_bytes, MANIFEST)
            digest = entries.read_small(_expect(entries, DIGEST, "second"), 65, DIGEST)
            signature = None
            member = entries.next()
            if member is not None and member.name == SIGNATURE:
                signature = entries.read_small(member, 64, SIGNATURE)
                member = entries.next()
            manifest = check_manifest_entries(text, digest, signature, trusted_keys, limits)
            report = Report(manifest, text, signature)
            files, seen = manifest["files"], set()
            spools = {}
            try:
                while member is not None:
                    name = member.name
                    if name in manifest_rules.RESERVED:
                        raise AotpackError(f"entry '{name}' appears twice or out of place")
                    record = files.get(name)
                    if record is None:
                        raise AotpackError(f"entry '{name}' is not listed in manifest.json 'files'")
                    if name in seen:
                        raise AotpackError(f"entry '{name}' appears twice")
                    if member.size != record["size"]:
                        raise AotpackError(f"entry '{name}' is {member.size} bytes, manifest.json says {record['size']}")
                    spool = None
                    if _content_checked(name, manifest) or keep(name):
                        spool = spools[name] = tempfile.TemporaryFile()
                    if _stream(tar, member, spool) != record["sha256"]:
                        raise AotpackError(f"sha256 mismatch for '{name}' (the archive is corrupt or was modified)")
                    seen.add(name)
                    member = entries.next()
                tape.drain(tar.offset + 2 * tarfile.BLOCKSIZE)  # libarchive consumes both zero blocks
                missing = sorted(set(files) - seen)
                if missing:
                    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                    raise AotpackError(f"file '{missing[0]}' listed in manifest.json is missing from the archive{more}")
                _check_contents(manifest, spools)
                for name, spool in spools.items():
                    if keep(name):
                        spool.seek(0)
                        report.members[name] = spool.read()
            finally:
                for spool in spools.values():
                    spool.close()
            report.files = len(files)
            return report


def check(archive: str | Path, limits: Limits | None = None, trusted_keys: list[str] | None = None,
          keep: Callable[[str], bool] = lambda name: False) -> Report:
    """Read and check the whole archive with the runtime's rules.

    Args:
        limits: default ``Limits.from_env()``.
        trusted_keys: PEM public keys; when not empty the archive must carry a valid
            signature by one of them (default: $AOTPACK_TRUSTED_KEYS).
        keep: which files to return in ``Report.members`` (held in memory).

    Raises:
        AotpackError: the first rule the archive breaks, as one line.
    """
    archive = Path(archive)
    limits = Limits.from_env() if limits is None else limits
    trusted_keys = trusted_keys_from_env() if trusted_keys is None else trusted_keys
    with _errors_named(archive):
        return _walk(archive, limits, trusted_keys, keep)


@contextlib.contextmanager
def _errors_named(archive: Path):
    """Every failure while reading ``archive`` as one AotpackError naming it."""
    try:
        yield
    except AotpackError as exc:
        raise AotpackError(f"{archive}: {exc}") from None
    except OSError as exc:
        raise AotpackError(f"cannot read {archive}: {exc.strerror or exc}") from None
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise AotpackError(f"{archive}: corrupt archive: {exc}") from None


def read_manifest(archive: str | Path, limits: Limits | None = None) -> dict:
    """The checked manifest (digest, schema, limits); reads only the manifest entries.

    Raises:
        AotpackError: unreadable archive or a manifest that breaks a rule.
    """
    archive = Path(archive)
    limits = Limits.from_env() if limits is None else limits
    with _errors_named(archive):
        with open(archive, "rb") as handle:
            if not _is_zstd(handle.read(4)):
                raise AotpackError("not zstd-compressed (an .aotpack archive is a zstd-compressed tar)")
            handle.seek(0)
            reader = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True)
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                entries = _Entries(tar, limits)
                text = entries.read_small(_expect(entries, MANIFEST, "first"), limits.max_manifest_bytes, MANIFEST)
                digest = entries.read_small(_expect(entries, DIGEST, "second"), 65, DIGEST)
                return check_manifest_entries(text, digest, None, [], limits)


def read_all(archive: str | Path) -> dict[str, bytes]:
    """Every file of a valid archive by path, plus the manifest entries (in memory).

    Raises:
        AotpackError: the archive breaks a reading rule.
    """
    report = check(archive, trusted_keys=[], keep=lambda name: True)
    members = {MANIFEST: report.manifest_text,
               DIGEST: (hashlib.sha256(report.manifest_text).hexdigest() + "\n").encode()}
    if report.signature:
        members[SIGNATURE] = report.signature
    members.update(report.members)
    return members
