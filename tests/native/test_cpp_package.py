"""The installed C++ package (issue 8, item 2): `cmake --install` gives a prefix that a
consumer uses with find_package(aotpack) + aotpack::runtime; samples/cpp is that consumer."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch.utils

import aotpack
from aotpack.commands.run import describe_output
from helpers import REPO, SAMPLES


BUILD = REPO / "native" / "build"


def _cmake(*args, cwd=None) -> subprocess.CompletedProcess:
    result = subprocess.run(["cmake", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                            timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_installed_prefix_builds_and_runs_the_sample_app(build_model, tmp_path):
    if not (BUILD / "CMakeCache.txt").is_file():
        pytest.fail(f"{BUILD} is not configured; build the runtime first (make runtime)")
    prefix = tmp_path / "prefix"
    _cmake("--install", BUILD, "--prefix", prefix)
    for installed in ["include/aotpack/runtime.h", "include/aotpack/dlpack.h", "include/aotpack/types.h",
                      "include/aotpack/model_abi.h", "lib/libaotpack_runtime.so", "bin/aotpack-run",
                      "lib/cmake/aotpack/aotpackConfig.cmake",
                      "lib/cmake/aotpack/aotpackConfigVersion.cmake",
                      "lib/cmake/aotpack/aotpackTargets.cmake"]:
        assert (prefix / installed).exists(), installed
    app = tmp_path / "app"
    _cmake("-S", REPO / "samples" / "cpp", "-B", app, "-DCMAKE_BUILD_TYPE=Release",
           f"-DCMAKE_PREFIX_PATH={prefix};{torch.utils.cmake_prefix_path}")
    _cmake("--build", app, "-j2")

    archive = build_model(SAMPLES / "mlp.py").archive
    x = np.linspace(-1, 1, 32 * 512, dtype=np.float32).reshape(32, 512)
    np.save(tmp_path / "x.npy", x)
    result = subprocess.run([str(app / "aotpack_app"), str(archive), str(tmp_path / "x.npy")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    with aotpack.load(archive) as model:
        (y,) = model(x)
    assert result.stdout.splitlines() == ["loaded mlp 0.1.0", describe_output("output_0", y)]
    # the app links the installed library, not the build tree's
    ldd = subprocess.run(["ldd", str(app / "aotpack_app")], capture_output=True, text=True).stdout
    assert f"{prefix}/lib/libaotpack_runtime.so.0" in ldd

    result = subprocess.run([str(app / "aotpack_app"), str(archive)], capture_output=True, text=True)
    assert (result.returncode, result.stderr) == (
        1, "aotpack_app: error: the model takes 1 input(s), got 0 .npy file(s)\n")
