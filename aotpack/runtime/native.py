"""Drive the native runtime (``aotpack-run``) from Python.

``aotpack run`` deliberately calls the C++ runtime rather than re-implementing it,
so what is tested is what is deployed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from aotpack import env
from aotpack.errors import AotpackError
from aotpack.archive.reader import read_manifest

#: A source checkout's root (editable installs); the runtime builds into native/build.
CHECKOUT = Path(__file__).resolve().parents[2]
#: The installed package: a wheel built by ``pip install .`` holds bin/aotpack-run and
#: lib/libaotpack_runtime.so.0 (setup.py).
PACKAGE = Path(__file__).resolve().parents[1]  # aotpack/
BUILD_HINT = "build it with `make runtime` in a source checkout, or install aotpack with `pip install .` (see native/README.md)"
RUNTIME_LIBRARY = "libaotpack_runtime.so"
WHEEL_RUNTIME_LIBRARY = "libaotpack_runtime.so.0"


def find_runtime() -> Path:
    """Path of ``aotpack-run``: ``$AOTPACK_RUNTIME``, ``native/build/``, the installed
    package's ``bin/``, then ``PATH``.

    Raises:
        AotpackError: not found; the message says how to build it.
    """
    return _find_tool("aotpack-run", env.RUNTIME, "native runtime")


def find_server() -> Path:
    """Path of ``aotpack-serve``: ``$AOTPACK_SERVE``, ``native/build/``, the installed
    package's ``bin/``, then ``PATH`` (as :func:`find_runtime`).

    Raises:
        AotpackError: not found; the message says how to build it (it needs cpp-httplib).
    """
    return _find_tool("aotpack-serve", env.SERVE, "inference server")


def _find_tool(tool: str, var: env.Variable, what: str) -> Path:
    """``$var`` (must be executable), the checkout's ``native/build/``, the package's
    ``bin/``, then ``PATH``."""
    chosen = env.get(var)
    if chosen:
        if Path(chosen).is_file() and os.access(chosen, os.X_OK):
            return Path(chosen)
        raise AotpackError(f"{var.name}={chosen} is not an executable file; point it at {tool} "
                           f"or unset it")
    candidates = [str(CHECKOUT / "native" / "build" / tool), str(PACKAGE / "bin" / tool),
                  shutil.which(tool)]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    hint = " (the server also needs libcpp-httplib-dev)" if tool == "aotpack-serve" else ""
    raise AotpackError(f"{what} {tool} not found; {BUILD_HINT}{hint}")


def find_runtime_library() -> Path:
    """Path of ``libaotpack_runtime.so``: ``$AOTPACK_RUNTIME_LIB``, ``native/build/``, then
    installed next to the package (``aotpack/lib/``, as ``pip install .`` puts it) or under the environment's prefix
    (``<sys.prefix>/lib``, where ``cmake --install --prefix`` puts it).

    Raises:
        AotpackError: not found; the message names the places looked at and how to build it.
    """
    import sys

    chosen = env.get(env.RUNTIME_LIB)
    if chosen:
        if Path(chosen).is_file():
            return Path(chosen)
        raise AotpackError(f"{env.RUNTIME_LIB.name}={chosen} is not a file; point it at {RUNTIME_LIBRARY} "
                           "or unset it")
    candidates = [CHECKOUT / "native" / "build" / RUNTIME_LIBRARY,
                  PACKAGE / "lib" / WHEEL_RUNTIME_LIBRARY,
                  PACKAGE / "lib" / RUNTIME_LIBRARY,
                  Path(sys.prefix) / "lib" / RUNTIME_LIBRARY]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise AotpackError(f"native runtime library {RUNTIME_LIBRARY} not found (looked in "
                       f"{', '.join(str(c.parent) for c in candidates)}); {BUILD_HINT}, or set "
                       f"{env.RUNTIME_LIB.name}")


def run_archive(archive: str | Path, inputs: list[str | Path], output: str | Path | None = None,
                bench: int = 0, device_limit: int = 0, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``aotpack-run ARCHIVE INPUT.npy... [--output OUT.npz] [--bench N]``.

    Raises:
        AotpackError: the runtime reported an error (its message is included).
    """
    cmd = [str(find_runtime()), str(archive), *map(str, inputs)]
    if output:
        cmd += ["--output", str(output)]
    if bench:
        cmd += ["--bench", str(bench)]
    if device_limit:
        cmd += ["--device-limit", str(device_limit)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if check and result.returncode != 0:
        message = result.stderr.strip() or result.stdout.strip()
        raise AotpackError(message.removeprefix("aotpack-run: error: "))
    return result


def parse_latency(stdout: str) -> dict[str, float]:
    """Fields of the ``latency_us median=.. p10=.. p90=.. runs=..`` line of ``--bench``."""
    line = re.search(r"^latency_us (.*)$", stdout, re.MULTILINE)
    if not line:
        raise AotpackError(f"aotpack-run printed no latency line:\n{stdout}")
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.eE+-]+)", line.group(1))}


def save_inputs(tensors, folder: str | Path) -> list[Path]:
    """Write each tensor as ``input_<i>.npy`` in ``folder`` (the runtime's input format)."""
    import numpy as np
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, tensor in enumerate(tensors):
        path = folder / f"input_{i}.npy"
        if tensor.dtype == torch.bfloat16:  # .npy has no bfloat16; the runtime converts float32
            tensor = tensor.float()
        np.save(path, tensor.detach().contiguous().numpy())
        paths.append(path)
    return paths


def run_tensors(archive: str | Path, tensors, workdir: str | Path, bench: int = 0):
    """Run ``archive`` on torch tensors through ``aotpack-run``.

    Returns:
        (outputs as torch tensors in manifest order, latency dict or None)
    """
    import numpy as np
    import torch

    workdir = Path(workdir)
    inputs = save_inputs(tensors, workdir)
    out = workdir / "outputs.npz"
    result = run_archive(archive, inputs, out, bench=bench)
    dtypes = [getattr(torch, o["dtype"]) for o in read_manifest(archive)["outputs"]]
    with np.load(out) as npz:  # bfloat16 outputs arrive as float32 (.npy has no bfloat16)
        outputs = [torch.from_numpy(npz[name].copy()).to(dtype) for name, dtype in zip(npz.files, dtypes)]
    return outputs, (parse_latency(result.stdout) if bench else None)
