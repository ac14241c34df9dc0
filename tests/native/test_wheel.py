"""``pip install .`` without the Makefile (issue 8, item 8): the wheel carries the native
runtime, built by setup.py's CMake step, and an installed copy loads and runs an archive
with no source checkout on its path."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import SAMPLES, eager_outputs


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel of this checkout, installed with ``--target`` into a fresh folder.

    The build uses this venv's torch (``--no-build-isolation``: the isolated build would
    install the pinned torch again, minutes for the same files). torch is linked in next to
    the package as a site-packages would hold it, so ``$ORIGIN/../../torch/lib`` resolves.
    """
    work = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                    "-w", str(work / "dist"), str(ROOT)], check=True, env=env, cwd=work)
    (wheel,) = (work / "dist").glob("aotpack-*.whl")
    target = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, env=env, cwd=work)
    (target / "torch").symlink_to(Path(torch.__file__).parent)
    return target


def test_wheel_is_platform_specific_and_holds_the_runtime(installed):
    (wheel,) = (installed.parent / "dist").glob("aotpack-*.whl")
    assert not wheel.name.endswith("-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"aotpack/bin/aotpack-run", "aotpack/lib/libaotpack_runtime.so.0",
            "aotpack/backends/cpu/templates/model.cpp.j2", "aotpack/include/kernel_abi.h"} <= names
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    assert f"aotpack/lib/_aotpack_binding{suffix}" in names
    httplib = subprocess.run(["pkg-config", "--exists", "cpp-httplib"]).returncode == 0
    assert ("aotpack/bin/aotpack-serve" in names) == httplib  # built where cpp-httplib is


def test_installed_copy_builds_and_runs_without_the_checkout(installed, tmp_path, cache_dir):
    """Build with the installed package, then run through its aotpack-run and aotpack.load."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOTPACK_RUNTIME")}
    env.update(PYTHONPATH=str(installed), AOTPACK_CACHE_DIR=str(cache_dir))
    script = f"""
import sys, numpy as np, torch, aotpack
from aotpack.runtime import native as runtime
assert runtime.find_runtime().is_relative_to({str(installed)!r}), runtime.find_runtime()
assert runtime.find_runtime_library().is_relative_to({str(installed)!r})
x = np.load(sys.argv[1])
with aotpack.load(sys.argv[2]) as model:
    assert type(model._runner).__name__ == "Runner", model._runner  # the wheel's _aotpack_binding
    (y,) = model(torch.from_numpy(x))
np.save(sys.argv[3], y.numpy())
"""
    reference, (x,) = eager_outputs(SAMPLES / "mlp.py")
    np.save(tmp_path / "x.npy", x.numpy())
    subprocess.run([sys.executable, "-m", "aotpack", "-q", "build", str(SAMPLES / "mlp.py"), "-o",
                    str(tmp_path), "--topn", "1"], check=True, env=env, cwd=tmp_path)
    archive = tmp_path / "mlp-0.1.0.aotpack"
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "x.npy"), str(archive),
                    str(tmp_path / "y.npy")], check=True, env=env, cwd=tmp_path)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "y.npy")), reference[0],
                               atol=1e-4, rtol=1e-4)
    tool = subprocess.run([str(installed / "aotpack" / "bin" / "aotpack-run"), str(archive),
                           str(tmp_path / "x.npy")], capture_output=True, text=True, env=env)
    assert tool.returncode == 0, tool.stderr
    assert tool.stdout.startswith("output_0: float32[32, 512] = ")
