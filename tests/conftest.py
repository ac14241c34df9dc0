"""Shared fixtures: one kernel cache per test session, sample loading, native runs."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from aotpack.build import build
from aotpack.config import Settings
from aotpack.export import load_model_file
from aotpack.runtime import run_tensors

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples"
MODELS = Path(__file__).resolve().parent / "models"
#: float32 parity bound against eager PyTorch (issue #2).
TOLERANCE = 1e-4


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernel-cache")


@pytest.fixture(scope="session")
def build_model(cache_dir, tmp_path_factory):
    """build(path, topn=..., **kw) into a fresh folder with the session cache; memoised."""
    done = {}

    def _build(path, topn=1, **kwargs):
        key = (str(path), topn, tuple(sorted(kwargs.items())))
        if key not in done:
            out = tmp_path_factory.mktemp("dist")
            settings = Settings.from_env(topn=topn, cache_dir=cache_dir)
            done[key] = build(path, out, settings=settings, **kwargs)
        return done[key]

    return _build


def eager_outputs(path) -> tuple[list[torch.Tensor], tuple]:
    """(eager outputs, example inputs) of a model file, computed on copies."""
    model_file = load_model_file(path)
    module = copy.deepcopy(model_file.module).eval()
    inputs = tuple(t.clone() for t in model_file.example_inputs)
    with torch.no_grad():
        out = module(*[t.clone() for t in inputs])
    return ([out] if isinstance(out, torch.Tensor) else list(out)), inputs


def assert_native_parity(archive, path, tmp_path, tolerance=TOLERANCE) -> float:
    """Run ``archive`` with the C++ runtime and compare to eager; returns max abs error."""
    reference, inputs = eager_outputs(path)
    outputs, _ = run_tensors(archive, inputs, tmp_path)
    assert len(outputs) == len(reference)
    worst = 0.0
    for ours, ref in zip(outputs, reference):
        assert ours.shape == ref.shape and ours.dtype == ref.dtype
        if ref.dtype.is_floating_point:
            error = (ours.double() - ref.double()).abs().max().item() if ref.numel() else 0.0
            assert error <= tolerance, f"max abs error {error} > {tolerance}"
            worst = max(worst, error)
        else:
            assert torch.equal(ours, ref)
    return worst
