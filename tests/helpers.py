"""Helpers shared by the tests: repository paths, eager references, native parity, template
compilation, the native runtime's tools and its private environments, signed copies.

Tests import these with ``from helpers import ...`` (``tests/`` is on ``sys.path`` through the
root ``conftest.py``); fixtures stay in ``conftest.py``."""
from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_leaves

from aotpack import backends
from aotpack.archive import writer
from aotpack.config import Settings
from aotpack.frontend.export import decomposition_table, load_model_file
from aotpack.lower.lowering import lower
from aotpack.runtime import parity
from aotpack.runtime.loader import load

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples"
MODELS = REPO / "tests" / "models"
BUILD = REPO / "native" / "build"
RUN = BUILD / "aotpack-run"
UNIT_TESTS = BUILD / "aotpack_runtime_test"
LIBRARY = BUILD / "libaotpack_runtime.so"
BUILD_HINT = (
    "run the native build first:\n"
    "  cmake -S native -B native/build -DCMAKE_BUILD_TYPE=Release "
    "-DCMAKE_PREFIX_PATH=$(.venv/bin/python -c 'import torch;print(torch.utils.cmake_prefix_path)')\n"
    "  cmake --build native/build -j2"
)


#: What each template epilogue computes, as eager does it (y: the template's result, r: the
#: residual), by the names of ``aotpack.ir.epilogues``.
EAGER_EPILOGUES = {
    "none": lambda y, r: y,
    "relu": lambda y, r: torch.nn.functional.relu(y),
    "gelu": lambda y, r: torch.nn.functional.gelu(y),
    "tanh": lambda y, r: torch.tanh(y),
    "sigmoid": lambda y, r: torch.sigmoid(y),
    "swish": lambda y, r: torch.nn.functional.silu(y),
    "hardswish": lambda y, r: torch.nn.functional.hardswish(y),
    "hardsigmoid": lambda y, r: torch.nn.functional.hardsigmoid(y),
    "add": lambda y, r: y + r,
    "add_relu": lambda y, r: torch.nn.functional.relu(y + r),
}


def _load_fixture_module():
    path = REPO / "tests" / "native_fixture" / "make_fixture.py"
    spec = importlib.util.spec_from_file_location("aotpack_native_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fx = _load_fixture_module()


def require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path} is missing; {BUILD_HINT}")
    return path


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


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def lower_function(fn, *inputs):
    ep = torch.export.export(_Fn(fn), inputs, strict=False).run_decompositions(decomposition_table())
    return lower(ep, backends.get("cpu"))


def run_native(env: dict, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """``aotpack-run ARGS`` with environment ``env``; stdout and stderr captured as text."""
    return subprocess.run([str(require(RUN)), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def cache_root(env: dict) -> Path:
    """The runtime's extraction cache under ``env``'s XDG_CACHE_HOME."""
    return Path(env["XDG_CACHE_HOME"]) / "aotpack" / "runtime"


def cache_entries(env: dict) -> list[str]:
    """Names of the published cache entries (sorted; the tmp folder left out)."""
    root = cache_root(env)
    return sorted(p.name for p in root.iterdir() if p.name != "tmp") if root.exists() else []


def leftovers(env: dict) -> list[str]:
    """Everything in ``env``'s TMPDIR and the cache's tmp folder: empty after a clean exit."""
    tmp = cache_root(env) / "tmp"
    return sorted(os.listdir(env["TMPDIR"])) + (sorted(os.listdir(tmp)) if tmp.exists() else [])


def signed_copy(archive: Path, private_key: Path, folder: Path) -> Path:
    """A copy of ``archive`` in ``folder`` signed with ``private_key`` (the original untouched)."""
    path = folder / f"signed-{archive.name}"
    path.write_bytes(archive.read_bytes())
    writer.sign_archive(path, private_key)
    return path
