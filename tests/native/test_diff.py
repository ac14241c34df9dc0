"""`aotpack diff A B` (issue 8, item 6): fields and exit codes (0 same, 1 different, 2 trouble)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import safetensors.torch

from aotpack.tune import autotune
from aotpack.tune import choice_cache
from aotpack.archive import layout
from aotpack.build import build
from aotpack.config import Settings
from aotpack.archive.layout import WEIGHTS_PATH as WEIGHTS
from aotpack.archive.writer import read_manifest, read_members, write_archive
from helpers import SAMPLES, fixed_timing



def aotpack_diff(*args):
    return subprocess.run([sys.executable, "-m", "aotpack", "diff", *map(str, args)],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory, cache_dir):
    """topn 3 (kernels are timed); GEMM steps made to pick ATen, so the archive holds both
    fused kernels (the GELU epilogue and the LayerNorm) whatever the machine's timings."""
    def aten_first(functions, device=None):
        return fixed_timing([1.0 + i for i in range(len(functions))])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotune, "time_functions", aten_first)
        patch.setattr(choice_cache, "read_all", lambda *args: {})  # the fake timings stay out of the cache
        patch.setattr(choice_cache, "write_all", lambda *args: None)
        return build(SAMPLES / "mlp.py", tmp_path_factory.mktemp("diff"),
                     settings=Settings.from_env(topn=3, cache_dir=cache_dir)).archive


def rewrite(archive, target, edit_manifest=None, edit_files=None):
    """A copy of ``archive`` with consistent checksums after the given edits."""
    files = read_members(archive)
    for entry in (layout.MANIFEST_PATH, layout.MANIFEST_DIGEST_PATH, layout.MANIFEST_SIGNATURE_PATH):
        files.pop(entry, None)
    manifest = read_manifest(archive)
    del manifest["files"]
    if edit_manifest:
        edit_manifest(manifest)
    if edit_files:
        edit_files(files)
    return write_archive(target, manifest, files)


def test_an_archive_equals_itself_and_its_copy(mlp, tmp_path):
    copy_ = rewrite(mlp, tmp_path / "copy.aotpack")
    result = aotpack_diff(mlp, copy_)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"same: {mlp} vs {copy_}"
    assert lines[-1].startswith("size archive: ")
    data = json.loads(aotpack_diff(mlp, copy_, "--json").stdout)
    assert data["same"] is True
    assert data["metadata"] == data["signature"] == {}
    assert data["kernels"] == {"added": [], "removed": [], "changed": []}
    assert data["weights"] == data["files"] == {"added": [], "removed": [], "changed": []}
    timed = [k for k in read_manifest(mlp)["kernels"] if k["timings_us"]]
    assert timed and [t["delta_us"] for t in data["timings"]] == [0.0] * len(timed)


def test_differences_are_named(mlp, tmp_path):
    manifest = read_manifest(mlp)
    kernels = sorted(manifest["kernels"], key=lambda k: not k["timings_us"])  # a timed one first
    first, second = kernels[0]["name"], kernels[1]["name"]

    def edit_manifest(m):
        m["version"] = "0.2.0"
        m["inputs"][0]["name"] = "features"
        by_name = {k["name"]: k for k in m["kernels"]}
        k = by_name[first]
        k["tiling_repr"], k["block_dim"], k["timings_us"] = "other", k["block_dim"] + 1, [1.0]
        m["kernels"] = [k, dict(by_name[second], name="fused_new_9")]
        m["constants"] = [c for c in m["constants"] if c["name"] != "norm.bias"]  # dropped below

    def edit_files(files):
        weights = safetensors.torch.load(files[WEIGHTS])
        weights["fc1.bias"] = weights["fc1.bias"] + 1
        del weights["norm.bias"]
        files[WEIGHTS] = safetensors.torch.save(weights)

    other = rewrite(mlp, tmp_path / "other.aotpack", edit_manifest, edit_files)
    result = aotpack_diff(mlp, other, "--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["same"] is False
    assert data["metadata"] == {"version": ["0.1.0", "0.2.0"]}
    assert data["signature"]["inputs"]["b"] == [{"name": "features", "dtype": "float32",
                                                  "shape": [32, 512], "strides": [512, 1]}]
    assert "outputs" not in data["signature"]
    assert data["kernels"]["added"] == ["fused_new_9"] and data["kernels"]["removed"] == [second]
    old = kernels[0]
    assert data["kernels"]["changed"] == [{"name": first, "tiling_repr": [old["tiling_repr"], "other"],
                                           "block_dim": [old["block_dim"], old["block_dim"] + 1]}]
    assert data["weights"] == {"added": [], "removed": ["norm.bias"], "changed": ["fc1.bias"]}
    assert data["files"]["changed"] == [WEIGHTS]
    [timing] = data["timings"]
    assert timing["name"] == first and timing["b_us"] == 1.0
    assert timing["delta_us"] == round(1.0 - min(old["timings_us"]), 3)
    text = aotpack_diff(mlp, other).stdout.splitlines()
    assert text[0] == f"different: {mlp} vs {other}"
    assert "metadata version: '0.1.0' -> '0.2.0'" in text
    assert "signature inputs: (x: float32[32, 512]) -> (features: float32[32, 512])" in text
    assert f"kernels removed: {second}" in text and "kernels added: fused_new_9" in text
    assert (f"winner {first}: tiling_repr {old['tiling_repr']!r} -> 'other', block_dim "
            f"{old['block_dim']} -> {old['block_dim'] + 1}") in text
    assert "weights removed: norm.bias" in text and "weights changed: fc1.bias" in text


def test_timings_alone_do_not_make_archives_different(mlp, tmp_path):
    def slower(m):
        for k in m["kernels"]:
            k["timings_us"] = [t * 2 for t in k["timings_us"]]

    other = rewrite(mlp, tmp_path / "slower.aotpack", slower)
    result = aotpack_diff(mlp, other, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["same"] is True and all(t["delta_pct"] == 100.0 for t in data["timings"])


def test_trouble_exits_2(mlp, tmp_path):
    result = aotpack_diff(mlp, tmp_path / "missing.aotpack")
    assert result.returncode == 2
    assert result.stderr == f"aotpack: error: cannot read {tmp_path / 'missing.aotpack'}: No such file or directory\n"
    junk = tmp_path / "junk.aotpack"
    junk.write_bytes(b"not an archive")
    result = aotpack_diff(junk, mlp)
    assert result.returncode == 2 and result.stderr.startswith(f"aotpack: error: {junk}")
