"""The portable backend (``aotpack/backends/portable/``) end to end: both samples and every
test model the CPU backend builds, built with ``backend="portable"``, run by the native runtime
(``aotpack.load``) and compared with eager PyTorch (``parity.ATOL``/``RTOL``) and with the CPU
backend's archive of the same model (the portable backend is its numerics reference)."""
from __future__ import annotations

import pytest
import torch

from aotpack.archive.writer import read_manifest, read_members
from aotpack.build import build
from aotpack.config import Settings
from aotpack.runtime import parity
from aotpack.runtime.loader import load
from helpers import MODELS, SAMPLES, assert_native_parity, eager_outputs

#: Test models made to fail the build (data-dependent shapes, a broken forward, no inputs).
NOT_BUILT = {"box_count_branch", "forward_raises", "masked_select", "no_example_inputs", "value_branch"}
MODEL_FILES = sorted(p for p in MODELS.glob("*.py") if p.stem not in NOT_BUILT)
SAMPLE_FILES = [SAMPLES / "mlp.py", SAMPLES / "transformer_block.py"]


@pytest.fixture(scope="module")
def build_portable(cache_dir, tmp_path_factory):
    """build(path) with the portable backend at TopN 1 into a fresh folder; memoised."""
    done = {}

    def _build(path):
        if path not in done:
            settings = Settings.from_env(backend="portable", topn=1, cache_dir=cache_dir)
            done[path] = build(path, tmp_path_factory.mktemp("portable"), settings=settings)
        return done[path]

    return _build


def _native_outputs(archive, inputs) -> list[torch.Tensor]:
    with load(archive) as model:
        return [t.clone() for t in model.run(*[t.clone() for t in inputs])]


@pytest.mark.parametrize("path", SAMPLE_FILES + MODEL_FILES, ids=lambda p: p.stem)
def test_portable_archive_matches_eager_through_the_native_runtime(build_portable, tmp_path, path):
    result = build_portable(path)
    manifest = read_manifest(result.archive)
    assert manifest["backend"] == "portable"
    assert manifest["target_isa"]["features"] == []
    assert_native_parity(result.archive, path, tmp_path)


@pytest.mark.parametrize("path", SAMPLE_FILES + MODEL_FILES, ids=lambda p: p.stem)
def test_portable_and_cpu_archives_agree(build_portable, build_model, path):
    """The CPU backend's vectorised, threaded kernels against the portable reference, both
    run natively on the same inputs."""
    _, inputs = eager_outputs(path)
    portable = _native_outputs(build_portable(path).archive, inputs)
    cpu = _native_outputs(build_model(path, topn=1).archive, inputs)
    check = parity.compare(cpu, portable, atol=parity.ATOL, rtol=parity.RTOL)
    assert check.ok, check.problems


def test_portable_kernels_are_plain_c_with_one_candidate_and_no_templates(build_portable):
    """No OpenMP, intrinsics or vector extensions in any shipped kernel; one candidate per
    kernel; the transformer block's GEMM, bmm and attention steps run as ATen calls (no
    template kernel, no GEMM-step choice)."""
    result = build_portable(SAMPLES / "transformer_block.py")
    manifest = read_manifest(result.archive)
    members = read_members(result.archive)
    sources = {name: data.decode() for name, data in members.items() if name.endswith("/kernel.cpp")}
    assert sources and len(sources) == len(manifest["kernels"])
    for name, text in sources.items():
        for banned in ("#pragma omp", "immintrin", "__m256", "vector_size", "__builtin_ia32"):
            assert banned not in text, f"{name} uses {banned}"
    assert all(k["candidates"] == 1 for k in manifest["kernels"])
    assert manifest["choices"] and all(c["kind"] == "kernel" for c in manifest["choices"])
    assert not [k for k in manifest["kernels"] if k["name"].startswith(("gemm", "conv", "bmm", "attention"))]
