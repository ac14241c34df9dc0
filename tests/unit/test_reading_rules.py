"""The Python reader's side of the rules both readers share (docs/archive.md, "Reading
rules"), without the runtime: safetensors tiling against what aotpack's own writer makes,
path bounds, limit variables. tests/native/test_hostile_corpus.py checks the runtime says the same."""
from __future__ import annotations

import io
import json

import pytest
import torch

from aotpack import env
from aotpack.archive import file_checks
from aotpack.archive import layout
from aotpack.archive import manifest_rules
from aotpack.archive import reader
from aotpack.errors import AotpackError
from aotpack.archive.weights import aligned_safetensors



def _st(header: dict, data: bytes) -> io.BytesIO:
    text = json.dumps(header).encode()
    return io.BytesIO(len(text).to_bytes(8, "little") + text + data)


def _u8(begin: int, end: int) -> dict:
    return {"dtype": "U8", "shape": [end - begin], "data_offsets": [begin, end]}


def test_files_the_writer_aligns_tile_their_data():
    tensors = {"w": torch.randn(16, 16), "bias": torch.randn(3), "ids": torch.arange(5), "empty": torch.empty(0),
               "mask": torch.ones(7, dtype=torch.bool), "half": torch.randn(33).half()}
    views = file_checks.read_safetensors(io.BytesIO(aligned_safetensors(tensors)), "w.safetensors")
    assert views == {name: (str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in tensors.items()}


@pytest.mark.parametrize("header, size, message", [
    ({"a": _u8(0, 8), "b": _u8(4, 12)}, 12, "tensors 'a' and 'b' overlap: data_offsets [0, 8] and [4, 12]"),
    ({"b": _u8(0, 8), "a": _u8(0, 8)}, 8, "tensors 'a' and 'b' overlap: data_offsets [0, 8] and [0, 8]"),
    ({"a": _u8(0, 4), "b": _u8(8, 12)}, 12, "4 bytes at data offset 4 belong to no tensor "
                                            "(data_offsets must cover the data back to back)"),
    ({"a": _u8(0, 4)}, 6, "2 bytes at data offset 4 belong to no tensor (data_offsets must cover the data "
                          "back to back)"),
    ({}, 3, "3 bytes at data offset 0 belong to no tensor (data_offsets must cover the data back to back)"),
    ({"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}}, 4, "tensor 'a' data_offsets end before they begin"),
    ({"z": _u8(0, 4), "a": {"dtype": "X", "shape": [], "data_offsets": [0, 0]}}, 4,
     "unsupported safetensors dtype 'X' (expected one of F32, F64, F16, BF16, I64, I32, I16, I8, U8, BOOL)"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4, "tensor 'a' holds 4 bytes, float32[2] needs 8"),
])
def test_safetensors_ranges_must_cover_the_data_back_to_back(header, size, message):
    with pytest.raises(AotpackError) as err:
        file_checks.read_safetensors(_st(header, bytes(size)), "t.safetensors")
    assert str(err.value) == f"t.safetensors: {message}"


def test_zero_size_tensors_may_share_an_offset():
    header = {"a": _u8(0, 4), "e1": _u8(4, 4), "e0": _u8(0, 0), "b": _u8(4, 6)}
    assert file_checks.read_safetensors(_st(header, bytes(6)), "t") == {
        "a": ("uint8", [4]), "b": ("uint8", [2]), "e0": ("uint8", [0]), "e1": ("uint8", [0])}


@pytest.mark.parametrize("path, message", [
    ("a/" * 31 + "b", None),
    ("a/" * 32 + "b", f"entry '{'a/' * 32}b' has more than 32 components"),
    ("x" * 200 + "/" + "y" * 255, None),
    ("y" * 256, f"entry '{'y' * 256}' has a component longer than 255 bytes"),
    ("/".join(["z" * 255] * 3 + ["z" * 254]) + "/w", None),  # 1024 bytes
    ("/".join(["z" * 255] * 3 + ["z" * 254]) + "/ww", "entry with a path longer than 1024 bytes"),
    ("kernels/.aotpack-complete", "entry 'kernels/.aotpack-complete' has a component starting with '.'"),
    ("a/../b", "entry 'a/../b' has a '..' component"),
])
def test_entry_paths_are_bounded(path, message):
    if message is None:
        manifest_rules.check_entry_path(path)
        return
    with pytest.raises(AotpackError) as err:
        manifest_rules.check_entry_path(path)
    assert str(err.value) == message


def test_a_file_cannot_also_be_a_folder():
    manifest_rules.check_no_file_is_a_folder(["a/b", "a/c", "ab"])
    with pytest.raises(AotpackError) as err:
        manifest_rules.check_no_file_is_a_folder(["z/y/x", "z", "m/n", "m"])
    assert str(err.value) == "manifest.json: files[\"m/n\"]: 'm' is a file, so it cannot be a folder"


@pytest.mark.parametrize("raw, value", [("1", 1), ("007", 7), ("9223372036854775807", layout.LIMIT_VALUE_MAX),
                                        ("0" * 5000 + "5", 5)])
def test_limit_values(raw, value):
    assert env.parse_limit("AOTPACK_MAX_ENTRIES", raw) == value


@pytest.mark.parametrize("raw", ["0", "9223372036854775808", "1" * 5000, "+1", " 1", "1\n", "\u0661", ""])
def test_limit_values_refused(raw):
    with pytest.raises(AotpackError) as err:
        env.parse_limit("AOTPACK_MAX_TOTAL_BYTES", raw)
    assert str(err.value) == f"AOTPACK_MAX_TOTAL_BYTES must be an integer from 1 to 9223372036854775807, got '{raw}'"


def test_real_archive_paths_are_far_below_the_bounds():
    longest = layout.lib_kernel_source_path("fused_" + "x" * 48 + "_123", "0" * 32)
    assert len(longest) < layout.MAX_PATH_BYTES // 8
    assert longest.count("/") + 1 <= layout.MAX_PATH_COMPONENTS // 6
