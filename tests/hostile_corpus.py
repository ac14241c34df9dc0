"""A corpus of hostile archives made from a real one, and two runners.

``run_corpus`` feeds each case to the native runtime (``aotpack-run --check``) and to
``aotpack verify`` as processes, each under an address-space limit and a 10 s timeout:

    python tests/hostile_corpus.py ARCHIVE [--sample N]     (``make fuzz`` runs it all)

Findings that fail the run: a signal (crash), a hang, a temp folder left behind, the two
readers disagreeing, an accepted manifest edit whose digest was not recomputed, or a line
of stderr that is not one clean error message.

``disagreement`` runs both readers in this process (``aotpack.load``, ``reader.check``),
fast enough for the test suite to feed them the whole corpus: they must accept and refuse
the same archives and name the same problem (``problem``). ``rule_cases`` are the cases
of the reading rules the readers once applied differently (docs/archive.md).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import io
import json
import os
import random
import resource
import shutil
import string
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zstandard

REPO = Path(__file__).resolve().parents[1]
RUNTIME = REPO / "native" / "build" / "aotpack-run"
TIMEOUT_S = 10
RUNTIME_AS = 16 << 30  # libtorch reserves much address space it never touches
PYTHON_AS = 4 << 30
#: Small limits so bombs and huge declared sizes are refused without filling the disk.
LIMITS = {"AOTPACK_MAX_TOTAL_BYTES": str(256 << 20), "AOTPACK_MAX_ENTRY_BYTES": str(128 << 20),
          "AOTPACK_MAX_ENTRIES": "2000"}


@dataclass
class Case:
    name: str
    data: bytes
    must_refuse: bool = False  # a manifest edit without a new digest, a broken file...


# ---- building blocks ----

def members_of(archive: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(archive), read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar]


def tar_bytes(members, fmt=tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            info = _copy(info)
            if info.isfile() or data:  # data of an odd type too: readers read it as a file
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return out.getvalue()


def zst(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw)


def _copy(info: tarfile.TarInfo) -> tarfile.TarInfo:
    new = tarfile.TarInfo(info.name)
    for attr in ("size", "mtime", "mode", "type", "linkname", "uid", "gid", "uname", "gname",
                 "devmajor", "devminor"):
        setattr(new, attr, getattr(info, attr))
    # a sparse map describes the data: kept; other records (size, path) are rewritten
    new.pax_headers = {k: v for k, v in info.pax_headers.items() if k.startswith("GNU.sparse.")}
    return new


def _info(name, data=b"", **kw) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    for k, v in kw.items():
        setattr(info, k, v)
    return info, data


def with_files(members, files: dict[str, bytes], manifest_edit=None, redigest=True, manifest_text=None):
    """Replace file contents, recompute the file table (and the digest unless told not to)."""
    members = [(_copy(i), d) for i, d in members]
    by_name = {i.name: k for k, (i, _) in enumerate(members)}
    manifest = json.loads(members[by_name["manifest.json"]][1])
    for path, data in files.items():
        if path in by_name:
            members[by_name[path]] = (members[by_name[path]][0], data)
        manifest["files"][path] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    if manifest_edit:
        manifest = manifest_edit(manifest)
    text = manifest_text if manifest_text is not None else json.dumps(manifest, indent=2, sort_keys=True).encode()
    old_digest = members[by_name["manifest.sha256"]][1]
    members[by_name["manifest.json"]] = (members[by_name["manifest.json"]][0], text)
    digest = (hashlib.sha256(text).hexdigest() + "\n").encode() if redigest else old_digest
    members[by_name["manifest.sha256"]] = (members[by_name["manifest.sha256"]][0], digest)
    return members


# ---- the corpus ----

def corpus(archive: bytes, seed: int = 7):
    """Yield the hostile cases, one at a time (each holds a whole archive in memory)."""
    rng = random.Random(seed)
    members = members_of(archive)
    files = {i.name: d for i, d in members if i.isfile()}
    raw = tar_bytes(members)
    yield Case("original", archive)
    n = len(archive)

    for k in range(80):  # truncations of the compressed file
        cut = rng.randrange(0, n) if k > 3 else [0, 1, 4, n - 1][k]
        yield (Case(f"truncate-{k}-{cut}", archive[:cut], must_refuse=True))
    for k in range(150):  # bit flips of the compressed file
        data = bytearray(archive)
        pos = rng.randrange(n)
        data[pos] ^= 1 << rng.randrange(8)
        yield (Case(f"bitflip-{k}-{pos}", bytes(data)))
    for k in range(80):  # byte overwrites of the compressed file
        data = bytearray(archive)
        pos, run = rng.randrange(n), rng.randrange(1, 64)
        data[pos:pos + run] = bytes(rng.randrange(256) for _ in range(run))[: len(data) - pos]
        yield (Case(f"overwrite-{k}-{pos}-{run}", bytes(data)))
    for k in range(80):  # overwrites inside the tar, recompressed: headers, data, end blocks
        data = bytearray(raw)
        pos = rng.randrange(len(raw)) if k % 4 else rng.randrange(0, len(raw), 512) + rng.randrange(0, 300)
        pos = min(pos, len(raw) - 1)
        run = rng.randrange(1, 16)
        data[pos:pos + run] = bytes(rng.randrange(256) for _ in range(run))[: len(data) - pos]
        yield (Case(f"tar-overwrite-{k}-{pos}-{run}", zst(bytes(data))))

    # unsafe and odd entries
    extra = {
        "dotdot": _info("../evil", b"x"), "absolute": _info("/tmp/evil", b"x"),
        "symlink": _info("model/link", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
        "hardlink": _info("model/hard", type=tarfile.LNKTYPE, linkname="model/model.so"),
        "chardev": _info("dev/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3),
        "blockdev": _info("dev/sda", type=tarfile.BLKTYPE, devmajor=8, devminor=0),
        "fifo": _info("model/fifo", type=tarfile.FIFOTYPE), "dot": _info("./model/x", b"x"),
        "backslash": _info("a\\..\\b", b"x"), "space": _info("a b", b"x"), "nonascii": _info("m\u00e9", b"x"),
        "longpath": _info("a/" * 2100 + "x", b"x"), "unlisted": _info("zzz/extra", b"x"),
        "dirdots": _info("a/../b", type=tarfile.DIRTYPE), "dir-ok": _info("model", type=tarfile.DIRTYPE),
    }
    for name, member in extra.items():
        yield (Case(f"entry-{name}", zst(tar_bytes(members + [member])), must_refuse=name != "dir-ok"))
    so = [p for p in files if p.endswith(".so")]
    yield (Case("entry-duplicate", zst(tar_bytes(members + [m for m in members if m[0].name == so[0]])), True))
    yield (Case("entry-duplicate-manifest", zst(tar_bytes(members + members[:1])), True))
    yield (Case("manifest-not-first", zst(tar_bytes(members[1:2] + members[:1] + members[2:])), True))
    yield (Case("no-digest", zst(tar_bytes(members[:1] + members[2:])), True))
    yield (Case("missing-file", zst(tar_bytes([m for m in members if m[0].name != so[-1]])), True))
    yield (Case("uncompressed", raw, True))
    yield (Case("double-zstd", zst(archive), True))
    yield (Case("empty", b"", True))
    yield (Case("garbage", bytes(rng.randrange(256) for _ in range(4096)), True))
    yield (Case("ustar-format", zst(tar_bytes(members, tarfile.USTAR_FORMAT))))
    yield (Case("gnu-format", zst(tar_bytes(members, tarfile.GNU_FORMAT))))
    half = len(raw) // 2
    yield (Case("two-frames", zst(raw[:half]) + zst(raw[half:])))
    yield (Case("trailing-garbage", archive + b"garbage!"))

    # tampered files with recomputed checksums (and digest): only content checks catch these
    for path in so:
        data = files[path]
        for cut in (0, 10, 63, 64, 200, len(data) // 3, len(data) // 2, len(data) - 200, len(data) - 1):
            yield (Case(f"elf-truncate-{path}-{cut}", zst(tar_bytes(with_files(members, {path: data[:cut]}))), True))
        for field, offset, value in (("class", 4, b"\x01"), ("data", 5, b"\x02"), ("type", 16, b"\x02\x00"),
                                     ("machine", 18, b"\xb7\x00"), ("phoff", 32, b"\xff" * 8),
                                     ("shoff", 40, b"\xff" * 8), ("phnum", 56, b"\xff\xff"),
                                     ("shnum", 60, b"\xff\xff"), ("magic", 0, b"\x7fELG")):
            bad = bytearray(data)
            bad[offset:offset + len(value)] = value
            yield (Case(f"elf-{field}-{path}", zst(tar_bytes(with_files(members, {path: bytes(bad)}))), True))
    weights = "weights/weights.safetensors"
    if weights in files:
        w = files[weights]
        for name, bad in (("truncated", w[: len(w) // 2]), ("empty", b""), ("short", w[:7]),
                          ("huge-header", (1 << 62).to_bytes(8, "little") + w[8:]),
                          ("bad-json", w[:8] + b"{" * (len(w) - 8)),
                          ("dtype", w.replace(b'"F32"', b'"F99"', 1))):
            if bad != w:  # no float32 tensor: no dtype to break
                yield (Case(f"weights-{name}", zst(tar_bytes(with_files(members, {weights: bad}))), True))
        data = bytearray(w)
        data[-1] ^= 0xFF  # data only: silently different numbers, which only a signature catches
        yield (Case("weights-data", zst(tar_bytes(with_files(members, {weights: bytes(data)})))))
    for path in [p for p in files if p.endswith(".cpp") or p.endswith("optimize_tiling")][:4]:
        yield (Case(f"text-{path}", zst(tar_bytes(with_files(members, {path: files[path] + b"\n// edited"})))))

    # manifest edits without a new digest: all must be refused
    def edits():
        yield "strides", lambda m: {**m, "constants": [dict(c, strides=list(reversed(c["strides"])))
                                                       for c in m["constants"]]}
        yield "shape", lambda m: {**m, "inputs": [dict(c, shape=[s + 1 for s in c["shape"]]) for c in m["inputs"]]}
        yield "name", lambda m: {**m, "name": "other"}
        yield "device_limit", lambda m: {**m, "device_limit": 1}
        yield "outputs", lambda m: {**m, "outputs": m["outputs"][:1]}
        yield "dtype", lambda m: {**m, "inputs": [dict(c, dtype="float64") for c in m["inputs"]]}
        yield "whitespace", None
    for name, edit in edits():
        if edit is None:
            text = json.dumps(json.loads(files["manifest.json"]), indent=3).encode()
            yield (Case(f"manifest-edit-{name}", zst(tar_bytes(with_files(members, {}, manifest_text=text,
                                                                                  redigest=False))), True))
            continue
        for k in range(6):  # the same edit through byte variants (key order, spacing)
            indent = [2, 1, 0, 4, None, 2][k]
            def fmt(m, indent=indent, k=k):
                return json.dumps(edit(m), indent=indent, sort_keys=k % 2 == 0).encode()
            text = fmt(json.loads(files["manifest.json"]))
            yield (Case(f"manifest-edit-{name}-{k}", zst(tar_bytes(with_files(members, {}, manifest_text=text,
                                                                                      redigest=False))), True))

    # malformed manifests, digest recomputed: both readers refuse them cleanly
    base = json.loads(files["manifest.json"])
    bad_texts = {
        "null": b"null", "list": b"[1, 2]", "number": b"42", "string": b'"x"', "empty": b"",
        "utf16": json.dumps(base).encode("utf-16"), "bom": b"\xef\xbb\xbf" + json.dumps(base).encode(),
        "deep": b"[" * 100000 + b"]" * 100000, "deep-object": b'{"a":' * 5000 + b"1" + b"}" * 5000,
        "files-list": json.dumps({**base, "files": list(base["files"])}).encode(),
        "files-null": json.dumps({**base, "files": None}).encode(),
        "uppercase": json.dumps({**base, "files": {p: {**r, "sha256": r["sha256"].upper()}
                                                   for p, r in base["files"].items()}}).encode(),
        "nan": json.dumps({**base, "device_limit": float("nan")}).encode(),
        "huge-int": json.dumps(base).encode().replace(b'"format_version": %d' % base["format_version"],
                                                      b'"format_version": 18446744073709551617'),
        "float-version": json.dumps({**base, "format_version": float(base["format_version"])}).encode(),
        "bool-version": json.dumps({**base, "format_version": True}).encode(),
        "version-next": json.dumps({**base, "format_version": base["format_version"] + 1}).encode(),
        "version-previous": json.dumps({**base, "format_version": base["format_version"] - 1}).encode(),
        "alias-cycle": json.dumps({**base, "weight_aliases": {"a": "b", "b": "a"}}).encode(),
        "alias-chain": json.dumps({**base, "weight_aliases": {"a": "b", "b": "c"}}).encode(),
        "alias-not-string": json.dumps({**base, "weight_aliases": {"a": 1}}).encode(),
        "alias-list": json.dumps({**base, "weight_aliases": ["a"]}).encode(),
        "no-model": json.dumps({k: v for k, v in base.items() if k != "model"}).encode(),
        "library-missing": json.dumps({**base, "model": {**base["model"], "library": "x.so"}}).encode(),
        "negative-dim": json.dumps({**base, "inputs": [dict(c, shape=[-1] * len(c["shape"])) for c in base["inputs"]]}).encode(),
        "surrogate": json.dumps(base).encode().replace(b'"name": "', b'"name": "\\ud800', 1),
        "invalid-utf8": json.dumps(base).encode().replace(b'"name": "', b'"name": "\xff', 1),
        "truncated-json": json.dumps(base).encode()[:-10],
        "files-dotdot": json.dumps({**base, "files": {**base["files"], "../x": {"sha256": "0" * 64, "size": 1}}}).encode(),
        "files-reserved": json.dumps({**base, "files": {**base["files"], "manifest.sig": {"sha256": "0" * 64, "size": 1}}}).encode(),
        "backend": json.dumps({**base, "backend": "npu"}).encode(),
        "mutated-unknown": json.dumps({**base, "mutated_buffers": ["nope"]}).encode(),
        "strides-length": json.dumps({**base, "inputs": [dict(c, strides=[]) for c in base["inputs"]]}).encode(),
        "huge-size": json.dumps({**base, "files": {**base["files"], so[0]: {**base["files"][so[0]], "size": 1 << 40}}}).encode(),
        "negative-size": json.dumps({**base, "files": {**base["files"], so[0]: {**base["files"][so[0]], "size": -1}}}).encode(),
    }
    if base["constants"]:  # an alias naming no stored tensor
        first = base["constants"][0]["name"]
        bad_texts["alias-missing"] = json.dumps({**base, "weight_aliases": {first: "ghost"}}).encode()
    for name, text in bad_texts.items():
        yield (Case(f"manifest-bad-{name}", zst(tar_bytes(with_files(members, {}, manifest_text=text))), True))

    # bombs, huge declared sizes and many entries
    zeros = b"\0" * (130 << 20)  # over the 128 MiB per-entry limit of LIMITS
    yield (Case("bomb-unlisted", zst(tar_bytes(members + [_info("zzz/bomb", zeros)])), True))
    yield (Case("bomb-listed", zst(tar_bytes(with_files(members, {"zzz/bomb": zeros}) + [_info("zzz/bomb", zeros)])), True))
    yield (Case("bomb-first", zst(tar_bytes([_info("bomb", zeros)] + members)), True))
    yield (Case("bomb-manifest", zst(tar_bytes([_info("manifest.json", zeros)] + members[1:])), True))
    yield (Case("bomb-digest", zst(tar_bytes(members[:1] + [_info("manifest.sha256", zeros[:1 << 20])] + members[2:])), True))
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(_copy(info), io.BytesIO(data))
        end = tar.offset  # before the end-of-archive blocks
    huge = tarfile.TarInfo("zzz/declared")
    huge.size = 1 << 41  # 2 TiB: beyond octal, so a pax "size" record
    for path in ("zzz/declared", so[0]):
        huge.name = path
        stream = body.getvalue()[:end] + huge.tobuf(tarfile.PAX_FORMAT) + b"\0" * 4096
        yield Case(f"declared-2TiB-{path}", zst(stream), True)
    many = [_info(f"many/{k}", b"") for k in range(2100)]
    yield (Case("many-unlisted", zst(tar_bytes(members + many)), True))
    yield (Case("many-listed", zst(tar_bytes(with_files(members, {i.name: b"" for i, _ in many}) + many)), True))
    yield (Case("many-dirs", zst(tar_bytes(members + [_info(f"d{k}", type=tarfile.DIRTYPE) for k in range(2100)])), True))
    yield from rule_cases(archive, members)


# ---- the reading rules the two readers once disagreed on (issue 49), one case each ----

def st_split(blob: bytes) -> tuple[dict, bytes]:
    """(header, data) of a safetensors file."""
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def st_join(header: dict | bytes, data: bytes) -> bytes:
    """A safetensors file of ``header`` (a dict, or raw header bytes) and ``data``."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


