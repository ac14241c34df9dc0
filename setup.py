"""Package build: setuptools for the Python code, CMake for the native runtime.

``pip install .`` compiles ``native/`` against the torch of the build environment and puts
``libaotpack_runtime.so.0`` (and ``_aotpack_binding``, aotpack.load's per-call extension,
where Python's headers are found) in ``aotpack/lib/`` and ``aotpack-run`` in ``aotpack/bin/`` of
the wheel (``aotpack.runtime.native`` looks there). pyproject.toml pins the build's torch to the
runtime dependency's version: the runtime links libtorch, so the two must be the same
release. Editable installs (``make venv``) skip this step: the Makefile builds
``native/build``, which a source checkout uses. ``AOTPACK_SKIP_NATIVE=1`` skips it too.

Why setuptools and not scikit-build-core: the Python side is plain setuptools already, and
one CMake configure + build of two targets is all the native side needs.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SYSTEM_PACKAGES = "g++ cmake pkg-config libarchive-dev libzstd-dev nlohmann-json3-dev libssl-dev"
#: Without it the wheel has no _aotpack_binding and aotpack.load calls through ctypes (~2.5 us more per call).
BINDING_PACKAGE = "python3-dev"
TARGETS = ("aotpack_runtime", "aotpack-run")
#: aotpack.load's per-call extension (native/python/binding.cpp), built where Python's headers are.
BINDING_TARGET = "aotpack_binding"
#: The inference server (native/server/), built where cpp-httplib is (libcpp-httplib-dev).
SERVER_TARGET = "aotpack-serve"


def _run(command: list[str], what: str) -> None:
    """Run one CMake step; on failure raise SystemExit with its output's tail and the fix."""
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-25:])
        raise SystemExit(f"{tail}\n\naotpack: {what} of the native runtime failed (exit "
                         f"{done.returncode}). It needs {SYSTEM_PACKAGES} (Debian/Ubuntu: "
                         f"apt-get install {SYSTEM_PACKAGES}); set AOTPACK_SKIP_NATIVE=1 to "
                         "install without it.")


def build_native_runtime(package_dir: Path) -> None:
    """Configure and build native/ in a temporary folder; copy the library and the tool into
    ``package_dir/lib`` and ``package_dir/bin``.

    Raises:
        SystemExit: cmake is missing or a CMake step fails; the message names the system
            packages to install.
    """
    import torch.utils  # the build environment's torch (pinned in pyproject.toml)

    if shutil.which("cmake") is None:
        raise SystemExit(f"aotpack: building the native runtime needs cmake; install {SYSTEM_PACKAGES}")
    with tempfile.TemporaryDirectory(prefix="aotpack-native-") as build:
        _run(["cmake", "-S", str(ROOT / "native"), "-B", build, "-DCMAKE_BUILD_TYPE=Release",
              "-DAOTPACK_WHEEL=ON", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
              f"-DPython3_EXECUTABLE={sys.executable}"], "configure")
        # _aotpack_binding only where CMake found Python's headers (aotpack.load falls back to ctypes)
        binding = "AOTPACK_BINDING_BUILT:INTERNAL=ON" in (Path(build) / "CMakeCache.txt").read_text()
        if not binding:
            print(f"aotpack: Python's headers not found, so no _aotpack_binding: aotpack.load will call "
                  f"through ctypes (~2.5 us more per call); install {BINDING_PACKAGE} for it", file=sys.stderr)
        # aotpack-serve only where CMake found cpp-httplib (`aotpack serve` says how to get it)
        server = "CPPHTTPLIB_FOUND:INTERNAL=1" in (Path(build) / "CMakeCache.txt").read_text()
        targets = [*TARGETS, *([BINDING_TARGET] if binding else []), *([SERVER_TARGET] if server else [])]
        _run(["cmake", "--build", build, "-j", str(os.cpu_count() or 1), "--target", *targets], "build")
        (package_dir / "lib").mkdir(parents=True, exist_ok=True)
        (package_dir / "bin").mkdir(parents=True, exist_ok=True)
        # The SONAME file, dereferenced (wheels hold no symlinks); aotpack-run asks for it.
        shutil.copyfile(Path(build) / "libaotpack_runtime.so.0", package_dir / "lib" / "libaotpack_runtime.so.0")
        shutil.copy2(Path(build) / "aotpack-run", package_dir / "bin" / "aotpack-run")
        if server:
            shutil.copy2(Path(build) / SERVER_TARGET, package_dir / "bin" / SERVER_TARGET)
        for module in Path(build).glob("_aotpack_binding*.so"):  # next to the library it calls
            shutil.copy2(module, package_dir / "lib" / module.name)


class BuildWithRuntime(build_py):
    """``build_py`` that also builds the native runtime into the wheel (not for editable installs)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode or os.environ.get("AOTPACK_SKIP_NATIVE") == "1":
            return
        print("aotpack: building the native runtime (CMake)", file=sys.stderr)
        build_native_runtime(Path(self.build_lib) / "aotpack")


class BinaryDistribution(Distribution):
    """The wheel holds native code: tag it for this platform and Python, not ``py3-none-any``."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildWithRuntime}, distclass=BinaryDistribution)
