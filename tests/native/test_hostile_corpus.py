"""The hostile corpus (tests/hostile_corpus.py) against both archive readers.

- The whole corpus made from the hand-built fixture archive (constants, weights, one .so)
  goes through the native runtime (`aotpack.load`, the C API, every byte extracted) and
  the Python reader (`aotpack verify`'s `reader.check`) in this process: they must accept
  and refuse the same archives and name the same problem (`hostile_corpus.problem`),
  except the host-dependent refusals of `hostile_corpus.HOST_DEPENDENT` and the points at
  which the tar/zstd libraries notice a damaged stream (docs/archive.md, "Reading rules").
- The cases of the rules the readers once applied differently (issue 49) are refused by
  both with the exact message below.
- A sample also runs through `aotpack-run --check` and `aotpack verify` as processes under
  address-space limits (no signal, no hang, nothing left behind); `make fuzz` runs the
  whole corpus that way on a real sample model.
"""
from __future__ import annotations

import itertools

import pytest

import hostile_corpus as hc
from helpers import MODELS
from test_native_runtime import fx


SAMPLE_EVERY = 40  # ~20 of ~740 cases as processes (+ ~10 must-refuse): ~40 s on 2 shared cores

WEIGHTS, SELFTEST = "weights/weights.safetensors", "selftest/inputs.safetensors"
GAP = "belong to no tensor (data_offsets must cover the data back to back)"
DEEP = "/".join(["d"] * 32)
LONG = "a/" + "/".join(c * 250 for c in "bcde") + "/" + "f" * 19  # 1025 bytes


def _files(path: str, what: str) -> str:
    return f'manifest.json: files["{path}"]: {what}'