def _st_tensor(values: bytes = bytes(16)) -> bytes:
    """A valid safetensors file holding one uint8 tensor 'x' of ``values``."""
    return st_join({"x": {"dtype": "U8", "shape": [len(values)], "data_offsets": [0, len(values)]}}, values)


def sparse_member(path: str, real_size: int, regions) -> tuple[tarfile.TarInfo, bytes]:
    """A pax (GNU sparse 1.0) entry of ``real_size`` bytes whose ``regions`` [(offset, length)]
    hold 0x01 bytes and the rest are holes."""
    info = tarfile.TarInfo("GNUSparseFile.0/" + path.rsplit("/", 1)[-1])
    sparse_map = (f"{len(regions)}\n" + "".join(f"{o}\n{n}\n" for o, n in regions)).encode()
    data = sparse_map + b"\0" * (-len(sparse_map) % 512) + b"".join(b"\x01" * n for _, n in regions)
    info.size, info.mode = len(data), 0o644
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": path,
                        "GNU.sparse.realsize": str(real_size)}
    return info, data


def _sparse_content(real_size: int, regions) -> bytes:
    content = bytearray(real_size)
    for offset, n in regions:
        content[offset:offset + n] = b"\x01" * n
    return bytes(content)


def rule_cases(archive: bytes, members):
    """Cases for the rules of docs/archive.md the readers once applied differently: zstd
    skippable frames, a file that is also a folder, sparse entries, path bounds, a library
    listed as weights, safetensors tiling and strict JSON headers."""
    files = {i.name: d for i, d in members if i.isfile()}
    manifest = json.loads(files["manifest.json"])
    library = manifest["model"]["library"]
    weights = "weights/weights.safetensors"
    so = sorted(p for p in files if p.endswith(".so"))

    def archive_with(extra_files=None, edit=None):
        """The archive with ``extra_files`` replaced or added (listed, at the end) and
        the manifest edited by ``edit``, digest recomputed."""
        listed = with_files(members, extra_files or {}, manifest_edit=edit)
        return zst(tar_bytes(listed + [_info(p, d) for p, d in (extra_files or {}).items() if p not in files]))

    # zstd: skippable frames (magic 0x184D2A5?) are part of the format
    skippable = (0x184D2A50).to_bytes(4, "little") + (6).to_bytes(4, "little") + b"aotpak"
    yield Case("zstd-skippable-first", skippable + archive)
    yield Case("zstd-skippable-between", archive + skippable + zst(b"\0" * 1024))
    yield Case("zstd-skippable-only", skippable, must_refuse=True)
    yield Case("zstd-skippable-inside", zst(skippable + tar_bytes(members)), must_refuse=True)

    # a file that is also a folder, the manifest's entries included
    yield Case("folder-under-file", archive_with({library + "/x": b"x"}), True)
    yield Case("folder-under-manifest", archive_with({"manifest.json/x": b"x"}), True)
    yield Case("folder-dir-entry-over-file", zst(tar_bytes(members + [_info(library, type=tarfile.DIRTYPE)])))

    # sparse entries: the runtime reads them differently (holes, sizes), so both refuse
    regions = [((4 << 20) - 1, 1)]
    yield Case("sparse-listed", zst(tar_bytes(with_files(members, {"zzz/sparse": _sparse_content(4 << 20, regions)})
                                              + [sparse_member("zzz/sparse", 4 << 20, regions)])), True)
    yield Case("sparse-one-region", zst(tar_bytes(with_files(members, {"zzz/full": b"\x01" * 4})
                                                  + [sparse_member("zzz/full", 4, [(0, 4)])])))

    # path bounds: bytes, components, component length, dot names (the cache's own)
    deep = "/".join(["d"] * 2000)
    yield Case("path-2000-folders", zst(tar_bytes(members + [_info("/".join(["d"] * k), type=tarfile.DIRTYPE)
                                                             for k in range(1, 2001)] + [_info(deep + "/x", b"x")])), True)
    yield Case("path-2000-folders-listed", archive_with({deep + "/x": b"x"}), True)
    yield Case("path-33-components", archive_with({"/".join(["d"] * 32) + "/x": b"x"}), True)
    yield Case("path-32-components", archive_with({"/".join(["d"] * 31) + "/x": b"x"}))
    yield Case("path-1025-bytes", archive_with({"a/" + "b" * 250 + "/" + "c" * 250 + "/" + "d" * 250 + "/"
                                                + "e" * 250 + "/" + "f" * 19: b"x"}), True)
    yield Case("path-1024-bytes", archive_with({"a/" + "b" * 250 + "/" + "c" * 250 + "/" + "d" * 250 + "/"
                                                + "e" * 250 + "/" + "f" * 18: b"x"}))
    yield Case("path-long-component", archive_with({"a/" + "b" * 256: b"x"}), True)
    yield Case("path-dot-name", archive_with({"model/.hidden": b"x"}), True)
    yield Case("path-cache-marker", archive_with({".aotpack-complete": b"x"}), True)

    # a file that compresses 1000:1 at the end: the decoder's output outgrows its input
    yield Case("zeros-listed-last", archive_with({"zzz/zeros": bytes(4 << 20)}))

    # odd tar type flags and data after the end-of-archive blocks
    for flag in string.ascii_letters + string.digits:  # a listed entry of every type flag
        if flag not in "xgLKS":  # pax and GNU name headers, sparse: above
            odd = _info("zzz/odd", b"xy", type=flag.encode(), linkname="")
            yield Case(f"typeflag-{flag}", zst(tar_bytes(with_files(members, {"zzz/odd": b"xy"}) + [odd])))
    yield Case("typeflag-empty-hardlink", zst(tar_bytes(with_files(members, {"zzz/odd": b""})
                                                        + [_info("zzz/odd", type=tarfile.LNKTYPE)])))
    yield Case("typeflag-regular-slash", zst(tar_bytes(members + [_info("zzz/dir/", type=tarfile.REGTYPE)])))
    end_of_tar = tar_bytes(members)
    yield Case("tail-small", zst(end_of_tar + bytes(range(256)) * 4))
    yield Case("tail-big", zst(end_of_tar + bytes(range(256)) * (8 << 10)), must_refuse=True)
    yield Case("tail-header", zst(end_of_tar + tar_bytes([_info("zzz/after", b"x")])))

    # several keys breaking one rule: both name the first in sorted order
    big = {p: {**r, "size": 1 << 40} for p, r in manifest["files"].items()}
    yield Case("order-two-big-files", archive_with(edit=lambda m: {**m, "files": big}), True)
    bad = {p: {**r, "sha256": "X" * 64} for p, r in manifest["files"].items()}
    yield Case("order-two-bad-digests", archive_with(edit=lambda m: {**m, "files": bad}), True)

    # a library listed as weights, weights that are not safetensors
    yield Case("library-is-weights", archive_with(edit=lambda m: {**m, "model": {**m["model"], "library": weights}}), True)
    yield Case("library-not-so", archive_with({"model/model.bin": files[library]},
                                              edit=lambda m: {**m, "model": {**m["model"], "library": "model/model.bin"}}))
    yield Case("weights-is-elf", archive_with({weights: files[so[0]]}), True)
    yield Case("weights-text", archive_with({weights: b"not a safetensors file at all"}), True)

    # safetensors: sorted by offset, the tensors cover the data back to back
    tensor_files = {"selftest": ("selftest/inputs.safetensors", _st_tensor())}
    if weights in files:
        tensor_files["weights"] = (weights, files[weights])
    for label, (path, blob) in tensor_files.items():
        header, data = st_split(blob)
        spans = sorted((v["data_offsets"], k) for k, v in header.items() if k != "__metadata__")
        def variant(name, new_header, new_data=None, refuse=True, path=path):
            body = st_join(new_header, data if new_data is None else new_data)
            return Case(f"st-{label}-{name}", archive_with({path: body}), refuse)
        yield variant("valid", header, refuse=False)
        yield variant("trailing-bytes", header, data + bytes(8))
        yield variant("metadata-nan", b'{"__metadata__": {"x": NaN}' + json.dumps(header).encode()[1:]
                      if header else b'{"__metadata__": {"x": NaN}}')
        yield variant("metadata-1e400", b'{"__metadata__": {"x": 1e400}' + (b", " if header else b"")
                      + json.dumps(header).encode()[1:])
        yield variant("metadata-deep", b'{"__metadata__": ' + b"[" * 100 + b"]" * 100 + (b", " if header else b"")
                      + json.dumps(header).encode()[1:])
        yield variant("bom", b"\xef\xbb\xbf" + json.dumps(header).encode())
        yield variant("surrogate", b'{"__metadata__": {"x": "\\ud800"}' + (b", " if header else b"")
                      + json.dumps(header).encode()[1:])
        if not spans:
            continue
        (begin, end), first = spans[0]
        yield variant("reversed", {**header, first: {**header[first], "data_offsets": [end, begin]}},
                      refuse=end != begin)
        yield variant("huge-dim", {**header, first: {**header[first], "shape": [1 << 63]}})
        yield variant("gap-first", {k: {**v, "data_offsets": [v["data_offsets"][0] + 8, v["data_offsets"][1] + 8]}
                                    for k, v in header.items() if k != "__metadata__"}, bytes(8) + data)
        if len(spans) > 1:
            (b2, e2), second = spans[1]
            shift = min(b2, 8)
            yield variant("overlap", {**header, second: {**header[second], "data_offsets": [b2 - shift, e2 - shift]}})
            yield variant("same-range", {**header, second: {**header[second], "data_offsets": [begin, end]}}
                          if e2 - b2 == end - begin else
                          {**header, second: {**header[second], "data_offsets": [b2 - shift, e2 - shift]}})


