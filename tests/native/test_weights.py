"""Each weight stored once (aotpack.archive.weights, manifest ``weight_aliases``), unread constants
dropped, tensor entries in their own low-level zstd frame, and both readers refusing bad
aliases with the same one-line message."""
from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
import zstandard

from aotpack.archive import layout
from aotpack.archive import manifest_rules
from aotpack.archive import writer as package
from aotpack.runtime import parity
from aotpack.archive import reader
from aotpack.errors import AotpackError
from aotpack.frontend.export import load_model_file
from aotpack.runtime.loader import load
from helpers import MODELS, eager_outputs


TIED = MODELS / "tied_weights.py"
EMBED = "decoder.embed_tokens.weight"  # the name forward reads the tied embedding by
VOCAB, DIM = 512, 64


@pytest.fixture(scope="module")
def tied(build_model):
    return build_model(TIED).archive


def _weights(archive) -> tuple[bytes, dict]:
    data = reader.read_all(archive)[layout.WEIGHTS_PATH]
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    header.pop("__metadata__", None)
    return data, header


def test_tied_weight_is_stored_once_and_every_name_resolves(tied):
    manifest = reader.read_manifest(tied)
    data, header = _weights(tied)
    # the embedding (under 3 parameter names and a plain tensor attribute) once; the two
    # all-ones LayerNorm weights and all-zeros biases once each
    assert sorted(header) == [EMBED, "norm1.bias", "norm1.weight"]
    assert len(data) - 8 - int.from_bytes(data[:8], "little") == (VOCAB * DIM + 2 * DIM) * 4
    assert manifest["weight_aliases"] == {
        "embed.weight": EMBED, "lm_head.weight": EMBED, "table": EMBED,
        "norm2.bias": "norm1.bias", "norm2.weight": "norm1.weight"}
    assert [c["name"] for c in manifest["constants"]] == [
        EMBED, "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "table"]
    # model.so, model.cpp, kernels.ir, weights, 5 per kernel: 2 fused (LayerNorms), + the GEMM
    # template's when it won lm_head (its panels then packed at load from the embedding)
    assert len(manifest["kernels"]) == 2 + ([c for c in manifest["choices"] if c["kind"] != "kernel"][0]["winner"] == "template")
    assert len(manifest["files"]) == 4 + 5 * len(manifest["kernels"])
    stored = safetensors.torch.load(data)
    embedding = load_model_file(TIED).module.embed.weight.detach()
    for name in ("embed.weight", "lm_head.weight", EMBED):
        assert torch.equal(stored[manifest_rules.stored_name(manifest, name)], embedding), name


def test_unread_constant_is_not_in_the_archive(tied):
    manifest = reader.read_manifest(tied)
    _, header = _weights(tied)
    assert "unused_table" not in header
    assert "unused_table" not in manifest["weight_aliases"]
    assert "unused_table" not in [c["name"] for c in manifest["constants"]]


def test_tied_outputs_match_eager_through_the_runtime(tied):
    reference, inputs = eager_outputs(TIED)
    with load(tied) as model:
        outputs = model.run(*inputs)
    check = parity.compare(outputs, reference, atol=1e-5, rtol=0)
    assert check.ok, check.problems


def test_tensor_entries_get_their_own_low_level_frame(tied):
    raw = tied.read_bytes()
    frames, at = [], 0
    while at < len(raw):
        size = zstandard.frame_content_size(raw[at:])
        length = _frame_length(raw[at:])
        frames.append((size, length))
        at += length
    assert len(frames) == 2  # manifest, kernels and model at ZSTD_LEVEL; the weights at level 1
    members = reader.read_all(tied)
    assert frames[1][0] >= len(members[layout.WEIGHTS_PATH])
    assert package.entry_level(layout.WEIGHTS_PATH) == package.TENSOR_ZSTD_LEVEL == 1
    assert package.entry_level(layout.MODEL_LIBRARY_PATH) == package.ZSTD_LEVEL


def _frame_length(data: bytes) -> int:
    """Compressed length of the first zstd frame of ``data``."""
    dobj = zstandard.ZstdDecompressor().decompressobj()
    dobj.decompress(data)
    return len(data) - len(dobj.unused_data)


def _rewritten(archive, tmp_path, edit) -> object:
    """``archive`` with its manifest edited by ``edit`` (file table and digest recomputed)."""
    members = reader.read_all(archive)
    manifest = json.loads(members[layout.MANIFEST_PATH])
    files = {p: d for p, d in members.items() if p not in manifest_rules.RESERVED}
    manifest.pop("files")
    edit(manifest)
    return package.write_archive(tmp_path / "bad.aotpack", manifest, files)


BAD_ALIASES = [
    ({"lm_head.weight": "ghost"},
     "weight alias 'lm_head.weight' -> 'ghost': no such tensor in weights/weights.safetensors"),
    ({"a": "b", "b": "a"}, "manifest.json: weight_aliases: the aliases form a cycle: 'a' -> 'b' -> 'a'"),
    ({"table": "table"}, "manifest.json: weight_aliases: the aliases form a cycle: 'table' -> 'table'"),
    ({"x": "table", "table": EMBED},
     "manifest.json: weight_aliases[\"x\"]: 'table' is itself an alias; an alias must name a tensor "
     "stored in weights/weights.safetensors"),
    ({"norm2.bias": "norm1.weight", "norm1.bias": "norm1.weight"},
     "weight alias 'norm1.bias' is also a tensor in weights/weights.safetensors; a name is either "
     "stored or an alias"),
    ({"table": "norm1.weight"},
     "constant 'table' (stored as 'norm1.weight'): manifest.json says float32[512, 64], "
     "weights/weights.safetensors holds float32[64]"),
]


def _refused_by_both_readers(bad, message: str) -> None:
    """The Python reader and the native runtime both refuse ``bad`` with ``message``."""
    with pytest.raises(AotpackError) as python:
        reader.check(bad)
    assert str(python.value) == f"{bad}: {message}"
    with pytest.raises(AotpackError) as native:
        load(bad)
    assert str(native.value) == f"cannot load '{bad}': {message}"


@pytest.mark.parametrize("aliases, message", BAD_ALIASES,
                         ids=["missing", "cycle", "self", "chain", "stored", "shape"])
def test_bad_alias_is_refused_by_both_readers(tied, tmp_path, aliases, message):
    bad = _rewritten(tied, tmp_path, lambda m: m["weight_aliases"].update(aliases))
    _refused_by_both_readers(bad, message)


def test_mutated_buffer_cannot_be_aliased(tied, tmp_path):
    def edit(manifest):
        manifest["mutated_buffers"] = ["norm2.weight"]
    bad = _rewritten(tied, tmp_path, edit)
    _refused_by_both_readers(bad, "mutated buffer 'norm2.weight' shares its weights with another name "
                                  "(weight_aliases); a buffer the model writes must be stored on its own")


def test_native_checks_cost_one_load_and_one_run(cache_dir, tmp_path, monkeypatch):
    from aotpack.runtime import loader
    from aotpack.commands import verify
    from aotpack.build import build
    from aotpack.config import Settings

    counts = {"load": 0, "run": 0}
    real_init, real_run = loader.Model.__init__, loader.Model.run

    def counted_init(self, *args, **kwargs):
        counts["load"] += 1
        real_init(self, *args, **kwargs)

    def counted_run(self, *args):
        counts["run"] += 1
        return real_run(self, *args)

    monkeypatch.setattr(loader.Model, "__init__", counted_init)
    monkeypatch.setattr(loader.Model, "run", counted_run)
    result = build(TIED, tmp_path, settings=Settings.from_env(cache_dir=cache_dir), selftest=True)
    assert counts == {"load": 1, "run": 1}  # the build's native check
    counts.update(load=0, run=0)
    lines = verify.verify(result.archive, run=True, trusted_keys=[])
    assert lines[2].startswith("load: ok: tied_weights 0.1.0 (loaded in ")
    assert lines[3].startswith("self-test: 1 outputs match eager PyTorch")
    assert counts == {"load": 1, "run": 1}  # verify --run: the load line and the self-test share one load
