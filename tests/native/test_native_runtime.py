"""End-to-end tests of the native runtime (native/) on hand-built archives.

Needs the native build (these tests fail, not skip, without it):

    cmake -S native -B native/build -DCMAKE_BUILD_TYPE=Release \
          -DCMAKE_PREFIX_PATH=$(.venv/bin/python -c 'import torch;print(torch.utils.cmake_prefix_path)')
    cmake --build native/build -j2
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from aotpack.archive import layout

from helpers import LIBRARY, RUN, UNIT_TESTS, fx, require
@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return fx.build_fixture(tmp_path_factory.mktemp("fixture"))


def run_tool(*args, tmpdir: Path | None = None, cache: Path | None = None) -> subprocess.CompletedProcess:
    """aotpack-run with TMPDIR pointed at `tmpdir`, so a test can see what was left behind,
    and with the extraction cache under `cache` ($XDG_CACHE_HOME) when given."""
    env = dict(os.environ)
    if tmpdir is not None:
        tmpdir.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmpdir)
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    return subprocess.run([str(require(RUN)), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)


def variant(fixture, tmp_path: Path, *, files=None, manifest_files=None, extra_members=(),
            **manifest_overrides) -> Path:
    """An archive like the good one, with the given changes. manifest_files: the files the
    manifest describes (default: the files actually stored)."""
    files = dict(fixture["files"] if files is None else files)
    described = files if manifest_files is None else manifest_files
    manifest = fx.make_manifest(described, **manifest_overrides)
    return fx.write_archive(tmp_path / "variant.aotpack", manifest, files, list(extra_members))


def assert_refused(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 1, result
    assert result.stderr.startswith("aotpack-run: error: cannot load '"), result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert "Segmentation" not in result.stderr and "terminate called" not in result.stderr


# ---- the C++ unit tests ----

def test_cpp_unit_tests():
    result = subprocess.run([str(require(UNIT_TESTS))], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checks passed" in result.stdout


# ---- running the good archive ----

def test_run_writes_npz_matching_numpy(fixture, tmp_path):
    out = tmp_path / "out.npz"
    result = run_tool(fixture["archive"], fixture["x"], "--output", out, tmpdir=tmp_path / "tmp")
    assert result.returncode == 0, result.stderr
    with np.load(out) as outputs:
        assert sorted(outputs.files) == ["calls", "y"]
        np.testing.assert_allclose(outputs["y"], fixture["expected"]["y"], rtol=1e-5, atol=1e-6)
        assert outputs["y"].dtype == np.float32
        np.testing.assert_array_equal(outputs["calls"], [1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz", "tmp"]  # no temp file left
    assert list((tmp_path / "tmp").iterdir()) == []  # extraction folder removed


def test_run_prints_outputs(fixture):
    result = run_tool(fixture["archive"], fixture["x"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("y: float32[4, 16] = ")
    first = [float(v) for v in lines[0].split("=")[1].split()[:4]]
    np.testing.assert_allclose(first, fixture["expected"]["y"].ravel()[:4], rtol=1e-4, atol=1e-5)
    assert lines[1] == "calls: int64[1] = 1"


def test_bench_output_format(fixture, tmp_path):
    result = run_tool(fixture["archive"], fixture["x"], "--bench", 20, "--warmup", 3,
                      "--output", tmp_path / "o.npz")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"load_ms=\d+\.\d+", lines[0]), lines
    assert re.fullmatch(r"latency_us median=\d+\.\d+ p10=\d+\.\d+ p90=\d+\.\d+ runs=20", lines[1]), lines
    with np.load(tmp_path / "o.npz") as outputs:
        np.testing.assert_array_equal(outputs["calls"], [23])  # the buffer is mutated in place


def test_help():
    result = run_tool("--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: aotpack-run ARCHIVE")


# ---- bad invocations ----

def test_wrong_input_dtype(fixture, tmp_path):
    x64 = tmp_path / "x64.npy"
    np.save(x64, fixture["x_array"].astype(np.float64))
    result = run_tool(fixture["archive"], x64)
    assert result.returncode == 1
    assert result.stderr == (f"aotpack-run: error: input 0 ('x'): expected float32[4, 8], "
                             f"got float64[4, 8] from {x64}\n")


def test_wrong_input_count(fixture):
    result = run_tool(fixture["archive"], fixture["x"], fixture["x"])
    assert result.returncode == 1
    assert "takes 1 input(s) (x: float32[4, 8]), got 2 .npy file(s)" in result.stderr


def test_fortran_order_input_is_accepted(fixture, tmp_path):
    # np.save of a transposed view writes column-major data with fortran_order=True
    path = tmp_path / "f.npy"
    np.save(path, np.asfortranarray(fixture["x_array"]))
    out = tmp_path / "out.npz"
    result = run_tool(fixture["archive"], path, "--output", out)
    assert result.returncode == 0, result.stderr
    with np.load(out) as outputs:
        np.testing.assert_allclose(outputs["y"], fixture["expected"]["y"], rtol=1e-5, atol=1e-6)


def test_usage_error():
    result = run_tool("--bench", "zero")
    assert result.returncode == 2 and "--bench expects an integer" in result.stderr


# ---- refused archives ----

def run_damaged(archive: Path, fixture, tmp_path: Path) -> subprocess.CompletedProcess:
    """aotpack-run on an archive whose manifest is the good one's but whose files are not,
    with a fresh extraction cache: the files are read (a cache entry for the good
    manifest would be used instead, see test_cache_entry_is_named_by_its_manifest).
    Checks that nothing was published to the cache or left in its temp folder."""
    cache = tmp_path / "xdg"
    result = run_tool(archive, fixture["x"], tmpdir=tmp_path / "tmp", cache=cache)
    assert sorted(os.listdir(cache / "aotpack" / "runtime")) == ["tmp"]
    assert os.listdir(cache / "aotpack" / "runtime" / "tmp") == []
    assert list((tmp_path / "tmp").iterdir()) == []
    return result


def tampered_model(fixture, tmp_path: Path) -> Path:
    """The good archive with one byte of model.so flipped; its manifest is unchanged."""
    files = dict(fixture["files"])
    so = bytearray(files[layout.MODEL_LIBRARY_PATH])
    so[len(so) // 2] ^= 0xFF
    files[layout.MODEL_LIBRARY_PATH] = bytes(so)
    return variant(fixture, tmp_path, files=files, manifest_files=fixture["files"])


def test_tampered_model_refused(fixture, tmp_path):
    result = run_damaged(tampered_model(fixture, tmp_path), fixture, tmp_path)
    assert_refused(result, f"sha256 mismatch for '{layout.MODEL_LIBRARY_PATH}'")


def test_cache_entry_is_named_by_its_manifest(fixture, tmp_path):
    """A cache entry holds files checked against its manifest's sha256 when extracted, and
    a load reads only an archive's manifest entries when their entry exists: a damaged
    copy of a cached archive runs the verified files, never its own."""
    cache = tmp_path / "xdg"
    good = tmp_path / "good.npz"
    assert run_tool(fixture["archive"], fixture["x"], "--output", good, cache=cache).returncode == 0
    [entry] = [p for p in (cache / "aotpack" / "runtime").iterdir() if p.name != "tmp"]
    assert entry.name == hashlib.sha256((entry / layout.MANIFEST_PATH).read_bytes()).hexdigest()
    tampered = tampered_model(fixture, tmp_path)
    out = tmp_path / "out.npz"
    result = run_tool(tampered, fixture["x"], "--output", out, cache=cache)
    assert result.returncode == 0, result.stderr
    with np.load(good) as expected, np.load(out) as outputs:
        np.testing.assert_array_equal(outputs["y"], expected["y"])
    assert_refused(run_tool(tampered, fixture["x"], cache=tmp_path / "fresh"),
                   f"sha256 mismatch for '{layout.MODEL_LIBRARY_PATH}'")


def _member(name: str, kind: bytes, **fields) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize("member, needle", [
    (_member("../evil", tarfile.REGTYPE), "entry '../evil' has a '..' component"),
    (_member("model/../../evil", tarfile.REGTYPE), "'..' component"),
    (_member("/tmp/evil", tarfile.REGTYPE), "has an absolute path"),
    (_member("model/link.so", tarfile.SYMTYPE, linkname="/etc/passwd"), "is a symbolic link"),
    (_member("model/hard.so", tarfile.LNKTYPE, linkname=layout.MODEL_LIBRARY_PATH), "is a hard link"),
    (_member("model/dev", tarfile.CHRTYPE, devmajor=1, devminor=3), "is a device"),
    (_member("model/fifo", tarfile.FIFOTYPE), "is a FIFO"),
], ids=["dotdot", "nested-dotdot", "absolute", "symlink", "hardlink", "device", "fifo"])
def test_unsafe_entry_refused(fixture, tmp_path, member, needle):
    archive = variant(fixture, tmp_path, extra_members=[member])
    assert_refused(run_damaged(archive, fixture, tmp_path), needle)
    assert not (tmp_path / "evil").exists()


def test_unlisted_entry_refused(fixture, tmp_path):
    files = dict(fixture["files"], **{"extra.txt": b"surprise"})
    archive = variant(fixture, tmp_path, files=files, manifest_files=fixture["files"])
    assert_refused(run_damaged(archive, fixture, tmp_path), "entry 'extra.txt' is not listed")


def test_missing_file_refused(fixture, tmp_path):
    files = {k: v for k, v in fixture["files"].items() if k != layout.MODEL_SOURCE_PATH}
    archive = variant(fixture, tmp_path, files=files, manifest_files=fixture["files"])
    assert_refused(run_damaged(archive, fixture, tmp_path),
                   f"file '{layout.MODEL_SOURCE_PATH}' listed in {layout.MANIFEST_PATH} is missing")


def test_missing_manifest_refused(fixture, tmp_path):
    archive = fx.write_archive(tmp_path / "m.aotpack", None, fixture["files"])
    assert_refused(run_tool(archive, fixture["x"]), f"the archive's first entry must be manifest.json, found '{layout.MODEL_SOURCE_PATH}'")


def test_not_an_archive_refused(tmp_path, fixture):
    path = tmp_path / "junk.aotpack"
    path.write_bytes(b"\x00" * 1000)
    assert_refused(run_tool(path, fixture["x"]), "junk.aotpack")


@pytest.mark.parametrize("overrides, needle", [
    ({"target_isa": {"march": "x", "features": ["sse2", "warp9"]}},
     "'warp9' (unknown feature name, treated as unsupported)"),
    ({"torch_version": "1.13.1"}, "built with torch 1.13.1 but this runtime links torch"),
    ({"format_version": layout.FORMAT_VERSION + 1},
     f"format_version {layout.FORMAT_VERSION + 1} is not supported (this runtime reads "
     f"{layout.FORMAT_VERSION}): use a newer aotpack runtime"),
    ({"format_version": 1},
     f"format_version 1 is not supported (this runtime reads {layout.FORMAT_VERSION}): the archive "
     "is from an older aotpack (before the versioned kernel launch ABI); rebuild it with this aotpack"),
    ({"backend": "npu"}, "backend 'npu' is not supported"),
    ({"model": {"library": layout.MODEL_LIBRARY_PATH, "abi_version": 7}},
     "model.abi_version 7 is not supported (this runtime implements model ABI 2.0; the major must match)"),
], ids=["cpu-feature", "torch-version", "format-version", "format-version-1", "backend", "abi-version"])
def test_incompatible_manifest_refused(fixture, tmp_path, overrides, needle):
    archive = variant(fixture, tmp_path, **overrides)
    assert_refused(run_tool(archive, fixture["x"], tmpdir=tmp_path / "tmp"), needle)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_constant_mismatch_refused(fixture, tmp_path):
    constants = [fx.spec("w", "float32", [16, 8], [8, 1]), fx.spec("b", "float32", [16], [1]),
                 fx.spec("calls", "int64", [1], [1])]
    archive = variant(fixture, tmp_path, constants=constants)
    assert_refused(run_tool(archive, fixture["x"]),
                   f"constant 'w': {layout.MANIFEST_PATH} says float32[16, 8], {layout.WEIGHTS_PATH} "
                   "holds float32[8, 16]")


def test_model_create_error_is_reported(fixture, tmp_path):
    # model.so refuses w with the wrong strides; its own message must reach the user.
    constants = [fx.spec("w", "float32", [8, 16], [16, 1]), fx.spec("b", "float32", [16], [1]),
                 fx.spec("calls", "int64", [1], [1])]
    archive = variant(fixture, tmp_path, constants=constants)
    assert_refused(run_tool(archive, fixture["x"], tmpdir=tmp_path / "tmp"),
                   "aotpack_model_create failed: w: layout mismatch: expected float32[8, 16] "
                   "strides [1, 8], got float32[8, 16] strides [16, 1]")
    assert list((tmp_path / "tmp").iterdir()) == []


# ---- the C API through ctypes ----

class TensorSpec(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int64),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64))]


def _c_api():
    lib = ctypes.CDLL(str(require(LIBRARY)))
    lib.aotpack_last_error.restype = ctypes.c_char_p
    lib.aotpack_model_load.argtypes = [ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p)]
    lib.aotpack_model_free.argtypes = [ctypes.c_void_p]
    lib.aotpack_model_name.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)]
    lib.aotpack_model_input_spec.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(TensorSpec)]
    lib.aotpack_model_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64,
                                      ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64]
    lib.aotpack_tensor_new.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                                       ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_void_p)]
    lib.aotpack_tensor_info.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32),
                                        ctypes.POINTER(ctypes.c_int64),
                                        ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                                        ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.aotpack_tensor_free.argtypes = [ctypes.c_void_p]
    return lib


def test_c_api(fixture):
    lib = _c_api()
    model = ctypes.c_void_p()
    assert lib.aotpack_model_load(b"/nonexistent.aotpack", 0, ctypes.byref(model)) != 0
    assert b"cannot load '/nonexistent.aotpack'" in lib.aotpack_last_error()

    assert lib.aotpack_model_load(str(fixture["archive"]).encode(), 0, ctypes.byref(model)) == 0, \
        lib.aotpack_last_error()
    try:
        name = ctypes.c_char_p()
        assert lib.aotpack_model_name(model, ctypes.byref(name)) == 0 and name.value == b"fixture_mlp"
        spec = TensorSpec()
        assert lib.aotpack_model_input_spec(model, 0, ctypes.byref(spec)) == 0
        assert (spec.name, spec.dtype, spec.shape[0], spec.shape[1]) == (b"x", 6, 4, 8)
        assert lib.aotpack_model_input_spec(model, 1, ctypes.byref(spec)) != 0
        assert b"input index 1 out of range" in lib.aotpack_last_error()

        x = np.ascontiguousarray(fixture["x_array"])
        sizes = (ctypes.c_int64 * 2)(4, 8)
        handle = ctypes.c_void_p()
        assert lib.aotpack_tensor_new(6, 2, sizes, None, x.ctypes.data, ctypes.byref(handle)) == 0
        inputs = (ctypes.c_void_p * 1)(handle.value)
        outputs = (ctypes.c_void_p * 2)()
        assert lib.aotpack_model_run(model, inputs, 1, outputs, 2) == 0, lib.aotpack_last_error()
        lib.aotpack_tensor_free(handle)
        spare = (ctypes.c_void_p * 1)()
        assert lib.aotpack_model_run(model, inputs, 1, spare, 1) != 0
        assert b"the model has 2 output(s), the caller passed 1 slot(s)" in lib.aotpack_last_error()

        dtype, ndim = ctypes.c_int32(), ctypes.c_int64()
        out_sizes, data = ctypes.POINTER(ctypes.c_int64)(), ctypes.c_void_p()
        assert lib.aotpack_tensor_info(outputs[0], ctypes.byref(dtype), ctypes.byref(ndim),
                                       ctypes.byref(out_sizes), None, ctypes.byref(data)) == 0
        assert (dtype.value, ndim.value, out_sizes[0], out_sizes[1]) == (6, 2, 4, 16)
        y = np.ctypeslib.as_array((ctypes.c_float * 64).from_address(data.value)).reshape(4, 16).copy()
        np.testing.assert_allclose(y, fixture["expected"]["y"], rtol=1e-5, atol=1e-6)
        for out in outputs:
            lib.aotpack_tensor_free(out)

        # A column-major input is copied into the manifest's row-major layout before the run
        # (model.so itself insists on strides [8, 1]).
        strides = (ctypes.c_int64 * 2)(1, 4)
        assert lib.aotpack_tensor_new(6, 2, sizes, strides, x.ctypes.data, ctypes.byref(handle)) == 0
        inputs = (ctypes.c_void_p * 1)(handle.value)
        assert lib.aotpack_model_run(model, inputs, 1, outputs, 2) == 0, lib.aotpack_last_error()
        assert lib.aotpack_tensor_info(outputs[0], None, None, None, None, ctypes.byref(data)) == 0
        y2 = np.ctypeslib.as_array((ctypes.c_float * 64).from_address(data.value)).reshape(4, 16)
        np.testing.assert_array_equal(y2, y)
        for h in (handle, *outputs):
            lib.aotpack_tensor_free(h)
    finally:
        lib.aotpack_model_free(model)