# ---- running ----

def _limit(nbytes: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    return apply


@dataclass
class Outcome:
    rc: int | None  # None: timed out
    stderr: str


def _run(cmd, env, limit) -> Outcome:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                           timeout=TIMEOUT_S, preexec_fn=_limit(limit))
        return Outcome(p.returncode, p.stderr)
    except subprocess.TimeoutExpired:
        return Outcome(None, "timeout")


def run_case(case: Case, work: Path) -> list[str]:
    """Problems found with one case (empty = fine)."""
    path = work / "case.aotpack"
    path.write_bytes(case.data)
    tmp, cache = work / "tmp", work / "cache"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(tmp), XDG_CACHE_HOME=str(cache), **LIMITS)
    env.pop("AOTPACK_TRUSTED_KEYS", None)  # no keys: set but empty is an error
    runtime = _run([str(RUNTIME), str(path), "--check"], env, RUNTIME_AS)
    python = _run([sys.executable, "-m", "aotpack", "verify", str(path)],
                  dict(env, PYTHONPATH=str(REPO)), PYTHON_AS)
    problems = []
    for who, out, prefix in (("runtime", runtime, "aotpack-run: error: "), ("verify", python, "aotpack: error: ")):
        if out.rc is None:
            problems.append(f"{who}: hang (> {TIMEOUT_S} s)")
        elif out.rc < 0:
            problems.append(f"{who}: killed by signal {-out.rc}")
        elif out.rc != 0 and (not out.stderr.startswith(prefix) or out.stderr.count("\n") != 1
                              or "internal error" in out.stderr or "Traceback" in out.stderr):
            problems.append(f"{who}: unclean error: {out.stderr[:300]!r}")
    if runtime.rc is not None and python.rc is not None and (runtime.rc == 0) != (python.rc == 0):
        problems.append(f"readers disagree: runtime rc {runtime.rc} {runtime.stderr.strip()[:200]!r}, "
                        f"verify rc {python.rc} {python.stderr.strip()[:200]!r}")
    if case.must_refuse and (runtime.rc == 0 or python.rc == 0):
        problems.append("accepted, but it must be refused")
    left = sorted(os.listdir(tmp)) + (sorted(os.listdir(cache / "aotpack/runtime/tmp"))
                                      if (cache / "aotpack/runtime/tmp").exists() else [])
    if left:
        problems.append(f"left behind: {left}")
    shutil.rmtree(cache, ignore_errors=True)
    return problems


