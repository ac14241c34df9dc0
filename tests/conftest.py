"""Shared fixtures: one kernel cache per test session, sample loading, native runs."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_leaves

from aotpack.runtime import parity
from aotpack.build import build
from aotpack.config import Settings
from aotpack.frontend.export import load_model_file
from aotpack.runtime.loader import load

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples"
MODELS = Path(__file__).resolve().parent / "models"

# The test models are all tiny kernels; the tests of tuning need every kernel's TopN, so the
# tiny-kernel and far-behind shortcuts are off here (builds and CLI runs inherit them) except where
# a test turns them on.
os.environ["AOTPACK_TINY_KERNEL_US"] = "0"
os.environ["AOTPACK_FAR_BEHIND_FACTOR"] = "0"


@pytest.fixture(scope="session", autouse=True)
def runtime_cache(tmp_path_factory) -> Path:
    """The native runtime's extraction cache ($XDG_CACHE_HOME/aotpack/runtime) of this
    session, so tests never write to the user's ~/.cache."""
    root = tmp_path_factory.mktemp("xdg-cache")
    os.environ["XDG_CACHE_HOME"] = str(root)
    return root


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


def fixed_timing(us: list[float], rounds: int = 5):
    """A clean ``timing.Timing`` in which candidate ``i`` takes ``us[i]`` every round
    (a stand-in for ``autotune.time_functions`` where a test fixes the winners)."""
    from aotpack.tune import timing

    return timing.Timing(us=[[t] * rounds for t in us], clean=[[True] * rounds for _ in us])


def eager_outputs(path) -> tuple[list[torch.Tensor], tuple]:
    """(eager outputs, example inputs) of a model file, computed on copies."""
    model_file = load_model_file(path)
    module = copy.deepcopy(model_file.module).eval()
    inputs = tuple(t.clone() for t in model_file.example_inputs)
    with torch.no_grad():
        out = module(*[t.clone() for t in inputs])
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)], inputs


def assert_native_parity(archive, path, tmp_path, atol=parity.ATOL, rtol=parity.RTOL) -> float:
    """Run ``archive`` with the native runtime in-process (``aotpack.load``) and compare to
    eager; returns max abs error."""
    reference, inputs = eager_outputs(path)
    with load(archive) as model:
        outputs = model.run(*inputs)
    check = parity.compare(outputs, reference, atol=atol, rtol=rtol)
    assert check.ok, check.problems
    return check.max_abs_error


def compile_tilings(kernel, tilings: list, folder: Path):
    """Render each tiling of a template ``kernel`` into its own static kernel under
    ``folder``, compile them and the wrapper (2 at a time), and return the CPU launcher."""
    from concurrent.futures import ThreadPoolExecutor

    from aotpack import backends

    backend = backends.get("cpu")
    toolchain = backend.toolchain(Settings.from_env())
    jobs = []
    for tiling in tilings:
        source = folder / "static_kernel" / tiling.kernel_key / "kernel.cpp"
        source.parent.mkdir(parents=True)
        source.write_text(backend.render_kernel(kernel, tiling))
        jobs.append((toolchain.compile_kernel, source, source.with_name("kernel.so")))
    (folder / "wrapper.cpp").write_text(backend.render_wrapper(tilings))
    jobs.append((toolchain.compile_wrapper, folder / "wrapper.cpp", folder / "wrapper.so"))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda job: job[0](job[1], job[2]), jobs))
    return backend.load_wrapper(folder / "wrapper.so", folder, kernel.name)


def pytest_collection_modifyitems(items):
    """Modules without their own ``pytestmark`` need the compiler and runtime: ``native``."""
    for item in items:
        if not any(m.name in ("unit", "native") for m in item.iter_markers()):
            item.add_marker(pytest.mark.native)
