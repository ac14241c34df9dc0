"""Stage: run the lowered graph once in Python mode and autotune (PGO) its kernels.

The run executes extern calls with torch and fused kernels through their
``wrapper.so`` (ctypes), on copies of the user's real inputs. The first time a kernel
with several candidates is reached, every candidate is timed on the very tensors it
receives there (warm-up, interleaved rounds, median), the fastest is written to
``optimize_tiling`` and the others are released. Kernels the run never reaches are
*unvisited* and use candidate 0. With one candidate, it goes straight to
``optimize_tiling`` without timing.
"""
from __future__ import annotations

import ctypes
import logging
import statistics
import time

import torch

from aotpack.compile import KernelArtifacts, save_winner
from aotpack.errors import AotpackError
from aotpack.ir import Buffer, CopyBack, ExternCall, Graph, KernelCall, StridedView

log = logging.getLogger("aotpack")

WARMUP_LAUNCHES = 3
ROUNDS = 15
#: Launches per timed sample: enough that ctypes overhead (~0.5 us) and timer
#: resolution stay small next to the kernel.
MIN_SAMPLE_NS = 50_000


class LoadedWrapper:
    """A kernel's ``wrapper.so`` loaded through ctypes (the Python-mode launcher)."""

    def __init__(self, art: KernelArtifacts):
        self.art = art
        self.lib = ctypes.CDLL(str(art.wrapper_path), mode=ctypes.RTLD_LOCAL)
        self.lib.aotpack_init.argtypes = [ctypes.c_char_p]
        self.lib.aotpack_launch.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        self.lib.aotpack_release.argtypes = [ctypes.c_char_p]
        self.lib.aotpack_last_error.restype = ctypes.c_char_p
        loaded = self.lib.aotpack_init(str(art.directory).encode())
        if loaded < 1:
            raise AotpackError(f"kernel {art.kernel.name}: {self._error()} (cache {art.directory}); "
                               "remove that folder and build again")

    def _error(self) -> str:
        return (self.lib.aotpack_last_error() or b"").decode()

    def launch(self, key: str, args) -> None:
        if self.lib.aotpack_launch(key.encode(), args) != 0:
            raise AotpackError(f"kernel {self.art.kernel.name}: {self._error()}")

    def release(self, keep_key: str) -> None:
        if self.lib.aotpack_release(keep_key.encode()) != 0:
            raise AotpackError(f"kernel {self.art.kernel.name}: {self._error()}")


#: A winner whose slowest timed round is this many times its median was measured on
#: a busy machine: say so, since the choice is cached.
NOISY_SPREAD = 3.0