def run_corpus(cases, log=print) -> dict:
    """Run every case; returns {"cases": count, "refused": count, "problems": {name: [..]}}."""
    count, problems = 0, {}
    with tempfile.TemporaryDirectory(prefix="aotpack-corpus-") as work:
        for case in cases:
            count += 1
            found = run_case(case, Path(work))
            if found:
                problems[case.name] = found
                log(f"{case.name}: " + "; ".join(found))
    return {"cases": count, "problems": problems}


# ---- both readers in this process: do they agree, and name the same problem? ----

#: Refusals only the runtime makes, because they depend on the host (docs/archive.md:
#: torch major.minor, CPU features of target_isa, the ABI version model.so reports).
HOST_DEPENDENT = ("built with torch ", "this CPU lacks ", " implements model ABI ")


#: The problem a tar or zstd library reports for a damaged stream (see disagreement()).
LIBRARY_FOUND = "corrupt archive"


def problem(message: str) -> str:
    """The problem a refusal names, as compared between the readers: the message up to its
    first " (" (the parenthesis explains; the runtime adds its ABI minor, for one) and, for
    errors of the tar/zstd/JSON libraries (libarchive vs tarfile, nlohmann vs json), only
    the category before the library's own words."""
    for category in (LIBRARY_FOUND, " is not valid JSON"):
        at = message.find(category)
        if at >= 0:
            return message[:at + len(category)]
    return message.split(" (", 1)[0]


