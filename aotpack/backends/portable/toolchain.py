"""The portable toolchain: the system C compiler for kernels and wrappers (C99, no ``-march``,
no OpenMP), the C++ compiler for the model library (the shared CppWrapper is C++).

Kernels compile at ``-O3`` for the compiler's default target of the host architecture, so a
binary runs on every CPU of that architecture; ``-fno-math-errno`` lets libm calls such as
``sqrt`` vectorise without ``-ffast-math`` (masks use -inf and NaN must survive).
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

from aotpack import env, leftovers
from aotpack.backends.base import Toolchain
from aotpack.backends.host import compiler as host_compiler
from aotpack.codegen.render import include_dir
from aotpack.errors import AotpackError

#: The C compiler of kernels and wrappers.
CC = "cc"
KERNEL_FLAGS = ["-std=c99", "-O3", "-fPIC", "-shared", "-fno-math-errno", "-pipe", "-w"]
KERNEL_LIBS = ["-lm"]
#: A wrapper is glue (a kernel_key lookup and one call per launch): -O0 builds it fastest.
WRAPPER_FLAGS = ["-std=gnu99", "-O0", "-fPIC", "-shared", "-pipe"]
WRAPPER_LIBS = ["-ldl", "-lpthread"]
#: model.so: the shared host CppWrapper (C++), glue compiled at -O0.
MODEL_FLAGS = ["-O0", "-fPIC", "-shared", "-std=c++17", "-pipe"]
MODEL_LIBS = ["-ldl"]
#: A compile that runs longer than this is stuck.
COMPILE_TIMEOUT_S = 300


def compiler_version(compiler: str) -> str:
    """First line of ``<compiler> --version`` (part of every cache key).

    Raises:
        AotpackError: the compiler is missing or broken.
    """
    return host_compiler.compiler_version(compiler, "compiler", "install gcc and g++ (apt-get install build-essential)")


@functools.lru_cache(maxsize=1)
def default_march() -> str:
    """The ``-march`` the C compiler targets when given none (e.g. ``x86-64``); ``default``
    where it does not say."""
    compiler_version(CC)
    query = subprocess.run([CC, "-Q", "--help=target"], capture_output=True, text=True).stdout
    found = re.search(r"-march=\s+(\S+)", query)
    return found.group(1) if found else "default"


def compile_so(command: list[str], source: Path, output: Path, libs: list[str]) -> None:
    """Compile ``source`` into the shared library ``output`` atomically (temp name + rename).

    Raises:
        AotpackError: the compiler failed or timed out, naming the source and its first errors.
    """
    tmp = output.with_name(f".{output.name}.{leftovers.tag()}.tmp")
    try:
        result = subprocess.run([*command, str(source), "-o", str(tmp), *libs], capture_output=True, text=True,
                                timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise AotpackError(f"compiling {source} took over {COMPILE_TIMEOUT_S} s and was stopped") from None
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        errors = "\n".join(result.stderr.strip().splitlines()[:20])
        raise AotpackError(f"compiling {source} failed (this is an aotpack bug; please report it "
                           f"with the file):\n{errors}")
    os.replace(tmp, output)


class PortableToolchain(Toolchain):
    """``cc`` for kernels (C99, -O3, no -march) and wrappers, ``$CXX`` for model.so."""

    def _prefix(self, kind: str) -> list[str]:
        if kind == "kernel":
            return [CC, *KERNEL_FLAGS]
        if kind == "wrapper":
            return [CC, *WRAPPER_FLAGS]
        return [env.get(env.CXX), *MODEL_FLAGS, f"-I{include_dir()}"]

    @staticmethod
    def _libs(kind: str) -> list[str]:
        return {"kernel": KERNEL_LIBS, "wrapper": WRAPPER_LIBS}.get(kind, MODEL_LIBS)

    def fingerprint(self) -> str:
        return "\0".join(["portable", compiler_version(CC), default_march(),
                          " ".join(KERNEL_FLAGS + KERNEL_LIBS), " ".join(WRAPPER_FLAGS + WRAPPER_LIBS)])

    def model_fingerprint(self) -> str:
        """The C++ compiler, its flags and every header model.cpp may include."""
        headers = sorted(include_dir().glob("*.h"))
        return "\0".join([compiler_version(env.get(env.CXX)), " ".join(MODEL_FLAGS + MODEL_LIBS),
                          *(f"{h.name}\0{h.read_text(errors='replace')}" for h in headers)])

    def command(self, source: Path, output: Path, kind: str, source_text: str = "") -> list[str]:
        return [*self._prefix(kind), str(source), "-o", str(output), *self._libs(kind)]

    def compile_kernel(self, source: Path, output: Path) -> None:
        compile_so([*self._prefix("kernel"), "-x", "c"], source, output, self._libs("kernel"))

    def compile_wrapper(self, source: Path, output: Path) -> None:
        compile_so([*self._prefix("wrapper"), "-x", "c"], source, output, self._libs("wrapper"))

    def compile_model(self, source: Path, output: Path) -> None:
        """model.cpp (it includes model_abi.h and kernel_abi.h) into model.so."""
        compile_so(self._prefix("model"), source, output, self._libs("model"))
