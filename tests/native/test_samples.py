"""Issue #2 end to end: both samples, built with TopN 1 and 3, run by the C++ runtime."""
import hashlib
import re

import pytest

from aotpack.archive import layout
from aotpack.archive.writer import read_manifest, read_members
from aotpack.backends.base import kernel_key
from helpers import SAMPLES, assert_native_parity

SAMPLE_FILES = ["mlp.py", "transformer_block.py"]


@pytest.mark.parametrize("topn", [1, 3])
@pytest.mark.parametrize("sample", SAMPLE_FILES)
def test_sample_matches_eager_through_native_runtime(build_model, tmp_path, sample, topn):
    result = build_model(SAMPLES / sample, topn=topn)
    assert result.archive.name == f"{sample[:-3]}-0.1.0.aotpack"
    assert_native_parity(result.archive, SAMPLES / sample, tmp_path)


@pytest.mark.parametrize("sample", SAMPLE_FILES)
def test_topn3_compiles_and_times_several_candidates(build_model, sample):
    manifest = read_manifest(build_model(SAMPLES / sample, topn=3).archive)
    tuned = [k for k in manifest["kernels"] if k["candidates"] > 1]
    assert tuned, "no kernel had more than one candidate"
    for k in tuned:
        assert len(k["timings_us"]) == k["candidates"] <= 3
        assert all(t > 0 for t in k["timings_us"])
        assert k["visited"]
        # the winner is the fastest timed candidate, or one the decision rule prefers to it
        # (fewer threads, then first in the solver's order: aotpack.tune.timing.decide)
        def preference(i):
            return int(re.search(r"block_dim=(\d+)", k["candidate_tilings"][i]).group(1)), i
        fastest = k["timings_us"].index(min(k["timings_us"]))
        best = k["candidate_tilings"].index(k["tiling_repr"])
        assert best == fastest or preference(best) < preference(fastest)
        assert isinstance(k["timing_contended"], bool)


@pytest.mark.parametrize("topn", [1, 3])
@pytest.mark.parametrize("sample", SAMPLE_FILES)
def test_archive_ships_exactly_the_winners(build_model, sample, topn):
    archive = build_model(SAMPLES / sample, topn=topn).archive
    manifest = read_manifest(archive)
    members = read_members(archive)
    kernel_sos = sorted(p for p in members if p.endswith("/kernel.so"))
    assert kernel_sos == sorted(k["lib_kernel"] for k in manifest["kernels"])
    source = members[layout.MODEL_SOURCE_PATH].decode()
    for k in manifest["kernels"]:
        # kernel_key follows the md5 rule and names the shipped static kernel
        rule = hashlib.md5(f"{k['tiling_repr']}|{k['workspace']}|{k['block_dim']}".encode()).hexdigest()
        assert k["kernel_key"] == rule == kernel_key(k["tiling_repr"], k["workspace"], k["block_dim"])
        assert k["lib_kernel"] == layout.lib_kernel_path(k["name"], k["kernel_key"])
        # optimize_tiling holds tiling_repr|workspace|block_dim of the winner
        optimize = members[layout.optimize_tiling_path(k["name"])].decode().strip()
        assert optimize == f"{k['tiling_repr']}|{k['workspace']}|{k['block_dim']}"
        # the C++ bakes the same lib_kernel and kernel_key in as literals
        literal = re.search(rf'\{{"{k["name"]}", "[^"]*", "[^"]*", "([^"]*)", "([0-9a-f]{{32}})"\}}', source)
        assert literal and literal.groups() == (k["lib_kernel"], k["kernel_key"])
    assert "ATen/ATen.h" not in source and "#include <ATen" not in source
    # every file is listed with its sha256 and size
    assert set(manifest["files"]) == set(members) - {layout.MANIFEST_PATH, layout.MANIFEST_DIGEST_PATH}
    for path, entry in manifest["files"].items():
        assert entry == {"sha256": hashlib.sha256(members[path]).hexdigest(), "size": len(members[path])}


def test_topn1_profiles_nothing(build_model):
    manifest = read_manifest(build_model(SAMPLES / "mlp.py", topn=1).archive)
    assert manifest["kernels"]
    assert all(k["candidates"] == 1 and k["timings_us"] == [] for k in manifest["kernels"])
