"""``.npy`` inputs: `aotpack run` and aotpack-run read them with the runtime's one reader
(``aotpack_npy_load``), so both refuse the same bad files with the same one-line message,
and a 0-dim array stays 0-dim."""
from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from aotpack.commands import cli
from aotpack.runtime import loader
from aotpack.errors import AotpackError
from helpers import MODELS, eager_outputs
from test_native_runtime import RUN, fx, require



@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return fx.build_fixture(tmp_path_factory.mktemp("fixture"))


def npy(header: str, data: bytes = b"") -> bytes:
    """A format 1.0 .npy file with this header dict (padded as numpy pads it)."""
    text = (header + " " * (64 - (len(header) + 11) % 64) + "\n").encode()
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


def _save(array) -> callable:
    return lambda path: np.save(path, array)


def _raw(data: bytes) -> callable:
    return lambda path: path.write_bytes(data)


def _extra_byte(path: Path) -> None:
    np.save(path, np.ones((4, 8), np.float32))
    path.write_bytes(path.read_bytes() + b"\0")


def _npz(path: Path) -> None:
    with open(path, "wb") as f:
        np.savez(f, x=np.ones((4, 8), np.float32))


F4 = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }"
#: (name, writer, message after "<path>: "); None writer: /dev/null itself.
BAD_INPUTS = [
    ("empty", _raw(b""), "not a .npy file (it is empty)"),
    ("devnull", None, None),
    ("big_endian", _save(np.ones((4, 8), ">f4")),
     "big-endian data ('>f4') is not supported; save a little-endian array "
     "(a.astype(a.dtype.newbyteorder('<')))"),
    ("string", _save(np.array(["ab", "c"])),
     "unsupported dtype '<U2' (supported: <f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1)"),
    ("npz", _npz, "not a .npy file (it is a zip, e.g. an .npz: pass each array as its own .npy file)"),
    ("structured", _save(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")])),
     "structured arrays (a list of fields as descr) are not supported; save each field as its own array"),
    ("unterminated", _raw(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), ")),
     "malformed .npy header (no closing '}')"),
    ("overflow", _raw(npy(F4 % "(4611686018427387904, 4611686018427387904)")),
     "shape [4611686018427387904, 4611686018427387904] is too large"),
    ("huge", _raw(npy(F4 % "(4294967296, 4)", b"\0" * 128)),
     "holds 128 data bytes, float32[4294967296, 4] needs 68719476736"),
    ("extra_byte", _extra_byte, "holds 129 data bytes, float32[4, 8] needs 128"),
]


def bad_input(tmp_path: Path, name: str, write) -> tuple[str, str]:
    """(path, the expected message) of one bad input."""
    if write is None:
        return "/dev/null", "cannot read '/dev/null': not a regular file"
    path = tmp_path / f"{name}.npy"
    write(path)
    message = dict((n, m) for n, _, m in BAD_INPUTS)[name]
    return str(path), f"{path}: {message}"


@pytest.fixture()
def aotpack_run(capsys, monkeypatch):
    """`aotpack run ARGS...` in this process (its signal handlers left out): returns
    (exit status, stdout, stderr)."""
    monkeypatch.setattr(cli, "_stop_on_terminate", lambda: None)

    def run(*args) -> tuple[int, str, str]:
        capsys.readouterr()
        status = cli.main(["run", *map(str, args)])
        out = capsys.readouterr()
        return status, out.out, out.err

    return run


def native_run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(require(RUN)), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name,write", [(n, w) for n, w, _ in BAD_INPUTS], ids=[n for n, _, _ in BAD_INPUTS])
def test_bad_input_is_one_line_from_both_front_ends(fixture, tmp_path, aotpack_run, name, write):
    path, message = bad_input(tmp_path, name, write)
    assert aotpack_run(fixture["archive"], "--inputs", path) == (1, "", f"aotpack: error: {message}\n")
    result = native_run(fixture["archive"], path)
    assert (result.returncode, result.stderr) == (1, f"aotpack-run: error: {message}\n")


def test_huge_shape_is_refused_before_allocating(tmp_path):
    """A 64-byte file claiming float32[2**40, 2**20] (4 PiB): refused from its size alone."""
    path = tmp_path / "huge.npy"
    path.write_bytes(npy(F4 % "(1099511627776, 1048576)"))
    with pytest.raises(AotpackError) as error:
        loader.read_npy(path)
    assert str(error.value) == f"{path}: holds 0 data bytes, float32[1099511627776, 1048576] needs 4611686018427387904"


@pytest.mark.parametrize("array", [np.float32(2.5), np.arange(6, dtype=np.int16).reshape(2, 3),
                                   np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
                                   np.array([True, False]), np.zeros((0, 3), np.uint8)],
                         ids=["0-dim", "int16", "fortran", "bool", "empty"])
def test_read_npy_matches_numpy(tmp_path, array):
    path = tmp_path / "a.npy"
    np.save(path, array)
    tensor = loader.read_npy(path)
    assert tensor.shape == array.shape and tensor.is_contiguous()
    np.testing.assert_array_equal(tensor.numpy(), np.load(path))


def test_zero_dim_input_stays_zero_dim_in_both_front_ends(build_model, tmp_path, aotpack_run):
    """scalar_reduce takes x: float32[7, 33] and scale: float32[] (0-dim)."""
    archive = build_model(MODELS / "scalar_reduce.py").archive
    reference, (x, scale) = eager_outputs(MODELS / "scalar_reduce.py")
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "scale.npy", scale.numpy())  # a 0-dim array
    inputs = [tmp_path / "x.npy", tmp_path / "scale.npy"]
    status, _, err = aotpack_run(archive, "--inputs", *inputs, "--output", tmp_path / "python.npz")
    assert status == 0, err
    result = native_run(archive, *inputs, "--output", tmp_path / "native.npz")
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "python.npz") as python, np.load(tmp_path / "native.npz") as native:
        assert len(python.files) == len(native.files) == len(reference)
        for a, b, expected in zip(python.values(), native.values(), reference):
            np.testing.assert_array_equal(a, b)
            torch.testing.assert_close(torch.from_numpy(a), expected, rtol=1e-5, atol=1e-5)


def test_wrong_shape_message_is_aotpack_runs(fixture, tmp_path, aotpack_run):
    path = tmp_path / "x.npy"
    np.save(path, np.ones((8, 4), np.float32))
    message = f"input 0 ('x'): expected float32[4, 8], got float32[8, 4] from {path}"
    assert aotpack_run(fixture["archive"], "--inputs", path) == (1, "", f"aotpack: error: {message}\n")
    assert native_run(fixture["archive"], path).stderr == f"aotpack-run: error: {message}\n"