def _time_candidates(wrapper: LoadedWrapper, args) -> tuple[list[float], list[float]]:
    """(median us per launch, max/median spread) of each candidate, rounds interleaved."""
    keys = [t.kernel_key for t in wrapper.art.candidates]
    launches = {}
    for key in keys:
        start = time.perf_counter_ns()
        for _ in range(WARMUP_LAUNCHES):
            wrapper.launch(key, args)
        per_launch = max(1, (time.perf_counter_ns() - start) // WARMUP_LAUNCHES)
        launches[key] = max(1, min(1000, MIN_SAMPLE_NS // per_launch))
    samples = {key: [] for key in keys}
    for _ in range(ROUNDS):
        for key in keys:
            count = launches[key]
            start = time.perf_counter_ns()
            for _ in range(count):
                wrapper.launch(key, args)
            samples[key].append((time.perf_counter_ns() - start) / count / 1000.0)
    medians = [statistics.median(samples[key]) for key in keys]
    spreads = [max(samples[key]) / m for key, m in zip(keys, medians)]
    return medians, spreads


def autotune_kernel(wrapper: LoadedWrapper, args) -> None:
    """Time every candidate on ``args``, keep the fastest (optimize_tiling), release the rest."""
    art = wrapper.art
    timings, spreads = _time_candidates(wrapper, args)
    for index, (tiling, us) in enumerate(zip(art.candidates, timings)):
        log.info("%s candidate %d (%s): Timing %.2f us", art.kernel.name, index, tiling.repr, us)
    best = min(range(len(timings)), key=timings.__getitem__)
    art.timings_us = timings
    save_winner(art, art.candidates[best])
    wrapper.release(art.winner.kernel_key)
    log.info("Autotune completed %s, best kernel index: %d", art.kernel.name, best)
    if spreads[best] > NOISY_SPREAD:
        log.warning("%s: timings were noisy (slowest round %.1fx the median); the machine may be "
                    "busy. The choice is cached: rebuild with --retune on an idle machine to re-time",
                    art.kernel.name, spreads[best])


def _view(env, parts) -> torch.Tensor:
    base, sizes, strides, offset = parts
    tensor = env[id(base)]
    return torch.as_strided(tensor, sizes, strides, tensor.storage_offset() + offset)


def _conform(tensor: torch.Tensor, buf: Buffer) -> torch.Tensor:
    """``tensor`` laid out exactly as ``buf`` says (kernels hard-code strides)."""
    if tuple(tensor.shape) != buf.shape or tensor.dtype != buf.dtype:
        raise AotpackError(f"{buf.name}: expected {buf.dtype}{list(buf.shape)}, got "
                           f"{tensor.dtype}{list(tensor.shape)}")
    same = all(st == want or size == 1 for st, want, size in zip(tensor.stride(), buf.strides, buf.shape))
    if same:
        return tensor
    return torch.empty_strided(buf.shape, buf.strides, dtype=buf.dtype).copy_(tensor)


def _extern_args(env, call: ExternCall):
    args, kwargs = [], {}
    for argument, arg in zip(call.op._schema.arguments, call.args):
        if arg.kind == "tensor":
            value = _view(env, arg.value)
        elif arg.kind == "tensor_list":
            value = [None if p is None else _view(env, p) for p in arg.value]
        elif arg.kind == "none":
            value = None
        else:
            value = arg.value
        if argument.kwarg_only:
            kwargs[argument.name] = value
        else:
            args.append(value)
    return args, kwargs


def run_python_mode(graph: Graph, arts: dict[int, KernelArtifacts], inputs: tuple) -> list[torch.Tensor]:
    """Execute ``graph`` on ``inputs``, autotuning each kernel the first time it runs.

    Args:
        arts: ``id(FusedKernel) -> KernelArtifacts``.
        inputs: the user's real inputs; cloned first, never modified.

    Returns:
        The graph outputs (for the build's parity check against eager).
    """
    env: dict[int, torch.Tensor] = {}
    for buf, tensor in zip(graph.inputs, inputs):
        env[id(buf)] = _conform(tensor.detach().clone(), buf)
    for buf in graph.constants:
        env[id(buf)] = graph.constant_tensors[buf.name].clone()
    wrappers: dict[int, LoadedWrapper] = {}
    for step in graph.steps:
        if isinstance(step, KernelCall):
            _run_kernel(step, env, arts[id(step.kernel)], wrappers)
        elif isinstance(step, ExternCall):
            args, kwargs = _extern_args(env, step)
            result = step.op(*args, **kwargs)
            results = result if isinstance(result, (list, tuple)) else [result]
            for buf, tensor in zip(step.outputs, results):
                if buf is not None:
                    env[id(buf)] = _conform(tensor, buf)
        elif isinstance(step, CopyBack):
            env[id(step.target)].copy_(_view(env, (step.source.base, step.source.shape,
                                                   step.source.strides, step.source.offset)))
    return [_view(env, parts) for parts in graph.outputs]


def _run_kernel(step: KernelCall, env, art: KernelArtifacts, wrappers) -> None:
    kernel = step.kernel
    for buf in kernel.outputs:
        env[id(buf)] = torch.empty_strided(buf.shape, buf.strides, dtype=buf.dtype)
    tensors = [env[id(b)] for b in kernel.inputs] + [env[id(b)] for b in kernel.outputs]
    args = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
    wrapper = wrappers.get(id(kernel))
    if wrapper is None:
        wrapper = wrappers[id(kernel)] = LoadedWrapper(art)
        art.visited = True
        if art.needs_autotune():
            autotune_kernel(wrapper, args)
        elif art.winner is None:
            save_winner(art, art.candidates[0])
    wrapper.launch(art.winner.kernel_key, args)


def finish_unvisited(arts: list[KernelArtifacts]) -> None:
    """Kernels the real inputs never reached keep candidate 0 (reported as unvisited)."""
    for art in arts:
        if art.winner is None:
            log.info("%s was not reached by the example inputs; using candidate 0", art.kernel.name)
            save_winner(art, art.candidates[0])