@contextlib.contextmanager
def _environment(values: dict[str, str | None]):
    """``os.environ`` with ``values`` set (None: unset) for the block, restored after."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def readers_verdicts(path: Path) -> tuple[str | None, str | None]:
    """(runtime, reader) refusal messages for the archive at ``path`` (None: accepted),
    without the archive's name: ``aotpack.load`` (the runtime's C API, extracting every byte
    with the cache off) and ``aotpack.archive.reader.check`` (``aotpack verify``'s rules)."""
    from aotpack.archive import reader
    from aotpack.errors import AotpackError
    from aotpack.runtime.loader import load

    verdicts = []
    for prefix, read in ((f"cannot load '{path}': ", lambda: load(path).close()),
                         (f"{path}: ", lambda: reader.check(path, trusted_keys=[]))):
        try:
            read()
            verdicts.append(None)
        except AotpackError as exc:
            text = str(exc)
            verdicts.append(text[len(prefix):] if text.startswith(prefix) else text)
    return verdicts[0], verdicts[1]


def disagreement(case: Case, work: Path) -> str | None:
    """Why the two readers disagree on ``case`` (accept vs refuse, or refusals naming
    different problems), a leftover temp folder, or an accepted must-refuse case; None when
    they agree. Runs both in this process under LIMITS, with the extraction cache off."""
    path, tmp = work / "case.aotpack", work / "tmp"
    path.write_bytes(case.data)
    tmp.mkdir(exist_ok=True)
    with _environment(dict(LIMITS, TMPDIR=str(tmp), AOTPACK_RUNTIME_CACHE="0", AOTPACK_TRUSTED_KEYS=None)):
        runtime, python = readers_verdicts(path)
    if os.listdir(tmp):
        return f"left behind: {sorted(os.listdir(tmp))}"
    if runtime is not None and python is None and runtime.startswith(HOST_DEPENDENT):
        return None
    if (runtime is None) != (python is None):
        return f"runtime: {runtime!r}, verify: {python!r}"
    # libarchive and tarfile/zstandard notice a damaged stream at different points: the
    # other reader may refuse it by a later check (a digest, the next entry, a sha256)
    found_by_library = runtime and LIBRARY_FOUND in (problem(runtime), problem(python))
    if runtime and problem(runtime) != problem(python) and not found_by_library:
        return f"runtime: {runtime!r}, verify: {python!r}"
    if case.must_refuse and runtime is None:
        return "accepted, but it must be refused"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive", type=Path)
    parser.add_argument("--sample", type=int, default=0, help="run every N-th case only")
    args = parser.parse_args()
    cases = corpus(args.archive.read_bytes())
    if args.sample:
        cases = itertools.islice(cases, 0, None, args.sample)
    result = run_corpus(cases)
    print(f"{result['cases']} hostile archives, {len(result['problems'])} with problems")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