#: case -> what both readers say about it on the fixture archive (None: accepted); a value
#: ending in ": " is a prefix (the JSON and zstd libraries word the rest themselves).
EXPECTED = {
    "zstd-skippable-first": None,
    "zstd-skippable-between": None,
    "zstd-skippable-only": "corrupt archive: ",
    "zstd-skippable-inside": "corrupt archive: ",
    "folder-under-file": _files("model/model.so/x", "'model/model.so' is a file, so it cannot be a folder"),
    "folder-under-manifest": _files("manifest.json/x", "'manifest.json' is a file, so it cannot be a folder"),
    "folder-dir-entry-over-file": None,
    "sparse-listed": "entry 'zzz/sparse' is a sparse file",
    "sparse-one-region": None,
    "path-2000-folders": f"entry '{DEEP}/d' has more than 32 components",
    "path-2000-folders-listed": _files("/".join(["d"] * 2000) + "/x", "entry with a path longer than 1024 bytes"),
    "path-33-components": _files(f"{DEEP}/x", f"entry '{DEEP}/x' has more than 32 components"),
    "path-32-components": None,
    "path-1025-bytes": _files(LONG, "entry with a path longer than 1024 bytes"),
    "path-1024-bytes": None,
    "path-long-component": _files("a/" + "b" * 256, f"entry 'a/{'b' * 256}' has a component longer than 255 bytes"),
    "path-dot-name": _files("model/.hidden", "entry 'model/.hidden' has a component starting with '.'"),
    "path-cache-marker": _files(".aotpack-complete", "entry '.aotpack-complete' has a component starting with '.'"),
    "library-is-weights": f"{WEIGHTS} is not a valid shared object for this host: no ELF magic",
    "library-not-so": None,
    "weights-is-elf": f"{WEIGHTS}: safetensors header length exceeds the file size",
    "weights-text": f"{WEIGHTS}: safetensors header length exceeds the file size",
    "st-weights-valid": None,
    "st-weights-overlap": f"{WEIGHTS}: tensors 'calls' and 'b' overlap: data_offsets [0, 8] and [0, 64]",
    "st-weights-same-range": f"{WEIGHTS}: tensors 'calls' and 'b' overlap: data_offsets [0, 8] and [0, 64]",
    "st-weights-gap-first": f"{WEIGHTS}: 8 bytes at data offset 0 {GAP}",
    "st-weights-trailing-bytes": f"{WEIGHTS}: 8 bytes at data offset 584 {GAP}",
    "st-weights-reversed": f"{WEIGHTS}: tensor 'calls' data_offsets end before they begin",
    "st-weights-huge-dim": f"{WEIGHTS}: tensor 'calls' has a bad shape entry",
    "st-weights-bom": f"{WEIGHTS}: header starts with a byte-order mark (it must be plain UTF-8 JSON)",
    "st-weights-metadata-deep": f"{WEIGHTS}: header nests deeper than 64 levels",
    "st-weights-metadata-nan": f"{WEIGHTS}: header is not valid JSON: ",
    "st-weights-metadata-1e400": f"{WEIGHTS}: header is not valid JSON: ",
    "st-weights-surrogate": f"{WEIGHTS}: header is not valid JSON: ",
    "st-selftest-valid": None,
    "st-selftest-trailing-bytes": f"{SELFTEST}: 8 bytes at data offset 16 {GAP}",
    "st-selftest-gap-first": f"{SELFTEST}: 8 bytes at data offset 0 {GAP}",
    "st-selftest-reversed": f"{SELFTEST}: tensor 'x' data_offsets end before they begin",
    "st-selftest-huge-dim": f"{SELFTEST}: tensor 'x' has a bad shape entry",
    "st-selftest-bom": f"{SELFTEST}: header starts with a byte-order mark (it must be plain UTF-8 JSON)",
    "st-selftest-metadata-deep": f"{SELFTEST}: header nests deeper than 64 levels",
    "st-selftest-metadata-nan": f"{SELFTEST}: header is not valid JSON: ",
    "st-selftest-metadata-1e400": f"{SELFTEST}: header is not valid JSON: ",
    "st-selftest-surrogate": f"{SELFTEST}: header is not valid JSON: ",
    "typeflag-0": None,
    "typeflag-Z": None,  # a flag no standard defines: a regular file to libarchive
    "typeflag-D": "file 'zzz/odd' listed in manifest.json is missing from the archive",  # a folder
    "typeflag-M": "entry 'zzz/odd' has an unsupported file type",
    "typeflag-V": "corrupt archive: ",  # a volume label has no data
    "typeflag-A": "corrupt archive: ",  # a Solaris ACL with no entry after it
    "typeflag-1": "entry 'zzz/odd' is 0 bytes, manifest.json says 2",  # a hard link naming nothing
    "typeflag-2": "entry 'zzz/odd' is a symbolic link",
    "typeflag-empty-hardlink": "entry 'zzz/odd' has an unsupported file type",
    "typeflag-regular-slash": None,
    "order-two-big-files": "file 'model/model.cpp' is 1099511627776 bytes, more than the limit of 134217728 "
                           "per entry (AOTPACK_MAX_ENTRY_BYTES)",  # the first of the files in path order
    "order-two-bad-digests": 'manifest.json: files["model/model.cpp"].sha256: not a 64-digit lower-case hex digest',
    "zeros-listed-last": None,
    "tail-small": None,
    "tail-header": None,  # after the end-of-archive block: padding, not an entry
    "tail-big": "corrupt archive: more than 1 MiB of data after the end of the tar",
}


@pytest.fixture(scope="module")
def fixture_archive(tmp_path_factory) -> bytes:
    return fx.build_fixture(tmp_path_factory.mktemp("fixture"))["archive"].read_bytes()


@pytest.fixture(scope="module")
def rule_verdicts(fixture_archive, tmp_path_factory) -> dict:
    """{case name: (runtime message, reader message)} of every rule case on the fixture."""
    work = tmp_path_factory.mktemp("rules")
    (work / "tmp").mkdir()
    members = hc.members_of(fixture_archive)
    verdicts = {}
    for case in hc.rule_cases(fixture_archive, members):
        path = work / "case.aotpack"
        path.write_bytes(case.data)
        with hc._environment(dict(hc.LIMITS, TMPDIR=str(work / "tmp"), AOTPACK_RUNTIME_CACHE="0",
                                  AOTPACK_TRUSTED_KEYS=None)):
            verdicts[case.name] = hc.readers_verdicts(path)
    return verdicts


