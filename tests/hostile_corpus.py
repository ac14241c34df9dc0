"""A corpus of hostile archives made from a real one, and a runner that feeds each to the
native runtime (``aotpack-run --check``) and to ``aotpack verify``, each under an
address-space limit and a 10 s timeout.

    python tests/hostile_corpus.py ARCHIVE [--sample N]     (``make fuzz`` runs it all)

Findings that fail the run: a signal (crash), a hang, a temp folder left behind, the two
readers disagreeing, an accepted manifest edit whose digest was not recomputed, or a line
of stderr that is not one clean error message.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import io
import json
import os
import random
import resource
import shutil
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
            if info.isfile():
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
