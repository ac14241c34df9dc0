"""weights/weights.safetensors is a standard safetensors file whose tensors start at
``layout.WEIGHTS_ALIGNMENT`` bytes (so the runtime maps them without a copy) wherever
their size allows it (aotpack.archive.weights.aligned_safetensors)."""
from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

from aotpack.archive import layout
from aotpack.archive.weights import aligned_safetensors


ALIGN = layout.WEIGHTS_ALIGNMENT


def _tensors() -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        "bias": torch.randn(10, generator=generator),  # 40 bytes: cannot keep the next aligned
        "conv.weight": torch.randn(16, 3, 3, 3, generator=generator),  # 1728 bytes = 27 x 64
        "embed": torch.randn(7, 33, generator=generator).to(torch.bfloat16),  # 462 bytes
        "fc.weight": torch.randn(64, 48, generator=generator),  # 12288 bytes
        "mask": torch.rand(5, 3, generator=generator) > 0.5,  # bool, 15 bytes
        "positions": torch.arange(16, dtype=torch.int64),  # 128 bytes
        "scale": torch.tensor(0.5),  # 0-d
        "empty": torch.empty(0, 4),
    }


def _header(blob: bytes) -> tuple[int, dict]:
    length = int.from_bytes(blob[:8], "little")
    return 8 + length, json.loads(blob[8:8 + length])


def test_the_safetensors_library_reads_every_tensor_back_exactly():
    tensors = _tensors()
    loaded = safetensors.torch.load(aligned_safetensors(tensors))
    assert list(sorted(loaded)) == sorted(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape, name
        assert torch.equal(loaded[name], tensor), name


def test_tensors_of_whole_cache_lines_start_aligned_with_no_holes():
    tensors = _tensors()
    data_start, header = _header(aligned_safetensors(tensors))
    assert data_start % ALIGN == 0
    spans = sorted(tuple(entry["data_offsets"]) for entry in header.values())
    assert spans[0][0] == 0
    assert all(end == next_begin for (_, end), (next_begin, _) in zip(spans, spans[1:]))
    whole = {"conv.weight", "fc.weight", "positions", "empty"}
    for name in whole:
        assert (data_start + header[name]["data_offsets"][0]) % ALIGN == 0, name
    # whole cache lines first, in the given order; then the rest, in the given order
    order = [name for name, _ in sorted(header.items(), key=lambda item: item[1]["data_offsets"])]
    assert order == ["conv.weight", "fc.weight", "positions", "empty",
                     "bias", "embed", "mask", "scale"]


def test_dtype_names_are_the_safetensors_librarys_own():
    _, header = _header(aligned_safetensors(_tensors()))
    _, reference = _header(safetensors.torch.save(_tensors()))
    for name, entry in header.items():
        assert entry["dtype"] == reference[name]["dtype"], name
        assert entry["shape"] == reference[name]["shape"], name


def test_no_tensors_is_an_empty_but_valid_file():
    blob = aligned_safetensors({})
    assert safetensors.torch.load(blob) == {}
    assert _header(blob)[0] % ALIGN == 0


def test_a_dtype_safetensors_cannot_store_is_a_clear_error():
    with pytest.raises(ValueError) as raised:
        aligned_safetensors({"x": torch.empty(2, dtype=torch.complex32)})
    assert str(raised.value) == (
        "a constant of dtype torch.complex32 cannot be stored in safetensors; cast it in the "
        "model to a dtype safetensors stores (float32, float16, bfloat16, integers, bool)")
