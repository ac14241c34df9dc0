"""``aotpack run``: run an archive in-process (``aotpack.load``) on ``.npy`` inputs.

Prints the outputs (or writes them to an ``.npz``) and, with ``--bench N``, the latency
line of ``aotpack-run --bench`` (``latency_us median=.. p10=.. p90=.. runs=N``), so the
two front ends of the same runtime read alike.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from aotpack import backends
from aotpack.errors import AotpackError
from aotpack.runtime.loader import Model, Signature, load, read_npy

SHOWN = 8  # values printed per output
WARMUP = 10  # as aotpack-run --warmup


def _describe(dtype: torch.dtype, shape) -> str:
    """``float32[2, 3]``, as the runtime's messages write a dtype and shape."""
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


def read_inputs(model: Model, paths: list[str | Path]) -> list[torch.Tensor]:
    """One tensor per ``.npy`` file, in manifest order, read by the runtime's reader
    (``loader.read_npy``, as aotpack-run). float32 files feed bfloat16 inputs (``.npy``
    has no bfloat16); otherwise dtype and shape must match the manifest.

    Raises:
        AotpackError: wrong number of files, an unreadable or malformed file, a dtype or
            shape that differs from the model's input (aotpack-run's messages).
    """
    if len(paths) != len(model.inputs):
        signature = ", ".join(f"{s.name}: {_describe(s.dtype, s.shape)}" for s in model.inputs)
        raise AotpackError(f"model '{model.name}' takes {len(model.inputs)} input(s) ({signature}), "
                           f"got {len(paths)} .npy file(s)")
    tensors = []
    for index, (path, spec) in enumerate(zip(paths, model.inputs)):
        tensor = read_npy(path)
        stored = tensor.dtype
        if spec.dtype == torch.bfloat16 and stored == torch.float32:
            tensor = tensor.to(torch.bfloat16)
        if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise AotpackError(f"input {index} ('{spec.name}'): expected {_describe(spec.dtype, spec.shape)}, "
                               f"got {_describe(stored, tensor.shape)} from {path}")
        tensors.append(tensor)
    return tensors


def _percentile(values: list[float], p: float) -> float:
    index = p * (len(values) - 1)
    lo, hi = int(index), min(int(index) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (index - lo)


def bench(model: Model, inputs: list[torch.Tensor], runs: int) -> tuple[list[torch.Tensor], str]:
    """``WARMUP`` untimed runs, then ``runs`` timed ones; returns the last outputs and the
    latency line (microseconds, wall clock per call)."""
    outputs = []
    for _ in range(WARMUP):
        outputs = model.run(*inputs)
    latencies = []
    for _ in range(runs):
        start = time.perf_counter()
        outputs = model.run(*inputs)
        latencies.append((time.perf_counter() - start) * 1e6)
    latencies.sort()
    line = (f"latency_us median={_percentile(latencies, 0.5):.2f} p10={_percentile(latencies, 0.1):.2f} "
            f"p90={_percentile(latencies, 0.9):.2f} runs={runs}")
    return outputs, line


def write_npz(path: str | Path, model: Model, outputs: list[torch.Tensor]) -> None:
    """Outputs by manifest name into ``path`` (bfloat16 as float32), written atomically."""
    path = Path(path)
    arrays = {spec.name: (t.float() if t.dtype == torch.bfloat16 else t).numpy()
              for spec, t in zip(model.outputs, outputs)}
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.pid{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


def describe_output(name: str, tensor: torch.Tensor) -> str:
    """``name: float32[2, 3] = v0 v1 ... (N values)``, as aotpack-run prints it."""
    values = tensor.detach().reshape(-1)[:SHOWN].double().tolist()
    text = f"{name}: {str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} ="
    text += "".join(f" {v:.6g}" for v in values)
    return text + (f" ... ({tensor.numel()} values)" if tensor.numel() > SHOWN else "")


def signature_line(signature: Signature | None) -> str:
    """The ``signature: ...`` line of ``-v``, as aotpack-run prints it."""
    if signature is None:
        return "signature: none (unsigned archive)"
    if not signature.verified:
        return "signature: present, not checked (no trusted keys given)"
    return f"signature: valid, key {signature.key_path} (sha256 {signature.key_sha256})"


def run(archive: str | Path, inputs: list[str | Path], output: str | Path | None = None,
        bench_runs: int = 0, device_limit: int = 0, trusted_keys: list[str] = (),
        require_signature: bool = False, verbose: bool = False) -> list[str]:
    """Load ``archive``, run it on the ``.npy`` files and return the lines to print.

    ``trusted_keys`` and ``require_signature`` go to ``aotpack.load`` (which adds
    AOTPACK_TRUSTED_KEYS's keys); ``verbose`` adds the ``signature:`` line first.

    Raises:
        AotpackError: a load or run failure, bad input files, a negative ``bench_runs``.
    """
    if bench_runs < 0:
        raise AotpackError(f"--bench must be >= 0, got {bench_runs}")
    # the extern calls honour the limit too (the runtime runs the default backend's archives)
    limited = (backends.get(backends.DEFAULT).device().extern_parallelism(device_limit) if device_limit
               else contextlib.nullcontext())
    start = time.perf_counter()
    with limited, load(archive, device_limit or None, trusted_keys=trusted_keys,
                       require_signature=require_signature) as model:
        load_ms = (time.perf_counter() - start) * 1e3
        lines = [signature_line(model.signature)] if verbose else []
        tensors = read_inputs(model, inputs)
        if bench_runs:
            outputs, latency = bench(model, tensors, bench_runs)
            lines += [f"load_ms={load_ms:.3f}", latency]
        else:
            outputs = model.run(*tensors)
        if output:
            write_npz(output, model, outputs)
        else:
            lines += [describe_output(spec.name, t) for spec, t in zip(model.outputs, outputs)]
    return lines