def test_every_rule_case_is_expected(rule_verdicts):
    """Each rule case has its verdict above, but the type flags: those only agree."""
    assert sorted(n for n in rule_verdicts if n in EXPECTED or not n.startswith("typeflag-")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_both_readers_give_the_rule_verdict(rule_verdicts, name):
    expected, (runtime, python) = EXPECTED[name], rule_verdicts[name]
    if expected is None or not expected.endswith(": "):
        assert (runtime, python) == (expected, expected)
    else:
        assert runtime.startswith(expected) and python.startswith(expected), (runtime, python)


def test_readers_agree_on_the_whole_corpus(fixture_archive, tmp_path):
    count, disagreements = 0, {}
    for case in hc.corpus(fixture_archive):
        count += 1
        found = hc.disagreement(case, tmp_path)
        if found:
            disagreements[case.name] = found
    assert count >= 550
    assert disagreements == {}


def test_rule_cases_agree_on_a_compiled_model_without_constants(build_model, tmp_path):
    """dict_outputs has no constants: its weights file is read only by the tensor-file rule."""
    archive = build_model(MODELS / "dict_outputs.py").archive.read_bytes()
    cases = list(hc.rule_cases(archive, hc.members_of(archive)))
    problems = {case.name: found for case in cases if (found := hc.disagreement(case, tmp_path))}
    assert problems == {}
    weights_is_elf = next(case for case in cases if case.name == "weights-is-elf")
    path = tmp_path / "weights-is-elf.aotpack"
    path.write_bytes(weights_is_elf.data)
    with hc._environment({"TMPDIR": str(tmp_path), "AOTPACK_RUNTIME_CACHE": "0", "AOTPACK_TRUSTED_KEYS": None}):
        runtime, python = hc.readers_verdicts(path)
    assert runtime == python == f"{WEIGHTS}: safetensors header length exceeds the file size"


@pytest.mark.parametrize("raw", ["99999999999999999999999", "9223372036854775808", "0", "00", "-1", "+5",
                                 " 5", "5 ", "1_000", "5e3", "0x10", "\u0663", "\u00b2"])
def test_limit_variables_are_refused_alike(fixture_archive, tmp_path, raw):
    path = tmp_path / "fixture.aotpack"
    path.write_bytes(fixture_archive)
    with hc._environment({"AOTPACK_MAX_ENTRIES": raw, "TMPDIR": str(tmp_path), "AOTPACK_RUNTIME_CACHE": "0",
                          "AOTPACK_TRUSTED_KEYS": None}):
        runtime, python = hc.readers_verdicts(path)
    message = f"AOTPACK_MAX_ENTRIES must be an integer from 1 to 9223372036854775807, got '{raw}'"
    assert (runtime, python) == (message, message)


@pytest.mark.parametrize("raw, verdict", [("9223372036854775807", None), ("007", None), ("", None),
                                          ("3", "manifest.json lists 3 files, more than the limit of 3 "
                                                "entries (AOTPACK_MAX_ENTRIES)")])
def test_limit_variables_are_accepted_alike(fixture_archive, tmp_path, raw, verdict):
    path = tmp_path / "fixture.aotpack"
    path.write_bytes(fixture_archive)
    with hc._environment({"AOTPACK_MAX_ENTRIES": raw, "TMPDIR": str(tmp_path), "AOTPACK_RUNTIME_CACHE": "0",
                          "AOTPACK_TRUSTED_KEYS": None}):
        assert hc.readers_verdicts(path) == (verdict, verdict)


def test_corpus_is_large_and_varied(build_model):
    archive = build_model(MODELS / "dict_outputs.py").archive.read_bytes()
    names = [case.name for case in hc.corpus(archive)]
    assert len(names) >= 500 and len(set(names)) == len(names)
    for kind in ("truncate-", "bitflip-", "overwrite-", "tar-overwrite-", "entry-", "elf-truncate-",
                 "manifest-edit-", "manifest-bad-", "bomb-", "declared-", "many-", "weights-", "zstd-",
                 "folder-", "sparse-", "path-", "library-", "st-weights-", "st-selftest-"):
        assert any(n.startswith(kind) for n in names), kind


def test_corpus_sample_fails_cleanly_everywhere(build_model):
    archive = build_model(MODELS / "dict_outputs.py").archive.read_bytes()
    sample = itertools.islice(hc.corpus(archive), 0, None, SAMPLE_EVERY)
    must = [c for c in hc.corpus(archive) if c.name.startswith(("manifest-edit-", "elf-", "bomb-"))][::16]
    result = hc.run_corpus(itertools.chain(sample, must), log=lambda line: None)
    assert result["cases"] >= 25
    assert result["problems"] == {}
